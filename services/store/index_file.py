"""IndexFile: the on-disk hash index that finds messages by key and store time (SPEC §4.7, §11.3).

Byte layout, all big-endian (Java's ByteBuffer default), byte-for-byte RocketMQ's::

    +----------------------+-----------------------------+-----------------------------------+
    | header, 40 B         | slot table, slot_num x 4 B  | entries, index_num x 20 B         |
    +----------------------+-----------------------------+-----------------------------------+

    header                              entry (index number n >= 1)
    | field          | bytes |          | field       | bytes |
    |----------------|-------|          |-------------|-------|
    | beginTimestamp | 8     |          | keyHash     | 4     | abs(hashCode("topic#key"))
    | endTimestamp   | 8     |          | phyOffset   | 8     | commitlog offset
    | beginPhyoffset | 8     |          | timeDiff    | 4     | seconds after beginTimestamp
    | endPhyoffset   | 8     |          | prevIndexNo | 4     | older entry, same slot; 0 = none
    | hashSlotCount  | 4     |
    | indexCount     | 4     |          slot: 4 B, number of the newest entry in its bucket
                                        (0 = empty bucket)

Entry ``n`` sits at ``40 + slot_num*4 + n*20``; with RocketMQ's defaults (5 000 000 slots,
20 000 000 entries) a file is 420 000 040 bytes and entry n is at
``40 + 20 000 000 + n*20`` (SPEC §15).

Design notes
------------
*Numbering.* Entry numbers start at 1 so that 0 can mean "empty slot" / "end of chain"; the
20 bytes at entry position 0 are never used. ``indexCount`` in the header is, as in RocketMQ,
the number of the *next* entry to write: 1 for an empty file, ``entries + 1`` after that (a
header still all zeros reads as 1). A file therefore holds ``index_num - 1`` entries and is full
when ``indexCount >= index_num``.

*Chains.* ``slot = keyHash % slot_num`` holds the newest entry of the bucket and every entry
points at the one before it, so a query walks newest first. Distinct keys can share a hash, so
results are candidates: the caller must read each message and compare its keys.

*Crash safety.* A process may be SIGKILLed between any two stores; the page cache survives.
Each put writes (a) the entry, (b) the slot, (c) the header counters, and a message's
``endPhyoffset``/``endTimestamp`` only after all its keys. ``indexCount`` is the commit point: an
entry or slot value ``>= indexCount`` belongs to a torn attempt. On reload the service rolls the
torn slots of the last file back to their committed value (:meth:`IndexFile.repair_torn_slots`,
walking the torn chain back below ``indexCount``); a put that still meets a torn slot takes the
same walk, so the new entry never points at itself. Because dispatch skips a message only when
its offset is *below* ``endPhyoffset`` (0 would otherwise be ambiguous), the last message is
re-added after a crash; queries dedupe by physical offset.

*Corruption.* A walk only moves to strictly smaller entry numbers, so it ends within
``index_num`` steps whatever the bytes say; out-of-range numbers end it. A file of the wrong size
is refused with a :class:`ValueError` naming both sizes.

*Time.* ``timeDiff`` is whole seconds, so an entry's store time is known only to within the
second ``[begin + diff*1000, begin + diff*1000 + 999]``; a query keeps an entry when that second
overlaps the query range. (RocketMQ compares the second's start only, and so can miss a message
stored late in the first second of the range.)

*File names* are the creation time as ``yyyyMMddHHmmssSSS`` like RocketMQ's, but in UTC: names
must sort in creation order, and local time runs backwards once a year at the end of summer time.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rocketq.java_hash import index_key_hash
from services.store.mapped_file import RESERVE_AHEAD_BYTES, DiskFullError, refused_when_full
from services.store.types import PhysicalOffset

_log = logging.getLogger(__name__)

# --- byte layout --------------------------------------------------------------------------------

HEADER = struct.Struct(
    ">"
    "q"  # beginTimestamp: store time (ms) of the first entry
    "q"  # endTimestamp: store time (ms) of the last message indexed here
    "q"  # beginPhyoffset: commitlog offset of the first entry
    "q"  # endPhyoffset: commitlog offset of the last message indexed here
    "i"  # hashSlotCount: slots that have become non-empty (a statistic)
    "i"  # indexCount: number of the next entry to write (1 when empty)
)
SLOT = struct.Struct(">i")  # number of the newest entry in this bucket, 0 = empty
ENTRY = struct.Struct(
    ">"
    "i"  # keyHash: index_key_hash("topic#key")
    "q"  # phyOffset: commitlog offset of the message
    "i"  # timeDiff: whole seconds after beginTimestamp, never negative
    "i"  # prevIndexNo: previous entry in the same slot, 0 = end of chain
)
_I64 = struct.Struct(">q")
_COUNTS = struct.Struct(">ii")  # hashSlotCount, indexCount: adjacent, written together

# Header field offsets, computed from the layout rather than typed in.
BEGIN_TIMESTAMP_AT = 0
END_TIMESTAMP_AT = struct.calcsize(">q")
BEGIN_PHY_OFFSET_AT = struct.calcsize(">qq")
END_PHY_OFFSET_AT = struct.calcsize(">qqq")
HASH_SLOT_COUNT_AT = struct.calcsize(">qqqq")
INDEX_COUNT_AT = struct.calcsize(">qqqqi")

# The same entry as a numpy record, for writing a whole batch in one copy.
ENTRY_DTYPE = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff_s", ">i4"), ("prev_index_no", ">i4")]
)

assert HEADER.size == 40
assert SLOT.size == 4
assert ENTRY.size == 20
assert ENTRY_DTYPE.itemsize == ENTRY.size
assert HEADER.size == INDEX_COUNT_AT + 4

DEFAULT_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
_PAGE_BYTES = 4096
"""Granularity of slot-table space reservations (module doc of mapped_file: a store into a
sparse page the volume has no room for is a SIGBUS, so space is reserved before each put)."""
SLOT_RESERVE_PAGES = 16
"""Slot-table pages reserved per fallocate (64 KiB of the default 20 MB table)."""
_INT32_MAX = 2**31 - 1
_SECOND_MS = 1000
_NO_OFFSET = PhysicalOffset(0)
"""The end offset a first index file inherits: nothing indexed before it."""


def index_file_size_bytes(
    slot_num: int = DEFAULT_SLOT_NUM, index_num: int = DEFAULT_INDEX_NUM
) -> int:
    """Size of an index file: header + slot table + entry area."""
    return HEADER.size + slot_num * SLOT.size + index_num * ENTRY.size


def entry_position_bytes(slot_num: int, index_no: int) -> int:
    """Absolute byte position of entry ``index_no`` in a file with ``slot_num`` slots."""
    return HEADER.size + slot_num * SLOT.size + index_no * ENTRY.size


def _time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    # Clamped to [0, INT32_MAX]: a clock that stepped back must not store a negative diff.
    return min(max((store_timestamp_ms - begin_timestamp_ms) // _SECOND_MS, 0), _INT32_MAX)


class IndexEntry(NamedTuple):
    """One 20-byte entry as read back, with its number (for dump tools and tests)."""

    index_no: int
    key_hash: int
    phy_offset: int
    time_diff_s: int
    prev_index_no: int


class IndexFile:
    """One mapped index file: put keys, walk chains, flush.

    Not thread-safe, except that :meth:`flush` may run in a worker thread while the single
    writer keeps putting (``fdatasync`` releases the GIL). Never close it while a flush runs.
    """

    def __init__(
        self,
        path: Path,
        slot_num: int = DEFAULT_SLOT_NUM,
        index_num: int = DEFAULT_INDEX_NUM,
        *,
        inherit_end_timestamp_ms: int = 0,
        inherit_end_phy_offset: PhysicalOffset = _NO_OFFSET,
        readonly: bool = False,
    ) -> None:
        """Open ``path`` if it exists, else create it (sparse, header written).

        ``inherit_end_*`` apply only when creating: the previous file's end, written as this
        file's begin and end until its first entry, so "already indexed?" keeps working across
        a roll. Raises :class:`ValueError` if an existing file has the wrong size or header.
        """
        if slot_num < 1 or not 2 <= index_num <= _INT32_MAX:
            raise ValueError(f"bad index file geometry: slot_num={slot_num} index_num={index_num}")
        self._path = Path(path)
        self._slot_num = slot_num
        self._index_num = index_num
        self._readonly = readonly
        self._size = index_file_size_bytes(slot_num, index_num)
        self._entries_at = HEADER.size + slot_num * SLOT.size
        self._dirty = False
        self._closed = False
        self._slot_pages_reserved = np.zeros(self._entries_at // _PAGE_BYTES + 1, dtype=bool)
        self._entries_reserved_to = 0
        if self._path.exists():
            self._fd = self._open_existing()
        else:
            if readonly:
                raise FileNotFoundError(self._path)
            self._fd = self._create(inherit_end_timestamp_ms, inherit_end_phy_offset)
        access = mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
        try:
            self._mm = mmap.mmap(self._fd, self._size, access=access)
        except BaseException:
            os.close(self._fd)
            raise
        # Views straight onto the mapping; numpy reads and writes the file's pages in place.
        self._slots = np.frombuffer(self._mm, dtype=">i4", count=slot_num, offset=HEADER.size)
        self._entries = np.frombuffer(
            self._mm, dtype=ENTRY_DTYPE, count=index_num, offset=self._entries_at
        )
        self._load_header()

    def _open_existing(self) -> int:
        fd = os.open(self._path, (os.O_RDONLY if self._readonly else os.O_RDWR) | os.O_CLOEXEC)
        size = os.fstat(fd).st_size
        if size != self._size:
            os.close(fd)
            raise ValueError(
                f"index file {self._path} is {size} bytes, expected {self._size} "
                f"(slot_num={self._slot_num}, index_num={self._index_num})"
            )
        return fd

    def _create(self, end_timestamp_ms: int, end_phy_offset: PhysicalOffset) -> int:
        # Built under a temporary name and renamed, so a crash never leaves a real-named file
        # without a header; ftruncate makes it sparse (the slot and entry areas cost no disk).
        tmp = self._path.with_name(self._path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, self._size)
            header = HEADER.pack(
                end_timestamp_ms, end_timestamp_ms, end_phy_offset, end_phy_offset, 0, 1
            )
            os.pwrite(fd, header, 0)
            os.replace(tmp, self._path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        self._dirty = True
        return fd

    def _load_header(self) -> None:
        begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = HEADER.unpack_from(self._mm)
        if index_count == 0:
            index_count = 1  # a header never written: RocketMQ's initial value
        if not 1 <= index_count <= self._index_num:
            self.close()
            raise ValueError(
                f"index file {self._path} has a corrupt header: indexCount={index_count}, "
                f"index_num={self._index_num}"
            )
        # The in-memory copy of the header; every write updates both it and the mapping.
        self._begin_ts: int = begin_ts
        self._end_ts: int = end_ts
        self._begin_phy: int = begin_phy
        self._end_phy: int = end_phy
        self._hash_slot_count: int = slot_count
        self._next_no: int = index_count

    # --- header properties ----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """Where the file lives."""
        return self._path

    @property
    def slot_num(self) -> int:
        """Number of hash slots."""
        return self._slot_num

    @property
    def index_num(self) -> int:
        """Number of entry positions (entry numbers run 1 .. index_num - 1)."""
        return self._index_num

    @property
    def begin_timestamp_ms(self) -> int:
        """Header beginTimestamp: store time of the first entry."""
        return self._begin_ts

    @property
    def end_timestamp_ms(self) -> int:
        """Header endTimestamp: latest store time of the messages indexed here."""
        return self._end_ts

    @property
    def begin_phy_offset(self) -> PhysicalOffset:
        """Header beginPhyoffset."""
        return PhysicalOffset(self._begin_phy)

    @property
    def end_phy_offset(self) -> PhysicalOffset:
        """Header endPhyoffset: messages below it are fully indexed."""
        return PhysicalOffset(self._end_phy)

    @property
    def hash_slot_count(self) -> int:
        """Header hashSlotCount: slots that became non-empty."""
        return self._hash_slot_count

    @property
    def index_count(self) -> int:
        """Header indexCount: the number the next entry will get (1 when empty)."""
        return self._next_no

    @property
    def entry_count(self) -> int:
        """Entries committed to this file."""
        return self._next_no - 1

    @property
    def is_full(self) -> bool:
        """True when no entry position is left."""
        return self._next_no >= self._index_num

    def entry_position(self, index_no: int) -> int:
        """Absolute byte position of entry ``index_no``."""
        return self._entries_at + index_no * ENTRY.size

    def overlaps(self, begin_ts_ms: int, end_ts_ms: int) -> bool:
        """Whether an entry of this file could be stored within ``[begin_ts_ms, end_ts_ms]``."""
        # Entries are known to the second, so the file's range extends to the end of its last one.
        return self._begin_ts <= end_ts_ms and self._end_ts + _SECOND_MS - 1 >= begin_ts_ms

    # --- writing ----------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._closed or self._readonly:
            raise ValueError(
                f"index file {self._path} is {'closed' if self._closed else 'read-only'}"
            )

    def _entry_prev(self, index_no: int) -> int:
        return int(ENTRY.unpack_from(self._mm, self._entries_at + index_no * ENTRY.size)[3])

    def _committed_head(
        self, slot_value: int, next_no: int, memo: dict[int, int] | None = None
    ) -> int:
        """The newest committed entry a slot stands for, skipping a torn attempt's entries.

        A slot value ``>= next_no`` was written by an attempt whose header never committed; its
        chain leads back, through that attempt's entries, to the value the slot had before.
        ``memo`` shares walks between slots, so repairing a whole file stays linear even if
        corruption strung every entry into one long chain.
        """
        value = slot_value
        walked: list[int] = []
        while not 0 <= value < next_no:
            if memo is not None and value in memo:
                value = memo[value]
                break
            if value < 0 or value >= self._index_num:
                value = 0  # garbage: cut the chain rather than follow it anywhere
                break
            walked.append(value)
            prev = self._entry_prev(value)
            if prev >= value:
                value = 0  # not strictly older: corrupt (or a self-loop), cut it
                break
            value = prev
        if memo is not None:
            memo.update(dict.fromkeys(walked, value))
        return value

    def put_key(
        self,
        key: str | int,
        phy_offset: PhysicalOffset,
        store_timestamp_ms: int,
        *,
        update_end: bool = True,
    ) -> bool:
        """Index one key (``"topic#key"`` or its :func:`index_key_hash`); False when full.

        ``update_end=False`` leaves endPhyoffset/endTimestamp to :meth:`set_end`, which the
        service calls once per message after all its keys.
        """
        self._check_writable()
        key_hash = index_key_hash(key) if isinstance(key, str) else key
        if not 0 <= key_hash <= _INT32_MAX or phy_offset < 0:
            raise ValueError(f"bad index entry: key_hash={key_hash} phy_offset={phy_offset}")
        n = self._next_no
        if n >= self._index_num:
            return False
        first = n == 1
        begin_ts = store_timestamp_ms if first else self._begin_ts
        slot_at = HEADER.size + (key_hash % self._slot_num) * SLOT.size
        # One slot: the scalar form of _reserve (numpy on one element cost more than the put).
        if not self._slot_pages_reserved[slot_at // _PAGE_BYTES]:
            self._reserve_slot_pages([slot_at // _PAGE_BYTES])
        entries_end = self._entries_at + (n + 1) * ENTRY.size
        if entries_end > self._entries_reserved_to:
            self._reserve_entries(entries_end)
        (slot_value,) = SLOT.unpack_from(self._mm, slot_at)
        prev = slot_value if 0 <= slot_value < n else self._committed_head(slot_value, n)
        diff = _time_diff_s(store_timestamp_ms, begin_ts)
        ENTRY.pack_into(
            self._mm, self._entries_at + n * ENTRY.size, key_hash, phy_offset, diff, prev
        )
        SLOT.pack_into(self._mm, slot_at, n)
        if first:
            self._write_begin(store_timestamp_ms, phy_offset)
        self._write_counts(self._hash_slot_count + (prev == 0), n + 1)
        if update_end:
            self.set_end(phy_offset, store_timestamp_ms)
        self._dirty = True
        return True

    def put_hashes(
        self, key_hashes: np.ndarray, phy_offsets: np.ndarray, timestamps_ms: np.ndarray
    ) -> int:
        """Index a batch of keys at once; returns how many fit (a prefix of the batch).

        Same bytes as calling :meth:`put_key` on each in order with ``update_end=False``: the
        entries go in one copy, then the slots, then the header counters.
        """
        self._check_writable()
        n0 = self._next_no
        m = min(len(key_hashes), self._index_num - n0)
        if m <= 0:
            return 0
        hashes = np.asarray(key_hashes[:m], dtype=np.int64)
        phys = np.asarray(phy_offsets[:m], dtype=np.int64)
        stamps = np.asarray(timestamps_ms[:m], dtype=np.int64)
        if hashes.min() < 0 or hashes.max() > _INT32_MAX or phys.min() < 0:
            raise ValueError("bad index batch: key hash outside [0, 2^31) or negative offset")
        first = n0 == 1
        begin_ts = int(stamps[0]) if first else self._begin_ts
        numbers = np.arange(n0, n0 + m, dtype=np.int64)
        slots = hashes % self._slot_num
        # Sort by slot (stable, so batch order is kept within a slot): each entry's predecessor
        # is the one before it in its run, and a run's first entry chains to the slot's head.
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        sorted_numbers = numbers[order]
        run_start = np.ones(m, dtype=bool)
        run_start[1:] = sorted_slots[1:] != sorted_slots[:-1]
        run_end = np.ones(m, dtype=bool)
        run_end[:-1] = run_start[1:]
        # Before the slots are even read: on tmpfs a read fault on a hole allocates a page too.
        self._reserve(
            HEADER.size + sorted_slots[run_end] * SLOT.size,
            self._entries_at + (n0 + m) * ENTRY.size,
        )
        heads = self._slots[sorted_slots[run_start]].astype(np.int64)
        torn = (heads < 0) | (heads >= n0)
        if torn.any():  # rare (see _committed_head); flatnonzero costs more than this test
            memo: dict[int, int] = {}
            for i in np.flatnonzero(torn).tolist():
                heads[i] = self._committed_head(int(heads[i]), n0, memo)
        sorted_prev = np.empty(m, dtype=np.int64)
        sorted_prev[1:] = sorted_numbers[:-1]
        sorted_prev[run_start] = heads
        prev = np.empty(m, dtype=np.int64)
        prev[order] = sorted_prev

        records = np.empty(m, dtype=ENTRY_DTYPE)
        records["key_hash"] = hashes
        records["phy_offset"] = phys
        diffs = (stamps - begin_ts) // _SECOND_MS
        np.maximum(diffs, 0, out=diffs)  # as _time_diff_s; np.clip is several times slower
        np.minimum(diffs, _INT32_MAX, out=diffs)
        records["time_diff_s"] = diffs
        records["prev_index_no"] = prev
        self._entries[n0 : n0 + m] = records  # (a) entries
        self._slots[sorted_slots[run_end]] = sorted_numbers[run_end]  # (b) slots, one per run
        if first:  # (c) header
            self._write_begin(begin_ts, PhysicalOffset(int(phys[0])))
        self._write_counts(self._hash_slot_count + int(np.count_nonzero(heads == 0)), n0 + m)
        self._dirty = True
        return m

    def _reserve(self, slot_positions: np.ndarray, entries_end: int) -> None:
        """Reserve disk space for the slots at ``slot_positions`` (bytes) and the entries
        below ``entries_end`` before a put writes them; :class:`DiskFullError` if the volume
        has no room (nothing written yet)."""
        pages = slot_positions // _PAGE_BYTES
        reserved = self._slot_pages_reserved[pages]
        if not reserved.all():  # the common case is a fast "all reserved already"
            self._reserve_slot_pages(np.unique(pages[~reserved]).tolist())
        if entries_end > self._entries_reserved_to:
            self._reserve_entries(entries_end)

    def _reserve_slot_pages(self, pages: list[int]) -> None:
        """Reserve the slot table around ``pages`` in aligned groups of SLOT_RESERVE_PAGES
        (a fresh file's puts land on a new page nearly every time: one fallocate per group,
        not per page)."""
        reserved = self._slot_pages_reserved
        for page in pages:
            if reserved[page]:
                continue  # its group was reserved by an earlier page of this call
            first = page - page % SLOT_RESERVE_PAGES
            last = min(first + SLOT_RESERVE_PAGES, len(reserved))
            try:
                self._fallocate(first * _PAGE_BYTES, min(last * _PAGE_BYTES, self._entries_at))
            except DiskFullError:  # no room for the group: the one page the put needs
                first, last = page, page + 1
                self._fallocate(first * _PAGE_BYTES, min(last * _PAGE_BYTES, self._entries_at))
            reserved[first:last] = True

    def _reserve_entries(self, entries_end: int) -> None:
        """Reserve the entry area up to ``entries_end`` and RESERVE_AHEAD_BYTES beyond it."""
        if entries_end > self._entries_reserved_to:
            start = self._entries_at + self._next_no * ENTRY.size
            ahead = min(self._size, entries_end + RESERVE_AHEAD_BYTES)
            try:
                self._fallocate(start, ahead)
            except DiskFullError:
                self._fallocate(start, entries_end)  # no room for the look-ahead: what we need
                ahead = entries_end
            self._entries_reserved_to = ahead

    def _fallocate(self, start: int, end: int) -> None:
        with refused_when_full(f"cannot reserve {end - start} bytes in {self._path}"):
            os.posix_fallocate(self._fd, start, end - start)

    def _write_begin(self, timestamp_ms: int, phy_offset: PhysicalOffset) -> None:
        self._begin_ts = timestamp_ms
        self._begin_phy = phy_offset
        _I64.pack_into(self._mm, BEGIN_TIMESTAMP_AT, timestamp_ms)
        _I64.pack_into(self._mm, BEGIN_PHY_OFFSET_AT, phy_offset)

    def _write_counts(self, hash_slot_count: int, next_no: int) -> None:
        self._hash_slot_count = min(hash_slot_count, _INT32_MAX)
        self._next_no = next_no
        _COUNTS.pack_into(self._mm, HASH_SLOT_COUNT_AT, self._hash_slot_count, next_no)

    def set_end(self, phy_offset: PhysicalOffset, store_timestamp_ms: int) -> None:
        """Record that the message at ``phy_offset`` is fully indexed (header end fields).

        Kept monotonic, so a clock that stepped back cannot shrink the file's time range.
        """
        self._check_writable()
        self._end_ts = max(self._end_ts, store_timestamp_ms)
        self._end_phy = max(self._end_phy, phy_offset)
        # Timestamp first: a crash between the two leaves the offset behind, which only means
        # the message is indexed again (a duplicate), never skipped.
        _I64.pack_into(self._mm, END_TIMESTAMP_AT, self._end_ts)
        _I64.pack_into(self._mm, END_PHY_OFFSET_AT, self._end_phy)
        self._dirty = True

    def repair_torn_slots(self) -> int:
        """Roll back slots written by an attempt that never committed; returns how many.

        Only the last file of a directory can hold them (a file is rolled only after its
        header commits), so the service calls this once, on that file, at load.
        """
        self._check_writable()
        torn = np.flatnonzero((self._slots < 0) | (self._slots >= self._next_no))
        memo: dict[int, int] = {}
        for slot in torn.tolist():
            head = self._committed_head(self.slot_value(slot), self._next_no, memo)
            SLOT.pack_into(self._mm, HEADER.size + slot * SLOT.size, head)
        if torn.size:
            self._dirty = True
            _log.warning("index file %s: rolled back %d torn slot(s)", self._path, torn.size)
        return int(torn.size)

    def truncate_from(self, phy_offset: PhysicalOffset) -> int:
        """Forget every entry pointing at ``phy_offset`` or beyond; return how many.

        Recovery calls this after cutting a torn commitlog tail, so no entry points past the
        log and the header's end offset no longer claims records that are gone (which would
        make the index skip the records written in their place). Entries are appended in
        commitlog order, so the survivors are a prefix: the count is lowered to it and slots
        that pointed into the dropped part are rolled back along their chains.
        """
        self._check_writable()
        live = self._entries[1 : self._next_no]["phy_offset"]
        keep = int(np.searchsorted(live, phy_offset, side="left"))  # entries 1..keep survive
        dropped = len(live) - keep
        if not dropped:
            return 0
        self._write_counts(self._hash_slot_count, keep + 1)
        self.repair_torn_slots()
        if keep:
            last = self._entries[keep]
            self._end_phy = int(last["phy_offset"])
            self._end_ts = self._begin_ts + int(last["time_diff_s"]) * _SECOND_MS
        else:
            self._end_phy, self._end_ts = self._begin_phy, self._begin_ts
        _I64.pack_into(self._mm, END_TIMESTAMP_AT, self._end_ts)
        _I64.pack_into(self._mm, END_PHY_OFFSET_AT, self._end_phy)
        self._dirty = True
        return dropped

    # --- reading ----------------------------------------------------------------------------------

    def slot_value(self, slot: int) -> int:
        """Raw value of slot ``slot`` (0 = empty)."""
        return int(SLOT.unpack_from(self._mm, HEADER.size + slot * SLOT.size)[0])

    def read_entry(self, index_no: int) -> IndexEntry:
        """Entry ``index_no`` as stored (no validation; for dumps and tests)."""
        if not 0 <= index_no < self._index_num:
            raise IndexError(f"entry {index_no} outside 0..{self._index_num - 1}")
        fields = ENTRY.unpack_from(self._mm, self._entries_at + index_no * ENTRY.size)
        return IndexEntry(index_no, *fields)

    def entries(self) -> Iterator[IndexEntry]:
        """Every committed entry, oldest first."""
        for index_no in range(1, self._next_no):
            yield self.read_entry(index_no)

    def select(
        self, key: str | int, max_num: int, begin_ts_ms: int, end_ts_ms: int
    ) -> list[PhysicalOffset]:
        """Offsets of up to ``max_num`` entries for ``key`` in the time range, newest first.

        ``key`` is ``"topic#key"`` or its hash. Results are candidates (hashes collide) and
        are deduplicated by offset.
        """
        key_hash = index_key_hash(key) if isinstance(key, str) else key
        out: list[PhysicalOffset] = []
        self.select_into(key_hash, max_num, begin_ts_ms, end_ts_ms, out=out, seen=set())
        return out

    def select_into(
        self,
        key_hash: int,
        max_num: int,
        begin_ts_ms: int,
        end_ts_ms: int,
        *,
        out: list[PhysicalOffset],
        seen: set[int],
    ) -> None:
        """Append matches to ``out`` until it holds ``max_num``; offsets in ``seen`` are skipped."""
        if self._closed or len(out) >= max_num or not 0 <= key_hash <= _INT32_MAX:
            return
        mm, entries_at, begin_ts = self._mm, self._entries_at, self._begin_ts
        next_no = self._next_no
        last_second_ms = _SECOND_MS - 1
        value = self.slot_value(key_hash % self._slot_num)
        bound = self._index_num  # every step must go strictly below the last: no loops
        while 0 < value < bound and len(out) < max_num:
            entry_hash, phy, diff, prev = ENTRY.unpack_from(mm, entries_at + value * ENTRY.size)
            # Entries >= indexCount are a torn attempt's: walked through, never returned.
            if value < next_no and entry_hash == key_hash and phy >= 0 and phy not in seen:
                second_ms = begin_ts + diff * _SECOND_MS
                if second_ms <= end_ts_ms and second_ms + last_second_ms >= begin_ts_ms:
                    seen.add(phy)
                    out.append(PhysicalOffset(phy))
            bound = value
            value = prev

    # --- lifetime ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Make everything written so far durable (``fdatasync``, which releases the GIL)."""
        if self._closed or not self._dirty:
            return
        self._dirty = False  # cleared first: a put racing this flush marks the file dirty again
        os.fdatasync(self._fd)

    def close(self) -> None:
        """Unmap and close; idempotent. Does not flush."""
        if self._closed:
            return
        self._closed = True
        # The numpy views hold buffer exports; the mapping cannot close while they live.
        del self._slots, self._entries
        self._mm.close()
        os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self._path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return (
            f"IndexFile({self._path.name}, entries={self.entry_count}/{self._index_num - 1}, "
            f"phy=[{self._begin_phy}, {self._end_phy}], ts=[{self._begin_ts}, {self._end_ts}])"
        )
