"""Orderly consumption: one listener call per queue at a time, in offset order (SPEC §6.15).

RocketMQ's ``ConsumeMessageOrderlyService`` on asyncio. Each queue with messages waiting has
exactly one *drain task*: it is started when :meth:`ProcessQueue.put_messages` answers
``dispatch=True`` (messages arrived and no drain was running), and it takes up to
``consume_message_batch_max_size`` lowest-offset messages, calls the listener, handles the
result and repeats until the queue is empty (``take_messages`` then clears the dispatch flag,
so the next pull starts a new drain). A drain that stops early (suspend, lost lock, time
slice) hands over to exactly one delayed task that resumes it, so there is never more than one
per queue. Each call holds the queue's ``consume_lock`` (with the result handling), which is
how the rebalance waits for a running call before giving the queue to another member.

Before every call the drain checks that the queue was not dropped and, in clustering mode, that
this client still holds the broker lock and renewed it within ``rebalance_lock_max_live_ms``;
otherwise it stops and tries to lock the queue itself after 100 ms (then every 1 s), resuming
once the lock is back (RocketMQ's tryLockLaterAndReconsume). Broadcasting has no broker locks:
every member reads every queue anyway.

Results:

| listener outcome                      | effect                                                 |
|---------------------------------------|--------------------------------------------------------|
| SUCCESS                               | ``pq.commit()``: the offset store gets one past the    |
|                                       | batch (increase_only=False, as RocketMQ); next batch   |
| SUSPEND_CURRENT_QUEUE_A_MOMENT, None, | every message gets reconsume_times + 1 and the batch   |
| an exception, any other value         | goes back to the head of the queue, which pauses for   |
|                                       | suspend_current_queue_time_ms (context's, else the     |
|                                       | config's; 10..30000); redelivery is local, never via a |
|                                       | retry topic, which would break the order               |
| ... once a message had                | it is sent back with delay level -1, so the broker     |
| max_reconsume_times redeliveries      | puts it in %DLQ%{group}, and counts as consumed; if    |
| (orderly: -1 = never)                 | the send-back fails it stays and the queue keeps       |
|                                       | suspending (broadcasting drops it with a warning)      |

A drain yields after 60 s of continuous consuming (it re-submits itself), so one busy queue
cannot hold a listener slot for ever while others wait. ``consume_thread_max`` bounds the
listener calls in progress across queues. The consume timeout (SPEC §6.13) does not apply: a
long call holds its queue by design.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rocketq.client import _tracing
from rocketq.client.consumer._consume import (
    SendBack,
    invoke_listener,
    is_async_listener,
    reset_retry_topic,
)
from rocketq.client.consumer.config import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageModel,
    OrderlyMessageListener,
    clamp_suspend_ms,
)
from rocketq.client.consumer.offset_store import OffsetStore
from rocketq.client.consumer.process_queue import ProcessQueue, wall_clock_ms
from rocketq.message import MessageQueue, ReceivedMessage

log = logging.getLogger(__name__)

MAX_TIME_CONSUME_CONTINUOUSLY_S = 60.0
"""RocketMQ's MAX_TIME_CONSUME_CONTINUOUSLY: a drain's time slice before it re-submits itself."""
RESUBMIT_DELAY_S = 0.01
"""Pause before a drain resumes after its time slice or after its lock came back."""
TRY_LOCK_FIRST_DELAY_S = 0.1
TRY_LOCK_RETRY_DELAY_S = 1.0
"""tryLockLaterAndReconsume: first lock attempt after 100 ms, then every 1 s while refused."""
DLQ_DELAY_LEVEL = -1
"""A send-back with a negative delay level goes straight to %DLQ%{group} (SPEC §6.14)."""

Sleep = Callable[[float], Awaitable[None]]
LockOne = Callable[[MessageQueue], Awaitable[bool]]
"""Locks one owned queue on its broker now; True if this client holds it afterwards."""


class ConsumeOrderlyService:
    """Runs an orderly listener over the queues of one consumer (see the module docstring)."""

    def __init__(
        self,
        *,
        group: str,
        listener: OrderlyMessageListener,
        message_model: MessageModel,
        batch_max_size: int,
        thread_max: int,
        offset_store: OffsetStore,
        send_back: SendBack,
        max_reconsume_times: int,
        suspend_time_ms: int,
        lock_max_live_ms: int,
        lock_one: LockOne | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._group = group
        self._listener = listener
        self._clustering = message_model is MessageModel.CLUSTERING
        self._batch_max = batch_max_size
        self._offsets = offset_store
        self._send_back = send_back
        self._max_reconsume = max_reconsume_times
        self._suspend_ms = suspend_time_ms
        self._lock_max_live_ms = lock_max_live_ms
        self._lock_one = lock_one
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._slots = asyncio.Semaphore(thread_max)
        self._executor: ThreadPoolExecutor | None = None
        if not is_async_listener(listener):
            self._executor = ThreadPoolExecutor(
                max_workers=thread_max, thread_name_prefix=f"consume-orderly-{group}"
            )
        self._tasks: set[asyncio.Task[None]] = set()
        self._calling: set[asyncio.Task[Any]] = set()  # tasks inside a listener call
        self._closed = False
        self.consumed_ok = 0
        self.consumed_failed = 0
        self.dead_lettered = 0

    # ---- scheduling -------------------------------------------------------------------------

    def submit(
        self, msgs: list[ReceivedMessage], pq: ProcessQueue, mq: MessageQueue, dispatch: bool
    ) -> None:
        """Pulled ``msgs`` are in ``pq`` already; start a drain if ``dispatch`` says none runs."""
        if dispatch:
            self._schedule(pq, mq, 0.0)

    def _schedule(self, pq: ProcessQueue, mq: MessageQueue, delay_s: float) -> None:
        self._spawn(self._drain_later(pq, mq, delay_s), f"consume-orderly-{mq}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain_later(self, pq: ProcessQueue, mq: MessageQueue, delay_s: float) -> None:
        if delay_s > 0:
            await self._sleep(delay_s)
        await self._drain(pq, mq)

    def _holds_lock(self, pq: ProcessQueue) -> bool:
        return not self._clustering or pq.holds_lock(self._clock(), self._lock_max_live_ms)

    # ---- the drain --------------------------------------------------------------------------

    async def _drain(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """Consume ``mq`` batch after batch until it is empty or must stop for a while."""
        started_s = self._monotonic()
        while not self._closed and not pq.dropped:
            if not self._holds_lock(pq):
                log.info(
                    "group %s: %s is not (or no longer) locked by this client; consuming it "
                    "once the lock is back",
                    self._group,
                    mq,
                )
                self._try_lock_later(pq, mq, TRY_LOCK_FIRST_DELAY_S)
                return
            if self._monotonic() - started_s > MAX_TIME_CONSUME_CONTINUOUSLY_S:
                self._schedule(pq, mq, RESUBMIT_DELAY_S)  # let other queues' calls in
                return
            if not await self._consume_one_batch(pq, mq):
                return

    async def _consume_one_batch(self, pq: ProcessQueue, mq: MessageQueue) -> bool:
        """One listener call and its result; True to go on with the next batch."""
        async with self._slots:
            await pq.consume_lock.acquire_async(yield_to_waiters=True)
            task = asyncio.current_task()
            assert task is not None
            self._calling.add(task)
            try:
                if pq.dropped or self._closed:
                    return False
                msgs = pq.take_messages(self._batch_max)
                if not msgs:
                    return False  # drained; the next put_messages dispatches again
                reset_retry_topic(msgs, self._group)
                context = ConsumeOrderlyContext(mq)
                status = await self._call_listener(msgs, context, mq)
                if pq.dropped:
                    log.warning(
                        "group %s: %s was dropped while %d message(s) were consumed; the new "
                        "owner consumes them again",
                        self._group,
                        mq,
                        len(msgs),
                    )
                    return False
                return await self.process_consume_result(status, context, msgs, pq, mq)
            finally:
                self._calling.discard(task)
                pq.consume_lock.release()

    async def _call_listener(
        self, msgs: list[ReceivedMessage], context: ConsumeOrderlyContext, mq: MessageQueue
    ) -> ConsumeOrderlyStatus | None:
        try:
            with _tracing.process_span(self._group, mq, msgs):
                outcome = await invoke_listener(self._listener, self._executor, list(msgs), context)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "group %s: orderly listener raised on %d message(s) of %s (offsets %d..%d); "
                "suspending the queue",
                self._group,
                len(msgs),
                mq,
                msgs[0].queue_offset,
                msgs[-1].queue_offset,
            )
            return None
        if outcome is not None and not isinstance(outcome, ConsumeOrderlyStatus):
            log.warning(
                "group %s: orderly listener returned %r, not a ConsumeOrderlyStatus; treated as "
                "SUSPEND_CURRENT_QUEUE_A_MOMENT",
                self._group,
                outcome,
            )
            return None
        return outcome

    # ---- results ----------------------------------------------------------------------------

    async def process_consume_result(
        self,
        status: ConsumeOrderlyStatus | None,
        context: ConsumeOrderlyContext,
        msgs: list[ReceivedMessage],
        pq: ProcessQueue,
        mq: MessageQueue,
    ) -> bool:
        """Commit or suspend (see the module table); True to go on with the next batch."""
        if status is ConsumeOrderlyStatus.SUCCESS:
            self.consumed_ok += len(msgs)
            self._commit(pq, mq)
            return True
        self.consumed_failed += len(msgs)
        again: list[ReceivedMessage] = []
        for msg in msgs:
            if self._reached_max(msg) and await self._give_up(msg, mq):
                continue  # stays in the consuming set; committed with what follows
            msg.reconsume_times += 1
            again.append(msg)
        if not again:
            self._commit(pq, mq)
            return True
        pq.make_messages_to_consume_again(again)
        delay_ms = clamp_suspend_ms(context.suspend_current_queue_time_ms, self._suspend_ms)
        self._schedule(pq, mq, delay_ms / 1000)
        return False

    def _commit(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        offset = pq.commit()
        if offset >= 0 and not pq.dropped:
            self._offsets.update_offset(mq, offset, increase_only=False)

    def _reached_max(self, msg: ReceivedMessage) -> bool:
        return 0 <= self._max_reconsume <= msg.reconsume_times

    async def _give_up(self, msg: ReceivedMessage, mq: MessageQueue) -> bool:
        """A message out of redeliveries: to the dead-letter topic; True if it is gone."""
        if not self._clustering:
            log.warning(
                "group %s: BROADCASTING orderly consumption of %s (offset %d of %s) failed %d "
                "times; dropped, broadcasting has no dead-letter topic",
                self._group,
                msg.msg_id,
                msg.queue_offset,
                mq,
                msg.reconsume_times + 1,
            )
            return True
        if not await self._send_back(mq, msg, DLQ_DELAY_LEVEL):
            return False
        self.dead_lettered += 1
        log.warning(
            "group %s: message %s (offset %d of %s) failed %d times; sent to the dead-letter "
            "topic, the queue moves on",
            self._group,
            msg.msg_id,
            msg.queue_offset,
            mq,
            msg.reconsume_times + 1,
        )
        return True

    # ---- lost locks -------------------------------------------------------------------------

    def _try_lock_later(self, pq: ProcessQueue, mq: MessageQueue, delay_s: float) -> None:
        """Lock ``mq`` after ``delay_s``; resume the drain once this client holds it."""

        async def later() -> None:
            await self._sleep(delay_s)
            if pq.dropped or self._closed:
                return
            if not self._holds_lock(pq):
                locked = False
                if self._lock_one is not None:
                    with contextlib.suppress(Exception):  # lock_one logs its own failures
                        locked = await self._lock_one(mq)
                if not locked or not self._holds_lock(pq):
                    self._try_lock_later(pq, mq, TRY_LOCK_RETRY_DELAY_S)
                    return
            await self._drain_later(pq, mq, RESUBMIT_DELAY_S)

        self._spawn(later(), f"consume-orderly-lock-{mq}")

    # ---- shutdown ---------------------------------------------------------------------------

    async def shutdown(self, await_termination_ms: int) -> None:
        """Stop starting calls; wait up to ``await_termination_ms`` for the running ones."""
        self._closed = True
        for task in list(self._tasks):
            if task not in self._calling:
                task.cancel()
        running = list(self._tasks)
        if running:
            _done, pending = await asyncio.wait(running, timeout=await_termination_ms / 1000)
            for task in pending:
                task.cancel()
            if pending:
                with contextlib.suppress(Exception):
                    await asyncio.wait(pending, timeout=1.0)
        if self._executor is not None:
            # Threads still in a listener cannot be interrupted; do not wait for them.
            self._executor.shutdown(wait=False, cancel_futures=True)
