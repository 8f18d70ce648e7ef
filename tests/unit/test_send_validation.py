"""Send on a real store without sockets: what is stored, and every refusal (Messaging.Send)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.message import decode_records
from services.broker.send_ids import UniqueIds, parse_peer
from services.common.errors import ServiceError
from tests.unit._broker_parts import PEER, BrokerParts, send_request

pytestmark = pytest.mark.unit

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def b(tmp_path: Path) -> Iterator[BrokerParts]:
    parts = BrokerParts(tmp_path)
    parts.create_topic("T")
    yield parts
    parts.close()


async def _send(b: BrokerParts, req: messaging_pb2.SendRequest) -> messaging_pb2.SendResponse:
    return await b.sender.send(req, PEER)


async def _refused(b: BrokerParts, req: messaging_pb2.SendRequest) -> ServiceError:
    max_before = b.store.commitlog.max_offset
    with pytest.raises(ServiceError) as err:
        await _send(b, req)
    assert b.store.commitlog.max_offset == max_before, "a refused send stored something"
    return err.value


async def test_batch_is_stored_in_order_with_consecutive_offsets(b: BrokerParts) -> None:
    resp = await _send(
        b, send_request("T", [b"a", b"b", b"c"], queue_id=2, properties={"TAGS": "X"})
    )
    assert [r.queue_offset for r in resp.results] == [0, 1, 2]
    assert {r.status for r in resp.results} == {messaging_pb2.SEND_OK}
    assert {r.queue_id for r in resp.results} == {2}
    assert len({r.msg_id for r in resp.results}) == 3
    got = b.store.get_messages("T", 2, 0, 32)
    msgs = [m for r in got.records for m in decode_records(r)]
    assert [m.body for m in msgs] == [b"a", b"b", b"c"]
    assert [m.msg_id for m in msgs] == [r.msg_id for r in resp.results]
    assert [m.offset_msg_id for m in msgs] == [r.offset_msg_id for r in resp.results]
    assert msgs[0].born_host == "10.1.2.3:40000"
    assert msgs[0].tags == "X"
    assert got.records and codec.decode_record(got.records[0]).queue_offset == 0


async def test_client_unique_id_is_kept_and_missing_ones_are_filled(b: BrokerParts) -> None:
    uniq = "0A0102030000AAAABBBB00000000CCCC"
    resp = await _send(b, send_request("T", properties={"UNIQ_KEY": uniq}))
    assert resp.results[0].msg_id == uniq
    filled = await _send(b, send_request("T", [b"x", b"y"]))
    ids = [r.msg_id for r in filled.results]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and ids[0] != ids[1]


async def test_keys_and_unique_ids_are_indexed(b: BrokerParts) -> None:
    resp = await _send(b, send_request("T", properties={"KEYS": "order-1 order-2"}))
    now = b.clock.now_ms() + 1000
    assert len(b.store.query_by_key("T", "order-2", 4, 0, now)) == 1
    assert len(b.store.query_by_key("T", resp.results[0].msg_id, 4, 0, now)) == 1


async def test_offset_msg_id_encodes_store_host_and_offset(b: BrokerParts) -> None:
    await _send(b, send_request("T"))
    second = (await _send(b, send_request("T"))).results[0]
    host, offset = codec.decode_offset_msg_id(second.offset_msg_id)
    assert offset > 0 and host == b.store.config.store_host
    assert b.store.read_record(offset) is not None


async def test_auto_create_from_default_topic(b: BrokerParts) -> None:
    resp = await _send(
        b, send_request("NewTopic", default_topic="TBW102", default_topic_queue_nums=2)
    )
    assert resp.results[0].queue_offset == 0
    cfg = b.topics.get("NewTopic")
    assert cfg is not None and cfg.write_queue_nums == 2 and cfg.perm == 6


async def test_unknown_topic_without_default_topic_is_not_found(b: BrokerParts) -> None:
    err = await _refused(b, send_request("Missing"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, common_pb2.TOPIC_NOT_EXIST)


async def test_unknown_topic_with_auto_create_off_is_not_found(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, auto_create_topic_enable=False)
    try:
        err = await _refused(parts, send_request("Missing", default_topic="TBW102"))
        assert err.code == grpc.StatusCode.NOT_FOUND
        assert "autoCreateTopicEnable" in err.message
    finally:
        parts.close()


@pytest.mark.parametrize("topic", ["bad topic", "a/b", "x" * 128, ""])
async def test_bad_topic_names(b: BrokerParts, topic: str) -> None:
    err = await _refused(b, send_request(topic, default_topic="TBW102"))
    assert (err.code, err.reason) == (INVALID, common_pb2.ILLEGAL_ARGUMENT)


async def test_127_character_topic_is_fine(b: BrokerParts) -> None:
    await _send(b, send_request("t" * 127, default_topic="TBW102"))


async def test_empty_request_empty_body_and_mixed_topics(b: BrokerParts) -> None:
    assert (await _refused(b, messaging_pb2.SendRequest(queue_id=0))).code == INVALID
    assert (await _refused(b, send_request("T", [b""]))).code == INVALID
    b.create_topic("U")
    mixed = send_request("T", [b"a"])
    mixed.messages.add(topic="U", body=b"b")
    err = await _refused(b, mixed)
    assert err.code == INVALID and "one topic" in err.message


async def test_queue_id_must_be_below_write_queue_nums(b: BrokerParts) -> None:
    b.create_topic("W", queues=8, read=2)
    await _send(b, send_request("W", queue_id=7))  # writes go to [0, 8) even though reads stop at 2
    assert (await _refused(b, send_request("T", queue_id=4))).code == INVALID
    assert (await _refused(b, send_request("T", queue_id=-1))).code == INVALID


async def test_size_limit_counts_topic_bodies_and_properties(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, max_message_size_bytes=4096)
    parts.create_topic("T")
    try:
        await _send(parts, send_request("T", [b"x" * (4096 - 1 - 60)], properties={}))
        err = await _refused(parts, send_request("T", [b"x" * 4096]))
        assert (err.code, err.reason) == (INVALID, common_pb2.MESSAGE_TOO_LARGE)
        err = await _refused(parts, send_request("T", [b"x" * 1500] * 3))
        assert err.reason == common_pb2.MESSAGE_TOO_LARGE and "batch" in err.message
    finally:
        parts.close()


async def test_size_limit_of_a_batch_sent_as_records_is_the_messages_one(tmp_path: Path) -> None:
    """The same batch, as messages and as encoded records: refused at the same message with
    the same answer, and a batch just under the limit is stored either way."""
    parts = BrokerParts(tmp_path, max_message_size_bytes=4096)
    parts.create_topic("T")

    def as_records(req: messaging_pb2.SendRequest) -> messaging_pb2.SendRequest:
        records = b"".join(
            codec.encode_sent_record(
                m.topic.encode(), m.body, codec.encode_properties(dict(m.properties)), 0, 0, 1
            )
            for m in req.messages
        )
        return messaging_pb2.SendRequest(producer_group="pg", records=records)

    try:
        props = {"UNIQ_KEY": "0" * 32}  # 41 bytes encoded; + topic 1 + body 1000 per message
        over = send_request("T", [b"x" * 1000] * 5, properties=props)
        refusals = [await _refused(parts, r) for r in (over, as_records(over))]
        assert refusals[0].reason == refusals[1].reason == common_pb2.MESSAGE_TOO_LARGE
        assert refusals[0].message == refusals[1].message
        assert "at message 3" in refusals[1].message
        under = send_request("T", [b"x" * 1000] * 3, properties=props)
        assert len((await _send(parts, as_records(under))).results) == 3
    finally:
        parts.close()


async def test_oversized_properties(b: BrokerParts) -> None:
    err = await _refused(b, send_request("T", properties={"big": "v" * 40_000}))
    assert err.reason == common_pb2.MESSAGE_TOO_LARGE


@pytest.mark.parametrize(
    "props",
    [
        {"REAL_TOPIC": "x"},
        {"ORIGIN_MESSAGE_ID": "x"},
        {"MIN_OFFSET": "1"},
        {"a\x01b": "v"},
        {"k": "v\x02w"},
    ],
)
async def test_reserved_and_malformed_properties(b: BrokerParts, props: dict[str, str]) -> None:
    assert (await _refused(b, send_request("T", properties=props))).code == INVALID


async def test_retry_topic_resubmission_may_carry_retry_properties(b: BrokerParts) -> None:
    b.topics.create_system_topic("%RETRY%cg", 1, 6)
    props = {"RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "ABC", "RECONSUME_TIME": "1"}
    resp = await _send(b, send_request("%RETRY%cg", properties=props, reconsume_times=1))
    assert resp.results[0].status == messaging_pb2.SEND_OK


def _timer_record(b: BrokerParts, resp: messaging_pb2.SendResponse) -> codec.Record:
    _, offset = codec.decode_offset_msg_id(resp.results[0].offset_msg_id)
    rec = b.store.read_record(offset)
    assert rec is not None
    return rec


@pytest.mark.parametrize(
    ("props", "delay_ms"),
    [
        ({"DELAY": "3"}, 10_000),
        ({"TIMER_DELAY_MS": "2500"}, 2500),
        ({"TIMER_DELAY_SEC": "7"}, 7000),
    ],
)
async def test_delayed_messages_go_to_the_timer_topic(
    b: BrokerParts, props: dict[str, str], delay_ms: int
) -> None:
    resp = await _send(
        b, send_request("T", queue_id=2, properties={**props, "TAGS": "A", "u": "v"})
    )
    r = resp.results[0]
    assert r.status == messaging_pb2.SEND_OK and r.queue_id == 2
    rec = _timer_record(b, resp)
    assert rec.topic == "rmq_sys_wheel_timer"
    assert rec.properties["REAL_TOPIC"] == "T" and rec.properties["REAL_QID"] == "2"
    assert rec.properties["TIMER_OUT_MS"] == str(b.clock.now_ms() + delay_ms)
    assert rec.properties["UNIQ_KEY"] == r.msg_id
    assert rec.properties["TAGS"] == "A" and rec.properties["u"] == "v"
    assert not set(props) & set(rec.properties)
    assert rec.queue_id == zlib.crc32(r.msg_id.encode()) % 8
    assert b.store.max_offset("T", 2) == 0, "a delayed message is visible in its topic"
    batch = await _refused(b, send_request("T", [b"a", b"b"], properties=props))
    assert batch.code == INVALID


async def test_deliver_ms_in_the_past_is_stored_in_its_topic(b: BrokerParts) -> None:
    now = b.clock.now_ms()
    for value in (str(now), "0"):
        await _send(b, send_request("T", properties={"TIMER_DELIVER_MS": value}))
    got = b.store.get_messages("T", 0, 0, 32)
    msgs = [m for r in got.records for m in decode_records(r)]
    assert len(msgs) == 2 and all("TIMER_DELIVER_MS" not in m.properties for m in msgs)
    future = await _send(b, send_request("T", properties={"TIMER_DELIVER_MS": str(now + 1)}))
    assert _timer_record(b, future).properties["TIMER_OUT_MS"] == str(now + 1)


@pytest.mark.parametrize(
    "props",
    [
        {"DELAY": "19"},
        {"DELAY": "-1"},
        {"DELAY": "soon"},
        {"TIMER_DELAY_MS": "-5"},
        {"TIMER_DELIVER_MS": "tomorrow"},
        {"DELAY": "2", "TIMER_DELAY_MS": "1000"},
        {"TIMER_DELAY_MS": str(3 * 86_400_000 + 1)},
        {"TIMER_DEL_UNIQKEY": "ABC"},
    ],
)
async def test_bad_delays(b: BrokerParts, props: dict[str, str]) -> None:
    assert (await _refused(b, send_request("T", properties=props))).code == INVALID


async def test_max_delay_is_named_and_configurable(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, timer_max_delay_sec=60, message_delay_level="1s 2m")
    try:
        parts.create_topic("T")
        err = await _refused(parts, send_request("T", properties={"TIMER_DELAY_MS": "60001"}))
        assert err.code == INVALID and "timerMaxDelaySec=60" in err.message
        await _send(parts, send_request("T", properties={"TIMER_DELAY_MS": "60000"}))
        assert (await _refused(parts, send_request("T", properties={"DELAY": "2"}))).code == INVALID
        assert (await _refused(parts, send_request("T", properties={"DELAY": "3"}))).code == INVALID
        await _send(parts, send_request("T", properties={"DELAY": "1"}))
    finally:
        parts.close()


async def test_delay_zero_is_not_delayed(b: BrokerParts) -> None:
    await _send(b, send_request("T", properties={"DELAY": "0"}))
    assert b.store.max_offset("T", 0) == 1


async def test_cancel_marker_goes_where_its_timer_went(b: BrokerParts) -> None:
    timer = await _send(b, send_request("T", properties={"DELAY": "5"}))
    handle = timer.results[0].msg_id
    out_ms = _timer_record(b, timer).properties["TIMER_OUT_MS"]
    b.clock.advance_ms(60_000)  # due by now: a marker still goes to the timer topic
    marker = await _send(
        b,
        send_request("T", properties={"TIMER_DEL_UNIQKEY": handle, "TIMER_DELIVER_MS": out_ms}),
    )
    rec = _timer_record(b, marker)
    assert rec.topic == "rmq_sys_wheel_timer"
    assert rec.queue_id == _timer_record(b, timer).queue_id
    assert rec.properties["TIMER_DEL_UNIQKEY"] == handle
    assert rec.properties["TIMER_OUT_MS"] == out_ms


async def test_reput_is_stored_once_in_its_topic(b: BrokerParts) -> None:
    props = {
        "TIMER_SOURCE": "1234",
        "TIMER_OUT_MS": "1700000000000",
        "REAL_TOPIC": "T",
        "REAL_QID": "1",
        "UNIQ_KEY": "0A0102030000AAAABBBB00000000CCCC",
        "DELAY": "3",  # never delayed again
    }
    first = await _send(b, send_request("T", queue_id=1, properties=props, reconsume_times=2))
    again = await _send(b, send_request("T", queue_id=1, properties=props, reconsume_times=2))
    assert again == first
    assert b.store.max_offset("T", 1) == 1
    rec = codec.decode_record(b.store.get_messages("T", 1, 0, 1).records[0])
    assert rec.reconsume_times == 2 and "DELAY" not in rec.properties
    assert rec.properties["TIMER_OUT_MS"] == "1700000000000"
    assert rec.properties["UNIQ_KEY"] == props["UNIQ_KEY"]


async def test_reput_batch_answers_repeats_in_order(b: BrokerParts) -> None:
    def req(*sources: str) -> messaging_pb2.SendRequest:
        msgs = [
            common_pb2.Message(topic="T", body=s.encode(), properties={"TIMER_SOURCE": s})
            for s in sources
        ]
        return messaging_pb2.SendRequest(queue_id=0, messages=msgs)

    first = await _send(b, req("1", "2"))
    mixed = await _send(b, req("3", "1", "3", "4", "2"))
    assert b.store.max_offset("T", 0) == 4  # 1, 2, 3, 4 once each
    by_source = {"1": first.results[0], "2": first.results[1]}
    by_source["3"], by_source["4"] = mixed.results[0], mixed.results[3]
    assert list(mixed.results) == [by_source[s] for s in ("3", "1", "3", "4", "2")]
    assert [r.queue_offset for r in mixed.results] == [2, 0, 2, 3, 1]


async def test_reput_is_stored_again_after_the_window(b: BrokerParts) -> None:
    req = send_request("T", properties={"TIMER_SOURCE": "99"})
    await _send(b, req)
    b.clock.advance_ms(31 * 60_000)
    await _send(b, req)
    assert b.store.max_offset("T", 0) == 2


async def test_transactional_messages_cannot_be_batched_or_delayed(b: BrokerParts) -> None:
    # (accepted transactional sends: tests/unit/test_transaction_end.py)
    batch = await _refused(b, send_request("T", [b"a", b"b"], sys_flag=4))
    assert batch.code == INVALID
    assert (await _refused(b, send_request("T", sys_flag=0x8))).code == INVALID
    delayed = send_request("T", properties={"DELAY": "1"}, sys_flag=4)
    assert (await _refused(b, delayed)).code == INVALID


async def test_compressed_flag_is_kept(b: BrokerParts) -> None:
    await _send(b, send_request("T", sys_flag=codec.SysFlag.COMPRESSED))
    rec = codec.decode_record(b.store.get_messages("T", 0, 0, 1).records[0])
    assert rec.sys_flag & codec.SysFlag.COMPRESSED


async def test_system_topics_are_not_writable_by_producers(b: BrokerParts) -> None:
    assert (await _refused(b, send_request("TBW102"))).code == grpc.StatusCode.PERMISSION_DENIED
    b.topics.create_system_topic("rmq_sys_wheel_timer", 1, 6)
    assert (
        await _refused(b, send_request("rmq_sys_wheel_timer"))
    ).code == grpc.StatusCode.PERMISSION_DENIED


async def test_unwritable_topic_and_broker(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, broker_permission=4)
    parts.create_topic("T")
    parts.create_topic("R", perm=4)
    try:
        assert (await _refused(parts, send_request("T"))).code == grpc.StatusCode.PERMISSION_DENIED
        parts.config.broker_permission = 6  # the live config: UpdateBrokerConfig mutates it
        await _send(parts, send_request("T"))
        assert (await _refused(parts, send_request("R"))).code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        parts.close()


async def test_slave_refuses_writes(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, broker_id=1, broker_role="SLAVE")
    parts.create_topic("T")
    try:
        err = await _refused(parts, send_request("T"))
        assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)
    finally:
        parts.close()


async def test_store_failures_map_to_codes(b: BrokerParts) -> None:
    b.store.retention.writable = False
    err = await _refused(b, send_request("T"))
    assert (err.code, err.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL)
    b.store.retention.writable = True
    b.store.close_files()
    err = await _refused(b, send_request("T"))
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == common_pb2.SERVICE_NOT_AVAILABLE


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("ipv4:1.2.3.4:5", "1.2.3.4:5"),
        ("ipv6:[::1]:7", "[::1]:7"),
        ("ipv6:%5B::1%5D:7", "[::1]:7"),
        ("ipv6:[::ffff:10.0.0.1]:9", "10.0.0.1:9"),
        ("unix:/tmp/sock", "127.0.0.1:0"),
        ("ipv4:garbage", "127.0.0.1:0"),
    ],
)
def test_parse_peer(peer: str, expected: str) -> None:
    assert str(parse_peer(peer)) == expected


def test_unique_ids_are_distinct_and_well_formed() -> None:
    ids = UniqueIds(codec.LOCALHOST)
    make = ids.factory(1_700_000_000_000)
    got = [make() for _ in range(1000)]
    assert len(set(got)) == 1000
    assert all(len(i) == 32 and bytes.fromhex(i) for i in got)
    assert got[0].startswith("7F000001")


async def test_sync_flush_waits_for_the_fsync_unless_wait_is_false(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, flush_disk_type="SYNC_FLUSH")
    parts.create_topic("T")

    # Not started: a waiting send would need the flusher, WAIT=false must not touch it.
    resp = await parts.sender.send(send_request("T", properties={"WAIT": "false"}), PEER)
    assert resp.results[0].status == messaging_pb2.SEND_OK
    await parts.store.start()
    try:
        resp = await parts.sender.send(send_request("T", [b"a", b"b"]), PEER)
        assert [r.status for r in resp.results] == [messaging_pb2.SEND_OK] * 2
        assert parts.store.flusher.flushed_offset >= parts.store.commitlog.max_offset
    finally:
        await parts.store.shutdown()
