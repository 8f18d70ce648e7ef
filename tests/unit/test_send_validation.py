"""Send on a real store without sockets: what is stored, and every refusal (Messaging.Send)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.message import decode_records
from services.broker.send_processor import UniqueIds, parse_peer
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


def _send(b: BrokerParts, req: messaging_pb2.SendRequest) -> messaging_pb2.SendResponse:
    return asyncio.run(b.sender.send(req, PEER))


def _refused(b: BrokerParts, req: messaging_pb2.SendRequest) -> ServiceError:
    max_before = b.store.commitlog.max_offset
    with pytest.raises(ServiceError) as err:
        _send(b, req)
    assert b.store.commitlog.max_offset == max_before, "a refused send stored something"
    return err.value


def test_batch_is_stored_in_order_with_consecutive_offsets(b: BrokerParts) -> None:
    resp = _send(b, send_request("T", [b"a", b"b", b"c"], queue_id=2, properties={"TAGS": "X"}))
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


def test_client_unique_id_is_kept_and_missing_ones_are_filled(b: BrokerParts) -> None:
    uniq = "0A0102030000AAAABBBB00000000CCCC"
    resp = _send(b, send_request("T", properties={"UNIQ_KEY": uniq}))
    assert resp.results[0].msg_id == uniq
    filled = _send(b, send_request("T", [b"x", b"y"]))
    ids = [r.msg_id for r in filled.results]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and ids[0] != ids[1]


def test_keys_and_unique_ids_are_indexed(b: BrokerParts) -> None:
    resp = _send(b, send_request("T", properties={"KEYS": "order-1 order-2"}))
    now = b.clock.now_ms() + 1000
    assert len(b.store.query_by_key("T", "order-2", 4, 0, now)) == 1
    assert len(b.store.query_by_key("T", resp.results[0].msg_id, 4, 0, now)) == 1


def test_offset_msg_id_encodes_store_host_and_offset(b: BrokerParts) -> None:
    _send(b, send_request("T"))
    second = _send(b, send_request("T")).results[0]
    host, offset = codec.decode_offset_msg_id(second.offset_msg_id)
    assert offset > 0 and host == b.store.config.store_host
    assert b.store.read_record(offset) is not None


def test_auto_create_from_default_topic(b: BrokerParts) -> None:
    resp = _send(b, send_request("NewTopic", default_topic="TBW102", default_topic_queue_nums=2))
    assert resp.results[0].queue_offset == 0
    cfg = b.topics.get("NewTopic")
    assert cfg is not None and cfg.write_queue_nums == 2 and cfg.perm == 6


def test_unknown_topic_without_default_topic_is_not_found(b: BrokerParts) -> None:
    err = _refused(b, send_request("Missing"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, common_pb2.TOPIC_NOT_EXIST)


def test_unknown_topic_with_auto_create_off_is_not_found(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, auto_create_topic_enable=False)
    try:
        err = _refused(parts, send_request("Missing", default_topic="TBW102"))
        assert err.code == grpc.StatusCode.NOT_FOUND
        assert "autoCreateTopicEnable" in err.message
    finally:
        parts.close()


@pytest.mark.parametrize("topic", ["bad topic", "a/b", "x" * 128, ""])
def test_bad_topic_names(b: BrokerParts, topic: str) -> None:
    err = _refused(b, send_request(topic, default_topic="TBW102"))
    assert (err.code, err.reason) == (INVALID, common_pb2.ILLEGAL_ARGUMENT)


def test_127_character_topic_is_fine(b: BrokerParts) -> None:
    _send(b, send_request("t" * 127, default_topic="TBW102"))


def test_empty_request_empty_body_and_mixed_topics(b: BrokerParts) -> None:
    assert _refused(b, messaging_pb2.SendRequest(queue_id=0)).code == INVALID
    assert _refused(b, send_request("T", [b""])).code == INVALID
    b.create_topic("U")
    mixed = send_request("T", [b"a"])
    mixed.messages.add(topic="U", body=b"b")
    err = _refused(b, mixed)
    assert err.code == INVALID and "one topic" in err.message


def test_queue_id_must_be_below_write_queue_nums(b: BrokerParts) -> None:
    b.create_topic("W", queues=8, read=2)
    _send(b, send_request("W", queue_id=7))  # writes go to [0, 8) even though reads stop at 2
    assert _refused(b, send_request("T", queue_id=4)).code == INVALID
    assert _refused(b, send_request("T", queue_id=-1)).code == INVALID


def test_size_limit_counts_topic_bodies_and_properties(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, max_message_size_bytes=4096)
    parts.create_topic("T")
    try:
        _send(parts, send_request("T", [b"x" * (4096 - 1 - 60)], properties={}))
        err = _refused(parts, send_request("T", [b"x" * 4096]))
        assert (err.code, err.reason) == (INVALID, common_pb2.MESSAGE_TOO_LARGE)
        err = _refused(parts, send_request("T", [b"x" * 1500] * 3))
        assert err.reason == common_pb2.MESSAGE_TOO_LARGE and "batch" in err.message
    finally:
        parts.close()


def test_oversized_properties(b: BrokerParts) -> None:
    err = _refused(b, send_request("T", properties={"big": "v" * 40_000}))
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
def test_reserved_and_malformed_properties(b: BrokerParts, props: dict[str, str]) -> None:
    assert _refused(b, send_request("T", properties=props)).code == INVALID


def test_retry_topic_resubmission_may_carry_retry_properties(b: BrokerParts) -> None:
    b.topics.create_system_topic("%RETRY%cg", 1, 6)
    props = {"RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "ABC", "RECONSUME_TIME": "1"}
    resp = _send(b, send_request("%RETRY%cg", properties=props, reconsume_times=1))
    assert resp.results[0].status == messaging_pb2.SEND_OK


@pytest.mark.parametrize("props", [{"DELAY": "3"}, {"TIMER_DELIVER_MS": "1700000000000"}])
def test_delayed_messages_wait_for_the_timer_wheel(b: BrokerParts, props: dict[str, str]) -> None:
    err = _refused(b, send_request("T", properties=props))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "timer-wheel" in err.message
    batch = _refused(b, send_request("T", [b"a", b"b"], properties=props))
    assert batch.code == INVALID


@pytest.mark.parametrize("delay", ["19", "-1", "soon"])
def test_bad_delay_levels(b: BrokerParts, delay: str) -> None:
    assert _refused(b, send_request("T", properties={"DELAY": delay})).code == INVALID


def test_delay_zero_is_not_delayed(b: BrokerParts) -> None:
    _send(b, send_request("T", properties={"DELAY": "0"}))


def test_transactional_messages_wait_for_their_issue(b: BrokerParts) -> None:
    err = _refused(b, send_request("T", sys_flag=codec.SysFlag.TRANSACTION_PREPARED))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    err = _refused(b, send_request("T", properties={"TRAN_MSG": "true"}))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    batch = _refused(b, send_request("T", [b"a", b"b"], sys_flag=4))
    assert batch.code == INVALID
    assert _refused(b, send_request("T", sys_flag=0x8)).code == INVALID


def test_compressed_flag_is_kept(b: BrokerParts) -> None:
    _send(b, send_request("T", sys_flag=codec.SysFlag.COMPRESSED))
    rec = codec.decode_record(b.store.get_messages("T", 0, 0, 1).records[0])
    assert rec.sys_flag & codec.SysFlag.COMPRESSED


def test_system_topics_are_not_writable_by_producers(b: BrokerParts) -> None:
    assert _refused(b, send_request("TBW102")).code == grpc.StatusCode.PERMISSION_DENIED
    b.topics.create_system_topic("rmq_sys_wheel_timer", 1, 6)
    assert (
        _refused(b, send_request("rmq_sys_wheel_timer")).code == grpc.StatusCode.PERMISSION_DENIED
    )


def test_unwritable_topic_and_broker(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, broker_permission=4)
    parts.create_topic("T")
    parts.create_topic("R", perm=4)
    try:
        assert _refused(parts, send_request("T")).code == grpc.StatusCode.PERMISSION_DENIED
        parts.config.broker_permission = 6  # the live config: UpdateBrokerConfig mutates it
        _send(parts, send_request("T"))
        assert _refused(parts, send_request("R")).code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        parts.close()


def test_slave_refuses_writes(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, broker_id=1, broker_role="SLAVE")
    parts.create_topic("T")
    try:
        err = _refused(parts, send_request("T"))
        assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)
    finally:
        parts.close()


def test_store_failures_map_to_codes(b: BrokerParts) -> None:
    b.store.retention.writable = False
    err = _refused(b, send_request("T"))
    assert (err.code, err.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL)
    b.store.retention.writable = True
    b.store.close_files()
    err = _refused(b, send_request("T"))
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


def test_sync_flush_waits_for_the_fsync_unless_wait_is_false(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, flush_disk_type="SYNC_FLUSH")
    parts.create_topic("T")

    async def main() -> None:
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

    asyncio.run(main())
