"""Recovery: make the commitlog, consume queues and index agree again after a start.

Design essay
------------
*Invariant after recovery.* The commitlog ends at the last record that is whole and whose
body CRC checks; every consume-queue unit and index entry points below that end; every record
below the end is in its consume queue; queue offsets continue densely from there.

*Where to scan from.* A clean shutdown removes the ``abort`` marker; its presence means the
last run died. After a clean shutdown we still verify the last three files (RocketMQ's normal
recovery). After a crash we verify from the file whose first record is no newer than the
checkpoint's oldest flush time — everything the checkpoint does not vouch for — and at least
the last three files.

*Torn tails.* A record that is cut short, has a bad magic or a bad CRC ends the log; bytes
after it are garbage from an interrupted write (or worse). They are zeroed, files after it are
deleted, and the event is reported. Only unacknowledged writes can be there: a SYNC_FLUSH ack
is given after fsync, and an fsynced prefix is never torn by a later crash.

*Re-dispatch.* Dispatch is idempotent (consume queues skip units they have, the index skips
what its last file covers), so recovery simply re-dispatches every record from the highest
physical offset any consume queue points at. Consume queues that pointed past the new end
are cut back first.

Alternatives considered: a separate "dispatched offset" in the checkpoint (RocketMQ 5's
approach) saves a scan of consume-queue tails, but adds one more thing to keep consistent;
the scan is cheap because units are binary-searched for the first empty one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from rocketq import codec
from services.common import failpoints
from services.store.checkpoint import Checkpoint
from services.store.commitlog import NOT_QUEUED, TRANSACTION_MASK, CommitLog
from services.store.consume_queue_store import ConsumeQueueStore
from services.store.dispatch import Dispatcher
from services.store.types import DispatchRequest, PhysicalOffset, QueueOffset

log = logging.getLogger(__name__)
NORMAL_RECOVERY_FILES = 3


@dataclass
class RecoveryReport:
    """What recovery found and did; printed by ``rocketq store verify`` and logged at start."""

    abnormal: bool = False
    scanned_from: int = 0
    commitlog_end: int = 0
    truncated_bytes: int = 0
    records_scanned: int = 0
    records_redispatched: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ScanItem:
    """One step of a commitlog scan: a record, or a blank file tail."""

    offset: PhysicalOffset
    size: int
    record: codec.Record | None


def scan(commitlog: CommitLog, start: PhysicalOffset, problems: list[str]) -> Iterator[ScanItem]:
    """Yield every valid record (and blank) from ``start`` until the first invalid bytes.

    The scan stops at zeros (never written), a torn or corrupt record, or the end of files;
    a description of anything that is not a clean end goes into ``problems``.
    """
    files = commitlog.files
    mf = files.find(start)
    while mf is not None:
        pos = start - mf.file_from_offset
        view = mf.view
        size_bytes = mf.file_size_bytes
        while pos + 8 <= size_bytes:
            size, magic = codec.peek_size_magic(view, pos)
            if size == 0 and magic == 0:
                return  # never written: the clean end of the log
            here = mf.file_from_offset + pos
            if magic == codec.BLANK_MAGIC:
                if pos + size != size_bytes:
                    problems.append(f"commitlog {here}: blank record does not reach file end")
                    return
                yield ScanItem(PhysicalOffset(here), size, None)
                pos = size_bytes
                break
            try:
                if size <= 0 or pos + size > size_bytes:
                    raise codec.CorruptRecord(f"at {here}: TOTALSIZE {size} does not fit the file")
                rec = codec.decode_record(view[pos : pos + size])
                if rec.physical_offset != here:
                    raise codec.CorruptRecord(
                        f"at {here}: record says it is at {rec.physical_offset}"
                    )
            except codec.CorruptRecord as exc:
                problems.append(f"commitlog: {exc}".replace("at 0:", f"at {here}:"))
                return
            yield ScanItem(PhysicalOffset(here), size, rec)
            pos += size
        if pos + 8 > size_bytes and pos != size_bytes:
            problems.append(f"commitlog {mf.file_from_offset + pos}: file ends inside a record")
            return
        start = PhysicalOffset(mf.file_from_offset + size_bytes)
        mf = files.find(start)


def _scan_start(commitlog: CommitLog, abnormal: bool, checkpoint: Checkpoint) -> PhysicalOffset:
    files = commitlog.files.files
    if not files:
        return PhysicalOffset(0)
    index = max(0, len(files) - NORMAL_RECOVERY_FILES)
    if abnormal:
        # Walk back to a file whose first record predates the checkpoint's oldest flush time.
        limit = checkpoint.min_timestamp_ms
        i = index
        while i > 0:
            first = PhysicalOffset(files[i].file_from_offset)  # a commitlog file starts there
            ts = commitlog.read_store_timestamp(first, codec.FIXED_BYTES_V6)
            if ts is not None and limit and ts <= limit:
                break
            i -= 1
        index = i
    return PhysicalOffset(files[index].file_from_offset)


def recover_commitlog(
    commitlog: CommitLog, abnormal: bool, checkpoint: Checkpoint, report: RecoveryReport
) -> None:
    """Find the true end of the commitlog and truncate everything after it."""
    start = _scan_start(commitlog, abnormal, checkpoint)
    report.scanned_from = start
    end = start
    last_ts = 0
    for item in scan(commitlog, start, report.problems):
        end = PhysicalOffset(item.offset + item.size)
        report.records_scanned += item.record is not None
        if item.record is not None:
            last_ts = item.record.store_timestamp_ms
    # Files before the scan start are taken as whole; the last written one ends at `end`.
    for mf in commitlog.files:
        if mf.file_from_offset + mf.file_size_bytes <= end:
            mf.wrote_position = mf.flushed_position = mf.file_size_bytes
    garbage = _garbage_after(commitlog, end)
    if garbage:
        failpoints.inject("recovery_before_truncate")
        report.truncated_bytes = garbage
        log.warning("commitlog: truncating %d bytes of torn tail at %d", garbage, end)
    commitlog.truncate(end)
    report.commitlog_end = end
    commitlog.last_store_timestamp_ms = last_ts


def recover_logics(
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    dispatcher: Dispatcher,
    report: RecoveryReport,
) -> None:
    """Cut consume queues back to the commitlog, rebuild offsets, re-dispatch the rest."""
    cl_end = commitlog.max_offset
    cl_min = commitlog.min_offset
    for cq in queues:
        cq.recover(cl_end)
        cq.correct_min_offset(cl_min)
        commitlog.queue_offsets[(cq.topic, cq.queue_id)] = cq.max_offset
    # Dispatch runs in commitlog order, so the furthest any queue reaches is where the
    # dispatched prefix ends. No queue pointing anywhere means rebuild everything.
    ends = [cq.max_physical_end for cq in queues if cq.max_physical_end]
    redispatch_from = PhysicalOffset(max(max(ends) if ends else cl_min, cl_min))
    if queues.rebuild_needed:
        redispatch_from = cl_min  # a queue was set aside: rebuild it (the others skip units)
        queues.rebuild_needed = False
    if dispatcher.index is not None:
        dispatcher.index.truncate(cl_end)
        # Dispatch writes the consume queues first, then the index: a crash between the two
        # leaves records the queues hold and the index lacks. The index's endPhyoffset is a
        # record start — unless its header is damaged, and then it is not trusted.
        indexed = max(dispatcher.index.max_indexed_offset, cl_min)
        if indexed < redispatch_from and _is_record_start(commitlog, indexed):
            redispatch_from = indexed
    batch: list[DispatchRequest] = []
    for item in scan(commitlog, redispatch_from, report.problems):
        rec = item.record
        if rec is None:
            continue
        key = (rec.topic, rec.queue_id)
        if rec.sys_flag & TRANSACTION_MASK not in NOT_QUEUED:
            commitlog.queue_offsets[key] = max(
                commitlog.queue_offsets.get(key, 0), rec.queue_offset + 1
            )
        batch.append(
            DispatchRequest(
                rec.topic,
                rec.queue_id,
                PhysicalOffset(item.offset),
                item.size,
                codec.tags_hash(rec.tags),
                rec.store_timestamp_ms,
                QueueOffset(rec.queue_offset),
                rec.keys,
                rec.uniq_key,
                rec.sys_flag,
                rec.prepared_transaction_offset,
            )
        )
        if len(batch) >= 1024:
            report.records_redispatched += len(batch)
            dispatcher.dispatch(batch)
            batch = []
    report.records_redispatched += len(batch)
    dispatcher.dispatch(batch)
    dispatcher.dispatched_offset = cl_end


def _is_record_start(commitlog: CommitLog, offset: PhysicalOffset) -> bool:
    try:
        rec = commitlog.read_record(offset)
    except codec.CorruptRecord:
        return False
    return rec is not None and rec.physical_offset == offset


_GARBAGE_CHUNK_BYTES = 4 * 1024 * 1024


def _garbage_after(commitlog: CommitLog, end: PhysicalOffset) -> int:
    """Non-zero bytes after ``end``: torn writes, contiguous from ``end`` to an all-zero chunk."""
    garbage = 0
    mf = commitlog.files.find(end)
    if mf is not None:
        pos = end - mf.file_from_offset
        while pos < mf.file_size_bytes:
            chunk = bytes(mf.view[pos : pos + _GARBAGE_CHUNK_BYTES])
            nonzero = len(chunk.rstrip(b"\0"))
            garbage += len(chunk) - chunk.count(0) if nonzero else 0
            if not nonzero:
                break
            pos += len(chunk)
    for later in commitlog.files:
        if later.file_from_offset > end and bytes(later.view[:8]) != bytes(8):
            garbage += 8
    return garbage
