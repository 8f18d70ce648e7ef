"""Admin ListDeadLetters / ResendDeadLetter on a real broker (admin.proto, SPEC §6.16).

Dead letters are made the way consumers make them: ConsumerSendBack with delay level -1. One
nameserver and one broker for the module; each test uses its own topic and group names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.codec import Prop
from tests.integration.cluster import ServiceProcess
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient, refused

pytestmark = pytest.mark.integration

PROPS = {Prop.KEYS: "order-7 cust-3", Prop.TAGS: "Paid", "region": "eu"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root: Path = tmp_path_factory.mktemp("dead_letters")
    with cluster(root) as c:
        yield c.broker
        c.check_logs()


class Client(RawClient):
    """Send and ConsumerSendBack shorthands on the raw stubs."""

    async def send(self, topic: str, body: bytes) -> messaging_pb2.SendResult:
        resp = await self.messaging.Send(
            messaging_pb2.SendRequest(
                producer_group="pg",
                default_topic="TBW102",
                messages=[common_pb2.Message(topic=topic, body=body, properties=PROPS)],
            )
        )
        result: messaging_pb2.SendResult = resp.results[0]
        return result

    async def back(self, group: str, offset: int, delay_level: int, **fields: Any) -> None:
        await self.messaging.ConsumerSendBack(
            messaging_pb2.ConsumerSendBackRequest(
                consumer_group=group, commitlog_offset=offset, delay_level=delay_level, **fields
            )
        )


def offset_of(result: messaging_pb2.SendResult) -> int:
    return codec.decode_offset_msg_id(result.offset_msg_id)[1]


async def dead_letters(c: Client, topic: str, group: str, n: int) -> list[str]:
    """Send ``n`` messages to ``topic`` and dead-letter each for ``group``; their ids."""
    ids: list[str] = []
    for i in range(n):
        sent = await c.send(topic, f"dead-{i}".encode())
        await c.back(group, offset_of(sent), -1, origin_topic=topic)
        ids.append(sent.msg_id)
    return ids


async def listing(c: Client, group: str, **fields: int) -> admin_pb2.ListDeadLettersResponse:
    resp: admin_pb2.ListDeadLettersResponse = await c.admin.ListDeadLetters(
        admin_pb2.ListDeadLettersRequest(consumer_group=group, **fields)
    )
    return resp


async def test_list_pages_through_the_dlq(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        ids = await dead_letters(c, "DlOrders", "g-list", 5)
        everything = await listing(c, "g-list")
        assert everything.total == 5 and everything.next_offset == 5
        assert [m.msg_id for m in everything.messages] == ids
        assert [m.queue_offset for m in everything.messages] == [0, 1, 2, 3, 4]
        first = everything.messages[0]
        assert first.message.topic == "%DLQ%g-list" and first.message.body == b"dead-0"
        assert first.reconsume_times == 1
        assert first.message.properties[Prop.RETRY_TOPIC] == "DlOrders"
        assert first.message.properties[Prop.ORIGIN_MESSAGE_ID] == ids[0]
        assert codec.decode_offset_msg_id(first.offset_msg_id)[1] == first.commitlog_offset
        page = await listing(c, "g-list", offset=1, max_num=2)
        assert [m.queue_offset for m in page.messages] == [1, 2] and page.next_offset == 3
        past_end = await listing(c, "g-list", offset=9)
        assert not past_end.messages and past_end.next_offset == 5 and past_end.total == 5
        unknown = await listing(c, "g-never-failed")
        assert not unknown.messages and unknown.total == 0
        for bad in (
            c.admin.ListDeadLetters(admin_pb2.ListDeadLettersRequest(consumer_group="a b")),
            listing(c, "g-list", max_num=0),
            listing(c, "g-list", max_num=257),
            listing(c, "g-list", offset=-1),
        ):
            code, _, _ = await refused(bad)
            assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_resend_puts_a_fresh_copy_in_the_original_topic(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        [orig_id] = await dead_letters(c, "DlResend", "g-resend", 1)
        [dead] = (await listing(c, "g-resend")).messages
        req = admin_pb2.ResendDeadLetterRequest(
            consumer_group="g-resend", offset_msg_id=dead.offset_msg_id
        )
        first = await c.admin.ResendDeadLetter(req)
        second = await c.admin.ResendDeadLetter(req)  # twice sends twice
        assert first.topic == second.topic == "DlResend"
        assert len({first.msg_id, second.msg_id, orig_id}) == 3
        found = await c.messaging.QueryMessageById(
            messaging_pb2.QueryMessageByIdRequest(topic="DlResend", msg_id=first.msg_id)
        )
        [copy] = found.messages
        props = dict(copy.message.properties)
        assert (copy.queue_id, copy.queue_offset) == (first.queue_id, first.queue_offset)
        assert copy.message.body == b"dead-0" and copy.reconsume_times == 0
        assert props[Prop.ORIGIN_MESSAGE_ID] == orig_id
        assert (props[Prop.TAGS], props[Prop.KEYS], props["region"]) == (
            "Paid",
            "order-7 cust-3",
            "eu",
        )
        assert Prop.RETRY_TOPIC not in props and Prop.REAL_TOPIC not in props
        assert (await listing(c, "g-resend")).total == 1  # the DLQ is a log


def bind_resend(c: Client) -> Callable[[str, str], Awaitable[object]]:
    async def resend(group: str, msg_id: str) -> object:
        return await c.admin.ResendDeadLetter(
            admin_pb2.ResendDeadLetterRequest(consumer_group=group, offset_msg_id=msg_id)
        )

    return resend


async def test_resend_refusals(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        await dead_letters(c, "DlGone", "g-gone", 1)
        [dead] = (await listing(c, "g-gone")).messages
        plain = await c.send("DlGone", b"not dead")

        resend = bind_resend(c)
        cases = [
            (resend("g-gone", "xyz"), grpc.StatusCode.INVALID_ARGUMENT),
            (resend("bad group", dead.offset_msg_id), grpc.StatusCode.INVALID_ARGUMENT),
            (resend("g-other", dead.offset_msg_id), grpc.StatusCode.NOT_FOUND),
            (resend("g-gone", plain.offset_msg_id), grpc.StatusCode.NOT_FOUND),
        ]
        for call, code in cases:
            got = await refused(call)
            assert got[0] == code, got
        await c.admin.DeleteTopic(
            admin_pb2.DeleteTopicRequest(
                topic="DlGone", target=admin_pb2.ApplyTarget(broker_name="broker-a")
            )
        )
        got = await refused(resend("g-gone", dead.offset_msg_id))
        assert got[:2] == (grpc.StatusCode.NOT_FOUND, common_pb2.TOPIC_NOT_EXIST), got
