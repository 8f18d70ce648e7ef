"""The compact answer to a batch (SendRequest.compact_response, SendResponse.batch): the broker
names where the batch went in five fields, the producer rebuilds from them and its own ids the
same SendResults the per-message answer gives (issue 16)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.errors import ServerError
from rocketq.client.producer._sender import (
    PreparedMessage,
    batch_results,
    build_send_request,
    prepare_batch,
    to_results,
)
from rocketq.message import Message, MessageQueue, ReceivedMessage, SendStatus, decode_records
from tests.unit._broker_parts import PEER, BrokerParts

pytestmark = pytest.mark.unit


@pytest.fixture
def b(tmp_path: Path) -> Iterator[BrokerParts]:
    parts = BrokerParts(tmp_path)  # 1 MiB commitlog files: a batch of 40 x 30 KiB spans two
    parts.create_topic("T")
    yield parts
    parts.close()


def _items(n: int, body_bytes: int = 100) -> list[PreparedMessage]:
    msgs = [Message("T", bytes([65 + i % 26]) * body_bytes, tags=f"t{i}") for i in range(n)]
    return prepare_batch(msgs, create_topic_key="TBW102", max_size_bytes=4 << 20)


def _request(items: list[PreparedMessage], queue_id: int = 1) -> messaging_pb2.SendRequest:
    return build_send_request("pg", MessageQueue("T", "broker-a", queue_id), items, as_records=True)


def _stored(b: BrokerParts, count: int) -> list[ReceivedMessage]:
    """Queue T:1 from its start (a pull returns at most its byte cap at once)."""
    out: list[ReceivedMessage] = []
    while len(out) < count:
        got = b.store.get_messages("T", 1, len(out), count - len(out))
        assert got.records, f"the queue holds {len(out)} messages, not {count}"
        out += [m for r in got.records for m in decode_records(r)]
    return out


@pytest.mark.parametrize("body_bytes", [100, 30_000], ids=["one file", "across a file roll"])
async def test_a_compact_answer_gives_the_results_the_store_holds(
    b: BrokerParts, body_bytes: int
) -> None:
    mq = MessageQueue("T", "broker-a", 1)
    first = _items(40, body_bytes)
    full_req = _request(first)
    full_req.compact_response = False
    full = await b.sender.send(full_req, PEER)
    assert len(full.results) == 40 and not full.HasField("batch")
    second = _items(40, body_bytes)
    req = _request(second)
    assert req.compact_response, "the producer asks for the compact answer"
    compact = await b.sender.send(req, PEER)
    assert not compact.results and compact.HasField("batch")
    assert compact.batch.first_queue_offset == 40 and compact.batch.queue_id == 1
    results = batch_results(compact.batch, mq, [m.msg_id for m in second], "addr")
    old = to_results(full, mq, 40, "addr")
    stored = _stored(b, 80)
    for result, msg in zip(old + results, stored, strict=True):
        assert result.status is SendStatus.SEND_OK and result.message_queue == mq
        assert (result.msg_id, result.offset_msg_id, result.queue_offset) == (
            msg.msg_id, msg.offset_msg_id, msg.queue_offset,
        )  # fmt: skip
    offsets = list(compact.batch.physical_offsets)
    assert offsets == sorted(offsets) and len(set(offsets)) == 40
    if body_bytes > 1000:  # the batch rolled over to a new commitlog file mid-way
        gaps = {y - x for x, y in itertools.pairwise(offsets)}
        assert len(gaps) > 1, "the batch did not span a file boundary"


async def test_what_needs_the_per_message_path_is_answered_per_message(b: BrokerParts) -> None:
    """A record without UNIQ_KEY goes the per-message way; its answer stays a result per
    message, which the producer reads as before."""
    records = b"".join(
        codec.encode_sent_record(b"T", b"body", codec.encode_properties({"TAGS": "x"}), 0, 0, 1)
        for _ in range(3)
    )
    req = messaging_pb2.SendRequest(producer_group="pg", records=records, compact_response=True)
    resp = await b.sender.send(req, PEER)
    assert len(resp.results) == 3 and not resp.HasField("batch")
    lone = build_send_request("pg", MessageQueue("T", "broker-a", 0), _items(1), as_records=True)
    assert not lone.compact_response, "a lone message travels as a Message, answered as before"


def test_a_compact_answer_that_does_not_fit_the_request_is_a_server_error() -> None:
    mq = MessageQueue("T", "broker-a", 1)
    batch = messaging_pb2.SendBatchResult(
        status=messaging_pb2.SEND_OK, queue_id=1, first_queue_offset=7,
        offset_msg_id_prefix="0A00000900002A9F", physical_offsets=[100, 300],
    )  # fmt: skip
    with pytest.raises(ServerError, match="2 results for 3 messages"):
        batch_results(batch, mq, ["a", "b", "c"], "addr")
    batch.status = 99  # type: ignore[assignment]
    with pytest.raises(ServerError, match="unknown send status 99"):
        batch_results(batch, mq, ["a", "b"], "addr")
    batch.status = messaging_pb2.FLUSH_DISK_TIMEOUT
    batch.queue_id = 2
    first, second = batch_results(batch, mq, ["a", "b"], "addr")
    assert first.status is SendStatus.FLUSH_DISK_TIMEOUT
    assert first.message_queue == MessageQueue("T", "broker-a", 2)
    assert (second.msg_id, second.offset_msg_id, second.queue_offset) == (
        "b", "0A00000900002A9F000000000000012C", 8,
    )  # fmt: skip
