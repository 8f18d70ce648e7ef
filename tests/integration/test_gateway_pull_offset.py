"""The v2 pull consumer's RPCs on the gateway: PullMessage, UpdateOffset, GetOffset, QueryOffset.

No official SDK's public API uses them, so the test is the protocol itself: raw v2 calls with
the gateway's own generated classes against one broker of ``cluster(gateway=True)`` (its gateway
on a free port of its own). Each test has its own topic and group.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("gwpull"), gateway=True) as c:
        yield c
        c.check_logs()


@pytest.fixture
async def stub(gw: Cluster) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
        yield svc_grpc.MessagingServiceStub(channel)


async def make_topic(c: Cluster, topic: str, queues: int = 1) -> None:
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
                ),
            )
        )


def queue(topic: str, qid: int = 0, broker: str = "") -> Any:
    mq = v2.MessageQueue(topic=v2.Resource(name=topic), id=qid)
    if broker:
        mq.broker.name = broker
    return mq


async def send(stub: Any, topic: str, bodies: list[bytes], tag: str = "TagA") -> None:
    messages = [
        v2.Message(
            topic=v2.Resource(name=topic),
            body=body,
            system_properties=v2.SystemProperties(
                tag=tag, message_id=f"{topic}-{tag}-{i}", message_type=v2.NORMAL
            ),
        )
        for i, body in enumerate(bodies)
    ]
    out = await stub.SendMessage(svc.SendMessageRequest(messages=messages), timeout=CALL_TIMEOUT_S)
    assert out.status.code == v2.OK, out.status


async def pull(
    stub: Any,
    group: str,
    mq: Any,
    offset: int,
    *,
    batch: int = 0,
    poll_s: int = 0,
    tags: str = "",
    sql: str = "",
) -> tuple[Any, list[Any], int | None]:
    """(status, messages, next_offset) of one PullMessage stream."""
    req = svc.PullMessageRequest(
        group=v2.Resource(name=group),
        message_queue=mq,
        offset=offset,
        batch_size=batch,
        long_polling_timeout=duration_pb2.Duration(seconds=poll_s),
    )
    if tags:
        req.filter_expression.CopyFrom(v2.FilterExpression(type=v2.TAG, expression=tags))
    if sql:
        req.filter_expression.CopyFrom(v2.FilterExpression(type=v2.SQL, expression=sql))
    frames = [f async for f in stub.PullMessage(req, timeout=CALL_TIMEOUT_S)]
    assert frames[0].WhichOneof("content") == "status", frames
    messages = [f.message for f in frames if f.WhichOneof("content") == "message"]
    nexts = [f.next_offset for f in frames if f.WhichOneof("content") == "next_offset"]
    return frames[0].status, messages, (nexts[-1] if nexts else None)


async def query(
    stub: Any, topic: str, policy: int, at: timestamp_pb2.Timestamp | None = None
) -> Any:
    req = svc.QueryOffsetRequest(message_queue=queue(topic), query_offset_policy=policy)
    if at is not None:
        req.timestamp.CopyFrom(at)
    return await stub.QueryOffset(req, timeout=CALL_TIMEOUT_S)


async def test_pull_consumer_reads_by_offset_and_keeps_its_position_on_the_broker(
    gw: Cluster, stub: Any
) -> None:
    topic, group = "V2Pull", "v2-puller"
    await make_topic(gw, topic)
    await send(stub, topic, [b"p0", b"p1"], tag="TagA")
    await send(stub, topic, [b"p2"], tag="TagB")

    begin, end = await query(stub, topic, v2.BEGINNING), await query(stub, topic, v2.END)
    assert (begin.status.code, begin.offset, end.status.code, end.offset) == (v2.OK, 0, v2.OK, 3)

    st, first, nxt = await pull(stub, group, queue(topic, broker="broker-a"), 0, batch=2)
    assert st.code == v2.OK and nxt == 2
    assert [m.body for m in first] == [b"p0", b"p1"]
    assert [m.system_properties.queue_offset for m in first] == [0, 1]
    assert first[0].system_properties.tag == "TagA"
    assert first[0].system_properties.body_digest.checksum == hashlib.md5(b"p0").hexdigest().upper()

    # A tag filter skips what does not match; next_offset moves past it all the same.
    st, tagged, nxt = await pull(stub, group, queue(topic), 0, tags="TagB")
    assert st.code == v2.OK and [m.body for m in tagged] == [b"p2"] and nxt == 3

    st, none, nxt = await pull(stub, group, queue(topic), 3)
    assert (st.code, none, nxt) == (v2.MESSAGE_NOT_FOUND, [], 3)

    # The group's position: none yet, then what it stored (GetOffset reads it back).
    offset_req = svc.GetOffsetRequest(group=v2.Resource(name=group), message_queue=queue(topic))
    missing = await stub.GetOffset(offset_req, timeout=CALL_TIMEOUT_S)
    assert missing.status.code == v2.OFFSET_NOT_FOUND, missing.status
    updated = await stub.UpdateOffset(
        svc.UpdateOffsetRequest(
            group=v2.Resource(name=group), message_queue=queue(topic), offset=2
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert updated.status.code == v2.OK, updated.status
    got = await stub.GetOffset(offset_req, timeout=CALL_TIMEOUT_S)
    assert (got.status.code, got.offset) == (v2.OK, 2)

    # A long poll at the end is answered by the next message sent.
    waiting = asyncio.create_task(pull(stub, group, queue(topic), 3, poll_s=15))
    await asyncio.sleep(0)  # the task has sent its request before the message goes out
    await send(stub, topic, [b"p3"], tag="TagA")
    st, late, nxt = await waiting
    if st.code == v2.MESSAGE_NOT_FOUND:  # the send beat the pull's registration: read it now
        st, late, nxt = await pull(stub, group, queue(topic), 3)
    assert st.code == v2.OK and [m.body for m in late] == [b"p3"] and nxt == 4

    # TIMESTAMP: the first offset stored at or after the time (the start of time: offset 0).
    at = await query(stub, topic, v2.TIMESTAMP, timestamp_pb2.Timestamp(seconds=0))
    assert (at.status.code, at.offset) == (v2.OK, 0)


async def test_bad_pull_and_offset_requests_get_the_protocol_status(gw: Cluster, stub: Any) -> None:
    topic, group = "V2PullBad", "v2-pull-bad"
    await make_topic(gw, topic, queues=2)
    await send(stub, topic, [b"x"])

    async def pull_code(group: str, mq: Any, offset: int, **kw: Any) -> int:
        st, _, _ = await pull(stub, group, mq, offset, **kw)
        return int(st.code)

    assert await pull_code(group, queue("NoSuchTopic"), 0) == v2.TOPIC_NOT_FOUND
    assert await pull_code(group, queue(topic, 7), 0) == v2.BAD_REQUEST
    assert await pull_code(group, queue(topic, broker="broker-z"), 0) == v2.BAD_REQUEST
    assert await pull_code(group, queue(topic), -1) == v2.ILLEGAL_OFFSET
    assert await pull_code(group, queue(topic), 0, batch=5000) == v2.BAD_REQUEST
    assert await pull_code(group, queue(topic), 0, poll_s=30) == v2.ILLEGAL_POLLING_TIME
    assert await pull_code("", queue(topic), 0) == v2.ILLEGAL_CONSUMER_GROUP
    assert await pull_code(group, queue(topic), 0, sql="a >>> (") == v2.ILLEGAL_FILTER_EXPRESSION

    # Far past the end: ILLEGAL_OFFSET, and next_offset is a valid place to go on from.
    begin = (await query(stub, topic, v2.BEGINNING)).offset
    end = (await query(stub, topic, v2.END)).offset
    st, _, nxt = await pull(stub, group, queue(topic), 1_000)
    assert st.code == v2.ILLEGAL_OFFSET and nxt is not None and begin <= nxt <= end, (st, nxt)

    # An offset beyond the queue's end is stored as the end, never past it.
    mq = queue(topic)
    update = svc.UpdateOffsetRequest(group=v2.Resource(name=group), message_queue=mq, offset=2**62)
    assert (await stub.UpdateOffset(update, timeout=CALL_TIMEOUT_S)).status.code == v2.OK
    got = await stub.GetOffset(
        svc.GetOffsetRequest(group=v2.Resource(name=group), message_queue=mq),
        timeout=CALL_TIMEOUT_S,
    )
    assert got.offset == end
    update.offset = -5
    assert (
        await stub.UpdateOffset(update, timeout=CALL_TIMEOUT_S)
    ).status.code == v2.ILLEGAL_OFFSET

    # QueryOffset: TIMESTAMP needs a time; an unknown topic is named as such.
    assert (await query(stub, topic, v2.TIMESTAMP)).status.code == v2.BAD_REQUEST
    assert (await query(stub, "NoSuchTopic", v2.END)).status.code == v2.TOPIC_NOT_FOUND
