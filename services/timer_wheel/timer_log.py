"""The TimerLog: one fixed 52-byte unit per scheduled timer, chained per wheel slot (SPEC §8.2).

Every timer the service reads from ``rmq_sys_wheel_timer`` gets one unit here. Units due in the
same wheel slot form a backwards linked list through ``prev_pos``: the slot
(:mod:`services.timer_wheel.wheel`) keeps the position of the newest unit, each unit the
position of the one linked before it, and ``-1`` ends the chain. The message itself lives in the
local :mod:`~services.timer_wheel.message_log`; ``offset_py``/``size_py`` say where.

Unit layout (``UNIT_SIZE`` = 52 bytes, big-endian, SPEC §8.2 / §11.4):

| offset | bytes | field           | meaning                                                    |
|--------|-------|-----------------|------------------------------------------------------------|
| 0      | 4     | size            | always 52 (``UNIT_SIZE``); a blank record holds its length |
| 4      | 8     | prevPos         | position of the previous unit of the same slot, or -1      |
| 12     | 4     | magic           | flags: MAGIC_DEFAULT 1, MAGIC_ROLL 2, MAGIC_DELETE 4       |
| 16     | 8     | currWriteTime   | base time of the delay (ms since the epoch)                |
| 24     | 4     | delayedTime     | ms after currWriteTime the unit is due; signed int32       |
| 28     | 8     | offsetPy        | position of the message in the local MessageLog            |
| 36     | 4     | sizePy          | its size in the MessageLog (bytes)                         |
| 40     | 4     | hashCode        | hash of the real topic (signed int32)                      |
| 44     | 8     | reserved        | written as 0                                               |

``currWriteTime + delayedTime`` is :attr:`TimerUnit.deliver_ms`. The log does not interpret
it; the timer-wheel service writes the start of the slot it links the unit into as
currWriteTime and the unit's due time minus that as delayedTime (clamped to int32; negative for
a timer already overdue), so a unit tells both its slot and its due time. A rolled unit (due
beyond the wheel's window) has ``MAGIC_ROLL``; its final time is the message's TIMER_OUT_MS.

Files: like the commitlog, a sequence of equally sized files (100 MiB by default) named by the
20-digit position they start at, so positions are global across files. A unit never straddles
two files: when fewer than ``UNIT_SIZE + BLANK_SIZE`` bytes are left, a blank record
(size = bytes left, prevPos 0, magic ``BLANK_MAGIC_CODE``) fills the rest and the unit goes to
the next file. Every unit therefore sits at ``file_start + k × 52``, which recovery and reads
check.

Durability and recovery: the service appends, then ``flush()`` (fdatasync), then saves its
:class:`~services.timer_wheel.checkpoint.Checkpoint`. On open the log finds its end by scanning
the last file for the first slot that is not a valid unit (vectorised, ~0.1 s per 100 MiB);
the service then calls ``truncate_to(checkpoint.timer_log_pos)`` to drop the tail written after
the last checkpoint (possibly torn by a crash). Before truncating, ``TimerWheel.rewind(pos,
log)`` unlinks that tail from every slot (or walk it with :meth:`TimerLog.iter_units` and call
``TimerWheel.unlink_last`` newest first): otherwise a slot could keep a position that the next
append reuses for a unit of another slot.
Retention: :meth:`TimerLog.delete_files_before` removes whole files below a position.

Writes go through ``struct.pack_into`` on the mapped file: one append costs about a microsecond.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.common import failpoints
from services.store.mapped_file import MappedFile, MappedFileQueue

UNIT = struct.Struct(
    ">i"  # size: UNIT_SIZE
    "q"  # prevPos: previous unit of the same slot, -1 ends the chain
    "i"  # magic: MAGIC_* flags
    "q"  # currWriteTime (ms)
    "i"  # delayedTime (ms after currWriteTime)
    "q"  # offsetPy: MessageLog position
    "i"  # sizePy: MessageLog entry size
    "i"  # hashCode of the real topic
    "q"  # reserved
)
UNIT_SIZE = 52
assert UNIT.size == UNIT_SIZE

BLANK = struct.Struct(
    ">i"  # size: bytes from here to the end of the file
    "q"  # prevPos: 0
    "i"  # magic: BLANK_MAGIC_CODE
)
BLANK_SIZE = 16
assert BLANK.size == BLANK_SIZE
BLANK_MAGIC_CODE = (0xBBCCDDEE ^ (1880681586 + 8)) - (1 << 32)
"""Marks the end of a file's units, as signed int32 (RocketMQ's value)."""
assert -(1 << 31) <= BLANK_MAGIC_CODE < 0

MAGIC_DEFAULT = 1
MAGIC_ROLL = 2
MAGIC_DELETE = 4
_MAGIC_ALL = MAGIC_DEFAULT | MAGIC_ROLL | MAGIC_DELETE
_MAGIC_OFFSET = 12

DEFAULT_TIMER_LOG_FILE_BYTES = 100 * 1024 * 1024


class TimerStoreError(Exception):
    """A timer storage file cannot serve a request (position gone, torn or corrupt data)."""


class PositionError(TimerStoreError):
    """The position is outside what the log holds (deleted, not yet written, misaligned)."""


class TornRecordError(TimerStoreError):
    """The bytes at the position are not a valid record: a blank, a torn write or zeros."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerUnit:
    """One TimerLog unit (see the module table). Keyword-only, so field order cannot slip."""

    size: int = UNIT_SIZE
    prev_pos: int
    """Position of the previous unit in the same slot, or -1 for the first."""
    magic: int
    """``MAGIC_DEFAULT`` possibly or-ed with ``MAGIC_ROLL`` / ``MAGIC_DELETE``."""
    curr_write_time_ms: int
    delayed_time_ms: int
    """Signed int32: ms after ``curr_write_time_ms`` at which the unit is due."""
    offset_py: int
    """Position of the message in the MessageLog."""
    size_py: int
    hash_topic: int
    """Hash of the real topic, as a signed int32."""

    @property
    def deliver_ms(self) -> int:
        """``curr_write_time_ms + delayed_time_ms`` (the service's due time for the unit)."""
        return self.curr_write_time_ms + self.delayed_time_ms


def magic_is_valid(magic: int) -> bool:
    """True for a unit magic: ``MAGIC_DEFAULT`` set, no bit outside the three flags."""
    return magic & MAGIC_DEFAULT != 0 and magic & ~_MAGIC_ALL == 0


class SegmentedLog:
    """What TimerLog and MessageLog share: a file queue, its end, truncation and retention.

    Subclasses define the record format; this class keeps positions honest: ``max_pos`` is one
    past the last written byte, ``min_pos`` the first byte still on disk.
    """

    blank_size: int
    """Bytes a blank (end-of-file) record needs; every file keeps room for one."""

    def __init__(self, directory: Path | str, file_bytes: int) -> None:
        self.directory = Path(directory)
        self.file_bytes = file_bytes
        self._queue = MappedFileQueue(self.directory, file_bytes)
        problems = self._queue.load()
        if problems:
            # A size mismatch or a gap means the directory was written with other settings or
            # damaged; serving from it could deliver garbage, so refuse to start.
            self._queue.close()
            raise TimerStoreError("; ".join(problems))
        self._recover_end()

    # -- positions ---------------------------------------------------------------------------
    @property
    def max_pos(self) -> int:
        """One past the last written byte (where the next record goes, or a blank before it)."""
        return self._queue.max_offset()

    @property
    def min_pos(self) -> int:
        """First position still on disk (0 until retention deletes a file)."""
        return self._queue.min_offset()

    def disk_bytes(self) -> int:
        """Bytes of files on disk (their full, preallocated size)."""
        return len(self._queue.files) * self.file_bytes

    def _file_for_read(self, pos: int, size: int) -> MappedFile:
        if pos < self.min_pos:
            raise PositionError(f"{self.directory.name}: position {pos} was deleted by retention")
        mf = self._queue.find(pos)
        if mf is None or pos + size > mf.file_from_offset + mf.wrote_position:
            raise PositionError(
                f"{self.directory.name}: no record of {size} bytes at {pos} "
                f"(written up to {self.max_pos})"
            )
        if pos - mf.file_from_offset + size > self.file_bytes:
            raise PositionError(f"{self.directory.name}: {size} bytes at {pos} cross a file end")
        return mf

    def _file_for_append(self, size: int) -> MappedFile:
        """The file a record of ``size`` bytes goes to, writing a blank to roll when needed."""
        mf = self._queue.writable_file()
        if mf.free_bytes < size + self.blank_size:
            self._write_blank(mf)
            mf = self._queue.writable_file()
        return mf

    def _write_blank(self, mf: MappedFile) -> None:
        raise NotImplementedError

    def _recover_end(self) -> None:
        """Set each file's write position from its content after ``load`` marked all full."""
        files = self._queue.files
        # Pre-created or truncated-away files at the end hold nothing; the newest file with a
        # record at its start is the one to scan. Earlier files are full (they end in a blank).
        for mf in reversed(files):
            mf.wrote_position = mf.flushed_position = 0
            if self._has_record_at_start(mf):
                end = self._scan_end(mf)
                mf.wrote_position = mf.flushed_position = end
                return

    def _has_record_at_start(self, mf: MappedFile) -> bool:
        return int.from_bytes(mf.view[0:4], "big", signed=True) > 0

    def _scan_end(self, mf: MappedFile) -> int:
        raise NotImplementedError

    # -- durability, recovery, retention -----------------------------------------------------
    def _flush_files(self) -> int:
        return self._queue.flush()

    def truncate_to(self, pos: int) -> int:
        """Drop every byte at or after ``pos`` (recovery to a checkpoint); return bytes dropped.

        Raises :class:`PositionError` if ``pos`` is past the end: the checkpoint then claims
        data the disk does not have, which the caller must report rather than paper over.
        """
        end = self.max_pos
        if pos > end:
            raise PositionError(
                f"{self.directory.name}: cannot truncate to {pos}, the log ends at {end} "
                "(a checkpoint ahead of the data: files lost or not synced)"
            )
        if pos < self.min_pos:
            raise PositionError(f"{self.directory.name}: {pos} is before the first file")
        self._check_boundary(pos)
        self._queue.truncate(pos)
        return end - pos

    def _check_boundary(self, pos: int) -> None:
        """Raise if ``pos`` cannot be a record boundary (subclasses know their alignment)."""

    def delete_files_before(self, pos: int) -> int:
        """Delete every file that ends at or before ``pos``; return how many were deleted.

        The file being written is always kept, so positions stay continuous.
        """
        count = 0
        last = self._queue.last_written()
        for mf in self._queue.files:
            if mf is last or mf.file_from_offset + self.file_bytes > pos:
                break
            count += 1
        if count:
            failpoints.inject("retention_before_delete")
            self._queue.delete_first(count)
        return count

    def close(self) -> None:
        """Unmap and close every file (no flush: call ``flush`` first for durability)."""
        self._queue.close()


class TimerLog(SegmentedLog):
    """The TimerLog files of one directory; see the module docstring for the layout."""

    blank_size = BLANK_SIZE

    def __init__(
        self, directory: Path | str, file_bytes: int = DEFAULT_TIMER_LOG_FILE_BYTES
    ) -> None:
        if file_bytes < UNIT_SIZE + BLANK_SIZE:
            raise ValueError(f"file_bytes must be at least {UNIT_SIZE + BLANK_SIZE}")
        super().__init__(directory, file_bytes)

    def append(self, unit: TimerUnit) -> int:
        """Write ``unit`` at the end of the log; return its position."""
        if unit.size != UNIT_SIZE or not magic_is_valid(unit.magic) or unit.prev_pos < -1:
            raise ValueError(f"invalid timer unit {unit}")
        return self.append_fields(
            unit.prev_pos,
            unit.magic,
            unit.curr_write_time_ms,
            unit.delayed_time_ms,
            unit.offset_py,
            unit.size_py,
            unit.hash_topic,
        )

    def append_fields(
        self,
        prev_pos: int,
        magic: int,
        curr_write_time_ms: int,
        delayed_time_ms: int,
        offset_py: int,
        size_py: int,
        hash_topic: int,
    ) -> int:
        """:meth:`append` without building a :class:`TimerUnit` (hot path); same checks."""
        if not magic_is_valid(magic) or prev_pos < -1:
            raise ValueError(f"invalid timer unit: magic {magic}, prev_pos {prev_pos}")
        mf = self._file_for_append(UNIT_SIZE)
        at = mf.wrote_position
        try:
            UNIT.pack_into(
                mf.view,
                at,
                UNIT_SIZE,
                prev_pos,
                magic,
                curr_write_time_ms,
                delayed_time_ms,
                offset_py,
                size_py,
                hash_topic,
                0,
            )
        except struct.error as exc:
            # Nothing was written: pack_into checks every value before touching the buffer.
            raise ValueError(f"timer unit field out of range: {exc}") from None
        mf.wrote_position = at + UNIT_SIZE
        return mf.file_from_offset + at

    def _write_blank(self, mf: MappedFile) -> None:
        BLANK.pack_into(mf.view, mf.wrote_position, mf.free_bytes, 0, BLANK_MAGIC_CODE)
        mf.wrote_position = self.file_bytes

    def read(self, pos: int) -> TimerUnit:
        """The unit at ``pos``; raises :class:`PositionError` or :class:`TornRecordError`."""
        mf = self._file_for_read(pos, BLANK_SIZE)  # a blank is shorter than a unit
        local = pos - mf.file_from_offset
        if local % UNIT_SIZE:
            raise PositionError(f"timer log position {pos} is not at a unit boundary")
        if local + UNIT_SIZE <= mf.wrote_position:
            fields = UNIT.unpack_from(mf.view, local)
            size, prev_pos, magic = fields[0], fields[1], fields[2]
            if size == UNIT_SIZE and magic_is_valid(magic) and prev_pos >= -1:
                return TimerUnit(
                    size=size,
                    prev_pos=prev_pos,
                    magic=magic,
                    curr_write_time_ms=fields[3],
                    delayed_time_ms=fields[4],
                    offset_py=fields[5],
                    size_py=fields[6],
                    hash_topic=fields[7],
                )
        size, _, magic = BLANK.unpack_from(mf.view, local)
        if magic == BLANK_MAGIC_CODE:
            raise TornRecordError(f"timer log position {pos} holds a blank end-of-file record")
        if local + UNIT_SIZE > mf.wrote_position:
            raise PositionError(f"timer log: no unit at {pos} (written up to {self.max_pos})")
        raise TornRecordError(
            f"timer log position {pos} holds a torn unit (size {size}, magic {magic})"
        )

    def iter_units(
        self, start_pos: int, end_pos: int | None = None
    ) -> Iterator[tuple[int, TimerUnit]]:
        """``(position, unit)`` for every unit in ``[start_pos, end_pos)``, oldest first.

        Blank records are skipped (the walk goes on in the next file); ``end_pos`` defaults to
        ``max_pos``. ``start_pos`` must be a unit boundary.
        """
        end = self.max_pos if end_pos is None else min(end_pos, self.max_pos)
        pos = start_pos
        while pos < end:
            mf = self._file_for_read(pos, BLANK_SIZE)
            local = pos - mf.file_from_offset
            magic = int.from_bytes(mf.view[local + 12 : local + 16], "big", signed=True)
            if magic == BLANK_MAGIC_CODE:
                pos = mf.file_from_offset + self.file_bytes
                continue
            yield pos, self.read(pos)
            pos += UNIT_SIZE

    def flush(self) -> int:
        """fdatasync every file written since the last flush; return the durable end position."""
        failpoints.inject("timer_log_before_flush")
        return self._flush_files()

    def _check_boundary(self, pos: int) -> None:
        if pos % self.file_bytes % UNIT_SIZE:
            raise PositionError(f"timer log position {pos} is not at a unit boundary")

    def _scan_end(self, mf: MappedFile) -> int:
        """Local end of the valid units of ``mf``: at the first non-unit, or the file end if a
        blank record closes it. Vectorised over the fixed 52-byte stride."""
        count = (self.file_bytes - BLANK_SIZE) // UNIT_SIZE + 1
        sizes = np.ndarray((count,), dtype=">i4", buffer=mf.view, offset=0, strides=(UNIT_SIZE,))
        magics = np.ndarray(
            (count,), dtype=">i4", buffer=mf.view, offset=_MAGIC_OFFSET, strides=(UNIT_SIZE,)
        )
        valid = (
            (sizes == UNIT_SIZE) & ((magics & MAGIC_DEFAULT) != 0) & ((magics & ~_MAGIC_ALL) == 0)
        )
        bad = np.flatnonzero(~valid)
        k = int(bad[0]) if bad.size else count
        del sizes, magics, valid  # release the buffer exports before the map can be closed
        local = k * UNIT_SIZE
        if local + BLANK_SIZE <= self.file_bytes:
            size, _, magic = BLANK.unpack_from(mf.view, local)
            if magic == BLANK_MAGIC_CODE and size == self.file_bytes - local:
                return self.file_bytes
        return local
