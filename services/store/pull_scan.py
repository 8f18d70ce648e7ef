"""The read of a pull: from a slice of consume-queue units to the records a GetResult carries.

``MessageStore.get_messages`` finds the units from the asked queue offset; :class:`UnitScan`
walks them with SPEC §6.7's rules, unit by unit in this order:

1. a pre-blank unit, or one in a commitlog file already found removed, is skipped;
2. a record ending past the confirm offset (replication) ends the queue for readers;
3. the count and byte caps end the pull (smaller caps when the record lies far enough behind the
   commitlog's end to count as on disk); the first record is never capped;
4. the tags filter skips a unit; a record that cannot be read (its file removed under the
   reader) is skipped with the rest of its file; the record filter skips a record;
5. the record is taken.

Why segments: a Python loop per unit with one ``commitlog.read`` and one copy per record cost
~1.3 µs per pulled message. The scan instead decodes a window of units with one ``struct``
call. In a queue the store wrote, records follow each other in the commitlog (each unit's
record starts at or after the previous one's end), so within a window offsets and record
ends increase, and whether a unit is on disk, within the caps, within the confirm offset or
inside a mapped file's written bytes is decided for a whole *segment* of units by bisection
(C-level ``accumulate``, ``map``, ``bisect``). A segment's records are copied by one list
comprehension slicing the file's map (one ``bytes`` per record, which every caller wants).

Not one copy per run of contiguous records (a producer's batch), cut later: measured in a
broker serving raw pulls, those ~150 KiB copies, cut and joined again, cost more than they
saved (7.0-7.5 µs of broker CPU per message against 5.2-5.9 before this module and 4.0-4.5
with per-record copies).

Where a segment stops (a unit the tags filter drops, a cap, a removed file), the unit there
goes through :meth:`UnitScan._walk`, the rules above spelled out unit by unit, so every edge
keeps its exact outcome; then segments resume. A stretch of units the tags filter drops is
passed over at once when none of them could end the scan. A window whose units are not in
commitlog order or have sizes no record has (pre-blank units, hand-made or damaged queues),
every window under a record filter (SQL92, a Python call per record anyway), and a window
where kept and dropped units alternate finely are walked unit by unit.
"""

from __future__ import annotations

import enum
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from operator import add, ne, sub
from typing import TYPE_CHECKING

from services.store.consume_queue import CQ_UNIT_BYTES, PRE_BLANK_SIZE
from services.store.types import PhysicalOffset

if TYPE_CHECKING:
    from services.store.commitlog import CommitLog
    from services.store.config import StoreConfig
    from services.store.mapped_file import MappedFile


class GetStatus(enum.Enum):
    """``GetMessageStatus`` of SPEC §6.7."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    suggest_pull_from_slave: bool = False


TagsFilter = Callable[[int], bool]
"""Given a unit's tags code, True if the message may match (hash-level check). It must have
no side effects: the scan may ask it about units past the point where the pull stops."""
RecordFilter = Callable[[memoryview], bool]
"""Given the stored record, True if it matches (property-level check, e.g. SQL92)."""

WINDOW_MIN_UNITS = 64
"""Units decoded at once at least (a filtered scan reads many units per record taken)."""
WINDOW_MAX_UNITS = 1024
"""…and at most (bounds the decode of units the pull may never reach, and the cache below)."""


WINDOW_STEP_UNITS = 32
"""Window sizes are multiples of this (one compiled struct per size, cached below)."""
_SIZE = struct.Struct(">i")
_SIZE_AT = 8
"""The size field's place in a unit (after the 8-byte offset)."""


@lru_cache(maxsize=128)
def _units_struct(count: int, with_tags: bool) -> struct.Struct:
    """``count`` consume-queue units (SPEC §11.2: offset q, size i, tags code q) in one call;
    without ``with_tags`` the tags codes are skipped (a third fewer ints to build)."""
    return struct.Struct(">" + ("qiq" if with_tags else "qi8x") * count)


class UnitScan:
    """One scan of consume-queue units into ``result`` (see the module doc)."""

    __slots__ = (
        "commitlog",
        "confirm",
        "disk_below",
        "disk_caps",
        "last_py",
        "memory_caps",
        "next_file_start",
        "offset",
        "record_filter",
        "result",
        "tags_filter",
        "total",
    )

    def __init__(
        self,
        result: GetResult,
        commitlog: CommitLog,
        config: StoreConfig,
        max_msgs: int,
        memory_limit: int,
        confirm: int | None,
        tags_filter: TagsFilter | None,
        record_filter: RecordFilter | None,
    ) -> None:
        self.result = result
        self.commitlog = commitlog
        self.offset = result.next_begin_offset
        """Queue offset of the first unit."""
        self.disk_below = commitlog.max_offset - memory_limit
        """A record starting below this offset counts as on disk (SPEC §6.7)."""
        self.memory_caps = (
            min(max_msgs, config.max_transfer_count_in_memory),
            config.max_transfer_bytes_in_memory,
        )
        self.disk_caps = (
            min(max_msgs, config.max_transfer_count_on_disk),
            config.max_transfer_bytes_on_disk,
        )
        self.confirm = confirm
        self.tags_filter = tags_filter
        self.record_filter = record_filter
        self.next_file_start = 0
        """Units below this offset are in a file found removed: skipped without a read."""
        self.total = 0
        """Bytes taken so far."""
        self.last_py = 0
        """Offset of the last record taken."""

    def scan(self, units: memoryview) -> GetResult:
        count = len(units) // CQ_UNIT_BYTES
        with_tags = self.tags_filter is not None
        i = 0
        stopped = False
        while i < count and not stopped:
            size = min(count - i, self._window_units(units, i))
            flat = _units_struct(size, with_tags).unpack_from(units, i * CQ_UNIT_BYTES)
            if with_tags:
                done, stopped = self._window(i, flat[0::3], flat[1::3], flat[2::3])
            else:
                done, stopped = self._window(i, flat[0::2], flat[1::2], None)
            i += done
        result = self.result
        result.next_begin_offset = self.offset + i
        if self.last_py:
            result.suggest_pull_from_slave = self.last_py < self.disk_below
        return result

    def _window_units(self, units: memoryview, i: int) -> int:
        """How many units to decode from unit ``i``: about what the caps leave room for, if
        records are the size of the first (rounded up, so few struct formats are compiled)."""
        taken = len(self.result.records)
        want = max(self.memory_caps[0], self.disk_caps[0]) - taken
        (first_size,) = _SIZE.unpack_from(units, i * CQ_UNIT_BYTES + _SIZE_AT)
        if 0 < first_size < PRE_BLANK_SIZE:
            room = max(self.memory_caps[1], self.disk_caps[1]) - self.total
            want = min(want, room // first_size + 1)
        want = max(WINDOW_MIN_UNITS, min(want, WINDOW_MAX_UNITS))
        return -(-want // WINDOW_STEP_UNITS) * WINDOW_STEP_UNITS

    def _window(
        self,
        first: int,
        offsets: tuple[int, ...],
        sizes: tuple[int, ...],
        tags: tuple[int, ...] | None,
    ) -> tuple[int, bool]:
        """Units ``first``… decoded (``tags`` only for a tags filter); returns (units
        consumed, whether the scan stopped)."""
        count = len(offsets)
        # taken_tags[k]: the tags filter keeps unit k (False past the last unit).
        taken_tags = None
        if tags is not None and self.tags_filter is not None:
            taken_tags = list(map(self.tags_filter, tags))
            taken_tags.append(False)
            # Kept and dropped units mixed finely (tags alternating): segments would be one
            # unit long and cost more than the plain walk.
            if sum(map(ne, taken_tags[1:], taken_tags[:-1])) > count // 4:
                return self._walk(first, 0, count, offsets, sizes, taken_tags)
            if True not in taken_tags and self._skip(0, offsets, sizes, taken_tags) == count:
                return count, False  # a window of units all dropped by the filter
        if self.record_filter is not None or min(sizes) <= 0 or max(sizes) >= PRE_BLANK_SIZE:
            return self._walk(first, 0, count, offsets, sizes, taken_tags)
        sums = list(accumulate(sizes, initial=0))
        """sums[k]: bytes of the window's units before k."""
        # lags[k] = offsets[k] - sums[k] grows by the gap before each record: in commitlog
        # order (each record at or after the end of the one before) the lags never fall.
        lags = list(map(sub, offsets, sums))
        if lags != sorted(lags):
            return self._walk(first, 0, count, offsets, sizes, taken_tags)
        j = 0
        last = count - 1
        while j < count:
            if taken_tags is None:
                taken = self._segment(first, j, offsets, sizes, sums, None)
            elif taken_tags[j] and taken_tags[j + 1]:
                taken = self._segment(first, j, offsets, sizes, sums, taken_tags)
            elif j < last and not taken_tags[j] and not taken_tags[j + 1]:
                taken = self._skip(j, offsets, sizes, taken_tags)
            else:
                taken = 0  # a lone unit between others the filter treats otherwise
            if taken:
                j += taken
                continue
            done, stopped = self._walk(first, j, j + 1, offsets, sizes, taken_tags)
            if stopped:
                return done, True
            j += 1
        return count, False

    def _segment(
        self,
        first: int,
        j: int,
        offsets: tuple[int, ...],
        sizes: tuple[int, ...],
        sums: list[int],
        taken_tags: list[bool] | None,
    ) -> int:
        """Take the longest segment from unit ``j`` of an ordered window at ``first`` that the
        per-unit rules would take whole; its length (0: unit ``j`` needs :meth:`_walk`)."""
        start = offsets[j]
        if start < self.next_file_start:
            return 0
        end = len(offsets) if taken_tags is None else taken_tags.index(False, j)
        # On disk, then in memory, never back: offsets increase.
        if start >= self.disk_below:
            most, cap_bytes = self.memory_caps
        else:
            end = bisect_left(offsets, self.disk_below, j, end)
            most, cap_bytes = self.disk_caps
        base = sums[j]
        within_bytes = bisect_right(sums, cap_bytes - self.total + base, j + 1, end + 1) - 1
        # (A first record alone over the byte cap is left to _walk, which never caps it.)
        end = min(end, j + most - len(self.result.records), within_bytes)
        if end > j and self.confirm is not None:
            ends = list(map(add, offsets[j:end], sizes[j:end]))  # increasing, like offsets
            end = j + bisect_right(ends, self.confirm)
        mf = self.commitlog.files.find(start) if end > j else None
        if mf is None:
            return 0
        # Whole records below the file's write position (a file's end holds a BLANK).
        written_end = mf.file_from_offset + mf.wrote_position
        end = bisect_left(offsets, written_end, j, end)
        if end > j and offsets[end - 1] + sizes[end - 1] > written_end:
            end -= 1
        if end == j:
            return 0
        self._copy(mf, first, j, end, offsets, sizes, sums)
        return end - j

    def _copy(
        self,
        mf: MappedFile,
        first: int,
        j: int,
        end: int,
        offsets: tuple[int, ...],
        sizes: tuple[int, ...],
        sums: list[int],
    ) -> None:
        """Take units ``j``…``end`` of the window at ``first``, all in ``mf``."""
        result = self.result
        result.records.extend(mf.copies(offsets[j:end], sizes[j:end]))
        queue_offset = self.offset + first
        result.queue_offsets.extend(range(queue_offset + j, queue_offset + end))
        result.status = GetStatus.FOUND
        self.total += sums[end] - sums[j]
        self.last_py = offsets[end - 1]

    def _skip(
        self, j: int, offsets: tuple[int, ...], sizes: tuple[int, ...], taken_tags: list[bool]
    ) -> int:
        """How many units from ``j``, all dropped by the tags filter, can be passed over at
        once: none of them could end the scan first (rules 2 and 3). 0: go unit by unit."""
        try:
            end = taken_tags.index(True, j, len(offsets))
        except ValueError:
            end = len(offsets)
        taken_count = len(self.result.records)
        if taken_count:
            # Caps that bind both on disk and in memory: no unit of the block can reach them.
            most = min(self.memory_caps[0], self.disk_caps[0])
            cap_bytes = min(self.memory_caps[1], self.disk_caps[1])
            if taken_count >= most or self.total + max(sizes[j:end]) > cap_bytes:
                return 0
        confirm = self.confirm
        if confirm is not None and max(map(add, offsets[j:end], sizes[j:end])) > confirm:
            return 0
        return end - j

    def _walk(
        self,
        first: int,
        j: int,
        end: int,
        offsets: tuple[int, ...],
        sizes: tuple[int, ...],
        taken_tags: list[bool] | None,
    ) -> tuple[int, bool]:
        """The rules of the module doc, unit by unit, for units ``j``…``end`` of the window
        at ``first`` (``taken_tags``: the tags filter's verdicts); returns (the unit after the
        last one walked, whether the scan ends before it)."""
        result = self.result
        confirm, disk_below, record_filter = self.confirm, self.disk_below, self.record_filter
        disk_most, disk_bytes = self.disk_caps
        memory_most, memory_bytes = self.memory_caps
        find, queue_offset = self.commitlog.files.find, self.offset + first
        taken_count, total, last_py = len(result.records), self.total, self.last_py
        stopped = False
        k = j
        for k in range(j, end):
            offset, size = offsets[k], sizes[k]
            if size == PRE_BLANK_SIZE or offset < self.next_file_start:
                continue
            if confirm is not None and offset + size > confirm:
                # Not yet on every in-sync replica: the queue ends here for readers.
                if first + k == 0:
                    result.status = GetStatus.OFFSET_OVERFLOW_ONE
                stopped = True
                break
            if taken_count and (
                (taken_count >= disk_most or total + size > disk_bytes)
                if offset < disk_below
                else (taken_count >= memory_most or total + size > memory_bytes)
            ):
                stopped = True
                break
            if taken_tags is not None and not taken_tags[k]:
                continue
            # CommitLog.read, inlined (the path of every lone record): all ``size`` bytes
            # below the file's write position, or the record is gone.
            mf = find(offset)
            pos = offset - mf.file_from_offset if mf is not None else 0
            if mf is None or (size != 0 and (size < 0 or pos + size > mf.wrote_position)):
                if not taken_count:
                    result.status = GetStatus.MESSAGE_WAS_REMOVING
                self.next_file_start = self.commitlog.next_file_start(PhysicalOffset(offset))
                continue
            if record_filter is None:
                result.records.append(mf.copy(pos, size))
            elif record_filter(data := mf.view[pos : pos + size]):
                result.records.append(bytes(data))
            else:
                continue
            result.queue_offsets.append(queue_offset + k)
            result.status = GetStatus.FOUND
            taken_count += 1
            total += size
            last_py = offset
        self.total, self.last_py = total, last_py
        return (k, True) if stopped else (end, False)
