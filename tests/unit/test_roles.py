"""Role switches in controller mode (services.broker.roles) and the ISR rules of the master's
tracker (haMaxTimeSlaveNotCatchup, publish ordering), with a fake controller and slave side
over a real store and replication service. ManualClock; no sockets, no sleeps (the event loop
only yields)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from services.broker.controller.keys import LeaderInfo, MemberState
from services.broker.ha_master import ReplicationService
from services.broker.ha_tracker import ReplicaTracker
from services.broker.roles import RoleManager
from services.broker.transaction_half import TransactionIndex
from services.common.errors import ServiceError
from tests.unit._broker_parts import BrokerParts
from tests.unit.test_ha_master import Master

pytestmark = pytest.mark.unit

ME = 1
ADDR = "127.0.0.1:10911"


class FakeController:
    """The controller surface roles.py uses; publish_isr records calls and can be held."""

    def __init__(self) -> None:
        self.epoch = 0
        self.leader: LeaderInfo | None = None
        self.is_leader = False
        self.write_lease_until = 0.0
        self.fence = True
        self._isr: set[int] = set()
        self.published: list[set[int]] = []
        self.publish_ok = True
        self.gate: asyncio.Event | None = None
        """When set, publish_isr waits for it (to look at the state in between)."""

    def write_fence(self) -> bool:
        return self.is_leader and self.fence

    def isr(self) -> set[int]:
        return set(self._isr)

    async def publish_isr(self, replica_ids: set[int]) -> bool:
        if self.gate is not None:
            await self.gate.wait()
        self.published.append(set(replica_ids))
        if self.publish_ok:
            self._isr = set(replica_ids)
        return self.publish_ok

    async def handover(self, target_replica_id: int) -> LeaderInfo:
        raise AssertionError("not used here")

    def handover_candidates(self) -> list[MemberState]:
        return []

    def status(self) -> dict[str, object]:
        return {"lease_remaining_ms": 1500}

    def lease_remaining_ms(self) -> int:
        return 1500


class FakeSlave:
    """Records what the RoleManager starts and stops on the slave side."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        self.calls.append("start")
        self._running = True

    def repoint(self) -> None:
        self.calls.append("repoint")

    async def stop(self) -> None:
        self.calls.append("stop")
        self._running = False

    def promoted(self) -> None:
        self.calls.append("promoted")


class Replica:
    """A broker's parts in controller mode with a RoleManager over fakes."""

    def __init__(self, root: Path, role: str = "SYNC_MASTER") -> None:
        self.parts = BrokerParts(
            root,
            etcd_endpoints=["127.0.0.1:2379"],
            broker_id=ME,
            broker_role=role,
            ha_housekeeping_interval_ms=20_000,
        )
        p = self.parts
        self.config = p.config
        self.replication = ReplicationService(
            config=p.config,
            store=p.store,
            topics=p.topics,
            groups=p.groups,
            offsets=p.offsets,
            clock=p.clock,
        )
        p.sender.ha_waiter = self.replication.waiter
        self.controller = FakeController()
        self.slave = FakeSlave()
        self.reregistered: list[int] = []
        self.roles = RoleManager(
            config=p.config,
            store=p.store,
            replication=self.replication,
            slave=self.slave,
            addr=ADDR,
            transactions=TransactionIndex(),
            offsets=p.offsets,
            reregister=self._reregister,
        )
        self.roles.attach(self.controller)

    async def _reregister(self, old_id: int) -> None:
        self.reregistered.append(old_id)

    @property
    def tracker(self) -> ReplicaTracker:
        return self.replication.tracker

    async def promote(self, epoch: int = 2) -> None:
        self.controller.is_leader = True
        self.controller.epoch = epoch
        self.controller._isr = {ME}
        await self.roles.become_master(epoch)

    async def close(self) -> None:
        await self.replication.stop()
        self.parts.close()


async def settle() -> None:
    """Let ready tasks run (the ISR publisher); no time passes."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_controller_mode_starts_as_a_candidate_slave_and_follows_a_leader(
    tmp_path: Path,
) -> None:
    r = Replica(tmp_path)
    cfg = r.config
    assert (cfg.broker_id, cfg.broker_role, cfg.is_master) == (ME, "SLAVE", False)
    assert r.roles.role == "candidate" and r.roles.master_addr() == ""
    await r.roles.become_slave(LeaderInfo(2, "127.0.0.1:20000", 3))
    assert r.roles.role == "slave" and r.slave.calls == ["start"]
    assert r.roles.master_addr() == "127.0.0.1:20000"
    assert r.reregistered == []  # still registered under its replica id
    await r.roles.become_slave(LeaderInfo(3, "127.0.0.1:30000", 4))
    assert r.slave.calls == ["start", "start"]  # SlaveSide.start re-points a running one
    assert r.roles.master_addr() == "127.0.0.1:30000" and r.roles.epoch == 4
    assert r.roles.member_state() == MemberState(ME, ADDR, 0, 0, 0, True)
    await r.close()


async def test_become_master_mutates_the_config_after_the_epoch_and_reregisters(
    tmp_path: Path,
) -> None:
    r = Replica(tmp_path)
    r.parts.create_topic("T")
    r.parts.append("T", count=3)
    await r.roles.become_slave(LeaderInfo(2, "127.0.0.1:20000", 1))
    await r.promote(epoch=2)
    cfg, store = r.config, r.parts.store
    assert (cfg.broker_id, cfg.broker_role, cfg.is_master) == (0, "SYNC_MASTER", True)
    assert store.epochs.entries[-1] == (2, store.commitlog.max_offset)
    assert r.slave.calls == ["start", "stop", "promoted"]
    assert r.reregistered == [ME]  # the replica id unregistered, 0 registered
    assert store.confirm_offset is None  # no in-sync slave: nothing bounds reads
    assert r.replication._started  # streams are accepted now
    r.controller.fence = False  # the lease fence drops: no write is acknowledged
    assert not cfg.is_master
    r.controller.fence = True
    r.roles.handing_over = True  # a switchover fences too
    assert not cfg.is_master
    stats = admin_pb2.GetRuntimeStatsResponse()
    r.roles.fill_stats(stats)
    assert stats.controller_mode and stats.replica_id == ME
    assert list(stats.in_sync_replica_ids) == [ME] and stats.lease_remaining_ms == 1500
    await r.close()


async def test_no_promotion_when_leadership_went_while_taking_over(tmp_path: Path) -> None:
    r = Replica(tmp_path)
    r.controller.is_leader = False
    await r.roles.become_master(2)
    assert r.config.broker_id == ME and not r.config.is_master
    assert r.roles.role != "master" and r.reregistered == []
    await r.close()


async def test_an_observer_is_never_promoted(tmp_path: Path) -> None:
    r = Replica(tmp_path, role="SLAVE")
    assert not r.roles.member_state().eligible
    await r.promote()
    assert r.config.broker_id == ME and r.roles.role == "candidate"
    await r.close()


async def test_lost_lease_demotes_at_once_and_fails_sync_waiters_with_not_master(
    tmp_path: Path,
) -> None:
    r = Replica(tmp_path)
    await r.promote()
    link = r.tracker.connect(2, "127.0.0.1:20000", 0)
    r.tracker.on_ack(link, 0, 0)
    assert link.in_sync
    r.parts.create_topic("T")
    send = asyncio.create_task(r.parts.sender.send(_send("T"), "ipv4:10.0.0.1:1"))
    await settle()
    assert r.replication.waiter.pending == 1 and not send.done()
    r.roles.lost_leadership("lease expired")  # synchronous: before any other callback
    cfg = r.config
    assert (cfg.broker_id, cfg.broker_role, cfg.is_master) == (ME, "SLAVE", False)
    assert link.closed  # the slaves' streams end
    with pytest.raises(ServiceError) as err:
        await send
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.reason == common_pb2.NOT_MASTER
    await settle()
    assert r.reregistered == [ME, 0]  # as 0 on promotion, back to the replica id now
    assert not r.replication._started
    # readers stay at what the in-sync slave confirmed: the unacknowledged send is hidden
    assert r.parts.store.confirm_offset == 0 < r.parts.store.commitlog.max_offset
    await r.roles.become_slave(LeaderInfo(2, "127.0.0.1:20000", 3))
    assert r.roles.role == "slave" and r.slave.calls[-1] == "start"
    await r.close()


async def test_a_new_leader_demotes_a_master(tmp_path: Path) -> None:
    r = Replica(tmp_path)
    await r.promote()
    await r.roles.become_slave(LeaderInfo(3, "127.0.0.1:30000", 3))
    assert r.config.broker_id == ME and not r.config.is_master
    assert r.roles.role == "slave" and r.reregistered == [ME, 0]
    assert r.slave.calls[-1] == "start"
    await r.close()


async def test_isr_expands_after_joining_and_shrinks_only_after_publishing(tmp_path: Path) -> None:
    r = Replica(tmp_path)
    await r.promote()
    tracker, c = r.tracker, r.controller
    r.parts.create_topic("T")
    link = tracker.connect(2, "127.0.0.1:20000", r.parts.store.commitlog.max_offset)
    c.gate = asyncio.Event()
    tracker.on_ack(link, link.start_offset, link.start_offset)
    assert link.in_sync  # expand: waited on locally before it is published
    await settle()
    assert c.published == []
    c.gate.set()
    await settle()
    assert c.published == [{1, 2}] and c.isr() == {1, 2}
    # shrink: the slave goes away; until {1} is published its last ack bounds reads
    c.gate = asyncio.Event()
    held_at = link.acked_offset
    r.parts.append("T", count=2)
    tracker.close(link, "gone")
    assert 2 in tracker.retained and tracker.bound == held_at
    assert r.parts.store.confirm_offset == held_at
    await settle()
    c.gate.set()
    await settle()
    assert c.published[-1] == {1} and tracker.retained == {}
    assert tracker.bound is None and r.parts.store.confirm_offset is None
    await r.close()


async def test_a_failed_shrink_keeps_the_member_retained(tmp_path: Path) -> None:
    r = Replica(tmp_path)
    await r.promote()
    tracker, c = r.tracker, r.controller
    link = tracker.connect(2, "127.0.0.1:20000", 0)
    tracker.on_ack(link, 0, 0)
    await settle()
    assert c.isr() == {1, 2}
    c.publish_ok = False
    tracker.close(link, "gone")
    await settle()
    assert c.published[-1] == {1} and c.isr() == {1, 2}
    assert 2 in tracker.retained and tracker.bound == 0  # still waiting on it
    await r.close()


def test_a_slave_that_never_catches_up_leaves_after_ha_max_time_slave_not_catchup() -> None:
    m = Master(ha_max_time_slave_not_catchup_ms=3000, ha_slave_fallbehind_max=1 << 20)
    link = m.connect()
    m.stream(link)
    m.ack(link, 0)
    assert link.in_sync
    m.append(100)
    m.stream(link)
    m.ack(link, 100)  # caught up with the max as of its previous ack
    for _ in range(4):  # from here on always 100 bytes behind a moving max
        m.clock.advance_ms(1000)
        m.append(100)
        m.stream(link)
        m.ack(link, m.max - 100)
    m.clock.advance_ms(500)
    m.tracker.housekeep()
    assert link.in_sync  # each ack reached where the master was at the previous ack
    m.append(10_000)
    m.stream(link)
    m.clock.advance_ms(1000)
    m.ack(link, link.acked_offset + 100)  # reaches the max as of its previous ack, once more
    caught_up_s = link.caught_up_s
    while m.clock.monotonic_s() - caught_up_s <= 3.0:  # then it falls behind for good
        assert link.in_sync
        m.clock.advance_ms(500)
        m.ack(link, link.acked_offset + 100)
        m.tracker.housekeep()
    assert not link.in_sync


def _send(topic: str) -> messaging_pb2.SendRequest:
    return messaging_pb2.SendRequest(
        producer_group="g",
        queue_id=0,
        messages=[common_pb2.Message(topic=topic, body=b"x")],
        born_timestamp_ms=1,
    )
