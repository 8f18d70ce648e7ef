"""ConsumerSendBack over a real broker and raw gRPC stubs: dead letters and retries through
the timer topic (SPEC §6.14, §6.16).

One nameserver and one broker for the module; each test uses its own topic and group names.
The dead-letter topic is write-only, so the tests read it the way an operator would: by key,
by unique id and by offset message id, never by pulling.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from typing import Any

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from rocketq.codec import Prop
from rocketq.validation import TIMER_TOPIC
from tests.integration.cluster import ServiceProcess
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient, refused

pytestmark = pytest.mark.integration

BROKER = "broker-a"
PROPS = {Prop.KEYS: "order-7 cust-3", Prop.TAGS: "Paid", "region": "eu"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    with cluster(tmp_path_factory.mktemp("send_back")) as c:
        b = c.broker
        yield b
        assert b.alive(), f"broker died:\n{b.log_tail()}"
        log = b.log_path.read_text(errors="replace")
        assert "Traceback" not in log, f"the broker logged an exception:\n{b.log_tail()}"


class Client(RawClient):
    """The raw client with this module's request shorthands."""

    async def send(self, topic: str, body: bytes, reconsume_times: int = 0) -> Any:
        resp = await self.messaging.Send(
            messaging_pb2.SendRequest(
                producer_group="pg",
                default_topic="TBW102",
                reconsume_times=reconsume_times,
                messages=[common_pb2.Message(topic=topic, body=body, properties=PROPS)],
            )
        )
        return resp.results[0]

    async def back(self, group: str, offset: int, delay_level: int = 0, **fields: Any) -> None:
        await self.messaging.ConsumerSendBack(
            messaging_pb2.ConsumerSendBackRequest(
                consumer_group=group, commitlog_offset=offset, delay_level=delay_level, **fields
            )
        )

    async def by_key(self, topic: str, key: str) -> list[common_pb2.StoredMessage]:
        resp = await self.messaging.QueryMessageByKey(
            messaging_pb2.QueryMessageByKeyRequest(topic=topic, key=key)
        )
        return list(resp.messages)


def offset_of(result: Any) -> int:
    return codec.decode_offset_msg_id(result.offset_msg_id)[1]


async def test_dead_letter_by_delay_level_keeps_the_message(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        sent = await c.send("SbOrders", b"payload-1")
        await c.back(
            "g-dlq", offset_of(sent), -1, origin_msg_id=sent.msg_id, origin_topic="SbOrders"
        )
        dlq = "%DLQ%g-dlq"
        topic = await c.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic=dlq))
        cfg = topic.config
        assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, 2)
        [found] = await c.by_key(dlq, "cust-3")
        props = dict(found.message.properties)
        assert found.message.topic == dlq
        assert found.message.body == b"payload-1"
        assert found.reconsume_times == 1
        assert found.msg_id == sent.msg_id  # the UNIQ_KEY is kept
        assert props[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id
        assert props[Prop.RETRY_TOPIC] == "SbOrders"
        assert (props[Prop.KEYS], props[Prop.TAGS], props["region"]) == (
            "order-7 cust-3",
            "Paid",
            "eu",
        )
        by_id = await c.messaging.QueryMessageById(
            messaging_pb2.QueryMessageByIdRequest(topic=dlq, msg_id=sent.msg_id)
        )
        assert [m.offset_msg_id for m in by_id.messages] == [found.offset_msg_id]
        view = await c.messaging.ViewMessage(
            messaging_pb2.ViewMessageRequest(offset_msg_id=found.offset_msg_id)
        )
        assert view.message.message.body == b"payload-1"
        # The original is untouched.
        orig = await c.messaging.ViewMessage(
            messaging_pb2.ViewMessageRequest(offset_msg_id=sent.offset_msg_id)
        )
        assert orig.message.message.topic == "SbOrders"
        assert orig.message.reconsume_times == 0
        # Write-only: a consumer cannot pull the dead letters.
        code, _, _ = await refused(
            c.messaging.Pull(
                messaging_pb2.PullRequest(
                    consumer_group="g-fresh",
                    topic=dlq,
                    queue_id=0,
                    sys_flag=0x4,
                    subscription="*",
                )
            )
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_dead_letter_when_reconsume_times_exceed_the_max(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        # The request's max: a fresh message (0 reconsumes) with max 0 is a dead letter.
        fresh = await c.send("SbMax", b"fresh")
        await c.back("g-max", offset_of(fresh), 0, max_reconsume_times=0)
        # The group's retryMaxTimes (default 16): a record already reconsumed 16 times.
        tired = await c.send("SbMax", b"tired", reconsume_times=16)
        await c.back("g-max", offset_of(tired), 0)
        found = await c.by_key("%DLQ%g-max", "order-7")
        assert sorted((m.message.body, m.reconsume_times) for m in found) == [
            (b"fresh", 1),
            (b"tired", 17),
        ]
        # A group whose retryMaxTimes is 2, set by an admin.
        await c.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.SubscriptionGroupConfig(group_name="g-max-2", retry_max_times=2),
            )
        )
        two = await c.send("SbMax", b"two", reconsume_times=2)
        await c.back("g-max-2", offset_of(two), 0)
        [m] = await c.by_key("%DLQ%g-max-2", "order-7")
        assert (m.message.body, m.reconsume_times) == (b"two", 3)


async def timer_record(c: Client, msg_id: str) -> list[common_pb2.StoredMessage]:
    """The timer-topic records of one unique id (operators find them the same way)."""
    resp = await c.messaging.QueryMessageById(
        messaging_pb2.QueryMessageByIdRequest(topic=TIMER_TOPIC, msg_id=msg_id)
    )
    return sorted(resp.messages, key=lambda m: m.commitlog_offset)


async def test_retry_goes_through_the_timer_topic(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        sent = await c.send("SbRetry", b"again", reconsume_times=15)
        for level, delay_ms in ((0, 7_200_000), (3, 10_000)):  # 3 + 15 = 18: 2 h
            await c.back("g-retry", offset_of(sent), level, origin_topic="SbRetry")
            timer = (await timer_record(c, sent.msg_id))[-1]
            props = dict(timer.message.properties)
            assert timer.message.topic == TIMER_TOPIC
            assert props[Prop.REAL_TOPIC] == "%RETRY%g-retry"
            assert props[Prop.REAL_QUEUE_ID] == "0"
            assert props[Prop.RETRY_TOPIC] == "SbRetry"
            assert props[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id
            assert props[Prop.TAGS] == "Paid" and props["region"] == "eu"
            assert timer.reconsume_times == 16
            # the broker stamps TIMER_OUT_MS just before storing
            lag_ms = timer.store_timestamp_ms - (int(props[Prop.TIMER_OUT_MS]) - delay_ms)
            assert 0 <= lag_ms < 1000, lag_ms
        retry = await c.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="%RETRY%g-retry"))
        assert (retry.config.write_queue_nums, retry.config.perm) == (1, 6)
        # nothing reached the retry topic or the DLQ yet: the timer-wheel re-puts it
        pulled = await c.messaging.Pull(
            messaging_pb2.PullRequest(
                consumer_group="g-retry",
                topic="%RETRY%g-retry",
                queue_id=0,
                sys_flag=0x4,
                subscription="*",
            )
        )
        assert pulled.max_offset == 0 and not pulled.records
        code, _, _ = await refused(
            c.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="%DLQ%g-retry"))
        )
        assert code == grpc.StatusCode.NOT_FOUND


async def test_bad_send_backs_and_the_broker_survives(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        sent = await c.send("SbBad", b"x")
        offset = offset_of(sent)
        cases: list[tuple[Awaitable[Any], grpc.StatusCode, int]] = [
            (
                c.back("g-bad", offset + 3, -1),
                grpc.StatusCode.NOT_FOUND,
                common_pb2.MESSAGE_NOT_FOUND,
            ),
            (
                c.back("g-bad", 1 << 45, -1),
                grpc.StatusCode.NOT_FOUND,
                common_pb2.MESSAGE_NOT_FOUND,
            ),
            (
                c.back("g-bad", -1, -1),
                grpc.StatusCode.INVALID_ARGUMENT,
                common_pb2.ILLEGAL_ARGUMENT,
            ),
            (
                c.back("", offset, -1),
                grpc.StatusCode.INVALID_ARGUMENT,
                common_pb2.ILLEGAL_ARGUMENT,
            ),
            (
                c.back("bad group!", offset, -1),
                grpc.StatusCode.INVALID_ARGUMENT,
                common_pb2.ILLEGAL_ARGUMENT,
            ),
        ]
        for call, code, reason in cases:
            got = await refused(call)
            assert got[:2] == (code, reason), got
        await c.set_config("autoCreateSubscriptionGroup", "false")
        try:
            got = await refused(c.back("g-unknown", offset, -1))
            assert got[:2] == (
                grpc.StatusCode.NOT_FOUND,
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
            )
        finally:
            await c.set_config("autoCreateSubscriptionGroup", "true")
        await c.back("g-bad", offset, -1)  # still serving
        assert len(await c.by_key("%DLQ%g-bad", "cust-3")) == 1
