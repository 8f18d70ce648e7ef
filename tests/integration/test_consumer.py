"""Push and lite pull consumers against real nameserver and broker processes (SPEC §6).

One cluster (a nameserver and a broker) serves the whole module; every test uses its own
topics and groups. Messages are sent with the real Producer, and every delivery is recorded
(consumer, body, queue, offset, reconsume count, time), so "no loss" and "duplicates only
around rebalances" are checked against the full history rather than a count.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    LitePullConsumer,
    LitePullConsumerConfig,
    MessageModel,
    PushConsumer,
    PushConsumerConfig,
    SyncLitePullConsumer,
    SyncPushConsumer,
)
from rocketq.client.consumer.config import format_consume_timestamp
from rocketq.client.consumer.offset_store import parse_offsets
from rocketq.client.producer import Producer, ProducerConfig, SyncProducer
from rocketq.message import Message, MessageQueue, ReceivedMessage
from tests.integration.cluster import read_only_broker
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import at_least, until, until_sync

pytestmark = pytest.mark.integration

BROKER = "broker-a"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("consumer")) as c:
        yield c


# ---- helpers ------------------------------------------------------------------------------


async def make_topic(c: Cluster, topic: str, read: int = 4, write: int | None = None) -> None:
    """Create ``topic`` on the broker (Admin, broker mode) and wait for its route."""
    async with RawClient(c.broker.addr) as rc:
        await rc.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.TopicConfig(
                    topic_name=topic,
                    read_queue_nums=read,
                    write_queue_nums=write or read,
                    perm=6,
                ),
            ),
            timeout=10,
        )
    await wait_routed(c.namesrv_addrs, topic, write or read)


async def broker_call(c: Cluster, method: str, request: object) -> object:
    async with RawClient(c.broker.addr) as rc:
        return await getattr(rc.messaging, method)(request, timeout=5)


async def stored_offset(c: Cluster, group: str, mq: MessageQueue) -> int:
    req = messaging_pb2.QueryConsumerOffsetRequest(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id
    )
    try:
        resp = await broker_call(c, "QueryConsumerOffset", req)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return -1
        raise
    assert isinstance(resp, messaging_pb2.QueryConsumerOffsetResponse)
    return int(resp.offset)


async def max_offset(c: Cluster, mq: MessageQueue) -> int:
    req = messaging_pb2.GetMaxOffsetRequest(topic=mq.topic, queue_id=mq.queue_id)
    resp = await broker_call(c, "GetMaxOffset", req)
    assert isinstance(resp, messaging_pb2.GetMaxOffsetResponse)
    return int(resp.offset)


def producer(c: Cluster, name: str) -> Producer:
    return Producer(ProducerConfig(group=f"pg-{name}", namesrv_addrs=c.namesrv_addrs))


async def send_all(
    p: Producer, topic: str, bodies: list[str], tags: Callable[[int], str] | None = None
) -> list[str]:
    for i, body in enumerate(bodies):
        await p.send(Message(topic, body.encode(), tags=tags(i) if tags else ""))
    return bodies


@dataclass
class Delivery:
    consumer: str
    body: str
    queue_id: int
    offset: int
    reconsume_times: int
    at: float
    tags: str


@dataclass
class Recorder:
    """Every delivery to every consumer, in arrival order."""

    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, name: str, msgs: list[ReceivedMessage]) -> None:
        now = time.monotonic()
        with self.lock:
            for m in msgs:
                self.deliveries.append(
                    Delivery(
                        name,
                        m.body.decode(),
                        m.queue_id,
                        m.queue_offset,
                        m.reconsume_times,
                        now,
                        m.tags,
                    )
                )

    def listener(
        self, name: str, delay_s: float = 0.0
    ) -> Callable[[list[ReceivedMessage], ConsumeContext], Awaitable[ConsumeResult]]:
        async def on_messages(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            self.record(name, msgs)
            if delay_s:
                await asyncio.sleep(delay_s)
            return ConsumeResult.CONSUME_SUCCESS

        return on_messages

    def received(self, consumer: str, n: int) -> bool:
        return len(self.bodies(consumer)) >= n

    def bodies(self, consumer: str | None = None) -> list[str]:
        with self.lock:
            return [d.body for d in self.deliveries if consumer in (None, d.consumer)]


def push(
    c: Cluster, group: str, listener: object, topic: str, expr: str = "*", **kw: object
) -> PushConsumer:
    kw.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    cfg = PushConsumerConfig(group, tuple(c.namesrv_addrs), **kw)  # type: ignore[arg-type]
    consumer = PushConsumer(cfg, listener)  # type: ignore[arg-type]
    consumer.subscribe(topic, expr)
    return consumer


def owned(consumer: PushConsumer | LitePullConsumer, topic: str) -> set[MessageQueue]:
    queues = (
        consumer.assigned_queues() if isinstance(consumer, PushConsumer) else consumer.assignment()
    )
    return {mq for mq in queues if mq.topic == topic}


def queues(topic: str, n: int) -> set[MessageQueue]:
    return {MessageQueue(topic, BROKER, i) for i in range(n)}


def owns(consumer: PushConsumer | LitePullConsumer, topic: str, n: int) -> Callable[[], bool]:
    """A predicate: the consumer owns exactly queues 0..n-1 of ``topic``."""
    return lambda: owned(consumer, topic) == queues(topic, n)


def at_offsets(consumer: PushConsumer, topic: str, offsets: dict[MessageQueue, int]) -> bool:
    return consumer.consume_offsets(topic) == offsets


# ---- clustering ---------------------------------------------------------------------------


async def test_clustering_members_join_and_leave_without_loss(env: Cluster) -> None:
    """Three consumers, one joining and one leaving mid-stream: nothing lost, and every
    duplicate delivery happens after a membership change (SPEC §6.10)."""
    topic, group = "CJoinLeave", "g-join-leave"
    await make_topic(env, topic, 8)
    rec = Recorder()
    c1 = push(env, group, rec.listener("c1", 0.002), topic)
    c2 = push(env, group, rec.listener("c2", 0.002), topic)
    c3 = push(env, group, rec.listener("c3", 0.002), topic)
    await c1.start()
    await c2.start()
    await until(
        lambda: (
            owned(c1, topic) | owned(c2, topic) == queues(topic, 8)
            and not owned(c1, topic) & owned(c2, topic)
        ),
        "c1 and c2 sharing the 8 queues",
        20,
    )
    sent: list[str] = []
    async with producer(env, "join-leave") as p:
        sent += await send_all(p, topic, [f"a{i}" for i in range(120)])
        t_join = time.monotonic()
        await c3.start()
        sent += await send_all(p, topic, [f"b{i}" for i in range(120)])
        await c2.close()
        t_leave = time.monotonic()
        sent += await send_all(p, topic, [f"c{i}" for i in range(120)])
    await until(lambda: set(sent) <= set(rec.bodies()), "every message delivered", 20)
    await until(
        lambda: (
            owned(c1, topic) | owned(c3, topic) == queues(topic, 8)
            and not owned(c1, topic) & owned(c3, topic)
        ),
        "c1 and c3 sharing the queues after c2 left",
        20,
    )
    await c1.close()
    await c3.close()

    assert set(rec.bodies()) == set(sent)  # nothing lost, nothing invented
    seen: set[str] = set()
    for d in rec.deliveries:
        if d.body in seen:
            assert d.at >= t_join, f"duplicate of {d.body} before any rebalance"
        seen.add(d.body)
    duplicates = len(rec.deliveries) - len(seen)
    assert duplicates <= len(sent) // 4, f"{duplicates} duplicates is more than a rebalance"
    assert any(d.at > t_join for d in rec.deliveries if d.consumer == "c3")
    assert not [d for d in rec.deliveries if d.consumer == "c2" and d.at > t_leave + 0.5]
    assert {d.consumer for d in rec.deliveries if d.body.startswith("c")} <= {"c1", "c3"}


async def test_restart_resumes_from_the_committed_offset(env: Cluster) -> None:
    topic, group = "CRestart", "g-restart"
    await make_topic(env, topic, 2)
    rec = Recorder()
    async with producer(env, "restart") as p:
        first = await send_all(p, topic, [f"r1-{i}" for i in range(30)])
        c = push(env, group, rec.listener("first"), topic)
        await c.start()
        await until(lambda: set(first) <= set(rec.bodies()), "first batch", 20)
        await c.close()  # persists offsets, leaves the group
        for mq in queues(topic, 2):
            assert await stored_offset(env, group, mq) == await max_offset(env, mq)
        second = await send_all(p, topic, [f"r2-{i}" for i in range(30)])
    again = push(env, group, rec.listener("second"), topic)
    await again.start()
    await until(lambda: set(second) <= set(rec.bodies("second")), "second batch", 20)
    await asyncio.sleep(0.3)  # a quiet interval, deliberately: no repeat may follow
    await again.close()
    assert sorted(rec.bodies("second")) == sorted(second)  # nothing lost, nothing repeated


async def test_committed_offset_is_the_smallest_in_flight(env: Cluster) -> None:
    """SPEC §15: later messages finishing first never move the offset past an earlier one."""
    topic, group = "CInFlight", "g-in-flight"
    await make_topic(env, topic, 1)
    mq = MessageQueue(topic, BROKER, 0)
    release = asyncio.Event()
    done: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if msgs[0].queue_offset == 3:
            await release.wait()
        done.append(msgs[0].queue_offset)
        return ConsumeResult.CONSUME_SUCCESS

    c = push(env, group, listener, topic, consume_thread_max=4)
    await c.start()
    async with producer(env, "in-flight") as p:
        await send_all(p, topic, [f"f{i}" for i in range(10)])
    await until(lambda: len(done) == 9, "all but offset 3 consumed", 20)
    assert c.consume_offsets(topic)[mq] == 3
    await c.persist_offsets()
    assert await stored_offset(env, group, mq) == 3
    release.set()
    await until(lambda: c.consume_offsets(topic).get(mq) == 10, "offset 10", 20)
    await c.persist_offsets()
    assert await stored_offset(env, group, mq) == 10
    await c.close()


async def test_reconsume_later_is_redelivered_locally_when_the_send_back_fails(
    env: Cluster,
) -> None:
    """A failed message whose send-back the broker refuses (here: the broker was made read-only)
    comes back from the client's own 5 s retry with reconsume_times + 1, and holds the offset
    meanwhile (SPEC §6.11). The served retry path is tested with the timer wheel."""
    topic, group = "CRetry", "g-retry"
    await make_topic(env, topic, 1)
    mq = MessageQueue(topic, BROKER, 0)
    rec = Recorder()
    offset_at_retry: list[int | None] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        rec.record("c", msgs)
        if msgs[0].body == b"bad" and msgs[0].reconsume_times > 0:
            offset_at_retry.append(c.consume_offsets(topic).get(mq))  # where it stood till now
        if msgs[0].body == b"bad" and msgs[0].reconsume_times == 0:
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.CONSUME_SUCCESS

    async with producer(env, "retry") as p:
        await send_all(p, topic, ["ok0", "bad", "ok1"])
    async with read_only_broker(env):
        c = push(env, group, listener, topic)
        await c.start()
        await until(lambda: len(rec.deliveries) >= 3, "first deliveries", 20)
        await until(lambda: rec.bodies().count("bad") == 2, "redelivery", 15)
        assert offset_at_retry[0] == 1  # held at the failed message until it came back
        first, second = [d for d in rec.deliveries if d.body == "bad"]
        assert 4.5 <= second.at - first.at <= 10.0
        assert (first.reconsume_times, second.reconsume_times) == (0, 1)
        await until(lambda: c.consume_offsets(topic).get(mq) == 3, "offset after retry", 20)
        await c.close()
    assert sorted(rec.bodies()) == ["bad", "bad", "ok0", "ok1"]


async def test_long_polling_delivers_within_a_fraction_of_a_second(env: Cluster) -> None:
    topic, group = "CLatency", "g-latency"
    await make_topic(env, topic, 2)
    arrived: dict[str, float] = {}

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        for m in msgs:
            arrived[m.body.decode()] = time.monotonic()
        return ConsumeResult.CONSUME_SUCCESS

    c = push(env, group, listener, topic)
    await c.start()
    await until(lambda: owned(c, topic) == queues(topic, 2), "assignment", 20)
    # The pulls of both queues are held on the broker (this module's other tests close their
    # consumers, so held pulls are this consumer's).
    async with RawClient(env.broker.addr) as rc:
        await until(lambda: at_least(rc.held_pulls(), 2), "both pulls held on the broker")
    latencies = []
    async with producer(env, "latency") as p:
        await p.send(Message(topic, b"warm"))
        await until(lambda: "warm" in arrived, "warm-up", 20)
        for i in range(10):
            body = f"l{i}"
            start = time.monotonic()
            await p.send(Message(topic, body.encode()))
            await until(functools.partial(arrived.__contains__, body), body, 5)
            latencies.append(arrived[body] - start)
            await asyncio.sleep(0.05)  # pacing: one message at a time, each into a held pull
    await c.close()
    assert max(latencies) < 1.0, latencies
    assert statistics.median(latencies) < 0.3, latencies


# ---- where to start, what to read ------------------------------------------------------------


async def test_consume_from_first_last_and_timestamp(env: Cluster) -> None:
    topic = "CFromWhere"
    await make_topic(env, topic, 2)
    rec = Recorder()
    async with producer(env, "from-where") as p:
        old = await send_all(p, topic, [f"old{i}" for i in range(10)])
        # consume_timestamp has second resolution: start the new batch in a fresh second
        await asyncio.sleep(1.05 - time.time() % 1)  # a real interval: the clock's next second
        stamp = format_consume_timestamp(int(time.time() * 1000))
        await asyncio.sleep(0.05)  # a real interval: the new batch is born after the stamp
        new = await send_all(p, topic, [f"new{i}" for i in range(10)])
        consumers = [
            push(env, "g-first", rec.listener("first"), topic),
            push(
                env,
                "g-last",
                rec.listener("last"),
                topic,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
            ),
            push(
                env,
                "g-stamp",
                rec.listener("stamp"),
                topic,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
                consume_timestamp=stamp,
            ),
        ]
        for c in consumers:
            await c.start()
        for c in consumers:
            await until(owns(c, topic, 2), "assignment", 20)
        await until(lambda: set(old + new) <= set(rec.bodies("first")), "first", 20)
        await until(lambda: set(new) <= set(rec.bodies("stamp")), "timestamp", 20)
        # CONSUME_FROM_LAST_OFFSET is decided at a queue's first pull: wait until every member
        # has a pull held on both queues (3 x 2; this module's other tests closed theirs)
        # before sending what "last" must see.
        async with RawClient(env.broker.addr) as rc:
            await until(lambda: at_least(rc.held_pulls(), 6), "every member's pulls held")
        later = await send_all(p, topic, [f"later{i}" for i in range(6)])
        await until(lambda: set(later) <= set(rec.bodies("last")), "last", 20)
        await until(lambda: set(later) <= set(rec.bodies("stamp")), "stamp later", 20)
    for c in consumers:
        await c.close()
    assert sorted(rec.bodies("first")) == sorted(old + new + later)
    assert sorted(rec.bodies("stamp")) == sorted(new + later)
    assert sorted(rec.bodies("last")) == sorted(later)


async def test_write_8_read_4_leaves_queues_4_to_7_unconsumed(env: Cluster) -> None:
    topic, group = "CReadWrite", "g-read-write"
    await make_topic(env, topic, read=4, write=8)
    rec = Recorder()
    async with producer(env, "read-write") as p:
        await send_all(p, topic, [f"w{i}" for i in range(80)])
    for qid in range(8):
        assert await max_offset(env, MessageQueue(topic, BROKER, qid)) == 10
    c = push(env, group, rec.listener("c"), topic)
    await c.start()
    await until(lambda: len(rec.deliveries) >= 40, "40 messages", 20)
    await asyncio.sleep(1.0)  # a quiet interval, deliberately: queues 4-7 must stay unread
    assert owned(c, topic) == queues(topic, 4)
    await c.close()
    assert len(rec.deliveries) == 40
    assert {d.queue_id for d in rec.deliveries} == {0, 1, 2, 3}


async def test_tag_filtering(env: Cluster) -> None:
    topic, group = "CTags", "g-tags"
    tag_cycle = ["A", "B", "C", ""]
    await make_topic(env, topic, 2)
    rec = Recorder()
    c = push(env, group, rec.listener("c"), topic, "A || B")
    await c.start()
    await until(lambda: owned(c, topic) == queues(topic, 2), "assignment", 20)
    async with producer(env, "tags") as p:
        bodies = await send_all(
            p, topic, [f"t{i}" for i in range(40)], tags=lambda i: tag_cycle[i % 4]
        )
    wanted = [b for i, b in enumerate(bodies) if tag_cycle[i % 4] in ("A", "B")]
    await until(lambda: set(wanted) <= set(rec.bodies()), "A and B messages", 20)
    maxima = {mq: await max_offset(env, mq) for mq in queues(topic, 2)}
    # filtered messages count as consumed: the offsets reach the end of each queue
    await until(lambda: c.consume_offsets(topic) == maxima, "offsets at the end", 20)
    await c.close()
    assert sorted(rec.bodies()) == sorted(wanted)
    assert {d.tags for d in rec.deliveries} == {"A", "B"}


async def test_batch_consumption_hands_up_to_batch_size_messages_of_one_queue(env: Cluster) -> None:
    """SPEC §6.18: consume_message_batch_max_size messages per call, never more, one queue each."""
    topic, group = "CBatch", "g-batch"
    calls: list[list[tuple[int, int]]] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append([(m.queue_id, m.queue_offset) for m in msgs])
        return ConsumeResult.CONSUME_SUCCESS

    await make_topic(env, topic, 2)
    async with producer(env, "batch") as p:
        await send_all(p, topic, [f"b{i}" for i in range(60)])
    c = push(env, group, listener, topic, consume_message_batch_max_size=5, pull_batch_size=10)
    await c.start()
    await until(lambda: sum(len(x) for x in calls) >= 60, "all 60 consumed", 20)
    await c.close()
    assert max(len(x) for x in calls) == 5
    assert all(len({q for q, _o in x}) == 1 for x in calls)  # a batch never mixes queues
    delivered = sorted(m for x in calls for m in x)
    assert len(set(delivered)) == 60


# ---- broadcasting -----------------------------------------------------------------------------


async def test_broadcasting_delivers_everything_to_each_member(
    env: Cluster, tmp_path: Path
) -> None:
    topic, group = "CBroadcast", "g-broadcast"
    await make_topic(env, topic, 2)
    rec = Recorder()

    def listener(name: str) -> Callable[..., ConsumeResult]:
        def on(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            rec.record(name, msgs)
            return (
                ConsumeResult.RECONSUME_LATER
                if msgs[0].body == b"fail"
                else ConsumeResult.CONSUME_SUCCESS
            )

        return on

    def member(name: str) -> PushConsumer:
        return push(
            env,
            group,
            listener(name),
            topic,
            message_model=MessageModel.BROADCASTING,
            instance_name=name,
            offset_store_dir=str(tmp_path),
        )

    b1, b2 = member("b1"), member("b2")
    await b1.start()
    await b2.start()
    for b in (b1, b2):
        await until(owns(b, topic, 2), "all queues", 20)
    async with producer(env, "broadcast") as p:
        sent = await send_all(p, topic, [f"x{i}" for i in range(39)] + ["fail"])
        maxima = {mq: await max_offset(env, mq) for mq in queues(topic, 2)}
        for name, b in (("b1", b1), ("b2", b2)):
            await until(functools.partial(rec.received, name, 40), name, 20)
            # the failure is dropped, not held for retry: offsets reach the queue ends
            await until(functools.partial(at_offsets, b, topic, maxima), "offsets", 20)
        await b1.close()
        await b2.close()
        for name, b in (("b1", b1), ("b2", b2)):
            assert sorted(rec.bodies(name)) == sorted(sent)  # all, once, no retry
            path = tmp_path / b.client_id / group / "offsets.json"
            stored = parse_offsets(path.read_text())
            assert {mq: o for mq, o in stored.items() if mq.topic == topic} == maxima
        # a restarted member resumes from its file: only the new messages arrive
        again = member("b1")
        await again.start()
        more = await send_all(p, topic, [f"y{i}" for i in range(4)])
        await until(lambda: set(more) <= set(rec.bodies("b1")), "b1 after restart", 20)
        await asyncio.sleep(0.3)  # a quiet interval, deliberately: nothing old may follow
        await again.close()
    assert sorted(rec.bodies("b1")) == sorted(sent + more)


# ---- lite pull ---------------------------------------------------------------------------------


async def poll_until(
    consumer: LitePullConsumer, n: int, timeout_s: float = 15
) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"polled {len(got)} of {n}"
        got += await consumer.poll(200)
    return got


async def test_lite_pull_assign_seek_and_commit(env: Cluster) -> None:
    topic, group = "LAssign", "g-lite-assign"
    await make_topic(env, topic, 2)
    async with producer(env, "lite-assign") as p:
        sent = await send_all(p, topic, [f"s{i}" for i in range(20)])
    cfg = LitePullConsumerConfig(
        group,
        tuple(env.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        auto_commit=False,
    )
    c = LitePullConsumer(cfg)
    await c.start()
    mqs = await c.fetch_message_queues(topic)
    assert set(mqs) == queues(topic, 2)
    c.assign(mqs)
    got = await poll_until(c, 20)
    assert sorted(m.body.decode() for m in got) == sorted(sent)
    assert await c.committed(mqs[0]) == -1  # nothing committed yet
    await c.commit_sync()
    for mq in mqs:
        assert await stored_offset(env, group, mq) == await max_offset(env, mq)
    # seek back: the queue's messages come again, from the start
    await c.seek(mqs[0], 0)
    again = await poll_until(c, await max_offset(env, mqs[0]))
    assert [m.queue_offset for m in again] == list(range(len(again)))
    assert {m.queue_id for m in again} == {0}
    with pytest.raises(ValueError):
        await c.seek(mqs[1], 10_000)
    await c.seek_to_end(mqs[0])
    await c.seek_to_begin(mqs[1])
    assert {m.queue_id for m in await poll_until(c, 1)} == {1}
    await c.commit({mqs[0]: 2})
    assert await stored_offset(env, group, mqs[0]) == 2
    c.pause([mqs[0]])
    c.resume([mqs[0]])
    await c.close()


async def test_lite_pull_subscribe_shares_queues_and_auto_commits(env: Cluster) -> None:
    topic, group = "LSubscribe", "g-lite-subscribe"
    await make_topic(env, topic, 4)

    def member() -> LitePullConsumer:
        cfg = LitePullConsumerConfig(
            group,
            tuple(env.namesrv_addrs),
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            auto_commit_interval_ms=100,
        )
        consumer = LitePullConsumer(cfg)
        consumer.subscribe(topic, "*")
        return consumer

    l1, l2 = member(), member()
    await l1.start()
    await l2.start()
    await until(
        lambda: (
            owned(l1, topic) | owned(l2, topic) == queues(topic, 4)
            and not owned(l1, topic) & owned(l2, topic)
            and bool(owned(l1, topic))
            and bool(owned(l2, topic))
        ),
        "two members sharing four queues",
        20,
    )
    async with producer(env, "lite-subscribe") as p:
        sent = await send_all(p, topic, [f"u{i}" for i in range(40)])
    got: list[str] = []
    deadline = time.monotonic() + 15
    while len(got) < 40:
        assert time.monotonic() < deadline, f"polled {len(got)} of 40"
        for lc in (l1, l2):
            got += [m.body.decode() for m in await lc.poll(100)]
    assert sorted(got) == sorted(sent)
    await asyncio.sleep(0.15)  # a real interval: the auto-commit interval elapses
    for lc in (l1, l2):
        await lc.poll(0)  # the auto commit runs inside poll()
    await l1.close()
    await l2.close()
    for mq in queues(topic, 4):
        assert await stored_offset(env, group, mq) == await max_offset(env, mq)


# ---- blocking wrappers -------------------------------------------------------------------------


def test_sync_consumers(env: Cluster) -> None:
    """The blocking wrappers run their own loop: this test stays synchronous (one asyncio.run
    for the topic, none nested)."""
    topic = "CSync"
    asyncio.run(make_topic(env, topic, 2))
    rec = Recorder()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        assert threading.current_thread().name.startswith("consume-")
        rec.record("push", msgs)
        return ConsumeResult.CONSUME_SUCCESS

    push_cfg = PushConsumerConfig(
        "g-sync-push",
        tuple(env.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    with SyncProducer(ProducerConfig(group="pg-sync", namesrv_addrs=env.namesrv_addrs)) as p:
        sent = [f"z{i}" for i in range(10)]
        for body in sent:
            p.send(Message(topic, body.encode()))
    with SyncPushConsumer(push_cfg, listener) as c:
        c.subscribe(topic)
        until_sync(lambda: set(rec.bodies()) >= set(sent), "every message pushed", 15)
        assert {mq.topic for mq in c.assigned_queues()} >= {topic}
    lite_cfg = LitePullConsumerConfig(
        "g-sync-lite",
        tuple(env.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    with SyncLitePullConsumer(lite_cfg) as lc:
        lc.subscribe(topic)
        got: list[str] = []
        deadline = time.monotonic() + 15
        while len(got) < len(sent):
            assert time.monotonic() < deadline
            got += [m.body.decode() for m in lc.poll(200)]
        lc.commit_sync()
        assert sorted(got) == sorted(sent)


# ---- broker restart ----------------------------------------------------------------------------


async def test_consumer_follows_a_restarted_broker_without_loss(tmp_path: Path) -> None:
    """The broker comes back on another port: pulls fail, the route is asked again, and
    consumption resumes from the offsets the broker kept (SPEC §10.1: no loss)."""
    topic, group = "CBrokerRestart", "g-broker-restart"
    with cluster(tmp_path) as c:
        await make_topic(c, topic, 2)
        rec = Recorder()
        consumer = push(c, group, rec.listener("c"), topic)
        await consumer.start()
        async with producer(c, "restart-1") as p:
            first = await send_all(p, topic, [f"p{i}" for i in range(20)])
        await until(lambda: set(first) <= set(rec.bodies()), "before the restart", 20)
        # in a thread: the consumer keeps running on this loop while the broker restarts
        await asyncio.to_thread(c.broker.stop)
        await asyncio.to_thread(c.restart, c.broker)
        async with producer(c, "restart-2") as p:
            second = await send_all(p, topic, [f"q{i}" for i in range(20)])
        await until(lambda: set(second) <= set(rec.bodies()), "after", 30)
        await consumer.close()
        assert set(rec.bodies()) == set(first + second)
