"""EtcdController against a real etcd: several controllers (one per replica) in this process,
each with a recording listener instead of a broker.

Covered: a fresh group elects its lowest eligible replica; a leader whose lease is revoked or
expires is replaced by the best in-sync member with the epoch bumped by one; a replica outside
P/isr never wins (and with no in-sync member alive nobody does); a leader whose keepalives stop
fences itself at ``write_lease_until``, before etcd expires its key; publish_isr only works for
the leader; handover; etcd SIGKILLed and restarted, and SIGSTOPped longer than the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import aetcd
import grpc
import pytest

from services.broker.config import BrokerConfig
from services.broker.controller import EtcdController, LeaderInfo, MemberState
from services.common.errors import ServiceError
from tests.integration.cluster import ServiceProcess, free_port, restart, start_etcd
from tests.support.until import until

pytestmark = pytest.mark.integration

TTL_S = 2
"""etcd's minimum lease TTL: failovers take about this long."""


class Recorder:
    """A ControllerListener that records every call with its monotonic time."""

    def __init__(self, replica_id: int, max_offset: int = 0, eligible: bool = True) -> None:
        self.state = MemberState(
            replica_id, f"127.0.0.1:{10900 + replica_id}", max_offset, 0, 0, eligible
        )
        self.events: list[tuple[float, str, object]] = []

    async def become_master(self, epoch: int) -> None:
        self.events.append((time.monotonic(), "master", epoch))

    async def become_slave(self, leader: LeaderInfo) -> None:
        self.events.append((time.monotonic(), "slave", leader))

    def lost_leadership(self, reason: str) -> None:
        self.events.append((time.monotonic(), "lost", reason))

    def member_state(self) -> MemberState:
        return self.state

    def kinds(self) -> list[str]:
        return [kind for _, kind, _ in self.events]

    def first(self, kind: str) -> tuple[float, object]:
        for at, k, arg in self.events:
            if k == kind:
                return at, arg
        raise AssertionError(f"no {kind} event in {self.events}")


class Group:
    """Controllers of one broker group under a unique key prefix."""

    def __init__(self, etcd_addr: str) -> None:
        self.etcd_addr = etcd_addr
        self.prefix = f"/t-{uuid.uuid4().hex[:8]}"
        self.controllers: dict[int, EtcdController] = {}
        self.listeners: dict[int, Recorder] = {}

    def add(
        self, replica_id: int, endpoints: list[str] | None = None, **state: Any
    ) -> EtcdController:
        config = BrokerConfig(
            broker_name="broker-a",
            broker_id=replica_id,
            etcd_endpoints=endpoints or [self.etcd_addr],
            controller_lease_ttl_sec=TTL_S,
            controller_key_prefix=self.prefix,
        )
        listener = Recorder(replica_id, **state)
        controller = EtcdController(config, listener, listener.state.addr)
        self.controllers[replica_id] = controller
        self.listeners[replica_id] = listener
        return controller

    async def start(self, *replica_ids: int) -> None:
        await asyncio.gather(*(self.controllers[r].start() for r in replica_ids))

    def leaders(self) -> list[int]:
        return [r for r, c in self.controllers.items() if c.is_leader]

    async def crash(self, replica_id: int) -> None:
        """Stop a controller without revoking its lease: etcd expires it after the TTL."""
        c = self.controllers[replica_id]
        c._stopping = True
        c.is_leader = False
        for task in c._tasks:
            task.cancel()
        await asyncio.wait(c._tasks)
        if c._fence_timer is not None:
            c._fence_timer.cancel()
        await c._session.close()

    async def stop_all(self) -> None:
        for c in self.controllers.values():
            if not c._stopping:
                await c.stop()

    async def get(self, name: str) -> dict[str, Any] | None:
        async with aetcd.Client(*_host_port(self.etcd_addr), timeout=2) as client:
            kv = await client.get(f"{self.prefix}/DefaultCluster/broker-a/{name}".encode())
        return None if kv is None else dict(json.loads(kv.value))


def _host_port(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


async def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> float:
    """:func:`tests.support.until.until` every 20 ms; the monotonic time it held."""
    await until(pred, what, timeout_s, 0.02)
    return time.monotonic()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    sp = start_etcd(tmp_path_factory.mktemp("etcd-shared"))
    try:
        yield sp
    finally:
        sp.kill()


@contextlib.asynccontextmanager
async def controllers(etcd_addr: str) -> AsyncIterator[Group]:
    """A Group on ``etcd_addr`` for one test (45 s at most), every controller stopped after."""
    group = Group(etcd_addr)
    try:
        async with asyncio.timeout(45):
            yield group
    finally:
        await group.stop_all()


async def test_fresh_group_elects_lowest_eligible_replica(etcd: ServiceProcess) -> None:
    async with controllers(etcd.addr) as g:
        g.add(1, eligible=False)  # an observer never leads, whatever its id
        for r in (4, 3, 2):
            g.add(r)
        await g.start(1, 4, 3, 2)
        await wait_until(lambda: bool(g.leaders()), 10, "a leader")
        assert g.leaders() == [2]
        assert g.listeners[2].kinds() == ["master"]
        assert g.listeners[2].first("master")[1] == 1
        assert await g.get("epoch") == {"epoch": 1}
        assert await g.get("isr") == {"epoch": 1, "replica_ids": [2]}
        leader = await g.get("leader")
        assert leader == {"replica_id": 2, "addr": "127.0.0.1:10902", "epoch": 1}
        for r in (1, 3, 4):
            rec = g.listeners[r]
            await wait_until(lambda: "slave" in rec.kinds(), 5, f"{r} follows")  # noqa: B023
            assert g.listeners[r].first("slave")[1] == LeaderInfo(2, "127.0.0.1:10902", 1)
            assert not g.controllers[r].write_fence()
        assert g.controllers[2].write_fence()
        status = g.controllers[3].status()
        assert status["leader_addr"] == "127.0.0.1:10902"
        members = cast(list[dict[str, object]], status["members"])
        assert [m["replica_id"] for m in members] == [1, 2, 3, 4]


async def test_revoked_leader_replaced_by_best_isr_member(etcd: ServiceProcess) -> None:
    async with controllers(etcd.addr) as g:
        g.add(1, max_offset=300)
        g.add(2, max_offset=100)
        g.add(3, max_offset=100)
        await g.start(1, 2, 3)
        await wait_until(lambda: g.leaders() == [1], 10, "replica 1 leads")
        assert await g.controllers[1].publish_isr({2, 3})
        assert await g.get("isr") == {"epoch": 1, "replica_ids": [1, 2, 3]}
        assert not await g.controllers[2].publish_isr({2})  # only the leader writes P/isr
        # 3 has more data by the time the leader goes: it must win although 2 has the lower id
        g.listeners[3].state = dataclasses.replace(g.listeners[3].state, max_offset=250)
        await wait_until(lambda: g.controllers[2].isr() == {1, 2, 3}, 5, "isr read back")

        # Elections rank the published member keys (about once a second): wait for 3's.
        async def published() -> bool:
            member = await g.get("members/3")
            return member is not None and member.get("max_offset") == 250

        await until(published, "replica 3's new max offset published", 5)
        await g.controllers[1].stop()  # revokes the lease: no TTL to wait for
        assert not await g.controllers[1].publish_isr({1})
        await wait_until(lambda: bool(g.leaders()), 10, "a new leader")
        assert g.leaders() == [3]
        assert g.listeners[3].first("master")[1] == 2
        assert await g.get("epoch") == {"epoch": 2}
        assert await g.get("isr") == {"epoch": 2, "replica_ids": [3]}
        assert g.controllers[3].old_master_replica_id == 1
        assert g.controllers[3].old_master_max_offset == 300
        await wait_until(
            lambda: g.controllers[2].leader == LeaderInfo(3, "127.0.0.1:10903", 2), 5, "2 follows"
        )
        assert g.listeners[2].events[-1][1:] == ("slave", LeaderInfo(3, "127.0.0.1:10903", 2))


async def test_member_outside_isr_never_wins_and_expiry_fences_first(etcd: ServiceProcess) -> None:
    async with controllers(etcd.addr) as g:
        g.add(1, max_offset=100)
        g.add(2, max_offset=100)
        g.add(3, max_offset=100)
        await g.start(1, 2, 3)
        await wait_until(lambda: g.leaders() == [1], 10, "replica 1 leads")
        # 3 gets the most data, but it is out of sync: it must never be elected
        g.listeners[3].state = dataclasses.replace(g.listeners[3].state, max_offset=900)
        assert await g.controllers[1].publish_isr({2})
        await wait_until(lambda: g.controllers[3].isr() == {1, 2}, 5, "isr read back")
        # the leader's keepalives stop (as if its link to etcd broke): it must stop acking at
        # write_lease_until, which comes before etcd deletes its key and 2 is elected
        leader = g.controllers[1]

        async def hang() -> None:
            await asyncio.sleep(3600)

        leader._refresh = hang  # type: ignore[method-assign]
        fence_at = leader.write_lease_until
        lost_at = await wait_until(lambda: not leader.write_fence(), 5, "the fence")
        await wait_until(lambda: "lost" in g.listeners[1].kinds(), 2, "lost_leadership")
        won_at = await wait_until(lambda: g.leaders() == [2], 10, "replica 2 elected")
        assert lost_at >= fence_at
        assert g.listeners[1].first("lost")[0] < g.listeners[2].first("master")[0]
        assert won_at - lost_at > 0.3, "etcd expired the key no earlier than the fence margin"
        assert await g.get("epoch") == {"epoch": 2}
        await wait_until(
            lambda: g.controllers[3].leader is not None and g.controllers[3].leader.replica_id == 2,
            5,
            "3 follows 2",
        )
        # now 2 dies too: 3 is the only live replica but not in P/isr = {2}: no master
        await g.crash(2)
        await g.crash(1)
        await asyncio.sleep(TTL_S + 2.5)  # a real interval: the TTL passes and nobody wins
        assert g.leaders() == []
        assert await g.get("leader") is None
        assert "master" not in g.listeners[3].kinds()


async def test_handover(etcd: ServiceProcess) -> None:
    async with controllers(etcd.addr) as g:
        for r in (1, 2, 3):
            g.add(r)
        g.add(4, eligible=False)
        await g.start(1, 2, 3, 4)
        await wait_until(lambda: g.leaders() == [1], 10, "replica 1 leads")
        with pytest.raises(ServiceError) as err:
            await g.controllers[1].handover(3)  # not in P/isr yet
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert g.controllers[1].write_fence()  # a refused handover changes nothing
        assert await g.controllers[1].publish_isr({2, 3, 4})
        await wait_until(lambda: len(g.controllers[1].handover_candidates()) == 2, 5, "members")
        with pytest.raises(ServiceError) as err:
            await g.controllers[1].handover(4)  # an observer
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(ServiceError) as err:
            await g.controllers[2].handover(3)  # not the leader
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        started = time.monotonic()
        new = await g.controllers[1].handover(3)
        assert new == LeaderInfo(3, "127.0.0.1:10903", 2)
        # Replica 3 learns that it won from its own campaign, a moment after the handover
        # returns (CI once saw no leader at all in between).
        await wait_until(lambda: g.leaders() == [3], TTL_S, "3 leads")
        assert time.monotonic() - started < TTL_S, "the target wins at once, nobody waits a TTL"
        assert "lost" in g.listeners[1].kinds()
        await wait_until(lambda: g.listeners[1].kinds()[-1] == "slave", 5, "1 follows 3")
        assert g.listeners[1].events[-1][2] == new
        # 0 = the best-ranked candidate; 1 and 2 are not in 3's fresh P/isr = {3} yet
        assert await g.controllers[3].publish_isr({1})
        await wait_until(lambda: len(g.controllers[3].handover_candidates()) == 1, 5, "members")
        assert (await g.controllers[3].handover(0)).replica_id == 1


async def test_unreachable_endpoint_skipped(etcd: ServiceProcess) -> None:
    async with controllers(etcd.addr) as g:
        g.add(1, endpoints=[f"127.0.0.1:{free_port()}", etcd.addr])
        g.add(2, endpoints=[etcd.addr, f"127.0.0.1:{free_port()}"])
        await g.start(1, 2)
        # Either may win: replica 1 can spend its first connect on the dead
        # endpoint and join after replica 2 has already formed the group.
        await wait_until(lambda: len(g.leaders()) == 1, 10, "one leader")
        leader = g.controllers[g.leaders()[0]].leader
        for r in (1, 2):
            c = g.controllers[r]
            await wait_until(lambda: c.leader == leader, 5, f"{r} sees it")  # noqa: B023


async def test_etcd_killed_and_restarted(tmp_path: Path) -> None:
    sp = start_etcd(tmp_path)
    try:
        async with controllers(sp.addr) as g:
            await _killed_and_restarted(g, sp)
    finally:
        sp.kill()


async def _killed_and_restarted(g: Group, sp: ServiceProcess) -> None:
    for r in (1, 2, 3):
        g.add(r)
    await g.start(1, 2, 3)
    await wait_until(lambda: g.leaders() == [1], 10, "replica 1 leads")
    leader = g.controllers[1]
    await asyncio.to_thread(sp.kill)
    killed_at = time.monotonic()
    await wait_until(lambda: not leader.write_fence(), TTL_S + 1, "the leader fences itself")
    assert time.monotonic() - killed_at <= TTL_S, "fenced within the lease"
    # The fence closes by the clock; the listener hears of it when the lease task next wakes.
    await wait_until(lambda: g.listeners[1].kinds()[-1] == "lost", 2, "lost_leadership")
    await asyncio.sleep(0.5)  # a quiet interval with etcd down: nothing may crash
    assert all(not t.done() for c in g.controllers.values() for t in c._tasks)
    await asyncio.to_thread(restart, sp)
    await wait_until(lambda: len(g.leaders()) == 1, 15, "a leader after etcd returns")
    new_leader = g.controllers[g.leaders()[0]]
    assert new_leader.epoch == 2
    assert await g.get("epoch") == {"epoch": 2}
    for r, c in g.controllers.items():
        await wait_until(lambda: c.leader == new_leader.leader, 5, f"{r} sees it")  # noqa: B023


async def test_etcd_paused_longer_than_ttl(tmp_path: Path) -> None:
    sp = start_etcd(tmp_path)
    try:
        async with controllers(sp.addr) as g:
            await _paused(g, sp)
    finally:
        sp.resume()
        sp.kill()


async def _paused(g: Group, sp: ServiceProcess) -> None:
    for r in (1, 2):
        g.add(r)
    await g.start(1, 2)
    await wait_until(lambda: g.leaders() == [1], 10, "replica 1 leads")
    sp.pause()
    paused_at = time.monotonic()
    await wait_until(lambda: not g.controllers[1].write_fence(), TTL_S + 1, "the fence")
    assert time.monotonic() - paused_at <= TTL_S
    await asyncio.sleep(TTL_S + 1)  # a real interval: past the TTL, nobody leads
    assert g.leaders() == []
    sp.resume()
    await wait_until(lambda: len(g.leaders()) == 1, 15, "a leader after etcd resumes")
    assert await g.get("epoch") == {"epoch": 2}
