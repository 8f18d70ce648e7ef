"""ConsumerSendBack on a real store: dead letters, retries through the timer topic, checks
(SPEC §6.14, §6.16)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.codec import Prop
from rocketq.validation import PERM_READ, PERM_WRITE
from services.broker.model import SubscriptionGroupConfig
from services.broker.send_back import SendBackProcessor
from services.common.errors import ServiceError
from services.store.message_store import GetStatus
from tests.unit._broker_parts import PEER, BrokerParts, send_request

pytestmark = pytest.mark.unit

TOPIC = "Orders"
GROUP = "cg"
DLQ = "%DLQ%cg"
RETRY = "%RETRY%cg"
TIMER = "rmq_sys_wheel_timer"


class Parts(BrokerParts):
    def __init__(self, root: Path, **config: object) -> None:
        super().__init__(root, **config)  # type: ignore[arg-type]
        self.backs = SendBackProcessor(
            config=self.config,
            store=self.store,
            topics=self.topics,
            groups=self.groups,
            clock=self.clock,
        )

    async def send(self, topic: str = TOPIC, reconsume_times: int = 0) -> messaging_pb2.SendResult:
        props = {Prop.KEYS: "order-1 k2", Prop.TAGS: "TagA", "user": "u1"}
        req = send_request(topic, [b"body-1"], properties=props, reconsume_times=reconsume_times)
        return (await self.sender.send(req, PEER)).results[0]

    def offset_of(self, result: messaging_pb2.SendResult) -> int:
        _host, offset = codec.decode_offset_msg_id(result.offset_msg_id)
        return offset

    async def back(self, offset: int, delay_level: int = 0, **fields: object) -> None:
        req = messaging_pb2.ConsumerSendBackRequest(
            consumer_group=fields.pop("group", GROUP),  # type: ignore[arg-type]
            commitlog_offset=offset,
            delay_level=delay_level,
            **fields,  # type: ignore[arg-type]
        )
        await self.backs.send_back(req)

    def timer_records(self) -> list[codec.Record]:
        """Every record of the timer topic, by commitlog offset."""
        out: list[codec.Record] = []
        for qid in range(self.config.timer_topic_queue_nums):
            got = self.store.get_messages(TIMER, qid, 0, 64)
            out += [codec.decode_record(r) for r in got.records]
        return sorted(out, key=lambda r: r.physical_offset)

    def dlq_records(self) -> list[codec.Record]:
        got = self.store.get_messages(DLQ, 0, 0, 32)
        if got.status is not GetStatus.FOUND:
            return []
        return [codec.decode_record(r) for r in got.records]


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    p = Parts(tmp_path)
    p.create_topic(TOPIC)
    try:
        yield p
    finally:
        p.close()


def code_of(exc: pytest.ExceptionInfo[ServiceError]) -> tuple[grpc.StatusCode, int]:
    return exc.value.code, exc.value.reason


async def test_delay_level_below_zero_goes_to_dlq(parts: Parts) -> None:
    sent = await parts.send()
    await parts.back(
        parts.offset_of(sent), delay_level=-1, origin_msg_id="ignored", origin_topic=TOPIC
    )
    dlq = parts.topics.get(DLQ)
    assert dlq is not None
    assert (dlq.read_queue_nums, dlq.write_queue_nums, dlq.perm, dlq.topic_sys_flag) == (
        1,
        1,
        PERM_WRITE,
        0,
    )
    [rec] = parts.dlq_records()
    original = parts.store.read_record(parts.offset_of(sent))
    assert original is not None
    assert rec.topic == DLQ and rec.queue_id == 0
    assert rec.body == b"body-1"
    assert rec.reconsume_times == 1
    assert rec.born_timestamp_ms == original.born_timestamp_ms
    assert rec.born_host == original.born_host
    assert rec.properties[Prop.RETRY_TOPIC] == TOPIC
    assert rec.properties[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id
    assert rec.properties[Prop.UNIQ_KEY] == sent.msg_id
    assert rec.properties[Prop.KEYS] == "order-1 k2"
    assert rec.properties[Prop.TAGS] == "TagA"
    assert rec.properties["user"] == "u1"
    # Indexed under the DLQ topic by key and by unique id.
    now = parts.clock.now_ms()
    assert [r.physical_offset for r in parts.store.query_by_key(DLQ, "k2", 4, 0, now)] == [
        rec.physical_offset
    ]
    assert len(parts.store.query_by_key(DLQ, sent.msg_id, 4, 0, now)) == 1


async def test_reconsume_times_over_the_max_go_to_dlq(parts: Parts) -> None:
    sent = await parts.send()
    offset = parts.offset_of(sent)
    await parts.back(offset, max_reconsume_times=1)  # 0 + 1 <= 1: the retry path
    assert parts.topics.get(DLQ) is None and len(parts.timer_records()) == 1
    await parts.back(offset, max_reconsume_times=0)  # 0 + 1 > 0
    assert len(parts.dlq_records()) == 1


async def test_group_retry_max_times_applies_without_the_request_field(parts: Parts) -> None:
    parts.groups.put(SubscriptionGroupConfig(GROUP, retry_max_times=2))
    retry = "%RETRY%cg"
    parts.create_topic(retry, queues=1)
    props = {Prop.RETRY_TOPIC: TOPIC, Prop.ORIGIN_MESSAGE_ID: "ORIG-ID", Prop.KEYS: "kk"}
    for times, to_dlq in ((1, False), (2, True)):
        req = send_request(retry, [b"again"], properties=props, reconsume_times=times)
        res = (await parts.sender.send(req, PEER)).results[0]
        await parts.back(parts.offset_of(res), origin_topic=retry)
        assert len(parts.timer_records()) == 1  # the first one's retry
        assert len(parts.dlq_records()) == (1 if to_dlq else 0)
    [rec] = parts.dlq_records()
    assert rec.reconsume_times == 3
    assert rec.properties[Prop.RETRY_TOPIC] == TOPIC  # kept from the retry record
    assert rec.properties[Prop.ORIGIN_MESSAGE_ID] == "ORIG-ID"
    assert rec.body == b"again"


async def test_unlimited_retries_never_dead_letter(parts: Parts) -> None:
    parts.groups.put(SubscriptionGroupConfig(GROUP, retry_max_times=-1))
    sent = await parts.send(reconsume_times=1000)
    await parts.back(parts.offset_of(sent))
    [timer] = parts.timer_records()
    assert timer.reconsume_times == 1001
    # beyond the last level every retry waits as long as the last level (2 h)
    assert int(timer.properties[Prop.TIMER_OUT_MS]) == parts.clock.now_ms() + 7_200_000
    await parts.back(parts.offset_of(sent), delay_level=-1)  # an explicit dead letter still works
    assert len(parts.dlq_records()) == 1


async def test_retry_record_without_retry_topic_uses_the_request_origin(parts: Parts) -> None:
    retry = "%RETRY%cg"
    parts.create_topic(retry, queues=1)
    res = (await parts.sender.send(send_request(retry, [b"x"]), PEER)).results[0]
    await parts.back(parts.offset_of(res), delay_level=-1, origin_topic=TOPIC)
    [rec] = parts.dlq_records()
    assert rec.properties[Prop.RETRY_TOPIC] == TOPIC


async def test_compressed_body_and_flag_are_kept(parts: Parts) -> None:
    body = zlib.compress(b"z" * 1000)
    req = send_request(TOPIC, [body], sys_flag=codec.SysFlag.COMPRESSED)
    req.messages[0].flag = 7
    res = (await parts.sender.send(req, PEER)).results[0]
    await parts.back(parts.offset_of(res), delay_level=-1)
    [rec] = parts.dlq_records()
    assert rec.body == body
    assert rec.sys_flag & codec.SysFlag.COMPRESSED
    assert rec.flag == 7


async def test_existing_dlq_is_reused_and_an_unwritable_one_refused(parts: Parts) -> None:
    sent = await parts.send()
    await parts.back(parts.offset_of(sent), delay_level=-1)
    await parts.back(parts.offset_of(sent), delay_level=-1)
    assert len(parts.dlq_records()) == 2
    parts.create_topic(DLQ, queues=1, perm=PERM_READ)
    with pytest.raises(ServiceError) as err:
        await parts.back(parts.offset_of(sent), delay_level=-1)
    assert err.value.code is grpc.StatusCode.PERMISSION_DENIED


async def test_missing_message_and_bad_requests(parts: Parts) -> None:
    sent = await parts.send()
    offset = parts.offset_of(sent)
    for bad_offset in (offset + 1, 1 << 40):
        with pytest.raises(ServiceError) as err:
            await parts.back(bad_offset, delay_level=-1)
        assert code_of(err) == (grpc.StatusCode.NOT_FOUND, common_pb2.MESSAGE_NOT_FOUND)
    with pytest.raises(ServiceError) as err:
        await parts.back(-1, delay_level=-1)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServiceError) as err:
        await parts.back(offset, delay_level=-1, group="bad group!")
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServiceError) as err:
        await parts.back(offset, delay_level=-1, group="g" * 200)  # %DLQ% + 200 > 127 characters
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert parts.dlq_records() == []


async def test_unknown_group_without_auto_create(tmp_path: Path) -> None:
    p = Parts(tmp_path, auto_create_subscription_group=False)
    try:
        p.create_topic(TOPIC)
        offset = p.offset_of(await p.send())
        with pytest.raises(ServiceError) as err:
            await p.back(offset, delay_level=-1)
        assert code_of(err) == (grpc.StatusCode.NOT_FOUND, common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST)
        p.groups.put(SubscriptionGroupConfig(GROUP))
        await p.back(offset, delay_level=-1)
        assert len(p.dlq_records()) == 1
    finally:
        p.close()


async def test_group_without_retry_queues_gets_no_retry(parts: Parts) -> None:
    parts.groups.put(SubscriptionGroupConfig(GROUP, retry_queue_nums=0))
    sent = await parts.send()
    await parts.back(parts.offset_of(sent), delay_level=-1)  # acknowledged, nothing stored
    assert parts.topics.get(DLQ) is None


async def test_slave_and_unwritable_broker(tmp_path: Path) -> None:
    for config, code in (
        ({"broker_id": 1}, grpc.StatusCode.UNAVAILABLE),
        ({"broker_permission": PERM_READ}, grpc.StatusCode.PERMISSION_DENIED),
    ):
        p = Parts(tmp_path / str(code), **config)
        try:
            with pytest.raises(ServiceError) as err:
                await p.back(0, delay_level=-1)
            assert err.value.code is code
        finally:
            p.close()


# -- the retry path --------------------------------------------------------------------------
LEVELS_MS = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


@pytest.mark.parametrize(
    ("stored_times", "requested", "level"),
    [
        (0, 0, 3),
        (1, 0, 4),
        (15, 0, 18),
        (16, 0, 18),
        (40, 0, 18),
        (0, 1, 1),
        (5, 2, 2),
        (0, 99, 18),
    ],
)
async def test_retry_goes_to_the_timer_topic_for_retry_topic(
    parts: Parts, stored_times: int, requested: int, level: int
) -> None:
    sent = await parts.send(reconsume_times=stored_times)
    parts.clock.advance_ms(1234)
    offset = parts.offset_of(sent)
    await parts.back(offset, delay_level=requested, origin_topic=TOPIC, max_reconsume_times=-1)
    [rec] = parts.timer_records()
    props = rec.properties
    assert props[Prop.REAL_TOPIC] == RETRY
    assert props[Prop.REAL_QUEUE_ID] == "0"  # retryQueueNums 1
    assert int(props[Prop.TIMER_OUT_MS]) == parts.clock.now_ms() + LEVELS_MS[level - 1] * 1000
    assert props[Prop.RETRY_TOPIC] == TOPIC
    assert props[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id == props[Prop.UNIQ_KEY]
    assert props[Prop.TAGS] == "TagA" and props["user"] == "u1"
    assert Prop.DELAY_LEVEL not in props and Prop.TIMER_SOURCE not in props
    assert rec.reconsume_times == stored_times + 1
    assert rec.body == b"body-1"
    assert rec.queue_id == zlib.crc32(sent.msg_id.encode()) % 8
    retry = parts.topics.get(RETRY)
    assert retry is not None and (retry.queue_nums, retry.perm) == (1, PERM_READ | PERM_WRITE)
    assert parts.store.max_offset(RETRY, 0) == 0  # nothing visible before the timer fires


async def test_retry_topic_gets_the_groups_retry_queue_nums(parts: Parts) -> None:
    parts.groups.put(SubscriptionGroupConfig(GROUP, retry_queue_nums=3))
    for _ in range(20):
        await parts.back(parts.offset_of(await parts.send()))
    retry = parts.topics.get(RETRY)
    assert retry is not None and retry.queue_nums == 3
    qids = {int(r.properties[Prop.REAL_QUEUE_ID]) for r in parts.timer_records()}
    assert qids <= {0, 1, 2} and len(qids) > 1


async def test_retry_record_reput_then_failed_again(parts: Parts) -> None:
    """The timer-wheel's re-put into %RETRY%, failed again: next level, same origin."""
    sent = await parts.send()
    await parts.back(parts.offset_of(sent), origin_topic=TOPIC)
    [timer] = parts.timer_records()
    reput_props = dict(timer.properties)
    reput_props[Prop.TIMER_SOURCE] = str(timer.physical_offset)
    req = send_request(RETRY, [timer.body], properties=reput_props, reconsume_times=1)
    res = (await parts.sender.send(req, PEER)).results[0]
    stored = codec.decode_record(parts.store.get_messages(RETRY, 0, 0, 1).records[0])
    assert stored.reconsume_times == 1 and stored.properties[Prop.RETRY_TOPIC] == TOPIC
    await parts.back(parts.offset_of(res), origin_topic=RETRY)
    second = parts.timer_records()[-1]
    assert second.reconsume_times == 2
    assert int(second.properties[Prop.TIMER_OUT_MS]) == parts.clock.now_ms() + 30_000  # level 4
    assert second.properties[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id
    assert second.properties[Prop.RETRY_TOPIC] == TOPIC
    assert Prop.TIMER_SOURCE not in second.properties


async def test_unwritable_retry_topic_is_refused(parts: Parts) -> None:
    parts.create_topic(RETRY, queues=1, perm=PERM_READ)
    with pytest.raises(ServiceError) as err:
        await parts.back(parts.offset_of(await parts.send()))
    assert err.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert parts.timer_records() == []
