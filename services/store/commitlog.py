"""The CommitLog: every message of every topic, appended to one sequence of mapped files.

Record layout: see :mod:`rocketq.codec` (RocketMQ's v1 record, SPEC §11.1). Files are 1 GiB by
default and named by their start offset; a record never spans two files — when the next record
(plus the 8 bytes a blank record needs) does not fit, the rest of the file is filled with a BLANK
record and the record goes to the next file (SPEC §4.5).

Appends go through ``pwrite`` (reads through the map, the same page cache): a page a write
covers whole needs no zero-fill, while a store through the map first faults the page in,
zero-filled. A thread used to pre-fault pages ahead of the writer (``madvise(POPULATE_WRITE)``)
to keep those faults off the event loop; on measurement it spent ~5 % of the broker's CPU
zero-filling pages that the data then overwrote, and it dirtied pages ahead of the data, which
every SYNC_FLUSH ``fdatasync`` wrote back too. With ``pwrite`` there is nothing to pre-fault.

Invariants, all kept by having exactly one writer (the event loop):

* physical offsets are dense: each record starts where the previous one (or the blank) ended;
* queue offsets are dense per ``(topic, queue_id)``: the commitlog assigns them while appending,
  in the same step as the physical offset, so the two can never disagree;
* a batch is validated whole before anything is assigned, so a rejected batch leaves no trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rocketq import codec
from rocketq.codec import BLANK_MAGIC, END_FILE_MIN_BLANK_BYTES, HostAddress
from services.common import failpoints
from services.common.clock import SYSTEM_CLOCK, Clock
from services.store.mapped_file import DiskFullError, MappedFile, MappedFileQueue
from services.store.types import DispatchRequest, DispatchRun, PhysicalOffset, QueueOffset

DEFAULT_COMMITLOG_FILE_BYTES = 1024 * 1024 * 1024
RESERVE_AHEAD_BYTES = 1024 * 1024
"""Space fallocated past a write that needs more. The commitlog is one file written at a time,
in appends of up to a replicated chunk (512 KiB), so it reserves more than a consume queue
(64 KiB): at 64 KiB a slave under load called fallocate for every chunk, ~350 times a second,
and the calls blocked its event loop for ~6 % of the time (strace: p90 0.7 ms, the longest
4 ms, while the flush thread's fdatasyncs ran); at 1 MiB, 389 calls and 84 ms in 3 s where
64 KiB took 1 044 and 195 ms (4 MiB: 129 and 15). Not more than 1 MiB, what SYNC_FLUSH's zeros
run ahead too: on a nearly full volume the look-ahead is room that consume queues and index
files cannot have, and at 4 MiB a small volume refused writes it had room for."""
TRANSACTION_MASK = codec.SysFlag.TRANSACTION_MASK
NOT_QUEUED = frozenset({codec.SysFlag.TRANSACTION_PREPARED, codec.SysFlag.TRANSACTION_ROLLBACK})
"""Transaction types whose records get no consume-queue unit and queue offset 0."""
_BLANK_HEAD = codec.SIZE_MAGIC  # TOTALSIZE + MAGIC of a blank record
_HOST_V6_BITS = codec.HOST_V6_BITS
_BORN_V6 = codec.SysFlag.BORNHOST_V6
_NOT_QUEUED_OFFSET = QueueOffset(0)
"""The queue offset stored in records that get no consume-queue unit."""


@dataclass(slots=True)
class MessageToStore:
    """A message as the broker hands it to the store; the store fills in the rest."""

    topic: str
    queue_id: int
    body: bytes
    properties: bytes
    """Already encoded with :func:`rocketq.codec.encode_properties`."""
    tags_code: int = 0
    keys: str = ""
    uniq_key: str = ""
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: HostAddress = codec.LOCALHOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True)
class SentBatch:
    """A batch the producer encoded as records (DESIGN.md §12), checked by the broker: the
    store stamps its fields in place and appends the bytes as they are.

    Every record is an IPv4 record of ``topic`` with no transaction bits; ``records`` is the
    request's buffer (copied once into a bytearray by the caller). The rest are columns, one
    value per record in order (no object per record: this is the broker's hot path)."""

    topic: str
    queue_id: int
    records: bytearray
    pos: list[int]
    size: list[int]
    flag: list[int]
    sys_flag: list[int]
    born_timestamp_ms: list[int]
    """0 = the store's timestamp."""
    tags_codes: list[int]
    keys: list[str]
    uniq_keys: list[str]
    born_host: HostAddress
    reconsume_times: int = 0


class SentAppend(NamedTuple):
    """Where the records of a :class:`SentBatch` landed: record i at ``physical_offsets[i]``
    with queue offset ``first_queue_offset + i``."""

    physical_offsets: list[int]
    first_queue_offset: int
    store_timestamp_ms: int
    end_offset: int
    """Just past the last record."""

    def run(self, batch: SentBatch) -> DispatchRun:
        """What dispatch takes for these records: the batch's columns, no object per record."""
        return DispatchRun(
            batch.topic,
            batch.queue_id,
            QueueOffset(self.first_queue_offset),
            self.physical_offsets,
            batch.size,
            batch.tags_codes,
            [self.store_timestamp_ms] * len(self.physical_offsets),
            batch.keys,
            batch.uniq_keys,
            batch.sys_flag,
            PhysicalOffset(self.end_offset),
        )

    def results(self, batch: SentBatch, store_host: HostAddress) -> list[AppendResult]:
        """What :meth:`CommitLog.append_batch` would return for these records."""
        q0, now = self.first_queue_offset, self.store_timestamp_ms
        return [
            AppendResult(PhysicalOffset(phys), size, QueueOffset(q0 + i), now, store_host)
            for i, (phys, size) in enumerate(zip(self.physical_offsets, batch.size, strict=True))
        ]


class AppendResult(NamedTuple):
    """Where one message landed. A tuple: one is built per message on the hot path."""

    physical_offset: PhysicalOffset
    size_bytes: int
    queue_offset: QueueOffset
    store_timestamp_ms: int
    store_host: HostAddress

    @property
    def offset_msg_id(self) -> str:
        """Store host + physical offset as hex; computed on demand (it costs ~1 µs)."""
        return codec.encode_offset_msg_id(self.store_host, self.physical_offset)


class MessageTooLarge(ValueError):
    """A single record cannot fit in one commitlog file."""


class CommitLog:
    """Append, read and truncate the commitlog. Knows nothing of consume queues or indexes."""

    def __init__(
        self,
        directory: Path,
        *,
        file_size_bytes: int = DEFAULT_COMMITLOG_FILE_BYTES,
        store_host: HostAddress = codec.LOCALHOST,
        clock: Clock = SYSTEM_CLOCK,
        zero_ahead: bool = False,
    ) -> None:
        # zero_ahead: space reserved by writing zeros (SYNC_FLUSH's fsyncs; see mapped_file.py).
        self.files = MappedFileQueue(
            directory,
            file_size_bytes,
            write_by_syscall=True,
            zero_ahead=zero_ahead,
            reserve_ahead_bytes=RESERVE_AHEAD_BYTES,
        )
        self.file_size_bytes = file_size_bytes
        self.store_host = store_host
        self.clock = clock
        self.queue_offsets: dict[tuple[str, int], int] = {}
        """Next queue offset of every (topic, queue id); rebuilt by recovery."""
        self.last_store_timestamp_ms = 0
        self._topic_bytes: dict[str, bytes] = {}

    # -- append ----------------------------------------------------------------------------
    def append_batch(
        self, messages: Sequence[MessageToStore]
    ) -> tuple[list[AppendResult], list[DispatchRequest]]:
        """Append ``messages`` in order; return where each landed and what to dispatch.

        The caller (the store) dispatches and flushes; this only writes bytes into the page
        cache. Raises :class:`MessageTooLarge` (nothing written) if a record cannot fit a file,
        and :class:`DiskFullError` (queue offsets given back; bytes of an earlier file of the
        batch may remain for the caller to cut) if the volume has no room.
        """
        encoded_topics = self._encode_topics(messages)
        now = max(self.clock.now_ms(), self.last_store_timestamp_ms)  # never backwards in the log
        self.last_store_timestamp_ms = now
        requests = self._append_records(messages, encoded_topics, now)
        failpoints.inject("commitlog_after_append")
        host = self.store_host
        results = [
            AppendResult(r.commitlog_offset, r.msg_size, r.queue_offset, now, host)
            for r in requests
        ]
        return results, requests

    def _append_records(
        self, messages: Sequence[MessageToStore], encoded_topics: list[bytes], now: int
    ) -> list[DispatchRequest]:
        """The append loop: pack each record where it lands, assign its offsets, seal a full
        file with a BLANK and go on in the next. One writer, so offsets are dense."""
        requests: list[DispatchRequest] = []
        mf = self.files.writable_file(self.files.max_offset())
        pending: list[bytes | memoryview] = []
        pending_bytes = 0
        offsets = self.queue_offsets
        host, store_v6 = self.store_host, self.store_host.is_v6
        record_struct, pack, crc = codec.record_struct, codec.pack_record, codec.body_crc
        store_bits = codec.with_host_bits(0, False, store_v6)
        for m, tb in zip(messages, encoded_topics, strict=True):
            born = m.born_host
            born_v6 = len(born.ip) == 16
            body, props = m.body, m.properties
            st = record_struct(born_v6, store_v6, len(body), len(tb), len(props))
            size = st.size
            if size + END_FILE_MIN_BLANK_BYTES > mf.free_bytes - pending_bytes:
                mf, pending_bytes = self._roll(mf, pending, requests), 0
            phys = PhysicalOffset(mf.file_from_offset + mf.wrote_position + pending_bytes)
            if m.sys_flag & TRANSACTION_MASK in NOT_QUEUED:
                qoff = _NOT_QUEUED_OFFSET  # half/rollback records never enter a consume queue
            else:
                key = (m.topic, m.queue_id)
                qoff = QueueOffset(offsets.get(key, 0))
                offsets[key] = qoff + 1
            # with_host_bits, inlined: one call less per message on the hot path
            sys_flag = (m.sys_flag & ~_HOST_V6_BITS) | store_bits | (_BORN_V6 if born_v6 else 0)
            pending.append(
                pack(
                    st,
                    crc(body),
                    m.queue_id,
                    m.flag,
                    qoff,
                    phys,
                    sys_flag,
                    m.born_timestamp_ms,
                    born,
                    now,
                    host,
                    m.reconsume_times,
                    m.prepared_transaction_offset,
                    body,
                    tb,
                    props,
                )
            )
            pending_bytes += size
            requests.append(
                DispatchRequest(
                    m.topic,
                    m.queue_id,
                    phys,
                    size,
                    m.tags_code,
                    now,
                    qoff,
                    m.keys,
                    m.uniq_key,
                    sys_flag,
                    m.prepared_transaction_offset,
                )
            )
        self._write_pending(mf, pending, requests)
        return requests

    def append_sent(self, batch: SentBatch) -> SentAppend:
        """Append a producer-encoded batch: stamp queue id, offsets, hosts and times into each
        record in place and write the bytes with one copy per file they land in (a record never
        spans two files). Same contract as :meth:`append_batch`, but the answer is columns
        (:class:`SentAppend`), not an object per record; dispatch its ``run``
        with ``Dispatcher.dispatch_run``."""
        if self.store_host.is_v6 or batch.born_host.is_v6:
            raise ValueError("sent batches are IPv4 records; the caller re-encodes for IPv6")
        limit = self.file_size_bytes - END_FILE_MIN_BLANK_BYTES
        if max(batch.size, default=0) > limit:
            raise MessageTooLarge(
                f"a {max(batch.size)}-byte record cannot fit a {self.file_size_bytes}-byte "
                "commitlog file"
            )
        now = max(self.clock.now_ms(), self.last_store_timestamp_ms)
        self.last_store_timestamp_ms = now
        key = (batch.topic, batch.queue_id)
        first_qoff = self.queue_offsets.get(key, 0)
        try:
            phys = self._stamp_and_write(batch, now, first_qoff)
        except DiskFullError:  # the offsets are given back: the batch is refused
            if first_qoff:
                self.queue_offsets[key] = first_qoff
            else:
                self.queue_offsets.pop(key, None)
            raise
        failpoints.inject("commitlog_after_append")
        end = phys[-1] + batch.size[-1] if phys else self.max_offset
        return SentAppend(phys, first_qoff, now, end)

    def _stamp_and_write(self, batch: SentBatch, now: int, qoff: int) -> list[int]:
        """The loop of :meth:`append_sent`: one ``pack_into`` per record, offsets dense; the
        records' physical offsets."""
        buf, qid = batch.records, batch.queue_id
        view = memoryview(buf)
        mf = self.files.writable_file(self.files.max_offset())
        out: list[int] = []
        add = out.append
        first = 0  # where the records not yet written start in buf (they are contiguous)
        pending_bytes = 0
        base, free = mf.file_from_offset + mf.wrote_position, mf.free_bytes
        stamp, at = codec.SENT_STAMP.pack_into, codec.OFFSET_QUEUEID
        born_ip, born_port = batch.born_host.ip, batch.born_host.port
        store_ip, store_port = self.store_host.ip, self.store_host.port
        reconsume = batch.reconsume_times
        for pos, size, flag, sys_flag, born in zip(
            batch.pos, batch.size, batch.flag, batch.sys_flag, batch.born_timestamp_ms, strict=True
        ):
            if size + END_FILE_MIN_BLANK_BYTES > free - pending_bytes:
                self._seal(mf, [view[first:pos]] if pos > first else [])
                mf, pending_bytes, first = self.files.writable_file(), 0, pos
                base, free = mf.file_from_offset + mf.wrote_position, mf.free_bytes
            phys = base + pending_bytes
            stamp(
                buf, pos + at, qid, flag, qoff, phys, sys_flag, born or now,
                born_ip, born_port, now, store_ip, store_port, reconsume, 0,
            )  # fmt: skip
            add(phys)
            pending_bytes += size
            qoff += 1
        self.queue_offsets[(batch.topic, qid)] = qoff
        if pending_bytes:
            mf.append(view[first : first + pending_bytes])
        return out

    def _encode_topics(self, messages: Sequence[MessageToStore]) -> list[bytes]:
        """Every message's topic as bytes, after checking that every record fits a file
        (:class:`MessageTooLarge` otherwise: the batch is refused before anything is assigned)."""
        encoded_topics = [self._encode_topic(m.topic) for m in messages]
        limit = self.file_size_bytes - END_FILE_MIN_BLANK_BYTES
        store_v6 = self.store_host.is_v6
        for m, tb in zip(messages, encoded_topics, strict=True):
            size = codec.record_size(
                len(m.body), len(tb), len(m.properties), m.born_host.is_v6, store_v6
            )
            if size > limit:
                raise MessageTooLarge(
                    f"a {size}-byte record cannot fit a {self.file_size_bytes}-byte commitlog file"
                )
        return encoded_topics

    def _roll(
        self, mf: MappedFile, pending: list[bytes | memoryview], requests: list[DispatchRequest]
    ) -> MappedFile:
        """Seal ``mf`` (write and clear ``pending``, then a BLANK) and return the next file."""
        try:
            self._seal(mf, pending)
        except DiskFullError:
            self.unassign_queue_offsets(requests)
            raise
        pending.clear()
        return self.files.writable_file()

    def _write_pending(
        self, mf: MappedFile, pending: list[bytes | memoryview], requests: list[DispatchRequest]
    ) -> None:
        """Write the batch's last records into ``mf``; on a full disk give the offsets back."""
        if pending:
            try:
                mf.append(_joined(pending))
            except DiskFullError:
                self.unassign_queue_offsets(requests)
                raise

    def unassign_queue_offsets(self, requests: Sequence[DispatchRequest]) -> None:
        """Give back the queue offsets ``requests`` took: their batch was refused (the volume
        had no room), so the next message of each queue must take the first one again."""
        offsets = self.queue_offsets
        for r in reversed(requests):  # reversed: a queue's first offset in the batch wins
            if r.sys_flag & TRANSACTION_MASK in NOT_QUEUED:
                continue
            if r.queue_offset:
                offsets[(r.topic, r.queue_id)] = r.queue_offset
            else:
                offsets.pop((r.topic, r.queue_id), None)

    def _seal(self, mf: MappedFile, pending: list[bytes | memoryview]) -> None:
        """Write what is pending, then fill the file's tail with a BLANK record."""
        if pending:
            mf.append(_joined(pending))
        remaining = mf.free_bytes
        blank = bytearray(remaining)
        _BLANK_HEAD.pack_into(blank, 0, remaining, BLANK_MAGIC)
        mf.append(blank)

    def _encode_topic(self, topic: str) -> bytes:
        tb = self._topic_bytes.get(topic)
        if tb is None:
            tb = topic.encode()
            if len(tb) > codec.TOPIC_MAX_BYTES:
                raise ValueError(f"topic {topic[:40]!r}… is {len(tb)} bytes; limit 127")
            if len(self._topic_bytes) < 100_000:
                self._topic_bytes[topic] = tb
        return tb

    def append_raw(self, physical_offset: PhysicalOffset, data: bytes | memoryview) -> None:
        """Write replicated bytes at exactly ``physical_offset`` (a slave's path; checked)."""
        if physical_offset != self.max_offset:
            raise ValueError(
                f"raw append at {physical_offset} but the commitlog ends at {self.max_offset}"
            )
        view = memoryview(data)
        while view:
            mf = self.files.writable_file(physical_offset)
            n = min(len(view), mf.free_bytes)
            mf.append(view[:n])
            view = view[n:]

    # -- read ------------------------------------------------------------------------------
    @property
    def min_offset(self) -> PhysicalOffset:
        return PhysicalOffset(self.files.min_offset())

    @property
    def max_offset(self) -> PhysicalOffset:
        return PhysicalOffset(self.files.max_offset())

    def read(self, physical_offset: PhysicalOffset, size: int) -> memoryview | None:
        """The ``size`` bytes at ``physical_offset``, or None if they are not (all) on disk."""
        mf = self.files.find(physical_offset)
        if mf is None:
            return None
        pos = physical_offset - mf.file_from_offset
        view = mf.read(pos, size)
        return view if len(view) == size else None

    def read_record(
        self, physical_offset: PhysicalOffset, *, check_crc: bool = True
    ) -> codec.Record | None:
        """Decode the record at ``physical_offset``; None if absent, CorruptRecord if damaged."""
        head = self.read(physical_offset, 8)
        if head is None:
            return None
        size, _magic = codec.peek_size_magic(head)
        if size <= 0 or size > self.file_size_bytes:
            raise codec.CorruptRecord(f"at {physical_offset}: implausible TOTALSIZE {size}")
        data = self.read(physical_offset, size)
        if data is None:
            return None
        return codec.decode_record(data, check_crc=check_crc)

    def read_store_timestamp(self, physical_offset: PhysicalOffset, size: int) -> int | None:
        """STORETIMESTAMP of the record at ``physical_offset`` without decoding the rest."""
        data = self.read(physical_offset, size)
        if data is None:
            return None
        try:
            return codec.peek_store_timestamp(data)
        except codec.CorruptRecord:  # too short to hold it
            return None

    def next_file_start(self, physical_offset: PhysicalOffset) -> PhysicalOffset:
        """Start of the file after the one holding ``physical_offset``."""
        size = self.file_size_bytes
        return PhysicalOffset(physical_offset + size - physical_offset % size)

    # -- durability / lifecycle ------------------------------------------------------------
    def flush(self) -> int:
        return self.files.flush()

    def truncate(self, physical_offset: PhysicalOffset) -> None:
        """Drop everything from ``physical_offset`` on (recovery, slave truncation)."""
        self.files.truncate(physical_offset)

    def close(self) -> None:
        self.files.close()


def _joined(pending: list[bytes | memoryview]) -> bytes | memoryview:
    """The pending records as one buffer: a lone slice is written as it is (no extra copy)."""
    return pending[0] if len(pending) == 1 else b"".join(pending)
