"""ConsumeOrderlyService (SPEC §6.15) on a real event loop with fakes for the broker side.

Time is in the test's hands: the service's delays go through :class:`ManualSleeper` (each
``sleep`` waits until the test fires it, so a suspend or a lock retry is observed, never
waited out), the lock clock and the time-slice clock are plain counters. No sockets, no sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from rocketq.client.consumer._consume_orderly import (
    DLQ_DELAY_LEVEL,
    RESUBMIT_DELAY_S,
    TRY_LOCK_FIRST_DELAY_S,
    TRY_LOCK_RETRY_DELAY_S,
    ConsumeOrderlyService,
)
from rocketq.client.consumer.config import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeResult,
    MessageModel,
)
from rocketq.client.consumer.offset_store import ReadOffsetType
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.message import MessageQueue, ReceivedMessage
from tests.support.until import until
from tests.unit.consumer_doubles import msg

# A test that hangs on a never-fired sleeper fails in 10 s, not at the suite-wide timeout.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

MQ = MessageQueue("T", "broker-a", 0)
MQ2 = MessageQueue("T", "broker-a", 1)
SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
LOCK_MAX_LIVE_MS = 30_000


class Offsets:
    """In-memory OffsetStore recording every update."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}
        self.updates: list[tuple[MessageQueue, int, bool]] = []

    async def load(self) -> None:
        pass

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        self.updates.append((mq, offset, increase_only))
        self.table[mq] = offset

    async def read_offset(self, mq: MessageQueue, type_: ReadOffsetType) -> int:
        return self.table.get(mq, -1)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        pass

    async def persist(self, mq: MessageQueue) -> None:
        pass

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return dict(self.table)


class ManualSleeper:
    """The service's ``sleep``: every call waits until the test fires it."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, asyncio.Future[None]]] = []
        self.history: list[float] = []

    async def sleep(self, delay_s: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append((delay_s, fut))
        self.history.append(delay_s)
        await fut

    def delays(self) -> list[float]:
        return [d for d, f in self.pending if not f.done()]

    def fire(self) -> None:
        """Let every pending sleep end."""
        pending, self.pending = self.pending, []
        for _d, fut in pending:
            if not fut.done():
                fut.set_result(None)


class Harness:
    """A service over fakes: ``clock_ms`` drives lock expiry, ``mono_s`` the time slice."""

    def __init__(
        self,
        listener: Callable[..., Any],
        *,
        model: MessageModel = MessageModel.CLUSTERING,
        batch: int = 1,
        max_reconsume: int = -1,
        send_back_ok: bool = True,
        lock_one_ok: bool = True,
    ) -> None:
        self.offsets = Offsets()
        self.sleeper = ManualSleeper()
        self.clock_ms = 1_000_000
        self.mono_s = 0.0
        self.sent_back: list[tuple[int, int]] = []
        self.send_back_ok = send_back_ok
        self.lock_one_ok = lock_one_ok
        self.lock_one_calls: list[MessageQueue] = []
        self.pqs: dict[MessageQueue, ProcessQueue] = {}
        self.svc = ConsumeOrderlyService(
            group="g",
            listener=listener,
            message_model=model,
            batch_max_size=batch,
            thread_max=4,
            offset_store=self.offsets,
            send_back=self._send_back,
            max_reconsume_times=max_reconsume,
            suspend_time_ms=1000,
            lock_max_live_ms=LOCK_MAX_LIVE_MS,
            lock_one=self._lock_one,
            clock=lambda: self.clock_ms,
            monotonic=lambda: self.mono_s,
            sleep=self.sleeper.sleep,
        )

    async def _send_back(self, mq: MessageQueue, m: ReceivedMessage, delay_level: int) -> bool:
        self.sent_back.append((m.queue_offset, delay_level))
        return self.send_back_ok

    async def _lock_one(self, mq: MessageQueue) -> bool:
        self.lock_one_calls.append(mq)
        if self.lock_one_ok:
            self.lock(self.pqs[mq])
        return self.lock_one_ok

    def lock(self, pq: ProcessQueue) -> None:
        pq.locked = True
        pq.last_lock_timestamp_ms = self.clock_ms

    def queue(self, mq: MessageQueue = MQ, locked: bool = True) -> ProcessQueue:
        pq = ProcessQueue(lambda: self.clock_ms)
        if locked:
            self.lock(pq)
        self.pqs[mq] = pq
        return pq

    def put(self, pq: ProcessQueue, offsets: Iterable[int], mq: MessageQueue = MQ) -> bool:
        msgs = [msg(o, queue_id=mq.queue_id) for o in offsets]
        dispatch = pq.put_messages(msgs)
        self.svc.submit(msgs, pq, mq, dispatch)
        return dispatch


async def settle() -> None:
    """Run every task that can run now (tasks blocked on the sleeper stay blocked)."""
    for _ in range(50):
        await asyncio.sleep(0)


class Recorder:
    """An async listener returning scripted statuses and recording each call."""

    def __init__(self, script: list[Any] | None = None) -> None:
        self.calls: list[list[int]] = []
        self.reconsumes: list[list[int]] = []
        self.script = list(script or [])

    async def __call__(self, msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> Any:
        self.calls.append([m.queue_offset for m in msgs])
        self.reconsumes.append([m.reconsume_times for m in msgs])
        outcome = self.script.pop(0) if self.script else SUCCESS
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return outcome(ctx)
        return outcome


async def test_batches_come_in_offset_order_and_commit_one_past_each() -> None:
    rec = Recorder()
    h = Harness(rec, batch=3)

    pq = h.queue()
    assert h.put(pq, [3, 1, 0, 2, 4, 5, 6, 7, 8, 9])
    await settle()
    assert rec.calls == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert h.offsets.updates == [
        (MQ, 3, False),
        (MQ, 6, False),
        (MQ, 9, False),
        (MQ, 10, False),
    ]
    assert pq.msg_count == 0
    assert h.put(pq, [10])  # the queue was drained: the next pull dispatches again
    await settle()
    assert rec.calls[-1] == [10] and h.offsets.table[MQ] == 11
    await h.svc.shutdown(0)


async def test_messages_arriving_during_a_drain_join_it() -> None:
    gate = asyncio.Event()
    calls: list[list[int]] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> Any:
        calls.append([m.queue_offset for m in msgs])
        await gate.wait()
        return SUCCESS

    h = Harness(listener, batch=2)

    pq = h.queue()
    assert h.put(pq, [0, 1])
    await settle()
    assert not h.put(pq, [2, 3])  # a drain runs: no second one
    gate.set()
    await settle()
    assert calls == [[0, 1], [2, 3]] and h.offsets.table[MQ] == 4
    await h.svc.shutdown(0)


async def test_suspend_redelivers_the_same_batch_after_the_suspend_time() -> None:
    rec = Recorder([SUSPEND, SUCCESS])
    h = Harness(rec, batch=2)

    pq = h.queue()
    h.put(pq, [0, 1, 2])
    await settle()
    assert rec.calls == [[0, 1]]
    assert h.sleeper.delays() == [1.0]  # suspend_current_queue_time_ms of the config
    assert h.offsets.updates == [] and pq.msg_count == 3
    h.sleeper.fire()
    await settle()
    assert rec.calls == [[0, 1], [0, 1], [2]]
    assert rec.reconsumes == [[0, 0], [1, 1], [0]]
    assert h.offsets.table[MQ] == 3 and h.sent_back == []
    await h.svc.shutdown(0)


@pytest.mark.parametrize(
    ("asked_ms", "delay_s"), [(-1, 1.0), (5, 0.01), (250, 0.25), (99_999, 30.0)]
)
async def test_context_suspend_time_is_used_and_clamped(asked_ms: int, delay_s: float) -> None:
    def suspend(ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        ctx.suspend_current_queue_time_ms = asked_ms
        return SUSPEND

    h = Harness(Recorder([suspend]))

    h.put(h.queue(), [0])
    await settle()
    assert h.sleeper.delays() == [delay_s]
    await h.svc.shutdown(0)


@pytest.mark.parametrize("outcome", [None, RuntimeError("boom"), ConsumeResult.CONSUME_SUCCESS])
async def test_none_exception_or_wrong_type_suspend(outcome: Any) -> None:
    rec = Recorder([outcome])
    h = Harness(rec)

    h.put(h.queue(), [0])
    await settle()
    assert h.sleeper.delays() == [1.0] and h.offsets.updates == []
    h.sleeper.fire()
    await settle()
    assert rec.calls == [[0], [0]] and h.offsets.table[MQ] == 1
    await h.svc.shutdown(0)


async def test_out_of_redeliveries_goes_to_the_dead_letter_topic_and_the_queue_moves_on() -> None:
    rec = Recorder([SUSPEND, SUSPEND, SUSPEND])
    h = Harness(rec, max_reconsume=2)

    pq = h.queue()
    h.put(pq, [0, 1])
    for _ in range(2):
        await settle()
        h.sleeper.fire()
    await settle()
    # first delivery + 2 redeliveries, then the broker gets it with delay level -1
    assert rec.calls == [[0], [0], [0], [1]]
    assert rec.reconsumes[:3] == [[0], [1], [2]]
    assert h.sent_back == [(0, DLQ_DELAY_LEVEL)] and h.svc.dead_lettered == 1
    assert h.offsets.table[MQ] == 2 and pq.msg_count == 0
    await h.svc.shutdown(0)


async def test_a_failed_send_back_keeps_the_queue_suspended() -> None:
    rec = Recorder([SUSPEND] * 5)
    h = Harness(rec, max_reconsume=1, send_back_ok=False)

    pq = h.queue()
    h.put(pq, [0, 1])
    for _ in range(3):
        await settle()
        h.sleeper.fire()
    await settle()
    assert rec.calls == [[0], [0], [0], [0]]
    # out of redeliveries after the 2nd call; the send-back is tried at each failure since
    assert [o for o, _lvl in h.sent_back] == [0, 0, 0]
    assert h.offsets.updates == [] and pq.msg_count == 2
    h.send_back_ok = True
    h.sleeper.fire()
    await settle()
    assert len(h.sent_back) == 4 and rec.calls[-1] == [1] and h.offsets.table[MQ] == 2
    await h.svc.shutdown(0)


async def test_unlimited_redeliveries_by_default() -> None:
    rec = Recorder([SUSPEND] * 20)
    h = Harness(rec)

    h.put(h.queue(), [0])
    for _ in range(20):
        await settle()
        h.sleeper.fire()
    await settle()
    assert len(rec.calls) == 21 and h.sent_back == []
    assert h.offsets.table[MQ] == 1
    await h.svc.shutdown(0)


async def test_an_expired_lock_stops_consumption_until_the_lock_is_back() -> None:
    rec = Recorder()
    h = Harness(rec, lock_one_ok=False)

    pq = h.queue()
    h.clock_ms += LOCK_MAX_LIVE_MS + 1  # not renewed for too long
    h.put(pq, [0])
    await settle()
    assert rec.calls == [] and h.sleeper.delays() == [TRY_LOCK_FIRST_DELAY_S]
    h.sleeper.fire()
    await settle()
    assert h.lock_one_calls == [MQ] and rec.calls == []
    assert h.sleeper.delays() == [TRY_LOCK_RETRY_DELAY_S]  # refused: again in 1 s
    h.lock_one_ok = True
    h.sleeper.fire()
    await settle()
    assert h.sleeper.delays() == [RESUBMIT_DELAY_S]
    h.sleeper.fire()
    await settle()
    assert rec.calls == [[0]] and h.offsets.table[MQ] == 1
    await h.svc.shutdown(0)


async def test_a_queue_never_locked_is_not_consumed_but_broadcasting_needs_no_lock() -> None:
    rec = Recorder()
    h = Harness(rec, lock_one_ok=False)
    rec_b = Recorder()
    hb = Harness(rec_b, model=MessageModel.BROADCASTING)

    h.put(h.queue(locked=False), [0])
    hb.put(hb.queue(locked=False), [0])
    await settle()
    assert rec.calls == [] and rec_b.calls == [[0]]
    await h.svc.shutdown(0)
    await hb.svc.shutdown(0)


async def test_lock_lost_between_batches_stops_the_drain() -> None:
    h_ref: list[Harness] = []

    def lose(ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        h_ref[0].pqs[MQ].locked = False  # a renewal found another holder meanwhile
        return SUCCESS

    rec = Recorder([lose])
    h = Harness(rec, lock_one_ok=False)
    h_ref.append(h)

    h.put(h.queue(), [0, 1])
    await settle()
    assert rec.calls == [[0]] and h.offsets.table[MQ] == 1
    assert h.sleeper.delays() == [TRY_LOCK_FIRST_DELAY_S]
    await h.svc.shutdown(0)


async def test_one_call_per_queue_at_a_time_but_queues_in_parallel() -> None:
    gate = asyncio.Event()
    running: dict[int, int] = {0: 0, 1: 0}
    most: dict[int, int] = {0: 0, 1: 0}
    both_running = False

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> Any:
        nonlocal both_running
        qid = ctx.message_queue.queue_id
        running[qid] += 1
        most[qid] = max(most[qid], running[qid])
        both_running = both_running or all(running.values())
        await gate.wait()
        running[qid] -= 1
        return SUCCESS

    h = Harness(listener)

    pq0, pq1 = h.queue(MQ), h.queue(MQ2)
    h.put(pq0, [0, 1, 2])
    h.put(pq1, [0, 1], MQ2)
    # even a wrongly repeated dispatch cannot start a second call on a queue
    h.svc.submit([], pq0, MQ, True)
    await settle()
    assert both_running and pq0.consume_lock.locked()
    gate.set()
    # lock waiters poll; thread-pool listeners finish on other threads
    await until(lambda: h.offsets.table == {MQ: 3, MQ2: 2}, "both queues committed", 2.0, 0.001)
    assert most == {0: 1, 1: 1}
    await h.svc.shutdown(0)


async def test_a_plain_listener_runs_on_the_thread_pool() -> None:
    threads: list[str] = []

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> Any:
        threads.append(threading.current_thread().name)
        return SUCCESS

    h = Harness(listener, batch=2)

    h.put(h.queue(), [0, 1, 2])
    await until(lambda: h.offsets.table.get(MQ) == 3, "MQ committed to 3", 2.0, 0.001)
    assert len(threads) == 2 and all(t.startswith("consume-orderly-g") for t in threads)
    await h.svc.shutdown(0)


async def test_a_busy_queue_yields_after_its_time_slice() -> None:
    h_ref: list[Harness] = []

    def slow(ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        h_ref[0].mono_s += 61  # this call took a minute
        return SUCCESS

    rec = Recorder([slow])
    h = Harness(rec)
    h_ref.append(h)

    h.put(h.queue(), [0, 1])
    await settle()
    assert rec.calls == [[0]] and h.sleeper.delays() == [RESUBMIT_DELAY_S]
    h.sleeper.fire()
    await settle()
    assert rec.calls == [[0], [1]] and h.offsets.table[MQ] == 2
    await h.svc.shutdown(0)


async def test_results_of_a_dropped_queue_are_ignored() -> None:
    h_ref: list[Harness] = []

    def drop(ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        h_ref[0].pqs[MQ].dropped = True  # rebalanced away during the call
        return SUCCESS

    rec = Recorder([drop])
    h = Harness(rec)
    h_ref.append(h)

    h.put(h.queue(), [0, 1])
    await settle()
    assert rec.calls == [[0]] and h.offsets.updates == []
    await h.svc.shutdown(0)


async def test_shutdown_waits_for_the_running_call_and_cancels_delays() -> None:
    gate = asyncio.Event()
    done: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> Any:
        if ctx.message_queue == MQ2:
            return SUSPEND
        await gate.wait()
        done.append(msgs[0].queue_offset)
        return SUCCESS

    h = Harness(listener)

    h.put(h.queue(), [0, 1])
    h.put(h.queue(MQ2), [0], MQ2)
    await settle()
    assert h.sleeper.delays() == [1.0]  # MQ2 suspended
    closing = asyncio.create_task(h.svc.shutdown(5000))
    await settle()
    assert not closing.done()
    gate.set()
    await closing
    assert done == [0] and h.offsets.table == {MQ: 1}  # no new call once closing
    assert not h.svc._tasks
