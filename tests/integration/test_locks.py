"""Queue locks over real broker processes and raw gRPC stubs (SPEC §6.15, messaging.proto).

One nameserver, a master (broker-a) and a slave of it (brokerId 1) for the module; the expiry
test gets its own cluster on a scaled clock, so the default 60 s lock life passes in seconds.
Each test uses its own topic and group names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

BROKER = "broker-a"
Queue = tuple[str, int]
LOCK_LIVE_S = 60
"""rebalanceLockMaxLiveTime's default."""
CLOCK_SPEED = 30
"""The expiry test's clock: a 60 s lock life is 2 s of real time."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("locks")
    with cluster(root, slaves=1) as c:
        yield c
        c.check_logs()


@pytest.fixture
def fast_clock(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path, clock_speed=CLOCK_SPEED) as c:
        yield c
        c.check_logs()


class Client(RawClient):
    """Lock and unlock shorthands on the raw stubs."""

    async def lock(
        self, group: str, client_id: str, queues: list[Queue], broker: str = BROKER
    ) -> list[Queue]:
        resp = await self.messaging.LockBatch(
            messaging_pb2.LockBatchRequest(
                consumer_group=group, client_id=client_id, queues=_mqs(queues, broker)
            )
        )
        for mq in resp.locked_queues:
            assert mq.broker_name == BROKER
        return [(mq.topic, mq.queue_id) for mq in resp.locked_queues]

    async def unlock(self, group: str, client_id: str, queues: list[Queue]) -> None:
        await self.messaging.UnlockBatch(
            messaging_pb2.UnlockBatchRequest(
                consumer_group=group, client_id=client_id, queues=_mqs(queues, BROKER)
            )
        )


def _mqs(queues: list[Queue], broker: str) -> list[common_pb2.MessageQueue]:
    return [common_pb2.MessageQueue(topic=t, broker_name=broker, queue_id=q) for t, q in queues]


def lock_clock_s() -> float:
    """The broker's lock clock on the expiry test's cluster: monotonic time at its speed."""
    return time.monotonic() * CLOCK_SPEED


async def lock_time_passes(since_s: float, span_s: float) -> None:
    """Wait until ``span_s`` of lock time has passed since ``since_s`` (a deliberately elapsed
    interval: nothing on the broker changes when it does, so there is no state to poll)."""
    await until(lambda: lock_clock_s() >= since_s + span_s, f"{span_s} s of lock time", 30)


async def test_lock_renew_unlock_round_trip(env: Cluster) -> None:
    async with Client(env.broker.addr) as c:
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


async def test_two_clients_contend(env: Cluster) -> None:
    async with Client(env.broker.addr) as c:
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


async def test_expired_lock_is_taken_over(fast_clock: Cluster) -> None:
    async with Client(fast_clock.broker.addr) as c:
        await c.make_topic("LkExpire", 2)
        q0, q1 = ("LkExpire", 0), ("LkExpire", 1)
        assert await c.lock("g-expire", "c1", [q0, q1]) == [q0, q1]
        assert await c.lock("g-expire", "c2", [q0, q1]) == []  # 60 s by default
        t0_end = lock_clock_s()
        assert await c.lock("g-expire", "c1", [q0, q1]) == [q0, q1]
        await lock_time_passes(t0_end, 0.6 * LOCK_LIVE_S)
        t1_start = lock_clock_s()
        assert await c.lock("g-expire", "c1", [q1]) == [q1]  # renewed in time
        await lock_time_passes(t0_end, 1.2 * LOCK_LIVE_S)
        got = await c.lock("g-expire", "c2", [q0, q1])
        assert q0 in got  # last locked over 60 s ago: taken over
        if lock_clock_s() - t1_start < LOCK_LIVE_S:  # (a stalled test machine may be late)
            assert got == [q0]
        await lock_time_passes(lock_clock_s(), 1.2 * LOCK_LIVE_S)
        assert await c.lock("g-expire", "c2", [q0, q1]) == [q0, q1]
        assert await c.lock("g-expire", "c1", [q0, q1]) == []
    log = fast_clock.broker.log_path.read_text(errors="replace")
    assert "taken over by c2 from c1" in log


async def test_locks_show_in_consumer_connection(env: Cluster) -> None:
    async with Client(env.broker.addr) as c:
        await c.make_topic("LkShow", 2)
        stream = c.messaging.ClientStream()
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


async def test_bad_lock_requests_and_slave(env: Cluster) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    async with Client(env.broker.addr) as c:
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
            got = (await refused(call))[:2]
            assert got == (code, common_pb2.ILLEGAL_ARGUMENT), got
        # nothing was locked by the refused requests; the broker keeps serving
        assert await c.lock("g-bad", "c2", ok) == ok
    async with Client(env.slaves[0].addr) as s:
        got = (await refused(s.lock("g-bad", "c1", [("SELF_TEST_TOPIC", 0)])))[:2]
        assert got == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)
        await s.unlock("g-bad", "c1", [("SELF_TEST_TOPIC", 0)])  # a slave holds nothing
