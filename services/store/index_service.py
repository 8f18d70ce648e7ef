"""IndexService: the directory of index files — build from dispatch, query, roll, retain.

The byte layout of one file, and why its writes are ordered as they are, is in
:mod:`services.store.index_file`; this module decides which keys of a record are indexed,
when to roll to a new file, how files are named (``yyyyMMddHHmmssSSS`` creation time, UTC, so
names sort in creation order even when local time steps back), and which files a query or
retention run touches.

Dispatch queues a record's keys and they are written in bulk (``PENDING_KEYS_MAX``): every
reader writes the queue first, so a query finds a key the moment its send is acknowledged; the
files may lag the commitlog by the queue, as after a crash, and recovery closes that gap the
same way (it re-dispatches from the last file's endPhyoffset).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import numpy as np

from rocketq.java_hash import index_key_hash, index_key_hashes_array
from services.common import failpoints
from services.common.clock import SYSTEM_CLOCK, Clock
from services.store.index_file import (
    _SECOND_MS,
    DEFAULT_INDEX_NUM,
    DEFAULT_SLOT_NUM,
    IndexFile,
)
from services.store.mapped_file import DiskFullError, refused_when_full
from services.store.types import DispatchRequest, DispatchRun, PhysicalOffset

_log = logging.getLogger(__name__)

# Transaction type in sysFlag bits 2-3 (SPEC §9). As RocketMQ 4.x, only ROLLBACK records are
# left out of the index; a PREPARED record is indexed so an operator can find a pending half
# message by key (it is stored under the half topic, so it never pollutes the real topic's keys).
_TRANSACTION_MASK = 0xC
_SKIPPED_TRANSACTIONS = frozenset({0xC})  # ROLLBACK

PENDING_KEYS_MAX = 512
"""Keys queued before they are written in one bulk put. A put has ~50 us of fixed cost (numpy)
and ~0.6 us per key: a slave's chunk or a batch of 32 written at once paid 3.4 us per key, a
single send's record ~5 us. Readers (:meth:`query`, :attr:`files`, :attr:`max_indexed_offset`),
the store's periodic flush and its shutdown write the queue first (:meth:`drain`); a crash loses
only what recovery rebuilds anyway (it re-dispatches from the index's endPhyoffset)."""

_NAME_DIGITS = 17
_NAME_BUMP_MAX = 100_000  # 100 s of bumped names; needing more means something is very wrong


def format_index_file_name(timestamp_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of ``timestamp_ms`` in UTC (17 digits)."""
    seconds, millis = divmod(timestamp_ms, _SECOND_MS)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y%m%d%H%M%S") + f"{millis:03d}"


def parse_index_file_name(name: str) -> int | None:
    """The UTC millisecond timestamp a file name stands for, or None if it is not one."""
    if len(name) != _NAME_DIGITS or not name.isascii() or not name.isdigit():
        return None
    try:
        moment = datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(moment.timestamp()) * _SECOND_MS + int(name[14:])


def index_keys(topic: str, uniq_key: str, keys: str) -> list[str]:
    """The index keys of one record: ``topic#uniqKey`` (if any), then ``topic#key`` per KEYS key."""
    prefix = topic + "#"
    out = [prefix + uniq_key] if uniq_key else []
    if keys:
        out.extend(prefix + k for k in keys.split(" ") if k)
    return out


def index_keys_of(req: DispatchRequest) -> list[str]:
    """:func:`index_keys` of a dispatched record."""
    return index_keys(req.topic, req.uniq_key, req.keys)


class IndexService:
    """All index files of one store: build from dispatch, query, roll, retain.

    Single writer; :meth:`flush` may run in a worker thread.
    """

    def __init__(
        self,
        index_dir: Path,
        *,
        slot_num: int = DEFAULT_SLOT_NUM,
        index_num: int = DEFAULT_INDEX_NUM,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._dir = Path(index_dir)
        self._slot_num = slot_num
        self._index_num = index_num
        self._clock = clock
        self._files: list[IndexFile] = []
        self._last_name_ms = -1  # newest 17-digit name seen, so a new name sorts after it
        self._loaded = False
        self._keys: list[str | int] = []
        self._offsets: list[int] = []
        self._stamps: list[int] = []
        """Queued entries, in dispatch order (see PENDING_KEYS_MAX); written by :meth:`drain`.
        The keys are all ``str`` (hashed in one batch when written) or, once a run brought its
        hashes (``DispatchRun.index_hashes``: a slave), all ``int``, their index hashes: keys
        queued after it are hashed as they come (on a slave, the few records of each chunk its
        batch reader declined), until the queue is empty again."""
        self._hashed = False
        """Whether the queued keys are index hashes (ints) rather than strings."""
        self._queued_end = -1
        """Offset of the last record whose keys were queued (-1: none since the last drain)."""
        self.problems: list[str] = []
        """``"path: reason"`` for each file :meth:`load` skipped (wrong size, corrupt header, …)."""

    @property
    def files(self) -> tuple[IndexFile, ...]:
        """Open index files, oldest first, the queued entries written (event-loop thread)."""
        self.drain()
        return tuple(self._files)

    def load(self) -> list[str]:
        """Open the existing files in name order; returns the ones skipped (also in ``problems``).

        A file that cannot be used is logged and skipped, never fatal: the index is derived
        data, and the commitlog it came from is still there.
        """
        if self._loaded:
            return list(self.problems)
        self._loaded = True
        if not self._dir.is_dir():
            return []
        for path in sorted(self._dir.iterdir()):
            if path.name.endswith(".tmp"):
                _log.info("removing unfinished index file %s", path)
                path.unlink(missing_ok=True)
                continue
            name_ms = parse_index_file_name(path.name)
            if name_ms is None or not path.is_file():
                self._skip(path, "not an index file (name must be 17 digits yyyyMMddHHmmssSSS)")
                continue
            self._last_name_ms = max(self._last_name_ms, name_ms)
            try:
                self._files.append(IndexFile(path, self._slot_num, self._index_num))
            except (ValueError, OSError) as exc:
                self._skip(path, str(exc))
        if self._files:
            self._files[-1].repair_torn_slots()
        return list(self.problems)

    def _skip(self, path: Path, reason: str) -> None:
        _log.warning("skipping index file %s: %s", path, reason)
        self.problems.append(f"{path}: {reason}")

    @property
    def max_indexed_offset(self) -> PhysicalOffset:
        """endPhyoffset of the last file: records below it are already indexed."""
        self.drain()
        return self._written_end()

    def _written_end(self) -> PhysicalOffset:
        return self._files[-1].end_phy_offset if self._files else PhysicalOffset(0)

    def _indexed_end(self) -> int:
        """:attr:`max_indexed_offset` with the queued entries counted, without writing them."""
        return self._queued_end if self._queued_end >= 0 else self._written_end()

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self.load()

    def _new_file_name(self) -> str:
        # A new name must sort after every existing one, even within one millisecond or after
        # the clock stepped back; bump the timestamp until it does and the name is free.
        name_ms = max(self._clock.now_ms(), self._last_name_ms + 1)
        for _ in range(_NAME_BUMP_MAX):
            name = format_index_file_name(name_ms)
            if not (self._dir / name).exists() and not (self._dir / (name + ".tmp")).exists():
                self._last_name_ms = name_ms
                return name
            name_ms += 1
        raise RuntimeError(f"no free index file name in {self._dir} after {_NAME_BUMP_MAX} tries")

    def _writable_file(self) -> IndexFile:
        if self._files and not self._files[-1].is_full:
            return self._files[-1]
        prev = self._files[-1] if self._files else None
        with refused_when_full(f"cannot create an index file in {self._dir}"):
            self._dir.mkdir(parents=True, exist_ok=True)
            new = IndexFile(
                self._dir / self._new_file_name(),
                self._slot_num,
                self._index_num,
                inherit_end_timestamp_ms=prev.end_timestamp_ms if prev else 0,
                inherit_end_phy_offset=prev.end_phy_offset if prev else PhysicalOffset(0),
            )
        self._files.append(new)
        _log.info("created index file %s", new.path)
        return new

    def build_index(self, req: DispatchRequest) -> None:
        """Index one dispatched record under its topic (uniq key, then each KEYS key)."""
        self.build_index_batch((req,))

    def build_index_batch(self, reqs: Sequence[DispatchRequest]) -> None:
        """Index many records, in order: their keys are queued and written in bulk.

        A record below the last indexed one is skipped (recovery re-dispatches from an older
        checkpoint; equal is not skipped: 0 is both "nothing yet" and "the record at 0"), and
        so is a ROLLBACK record.
        """
        failpoints.inject("dispatch_before_index")
        self._ensure_loaded()
        end = self._indexed_end()
        keys, offsets, stamps = self._keys, self._offsets, self._stamps
        queued = len(keys)
        skipped = _SKIPPED_TRANSACTIONS
        for req in reqs:
            offset = req.commitlog_offset
            if offset < end or (req.sys_flag & _TRANSACTION_MASK) in skipped:
                continue
            if req.uniq_key and not req.keys:  # the common case, one key: no list to build
                keys.append(req.topic + "#" + req.uniq_key)
                offsets.append(offset)
                stamps.append(req.store_timestamp_ms)
                end = offset
                continue
            more = index_keys_of(req)
            if more:
                keys.extend(more)
                offsets.extend([offset] * len(more))
                stamps.extend([req.store_timestamp_ms] * len(more))
                end = offset
        self._queued_and_maybe_written(end, queued)

    def build_index_run(self, run: DispatchRun) -> None:
        """:meth:`build_index_batch` for records given as columns: the same keys, files and
        order, without a DispatchRequest per record."""
        phys = run.physical_offsets
        self._ensure_loaded()
        if not phys or phys[0] < self._indexed_end():
            self.build_index_batch(run.requests())  # a re-dispatch: skip what is in
            return
        failpoints.inject("dispatch_before_index")
        if run.index_hashes is not None:  # a slave's batch: hashed from the records' bytes
            self._hash_queued(len(self._keys))
            self._keys.extend(run.index_hashes.tolist())
            self._offsets.extend(phys)
            self._stamps.extend(run.store_timestamps_ms)
            self._queued_and_maybe_written(phys[-1])
            return
        uniq_keys = run.uniq_keys
        queued = len(self._keys)
        if all(uniq_keys) and not any(run.keys):  # the common case: one key per record
            prefix = run.topic + "#"
            self._keys.extend([prefix + u for u in uniq_keys])
            self._offsets.extend(phys)
            self._stamps.extend(run.store_timestamps_ms)
            self._queued_and_maybe_written(phys[-1], queued)
            return
        end = self._indexed_end()
        for uniq, more, offset, stamp in zip(
            uniq_keys, run.keys, phys, run.store_timestamps_ms, strict=True
        ):
            mine = index_keys(run.topic, uniq, more)
            if mine:
                self._keys.extend(mine)
                self._offsets.extend([offset] * len(mine))
                self._stamps.extend([stamp] * len(mine))
                end = offset
        self._queued_and_maybe_written(end, queued)

    def _queued_and_maybe_written(self, end: int, queued: int | None = None) -> None:
        """``queued``: the queue's length before the keys just added, as strings (hashed now
        if the queue is one of hashes)."""
        if self._hashed and queued is not None:
            self._hash_queued(queued)
        if self._keys:
            self._queued_end = end
            if len(self._keys) >= PENDING_KEYS_MAX:
                self.drain()

    def drain(self) -> None:
        """Write the queued entries (event-loop thread only: :meth:`flush` runs in a worker and
        never calls this). :class:`DiskFullError` when a file cannot be created or grown; what
        was not written stays queued for the next try."""
        if not self._keys:
            return
        self._ensure_loaded()
        keys = self._keys
        hashes = (
            np.array(keys, dtype=np.int64)
            if self._hashed
            else index_key_hashes_array(cast(list[str], keys))
        )
        offsets = np.array(self._offsets, dtype=np.int64)
        stamps = np.array(self._stamps, dtype=np.int64)
        done = 0
        try:
            while done < len(hashes):
                target = self._writable_file()
                count = target.put_hashes(hashes[done:], offsets[done:], stamps[done:])
                assert count > 0, "a writable file always has room for one entry"
                # The last record in this chunk may continue in the next file; marking it here
                # is still safe, since a record *at* endPhyoffset is indexed again after a crash.
                end = PhysicalOffset(int(offsets[done + count - 1]))
                target.set_end(end, int(stamps[done : done + count].max()))
                done += count
        finally:
            del self._keys[:done], self._offsets[:done], self._stamps[:done]
            if not self._keys:
                self._queued_end = -1
                self._hashed = False

    def _hash_queued(self, start: int) -> None:
        """Make the queue one of hashes (see ``_keys``), hashing the strings from ``start``."""
        if not self._hashed:
            start = 0
            self._hashed = True
        tail = cast(list[str], self._keys[start:])
        if tail:
            self._keys[start:] = index_key_hashes_array(tail).tolist()

    def query(
        self, topic: str, key: str, max_num: int, begin_ts_ms: int, end_ts_ms: int
    ) -> list[PhysicalOffset]:
        """Offsets of records whose key may be ``key``, stored in the range, newest first.

        At most ``max_num``, no offset twice. Hashes collide: read each record and compare.
        """
        self.drain()
        if max_num <= 0 or begin_ts_ms > end_ts_ms:
            return []
        key_hash = index_key_hash(topic + "#" + key)
        out: list[PhysicalOffset] = []
        seen: set[int] = set()
        for index_file in reversed(self._files):
            if len(out) >= max_num:
                break
            if index_file.entry_count and index_file.overlaps(begin_ts_ms, end_ts_ms):
                index_file.select_into(
                    key_hash, max_num, begin_ts_ms, end_ts_ms, out=out, seen=seen
                )
        return out

    def truncate(self, phy_offset: PhysicalOffset) -> int:
        """Drop entries pointing at ``phy_offset`` or beyond (recovery cut the log there).

        Files wholly beyond it are deleted; the file that straddles it is cut back; queued
        entries at or past it are dropped unwritten (the others stay queued: a truncate may
        undo a write the full volume refused). Returns the number of entries dropped.
        """
        self._ensure_loaded()
        keep = bisect.bisect_left(self._offsets, phy_offset)
        dropped = len(self._keys) - keep
        del self._keys[keep:], self._offsets[keep:], self._stamps[keep:]
        self._queued_end = self._offsets[-1] if self._offsets else -1
        for index_file in reversed(tuple(self._files)):
            if index_file.entry_count and index_file.read_entry(1).phy_offset >= phy_offset:
                dropped += index_file.entry_count
                self._files.remove(index_file)
                index_file.destroy()
                continue
            dropped += index_file.truncate_from(phy_offset)
            break
        if dropped:
            _log.warning("index: dropped %d entries at or past offset %d", dropped, phy_offset)
        return dropped

    def delete_files_before(self, min_commitlog_offset: PhysicalOffset) -> int:
        """Delete files whose endPhyoffset is below ``min_commitlog_offset``; never the last one."""
        self._ensure_loaded()
        doomed = [f for f in self._files[:-1] if f.end_phy_offset < min_commitlog_offset]
        for index_file in doomed:
            self._files.remove(index_file)
            index_file.destroy()
            _log.info("deleted index file %s", index_file.path)
        return len(doomed)

    def flush(self) -> None:
        """fdatasync every file written since its last flush."""
        for index_file in tuple(self._files):
            index_file.flush()

    def close(self) -> None:
        """Write the queued entries (a full volume drops them, as a crash would: recovery
        rebuilds them) and close every file, without flushing."""
        try:
            self.drain()
        except DiskFullError as exc:
            _log.warning("index: %d queued entries dropped at close: %s", len(self._keys), exc)
        self._keys, self._offsets, self._stamps = [], [], []
        self._hashed = False
        self._queued_end = -1
        for index_file in self._files:
            index_file.close()
        self._files.clear()
