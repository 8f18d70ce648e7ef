"""Campaigning while the group has no leader key (the ranking and its delays: ``election.py``).

When the leader key disappears this replica first publishes fresh numbers and reads the group
again (so the ranking sees them), then waits its rank's delay since the key vanished, and tries
the election transaction: create P/leader under its lease and bump P/epoch, guarded by "no
leader key" and "epoch unchanged since my read". At most one replica wins an epoch; a loser
simply reads the group again and follows the winner.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aetcd import transactions as tx

from services.broker.controller import election
from services.broker.controller.election import Verdict
from services.broker.controller.keys import (
    GroupKeys,
    IsrRecord,
    LeaderInfo,
    MemberState,
    Snapshot,
    encode_epoch,
    encode_isr,
    encode_leader,
)
from services.broker.controller.lease import Lease
from services.broker.controller.session import EtcdSession
from services.common.clock import Clock

log = logging.getLogger(__name__)

NO_CANDIDATE_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class Won:
    """An election this replica won: the leader key it wrote and the P/isr of its epoch."""

    leader: LeaderInfo
    raw: bytes
    isr: IsrRecord
    plan: election.CampaignPlan


class Campaign:
    """This replica's campaign for the leader key, one step per read of the group."""

    def __init__(
        self,
        session: EtcdSession,
        keys: GroupKeys,
        lease: Lease,
        clock: Clock,
        *,
        name: str,
        replica_id: int,
        addr: str,
        member_state: Callable[[], MemberState],
        publish_member: Callable[[], Awaitable[None]],
        wake: Callable[[], None],
    ) -> None:
        self.no_leader_since: float | None = None
        """When (monotonic) this replica first saw no leader key; None while there is one."""
        self.campaign_at: float | None = None
        """When this replica's rank allows it to try (the main loop wakes up for it)."""
        self._session = session
        self._keys = keys
        self._lease = lease
        self._clock = clock
        self._name = name
        self._replica_id = replica_id
        self._addr = addr
        self._member_state = member_state
        self._publish_member = publish_member
        self._wake = wake
        self._last_note = ""
        self._last_no_candidate_log = -NO_CANDIDATE_LOG_INTERVAL_S

    def leader_seen(self) -> None:
        """A leader key exists (or this replica just won): no campaign is due."""
        self.no_leader_since = None
        self.campaign_at = None

    def wait_s(self, resync_s: float) -> float:
        """How long the main loop may sleep: until the campaign is due, at most ``resync_s``."""
        if self.campaign_at is None:
            return resync_s
        return min(resync_s, max(0.0, self.campaign_at - self._clock.monotonic_s()))

    async def step(self, snap: Snapshot) -> Won | None:
        """Act on a read without a leader key; the election won, if this step won one."""
        if not self._lease.held():
            return None  # a leader key needs a live lease to hang on
        now_s = self._clock.monotonic_s()
        if self.no_leader_since is None:
            # The leader just vanished (or this is the first look): publish fresh numbers and
            # rank on a new read, so the ranking sees them.
            self.no_leader_since = now_s
            await self._publish_member()
            self._wake()
            return None
        plan = self._plan(snap, now_s, self.no_leader_since)
        if plan is None:
            return None
        self.campaign_at = None
        return await self._try_win(snap, plan)

    def _plan(self, snap: Snapshot, now_s: float, since_s: float) -> election.CampaignPlan | None:
        """The plan when it is time to try; None (noted in the log) while it is not."""
        plan = election.plan_campaign(
            self._member_state(),
            snap.members,
            snap.isr,
            snap.handover,
            snap.epoch,
            self._lease.ttl_s,
        )
        if plan.verdict is Verdict.NO_CANDIDATE:
            if now_s - self._last_no_candidate_log >= NO_CANDIDATE_LOG_INTERVAL_S:
                self._last_no_candidate_log = now_s
                log.warning("%s: no master: %s", self._name, plan.reason)
            return None
        if plan.verdict is Verdict.NOT_CANDIDATE:
            self._note(f"not campaigning: {plan.reason}")
            return None
        due_s = since_s + plan.delay_ms / 1000
        if now_s < due_s:
            self.campaign_at = due_s
            self._note(f"campaigning in {plan.delay_ms} ms ({plan.reason})")
            return None
        return plan

    def _note(self, note: str) -> None:
        if note != self._last_note:
            self._last_note = note
            log.info("%s: %s", self._name, note)

    async def _try_win(self, snap: Snapshot, plan: election.CampaignPlan) -> Won | None:
        lease_id = self._lease.lease_id
        replica_id = self._replica_id
        new_epoch = snap.epoch + 1
        leader = LeaderInfo(replica_id, self._addr, new_epoch)
        raw = encode_leader(leader)
        isr = IsrRecord(new_epoch, election.isr_after_win(replica_id))
        k = self._keys
        won = await self._session.txn(
            [tx.Version(k.leader) == 0, tx.Mod(k.epoch) == snap.epoch_mod_revision],
            [
                tx.Put(k.leader, raw, lease=lease_id),
                tx.Put(k.epoch, encode_epoch(new_epoch)),
                tx.Put(k.isr, encode_isr(isr)),
                tx.Delete(k.handover),
            ],
            "election",
        )
        if not won:
            log.info("%s: lost the race for epoch %d", self._name, new_epoch)
            self._wake()
            return None
        if lease_id != self._lease.lease_id:
            self._wake()  # the lease was dropped meanwhile: the key is stale, delete it
            return None
        return Won(leader, raw, isr, plan)
