"""Queue locks over real broker processes and raw gRPC stubs (SPEC §6.15, messaging.proto).

One nameserver, a master (broker-a) and a slave of it (brokerId 1, no nameserver) for the module.
Each test uses its own topic and group names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from grpc_status import rpc_status

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from tests.integration.cluster import ServiceProcess, start_broker, start_nameserver

pytestmark = pytest.mark.integration

BROKER = "broker-a"
T = TypeVar("T")
Queue = tuple[str, int]


@dataclass
class Env:
    master: ServiceProcess
    slave: ServiceProcess


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("locks")
    procs: list[ServiceProcess] = []
    try:
        ns = start_nameserver(root)
        procs.append(ns)
        master = start_broker(root, [ns.addr], BROKER)
        procs.append(master)
        slave = start_broker(root / "slave", [], BROKER, brokerId=1, brokerRole="SLAVE")
        procs.append(slave)
        yield Env(master, slave)
        for p in procs[1:]:
            assert p.alive(), f"{p.name} died:\n{p.log_tail()}"
            log = p.log_path.read_text(errors="replace")
            assert "Traceback" not in log, f"{p.name} logged an exception:\n{p.log_tail()}"
    finally:
        for p in reversed(procs):
            p.stop()


class Client:
    """Messaging and Admin stubs on one channel."""

    def __init__(self, addr: str) -> None:
        self.channel = grpc.aio.insecure_channel(addr)
        self.stub = messaging_pb2_grpc.MessagingStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)

    async def make_topic(self, topic: str, queues: int = 4) -> None:
        await self.stub.Send(
            messaging_pb2.SendRequest(
                producer_group="pg",
                default_topic="TBW102",
                default_topic_queue_nums=queues,
                messages=[common_pb2.Message(topic=topic, body=b"x")],
            )
        )

    async def lock(
        self, group: str, client_id: str, queues: list[Queue], broker: str = BROKER
    ) -> list[Queue]:
        resp = await self.stub.LockBatch(
            messaging_pb2.LockBatchRequest(
                consumer_group=group, client_id=client_id, queues=_mqs(queues, broker)
            )
        )
        for mq in resp.locked_queues:
            assert mq.broker_name == BROKER
        return [(mq.topic, mq.queue_id) for mq in resp.locked_queues]

    async def unlock(self, group: str, client_id: str, queues: list[Queue]) -> None:
        await self.stub.UnlockBatch(
            messaging_pb2.UnlockBatchRequest(
                consumer_group=group, client_id=client_id, queues=_mqs(queues, BROKER)
            )
        )

    async def set_config(self, key: str, value: str) -> None:
        await self.admin.UpdateBrokerConfig(
            admin_pb2.UpdateBrokerConfigRequest(updates={key: value})
        )


def _mqs(queues: list[Queue], broker: str) -> list[common_pb2.MessageQueue]:
    return [common_pb2.MessageQueue(topic=t, broker_name=broker, queue_id=q) for t, q in queues]


async def client(addr: str) -> AsyncIterator[Client]:
    c = Client(addr)
    try:
        yield c
    finally:
        await c.channel.close()


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


async def refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, int]:
    """Await ``call``, which must fail; its code and ErrorDetail reason."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        status = rpc_status.from_call(err)
        reason = common_pb2.ERROR_REASON_UNSPECIFIED
        if status is not None and status.details:
            detail = common_pb2.ErrorDetail()
            status.details[0].Unpack(detail)
            reason = detail.reason
        return err.code(), reason
    raise AssertionError("the call succeeded but was expected to fail")


def test_lock_renew_unlock_round_trip(env: Env) -> None:
    async def main() -> None:
        async for c in client(env.master.addr):
            await c.make_topic("LkRound")
            q = [("LkRound", 0), ("LkRound", 1)]
            assert await c.lock("g-round", "c1", q) == q
            assert await c.lock("g-round", "c1", q) == q  # renewal
            assert await c.lock("g-round", "c2", q) == []
            await c.unlock("g-round", "c2", q)  # not the holder: ignored
            assert await c.lock("g-round", "c2", q) == []
            await c.unlock("g-round", "c1", [q[0]])
            assert await c.lock("g-round", "c2", q) == [q[0]]
            await c.unlock("g-round", "c1", q)
            await c.unlock("g-round", "c1", q)  # nothing held any more: a no-op
            assert await c.lock("g-round", "c2", q) == q
            # another group locks the same queues independently
            assert await c.lock("g-round-2", "c1", q) == q

    run(main())


def test_two_clients_contend(env: Env) -> None:
    async def main() -> None:
        async for c in client(env.master.addr):
            await c.make_topic("LkContend", 4)
            all_q = [("LkContend", i) for i in range(4)]
            assert await c.lock("g-contend", "c1", all_q[:3]) == all_q[:3]
            assert await c.lock("g-contend", "c2", all_q) == all_q[3:]
            # Many clients race for the same queues: each queue goes to exactly one of them.
            race = all_q
            await c.unlock("g-contend", "c1", race)
            await c.unlock("g-contend", "c2", race)
            got = await asyncio.gather(*(c.lock("g-contend", f"r{i}", race) for i in range(6)))
            owners: dict[Queue, list[int]] = {}
            for i, held in enumerate(got):
                for queue in held:
                    owners.setdefault(queue, []).append(i)
            assert sorted(owners) == race
            assert all(len(who) == 1 for who in owners.values()), owners

    run(main())


def test_expired_lock_is_taken_over(env: Env) -> None:
    async def main() -> None:
        async for c in client(env.master.addr):
            await c.make_topic("LkExpire", 2)
            q0, q1 = ("LkExpire", 0), ("LkExpire", 1)
            assert await c.lock("g-expire", "c1", [q0, q1]) == [q0, q1]
            assert await c.lock("g-expire", "c2", [q0, q1]) == []  # 60 s by default
            # The broker reads rebalanceLockMaxLiveTime at every call.
            await c.set_config("rebalanceLockMaxLiveTime", "1000")
            try:
                t0_end = time.monotonic()
                assert await c.lock("g-expire", "c1", [q0, q1]) == [q0, q1]
                await asyncio.sleep(0.6)
                t1_start = time.monotonic()
                assert await c.lock("g-expire", "c1", [q1]) == [q1]  # renewed in time
                await asyncio.sleep(max(0.0, t0_end + 1.2 - time.monotonic()))
                got = await c.lock("g-expire", "c2", [q0, q1])
                assert q0 in got  # last locked over 1 s ago: taken over
                if time.monotonic() - t1_start < 1.0:  # (a stalled test machine may be late)
                    assert got == [q0]
                await asyncio.sleep(1.2)
                assert await c.lock("g-expire", "c2", [q0, q1]) == [q0, q1]
                assert await c.lock("g-expire", "c1", [q0, q1]) == []
            finally:
                await c.set_config("rebalanceLockMaxLiveTime", "60000")
        log = env.master.log_path.read_text(errors="replace")
        assert "taken over by c2 from c1" in log

    run(main())


def test_locks_show_in_consumer_connection(env: Env) -> None:
    async def main() -> None:
        async for c in client(env.master.addr):
            await c.make_topic("LkShow", 2)
            stream = c.stub.ClientStream()
            await stream.write(
                messaging_pb2.ClientStreamRequest(
                    heartbeat=messaging_pb2.Heartbeat(
                        client_id="c-show",
                        consumers=[
                            messaging_pb2.ConsumerData(
                                consumer_group="g-show",
                                consume_orderly=True,
                                subscriptions=[
                                    messaging_pb2.SubscriptionData(topic="LkShow", expression="*")
                                ],
                            )
                        ],
                    )
                )
            )
            msg = await asyncio.wait_for(stream.read(), 5)  # the heartbeat ack
            assert msg is not grpc.aio.EOF
            assert await c.lock("g-show", "c-show", [("LkShow", 1), ("LkShow", 0)]) == [
                ("LkShow", 1),
                ("LkShow", 0),
            ]
            conn = await c.admin.GetConsumerConnection(
                admin_pb2.GetConsumerConnectionRequest(consumer_group="g-show")
            )
            assert [(lk.topic, lk.queue_id, lk.client_id) for lk in conn.locks] == [
                ("LkShow", 0, "c-show"),
                ("LkShow", 1, "c-show"),
            ]
            assert all(lk.last_lock_ms > 0 for lk in conn.locks)
            stream.cancel()

    run(main())


def test_bad_lock_requests_and_slave(env: Env) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    async def main() -> None:
        async for c in client(env.master.addr):
            await c.make_topic("LkBad", 2)
            ok = [("LkBad", 0)]
            cases: list[tuple[Awaitable[Any], grpc.StatusCode]] = [
                (c.lock("", "c1", ok), invalid),
                (c.lock("bad group!", "c1", ok), invalid),
                (c.lock("g-bad", "", ok), invalid),
                (c.lock("g-bad", "c" * 300, ok), invalid),
                (c.lock("g-bad", "c\n1", ok), invalid),
                (c.lock("g-bad", "c1", []), invalid),
                (c.lock("g-bad", "c1", [("LkBad", i % 2) for i in range(1025)]), invalid),
                (c.lock("g-bad", "c1", ok, broker="broker-z"), invalid),
                (c.lock("g-bad", "c1", [("NoSuchTopicHere", 0)]), invalid),
                (c.lock("g-bad", "c1", [("bad topic!", 0)]), invalid),
                (c.lock("g-bad", "c1", [("LkBad", 2)]), invalid),
                (c.lock("g-bad", "c1", [("LkBad", -1)]), invalid),
                (c.unlock("g-bad", "", ok), invalid),
                (c.unlock("", "c1", ok), invalid),
            ]
            for call, code in cases:
                got = await refused(call)
                assert got == (code, common_pb2.ILLEGAL_ARGUMENT), got
            # nothing was locked by the refused requests; the broker keeps serving
            assert await c.lock("g-bad", "c2", ok) == ok
        async for s in client(env.slave.addr):
            got = await refused(s.lock("g-bad", "c1", [("SELF_TEST_TOPIC", 0)]))
            assert got == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)
            await s.unlock("g-bad", "c1", [("SELF_TEST_TOPIC", 0)])  # a slave holds nothing

    run(main())
