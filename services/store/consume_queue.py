"""ConsumeQueue: per (topic, queue id), an array of fixed 20-byte units pointing into the commitlog.

Unit layout (SPEC §11.2), big-endian:

| field            | bytes | meaning                                               |
|------------------|-------|-------------------------------------------------------|
| commitlog offset | 8     | physical offset of the record                          |
| size             | 4     | the record's TOTALSIZE                                 |
| tags code        | 8     | hash of the TAGS property (0 when none)               |

Files hold 300 000 units (6 000 000 bytes) and are named by their start *byte* offset (0,
6000000, …), so unit ``i`` lives at byte ``(i mod 300 000) × 20`` of file ``⌊i / 300 000⌋``
(SPEC §15). Path: ``consumequeue/{topic}/{queueId}/{fileName}``.

A unit whose size is 0 was never written. A "pre-blank" unit (offset 0, size 0x7FFFFFFF) fills
the positions before a queue's first real unit when the queue starts past 0 (rebuilt after
the commitlog files it indexed were deleted).

``put`` is idempotent on the queue offset: recovery re-dispatches records from a point the
queue may already cover, and a unit that is already there is skipped, never duplicated.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from services.store.mapped_file import MappedFileQueue
from services.store.types import PhysicalOffset, QueueOffset

CQ_UNIT = struct.Struct(
    ">q"  # commitlog offset
    "i"  # size
    "q"  # tags code
)
CQ_UNIT_BYTES = CQ_UNIT.size
assert CQ_UNIT_BYTES == 20
DEFAULT_UNITS_PER_FILE = 300_000
PRE_BLANK_SIZE = 0x7FFFFFFF
_FIRST = QueueOffset(0)


class ConsumeQueue:
    """One queue's units."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        queue_id: int,
        units_per_file: int = DEFAULT_UNITS_PER_FILE,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.files = MappedFileQueue(directory, units_per_file * CQ_UNIT_BYTES, create_ahead=False)
        self.min_logic_offset = 0
        """Byte offset of the first unit whose record is still in the commitlog."""
        self.max_physical_end = 0
        """Physical offset just past the last record this queue points at."""

    # -- offsets ---------------------------------------------------------------------------
    @property
    def min_offset(self) -> QueueOffset:
        return QueueOffset(max(self.min_logic_offset, self.files.min_offset()) // CQ_UNIT_BYTES)

    @property
    def max_offset(self) -> QueueOffset:
        """One past the last unit: the queue offset the next message gets."""
        return QueueOffset(self.files.max_offset() // CQ_UNIT_BYTES)

    # -- write -----------------------------------------------------------------------------
    def put(
        self, queue_offset: QueueOffset, commitlog_offset: PhysicalOffset, size: int, tags_code: int
    ) -> bool:
        """Write one unit at ``queue_offset``; False if already present (idempotent re-dispatch)."""
        unit = CQ_UNIT.pack(commitlog_offset, size, tags_code)
        return self.put_many(queue_offset, unit, PhysicalOffset(commitlog_offset + size))

    def put_many(
        self, first_queue_offset: QueueOffset, units: bytes, physical_end: PhysicalOffset
    ) -> bool:
        """Write consecutive packed units starting at ``first_queue_offset``.

        Units already on disk are skipped; a gap (the queue starts later than its files, e.g.
        after retention) is filled with pre-blank units. Returns False if nothing was new.
        """
        at = first_queue_offset * CQ_UNIT_BYTES
        files = self.files.files
        if files:
            # Fast path, the common case (a unit or a run appended at the end of the last
            # file): dispatch calls this once per run, often once per record.
            last = files[-1]
            pos = last.wrote_position
            if at == last.file_from_offset + pos and pos + len(units) <= last.file_size_bytes:
                last.append(units)
                self.max_physical_end = max(self.max_physical_end, physical_end)
                return True
        expected = self.files.max_offset()
        if at + len(units) <= expected and self.files.files:
            return False
        if at < expected:
            skip = expected - at
            units = units[skip:]
            at = expected
        if not self.files.files:
            self.min_logic_offset = at
        elif at > expected:
            self._fill_pre_blank(expected, at)
        view = memoryview(units)
        while view:
            mf = self.files.writable_file(at)
            if mf.file_from_offset + mf.wrote_position < at:  # first file, starting mid-way
                mf.append(_pre_blank(at - mf.file_from_offset - mf.wrote_position))
            n = min(len(view), mf.free_bytes)
            mf.append(view[:n])
            view = view[n:]
            at += n
        self.max_physical_end = max(self.max_physical_end, physical_end)
        return True

    def _fill_pre_blank(self, start: int, end: int) -> None:
        while start < end:
            mf = self.files.writable_file(start)
            n = min(end - start, mf.free_bytes)
            mf.append(_pre_blank(n))
            start += n

    # -- read ------------------------------------------------------------------------------
    def unit(self, queue_offset: int) -> tuple[PhysicalOffset, int, int] | None:
        """(commitlog offset, size, tags code) of one unit, or None outside the queue.

        ``queue_offset`` is a :class:`QueueOffset`; typed ``int`` because the binary searches
        here probe computed midpoints (and the admin service passes wire values)."""
        if queue_offset < self.min_offset or queue_offset >= self.max_offset:
            return None
        at = queue_offset * CQ_UNIT_BYTES
        mf = self.files.find(at)
        if mf is None:
            return None
        data = mf.read(at - mf.file_from_offset, CQ_UNIT_BYTES)
        if len(data) < CQ_UNIT_BYTES:
            return None
        off, size, tags = CQ_UNIT.unpack(data)
        return off, size, tags

    def units_from(self, queue_offset: QueueOffset, max_units: int) -> memoryview:
        """Raw units from ``queue_offset``, up to ``max_units`` and never past a file's end."""
        at = queue_offset * CQ_UNIT_BYTES
        mf = self.files.find(at)
        if mf is None:
            return memoryview(b"")
        return mf.read(at - mf.file_from_offset, max_units * CQ_UNIT_BYTES)

    def iter_units(
        self, start: QueueOffset = _FIRST
    ) -> Iterator[tuple[QueueOffset, PhysicalOffset, int, int]]:
        """Every written unit from queue offset ``start``: (queue offset, offset, size, tags)."""
        qoff: int = max(start, self.min_offset)
        end = self.max_offset
        while qoff < end:
            chunk = self.units_from(QueueOffset(qoff), min(end - qoff, 4096))
            if not chunk:
                return
            for off, size, tags in CQ_UNIT.iter_unpack(chunk):
                yield QueueOffset(qoff), off, size, tags
                qoff += 1

    def offset_by_time(
        self, timestamp_ms: int, store_time: Callable[[PhysicalOffset, int], int | None]
    ) -> QueueOffset:
        """First queue offset whose record was stored at or after ``timestamp_ms``.

        Binary search over the units, reading each probe's store time from the commitlog with
        ``store_time(offset, size)``; units whose record is gone count as "before". Returns
        ``max_offset`` when every message is older.
        """
        lo, hi = int(self.min_offset), int(self.max_offset)
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            ts = store_time(u[0], u[1]) if u and u[1] != PRE_BLANK_SIZE else None
            if ts is None or ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return QueueOffset(lo)

    # -- recovery and retention ------------------------------------------------------------
    def find_written_end(self) -> int:
        """Set each file's write position from its contents; return the queue's byte end.

        Units are written in order and a written unit never has size 0, so the first empty
        unit of a file is found by binary search; files after a partly written one are empty.
        Writes nothing, so the read-only inspector uses it too.
        """
        end_at = self.files.min_offset()
        full = True
        for mf in self.files:
            if not full:
                mf.wrote_position = mf.flushed_position = 0
                continue
            n_units = mf.file_size_bytes // CQ_UNIT_BYTES
            lo, hi = 0, n_units
            while lo < hi:
                mid = (lo + hi) // 2
                _off, size, _tags = CQ_UNIT.unpack_from(mf.view, mid * CQ_UNIT_BYTES)
                if size != 0:
                    lo = mid + 1
                else:
                    hi = mid
            mf.wrote_position = mf.flushed_position = lo * CQ_UNIT_BYTES
            end_at = mf.file_from_offset + mf.wrote_position
            full = lo == n_units
        return end_at

    def recover(self, commitlog_max_offset: PhysicalOffset) -> None:
        """Find the last valid unit; drop units pointing at or past the commitlog's end."""
        self.files.truncate(self.find_written_end())
        # Now drop units whose record lies beyond the commitlog (its tail was torn).
        while self.max_offset > self.min_offset:
            u = self.unit(self.max_offset - 1)
            if u is None:
                break
            off, size, _ = u
            if size != PRE_BLANK_SIZE and off + size > commitlog_max_offset:
                self.files.truncate((self.max_offset - 1) * CQ_UNIT_BYTES)
                continue
            self.max_physical_end = off + size if size != PRE_BLANK_SIZE else 0
            break
        if self.files.files and self.min_logic_offset < self.files.min_offset():
            self.min_logic_offset = self.files.min_offset()

    def correct_min_offset(self, commitlog_min_offset: PhysicalOffset) -> None:
        """Advance the logical minimum past units whose records retention deleted."""
        lo, hi = int(self.min_offset), int(self.max_offset)
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is not None and (u[1] == PRE_BLANK_SIZE or u[0] < commitlog_min_offset):
                lo = mid + 1
            else:
                hi = mid
        self.min_logic_offset = lo * CQ_UNIT_BYTES

    def delete_files_before(self, commitlog_min_offset: PhysicalOffset) -> int:
        """Delete whole files whose every unit points below ``commitlog_min_offset``."""
        count = 0
        for mf in self.files.files[:-1]:
            # A copy, not a view: a view left in ``last`` would keep the map exported and make
            # delete_first's close() raise BufferError.
            last = bytes(mf.read(mf.file_size_bytes - CQ_UNIT_BYTES, CQ_UNIT_BYTES))
            if len(last) < CQ_UNIT_BYTES:
                break
            off, size, _ = CQ_UNIT.unpack(last)
            if off + size > commitlog_min_offset and size != PRE_BLANK_SIZE:
                break
            count += 1
        self.files.delete_first(count)
        self.correct_min_offset(commitlog_min_offset)
        return count

    def physical_end(self) -> PhysicalOffset:
        return PhysicalOffset(self.max_physical_end)

    def flush(self) -> None:
        self.files.flush()

    def close(self) -> None:
        self.files.close()


def _pre_blank(nbytes: int) -> bytes:
    return CQ_UNIT.pack(0, PRE_BLANK_SIZE, 0) * (nbytes // CQ_UNIT_BYTES)
