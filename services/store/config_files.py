"""The JSON config files under ``store/config`` (SPEC §4.4, §11.7), written atomically.

| file                      | holds                                                         |
|---------------------------|---------------------------------------------------------------|
| ``topics.json``           | ``{"topicConfigTable": {name: TopicConfig}, "dataVersion": …}`` |
| ``subscriptionGroup.json``| ``{"subscriptionGroupTable": {group: config}, "dataVersion": …}`` |
| ``consumerOffset.json``   | ``{"offsetTable": {"topic@group": {queueId: offset}}}``         |
| ``delayOffset.json``      | ``{"offsetTable": {delayLevel: offset}}``                       |

RocketMQ writes these with fastjson, whose integer map keys are *unquoted*
(``{0:1,1:0}``), which is not JSON. We write standard JSON (quoted keys) so every tool can
read our files, and we *read* both forms, so a store directory copied from a RocketMQ broker
loads. Writes go to ``name.tmp``, are fsynced, renamed over ``name`` and the directory is
fsynced; the previous version is kept as ``name.bak`` as RocketMQ does. A crash at any point
leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from services.common import atomic_write

TOPICS = "topics.json"
SUBSCRIPTION_GROUPS = "subscriptionGroup.json"
CONSUMER_OFFSETS = "consumerOffset.json"
DELAY_OFFSETS = "delayOffset.json"

# A fastjson integer key: `{` or `,`, optional spaces, digits, optional spaces, then `:`.
_UNQUOTED_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


class ConfigFileError(ValueError):
    """A config file exists but cannot be parsed; the message names the file."""


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content; the
    previous version is kept as ``name.bak``."""
    atomic_write.write_atomic(
        path, data, keep_backup=True, failpoint_before_rename="config_before_rename"
    )


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as pretty JSON."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n")


def parse_json(text: str, *, source: str = "<config>") -> Any:
    """Parse standard JSON or fastjson's unquoted-integer-key dialect."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2"\3', text))
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{source}: not valid JSON ({exc})") from None


def read_json(path: Path, default: Any) -> Any:
    """Read ``path``; fall back to ``name.bak`` if the main file is damaged; else ``default``."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        if not candidate.exists():
            continue
        try:
            return parse_json(candidate.read_text(encoding="utf-8"), source=str(candidate))
        except (ConfigFileError, UnicodeDecodeError):
            if candidate is path and path.with_name(path.name + ".bak").exists():
                continue
            raise
    return default


def load_offset_table(path: Path) -> dict[str, dict[int, int]]:
    """consumerOffset.json / delayOffset.json-style ``offsetTable`` with integer inner keys."""
    raw = read_json(path, {"offsetTable": {}})
    table = raw.get("offsetTable", {}) if isinstance(raw, dict) else {}
    out: dict[str, dict[int, int]] = {}
    for key, queues in table.items():
        if isinstance(queues, dict):
            out[str(key)] = {int(q): int(o) for q, o in queues.items()}
    return out


def save_offset_table(path: Path, table: dict[str, dict[int, int]]) -> None:
    write_json(
        path, {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in table.items()}}
    )
