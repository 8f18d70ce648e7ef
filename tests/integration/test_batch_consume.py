"""Batch consumption end to end (SPEC §6.18): consume_message_batch_max_size > 1 hands several
messages to one listener call, never more than the limit, never mixing queues or skipping an
offset; one failure retries the whole batch; the limit may not exceed pull_batch_size; an
orderly consumer with batches keeps the queue order.

A real nameserver and broker serve the module; every listener call is recorded (queue id and
offsets of its messages, reconsume counts), and the checks run over that full history.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue, ReceivedMessage
from tests.integration.cluster import read_only_broker
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.until import until

pytestmark = pytest.mark.integration

BROKER = "broker-a"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("batch")) as c:
        yield c


# ---- helpers ------------------------------------------------------------------------------


async def make_topic(c: Cluster, topic: str, queues: int) -> None:
    async with Admin(c.namesrv_addrs) as admin:
        results = await admin.create_topic(TopicConfig(topic, queues, queues))
        assert all(r.ok for r in results), results
    await wait_routed(c.namesrv_addrs, topic, queues)


async def preload(c: Cluster, topic: str, queues: int, per_queue: int) -> None:
    """``per_queue`` messages "q{queue}:{i}" in every queue, sent in batches of 50."""
    cfg = ProducerConfig(group=f"pg-{topic}", namesrv_addrs=c.namesrv_addrs)
    async with Producer(cfg) as p:
        for q in range(queues):
            mq = MessageQueue(topic, BROKER, q)
            for start in range(0, per_queue, 50):
                msgs = [
                    Message(topic, f"q{q}:{i}".encode())
                    for i in range(start, min(per_queue, start + 50))
                ]
                await p.send_batch(msgs, queue=mq)


@dataclass
class Call:
    queue_id: int
    offsets: list[int]
    reconsume_times: list[int]
    bodies: list[str]


@dataclass
class Calls:
    """Every listener call, in the order the calls started."""

    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, msgs: list[ReceivedMessage]) -> Call:
        queue_ids = {m.queue_id for m in msgs}
        assert len(queue_ids) == 1, f"one call mixed queues {queue_ids}"
        call = Call(
            queue_ids.pop(),
            [m.queue_offset for m in msgs],
            [m.reconsume_times for m in msgs],
            [m.body.decode() for m in msgs],
        )
        with self.lock:
            self.calls.append(call)
        return call

    def delivered(self) -> int:
        with self.lock:
            return sum(len(c.offsets) for c in self.calls)


def config(c: Cluster, group: str, **kw: object) -> PushConsumerConfig:
    return PushConsumerConfig(
        group,
        tuple(c.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        **kw,  # type: ignore[arg-type]
    )


def consecutive(offsets: list[int]) -> bool:
    return offsets == list(range(offsets[0], offsets[0] + len(offsets)))


# ---- tests --------------------------------------------------------------------------------


async def test_backlog_is_consumed_in_batches_of_at_most_eight(env: Cluster) -> None:
    topic, group, queues, per_queue = "BatchBacklog", "g-batch-backlog", 4, 150
    await make_topic(env, topic, queues)
    await preload(env, topic, queues, per_queue)
    rec = Calls()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        call = rec.record(msgs)
        assert ctx.message_queue.queue_id == call.queue_id
        return ConsumeResult.CONSUME_SUCCESS

    cfg = config(env, group, consume_message_batch_max_size=8, pull_batch_size=32)
    consumer = PushConsumer(cfg, listener)
    consumer.subscribe(topic, "*")
    async with read_only_broker(env), consumer:
        total = queues * per_queue
        await until(lambda: rec.delivered() >= total, f"{total} messages", 30)
        ends = {MessageQueue(topic, BROKER, q): per_queue for q in range(queues)}
        await until(lambda: consumer.consume_offsets(topic) == ends, "offsets at end", 10)
    sizes = [len(c.offsets) for c in rec.calls]
    assert all(1 <= s <= 8 for s in sizes), sorted(set(sizes))
    # Pulls of 32 from a backlog split into full batches of 8.
    assert sizes.count(8) >= total // 8 // 2, sizes
    for c in rec.calls:
        assert consecutive(c.offsets), c  # queue order inside a call, no gap
        assert c.bodies == [f"q{c.queue_id}:{o}" for o in c.offsets]
    seen = sorted((c.queue_id, o) for c in rec.calls for o in c.offsets)
    assert seen == [(q, o) for q in range(queues) for o in range(per_queue)]  # once each


async def test_a_failed_batch_is_redelivered_whole(env: Cluster) -> None:
    """RECONSUME_LATER for a batch of 8 retries all 8 and nothing else; the offset then moves
    past all of them. The broker is read-only meanwhile, so the send-backs are refused and the
    client's local retry redelivers the batch with the original offsets (the served retry path
    through %RETRY% and the timer wheel has its own tests)."""
    topic, group = "BatchRetry", "g-batch-retry"
    await make_topic(env, topic, 1)
    await preload(env, topic, 1, 24)
    rec = Calls()
    failed: list[Call] = []
    mq = MessageQueue(topic, BROKER, 0)
    offset_at_retry: list[int | None] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        call = rec.record(msgs)
        if call.reconsume_times[0] > 0:  # where the offset stood until the batch came back
            offset_at_retry.append(consumer.consume_offsets(topic).get(mq))
        if "q0:10" in call.bodies and call.reconsume_times[0] == 0:
            failed.append(call)
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.CONSUME_SUCCESS

    cfg = config(env, group, consume_message_batch_max_size=8, pull_batch_size=32)
    consumer = PushConsumer(cfg, listener)
    consumer.subscribe(topic, "*")
    async with read_only_broker(env), consumer:
        await until(lambda: rec.delivered() >= 24, "first deliveries", 15)
        assert len(failed) == 1
        bad = failed[0]
        assert len(bad.offsets) == 8 and 10 in bad.offsets
        held = bad.offsets[0]
        await until(lambda: consumer.consume_offsets(topic).get(mq) == held, "held", 3)
        await until(lambda: rec.delivered() >= 32, "the batch again", 20)
        assert offset_at_retry[0] == held  # held at the failed batch until it came back
        await until(lambda: consumer.consume_offsets(topic)[mq] == 24, "offset at end", 10)
        # A quiet interval, deliberately: nothing may be delivered after the end (no state
        # changes when nothing happens, so there is nothing to poll).
        await asyncio.sleep(0.3)
    again = [
        (o, r) for c in rec.calls for o, r in zip(c.offsets, c.reconsume_times, strict=True) if r
    ]
    assert sorted(again) == [(o, 1) for o in bad.offsets]
    firsts = sorted(
        o for c in rec.calls for o, r in zip(c.offsets, c.reconsume_times, strict=True) if not r
    )
    assert firsts == list(range(24))
    assert rec.delivered() == 32


def test_batch_larger_than_pull_batch_is_refused_at_construction() -> None:
    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return ConsumeResult.CONSUME_SUCCESS

    with pytest.raises(ValueError, match="pull_batch_size"):
        PushConsumer(
            PushConsumerConfig(
                "g-too-big",
                ("127.0.0.1:9876",),
                consume_message_batch_max_size=33,
                pull_batch_size=32,
            ),
            listener,
        )
    with pytest.raises(ValueError, match="pull_batch_size"):
        PushConsumerConfig(
            "g-too-big", ("127.0.0.1:9876",), consume_message_batch_max_size=9, pull_batch_size=8
        )
    # Equal is allowed.
    PushConsumerConfig(
        "g-equal", ("127.0.0.1:9876",), consume_message_batch_max_size=32, pull_batch_size=32
    )


async def test_orderly_batches_of_four_keep_queue_order(env: Cluster) -> None:
    """An orderly consumer with batches of 4 over 4 queues: every call holds 1..4 consecutive
    offsets of one queue, a queue's calls follow each other in offset order without overlap
    (a suspended batch comes back first, whole), and every message is consumed."""
    topic, group, queues, per_queue = "BatchOrderly", "g-batch-orderly", 4, 60
    await make_topic(env, topic, queues)
    await preload(env, topic, queues, per_queue)
    rec = Calls()
    suspended: list[Call] = []

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        call = rec.record(msgs)
        if "q2:21" in call.bodies and not suspended:
            suspended.append(call)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    cfg = config(
        env,
        group,
        consume_message_batch_max_size=4,
        pull_batch_size=32,
        suspend_current_queue_time_ms=200,
    )
    consumer = PushConsumer(cfg, listener, orderly=True)
    consumer.subscribe(topic, "*")
    async with consumer:
        await until(lambda: rec.delivered() > queues * per_queue, "all messages", 30)
        ends = {MessageQueue(topic, BROKER, q): per_queue for q in range(queues)}
        await until(lambda: consumer.consume_offsets(topic) == ends, "offsets at end", 10)
    assert len(suspended) == 1
    for c in rec.calls:
        assert 1 <= len(c.offsets) <= 4 and consecutive(c.offsets), c
    for q in range(queues):
        calls = [c for c in rec.calls if c.queue_id == q]
        if q == 2:
            # The suspended batch is the only repeat, and it comes back next, whole.
            i = next(i for i, c in enumerate(calls) if c is suspended[0])
            assert calls[i + 1].offsets == suspended[0].offsets
            del calls[i]
        flat = [o for c in calls for o in c.offsets]
        assert flat == list(range(per_queue)), (q, flat)
