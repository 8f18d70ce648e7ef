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

Why runs: a producer's batch lands contiguously in the commitlog, so consecutive units of a
queue usually point at consecutive records (``offset == previous offset + previous size``).
A Python loop per unit with one ``commitlog.read`` and one copy per record cost ~1.3 µs per
pulled message; the scan instead decodes a window of units with one ``struct`` call and
finds, with C-level list operations (``map``, ``accumulate``, ``bisect``), the longest run of
units that rules 1-5 would all take: contiguous, not filtered out, within the caps and the
confirm offset, inside one mapped file's written bytes. Such a run is copied with one
``bytes()``. Where a run stops (a filtered unit, a cap, a removed file, a gap), the unit
there goes through :meth:`UnitScan._one`, the rules above spelled out for one unit, so every
edge keeps its exact outcome; then runs resume. A record filter (SQL92) is a Python call per
record anyway: with one, every unit takes the per-unit path.

Within a run offsets strictly increase (sizes are checked positive), which is what lets a
run's in-memory/on-disk state, its confirm bound and its file be decided by bisection.
"""

from __future__ import annotations

import enum
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from operator import sub
from typing import TYPE_CHECKING

from services.store.consume_queue import CQ_UNIT_BYTES, PRE_BLANK_SIZE
from services.store.types import PhysicalOffset

if TYPE_CHECKING:
    from services.store.commitlog import CommitLog
    from services.store.config import StoreConfig


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
    """What a read returns. The found records are kept as copied runs (each one or more whole
    records back to back): :attr:`payload` is all of them in one ``bytes`` (what a Pull
    response carries), :attr:`records` cuts them into one ``bytes`` per record on first use."""

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: list[int] = field(default_factory=list)
    suggest_pull_from_slave: bool = False
    runs: list[bytes] = field(default_factory=list)
    """Copies of the found records, in queue order; each holds ``run_counts[i]`` records."""
    run_counts: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    """Each found record's size in bytes, in queue order."""
    _records: list[bytes] | None = None

    @property
    def records(self) -> list[bytes]:
        """One ``bytes`` per found record, in queue order (cut from the runs once)."""
        if self._records is None:
            self._records = _cut(self.runs, self.run_counts, self.sizes)
        return self._records

    @property
    def payload(self) -> bytes:
        """Every found record back to back: ``b"".join(records)`` without cutting them."""
        runs = self.runs
        return runs[0] if len(runs) == 1 else b"".join(runs)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def _cut(runs: list[bytes], counts: list[int], sizes: list[int]) -> list[bytes]:
    out: list[bytes] = []
    at = 0
    for run, count in zip(runs, counts, strict=True):
        if count == 1:
            out.append(run)  # a lone record is its run: no second copy
        else:
            # One C call cuts the run: the format names each record's size ("1200s1201s…").
            fmt = "s".join(map(str, sizes[at : at + count])) + "s"
            out.extend(struct.unpack(fmt, run))
        at += count
    return out


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
        taken = len(self.result.sizes)
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
        sums = list(accumulate(sizes, initial=0))
        """sums[k]: bytes of units before k; a run's records span sums[j]…sums[j + n]."""
        # Unit k continues a run from unit j iff offsets[k] - sums[k] == offsets[j] - sums[j]:
        # ``lags`` holds that difference, which only grows (by each gap between records).
        lags = list(map(sub, offsets, sums))
        plain = min(sizes) > 0 and max(sizes) < PRE_BLANK_SIZE
        # taken_tags[k]: the tags filter keeps unit k (False past the last unit).
        taken_tags = None
        if tags is not None and self.tags_filter is not None:
            taken_tags = list(map(self.tags_filter, tags))
            taken_tags.append(False)
        j = 0
        while j < count:
            if self.record_filter is None:
                taken = self._run(first, j, offsets, sizes, sums, lags, plain, taken_tags)
                if taken:
                    j += taken
                    continue
            if self._one(first + j, offsets[j], sizes[j], tags[j] if tags is not None else 0):
                return j, True
            j += 1
        return count, False

    def _run(
        self,
        first: int,
        j: int,
        offsets: tuple[int, ...],
        sizes: tuple[int, ...],
        sums: list[int],
        lags: list[int],
        plain: bool,
        taken_tags: list[bool] | None,
    ) -> int:
        """Take the longest run from unit ``j`` of the window at ``first`` that the per-unit
        rules would take whole; its length (0: unit ``j`` needs :meth:`_one`)."""
        start = offsets[j]
        if start < self.next_file_start:
            return 0
        n = _run_length(lags, j)
        if taken_tags is not None:
            n = min(n, taken_tags.index(False, j) - j)
        if not plain:
            n = _plain_sizes(sizes, j, n)
        if n == 0:
            return 0
        # Offsets increase along the run: on disk, then in memory, never back.
        if start >= self.disk_below:
            most, cap_bytes = self.memory_caps
        else:
            n = bisect_left(offsets, self.disk_below, j, j + n) - j
            most, cap_bytes = self.disk_caps
        # A unit's end offset is start + sums[k + 1] - sums[j]: bound the ends by bisection.
        base = sums[j]
        taken_count = len(self.result.sizes)
        within_bytes = bisect_right(sums, cap_bytes - self.total + base, j + 1, j + n + 1) - j - 1
        # (A first record alone over the byte cap is left to _one, which never caps it.)
        n = min(n, most - taken_count, within_bytes)
        if self.confirm is not None:
            n = bisect_right(sums, self.confirm - start + base, j + 1, j + n + 1) - j - 1
        mf = self.commitlog.files.find(start) if n > 0 else None
        if mf is None:
            return 0
        pos = start - mf.file_from_offset
        # Only whole records below the file's write position (the next file has the rest).
        n = bisect_right(sums, mf.wrote_position - pos + base, j + 1, j + n + 1) - j - 1
        if n <= 0:
            return 0
        length = sums[j + n] - base
        run = bytes(mf.view[pos : pos + length])
        self._take(run, n, sizes[j : j + n], self.offset + first + j, offsets[j + n - 1])
        return n

    def _take(
        self, run: bytes, count: int, sizes: tuple[int, ...], queue_offset: int, last: int
    ) -> None:
        """Add ``count`` records copied as ``run`` (the first at ``queue_offset``, the last at
        commitlog offset ``last``)."""
        result = self.result
        result.runs.append(run)
        result.run_counts.append(count)
        result.sizes.extend(sizes)
        result.queue_offsets.extend(range(queue_offset, queue_offset + count))
        result.status = GetStatus.FOUND
        self.total += len(run)
        self.last_py = last

    def _one(self, index: int, offset: int, size: int, tags: int) -> bool:
        """The rules of the module doc for the unit at ``index``; True if the scan ends
        before it."""
        if size == PRE_BLANK_SIZE or offset < self.next_file_start:
            return False
        result = self.result
        if self.confirm is not None and offset + size > self.confirm:
            # Not yet on every in-sync replica: the queue ends here for readers.
            if index == 0:
                result.status = GetStatus.OFFSET_OVERFLOW_ONE
            return True
        taken_count = len(result.sizes)
        most, cap_bytes = self.disk_caps if offset < self.disk_below else self.memory_caps
        if taken_count and (taken_count >= most or self.total + size > cap_bytes):
            return True
        if self.tags_filter is not None and not self.tags_filter(tags):
            return False
        data = self.commitlog.read(PhysicalOffset(offset), size)
        if data is None:
            if not taken_count:
                result.status = GetStatus.MESSAGE_WAS_REMOVING
            self.next_file_start = self.commitlog.next_file_start(PhysicalOffset(offset))
            return False
        if self.record_filter is not None and not self.record_filter(data):
            return False
        self._take(bytes(data), 1, (size,), self.offset + index, offset)
        return False


def _run_length(lags: list[int], j: int) -> int:
    """Units from ``j`` with the lag of unit ``j``: contiguous records. Lags only grow in a
    queue written by the store, so bisection finds the run's end; units written otherwise
    (hand-made, damaged) are caught by the count and walked one by one."""
    lag = lags[j]
    end = bisect_right(lags, lag, j)
    if lags[j:end].count(lag) == end - j:
        return end - j
    k = j + 1
    while k < len(lags) and lags[k] == lag:
        k += 1
    return k - j


def _plain_sizes(sizes: tuple[int, ...], j: int, n: int) -> int:
    """How many of the ``n`` units from ``j`` precede the first with a size no run may hold
    (a pre-blank unit, or a damaged one of size <= 0): those go through the per-unit rules."""
    for k in range(j, j + n):
        if sizes[k] <= 0 or sizes[k] == PRE_BLANK_SIZE:
            return k - j
    return n
