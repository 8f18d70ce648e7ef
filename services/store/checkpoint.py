"""The checkpoint file: when the commitlog, consume queues and index were last flushed.

Layout (RocketMQ's StoreCheckpoint; a 4 KiB file so one page write covers it), big-endian:

| offset | bytes | field                   | meaning                                          |
|--------|-------|-------------------------|--------------------------------------------------|
| 0      | 8     | physicMsgTimestamp      | store time of the last commitlog record flushed  |
| 8      | 8     | logicsMsgTimestamp      | store time of the last record flushed to its CQ  |
| 16     | 8     | indexMsgTimestamp       | store time of the last record flushed to the index |
| 24     | 8     | masterFlushedOffset     | physical offset flushed (replication uses it)     |
| 32     | 8     | confirmPhyOffset        | offset the in-sync replicas acknowledged          |

Abnormal recovery starts scanning at the commitlog file whose first record is no newer than
the smallest of the three timestamps, so everything after the last flush is re-verified.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from services.common import failpoints

CHECKPOINT = struct.Struct(
    ">q"  # physicMsgTimestamp
    "q"  # logicsMsgTimestamp
    "q"  # indexMsgTimestamp
    "q"  # masterFlushedOffset
    "q"  # confirmPhyOffset
)
assert CHECKPOINT.size == 40
CHECKPOINT_FILE_BYTES = 4096


@dataclass(slots=True)
class Checkpoint:
    """The five values, read at start and rewritten after every flush."""

    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @property
    def min_timestamp_ms(self) -> int:
        """The oldest of the three flush times: recovery must re-verify from there."""
        return min(
            self.physic_msg_timestamp_ms,
            self.logics_msg_timestamp_ms,
            self.index_msg_timestamp_ms,
        )

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """Read ``path``; a missing or short file reads as all zeros (a fresh store)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls()
        if len(raw) < CHECKPOINT.size:
            return cls()
        return cls(*CHECKPOINT.unpack_from(raw))

    def save(self, path: Path) -> None:
        """Write in place and fdatasync; one 4 KiB page, so a torn write is not expected."""
        failpoints.inject("checkpoint_before_write")
        data = CHECKPOINT.pack(
            self.physic_msg_timestamp_ms,
            self.logics_msg_timestamp_ms,
            self.index_msg_timestamp_ms,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        ).ljust(CHECKPOINT_FILE_BYTES, b"\0")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
