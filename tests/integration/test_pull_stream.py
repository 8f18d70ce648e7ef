"""Messaging.PullStream against a real broker: a consumer's pulls of every queue go down one
stream per broker and read what unary Pulls read; a pull held for new messages holds up no other
request of the stream; refusals are answered on the stream, which goes on; a client walking away
releases its held pulls; a server without the RPC gets unary Pulls (issue 16)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client._request_stream import PULL, RequestStreams
from rocketq.client.consumer import (
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.consumer._api import BrokerApi
from rocketq.client.errors import ServerError, detail_of
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue, decode_records
from tests.integration.test_producer import create_topic
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "PullStreamed"
QUEUES = 4
PER_QUEUE = 30
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("pullstream")) as c:
        asyncio.run(_fill(c))
        yield c


async def _fill(c: Cluster) -> None:
    """The topic, with PER_QUEUE messages in each queue but the last (left empty for holds)."""
    await create_topic(c.broker.addr, "broker-a", TOPIC, QUEUES)
    await wait_routed(c.namesrv_addrs, TOPIC, QUEUES)
    async with Producer(ProducerConfig("pg_fill", c.namesrv_addrs)) as p:
        for q in range(QUEUES - 1):
            batch = [Message(TOPIC, b"q%d-%d" % (q, i), tags="t") for i in range(PER_QUEUE)]
            await p.send_batch(batch, queue=MessageQueue(TOPIC, "broker-a", q))


def pull(queue_id: int, offset: int = 0, *, hold_ms: int = 0, **kw: Any) -> Any:
    return messaging_pb2.PullRequest(
        consumer_group=kw.pop("group", "g_raw"),
        topic=kw.pop("topic", TOPIC),
        queue_id=queue_id,
        queue_offset=offset,
        sys_flag=FLAG_SUBSCRIPTION | (FLAG_SUSPEND if hold_ms else 0),
        suspend_timeout_ms=hold_ms,
        subscription="*",
        expression_type=common_pb2.TAG,
        **kw,
    )


async def _consume_all(one: Cluster, group: str, *, streamed: bool) -> set[Any]:
    """Every message a push consumer of ``group`` reads, as (queue, offset, body); its pulls
    go down a stream to the broker, or unary."""
    got: set[Any] = set()

    async def listener(msgs: list[Any], _ctx: Any) -> ConsumeResult:
        got.update((m.queue_id, m.queue_offset, m.body) for m in msgs)
        return ConsumeResult.CONSUME_SUCCESS

    config = PushConsumerConfig(
        group,
        one.namesrv_addrs,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        pull_stream=streamed,
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe(TOPIC)
    async with consumer:
        await until(lambda: len(got) >= PER_QUEUE * (QUEUES - 1), f"{group} read everything")
        assert consumer._api is not None
        streams = consumer._api._pull_streams
        assert (streams.open_addrs() if streams else []) == ([one.broker.addr] if streamed else [])
    return got


async def test_consumers_down_the_stream_and_unary_read_the_same_messages(one: Cluster) -> None:
    streamed = await _consume_all(one, "g_stream", streamed=True)
    unary = await _consume_all(one, "g_unary", streamed=False)
    assert streamed == unary
    assert {(q, off) for q, off, _ in streamed} == {
        (q, off) for q in range(QUEUES - 1) for off in range(PER_QUEUE)
    }


async def test_a_held_pull_holds_up_no_other_request_of_the_stream(one: Cluster) -> None:
    empty = QUEUES - 1
    async with RawClient(one.broker.addr) as raw:
        end = await _end_of(raw, empty)
        call = raw.messaging.PullStream()
        await call.write(
            messaging_pb2.PullStreamRequest(id=1, request=pull(empty, end, hold_ms=20_000))
        )
        await call.write(messaging_pb2.PullStreamRequest(id=2, request=pull(0, max_msg_nums=5)))
        first = await call.read()
        assert first.id == 2 and first.response.status == messaging_pb2.FOUND
        assert [m.body for m in decode_records(first.response.records)] == [
            b"q0-%d" % i for i in range(5)
        ]
        await until(raw.held_pulls, "the broker holds pull 1")
        async with Producer(ProducerConfig("pg_wake", one.namesrv_addrs)) as p:
            await p.send(
                Message(TOPIC, b"wakes pull 1"), queue=MessageQueue(TOPIC, "broker-a", empty)
            )
        second = await call.read()
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    assert second.id == 1 and second.response.status == messaging_pb2.FOUND
    assert [m.body for m in decode_records(second.response.records)] == [b"wakes pull 1"]


async def test_refusals_are_answered_on_the_stream_as_pull_ends_with_them(one: Cluster) -> None:
    requests = {
        1: pull(1, max_msg_nums=3),
        2: pull(1, topic="NoSuchTopic"),
        3: pull(99),
        4: pull(1, max_msg_nums=5000),
        5: pull(2, max_msg_nums=3),
    }
    async with RawClient(one.broker.addr) as raw:
        unary: dict[int, tuple[grpc.StatusCode, common_pb2.ErrorDetail | None]] = {}
        for rid in (2, 3, 4):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw.messaging.Pull(requests[rid], timeout=10)
            unary[rid] = (err.value.code(), detail_of(err.value))
        call = raw.messaging.PullStream()
        for rid, req in requests.items():
            await call.write(messaging_pb2.PullStreamRequest(id=rid, request=req))
        await call.done_writing()
        answers = {a.id: a async for a in call}
        assert await call.code() == grpc.StatusCode.OK, "refusals do not end the stream"
    assert sorted(answers) == [1, 2, 3, 4, 5]
    for rid, queue in ((1, 1), (5, 2)):
        bodies = [m.body for m in decode_records(answers[rid].response.records)]
        assert bodies == [b"q%d-%d" % (queue, i) for i in range(3)]
    for rid, (code, detail) in unary.items():
        error = answers[rid].error
        assert not answers[rid].HasField("response")
        assert (error.code, error.detail) == (code.value[0], detail), rid
    assert unary[4][0] == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_client_walking_away_releases_its_held_pulls(one: Cluster) -> None:
    async with RawClient(one.broker.addr) as raw:
        end = await _end_of(raw, QUEUES - 1)
        call = raw.messaging.PullStream()
        for rid in range(1, 4):
            req = pull(QUEUES - 1, end, hold_ms=20_000, group=f"g_walk{rid}")
            await call.write(messaging_pb2.PullStreamRequest(id=rid, request=req))
        await until(_held(raw, 3), "the broker holds the stream's 3 pulls")
        call.cancel()
        await until(_held(raw, 0), "the held pulls released")
        answer = await raw.messaging.Pull(pull(0, max_msg_nums=1), timeout=5)
    assert answer.status == messaging_pb2.FOUND
    one.check_logs()


def _held(raw: RawClient, count: int) -> Callable[[], Awaitable[bool]]:
    async def held() -> bool:
        return await raw.held_pulls() == count

    return held


async def _end_of(raw: RawClient, queue_id: int) -> int:
    req = messaging_pb2.GetMaxOffsetRequest(topic=TOPIC, queue_id=queue_id)
    return int((await raw.messaging.GetMaxOffset(req, timeout=5)).offset)


def _api(raw: RawClient, streams: RequestStreams) -> BrokerApi:
    """The consumer's broker calls, made through ``raw``'s channel."""
    instance = SimpleNamespace(messaging=lambda _addr: raw.messaging)
    return BrokerApi(cast(Any, instance), "g_api", 3000, streams)


async def test_a_held_pull_is_answered_before_the_client_gives_up(one: Cluster) -> None:
    """A unary pull's hold ends before its deadline; a stream request has none, so the client
    asks for a hold that ends before it stops waiting."""
    empty = QUEUES - 1
    async with RawClient(one.broker.addr) as raw:
        end = await _end_of(raw, empty)
        api = _api(raw, RequestStreams(lambda _addr: raw.messaging, PULL))
        held = pull(empty, end, hold_ms=20_000, group="g_short")
        answer = await api.pull(one.broker.addr, held, 1000)
        await api.close()
    assert answer.status == messaging_pb2.NO_NEW_MSG


async def test_a_full_stream_sends_the_next_pull_unary(one: Cluster) -> None:
    """Pulls the client gave up on still count until the broker answers them: the broker holds
    them, and a stream whose requests all wait behind holds would hold up the next pull."""
    empty = QUEUES - 1
    async with RawClient(one.broker.addr) as raw:
        end = await _end_of(raw, empty)
        streams = RequestStreams(
            lambda _addr: raw.messaging, dataclasses.replace(PULL, pending_max=2)
        )
        api = _api(raw, streams)
        addr = one.broker.addr
        holds = [
            asyncio.create_task(
                api.pull(addr, pull(empty, end, hold_ms=20_000, group=f"g_full{i}"), 30_000)
            )
            for i in range(2)
        ]
        await until(_held(raw, 2), "the broker holds both pulls of the stream")
        found = await api.pull(addr, pull(0, max_msg_nums=2), 3000)  # unary: the stream is full
        assert found.status == messaging_pb2.FOUND and streams.in_flight(addr) == 2
        for task in holds:
            task.cancel()
        await asyncio.gather(*holds, return_exceptions=True)
        assert streams.in_flight(addr) == 2, "given up on, but still held by the broker"
        async with Producer(ProducerConfig("pg_full", one.namesrv_addrs)) as p:
            await p.send(
                Message(TOPIC, b"ends the holds"), queue=MessageQueue(TOPIC, "broker-a", empty)
            )
        await until(lambda: streams.in_flight(addr) == 0, "the late answers counted off")
        await api.close()


async def test_a_server_without_pull_stream_is_sent_unary_pulls(one: Cluster) -> None:
    """The nameserver serves no Messaging: the stream is refused UNIMPLEMENTED, the pull goes
    as a unary Pull (refused the same way: the error a unary call raises), and that address
    gets unary Pulls from then on."""
    async with RawClient(one.nameserver.addr) as raw:
        streams = RequestStreams(lambda _addr: raw.messaging, PULL)
        api = _api(raw, streams)
        with pytest.raises(ServerError) as err:
            await api.pull(one.nameserver.addr, pull(0), 3000)
        assert err.value.code == "UNIMPLEMENTED"
        assert not streams.usable(one.nameserver.addr)
        await api.close()
