"""The controller's campaign step (services.broker.controller.campaign) on a ManualClock with a
fake etcd transaction: publish first, wait the rank's delay, then try the election txn once;
a lost race or a lease dropped meanwhile wins nothing. No sockets, no sleeps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from services.broker.controller.campaign import Campaign
from services.broker.controller.election import RANK_STEP_MS
from services.broker.controller.keys import (
    GroupKeys,
    IsrRecord,
    LeaderInfo,
    MemberState,
    Snapshot,
)
from services.broker.controller.lease import Lease
from services.broker.controller.session import ProblemLog
from services.common.clock import ManualClock

pytestmark = pytest.mark.unit

TTL_S = 2
ME = 2
ADDR = f"127.0.0.1:1090{ME}"


def member(replica_id: int) -> MemberState:
    return MemberState(replica_id, f"127.0.0.1:1090{replica_id}", 100, 1, 0, True)


class FakeSession:
    """Answers election transactions with ``won``; ``during_txn`` runs while one is out."""

    def __init__(self) -> None:
        self.won = True
        self.txns: list[str] = []
        self.during_txn: Callable[[], None] = lambda: None

    async def txn(self, compare: list[Any], success: list[Any], what: str) -> bool:
        self.txns.append(what)
        self.during_txn()
        return self.won


class Harness:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.session = FakeSession()
        self.published = 0
        self.wakes = 0
        problems = ProblemLog(logging.getLogger(__name__), "test")
        self.lease = Lease(
            None,  # type: ignore[arg-type]  # never called: the lease is set up by hand
            TTL_S,
            self.clock,
            name="test",
            problems=problems,
            on_granted=lambda: None,
            on_lost=lambda _reason: None,
        )
        self.lease.lease_id = 0x51
        self.lease.write_lease_until = 100.0
        self.campaign = Campaign(
            self.session,  # type: ignore[arg-type]
            GroupKeys("/t", "DefaultCluster", "broker-a"),
            self.lease,
            self.clock,
            name="test",
            replica_id=ME,
            addr=ADDR,
            member_state=lambda: member(ME),
            publish_member=self._publish,
            wake=self._wake,
        )

    async def _publish(self) -> None:
        self.published += 1

    def _wake(self) -> None:
        self.wakes += 1


def no_leader(epoch: int = 1) -> Snapshot:
    """A read of the group after its leader key vanished: 1 and 2 in sync, 1 ranked first."""
    return Snapshot(
        revision=9,
        epoch=epoch,
        epoch_mod_revision=7,
        isr=IsrRecord(epoch, frozenset({1, ME})),
        members={1: member(1), ME: member(ME)},
    )


async def test_the_second_ranked_replica_publishes_waits_its_rank_then_wins() -> None:
    h = Harness()
    assert await h.campaign.step(no_leader()) is None  # first look: fresh numbers, read again
    assert (h.published, h.wakes, h.session.txns) == (1, 1, [])
    h.clock.advance_ms(100)
    assert await h.campaign.step(no_leader()) is None
    assert h.campaign.campaign_at == pytest.approx(RANK_STEP_MS / 1000)
    assert h.campaign.wait_s(1.0) == pytest.approx(0.4)  # the main loop wakes up for it
    h.clock.advance_ms(RANK_STEP_MS - 100)
    won = await h.campaign.step(no_leader())
    assert won is not None and h.session.txns == ["election"]
    assert won.leader == LeaderInfo(ME, ADDR, 2)
    assert won.isr == IsrRecord(2, frozenset({ME}))
    assert h.campaign.campaign_at is None


async def test_a_lost_race_or_a_lease_dropped_meanwhile_wins_nothing() -> None:
    h = Harness()
    await h.campaign.step(no_leader())
    h.clock.advance_ms(RANK_STEP_MS)
    h.session.won = False
    assert await h.campaign.step(no_leader()) is None
    assert h.wakes == 2  # read again, and follow whoever won
    h.session.won = True
    h.session.during_txn = lambda: setattr(h.lease, "lease_id", None)
    assert await h.campaign.step(no_leader()) is None  # its key hangs on a dead lease
    assert h.wakes == 3


async def test_no_campaign_without_a_lease_surely_valid_in_etcd() -> None:
    h = Harness()
    h.lease.write_lease_until = 0.0  # the fence has passed
    assert await h.campaign.step(no_leader()) is None
    assert (h.published, h.wakes, h.campaign.no_leader_since) == (0, 0, None)


async def test_a_replica_outside_the_isr_never_campaigns() -> None:
    h = Harness()
    snap = no_leader()
    snap.isr = IsrRecord(1, frozenset({1}))
    await h.campaign.step(snap)
    h.clock.advance_ms(10 * RANK_STEP_MS)
    assert await h.campaign.step(snap) is None
    assert h.session.txns == [] and h.campaign.campaign_at is None


async def test_a_leader_seen_resets_the_wait() -> None:
    h = Harness()
    await h.campaign.step(no_leader())
    h.clock.advance_ms(100)
    await h.campaign.step(no_leader())
    h.campaign.leader_seen()
    assert h.campaign.no_leader_since is None and h.campaign.wait_s(1.0) == 1.0
