"""Named failpoints at durability boundaries (STYLE.md habit 7, after etcd's gofail).

A failpoint is inert unless the environment variable ``ROCKETQ_FAILPOINTS`` names it, so the
check on the hot path is one dict lookup on an empty dict. The variable holds ``;``-separated
terms ``name=action``:

| action          | effect at the point                                                  |
|-----------------|----------------------------------------------------------------------|
| ``crash``       | ``SIGKILL`` to this process: no cleanup, no flush        |
| ``crash@N``     | crash the N-th time the point is reached (1-based), pass before     |
| ``error``       | raise :class:`FailpointError` (the caller's error path runs)         |
| ``sleep(MS)``   | block for MS milliseconds                                            |
| ``off``         | nothing                                                             |

Robustness tests start a process with e.g. ``ROCKETQ_FAILPOINTS="commitlog_before_flush=crash@3"``
and check what survives. :data:`KNOWN` lists every point, so a typo in a test fails loudly.
"""

from __future__ import annotations

import os
import signal
import time

ENV_VAR = "ROCKETQ_FAILPOINTS"

#: Every failpoint compiled into RocketQ, with where it sits.
KNOWN: dict[str, str] = {
    "commitlog_after_append": "records are in the mapped file, not yet dispatched or flushed",
    "commitlog_before_flush": "a flush is about to fsync the commitlog",
    "commitlog_after_flush": "the commitlog fsync returned, waiters not yet released",
    "dispatch_before_consume_queue": "a record is about to be written to its consume queue",
    "dispatch_before_index": "a record is about to be written to the index file",
    "checkpoint_before_write": "the checkpoint file is about to be updated",
    "recovery_before_truncate": "recovery found a torn tail and is about to truncate it",
    "config_before_rename": "an atomic config write has fsynced its temp file, not renamed it",
    "retention_before_delete": "retention is about to delete an expired file",
    "timer_log_before_flush": "the timer-wheel is about to fsync its TimerLog",
    "timer_before_checkpoint": "the timer checkpoint's temp file is written, not yet fsynced",
    "transaction_before_end_put": "EndTransaction is about to append the committed message and "
    "its op record (one append)",
}


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``error``."""


class _Action:
    __slots__ = ("arg", "hits", "kind")

    def __init__(self, kind: str, arg: int) -> None:
        self.kind = kind
        self.arg = arg
        self.hits = 0


def _parse(spec: str) -> dict[str, _Action]:
    actions: dict[str, _Action] = {}
    for term in filter(None, (t.strip() for t in spec.split(";"))):
        name, _, action = term.partition("=")
        name = name.strip()
        action = action.strip()
        if name not in KNOWN:
            raise ValueError(f"unknown failpoint {name!r} in ${ENV_VAR}; known: {sorted(KNOWN)}")
        if action == "crash":
            actions[name] = _Action("crash", 1)
        elif action.startswith("crash@"):
            actions[name] = _Action("crash", int(action[6:]))
        elif action == "error":
            actions[name] = _Action("error", 0)
        elif action.startswith("sleep(") and action.endswith(")"):
            actions[name] = _Action("sleep", int(action[6:-1]))
        elif action == "off":
            continue
        else:
            raise ValueError(f"bad failpoint action {action!r} for {name}")
    return actions


_active: dict[str, _Action] = _parse(os.environ.get(ENV_VAR, ""))


def reload(spec: str | None = None) -> None:
    """Re-read the failpoint spec (from ``spec`` or the environment); for in-process tests."""
    global _active
    _active = _parse(os.environ.get(ENV_VAR, "") if spec is None else spec)


def inject(name: str) -> None:
    """Run the failpoint ``name`` if it is enabled; otherwise return at once."""
    if not _active:
        return
    action = _active.get(name)
    if action is None:
        return
    action.hits += 1
    if action.kind == "crash":
        if action.hits >= action.arg:
            os.kill(os.getpid(), signal.SIGKILL)
    elif action.kind == "error":
        raise FailpointError(f"failpoint {name} injected an error")
    elif action.kind == "sleep":
        time.sleep(action.arg / 1000.0)


def available() -> list[str]:
    """Names of every failpoint, for robustness suites that iterate over them."""
    return sorted(KNOWN)
