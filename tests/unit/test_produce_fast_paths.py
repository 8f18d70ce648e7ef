"""The producer's per-batch shortcuts give what the per-message way gives: the same records, the
same properties, the same errors, unique ids and equal results (issue 16)."""

from __future__ import annotations

import os
import zlib

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.errors import InvalidArgumentError, MessageTooLargeError, ServerError
from rocketq.client.producer import ProducerConfig
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer._sender import (
    PreparedMessage,
    build_send_request,
    prepare_batch,
    prepare_message,
    to_results,
)
from rocketq.codec import Prop
from rocketq.message import (
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    new_unique_id,
    new_unique_ids,
    send_result,
)

pytestmark = pytest.mark.unit

MiB = 1024 * 1024


def _batch(msgs: list[Message], max_size_bytes: int = 4 * MiB) -> list[PreparedMessage]:
    return prepare_batch(msgs, create_topic_key="TBW102", max_size_bytes=max_size_bytes)


def _one(msg: Message) -> PreparedMessage:
    return prepare_message(msg, create_topic_key="TBW102", max_size_bytes=4 * MiB)


def test_batch_records_are_each_messages_record_with_zlibs_crc() -> None:
    msgs = [
        (os.urandom(n), f"TAGS\x01t{n}\x02".encode(), flag)
        for n, flag in ((1, 0), (1024, 7), (70_000, 1))
    ]
    batch = codec.encode_sent_batch("Tópico".encode(), msgs, 1_700_000_000_123)
    single = b"".join(
        codec.encode_sent_record("Tópico".encode(), body, props, flag, 0, 1_700_000_000_123)
        for body, props, flag in msgs
    )
    assert batch == single and codec.count_records(batch) == 3
    # the CRC the broker checks is zlib's, masked to a Java int
    crc_at = codec.OFFSET_BODYCRC
    assert int.from_bytes(batch[crc_at : crc_at + 4], "big") == zlib.crc32(msgs[0][0]) & 0x7FFFFFFF


@pytest.mark.parametrize(
    "msg",
    [
        Message("T", b"x", tags="TagA"),
        Message("T", b"x"),
        Message("T", b"x", tags="a b", keys="k1 k2"),
        Message("T", b"x", tags="t", properties={"p": "v"}),
        Message("T", b"x", tags="t", delay_level=3),
        Message("T", b"x", wait_store_msg_ok=False),
    ],
)
def test_properties_are_the_messages_wire_properties_with_its_id(msg: Message) -> None:
    [item] = _batch([msg])
    expected = {**msg.wire_properties(), Prop.UNIQ_KEY: item.msg_id}
    assert item.props == expected
    assert item.properties == codec.encode_properties(expected)
    assert codec.decode_properties(item.properties) == expected
    assert item.size_bytes == 1 + 1 + 20 + len(item.properties)


def test_a_batchs_errors_are_those_of_its_first_bad_message() -> None:
    with pytest.raises(InvalidArgumentError, match="characters"):  # checked, not just "mixed"
        _batch([Message("A", b"x"), Message("bad topic!", b"x")])
    with pytest.raises(InvalidArgumentError, match="reserved"):
        _batch([Message("A", b"x"), Message("TBW102", b"x")])
    with pytest.raises(InvalidArgumentError, match="one topic"):
        _batch([Message("A", b"x"), Message("B", b"x")])
    with pytest.raises(InvalidArgumentError, match="empty body"):
        _batch([Message("A", b"x"), Message("A", b"")])
    with pytest.raises(InvalidArgumentError, match="U\\+0001"):
        _batch([Message("A", b"x"), Message("A", b"x", tags="t\x01")])
    with pytest.raises(InvalidArgumentError, match="U\\+0001"):
        _batch([Message("A", b"x", keys=["k\x02"])])
    with pytest.raises(InvalidArgumentError, match="delayed"):
        _batch([Message("A", b"x"), Message("A", b"x", delay_ms=5)])
    with pytest.raises(InvalidArgumentError, match="must be bytes"):
        _batch([Message("A", "text")])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="at least one"):
        _batch([])
    with pytest.raises(MessageTooLargeError, match="batch of 2"):
        _batch([Message("A", b"x" * 300), Message("A", b"x" * 300)], max_size_bytes=500)


def test_a_batch_prepares_each_message_as_it_is_prepared_alone() -> None:
    """The batch's inline way for tag-only messages and the per-message way for the rest give
    the same item, message by message, in one batch mixing both."""
    msgs = [
        Message("A", b"x", tags="t"), Message("A", b"yy"),
        Message("A", b"z", tags="\u00e9t\u00e9", flag=3), Message("A", b"k", keys=["k1"]),
        Message("A", bytearray(b"ba"), tags="t"),  # type: ignore[arg-type]
        Message("A", b"w", tags="t", wait_store_msg_ok=False),
        Message("A", b"p", properties={"a": "b"}),
    ]  # fmt: skip
    items = _batch(msgs)
    for msg, item in zip(msgs, items, strict=True):
        alone = prepare_message(
            msg, create_topic_key="TBW102", max_size_bytes=4 * MiB, msg_id=item.msg_id
        )
        assert (item.topic, item.flag, item.body, item.props, item.properties) == (
            alone.topic, alone.flag, alone.body, alone.props, alone.properties,
        ), msg  # fmt: skip
        assert (item.size_bytes, item.delayed) == (alone.size_bytes, alone.delayed)
        assert type(item.body) is bytes


def test_a_tag_the_batch_cannot_carry_is_refused_as_alone() -> None:
    with pytest.raises(MessageTooLargeError, match="properties of a message to 'A' take"):
        _batch([Message("A", b"x", tags="t"), Message("A", b"x", tags="t" * 40_000)])
    with pytest.raises(MessageTooLargeError, match="is 542 bytes"):
        _batch([Message("A", b"x" * 470, tags="tag")], max_size_bytes=530)
    with pytest.raises(InvalidArgumentError, match="U\\+0002"):
        _batch([Message("A", b"x", tags="t"), Message("A", b"x", tags="t\x02")] * 2)


def test_batch_ids_are_distinct_and_bodies_become_bytes() -> None:
    items = _batch(Message("A", bytearray(b"xy")) for _ in range(300))  # type: ignore[arg-type]
    ids = [i.msg_id for i in items] + [_one(Message("A", b"x")).msg_id]
    assert len(set(ids)) == 301
    assert all(len(i) == 32 and i == i.upper() and bytes.fromhex(i) for i in ids)
    assert all(type(i.body) is bytes and i.body == b"xy" for i in items)


def test_unique_ids_carry_the_pid_and_a_forked_child_gets_its_own() -> None:
    parent = new_unique_id()
    assert int(parent[8:12], 16) == os.getpid() & 0xFFFF
    batch = new_unique_ids(5)
    assert len({i[:28] for i in batch}) == 1  # prefix and time: one clock reading per batch
    assert {i[:20] for i in batch} == {parent[:20]}  # ip, pid, random: fixed per process
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one id, written back, then out without pytest's teardown
        os.write(write_fd, new_unique_id().encode())
        os._exit(0)
    os.close(write_fd)
    child = os.read(read_fd, 64).decode()
    os.close(read_fd)
    os.waitpid(pid, 0)
    assert int(child[8:12], 16) == pid & 0xFFFF
    assert child[:20] != parent[:20]


def test_results_equal_sendresults_and_share_the_requests_queue() -> None:
    mq = MessageQueue("T", "b", 3)
    resp = messaging_pb2.SendResponse()
    resp.results.add(
        status=messaging_pb2.SEND_OK, msg_id="M1", offset_msg_id="O1", queue_id=3, queue_offset=9
    )
    resp.results.add(
        status=messaging_pb2.FLUSH_DISK_TIMEOUT, msg_id="M2", offset_msg_id="O2", queue_id=5,
        queue_offset=1, transaction_id="tx",
    )  # fmt: skip
    first, second = to_results(resp, mq, 2, "addr")
    assert first == SendResult(SendStatus.SEND_OK, "M1", "O1", mq, 9, "")
    assert first.message_queue is mq
    assert hash(first) == hash(SendResult(SendStatus.SEND_OK, "M1", "O1", mq, 9))
    assert second == send_result(
        SendStatus.FLUSH_DISK_TIMEOUT, "M2", "O2", MessageQueue("T", "b", 5), 1, "tx"
    )
    with pytest.raises(AttributeError):  # still frozen
        first.queue_offset = 1  # type: ignore[misc]
    with pytest.raises(ServerError, match="2 results for 3"):
        to_results(resp, mq, 3, "addr")


def test_send_request_records_decode_to_the_prepared_messages() -> None:
    items = _batch([Message("T", os.urandom(n), tags=f"t{n}", flag=n) for n in (5, 700, 3000)])
    req = build_send_request("g", MessageQueue("T", "b", 0), items, as_records=True)
    assert not req.messages and codec.count_records(req.records) == 3
    pos = 0
    for item in items:
        record = codec.decode_record(req.records, pos)
        assert (record.body, record.flag, record.topic) == (item.body, item.flag, "T")
        assert record.properties == item.props and record.born_timestamp_ms == req.born_timestamp_ms
        assert record.body_crc == zlib.crc32(item.body) & 0x7FFFFFFF
        pos += record.total_size


def test_a_producer_checks_each_topic_once_and_every_message_always() -> None:
    core = ProducerCore(ProducerConfig("g", ["127.0.0.1:9876"], max_message_size_bytes=100))
    for _ in range(2):  # a refused topic is not remembered
        with pytest.raises(InvalidArgumentError, match="characters"):
            core.prepare(Message("bad topic!", b"x"))
        with pytest.raises(InvalidArgumentError, match="reserved"):
            core.prepare(Message("TBW102", b"x"))
    first = core.prepare(Message("Topic9", b"x", tags="a"))
    assert first.size_bytes == 6 + 1 + 20 + len(first.properties)
    with pytest.raises(InvalidArgumentError, match="empty body"):
        core.prepare(Message("Topic9", b""))
    with pytest.raises(MessageTooLargeError, match="limit is 100"):
        core.prepare(Message("Topic9", b"x" * 100))
    assert core.prepare(Message("Topic9", b"x")).msg_id != first.msg_id
