"""Durability: ASYNC_FLUSH on an interval, SYNC_FLUSH as group commit.

Group commit (SPEC §4.9, after RocketMQ's GroupCommitService): a writer under SYNC_FLUSH
appends, then awaits :meth:`FlushService.wait_flushed` for its end offset. One flusher task
runs ``fdatasync`` in a worker thread (it releases the GIL, so the event loop keeps appending);
every writer whose offset the fsync covered is released together, and writers that arrived
during the fsync are covered by the next one. RocketMQ swaps two request lists every 10 ms;
here the next fsync starts once the loop has released the previous group, which gives the same
batching without a fixed tick.

Per group the loop wakes the flusher (a set Event costs no turn while a flush runs), lets
runnable Send handlers append once more, hands the fsync to the thread and releases the group
when it answers. Under the peers benchmark's SYNC_FLUSH produce load on a loaded 2-core VM, an
earlier shape (a ``wait_for`` task per group and ``asyncio.wait`` around each fsync, for the
deadlines) kept a writer waiting 4.5-9.8 ms for fsyncs of 1.1-2.6 ms; this one 2.9-4.5 ms for
fsyncs of 0.9-1.3 ms, at the same CPU per message. A dedicated flusher thread that restarts the
fsync without the loop ran twice the fsyncs for smaller groups and cost more CPU per message:
on a CPU-bound machine, with the loop in the cycle, a busy broker gets larger groups.

A writer not released within ``sync_flush_timeout_ms`` gets ``False`` (→ FLUSH_DISK_TIMEOUT):
its message is stored and will be flushed, but the broker could not promise it in time. One
loop timer, armed for the oldest waiter's deadline, expires them, so a stuck fsync delays no
answer past its deadline.

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

from services.common import failpoints

log = logging.getLogger(__name__)


class FlushDiskType(enum.Enum):
    """``flushDiskType`` in the broker config."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


FLUSH_ERROR_PAUSE_S = 0.1
"""After a failed commitlog fsync the flusher waits this long before trying again."""


class FlushService:
    """Owns the flush tasks of one store.

    ``flush_commitlog`` and ``flush_logics`` are called in worker threads (one each):
    the first returns the commitlog offset now durable, the second flushes consume queues and
    index and writes the checkpoint.
    """

    def __init__(
        self,
        *,
        flush_disk_type: FlushDiskType,
        flush_commitlog: Callable[[], int],
        flush_logics: Callable[[], None],
        flush_interval_commitlog_ms: int = 500,
        flush_interval_consume_queue_ms: int = 1000,
        sync_flush_timeout_ms: int = 5000,
    ) -> None:
        self.flush_disk_type = flush_disk_type
        self._flush_commitlog = flush_commitlog
        self._flush_logics = flush_logics
        self.flush_interval_commitlog_ms = flush_interval_commitlog_ms
        self.flush_interval_consume_queue_ms = flush_interval_consume_queue_ms
        self.sync_flush_timeout_ms = sync_flush_timeout_ms
        self.flushed_offset = 0
        """Durable commitlog offset as the loop knows it (only the loop writes it)."""
        # (end offset, future, deadline): appended in offset order, so the deque stays sorted
        # by offset and — with one timeout for all — by deadline too.
        self._waiters: deque[tuple[int, asyncio.Future[bool], float]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._expiry: asyncio.TimerHandle | None = None
        """The one timer that fails waiters past their deadline (see :meth:`_on_deadline`)."""
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
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._commitlog_loop(), name="flush-commitlog"),
            asyncio.create_task(self._logics_loop(), name="flush-logics"),
        ]

    async def stop(self) -> None:
        """Stop the flushers, then flush everything once more (a clean shutdown loses nothing)."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        loop = asyncio.get_running_loop()
        flushed = await loop.run_in_executor(self._cl_executor, self._flush_cl_once)
        self.flushed_offset = max(self.flushed_offset, flushed)
        await loop.run_in_executor(self._cq_executor, self._flush_logics)
        self._release(self.flushed_offset)
        for _, fut, _deadline in self._waiters:
            if not fut.done():
                fut.set_result(False)
        self._waiters.clear()
        self._cq_executor.shutdown(wait=True)
        self._cl_executor.shutdown(wait=True)

    # -- sync flush ------------------------------------------------------------------------
    async def wait_flushed(self, end_offset: int) -> bool:
        """Wait until the commitlog is durable up to ``end_offset``; False on timeout.

        No ``wait_for``/``shield`` per writer (each costs a task): one loop timer fails
        waiters whose deadline has passed, so a waiter is one future and one tuple.
        """
        if self.flushed_offset >= end_offset:
            return True
        assert self._wakeup is not None, "FlushService.start() was not called"
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        deadline = loop.time() + self.sync_flush_timeout_ms / 1000
        self._waiters.append((end_offset, fut, deadline))
        self._wakeup.set()
        if self._expiry is None:
            self._expiry = loop.call_at(deadline, self._on_deadline)
        return await fut

    def _on_flushed(self, flushed: int) -> None:
        """On the loop, once per fsync: the group it covered is released."""
        self.flushed_offset = max(self.flushed_offset, flushed)
        self._release(self.flushed_offset)

    def _on_deadline(self) -> None:
        """The oldest waiter's deadline: fail what is due, re-arm for the next waiter."""
        loop = self._loop
        assert loop is not None
        self._expiry = None
        self._expire(loop.time())
        if self._waiters:
            self._expiry = loop.call_at(self._waiters[0][2], self._on_deadline)

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
        """One fsync per round: under SYNC_FLUSH when a writer waits, under ASYNC_FLUSH every
        interval (or sooner when asked). The wake-up is cleared before the fsync reads the
        write position, so a writer that appends and asks after that gets the next round."""
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup
        assert wakeup is not None
        sync = self.flush_disk_type is FlushDiskType.SYNC_FLUSH
        while True:
            if sync:
                await wakeup.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), self.flush_interval_commitlog_ms / 1000)
            if sync:
                # One loop turn before the fsync reads the write position: Send handlers already
                # runnable append first and ride in this group instead of the next one.
                await asyncio.sleep(0)
            wakeup.clear()
            if sync and not self._waiters:
                continue
            try:
                flushed = await loop.run_in_executor(self._cl_executor, self._flush_cl_once)
            except OSError as exc:
                log.error("commitlog flush failed: %s", exc)
                await asyncio.sleep(FLUSH_ERROR_PAUSE_S)
                continue
            self._on_flushed(flushed)

    async def _logics_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.flush_interval_consume_queue_ms / 1000)
            try:
                await loop.run_in_executor(self._cq_executor, self._flush_logics)
            except OSError as exc:
                log.error("consume queue / index flush failed: %s", exc)
