"""The consumer's ConsumeService with fakes in place of brokers (no sockets, no sleeps): how
listener results move offsets and send messages back (SPEC §6.11), workers and batches, and
issue 16's path (batches addressed by index in the pulled run, calls that never suspend
released together, contexts handed on). Split from test_consumer_units."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from rocketq.client.consumer._consume import ConsumeService, ack_index_for
from rocketq.client.consumer.config import ConsumeContext, ConsumeResult, MessageModel
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.message import MessageQueue, ReceivedMessage
from tests.support.until import until
from tests.unit.consumer_doubles import MQ, MemoryOffsets, msg

pytestmark = pytest.mark.unit


# ---- result processing (SPEC §6.11) ------------------------------------------------------------


def test_ack_index() -> None:
    ctx = ConsumeContext(MQ)
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ctx, 4) == 3
    assert ack_index_for(ConsumeResult.RECONSUME_LATER, ctx, 4) == -1
    assert ack_index_for(None, ctx, 4) == -1
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ, ack_index=1), 4) == 1
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ, ack_index=9), 4) == 3


def service(
    model: MessageModel,
    offsets: MemoryOffsets,
    send_back_ok: bool = False,
    listener: Any = None,
    batch: int = 1,
) -> tuple[ConsumeService, list[int]]:
    sent: list[int] = []

    async def send_back(mq: MessageQueue, m: ReceivedMessage, delay_level: int) -> bool:
        sent.append(m.queue_offset)
        return send_back_ok

    svc = ConsumeService(
        group="g",
        listener=listener or (lambda msgs, ctx: ConsumeResult.CONSUME_SUCCESS),
        message_model=model,
        batch_max_size=batch,
        thread_max=4,
        offset_store=offsets,
        send_back=send_back,
        consume_timeout_ms=1000,
        local_retry_delay_s=0.0,
    )
    return svc, sent


def submit_pull(
    svc: ConsumeService, count: int, *, one_worker: bool = False
) -> tuple[ProcessQueue, list[ReceivedMessage]]:
    """Submit one pull of ``count`` messages (offsets 0 ..) to ``svc`` (``one_worker``: with a
    single worker); their ProcessQueue and the messages."""
    if one_worker:
        svc._workers_max = 1
    pq = ProcessQueue()
    pulled = [msg(i) for i in range(count)]
    pq.put_messages(pulled)
    svc.submit(pulled, pq, MQ, True)
    return pq, pulled


async def idle(svc: ConsumeService) -> None:
    """Wait for every submitted batch, then shut the service down."""
    while svc._tasks:
        await asyncio.wait(list(svc._tasks), timeout=10)
    await svc.shutdown(0)


async def test_offset_stays_at_smallest_in_flight() -> None:
    """SPEC §15: a, b, c, d consumed with d first keeps the offset at a."""

    offsets = MemoryOffsets()
    svc, _ = service(MessageModel.CLUSTERING, offsets)
    pq = ProcessQueue()
    a, b, c, d = (msg(i) for i in range(10, 14))
    pq.put_messages([a, b, c, d])
    ok = ConsumeResult.CONSUME_SUCCESS
    await svc.process_consume_result(ok, ConsumeContext(MQ), [d], pq, MQ)
    assert offsets.table[MQ] == 10
    await svc.process_consume_result(ok, ConsumeContext(MQ), [b, c], pq, MQ)
    assert offsets.table[MQ] == 10
    await svc.process_consume_result(ok, ConsumeContext(MQ), [a], pq, MQ)
    assert offsets.table[MQ] == 14
    await svc.shutdown(0)


async def test_broadcasting_drops_failures_without_send_back() -> None:
    offsets = MemoryOffsets()
    svc, sent = service(MessageModel.BROADCASTING, offsets)
    pq = ProcessQueue()
    batch = [msg(0), msg(1)]
    pq.put_messages(batch)
    await svc.process_consume_result(
        ConsumeResult.RECONSUME_LATER, ConsumeContext(MQ), batch, pq, MQ
    )
    assert sent == []
    assert pq.msg_count == 0 and offsets.table[MQ] == 2
    assert svc.consumed_failed == 2
    await svc.shutdown(0)


async def test_clustering_sent_back_failures_release_the_offset() -> None:
    offsets = MemoryOffsets()
    svc, sent = service(MessageModel.CLUSTERING, offsets, send_back_ok=True)
    pq = ProcessQueue()
    batch = [msg(0), msg(1), msg(2)]
    pq.put_messages(batch)
    ctx = ConsumeContext(MQ, ack_index=0)
    await svc.process_consume_result(ConsumeResult.CONSUME_SUCCESS, ctx, batch, pq, MQ)
    assert sent == [1, 2]
    assert offsets.table[MQ] == 3 and pq.msg_count == 0
    await svc.shutdown(0)


async def test_failed_send_back_retries_locally_and_holds_the_offset() -> None:
    offsets = MemoryOffsets()
    calls: list[tuple[int, int]] = []
    done = asyncio.Event()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append((msgs[0].queue_offset, msgs[0].reconsume_times))
        if len(calls) == 2:
            loop.call_soon_threadsafe(done.set)
        return ConsumeResult.RECONSUME_LATER if len(calls) == 1 else ConsumeResult.CONSUME_SUCCESS

    loop = asyncio.get_running_loop()
    svc, sent = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq = ProcessQueue()
    m0, m1 = msg(0), msg(1)
    pq.put_messages([m0, m1])
    await svc.process_consume_result(
        ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ), [m1], pq, MQ
    )
    assert offsets.table[MQ] == 0
    svc.submit([m0], pq, MQ, True)
    await asyncio.wait_for(done.wait(), 10)
    await svc.shutdown(5000)
    assert sent == [0]
    assert calls == [(0, 0), (0, 1)]  # redelivered locally with reconsume_times + 1
    assert offsets.table[MQ] == 2


async def test_results_of_a_dropped_queue_are_ignored() -> None:
    offsets = MemoryOffsets()
    finished = asyncio.Event()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        pq.dropped = True  # rebalanced away while consuming
        finished.set()
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq = ProcessQueue()
    pq.put_messages([msg(0)])
    svc.submit([msg(0)], pq, MQ, True)
    await asyncio.wait_for(finished.wait(), 10)
    await svc.shutdown(5000)
    assert MQ not in offsets.table


async def test_batches_split_by_consume_message_batch_max_size() -> None:
    offsets = MemoryOffsets()
    sizes: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        sizes.append(len(msgs))
        assert ctx.message_queue == MQ
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener, batch=3)
    pq = ProcessQueue()
    batch = [msg(i) for i in range(7)]
    pq.put_messages(batch)
    svc.submit(batch, pq, MQ, True)
    await idle(svc)
    assert sorted(sizes) == [1, 3, 3]
    assert offsets.table[MQ] == 7


async def test_workers_bound_the_calls_in_progress_and_drain_every_batch() -> None:
    """Listener batches wait in one FIFO; at most thread_max (4) workers call the listener."""
    offsets = MemoryOffsets()
    running, most = [0], [0]
    gate = asyncio.Event()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await gate.wait()
        running[0] -= 1
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq = ProcessQueue()
    pulled = [msg(i) for i in range(10)]
    pq.put_messages(pulled)
    svc.submit(pulled, pq, MQ, True)  # ten listener batches of one
    await until(lambda: running[0] == 4, "four listener calls running")
    assert MQ not in offsets.table  # nothing consumed yet: nothing committed
    gate.set()
    await until(lambda: offsets.table.get(MQ) == 10, "offset 10 committed")
    assert most[0] == 4 and svc.consumed_ok == 10 and pq.msg_count == 0
    # Workers that ran dry ended; a later pull starts them again.
    later = [msg(i) for i in range(10, 12)]
    pq.put_messages(later)
    svc.submit(later, pq, MQ, True)
    await until(lambda: offsets.table.get(MQ) == 12, "offset 12 committed")
    await svc.shutdown(0)


async def test_plain_listener_batches_share_thread_trips_and_keep_their_own_results() -> None:
    """A backlog of 40 batches goes to the pool a few at a time; each is still one call."""
    offsets = MemoryOffsets()
    calls: list[int] = []
    threads: set[str] = set()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append(msgs[0].queue_offset)
        threads.add(threading.current_thread().name)
        if msgs[0].queue_offset == 7:
            raise RuntimeError("offset 7 fails")
        return (
            ConsumeResult.RECONSUME_LATER
            if msgs[0].queue_offset == 9
            else ConsumeResult.CONSUME_SUCCESS
        )

    svc, sent = service(MessageModel.CLUSTERING, offsets, send_back_ok=True, listener=listener)
    submit_pull(svc, 40)
    await until(lambda: offsets.table.get(MQ) == 40, "offset 40 committed")
    assert sorted(calls) == list(range(40)) and sent == [7, 9]
    assert (svc.consumed_ok, svc.consumed_failed) == (38, 2)
    assert all(name.startswith("consume-g") for name in threads)
    await svc.shutdown(0)


async def test_a_queue_dropped_mid_trip_skips_only_its_own_batches() -> None:
    offsets = MemoryOffsets()
    mq_a, mq_b = MessageQueue("T", "b", 1), MessageQueue("T", "b", 2)
    pq_a, pq_b = ProcessQueue(), ProcessQueue()
    called: list[tuple[int, int]] = []

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        called.append((ctx.message_queue.queue_id, msgs[0].queue_offset))
        if ctx.message_queue == mq_a:
            pq_a.dropped = True  # rebalanced away during its first call
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    for i in range(8):  # interleaved, so each thread trip carries batches of both queues
        for mq, pq in ((mq_a, pq_a), (mq_b, pq_b)):
            one = [msg(i)]
            pq.put_messages(one)
            svc.submit(one, pq, mq, True)
    await until(lambda: offsets.table.get(mq_b) == 8, "queue b consumed to offset 8")
    assert sorted(o for q, o in called if q == 2) == list(range(8))
    assert len([o for q, o in called if q == 1]) < 8  # batches of a after the drop never ran
    assert mq_a not in offsets.table
    await svc.shutdown(0)


async def test_batches_still_waiting_at_shutdown_are_not_consumed() -> None:
    offsets = MemoryOffsets()
    gate = asyncio.Event()
    seen: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.append(msgs[0].queue_offset)
        await gate.wait()
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    submit_pull(svc, 8)
    await until(lambda: len(seen) == 4, "four listener calls started")
    closing = asyncio.create_task(svc.shutdown(5000))
    gate.set()
    await closing
    assert seen == [0, 1, 2, 3]  # the four in progress finished; the rest never started
    assert offsets.table[MQ] == 4  # the committed offset stays below what was not consumed


async def test_listener_exception_and_bad_return_mean_reconsume_later() -> None:
    offsets = MemoryOffsets()

    def boom(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        raise RuntimeError("business failure")

    svc, sent = service(MessageModel.CLUSTERING, offsets, send_back_ok=True, listener=boom)
    pq = ProcessQueue()
    pq.put_messages([msg(0)])
    svc.submit([msg(0)], pq, MQ, True)
    await idle(svc)
    assert sent == [0] and offsets.table[MQ] == 1

    svc2, sent2 = service(
        MessageModel.CLUSTERING, offsets, send_back_ok=True, listener=lambda m, c: "ok"
    )
    pq2 = ProcessQueue()
    pq2.put_messages([msg(5)])
    svc2.submit([msg(5)], pq2, MQ, True)
    await idle(svc2)
    assert sent2 == [5]


# ---- issue 16: batches addressed by index in the pulled run; offsets stored per pull ----------


async def test_a_stuck_call_does_not_hold_back_the_stored_offset_of_the_calls_before_it() -> None:
    """One worker (consume_thread_max 1) runs a pull of five; the call on offset 3 hangs. The
    offset store already holds 3 (the calls on 0..2 are done), not the offset before the pull:
    the kept offset is handed over as soon as the loop gets a turn, not only at the pull's end."""
    offsets = MemoryOffsets()
    gate = asyncio.Event()
    calls: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append(msgs[0].queue_offset)
        if msgs[0].queue_offset == 3:
            await gate.wait()
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq, _ = submit_pull(svc, 5, one_worker=True)
    await until(lambda: offsets.table.get(MQ) == 3, "offset 3 stored while 3 is in a call")
    assert calls == [0, 1, 2, 3] and pq.msg_count == 2
    gate.set()
    await until(lambda: offsets.table.get(MQ) == 5, "offset 5 stored")
    await svc.shutdown(0)


async def test_a_pull_that_overlaps_the_cache_is_consumed_message_by_message() -> None:
    """A pull repeating an offset still cached takes the ProcessQueue's per-message path (no
    run of its own): each message is consumed once, the offset ends past the last."""
    offsets = MemoryOffsets()
    seen: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.extend(m.queue_offset for m in msgs)
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener, batch=2)
    pq = ProcessQueue()
    first = [msg(i) for i in range(3)]
    pq.put_messages(first)
    again = [msg(i) for i in range(2, 6)]  # offset 2 again, then 3..5
    pq.put_messages(again)
    assert pq.run_of(first) is not None and pq.run_of(again) is None  # 3..5 cached apart
    svc.submit(first, pq, MQ, True)
    svc.submit(again[1:], pq, MQ, True)
    await until(lambda: offsets.table.get(MQ) == 6, "offset 6 committed")
    assert sorted(seen) == list(range(6)) and pq.msg_count == 0
    await svc.shutdown(0)


async def test_offsets_kept_for_the_store_are_handed_over_at_shutdown() -> None:
    offsets = MemoryOffsets()
    svc, _ = service(MessageModel.CLUSTERING, offsets)
    pq = ProcessQueue()
    pulled = [msg(i) for i in range(4)]
    pq.put_messages(pulled)
    svc._unstored[pq] = (MQ, 2)  # as _done leaves it between two loop turns
    await svc.shutdown(0)
    assert offsets.table[MQ] == 2


async def test_a_call_is_in_flight_only_while_it_is_suspended() -> None:
    """A coroutine listener's calls that finish without suspending are released before
    anything else runs; the call that suspends is the only one the queue holds as started (the
    consume timeout sees it), and what it awaits reaches it: here a RECONSUME_LATER, so its
    message is sent back and the offset still moves past it."""
    offsets = MemoryOffsets()
    answer: asyncio.Future[ConsumeResult] = asyncio.get_running_loop().create_future()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if msgs[0].queue_offset == 2:
            return await answer
        return ConsumeResult.CONSUME_SUCCESS

    svc, sent = service(MessageModel.CLUSTERING, offsets, True, listener=listener)
    pq, pulled = submit_pull(svc, 5, one_worker=True)
    await until(lambda: offsets.table.get(MQ) == 2, "offset 2 stored while 2 is in a call")
    # 0 and 1 are gone; 2 is started; 3 and 4 wait, not started.
    assert pq.msg_count == 3
    assert pq.expired_messages(time.time_ns() // 1_000_000 + 10, 0) == [pulled[2]]
    answer.set_result(ConsumeResult.RECONSUME_LATER)
    await until(lambda: offsets.table.get(MQ) == 5, "offset 5 stored")
    assert sent == [2] and svc.consumed_ok == 4 and svc.consumed_failed == 1
    await svc.shutdown(0)


async def test_calls_that_fail_between_successes_are_retried_and_the_rest_released() -> None:
    """Results that need more than a release (an exception, RECONSUME_LATER, an ack_index
    short of the batch) come between successes of the same pull without suspending: each
    failed message is sent back once, every other one consumed once, the offset ends past
    the pull."""
    offsets = MemoryOffsets()
    seen: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        first = msgs[0].queue_offset
        seen.extend(m.queue_offset for m in msgs)
        if first == 2:
            raise RuntimeError("listener bug")
        if first == 4:
            return ConsumeResult.RECONSUME_LATER
        if first == 6:
            ctx.ack_index = 0  # 6 done, 7 not
        return ConsumeResult.CONSUME_SUCCESS

    svc, sent = service(MessageModel.CLUSTERING, offsets, True, listener=listener, batch=2)
    pq, _ = submit_pull(svc, 10)
    await until(lambda: offsets.table.get(MQ) == 10, "offset 10 stored")
    assert seen == list(range(10)) and sorted(sent) == [2, 3, 4, 5, 7]
    assert pq.msg_count == 0 and svc.consumed_ok == 5
    await svc.shutdown(0)


async def test_shutdown_cancels_a_suspended_call_inside_the_listener() -> None:
    """A call suspended in the listener is cancelled at shutdown like any awaited coroutine:
    the listener sees the CancelledError where it waits, and its message is not consumed (the
    offset stays on it)."""
    offsets = MemoryOffsets()
    cancelled: list[int] = []
    entered = asyncio.Event()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if msgs[0].queue_offset == 1:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(msgs[0].queue_offset)
                raise
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq, _ = submit_pull(svc, 3, one_worker=True)
    await asyncio.wait_for(entered.wait(), 5)
    await svc.shutdown(0)
    assert cancelled == [1] and offsets.table.get(MQ) == 1 and pq.msg_count == 2


async def test_each_call_gets_a_context_as_new_and_a_kept_one_is_never_handed_on() -> None:
    """A context the listener changed, or still holds after its call, never reaches another
    call: each call sees a context as new, and the kept ones stay as the listener left them."""
    offsets = MemoryOffsets()
    seen: list[tuple[int, int | None]] = []
    kept: list[ConsumeContext] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.append((ctx.delay_level_when_next_consume, ctx.ack_index))
        if msgs[0].queue_offset % 2:
            kept.append(ctx)
        else:
            ctx.delay_level_when_next_consume = 5
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    submit_pull(svc, 6)
    await until(lambda: offsets.table.get(MQ) == 6, "offset 6 stored")
    assert seen == [(0, None)] * 6 and len({id(c) for c in kept}) == 3
    assert all(c.delay_level_when_next_consume == 0 and c.message_queue == MQ for c in kept)
    await svc.shutdown(0)


async def test_a_timeout_inside_a_suspended_call_stays_the_listener_s_own() -> None:
    """A listener's own timeout (a cancel the task takes back) works through a call resumed by
    hand: the listener catches its TimeoutError and the call succeeds; nothing is retried."""
    offsets = MemoryOffsets()
    timed_out: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        await asyncio.sleep(0)  # a bare yield first, then a wait that times out
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            timed_out.append(msgs[0].queue_offset)
        return ConsumeResult.CONSUME_SUCCESS

    svc, sent = service(MessageModel.CLUSTERING, offsets, listener=listener)
    submit_pull(svc, 3)
    await until(lambda: offsets.table.get(MQ) == 3, "offset 3 stored")
    assert sorted(timed_out) == [0, 1, 2] and sent == [] and svc.consumed_ok == 3
    await svc.shutdown(0)
