"""Half messages, EndTransaction and ListHalfMessages on a real store, without sockets (SPEC §9).

The broker parts are the real ones (store, managers, Send, EndTransaction, the shared index);
:class:`Tx` wires them like server.py does. test_transaction_check.py reuses it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import admin_pb2, messaging_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.validation import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from services.broker.send_processor import SendProcessor
from services.broker.transaction_admin import list_half_messages
from services.broker.transaction_end import EndTransactionProcessor
from services.broker.transaction_half import CHECK_GROUP, TRAN_ID, TRAN_STATE, TransactionIndex
from services.common import failpoints
from services.common.errors import ServiceError
from tests.unit._broker_parts import PEER, BrokerParts, send_request

pytestmark = pytest.mark.unit

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
COMMIT = messaging_pb2.TRANSACTION_COMMIT
ROLLBACK = messaging_pb2.TRANSACTION_ROLLBACK
UNKNOWN = messaging_pb2.TRANSACTION_UNKNOWN


class Tx(BrokerParts):
    """BrokerParts plus the transaction pieces sharing one index."""

    def __init__(self, root: Path, **config: object) -> None:
        super().__init__(root, **config)  # type: ignore[arg-type]
        self.create_topic("T")
        self.index = TransactionIndex()
        self.index.rebuild(self.store, self.offsets)
        self.sender = SendProcessor(
            config=self.config,
            store=self.store,
            topics=self.topics,
            clock=self.clock,
            transactions=self.index,
        )
        self.ends = EndTransactionProcessor(
            config=self.config,
            store=self.store,
            topics=self.topics,
            offsets=self.offsets,
            index=self.index,
            clock=self.clock,
        )

    async def half(
        self, body: bytes = b"order", *, queue_id: int = 1, **props: str
    ) -> messaging_pb2.SendResult:
        req = send_request(
            "T",
            [body],
            queue_id=queue_id,
            properties={Prop.TAGS: "Paid", Prop.KEYS: "k1", "biz": "7", **props},
            sys_flag=SysFlag.TRANSACTION_PREPARED,
        )
        return (await self.sender.send(req, PEER)).results[0]

    async def end(
        self, sent: messaging_pb2.SendResult, decision: int, /, **fields: object
    ) -> messaging_pb2.EndTransactionResponse:
        _, offset = codec.decode_offset_msg_id(sent.offset_msg_id)
        request = messaging_pb2.EndTransactionRequest(
            producer_group="pg",
            commitlog_offset=offset,
            queue_offset=sent.queue_offset,
            msg_id=sent.msg_id,
            transaction_id=sent.transaction_id,
            resolution=decision,  # type: ignore[arg-type]
        )
        for name, value in fields.items():
            setattr(request, name, value)
        return await self.ends.end(request)

    def records(self, topic: str, queue_id: int = 0) -> list[codec.Record]:
        got = self.store.get_messages(topic, queue_id, 0, 1000)
        return [codec.decode_record(r) for r in got.records]

    async def listed(self, **fields: object) -> admin_pb2.ListHalfMessagesResponse:
        request = admin_pb2.ListHalfMessagesRequest(**fields)  # type: ignore[arg-type]
        return await list_half_messages(request, self.store, self.offsets)


@pytest.fixture
def tx(tmp_path: Path) -> Iterator[Tx]:
    parts = Tx(tmp_path)
    yield parts
    parts.close()


async def refused(call: Awaitable[object]) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        await call
    return err.value


# -- half messages ---------------------------------------------------------------------------
async def test_half_message_is_stored_in_the_half_topic_only(tx: Tx) -> None:
    sent = await tx.half(TRANSACTION_CHECK_TIMES="9")
    assert sent.status == messaging_pb2.SEND_OK
    assert sent.queue_id == 1 and sent.queue_offset == 0
    assert sent.transaction_id == sent.msg_id and len(sent.msg_id) == 32
    assert tx.store.max_offset("T", 1) == 0, "a half message is visible in its real topic"
    [rec] = tx.records(TRANS_HALF_TOPIC)
    assert rec.sys_flag & SysFlag.TRANSACTION_MASK == 0
    assert codec.encode_offset_msg_id(rec.store_host, rec.physical_offset) == sent.offset_msg_id
    assert rec.properties[Prop.REAL_TOPIC] == "T"
    assert rec.properties[Prop.REAL_QUEUE_ID] == "1"
    assert rec.properties[Prop.TRANSACTION_PREPARED] == "true"
    assert rec.properties[Prop.PRODUCER_GROUP] == "pg"
    assert rec.properties["biz"] == "7" and rec.uniq_key == sent.msg_id
    assert Prop.TRANSACTION_CHECK_TIMES not in rec.properties, "the broker owns the check count"
    half_cfg = tx.topics.get(TRANS_HALF_TOPIC)
    assert half_cfg is not None and half_cfg.perm == 2 and half_cfg.queue_nums == 1
    assert tx.index.stats()["transaction_half_pending"] == "1"


async def test_tran_msg_property_alone_makes_a_half_message(tx: Tx) -> None:
    req = send_request("T", properties={Prop.TRANSACTION_PREPARED: "true"})
    sent = (await tx.sender.send(req, PEER)).results[0]
    assert sent.transaction_id == sent.msg_id
    assert tx.store.max_offset(TRANS_HALF_TOPIC, 0) == 1 and tx.store.max_offset("T", 0) == 0


async def test_half_message_needs_a_producer_group(tx: Tx) -> None:
    req = send_request("T", sys_flag=SysFlag.TRANSACTION_PREPARED)
    req.producer_group = ""
    err = await refused(tx.sender.send(req, PEER))
    assert err.code == INVALID and "producer_group" in err.message
    assert tx.store.commitlog.max_offset == 0


# -- EndTransaction --------------------------------------------------------------------------
async def test_commit_stores_the_real_message_and_its_op_record(tx: Tx) -> None:
    sent = await tx.half(b"paid")
    await tx.end(sent, COMMIT)
    [half] = tx.records(TRANS_HALF_TOPIC)
    [real] = tx.records("T", 1)
    assert real.body == b"paid" and real.uniq_key == sent.msg_id
    assert real.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_COMMIT
    assert real.prepared_transaction_offset == half.physical_offset
    assert real.born_timestamp_ms == half.born_timestamp_ms and real.born_host == half.born_host
    assert real.tags == "Paid" and real.keys == "k1" and real.properties["biz"] == "7"
    assert real.properties[Prop.PRODUCER_GROUP] == "pg"
    for gone in (Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID, Prop.TRANSACTION_PREPARED):
        assert gone not in real.properties
    assert [r.body for r in tx.store.query_by_key("T", "k1", 8, 0, 2**62)] == [b"paid"]
    [op] = tx.records(TRANS_OP_HALF_TOPIC)
    assert op.body == b"0" and op.tags == "d"
    assert op.properties[TRAN_ID] == sent.msg_id and op.properties[TRAN_STATE] == "COMMIT"
    assert op.physical_offset > real.physical_offset  # one append: message, then op
    assert tx.index.stats()["transaction_half_pending"] == "0"


async def test_rollback_stores_only_the_op_record(tx: Tx) -> None:
    sent = await tx.half()
    await tx.end(sent, ROLLBACK)
    assert tx.store.max_offset("T", 1) == 0
    [op] = tx.records(TRANS_OP_HALF_TOPIC)
    assert op.properties[TRAN_STATE] == "ROLLBACK"


async def test_end_is_idempotent_by_transaction_id(tx: Tx) -> None:
    committed = await tx.half(b"a")
    await tx.end(committed, COMMIT)
    await tx.end(committed, COMMIT)
    await tx.end(committed, ROLLBACK)
    rolled = await tx.half(b"b")
    await tx.end(rolled, ROLLBACK)
    await tx.end(rolled, COMMIT, from_transaction_check=True)
    assert [r.body for r in tx.records("T", 1)] == [b"a"]
    assert len(tx.records(TRANS_OP_HALF_TOPIC)) == 2


async def test_unknown_changes_nothing(tx: Tx) -> None:
    sent = await tx.half()
    before = tx.store.commitlog.max_offset
    await tx.end(sent, UNKNOWN)
    assert tx.store.commitlog.max_offset == before
    await tx.end(sent, COMMIT)
    assert len(tx.records("T", 1)) == 1


async def test_bad_requests_are_refused_and_change_nothing(tx: Tx) -> None:
    sent = await tx.half()
    plain = (await tx.sender.send(send_request("T"), PEER)).results[0]
    before = tx.store.commitlog.max_offset
    cases = [
        ({"producer_group": ""}, INVALID),
        ({"producer_group": "bad group!"}, INVALID),
        ({"commitlog_offset": -1}, INVALID),
        ({"queue_offset": -1}, INVALID),
        ({"resolution": 0}, INVALID),
        ({"resolution": 9}, INVALID),
        ({"commitlog_offset": 10**9}, NOT_FOUND),
        ({"commitlog_offset": 3}, NOT_FOUND),  # inside a record
        ({"transaction_id": "0" * 32}, INVALID),
        ({"msg_id": "F" * 32}, INVALID),
        ({"producer_group": "other"}, INVALID),
    ]
    for fields, code in cases:
        err = await refused(tx.end(sent, COMMIT, **fields))
        assert err.code == code, (fields, err)
    # a plain message is not a half message
    err = await refused(tx.end(plain, COMMIT, transaction_id="", msg_id=""))
    assert err.code == NOT_FOUND
    assert tx.store.commitlog.max_offset == before
    assert "does not match" in (await refused(tx.end(sent, COMMIT, producer_group="x"))).message


async def test_slave_refuses(tmp_path: Path) -> None:
    parts = Tx(tmp_path, broker_role="SLAVE", broker_id=1)
    try:
        req = messaging_pb2.EndTransactionRequest(producer_group="pg", resolution=COMMIT)
        err = await refused(parts.ends.end(req))
        assert err.code == grpc.StatusCode.UNAVAILABLE
    finally:
        parts.close()


async def test_commit_to_a_vanished_queue_is_refused_until_it_exists(tx: Tx) -> None:
    sent = await tx.half(queue_id=3)
    tx.topics.delete("T")
    assert (await refused(tx.end(sent, COMMIT))).code == NOT_FOUND
    assert tx.index.stats()["transaction_half_pending"] == "1"
    tx.create_topic("T")
    await tx.end(sent, COMMIT)
    assert len(tx.records("T", 3)) == 1


async def test_failpoint_before_the_append_stores_nothing(tx: Tx) -> None:
    sent = await tx.half()
    before = tx.store.commitlog.max_offset
    failpoints.reload("transaction_before_end_put=error")
    try:
        with pytest.raises(failpoints.FailpointError):
            await tx.end(sent, COMMIT)
    finally:
        failpoints.reload("")
    assert tx.store.commitlog.max_offset == before
    await tx.end(sent, COMMIT)
    assert len(tx.records("T", 1)) == 1


async def test_restart_keeps_end_idempotent(tmp_path: Path) -> None:
    parts = Tx(tmp_path)
    committed = await parts.half(b"a")
    rolled = await parts.half(b"b")
    pending = await parts.half(b"c")
    await parts.end(committed, COMMIT)
    await parts.end(rolled, ROLLBACK)
    parts.close()
    again = Tx(tmp_path)  # index rebuilt from the two topics
    try:
        assert again.index.stats()["transaction_half_pending"] == "1"
        await again.end(committed, COMMIT)
        await again.end(rolled, COMMIT)
        await again.end(pending, COMMIT)
        await again.end(pending, COMMIT)
        assert [r.body for r in again.records("T", 1)] == [b"a", b"c"]
    finally:
        again.close()


async def test_a_final_copy_below_the_progress_stays_final(tx: Tx) -> None:
    sent = await tx.half()
    await tx.end(sent, ROLLBACK)
    tx.offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, 1)
    assert tx.index.advance_ops(1) == 1
    assert tx.index.entries == {}, "the decided entry was not forgotten"
    await tx.end(sent, COMMIT)
    assert tx.store.max_offset("T", 1) == 0


# -- ListHalfMessages ------------------------------------------------------------------------
async def test_list_half_messages(tx: Tx) -> None:
    first = await tx.half(b"a")
    tx.clock.advance_ms(5)
    resolved = await tx.half(b"b")
    tx.clock.advance_ms(5)
    third = await tx.half(b"c", queue_id=2)
    tx.create_topic("U")
    other = (
        await tx.sender.send(send_request("U", sys_flag=SysFlag.TRANSACTION_PREPARED), PEER)
    ).results[0]
    await tx.end(resolved, COMMIT)
    got = await tx.listed()
    assert got.total == 3
    assert [m.transaction_id for m in got.messages] == [
        first.transaction_id,
        third.transaction_id,
        other.transaction_id,
    ]
    row = got.messages[1]
    assert row.producer_group == "pg" and row.check_times == 0
    assert row.message.message.topic == "T" and row.message.queue_id == 2
    assert row.message.message.body == b"c" and row.message.message.properties["biz"] == "7"
    assert Prop.REAL_TOPIC not in row.message.message.properties
    assert row.queue_offset == third.queue_offset
    assert codec.decode_offset_msg_id(third.offset_msg_id)[1] == row.commitlog_offset
    only_u = await tx.listed(topic="U")
    assert [m.transaction_id for m in only_u.messages] == [other.transaction_id]
    cut = await tx.listed(max_num=1)
    assert cut.total == 3 and len(cut.messages) == 1
    assert (await tx.listed(topic="nothing")).total == 0
    for bad in (0, 1001):
        assert (await refused(tx.listed(max_num=bad))).code == INVALID


async def test_list_is_empty_before_any_transaction(tx: Tx) -> None:
    got = await tx.listed()
    assert got.total == 0 and not got.messages
