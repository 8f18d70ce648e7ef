"""Durability: ASYNC_FLUSH on an interval, SYNC_FLUSH as group commit.

Group commit (SPEC §4.9, after RocketMQ's GroupCommitService): a writer under SYNC_FLUSH
appends, then awaits :meth:`FlushService.wait_flushed` for its end offset. One flusher task
runs ``fdatasync`` in a worker thread (it releases the GIL, so the event loop keeps appending);
every writer whose offset the fsync covered is released together, and writers that arrived
during the fsync are covered by the next one. RocketMQ swaps two request lists every 10 ms;
here the next fsync simply starts as soon as the previous one returns, which gives the same
batching without a fixed tick.

A writer not released within ``sync_flush_timeout_ms`` gets ``False`` (→ FLUSH_DISK_TIMEOUT):
its message is stored and will be flushed, but the broker could not promise it in time.

Consume queues and index files are flushed every ``flush_consume_queue_interval_ms``; the
checkpoint is written after them, so its timestamps never run ahead of what is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rocketq.aio import wait_event
from services.common import failpoints

log = logging.getLogger(__name__)


class FlushDiskType(enum.Enum):
    """``flushDiskType`` in the broker config."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class FlushService:
    """Owns the flush tasks of one store.

    ``flush_commitlog`` and ``flush_logics`` are called in a worker thread and return the
    commitlog offset now durable / nothing; ``before_logics`` runs on the loop just before each
    logics flush (the store writes its queued index entries there).
    """

    def __init__(
        self,
        *,
        flush_disk_type: FlushDiskType,
        flush_commitlog: Callable[[], int],
        flush_logics: Callable[[], None],
        before_logics: Callable[[], None] = lambda: None,
        flush_interval_commitlog_ms: int = 500,
        flush_interval_consume_queue_ms: int = 1000,
        sync_flush_timeout_ms: int = 5000,
    ) -> None:
        self.flush_disk_type = flush_disk_type
        self._flush_commitlog = flush_commitlog
        self._flush_logics = flush_logics
        self._before_logics = before_logics
        self.flush_interval_commitlog_ms = flush_interval_commitlog_ms
        self.flush_interval_consume_queue_ms = flush_interval_consume_queue_ms
        self.sync_flush_timeout_ms = sync_flush_timeout_ms
        self.flushed_offset = 0
        # (end offset, future, deadline): appended in offset order, so the deque stays sorted
        # by offset and — with one timeout for all — by deadline too.
        self._waiters: deque[tuple[int, asyncio.Future[bool], float]] = deque()
        self._wakeup: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Two threads: the commitlog fsync never queues behind a slow consume-queue flush.
        self._cl_executor = ThreadPoolExecutor(1, thread_name_prefix="flush-commitlog")
        self._cq_executor = ThreadPoolExecutor(1, thread_name_prefix="flush-logics")
        self.fsync_count = 0
        self.on_flush: Callable[[float], None] | None = None
        """Told each commitlog flush's duration in seconds, from the flush thread."""

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return bool(self._tasks)

    def start(self, initial_flushed_offset: int) -> None:
        self.flushed_offset = initial_flushed_offset
        self._wakeup = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._commitlog_loop(), name="flush-commitlog"),
            asyncio.create_task(self._logics_loop(), name="flush-logics"),
        ]

    async def stop(self) -> None:
        """Stop the loops, then flush everything once more (a clean shutdown loses nothing)."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        loop = asyncio.get_running_loop()
        self.flushed_offset = await loop.run_in_executor(self._cl_executor, self._flush_cl_once)
        self._before_logics()
        await loop.run_in_executor(self._cq_executor, self._flush_logics)
        self._release(self.flushed_offset)
        for _, fut, _deadline in self._waiters:
            if not fut.done():
                fut.set_result(False)
        self._waiters.clear()
        self._cl_executor.shutdown(wait=True)
        self._cq_executor.shutdown(wait=True)

    # -- sync flush ------------------------------------------------------------------------
    async def wait_flushed(self, end_offset: int) -> bool:
        """Wait until the commitlog is durable up to ``end_offset``; False on timeout.

        No ``wait_for``/``shield`` per writer (each costs a task): the flusher loop itself
        fails waiters whose deadline has passed, so a waiter is one future and one tuple.
        """
        if self.flushed_offset >= end_offset:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        deadline = loop.time() + self.sync_flush_timeout_ms / 1000
        self._waiters.append((end_offset, fut, deadline))
        assert self._wakeup is not None, "FlushService.start() was not called"
        self._wakeup.set()
        return await fut

    def _release(self, flushed: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= flushed:
            _, fut, _deadline = waiters.popleft()
            if not fut.done():
                fut.set_result(True)

    def _expire(self, now: float) -> None:
        """Fail waiters whose deadline passed (FLUSH_DISK_TIMEOUT); they stay stored."""
        waiters = self._waiters
        while waiters and waiters[0][2] <= now:
            _, fut, _deadline = waiters.popleft()
            if not fut.done():
                fut.set_result(False)

    def _flush_cl_once(self) -> int:
        failpoints.inject("commitlog_before_flush")
        started = time.perf_counter()
        flushed = self._flush_commitlog()
        on_flush = self.on_flush
        if on_flush is not None:  # the flush latency histogram (broker metrics); thread-safe
            on_flush(time.perf_counter() - started)
        failpoints.inject("commitlog_after_flush")
        self.fsync_count += 1
        return flushed

    async def _commitlog_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        interval_s = self.flush_interval_commitlog_ms / 1000
        sync = self.flush_disk_type is FlushDiskType.SYNC_FLUSH
        while True:
            timeout = None if sync else interval_s
            if self._waiters:
                until_deadline = max(0.0, self._waiters[0][2] - loop.time())
                timeout = until_deadline if timeout is None else min(timeout, until_deadline)
            await wait_event(self._wakeup, timeout)
            self._wakeup.clear()
            self._expire(loop.time())
            if sync and not self._waiters:
                continue
            try:
                flushed = await self._flush_expiring(loop)
            except OSError as exc:  # a failing disk: writers time out with FLUSH_DISK_TIMEOUT
                log.error("commitlog flush failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self.flushed_offset = max(self.flushed_offset, flushed)
            self._release(self.flushed_offset)
            self._expire(loop.time())

    async def _flush_expiring(self, loop: asyncio.AbstractEventLoop) -> int:
        """Run one fsync off the loop; writers whose deadline passes meanwhile get their
        FLUSH_DISK_TIMEOUT on time instead of a late SEND_OK when a slow disk finally answers."""
        flush = loop.run_in_executor(self._cl_executor, self._flush_cl_once)
        while True:
            timeout = None
            if self._waiters:
                timeout = max(0.0, self._waiters[0][2] - loop.time())
            done, _ = await asyncio.wait({flush}, timeout=timeout)
            if done:
                return flush.result()
            self._expire(loop.time())

    async def _logics_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.flush_interval_consume_queue_ms / 1000)
            try:
                self._before_logics()
                await loop.run_in_executor(self._cq_executor, self._flush_logics)
            except OSError as exc:
                log.error("consume queue / index flush failed: %s", exc)
