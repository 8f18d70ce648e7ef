"""Orderly push consumers against a real nameserver and broker (SPEC §6.15, §6.18).

One cluster serves the module, with the broker's lock expiry shortened to 5 s
(rebalanceLockMaxLiveTime) and the consumers' lock renewal to 1 s (treated as lost after 3 s),
so lock behaviour shows within seconds. Every test uses its own topic and group. Messages are
sent with sharding keys by the real Producer; every delivery is recorded in call order (all
consumers run on the test's event loop), so "in order" and "nothing lost" are checked against
the full history.

Raw LockBatch/UnlockBatch calls from a made-up client id ("intruder") show the broker's view of
the locks: while a consumer holds a queue, the intruder gets nothing; once it closes cleanly,
the intruder gets every queue at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageModel,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue, ReceivedMessage
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

BROKER = "broker-a"
BROKER_LOCK_MAX_LIVE_MS = 5000
INTRUDER = "127.0.0.1@intruder"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(
        tmp_path_factory.mktemp("orderly"),
        broker_keys={"rebalanceLockMaxLiveTime": BROKER_LOCK_MAX_LIVE_MS},
    ) as c:
        yield c


# ---- helpers ------------------------------------------------------------------------------


async def make_topic(c: Cluster, topic: str, queues: int) -> list[MessageQueue]:
    async with Admin(c.namesrv_addrs) as admin:
        results = await admin.create_topic(TopicConfig(topic, queues, queues))
        assert all(r.ok for r in results), results
    await wait_routed(c.namesrv_addrs, topic, queues)
    return [MessageQueue(topic, BROKER, i) for i in range(queues)]


def config(c: Cluster, group: str, **kw: Any) -> PushConsumerConfig:
    defaults: dict[str, Any] = {
        "consume_from_where": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        "rebalance_interval_ms": 1000,
        "rebalance_lock_interval_ms": 1000,
        "rebalance_lock_max_live_ms": 3000,
        "persist_consumer_offset_interval_ms": 1000,
    }
    defaults.update(kw)
    return PushConsumerConfig(group, tuple(c.namesrv_addrs), **defaults)


async def lock_call(
    c: Cluster, method: str, group: str, client_id: str, mqs: list[MessageQueue]
) -> set[int]:
    """A raw LockBatch/UnlockBatch; the queue ids the answer says the client holds."""
    pbs = [
        common_pb2.MessageQueue(topic=mq.topic, broker_name=BROKER, queue_id=mq.queue_id)
        for mq in mqs
    ]
    async with RawClient(c.brokers[0].addr) as raw:
        stub = raw.messaging
        if method == "lock":
            resp = await stub.LockBatch(
                messaging_pb2.LockBatchRequest(
                    consumer_group=group, client_id=client_id, queues=pbs
                ),
                timeout=5,
            )
            return {q.queue_id for q in resp.locked_queues}
        await stub.UnlockBatch(
            messaging_pb2.UnlockBatchRequest(consumer_group=group, client_id=client_id, queues=pbs),
            timeout=5,
        )
        return set()


async def stored_offset(c: Cluster, group: str, mq: MessageQueue) -> int:
    async with RawClient(c.brokers[0].addr) as raw:
        stub = raw.messaging
        try:
            resp = await stub.QueryConsumerOffset(
                messaging_pb2.QueryConsumerOffsetRequest(
                    consumer_group=group, topic=mq.topic, queue_id=mq.queue_id
                ),
                timeout=5,
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return -1
            raise
        return int(resp.offset)


@dataclass
class Delivery:
    consumer: str
    key: str
    seq: int
    queue_id: int
    offset: int
    reconsume_times: int
    at_s: float


@dataclass
class Log:
    """Every listener call's messages, in call order."""

    deliveries: list[Delivery] = field(default_factory=list)
    in_call: dict[tuple[str, int], int] = field(default_factory=dict)
    overlaps: int = 0

    def listener(
        self,
        name: str,
        work_s: float = 0.0,
        decide: Callable[[ReceivedMessage], ConsumeOrderlyStatus] | None = None,
    ) -> Callable[..., Any]:
        async def listen(
            msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            qkey = (ctx.message_queue.topic, ctx.message_queue.queue_id)
            self.in_call[qkey] = self.in_call.get(qkey, 0) + 1
            if self.in_call[qkey] > 1:
                self.overlaps += 1  # two calls on one queue at once: must never happen
            try:
                status = ConsumeOrderlyStatus.SUCCESS
                for m in msgs:
                    key, seq = m.body.decode().split(":")
                    self.deliveries.append(
                        Delivery(
                            name,
                            key,
                            int(seq),
                            m.queue_id,
                            m.queue_offset,
                            m.reconsume_times,
                            time.monotonic(),
                        )
                    )
                    if decide is not None:
                        status = decide(m)
                if work_s:
                    await asyncio.sleep(work_s)
                return status
            finally:
                self.in_call[qkey] -= 1

        return listen

    def seqs(self, key: str) -> list[int]:
        return [d.seq for d in self.deliveries if d.key == key]

    def seen(self) -> set[tuple[str, int]]:
        return {(d.key, d.seq) for d in self.deliveries}


async def send_keyed(
    p: Producer, topic: str, keys: list[str], per_key: int, pause_s: float = 0.0
) -> None:
    """``per_key`` messages for each key, interleaved, each key's in order (sync sends)."""
    for seq in range(per_key):
        for key in keys:
            await p.send(Message(topic, f"{key}:{seq}".encode()), sharding_key=key)
        if pause_s:
            await asyncio.sleep(pause_s)


def owned(consumer: PushConsumer, topic: str) -> set[int]:
    """Queue ids of ``topic`` the consumer owns (its retry topic's queues left out)."""
    return {mq.queue_id for mq in consumer.assigned_queues() if mq.topic == topic}


def producer(c: Cluster, name: str) -> Producer:
    return Producer(ProducerConfig(group=f"pg-{name}", namesrv_addrs=c.namesrv_addrs))


# ---- tests --------------------------------------------------------------------------------


async def test_two_orderly_members_keep_every_key_in_order_while_one_joins(env: Cluster) -> None:
    topic, group = "orderly-join", "cg-orderly-join"
    keys = [f"order-{i}" for i in range(16)]
    per_key = 30
    log = Log()
    moved: set[int] = set()

    await make_topic(env, topic, 8)
    # The default 20 s rebalance interval: the broker's membership notice starts the
    # rebalances, and b, refused the queues a is still releasing, retries after 1 s.
    cfg = config(env, group, rebalance_interval_ms=20_000)
    a = PushConsumer(cfg, log.listener("a", 0.002), orderly=True)
    b = PushConsumer(cfg, log.listener("b", 0.002), orderly=True)
    a.subscribe(topic)
    b.subscribe(topic)
    async with producer(env, "join") as p:
        await a.start()
        try:
            await until(lambda: len(owned(a, topic)) == 8, "a owns all 8 queues", timeout_s=30.0)
            sending = asyncio.create_task(send_keyed(p, topic, keys, per_key, 0.05))
            await until(lambda: len(log.deliveries) >= 100, "a consumed a while", timeout_s=30.0)
            await b.start()  # joins mid-stream: half the queues move to b
            try:
                await sending
                await until(
                    lambda: len(log.seen()) == len(keys) * per_key,
                    "every message consumed",
                    timeout_s=60,
                )
                mine, theirs = owned(a, topic), owned(b, topic)
                assert len(mine) == 4 and len(theirs) == 4 and not mine & theirs
                moved.update(theirs)
            finally:
                await b.close()
        finally:
            await a.close()
    assert log.overlaps == 0
    for key in keys:
        # in order, nothing lost, nothing twice: the queue moved only after a's last
        # call ended and its offset was persisted, and b read that offset
        assert log.seqs(key) == list(range(per_key)), key
    # the queues b took were consumed by a before, then by b: real hand-overs
    for q in moved:
        consumers = [d.consumer for d in log.deliveries if d.queue_id == q]
        assert consumers[0] == "a" and consumers[-1] == "b", (q, consumers)
    assert all(len({d.queue_id for d in log.deliveries if d.key == k}) == 1 for k in keys)


async def test_suspend_redelivers_locally_after_the_suspend_time_and_keeps_order(
    env: Cluster,
) -> None:
    topic, group = "orderly-suspend", "cg-orderly-suspend"
    keys = ["k0", "k1"]
    log = Log()
    suspended: list[int] = []

    def decide(m: ReceivedMessage) -> ConsumeOrderlyStatus:
        if m.body == b"k0:3" and not suspended:
            suspended.append(m.queue_offset)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    await make_topic(env, topic, 2)
    consumer = PushConsumer(
        config(env, group, suspend_current_queue_time_ms=700),
        log.listener("a", decide=decide),
        orderly=True,
    )
    consumer.subscribe(topic)
    async with producer(env, "suspend") as p:
        await send_keyed(p, topic, keys, 8)
        async with consumer:
            await until(lambda: len(log.seen()) == 16, "all consumed", timeout_s=30.0)
            await until(lambda: len(log.seqs("k0")) == 9, "the redelivery", timeout_s=30.0)
    k0 = [d for d in log.deliveries if d.key == "k0"]
    assert [d.seq for d in k0] == [0, 1, 2, 3, 3, 4, 5, 6, 7]
    first, again = k0[3], k0[4]
    assert again.offset == first.offset and again.reconsume_times == 1
    assert 0.6 <= again.at_s - first.at_s <= 5.0  # after ~suspend_current_queue_time_ms
    assert [d.seq for d in log.deliveries if d.key == "k1"] == list(range(8))


async def test_broker_locks_are_taken_renewed_respected_and_released_on_close(env: Cluster) -> None:
    topic, group = "orderly-locks", "cg-orderly-locks"
    mqs_all: list[MessageQueue] = []
    log = Log()

    mqs_all.extend(await make_topic(env, topic, 4))
    # another client holds queue 3 at first: the consumer must leave it alone
    assert await lock_call(env, "lock", group, INTRUDER, mqs_all[3:]) == {3}
    consumer = PushConsumer(config(env, group), log.listener("a"), orderly=True)
    consumer.subscribe(topic)
    async with producer(env, "locks") as p:
        await send_keyed(p, topic, [f"k{i}" for i in range(8)], 5)
        async with consumer:
            await until(
                lambda: (
                    {mq.queue_id for mq in consumer.assigned_queues() if mq.topic == topic}
                    == {0, 1, 2}
                ),
                "queues 0-2 owned",
                timeout_s=30.0,
            )
            held_back = {d.queue_id for d in log.deliveries}
            await asyncio.sleep(1.5)  # a rebalance or two: queue 3 stays with the intruder
            assert 3 not in {d.queue_id for d in log.deliveries} | held_back
            assert 3 not in owned(consumer, topic)
            await lock_call(env, "unlock", group, INTRUDER, mqs_all[3:])
            await until(
                lambda: len(log.seen()) == 40, "queue 3 consumed after release", timeout_s=30.0
            )
            # held and renewed: past the broker's 5 s expiry the intruder still gets nothing
            assert await lock_call(env, "lock", group, INTRUDER, mqs_all) == set()
            # A deliberate real interval: the broker's lock expiry, which the renewals outrun.
            await asyncio.sleep(BROKER_LOCK_MAX_LIVE_MS / 1000 + 1)
            assert await lock_call(env, "lock", group, INTRUDER, mqs_all) == set()
        # a clean close persisted the offsets, then unlocked: free at once
        assert await lock_call(env, "lock", group, INTRUDER, mqs_all) == {0, 1, 2, 3}
    await lock_call(env, "unlock", group, INTRUDER, mqs_all)
    offsets = [await stored_offset(env, group, mq) for mq in mqs_all]
    per_queue = [len([d for d in log.deliveries if d.queue_id == i]) for i in range(4)]
    assert offsets == per_queue  # every queue's offset is one past what was consumed


async def test_batches_respect_consume_message_batch_max_size_in_order(env: Cluster) -> None:
    topic, group = "orderly-batch", "cg-orderly-batch"
    sizes: list[int] = []
    log = Log()
    inner = log.listener("a")

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> Any:
        sizes.append(len(msgs))
        offsets = [m.queue_offset for m in msgs]
        assert offsets == sorted(offsets) and len(set(m.queue_id for m in msgs)) == 1
        return await inner(msgs, ctx)

    await make_topic(env, topic, 1)
    consumer = PushConsumer(
        config(env, group, consume_message_batch_max_size=4, pull_batch_size=8),
        listener,
        orderly=True,
    )
    consumer.subscribe(topic)
    async with producer(env, "batch") as p:
        await send_keyed(p, topic, ["k"], 30)
        async with consumer:
            await until(lambda: len(log.seen()) == 30, "all consumed", timeout_s=30.0)
    assert log.seqs("k") == list(range(30))
    assert max(sizes) == 4 and sum(sizes) == 30


async def test_broadcasting_orderly_takes_no_broker_lock_and_each_member_gets_everything_in_order(
    env: Cluster, tmp_path: Path
) -> None:
    topic, group = "orderly-broadcast", "cg-orderly-broadcast"
    keys = ["k0", "k1", "k2"]
    log = Log()

    mqs = await make_topic(env, topic, 2)
    # another client holds every queue: broadcasting members read them anyway
    assert await lock_call(env, "lock", group, INTRUDER, mqs) == {0, 1}
    members = [
        PushConsumer(
            config(
                env,
                group,
                message_model=MessageModel.BROADCASTING,
                instance_name=f"bc-{name}",
                offset_store_dir=str(tmp_path),
            ),
            log.listener(name),
            orderly=True,
        )
        for name in ("a", "b")
    ]
    for m in members:
        m.subscribe(topic)
    async with producer(env, "broadcast") as p:
        await send_keyed(p, topic, keys, 10)
        for m in members:
            await m.start()
        try:
            await until(lambda: len(log.deliveries) == 60, "both got all 30", timeout_s=30.0)
        finally:
            for m in members:
                await m.close()
    await lock_call(env, "unlock", group, INTRUDER, mqs)
    for name in ("a", "b"):
        for key in keys:
            seqs = [d.seq for d in log.deliveries if d.consumer == name and d.key == key]
            assert seqs == list(range(10)), (name, key)
    assert log.overlaps == 0
