"""Messaging.SendStream against a real broker: a producer's sends go down one stream per broker
and get what a unary Send gets, refusals included; a stalled broker times a request out while
the stream serves the next; a server without the RPC gets unary calls (issue 16)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client._request_stream import SEND, RequestStreams
from rocketq.client.errors import (
    MessageTooLargeError,
    RequestTimeoutError,
    RocketQError,
    ServerError,
    detail_of,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.client.producer._sender import SendHandler, build_send_request, prepare_batch
from rocketq.message import Message, MessageQueue
from tests.integration.test_producer import assert_stored, create_topic, pull_queue
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.integration

TOPIC = "Streamed"


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(
        tmp_path_factory.mktemp("stream"), broker_keys={"autoCreateTopicEnable": False}
    ) as c:
        asyncio.run(_make_topic(c))
        yield c


async def _make_topic(c: Cluster) -> None:
    await create_topic(c.broker.addr, "broker-a", TOPIC, 4)
    await wait_routed(c.namesrv_addrs, TOPIC, 4)


def _streams(p: Producer) -> RequestStreams:
    streams = p._core._send_handler()._streams
    assert streams is not None
    return streams


async def test_sends_down_the_stream_are_stored_as_unary_sends_are(one: Cluster) -> None:
    cfg = ProducerConfig("pg_stream", one.namesrv_addrs)
    async with (
        Producer(cfg) as p,
        Producer(dataclasses.replace(cfg, group="pg_unary", send_stream=False)) as u,
    ):
        sent = []
        for producer in (p, u, p):
            q = MessageQueue(TOPIC, "broker-a", 1)
            batch = [Message(TOPIC, b"b%d" % i, tags="t") for i in range(40)]
            sent += zip(await producer.send_batch(batch, queue=q), batch, strict=True)
            lone = Message(TOPIC, b"lone", keys=["k"])
            sent.append((await producer.send(lone, queue=q), lone))
        assert _streams(p).open_addrs() == [one.broker.addr]
        assert u._core._send_handler()._streams is None
    stored = await pull_queue(one.broker.addr, TOPIC, 1)
    assert [m.queue_offset for m in stored] == list(range(len(sent)))
    for (result, msg), got in zip(sent, stored, strict=True):
        got.broker_name = "broker-a"
        assert_stored(result, got, msg.body)
        assert result.msg_id == got.msg_id


def _records(topic: str, count: int, *, crc_ok: bool = True) -> bytes:
    items = prepare_batch(
        [Message(topic, b"r%d" % i) for i in range(count)],
        create_topic_key="TBW102",
        max_size_bytes=1 << 20,
    )
    req = build_send_request("pg", MessageQueue(topic, "broker-a", 2), items, as_records=True)
    raw = bytearray(req.records)
    if not crc_ok:
        raw[codec.FIXED_BYTES_V4 + 4] ^= 0xFF  # record 0's first body byte
    return bytes(raw)


async def test_refusals_are_answered_on_the_stream_as_send_ends_with_them(one: Cluster) -> None:
    requests = {
        1: messaging_pb2.SendRequest(queue_id=2, records=_records(TOPIC, 3), compact_response=True),
        2: messaging_pb2.SendRequest(queue_id=2, records=_records(TOPIC, 3, crc_ok=False)),
        3: messaging_pb2.SendRequest(queue_id=2, records=_records("NoSuchTopic", 2)),
        4: messaging_pb2.SendRequest(queue_id=9, records=_records(TOPIC, 2)),
        5: messaging_pb2.SendRequest(queue_id=2, records=_records(TOPIC, 2)),
    }
    async with RawClient(one.broker.addr) as raw:
        before = len(await pull_queue(one.broker.addr, TOPIC, 2))
        unary: dict[int, tuple[grpc.StatusCode, common_pb2.ErrorDetail | None]] = {}
        for rid in (2, 3, 4):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw.messaging.Send(requests[rid], timeout=10)
            unary[rid] = (err.value.code(), detail_of(err.value))
        call = raw.messaging.SendStream()
        for rid, req in requests.items():
            await call.write(messaging_pb2.SendStreamRequest(id=rid, request=req))
        await call.done_writing()
        answers = {a.id: a async for a in call}
        assert await call.code() == grpc.StatusCode.OK, "refusals do not end the stream"
    assert sorted(answers) == [1, 2, 3, 4, 5]
    assert answers[1].response.batch.first_queue_offset == before
    assert len(answers[1].response.batch.physical_offsets) == 3
    assert len(answers[5].response.results) == 2
    for rid, (code, detail) in unary.items():
        error = answers[rid].error
        assert not answers[rid].HasField("response")
        assert (error.code, error.detail) == (code.value[0], detail), rid
    assert "BODYCRC" in answers[2].error.detail.message
    assert answers[3].error.detail.reason == common_pb2.TOPIC_NOT_EXIST
    stored = await pull_queue(one.broker.addr, TOPIC, 2)
    assert len(stored) == before + 5, "a refused request stored something"


async def test_a_stalled_broker_times_out_a_request_and_the_stream_serves_the_next(
    one: Cluster,
) -> None:
    cfg = ProducerConfig("pg_stall", one.namesrv_addrs, retry_times_when_send_failed=0)
    async with Producer(cfg) as p:
        q = MessageQueue(TOPIC, "broker-a", 3)
        await p.send(Message(TOPIC, b"first"), queue=q)
        one.broker.pause()
        try:
            with pytest.raises(RequestTimeoutError, match="Deadline Exceeded"):
                await p.send(Message(TOPIC, b"stalled"), queue=q, timeout_ms=300)
        finally:
            one.broker.resume()
        last = await p.send(Message(TOPIC, b"after"), queue=q)
        assert _streams(p).open_addrs() == [one.broker.addr], "the stream outlived the timeout"
    stored = await pull_queue(one.broker.addr, TOPIC, 3)
    assert stored[-1].body == b"after" and stored[-1].queue_offset == last.queue_offset


async def test_a_server_without_send_stream_is_sent_unary_calls(one: Cluster) -> None:
    """The nameserver serves no Messaging: the stream is refused UNIMPLEMENTED, the request
    goes as a unary Send (refused the same way: the error a unary call raises), and that
    address gets unary calls from then on."""
    async with RawClient(one.nameserver.addr) as raw:
        streams = RequestStreams(lambda _addr: raw.messaging, SEND)
        handler = SendHandler(lambda _addr: raw.messaging, streams)
        req = messaging_pb2.SendRequest(queue_id=0, records=_records(TOPIC, 2))
        mq = MessageQueue(TOPIC, "broker-a", 0)
        with pytest.raises(ServerError) as err:
            await handler.send(one.nameserver.addr, mq, req, 3000, ["a", "b"])
        assert err.value.code == "UNIMPLEMENTED"
        assert not streams.usable(one.nameserver.addr)
        await handler.close()


async def test_a_client_that_walks_away_mid_stream_leaves_the_broker_serving(one: Cluster) -> None:
    async with RawClient(one.broker.addr) as raw:
        call = raw.messaging.SendStream()
        for rid in range(1, 21):
            req = messaging_pb2.SendRequest(queue_id=0, records=_records(TOPIC, 50))
            await call.write(messaging_pb2.SendStreamRequest(id=rid, request=req))
        call.cancel()
    cfg = ProducerConfig("pg_after_walkaway", one.namesrv_addrs)
    async with Producer(cfg) as p:
        result = await p.send(
            Message(TOPIC, b"still serving"), queue=MessageQueue(TOPIC, "broker-a", 0)
        )
    stored = await pull_queue(one.broker.addr, TOPIC, 0)
    [after] = [m for m in stored if m.body == b"still serving"]
    assert after.queue_offset == result.queue_offset
    assert len(stored) % 50 == 1, "a request of the walked-away stream was half stored"
    one.check_logs()


async def test_a_refusal_raises_the_same_error_down_the_stream_as_unary(one: Cluster) -> None:
    """The broker refuses what the producer let through (its maxMessageSize is lowered at
    run time): both producers raise the same SDK error, class, text and reason."""
    cfg = ProducerConfig("pg_refused", one.namesrv_addrs, retry_times_when_send_failed=0)
    q = MessageQueue(TOPIC, "broker-a", 0)
    raised: list[RocketQError] = []
    async with RawClient(one.broker.addr) as raw:
        await raw.set_config("maxMessageSize", "2048")
        try:
            for stream in (True, False):
                async with Producer(dataclasses.replace(cfg, send_stream=stream)) as p:
                    with pytest.raises(MessageTooLargeError) as err:
                        await p.send_batch([Message(TOPIC, b"x" * 1000)] * 3, queue=q)
                    raised.append(err.value)
        finally:
            await raw.set_config("maxMessageSize", str(4 * 1024 * 1024))
    down_stream, unary = raised
    assert unary.code == "INVALID_ARGUMENT", "refused by the broker, not the producer"
    assert str(down_stream) == str(unary) and "maxMessageSize" in str(unary)
    assert (down_stream.code, down_stream.reason, down_stream.metadata) == (
        unary.code, unary.reason, unary.metadata,
    )  # fmt: skip


async def test_a_corrupt_frame_ends_the_stream_after_the_answers_before_it(one: Cluster) -> None:
    good = messaging_pb2.SendStreamRequest(
        id=7, request=messaging_pb2.SendRequest(queue_id=0, records=_records(TOPIC, 4))
    )
    async with RawClient(one.broker.addr) as raw:
        call = raw.channel.stream_stream(
            "/rocketq.v1.Messaging/SendStream",
            request_serializer=lambda frame: frame,
            response_deserializer=messaging_pb2.SendStreamResponse.FromString,
        )(iter([good.SerializeToString(), b"\x00"]))
        answers = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for answer in call:
                answers.append(answer)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid protobuf message" in (err.value.details() or "")
    assert [a.id for a in answers] == [7] and len(answers[0].response.results) == 4
    one.check_logs()
