"""Transactions on one real broker over raw gRPC stubs (SPEC §9; the SDK-level tests are
tests/system).

The module's broker checks every 300 ms, after 300 ms, at most 3 times, so check-backs and
discards happen within a couple of seconds. Each test uses its own topic and producer group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from rocketq.codec import Prop, SysFlag
from rocketq.validation import TRANS_HALF_TOPIC
from tests.integration.cluster import ServiceProcess, start_broker, start_nameserver
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

COMMIT = messaging_pb2.TRANSACTION_COMMIT
ROLLBACK = messaging_pb2.TRANSACTION_ROLLBACK
UNKNOWN = messaging_pb2.TRANSACTION_UNKNOWN
FAST_CHECKS: dict[str, object] = {
    "transactionCheckInterval": 300,
    "transactionTimeout": 300,
    "transactionCheckMax": 3,
}


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    ns = start_nameserver(tmp_path_factory.mktemp("tx_ns"))
    try:
        yield ns
    finally:
        ns.stop()


@pytest.fixture(scope="module")
def broker(
    namesrv: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    b = start_broker(
        tmp_path_factory.mktemp("tx"), [namesrv.addr], "broker-tx", None, **FAST_CHECKS
    )
    try:
        yield b
        assert b.alive(), f"broker died:\n{b.log_tail()}"
        log = b.log_path.read_text(errors="replace")
        assert "Traceback" not in log, f"the broker logged an exception:\n{b.log_tail()}"
    finally:
        b.stop()


class Client(RawClient):
    """The raw client with this module's transaction shorthands."""

    async def half(
        self, topic: str, body: bytes, group: str, queue_id: int = 0, **props: str
    ) -> messaging_pb2.SendResult:
        resp = await self.messaging.Send(
            messaging_pb2.SendRequest(
                producer_group=group,
                default_topic="TBW102",
                queue_id=queue_id,
                sys_flag=SysFlag.TRANSACTION_PREPARED,
                messages=[
                    common_pb2.Message(
                        topic=topic,
                        body=body,
                        properties={Prop.TRANSACTION_PREPARED: "true", Prop.KEYS: "k", **props},
                    )
                ],
            )
        )
        result: messaging_pb2.SendResult = resp.results[0]
        return result

    async def end(
        self, sent: messaging_pb2.SendResult, group: str, decision: int, /, **fields: Any
    ) -> None:
        request = messaging_pb2.EndTransactionRequest(
            producer_group=group,
            commitlog_offset=codec.decode_offset_msg_id(sent.offset_msg_id)[1],
            queue_offset=sent.queue_offset,
            msg_id=sent.msg_id,
            transaction_id=sent.transaction_id,
            resolution=decision,  # type: ignore[arg-type]
        )
        for name, value in fields.items():
            setattr(request, name, value)
        await self.messaging.EndTransaction(request)

    async def pull(self, topic: str, queue_id: int = 0, group: str = "tx-reader") -> list[bytes]:
        resp = await self.messaging.Pull(
            messaging_pb2.PullRequest(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                sys_flag=0x4,
                subscription="*",
                decoded=True,
            )
        )
        return [m.message.body for m in resp.messages]

    async def half_list(self, topic: str) -> admin_pb2.ListHalfMessagesResponse:
        request = admin_pb2.ListHalfMessagesRequest(topic=topic)
        listed: admin_pb2.ListHalfMessagesResponse = await self.admin.ListHalfMessages(request)
        return listed


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    code, _, _ = await refused(call)
    return code


async def test_half_is_invisible_until_commit_and_end_is_idempotent(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        sent = await c.half("TxOrders", b"paid", "tx-pg1", queue_id=0)
        assert sent.status == messaging_pb2.SEND_OK
        assert sent.transaction_id == sent.msg_id and sent.queue_id == 0
        assert await c.pull("TxOrders") == []
        code = await code_of(c.pull(TRANS_HALF_TOPIC))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        listed = await c.half_list("TxOrders")
        assert [m.transaction_id for m in listed.messages] == [sent.transaction_id]
        assert listed.messages[0].message.message.topic == "TxOrders"
        await c.end(sent, "tx-pg1", COMMIT)
        await c.end(sent, "tx-pg1", COMMIT)
        await c.end(sent, "tx-pg1", ROLLBACK)
        assert await c.pull("TxOrders") == [b"paid"]
        assert (await c.half_list("TxOrders")).total == 0
        rolled = await c.half("TxOrders", b"cancelled", "tx-pg1")
        await c.end(rolled, "tx-pg1", ROLLBACK)
        await c.end(rolled, "tx-pg1", COMMIT, from_transaction_check=True)
        await asyncio.sleep(0.8)  # a few check rounds: nothing may resurface
        assert await c.pull("TxOrders") == [b"paid"]


async def test_end_transaction_bad_input(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        sent = await c.half("TxBad", b"x", "tx-pg2")
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        cases: list[tuple[dict[str, Any], grpc.StatusCode]] = [
            ({"producer_group": ""}, invalid),
            ({"commitlog_offset": -5}, invalid),
            ({"resolution": 0}, invalid),
            ({"transaction_id": "1" * 32}, invalid),
            ({"producer_group": "someone-else"}, invalid),
            ({"commitlog_offset": 1 << 40}, grpc.StatusCode.NOT_FOUND),
        ]
        for fields, expected in cases:
            got = await code_of(c.end(sent, "tx-pg2", COMMIT, **fields))
            assert got == expected, fields
        await c.end(sent, "tx-pg2", UNKNOWN)
        assert await c.pull("TxBad") == []
        bad_max = admin_pb2.ListHalfMessagesRequest(max_num=0)
        assert await code_of(c.admin.ListHalfMessages(bad_max)) == invalid
        batch = messaging_pb2.SendRequest(
            producer_group="tx-pg2",
            default_topic="TBW102",
            sys_flag=SysFlag.TRANSACTION_PREPARED,
            messages=[common_pb2.Message(topic="TxBad", body=b) for b in (b"a", b"b")],
        )
        assert await code_of(c.messaging.Send(batch)) == invalid
        no_group = messaging_pb2.SendRequest(
            default_topic="TBW102",
            sys_flag=SysFlag.TRANSACTION_PREPARED,
            messages=[common_pb2.Message(topic="TxBad", body=b"a")],
        )
        assert await code_of(c.messaging.Send(no_group)) == invalid


async def test_check_back_reaches_a_registered_producer(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        stream = c.messaging.ClientStream()
        await stream.write(
            messaging_pb2.ClientStreamRequest(
                heartbeat=messaging_pb2.Heartbeat(
                    client_id="10.0.0.1@checker",
                    producers=[messaging_pb2.ProducerData(producer_group="tx-pg3")],
                )
            )
        )
        first = await asyncio.wait_for(stream.read(), 5)
        assert first.HasField("heartbeat_ack")
        sent = await c.half("TxChecked", b"maybe", "tx-pg3", order="42")
        await c.end(sent, "tx-pg3", UNKNOWN)
        push = await asyncio.wait_for(stream.read(), 10)
        assert push.HasField("check_transaction_state"), push
        check = push.check_transaction_state
        assert check.transaction_id == sent.transaction_id
        assert check.message.message.topic == "TxChecked"
        assert check.message.message.properties["order"] == "42"
        assert check.queue_offset > sent.queue_offset  # a re-put copy
        await c.messaging.EndTransaction(
            messaging_pb2.EndTransactionRequest(
                producer_group=check.producer_group,
                commitlog_offset=check.commitlog_offset,
                queue_offset=check.queue_offset,
                msg_id=check.msg_id,
                transaction_id=check.transaction_id,
                resolution=COMMIT,
                from_transaction_check=True,
            )
        )
        assert await c.pull("TxChecked") == [b"maybe"]
        with pytest.raises(asyncio.TimeoutError):  # no further check of a resolved one
            await asyncio.wait_for(stream.read(), 1.0)
        stream.cancel()


async def test_unanswered_checks_end_in_a_discard(broker: ServiceProcess) -> None:
    async with Client(broker.addr) as c:
        sent = await c.half("TxLost", b"orphan", "tx-pg4")
        assert (await c.half_list("TxLost")).total == 1

        async def discarded() -> bool:
            return (await c.half_list("TxLost")).total == 0

        await until(discarded, "TxLost's half message discarded", timeout_s=15)
        assert (await c.half_list("TxLost")).total == 0, "never discarded"
        await c.end(sent, "tx-pg4", COMMIT)  # too late: the discard is final
        assert await c.pull("TxLost") == []
        log = broker.log_path.read_text(errors="replace")
        assert f"transaction {sent.transaction_id}" in log and "discarded" in log


async def test_crash_before_the_commit_append_then_restart_commits_once(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    name = "broker-crash"
    b = start_broker(
        tmp_path, [ns.addr], name, env={"ROCKETQ_FAILPOINTS": "transaction_before_end_put=crash"}
    )
    try:
        async with Client(b.addr) as c:
            sent = await c.half("TxCrash", b"once", "tx-pg5")
            code = await code_of(c.end(sent, "tx-pg5", COMMIT))
            assert code == grpc.StatusCode.UNAVAILABLE
        assert b.wait_exit(10) == -9, "the failpoint did not kill the broker"
        again = start_broker(tmp_path, [ns.addr], name)  # same store, no failpoint
        async with Client(again.addr) as c:
            assert await c.pull("TxCrash") == []
            assert (await c.half_list("TxCrash")).total == 1
            await c.end(sent, "tx-pg5", COMMIT)
            assert await c.pull("TxCrash") == [b"once"]
        again.stop()
        third = start_broker(tmp_path, [ns.addr], name)  # a clean restart after the commit
        async with Client(third.addr) as c:
            await c.end(sent, "tx-pg5", COMMIT)
            await c.end(sent, "tx-pg5", ROLLBACK)
            assert await c.pull("TxCrash") == [b"once"]
            assert (await c.half_list("TxCrash")).total == 0
        assert third.stop() == 0
    finally:
        ns.stop()
