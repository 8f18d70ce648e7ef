"""TAG and SQL92 filtering end to end (SPEC §6.17), with the rocketq SDK against a real
nameserver and broker started with enablePropertyFilter=true.

- TAG: ``"TagA || TagB"`` gets exactly those, ``"*"`` everything, an untagged message only
  ``"*"``; a hash collision ("Aa" and "BB" share Java's String.hashCode) passes the broker,
  which compares hashes, and is dropped by the client, which compares strings, and the
  consumer's offset still moves past it.
- SQL92 over user properties (numbers compared as numbers, strings, IN, BETWEEN, NOT, IS NULL
  on messages without the property) with push and lite pull consumers; every expected set is
  computed by an independent Python predicate over what was sent.
- A syntax error is refused at subscribe() with its position; the broker refuses it too.
- Filters over a backlog (mostly non-matching messages sent before the consumer starts) and
  under long polling (held pulls woken by non-matching arrivals deliver nothing).
- A broker with enablePropertyFilter=false: an SQL92 consumer gets nothing and says why in
  its log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    ExpressionType,
    LitePullConsumer,
    LitePullConsumerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue, ReceivedMessage, decode_records
from rocketq.sql92 import Sql92Error
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import at_least, until

pytestmark = pytest.mark.integration

BROKER = "broker-a"
FLAG_SUBSCRIPTION = 0x4
SQL = ExpressionType.SQL92
SHORT_HOLD_MS = 1000
"""Long-poll hold for consumers whose offsets a test waits on: a queue's offset moves past
trailing filtered-out messages only when a later pull finds nothing (SPEC §6.8
correctTagsOffset), which a 15 s hold would delay by up to 15 s."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("filtering")
    with cluster(root, broker_keys={"enablePropertyFilter": True}) as c:
        yield c


# ---- helpers ------------------------------------------------------------------------------


async def make_topic(namesrv_addrs: list[str], topic: str, queues: int) -> None:
    async with Admin(namesrv_addrs) as admin:
        results = await admin.create_topic(TopicConfig(topic, queues, queues))
        assert all(r.ok for r in results), results
    await wait_routed(namesrv_addrs, topic, queues)


async def send(namesrv_addrs: list[str], msgs: list[Message], in_order: bool = False) -> None:
    """Send ``msgs``, 32 at a time (stored in any order), or one by one with ``in_order``."""
    cfg = ProducerConfig(group="pg-filtering", namesrv_addrs=namesrv_addrs)
    window = 1 if in_order else 32
    async with Producer(cfg) as p:
        for start in range(0, len(msgs), window):
            await asyncio.gather(*(p.send(m) for m in msgs[start : start + window]))


async def raw_pull(
    addr: str,
    topic: str,
    queue_id: int,
    expression: str,
    kind: common_pb2.ExpressionType.ValueType = common_pb2.TAG,
) -> messaging_pb2.PullResponse:
    async with RawClient(addr) as rc:
        resp: messaging_pb2.PullResponse = await rc.messaging.Pull(
            messaging_pb2.PullRequest(
                consumer_group="filter-raw-reader",
                topic=topic,
                queue_id=queue_id,
                queue_offset=0,
                max_msg_nums=64,
                sys_flag=FLAG_SUBSCRIPTION,
                subscription=expression,
                expression_type=kind,
            ),
            timeout=10,
        )
        return resp


@dataclass
class Bodies:
    """What one consumer received, thread-safe (plain listeners run on a thread pool)."""

    got: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def listener(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        with self.lock:
            self.got += [m.body.decode() for m in msgs]
        return ConsumeResult.CONSUME_SUCCESS

    def snapshot(self) -> list[str]:
        with self.lock:
            return list(self.got)


def push(
    namesrv_addrs: list[str],
    group: str,
    topic: str,
    expression: str,
    kind: ExpressionType,
    bodies: Bodies,
    **kw: object,
) -> PushConsumer:
    cfg = PushConsumerConfig(
        group,
        tuple(namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        **kw,  # type: ignore[arg-type]
    )
    consumer = PushConsumer(cfg, bodies.listener)
    consumer.subscribe(topic, expression, kind)
    return consumer


def at_end(consumer: PushConsumer, topic: str, ends: dict[int, int]) -> Callable[[], bool]:
    want = {MessageQueue(topic, BROKER, q): end for q, end in ends.items()}
    return lambda: consumer.consume_offsets(topic) == want


# ---- TAG ----------------------------------------------------------------------------------


async def test_tag_lists_star_and_untagged_messages(env: Cluster) -> None:
    topic, cycle = "FTags", ["TagA", "TagB", "TagC", ""]
    await make_topic(env.namesrv_addrs, topic, 2)
    sent = [Message(topic, f"t{i}:{cycle[i % 4]}".encode(), tags=cycle[i % 4]) for i in range(48)]
    await send(env.namesrv_addrs, sent)
    bodies = [m.body.decode() for m in sent]
    expected = {
        "TagA || TagB": [b for b in bodies if b.endswith((":TagA", ":TagB"))],
        "TagC": [b for b in bodies if b.endswith(":TagC")],
        "*": bodies,
    }
    got = {expr: Bodies() for expr in expected}
    consumers = [
        push(env.namesrv_addrs, f"g-tags-{i}", topic, expr, ExpressionType.TAG, got[expr])
        for i, expr in enumerate(expected)
    ]
    await asyncio.gather(*(c.start() for c in consumers))
    try:
        for expr, want in expected.items():
            n, bodies_of = len(want), got[expr]
            await until(lambda: len(bodies_of.snapshot()) >= n, expr, 20)  # noqa: B023
        await asyncio.sleep(0.5)  # a quiet interval, deliberately: nothing beyond the expected
    finally:
        await asyncio.gather(*(c.close() for c in consumers))
    for expr, want in expected.items():
        assert sorted(got[expr].snapshot()) == sorted(want), expr
    untagged = [b for b in bodies if b.endswith(":")]
    assert untagged and set(untagged) <= set(got["*"].snapshot())


async def test_tag_hash_collision_passes_the_broker_and_is_dropped_by_the_client(
    env: Cluster,
) -> None:
    topic, group = "FCollision", "g-collision"
    assert codec.tags_hash("Aa") == codec.tags_hash("BB")  # Java's String.hashCode: 2112
    await make_topic(env.namesrv_addrs, topic, 1)
    tags = ["Aa", "BB", "C", "Aa", "BB"]
    await send(
        env.namesrv_addrs,
        [Message(topic, f"c{i}".encode(), tags=t) for i, t in enumerate(tags)],
        in_order=True,
    )
    # The broker compares hashes only: both Aa and BB pass, C does not.
    resp = await raw_pull(env.brokers[0].addr, topic, 0, "Aa")
    assert resp.status == messaging_pb2.FOUND
    assert [m.tags for m in decode_records(resp.records)] == ["Aa", "BB", "Aa", "BB"]
    assert resp.next_begin_offset == 5

    got = Bodies()
    consumer = push(
        env.namesrv_addrs,
        group,
        topic,
        "Aa",
        ExpressionType.TAG,
        got,
        broker_suspend_max_time_ms=SHORT_HOLD_MS,
    )
    async with consumer:
        await until(lambda: len(got.snapshot()) >= 2, "the Aa messages", 15)
        # The offset moves past the dropped BB at the tail, not just past the last Aa.
        await until(at_end(consumer, topic, {0: 5}), "offset past BB", 10)
        # A lone BB arriving later is dropped too, and the offset still moves past it.
        await send(env.namesrv_addrs, [Message(topic, b"c5", tags="BB")])
        await until(at_end(consumer, topic, {0: 6}), "offset past the lone BB", 10)
    assert sorted(got.snapshot()) == ["c0", "c3"]


# ---- SQL92 --------------------------------------------------------------------------------

COLORS = ("red", "green", "blue")


@dataclass(frozen=True)
class Props:
    i: int
    s: str
    a: int | None  # None = the message has no property "a"


def sample_props(n: int) -> list[Props]:
    return [Props(i, COLORS[i % 3], None if i % 5 == 0 else i % 20) for i in range(n)]


def to_message(topic: str, p: Props) -> Message:
    props = {"s": p.s, "n": str(p.i)}
    if p.a is not None:
        props["a"] = str(p.a)
    return Message(topic, f"m{p.i}".encode(), properties=props)


def _a(p: Props, test: Callable[[int], bool]) -> bool:
    """A comparison on ``a``: NULL (no property) is unknown, which never matches."""
    return p.a is not None and test(p.a)


SQL_CASES: dict[str, Callable[[Props], bool]] = {
    "a > 15": lambda p: _a(p, lambda a: a > 15),
    "a BETWEEN 3 AND 5": lambda p: _a(p, lambda a: 3 <= a <= 5),
    "s = 'red'": lambda p: p.s == "red",
    "s IN ('red', 'blue')": lambda p: p.s in ("red", "blue"),
    "s <> 'green' AND a >= 10": lambda p: p.s != "green" and _a(p, lambda a: a >= 10),
    "a IS NULL": lambda p: p.a is None,
    "a IS NOT NULL AND a < 2": lambda p: _a(p, lambda a: a < 2),
    "NOT (a < 10)": lambda p: _a(p, lambda a: not a < 10),
    "a > 15 OR s = 'blue'": lambda p: _a(p, lambda a: a > 15) or p.s == "blue",
    "n >= 50 AND n < 53": lambda p: 50 <= p.i < 53,
}


async def test_sql92_push_consumers_get_exactly_the_matching_messages(env: Cluster) -> None:
    """Ten SQL92 consumer groups read the same backlog of 80 messages (sent before they
    start); each gets exactly what its predicate selects and moves its offsets to the end."""
    topic = "FSql"
    await make_topic(env.namesrv_addrs, topic, 4)
    props = sample_props(80)
    await send(env.namesrv_addrs, [to_message(topic, p) for p in props])
    got = {expr: Bodies() for expr in SQL_CASES}
    consumers = [
        push(
            env.namesrv_addrs,
            f"g-sql-{i}",
            topic,
            expr,
            SQL,
            got[expr],
            broker_suspend_max_time_ms=SHORT_HOLD_MS,
        )
        for i, expr in enumerate(SQL_CASES)
    ]
    ends = await queue_ends(env, topic, 4)
    await asyncio.gather(*(c.start() for c in consumers))
    try:
        for c in consumers:
            await until(at_end(c, topic, ends), f"offsets of {c.subscriptions()}", 30)
        await asyncio.sleep(0.3)  # a quiet interval, deliberately: nothing more may arrive
    finally:
        await asyncio.gather(*(c.close() for c in consumers))
    for expr, wanted in SQL_CASES.items():
        want = sorted(f"m{p.i}" for p in props if wanted(p))
        assert want, expr  # every case selects something
        assert sorted(got[expr].snapshot()) == want, expr


async def queue_ends(c: Cluster, topic: str, queues: int) -> dict[int, int]:
    ends = {}
    async with RawClient(c.broker.addr) as rc:
        for q in range(queues):
            resp = await rc.messaging.GetMaxOffset(
                messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=q), timeout=5
            )
            ends[q] = resp.offset
    return ends


async def test_sql92_lite_pull_consumer(env: Cluster) -> None:
    topic, expr = "FSqlLite", "s IN ('blue') AND a IS NOT NULL"
    await make_topic(env.namesrv_addrs, topic, 2)
    props = sample_props(60)
    await send(env.namesrv_addrs, [to_message(topic, p) for p in props])
    want = sorted(f"m{p.i}" for p in props if p.s == "blue" and p.a is not None)
    cfg = LitePullConsumerConfig(
        "g-sql-lite",
        tuple(env.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer = LitePullConsumer(cfg)
    consumer.subscribe(topic, expr, SQL)
    got: list[ReceivedMessage] = []
    async with consumer:
        deadline = time.monotonic() + 20
        while len(got) < len(want) and time.monotonic() < deadline:
            got += await consumer.poll(500)
        got += await consumer.poll(500)  # nothing more may come
    assert sorted(m.body.decode() for m in got) == want
    assert all(m.properties["s"] == "blue" and "a" in m.properties for m in got)


async def test_sql92_backlog_mostly_not_matching(env: Cluster) -> None:
    """2 000 messages, 1 % matching, sent before the consumer starts: it gets exactly the 20,
    and its offsets reach the end of every queue."""
    topic, group, n = "FSqlBacklog", "g-sql-backlog", 2000
    await make_topic(env.namesrv_addrs, topic, 4)
    msgs = [Message(topic, f"b{i}".encode(), properties={"v": str(i % 100)}) for i in range(n)]
    await send(env.namesrv_addrs, msgs)
    want = sorted(f"b{i}" for i in range(n) if i % 100 == 42)
    ends = await queue_ends(env, topic, 4)
    got = Bodies()
    consumer = push(
        env.namesrv_addrs,
        group,
        topic,
        "v = 42",
        SQL,
        got,
        broker_suspend_max_time_ms=SHORT_HOLD_MS,
    )
    async with consumer:
        await until(at_end(consumer, topic, ends), "offsets at the end", 30)
        await asyncio.sleep(0.3)  # a quiet interval, deliberately: nothing more may arrive
    assert sorted(got.snapshot()) == want


async def test_sql92_under_long_polling(env: Cluster) -> None:
    """While the consumer's pulls are held on the broker, non-matching arrivals deliver
    nothing and a matching one is delivered at once."""
    topic, group = "FSqlHold", "g-sql-hold"
    await make_topic(env.namesrv_addrs, topic, 1)
    arrived: dict[str, float] = {}

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        for m in msgs:
            arrived[m.body.decode()] = time.monotonic()
        return ConsumeResult.CONSUME_SUCCESS

    cfg = PushConsumerConfig(group, tuple(env.namesrv_addrs))
    consumer = PushConsumer(cfg, listener)
    consumer.subscribe(topic, "color = 'red' AND size > 3", SQL)
    async with consumer, RawClient(env.broker.addr) as rc:
        mq = MessageQueue(topic, BROKER, 0)
        await until(lambda: mq in consumer.assigned_queues(), "assignment", 15)
        await until(lambda: at_least(rc.held_pulls(), 1), "the pull to be held")
        checked = await rc.arrivals_checked()
        cfgp = ProducerConfig(group="pg-hold", namesrv_addrs=env.namesrv_addrs)
        async with Producer(cfgp) as p:
            for i, props in enumerate(
                [{"color": "red", "size": "1"}, {"color": "blue", "size": "9"}, {}] * 3
            ):
                await p.send(Message(topic, f"no{i}".encode(), properties=props))
            # the broker checked the arrivals against the held pull and left it held
            await until(lambda: at_least(rc.arrivals_checked(), checked + 1), "arrivals checked")
            assert await rc.held_pulls() >= 1
            assert arrived == {}
            latencies = []
            for i in range(3):
                start = time.monotonic()
                await p.send(
                    Message(topic, f"yes{i}".encode(), properties={"color": "red", "size": "4"})
                )
                body = f"yes{i}"
                await until(lambda: body in arrived, body, 5)  # noqa: B023
                latencies.append(arrived[body] - start)
        await asyncio.sleep(0.3)  # a quiet interval, deliberately: nothing more may arrive
    assert sorted(arrived) == ["yes0", "yes1", "yes2"]
    assert max(latencies) < 1.0, latencies


async def test_sql92_syntax_error_is_refused_at_subscribe_with_its_position(env: Cluster) -> None:
    push_consumer = PushConsumer(
        PushConsumerConfig("g-sql-bad", tuple(env.namesrv_addrs)), Bodies().listener
    )
    with pytest.raises(Sql92Error) as err:
        push_consumer.subscribe("FSqlBad", "a >> 5", SQL)
    assert isinstance(err.value, ValueError)
    assert err.value.position == 3 and "position 3" in str(err.value)
    assert "FSqlBad" not in push_consumer.subscriptions()

    lite = LitePullConsumer(LitePullConsumerConfig("g-sql-bad-lite", tuple(env.namesrv_addrs)))
    for bad in ("s IN ('x'", "a BETWEEN 1", "a = = 1", "(a > 1"):
        with pytest.raises(Sql92Error) as lerr:
            lite.subscribe("FSqlBad", bad, SQL)
        assert 0 <= lerr.value.position <= len(bad), (bad, lerr.value.position)
        assert lerr.value.expression == bad
    await make_topic(env.namesrv_addrs, "FSqlBad", 1)
    with pytest.raises(grpc.aio.AioRpcError) as rpc:
        await raw_pull(env.brokers[0].addr, "FSqlBad", 0, "a >> 5", common_pb2.SQL92)
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "position 3" in (rpc.value.details() or "")


async def test_sql92_on_a_broker_without_property_filter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """enablePropertyFilter=false (the default): SQL92 consumers get nothing, and the reason
    (the broker's refusal naming enablePropertyFilter) is in their log as a WARNING or worse."""
    caplog.set_level(logging.WARNING, logger="rocketq")
    topic = "FSqlOff"
    with cluster(tmp_path, broker_keys={"enablePropertyFilter": False}) as c:
        addrs = c.namesrv_addrs
        await make_topic(addrs, topic, 1)
        await send(addrs, [to_message(topic, p) for p in sample_props(10)])
        got = Bodies()
        consumer = push(addrs, "g-sql-off", topic, "a > 1", SQL, got)
        lite = LitePullConsumer(
            LitePullConsumerConfig(
                "g-sql-off-lite",
                tuple(addrs),
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            )
        )
        lite.subscribe(topic, "a > 1", SQL)
        async with consumer, lite:
            polled = []
            deadline = time.monotonic() + 4  # a real interval: nothing may come in 4 s
            while time.monotonic() < deadline:
                polled += await lite.poll(500)
        assert got.snapshot() == [] and polled == []
    refusals = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "enablePropertyFilter" in r.getMessage()
    ]
    groups = {
        g
        for g in ("g-sql-off-lite", "g-sql-off")
        for r in refusals
        if f"group {g}:" in r.getMessage()
    }
    assert groups == {"g-sql-off", "g-sql-off-lite"}, [r.getMessage() for r in caplog.records]
