"""Ordered sending end to end (SPEC §5.4): a sharding key or a selector keeps one business id in
one queue, in send order; a one-queue topic read by an orderly consumer gives global order.

A real nameserver and broker serve the module. Where messages landed is read back with raw Pull
calls (queue id and queue offset of every stored message), not from the producer's SendResults
alone, so the test checks what a consumer will actually see.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.java_hash import java_string_hash
from rocketq.message import Message, MessageQueue, ReceivedMessage, decode_records
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

BROKER = "broker-a"
FLAG_SUBSCRIPTION = 0x4


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("ordered")) as c:
        yield c


async def make_topic(c: Cluster, topic: str, queues: int) -> None:
    async with Admin(c.namesrv_addrs) as admin:
        results = await admin.create_topic(TopicConfig(topic, queues, queues))
        assert all(r.ok for r in results), results
    await wait_routed(c.namesrv_addrs, topic, queues)


async def pull_all(c: Cluster, topic: str, queue_id: int) -> list[ReceivedMessage]:
    """Every message stored in one queue, in queue order, read with plain Pull calls."""
    out: list[ReceivedMessage] = []
    offset = 0
    async with RawClient(c.brokers[0].addr) as raw:
        stub = raw.messaging
        while True:
            resp = await stub.Pull(
                messaging_pb2.PullRequest(
                    consumer_group="ordered-reader",
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msg_nums=256,
                    sys_flag=FLAG_SUBSCRIPTION,
                    subscription="*",
                ),
                timeout=10,
            )
            if resp.status != messaging_pb2.FOUND:
                return out
            out += decode_records(resp.records, BROKER)
            offset = resp.next_begin_offset


def key_of(m: ReceivedMessage) -> tuple[str, int]:
    key, seq = m.body.decode().split(":")
    return key, int(seq)


def producer(c: Cluster, name: str) -> Producer:
    return Producer(ProducerConfig(group=f"pg-{name}", namesrv_addrs=c.namesrv_addrs))


async def test_sharding_key_keeps_each_key_in_one_queue_in_send_order(env: Cluster) -> None:
    """Twelve order ids, twenty status changes each, sent concurrently across ids but in order
    within one id: every id sits in the queue Java's SelectMessageQueueByHash picks, and its
    queue offsets rise with its sequence numbers."""
    topic, n_queues, keys, per_key = "OrderedByKey", 8, [f"order-{i}" for i in range(12)], 20

    await make_topic(env, topic, n_queues)
    async with producer(env, "by-key") as p:

        async def one_key(key: str) -> list[tuple[int, int]]:
            placed = []
            for seq in range(per_key):
                r = await p.send(Message(topic, f"{key}:{seq}".encode()), sharding_key=key)
                placed.append((r.message_queue.queue_id, r.queue_offset))
            return placed

        results = dict(zip(keys, await asyncio.gather(*map(one_key, keys)), strict=True))
    stored = [m for q in range(n_queues) for m in await pull_all(env, topic, q)]
    assert len(stored) == len(keys) * per_key
    by_key: dict[str, list[ReceivedMessage]] = {}
    for m in stored:
        by_key.setdefault(key_of(m)[0], []).append(m)
    used_queues = set()
    for key in keys:
        msgs = sorted(by_key[key], key=lambda m: m.queue_offset)
        expected_queue = abs(java_string_hash(key)) % n_queues
        assert {m.queue_id for m in msgs} == {expected_queue}, key
        assert [key_of(m)[1] for m in msgs] == list(range(per_key)), key
        assert [(m.queue_id, m.queue_offset) for m in msgs] == results[key]
        used_queues.add(expected_queue)
    assert len(used_queues) > 1  # the keys really were spread, not all in one queue


class ByOrderNumber:
    """A user selector: order number modulo the queue count (what a RocketMQ example does)."""

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: object) -> MessageQueue:
        assert isinstance(arg, int)
        return mqs[arg % len(mqs)]


async def test_selector_and_explicit_queue_keep_send_order(env: Cluster) -> None:
    topic, n_queues = "OrderedBySelector", 8

    await make_topic(env, topic, n_queues)
    async with producer(env, "by-selector") as p:
        for seq in range(10):
            for order_no in (3, 11, 6):  # 3 and 11 share queue 3
                await p.send(
                    Message(topic, f"o{order_no}:{seq}".encode()),
                    selector=ByOrderNumber(),
                    arg=order_no,
                )
        fixed = MessageQueue(topic, BROKER, 5)
        for seq in range(10):
            r = await p.send(Message(topic, f"fixed:{seq}".encode()), queue=fixed)
            assert r.message_queue == fixed
    q3 = [key_of(m) for m in await pull_all(env, topic, 3)]
    assert q3 == [(k, s) for s in range(10) for k in ("o3", "o11")]
    assert [key_of(m) for m in await pull_all(env, topic, 6)] == [("o6", s) for s in range(10)]
    assert [key_of(m) for m in await pull_all(env, topic, 5)] == [("fixed", s) for s in range(10)]
    for q in (0, 1, 2, 4, 7):
        assert await pull_all(env, topic, q) == []


async def test_one_queue_topic_with_an_orderly_consumer_gives_global_order(env: Cluster) -> None:
    """300 messages into a one-queue topic; an orderly consumer with many threads and
    batches of 4 still sees them in exactly the send order, each once."""
    topic, group, n = "GlobalOrder", "g-global-order", 300

    await make_topic(env, topic, 1)
    async with producer(env, "global") as p:
        for i in range(n):
            await p.send(Message(topic, f"g:{i}".encode()))
    seen: list[tuple[int, int]] = []  # (sequence, queue offset)
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        with lock:
            seen.extend((key_of(m)[1], m.queue_offset) for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    cfg = PushConsumerConfig(
        group,
        tuple(env.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=4,
        consume_thread_max=8,
    )
    consumer = PushConsumer(cfg, listener, orderly=True)
    consumer.subscribe(topic, "*")
    async with consumer:
        await until(lambda: len(seen) >= n, f"all {n} consumed", timeout_s=30)
        # A deliberate quiet interval: a redelivery or duplicate would arrive within it.
        await asyncio.sleep(0.3)
    assert [s for s, _ in seen] == list(range(n))
    assert [o for _, o in seen] == list(range(n))
