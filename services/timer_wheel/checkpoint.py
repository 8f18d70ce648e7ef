"""The timer-wheel checkpoint: how far its logs, its hand and its broker offsets are durable.

The service makes a batch durable in this order: TimerLog and MessageLog ``flush()``, wheel
``flush()``, then :meth:`Checkpoint.save`, and only then commits the consume offsets to the
brokers. So after a crash everything up to the checkpoint's positions is on disk, every record
before ``queue_offsets`` is in the logs, and everything after is re-read from the brokers.

File (JSON, one object, ``version`` first so a later layout can be told apart):

| key               | type                       | meaning                                        |
|-------------------|----------------------------|------------------------------------------------|
| version           | int                        | ``CHECKPOINT_VERSION`` (1)                     |
| timer_log_pos     | int                        | TimerLog end position covered by this save     |
| message_log_pos   | int                        | MessageLog end position covered by this save   |
| hand_ms           | int                        | every slot before this time has been delivered |
| queue_offsets     | list of [broker, qid, off] | next offset to read per timer-topic queue      |
| extra             | object                     | service-defined values (ints or strings)       |

Saving is atomic: write ``<name>.tmp``, fsync it, rename it over the file, fsync the directory.
A crash leaves either the old or the new checkpoint, plus perhaps a stale ``.tmp`` that
:meth:`Checkpoint.load` ignores and removes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.common.atomic_write import tmp_path, write_atomic

CHECKPOINT_VERSION = 1

QueueKey = tuple[str, int]
"""``(broker_name, queue_id)`` of one queue of the timer topic."""


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be read as a checkpoint."""


class Checkpoint:
    """The checkpoint at ``path``; fields are plain attributes, set them then :meth:`save`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.timer_log_pos = 0
        self.message_log_pos = 0
        self.hand_ms = 0
        """Every slot that starts before this time has been delivered."""
        self.queue_offsets: dict[QueueKey, int] = {}
        """Committed (next to read) offset per ``(broker_name, queue_id)``."""
        self.extra: dict[str, int | str] = {}
        """Values the service wants kept across restarts; saved as they are."""

    @property
    def _tmp_path(self) -> Path:
        return tmp_path(self.path)

    def load(self) -> bool:
        """Read the file into the fields; return False (fields untouched) if there is none.

        Raises :class:`CheckpointError` for a file that is not a valid checkpoint: it was
        renamed into place whole, so damage there is not a crash artefact to ignore.
        """
        self._tmp_path.unlink(missing_ok=True)  # a save cut short by a crash
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        try:
            self._apply(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{self.path}: not a valid timer checkpoint: {exc}") from exc
        return True

    def _apply(self, doc: dict[str, Any]) -> None:
        version = doc["version"]
        if version != CHECKPOINT_VERSION:
            raise ValueError(f"unsupported version {version!r}")
        timer_log_pos = _int(doc["timer_log_pos"])
        message_log_pos = _int(doc["message_log_pos"])
        hand_ms = _int(doc["hand_ms"])
        offsets = {(str(b), _int(q)): _int(o) for b, q, o in doc["queue_offsets"]}
        extra = doc.get("extra", {})
        if not isinstance(extra, dict):
            raise ValueError("extra is not an object")
        # Assign only once everything parsed, so a bad file leaves the fields as they were.
        self.timer_log_pos, self.message_log_pos, self.hand_ms = (
            timer_log_pos,
            message_log_pos,
            hand_ms,
        )
        self.queue_offsets = offsets
        self.extra = dict(extra)

    def to_json(self) -> dict[str, Any]:
        """The document :meth:`save` writes."""
        return {
            "version": CHECKPOINT_VERSION,
            "timer_log_pos": self.timer_log_pos,
            "message_log_pos": self.message_log_pos,
            "hand_ms": self.hand_ms,
            "queue_offsets": [[b, q, o] for (b, q), o in sorted(self.queue_offsets.items())],
            "extra": self.extra,
        }

    def save(self) -> None:
        """Write the fields atomically and durably (tmp, fsync, rename, directory fsync)."""
        data = json.dumps(self.to_json(), separators=(",", ":")).encode()
        write_atomic(self.path, data, failpoint_before_fsync="timer_before_checkpoint")


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value
