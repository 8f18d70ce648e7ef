"""MessageStore: the facade that wires commitlog, consume queues, index, flush and retention.

It is deliberately thin — each concern lives in its own module — and it is the only object the
broker's handlers talk to. Every method runs on the event loop; only fsyncs leave it.

Lifecycle: ``open()`` maps files and recovers (synchronous, before serving), ``start()`` starts
the flush and retention tasks, ``shutdown()`` flushes everything, writes the checkpoint and
removes the ``abort`` marker — the next start then knows the shutdown was clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rocketq import codec
from services.common.atomic_write import fsync_dir
from services.common.clock import SYSTEM_CLOCK, Clock
from services.store.checkpoint import Checkpoint
from services.store.commitlog import (
    AppendResult,
    CommitLog,
    MessageToStore,
    SentAppend,
    SentBatch,
)
from services.store.config import StoreConfig
from services.store.consume_queue import CQ_UNIT_BYTES
from services.store.consume_queue_store import ConsumeQueueStore
from services.store.dispatch import Dispatcher
from services.store.epoch_file import EpochHistory
from services.store.errors import ReplicaCorruptError as ReplicaCorruptError  # noqa: PLC0414 (re-export)
from services.store.errors import ReplicaRangeError as ReplicaRangeError  # noqa: PLC0414 (re-export)
from services.store.errors import StoreError as StoreError  # noqa: PLC0414 (re-export)
from services.store.flush import FlushDiskType, FlushService
from services.store.index_service import IndexService
from services.store.mapped_file import DiskFullError
from services.store.pull_scan import GetResult as GetResult  # noqa: PLC0414 (re-export)
from services.store.pull_scan import GetStatus as GetStatus  # noqa: PLC0414 (re-export)
from services.store.pull_scan import RecordFilter as RecordFilter  # noqa: PLC0414 (re-export)
from services.store.pull_scan import TagsFilter as TagsFilter  # noqa: PLC0414 (re-export)
from services.store.pull_scan import UnitScan
from services.store.recovery import RecoveryReport, recover_commitlog, recover_logics
from services.store.replica import ReplicaWriter, read_replica
from services.store.retention import DiskUsage, RetentionService, disk_used_ratio
from services.store.types import DispatchRequest, PhysicalOffset, QueueOffset

log = logging.getLogger(__name__)


class PutStatus(enum.Enum):
    """Outcome of a put, as the broker maps it to SendStatus / gRPC codes."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


class StoreFullError(StoreError):
    """Disk use is at or above diskSpaceWarningLevelRatio, or the volume had no room for a
    write (which was then undone: the store is as before it); appends are refused."""


class StoreClosedError(StoreError):
    """The store is not open (starting, or shutting down)."""


@dataclass(slots=True)
class PutResult:
    status: PutStatus
    results: list[AppendResult]


ConfirmListener = Callable[[int], None]
"""Called with the new confirm offset each time it advances (wakes held pulls)."""


class MessageStore:
    """One broker's store."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        disk_usage: DiskUsage = disk_used_ratio,
        memory_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.commitlog = CommitLog(
            config.commitlog_dir,
            file_size_bytes=config.commitlog_file_bytes,
            store_host=config.store_host,
            clock=clock,
            zero_ahead=config.zero_ahead_commitlog,
        )
        self.queues = ConsumeQueueStore(
            config.consume_queue_dir, config.consume_queue_units_per_file
        )
        self.index: IndexService | None = (
            IndexService(
                config.index_dir,
                slot_num=config.index_slot_num,
                index_num=config.index_num,
                clock=clock,
            )
            if config.message_index_enable
            else None
        )
        self.dispatcher = Dispatcher(self.queues, self.index)
        self.checkpoint = Checkpoint()
        self.flusher = FlushService(
            flush_disk_type=config.flush_disk_type,
            flush_commitlog=self._flush_commitlog,
            flush_logics=self._flush_logics,
            before_logics=self._write_queued_index,
            flush_interval_commitlog_ms=config.flush_interval_commitlog_ms,
            flush_interval_consume_queue_ms=config.flush_interval_consume_queue_ms,
            sync_flush_timeout_ms=config.sync_flush_timeout_ms,
        )
        self.retention = RetentionService(
            config, self.commitlog, self.queues, self.index, clock, disk_usage
        )
        self.memory_bytes = memory_bytes or config.physical_memory_bytes or _physical_memory_bytes()
        """Physical memory the in-memory ratio applies to (SPEC §6.7)."""
        self.recovery: RecoveryReport | None = None
        self.replica = ReplicaWriter(self.commitlog, self.dispatcher)
        self.epochs = EpochHistory(config.store_dir / "epoch")
        """Which failover epoch wrote which commitlog range (replication; issue 8 bumps it)."""
        self.confirm_offset: PhysicalOffset | None = None
        """Replication bound on reads: records ending past it are not served. None: none."""
        self.confirm_listeners: list[ConfirmListener] = []
        self._lock_fd: int | None = None
        self._open = False
        self._retention_task: asyncio.Task[None] | None = None
        self._disk_full = False
        """The last write found the volume full (logged once per episode, not per retry)."""

    @property
    def memory_limit_bytes(self) -> int:
        """How far behind the commitlog's end a message may lie and still count as in memory:
        ``access_message_in_memory_max_ratio`` % of physical memory (read from the current
        config, which the broker replaces on a runtime config update)."""
        return self.memory_bytes * self.config.access_message_in_memory_max_ratio // 100

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> RecoveryReport:
        """Lock the directory, map every file and recover. Call before serving."""
        cfg = self.config
        cfg.store_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(cfg.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreError(
                f"{cfg.store_dir} is in use by another process (its lock file is held); "
                "stop that broker or choose another store directory"
            ) from None
        report = RecoveryReport(abnormal=cfg.abort_path.exists())
        self.checkpoint = Checkpoint.load(cfg.checkpoint_path)
        report.problems.extend(self.commitlog.files.load())
        report.problems.extend(self.queues.load())
        if self.index is not None:
            report.problems.extend(self.index.load())
        recover_commitlog(self.commitlog, report.abnormal, self.checkpoint, report)
        recover_logics(self.commitlog, self.queues, self.dispatcher, report)
        try:
            self.epochs.load()
        except ValueError as exc:
            self.close_files()
            raise StoreError(
                f"{exc}; repair or remove the file (a slave then copies its master's history, "
                "a master starts a new one at epoch 0)"
            ) from None
        if self.epochs.last_epoch is None and not cfg.slave:
            self.epochs.append(0, self.commitlog.max_offset)  # static roles: epoch 0 from here
        cfg.abort_path.touch()
        fsync_dir(cfg.store_dir)
        for problem in report.problems:
            log.warning("store recovery: %s", problem)
        self.recovery = report
        self._open = True
        return report

    async def start(self) -> None:
        """Start flushing and retention (needs a running event loop)."""
        if not self._open:
            self.open()
        self.flusher.start(self.commitlog.max_offset)
        self._retention_task = asyncio.create_task(self._retention_loop(), name="retention")

    async def shutdown(self) -> None:
        """Flush everything, write the checkpoint, remove ``abort``: a clean stop."""
        if not self._open:
            return
        self._open = False
        self.replica.drop_partial()  # the next start then finds whole records only
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
        if self.flusher.running:
            await self.flusher.stop()  # writes the queued index entries first
        else:
            self._flush_commitlog()
            self._write_queued_index()
            self._flush_logics()
        self.close_files()
        self.config.abort_path.unlink(missing_ok=True)
        fsync_dir(self.config.store_dir)

    def close_files(self) -> None:
        """Unmap everything and release the lock (no flush; ``shutdown`` flushes first)."""
        self._open = False
        self.commitlog.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.clean_resource_interval_ms / 1000)
            try:
                self.retention.run_once()
            except Exception:  # retention must never take the broker down
                log.exception("retention run failed")

    # -- flush callbacks (worker threads) --------------------------------------------------
    def _flush_commitlog(self) -> int:
        ts = self.commitlog.last_store_timestamp_ms
        flushed = self.commitlog.flush()
        self.checkpoint.physic_msg_timestamp_ms = ts
        self.checkpoint.master_flushed_offset = flushed
        return flushed

    def _write_queued_index(self) -> None:
        """Write the index entries dispatch queued (IndexService.PENDING_KEYS_MAX), on the loop.
        A full volume leaves them queued; recovery would rebuild them anyway."""
        if self.index is None:
            return
        try:
            self.index.drain()
        except DiskFullError as exc:
            log.warning("index entries stay queued: %s", exc)

    def _flush_logics(self) -> None:
        ts = self.commitlog.last_store_timestamp_ms
        self.queues.flush()
        if self.index is not None:
            self.index.flush()
        self.checkpoint.logics_msg_timestamp_ms = ts
        self.checkpoint.index_msg_timestamp_ms = ts
        self.checkpoint.save(self.config.checkpoint_path)

    # -- writes ----------------------------------------------------------------------------
    def append(self, messages: Sequence[MessageToStore]) -> list[AppendResult]:
        """Append and dispatch; durable per the flush policy only after :meth:`put`'s wait."""
        return self._append(lambda: self.commitlog.append_batch(messages), len(messages))

    def append_sent(self, batch: SentBatch) -> SentAppend:
        """:meth:`append` for a producer-encoded batch (stamped in place, DESIGN.md §12); the
        answer is columns (see :class:`SentAppend`), not an AppendResult per record."""
        self._check_writable()
        start = self.commitlog.max_offset
        appended: SentAppend | None = None
        try:
            appended = self.commitlog.append_sent(batch)  # undoes its own offsets
            self.dispatcher.dispatch_run(appended.run(batch))
        except DiskFullError as exc:
            self.replica.truncate(start, self.queues)  # bytes, units and index entries
            if appended is not None:  # refused by dispatch: give the offsets back
                self.commitlog.unassign_queue_offsets(appended.run(batch).requests()[:1])
            raise self._full(exc, f"{len(batch.pos)} message(s) not stored") from exc
        self._disk_has_room()
        return appended

    def _check_writable(self) -> None:
        if not self._open:
            raise StoreClosedError("the store is not open; the broker is starting or stopping")
        if not self.retention.writable:
            raise StoreFullError(
                f"disk use is at or above {self.config.disk_space_warning_level_ratio}% on "
                f"{self.config.store_dir}; writes are refused until retention frees space "
                "(lower fileReservedTime or add disk)"
            )

    def _append(
        self,
        append: Callable[[], tuple[list[AppendResult], list[DispatchRequest]]],
        count: int,
    ) -> list[AppendResult]:
        self._check_writable()
        start = self.commitlog.max_offset
        requests: list[DispatchRequest] = []
        try:
            results, requests = append()  # undoes its own offsets
            self.dispatcher.dispatch(requests)
        except DiskFullError as exc:
            self.replica.truncate(start, self.queues)  # bytes, units and index entries
            self.commitlog.unassign_queue_offsets(requests)  # refused by dispatch: give back
            raise self._full(exc, f"{count} message(s) not stored") from exc
        self._disk_has_room()
        return results

    async def put(self, messages: Sequence[MessageToStore]) -> PutResult:
        """Append, dispatch and — under SYNC_FLUSH — wait for the covering fsync."""
        results = self.append(messages)
        status = PutStatus.PUT_OK
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH and results:
            last = results[-1]
            if not await self.flusher.wait_flushed(last.physical_offset + last.size_bytes):
                status = PutStatus.FLUSH_DISK_TIMEOUT
        return PutResult(status, results)

    # -- replication (DESIGN.md §6; the logic lives in replica.py) -------------------------
    def read_replica(self, physical_offset: PhysicalOffset, max_bytes: int) -> bytes:
        """Master: stored commitlog bytes from ``physical_offset`` (at most ``max_bytes``, never
        across a file end, b"" when nothing is new). ReplicaRangeError outside the commitlog."""
        return read_replica(self.commitlog, physical_offset, max_bytes)

    def append_replica(
        self, physical_offset: PhysicalOffset, data: bytes | memoryview
    ) -> PhysicalOffset:
        """Slave: write a replicated chunk and dispatch its whole records as the master did.

        ``physical_offset`` must be the commitlog's max offset, else ValueError. Returns the new
        max offset. A chunk may end inside a record: it is dispatched when the next chunk
        completes it. ReplicaCorruptError, after keeping the good prefix, when a check fails.
        """
        if not self._open:
            raise StoreClosedError("the store is not open; the broker is starting or stopping")
        if not self.retention.writable:
            raise StoreFullError(
                f"disk use is at or above {self.config.disk_space_warning_level_ratio}% on "
                f"{self.config.store_dir}; replication pauses until retention frees space"
            )
        whole_end = self.replica.dispatched_offset
        try:
            new_max = self.replica.append(physical_offset, data)
        except DiskFullError as exc:
            # Undo the chunk (and any partial record before it): the stream restarts at the
            # last whole record, exactly as after a reconnect.
            self.truncate_replica(whole_end)
            raise self._full(exc, f"replicated bytes from {physical_offset} not stored") from exc
        self._disk_has_room()
        return new_max

    def _full(self, exc: DiskFullError, what: str) -> StoreFullError:
        if not self._disk_full:
            self._disk_full = True
            log.error(
                "the store's volume is full (%s): %s; the write was undone and the store is "
                "unchanged. Writes fail until space is freed on %s",
                exc.strerror,
                what,
                self.config.store_dir,
            )
        return StoreFullError(f"no space left on the store's volume ({exc}); {what}")

    def _disk_has_room(self) -> None:
        if self._disk_full:
            self._disk_full = False
            log.info("the store's volume has room again: writes resumed")

    def truncate_replica(self, physical_offset: PhysicalOffset) -> None:
        """Slave: drop commitlog bytes at/after ``physical_offset`` with the consume-queue units
        and index entries built from them. The epoch history is left to the caller."""
        if not self._open:
            raise StoreClosedError("the store is not open; the broker is starting or stopping")
        self.replica.truncate(physical_offset, self.queues)
        self.flusher.flushed_offset = min(self.flusher.flushed_offset, physical_offset)

    @property
    def replica_dispatched_offset(self) -> PhysicalOffset:
        """Slave: end of the last whole record written and dispatched (a partial tail excluded)."""
        return self.replica.dispatched_offset

    def set_confirm_offset(self, offset: PhysicalOffset | None) -> None:
        """Bound reads at ``offset`` (None: unbounded); listeners run when the bound advances."""
        old = self.confirm_offset
        self.confirm_offset = offset
        if old is None or (offset is not None and offset <= old):
            return
        reached = self.commitlog.max_offset if offset is None else offset
        for listener in self.confirm_listeners:
            listener(reached)

    # -- reads -----------------------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> QueueOffset:
        cq = self.queues.find(topic, queue_id)
        return cq.min_offset if cq else QueueOffset(0)

    def max_offset(self, topic: str, queue_id: int) -> QueueOffset:
        cq = self.queues.find(topic, queue_id)
        return cq.max_offset if cq else QueueOffset(0)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> QueueOffset:
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            return QueueOffset(0)
        return cq.offset_by_time(timestamp_ms, self.commitlog.read_store_timestamp)

    def read_record(self, physical_offset: int) -> codec.Record | None:
        """The record at a physical offset (view by offset message id).

        Takes a plain ``int``: the broker's handlers pass wire values (offset message ids,
        request fields) straight in; this is where they become a :class:`PhysicalOffset`."""
        if physical_offset < self.commitlog.min_offset:
            return None
        return self.commitlog.read_record(PhysicalOffset(physical_offset))

    def query_by_key(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> list[codec.Record]:
        """Messages of ``topic`` whose key (or unique id) is ``key``, stored in the range."""
        if self.index is None:
            return []
        out: list[codec.Record] = []
        for phys in self.index.query(topic, key, max_num, begin_ms, end_ms):
            try:
                rec = self.read_record(phys)
            except codec.CorruptRecord:
                continue
            # The index is a hash index: confirm the key really matches.
            if (
                rec is not None
                and rec.topic == topic
                and (key in rec.keys.split(" ") or rec.uniq_key == key)
            ):
                out.append(rec)
        return out

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        *,
        tags_filter: TagsFilter | None = None,
        record_filter: RecordFilter | None = None,
    ) -> GetResult:
        """Read up to ``max_msgs`` records from queue offset ``offset``, with SPEC §6.7's
        statuses. ``offset`` is a plain ``int`` from the wire (a Pull request's queue offset);
        it becomes a :class:`QueueOffset` here."""
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_off, max_off = int(cq.min_offset), int(cq.max_offset)
        if max_off == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if offset < min_off:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            nxt = 0 if min_off == 0 else max_off
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, nxt, min_off, max_off)
        units = cq.units_from(QueueOffset(offset), max(16000 // CQ_UNIT_BYTES, max_msgs * 20))
        if not units:
            nxt = offset + cq.units_per_file - offset % cq.units_per_file
            return GetResult(GetStatus.OFFSET_FOUND_NULL, nxt, min_off, max_off)
        return self._scan_units(
            units, offset, max_msgs, min_off, max_off, tags_filter, record_filter
        )

    def _scan_units(
        self,
        units: memoryview,
        offset: int,
        max_msgs: int,
        min_off: int,
        max_off: int,
        tags_filter: TagsFilter | None,
        record_filter: RecordFilter | None,
    ) -> GetResult:
        result = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, min_off, max_off)
        scan = UnitScan(
            result,
            self.commitlog,
            self.config,
            max_msgs,
            self.memory_limit_bytes,
            self.confirm_offset,
            tags_filter,
            record_filter,
        )
        return scan.scan(units)


PHYSICAL_MEMORY_ENV = "ROCKETQ_PHYSICAL_MEMORY_BYTES"
"""Pretend the machine has this much memory (tests of the slave suggestion, SPEC §6.7)."""


def _physical_memory_bytes() -> int:
    override = os.environ.get(PHYSICAL_MEMORY_ENV, "").strip()
    if override.isdigit() and int(override) > 0:
        return int(override)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3
