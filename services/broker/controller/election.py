"""Who may lead a broker group, in which order replicas campaign, and what a read of the leader
key means for this replica. Pure functions: no etcd, no clock (the controller supplies both).

Ranking (best first) of the live members allowed to lead::

    (last_epoch desc, max_offset desc, priority asc, replica_id asc)

Allowed to lead = eligible (not an observer) AND live (its member key exists, i.e. its lease is
alive) AND in P/isr. Without P/isr (a brand-new group, no election ever finished) every eligible
live member may lead; stores are then normally empty, so the ranking falls through to priority
and the lowest replica id, and a fresh group elects deterministically: its first election
waits ``FRESH_GROUP_WAIT_MS`` so replicas started together all count, not just the first one
up. (Ranking by data first
there too means a group moved from static roles to controller mode elects the replica with the
most data, not merely the lowest id.)

The ISR rule is what makes SYNC_MASTER lossless: every member of P/isr holds every message that
was acknowledged SEND_OK, so electing only from P/isr never loses one. When no live member is in
P/isr the group stays without a master (writes unavailable, reads from slaves) until one returns.

Rank ``k`` campaigns ``k × RANK_STEP_MS`` after the leader key disappeared, so the best replica
normally wins at once and a dead rank 0 only costs half a second. A P/handover of the current
epoch naming another live candidate holds everybody else back ``HANDOVER_WAIT_TTLS`` lease TTLs,
long enough for the target to win, short enough that a target dying mid-switchover does not leave
the group leaderless for long.

The winner writes P/isr = {itself}: it has acknowledged nothing yet in its epoch, and a slave
joins again (the new master adds it locally, then publishes) once it has caught up. Keeping the
old set would be safe only if the new master waited on every one of them from its first write.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from services.broker.controller.keys import HandoverRecord, IsrRecord, LeaderInfo, MemberState

RANK_STEP_MS = 500
"""How much longer each next-ranked candidate waits before it campaigns."""
HANDOVER_WAIT_TTLS = 2
"""During a switchover, replicas other than the target wait this many lease TTLs."""
FRESH_GROUP_WAIT_MS = 1000
"""A brand-new group waits this long before its first election, so that replicas started
together all publish their member keys and the ranking (lowest id) decides, not start order."""


def rank_key(member: MemberState) -> tuple[int, int, int, int]:
    return (-member.last_epoch, -member.max_offset, member.priority, member.replica_id)


def candidates(members: Mapping[int, MemberState], isr: IsrRecord | None) -> list[MemberState]:
    """The live members allowed to lead, best first."""
    allowed = [
        m
        for m in members.values()
        if m.eligible and (isr is None or m.replica_id in isr.replica_ids)
    ]
    return sorted(allowed, key=rank_key)


class Verdict(enum.Enum):
    CAMPAIGN = "campaign"
    """Try the election txn once ``delay_ms`` passed without a leader."""
    NOT_CANDIDATE = "not a candidate"
    """Others may lead, this replica may not (observer, or outside P/isr)."""
    NO_CANDIDATE = "no candidate"
    """Nobody alive may lead: the group stays without a master."""


@dataclass(frozen=True)
class CampaignPlan:
    verdict: Verdict
    delay_ms: int = 0
    rank: int = -1
    ranking: tuple[MemberState, ...] = ()
    reason: str = ""

    def describe_ranking(self) -> str:
        """``[2(e3,o1024,p0), 3(e3,o900,p0)]`` for the election logs."""
        parts = [
            f"{m.replica_id}(e{m.last_epoch},o{m.max_offset},p{m.priority})" for m in self.ranking
        ]
        return "[" + ", ".join(parts) + "]"


def plan_campaign(
    me: MemberState,
    members: Mapping[int, MemberState],
    isr: IsrRecord | None,
    handover: HandoverRecord | None,
    epoch: int,
    lease_ttl_s: int,
) -> CampaignPlan:
    """What this replica does while the group has no leader key. ``me`` (fresh numbers) stands
    in for this replica's member key whether or not etcd has it yet."""
    live = dict(members)
    live[me.replica_id] = me
    ranking = tuple(candidates(live, isr))
    ids = [m.replica_id for m in ranking]
    if not ranking:
        if isr is not None:
            reason = (
                f"no in-sync replica alive (in-sync set {sorted(isr.replica_ids)}); not electing "
                "an out-of-sync one, which could lose acknowledged messages"
            )
        else:
            reason = "no eligible replica alive"
        return CampaignPlan(Verdict.NO_CANDIDATE, reason=reason)
    if me.replica_id not in ids:
        if not me.eligible:
            reason = "this replica is an observer (brokerRole SLAVE): it never leads"
        else:
            assert isr is not None  # without P/isr every eligible member is a candidate
            reason = f"not in the in-sync set {sorted(isr.replica_ids)}"
        return CampaignPlan(Verdict.NOT_CANDIDATE, ranking=ranking, reason=reason)
    rank = ids.index(me.replica_id)
    delay_ms = rank * RANK_STEP_MS + (FRESH_GROUP_WAIT_MS if isr is None else 0)
    reason = f"rank {rank}" + (" of a new group" if isr is None else "")
    if handover is not None and handover.epoch == epoch and handover.target_replica_id in ids:
        if handover.target_replica_id == me.replica_id:
            delay_ms = 0
            reason = "handover target"
        else:
            delay_ms += HANDOVER_WAIT_TTLS * lease_ttl_s * 1000
            reason = f"rank {rank}, waiting for handover target {handover.target_replica_id}"
    return CampaignPlan(Verdict.CAMPAIGN, delay_ms, rank, ranking, reason)


def isr_after_win(me: int) -> frozenset[int]:
    """P/isr written by the election txn (see the module docstring for why only the winner)."""
    return frozenset({me})


class LeaderView(enum.Enum):
    NONE = "none"
    """No leader key: campaign (if allowed)."""
    MINE = "mine"
    """The key this replica wrote in its current term."""
    STALE_MINE = "stale mine"
    """Names this replica but it does not hold it (an abandoned term, e.g. after its lease
    could not be refreshed in time): delete it; leadership is never resumed in an old epoch."""
    OTHER = "other"
    """Another replica leads: follow it."""
    UNREADABLE = "unreadable"
    """A leader key that does not decode: wait for it to go away with its lease."""


def classify_leader(
    me: int,
    present: bool,
    leader: LeaderInfo | None,
    raw: bytes,
    held_raw: bytes | None,
) -> LeaderView:
    """What the leader key read from etcd means to replica ``me``, which holds the key value
    ``held_raw`` while it leads (None otherwise)."""
    if not present:
        return LeaderView.NONE
    if held_raw is not None and raw == held_raw:
        return LeaderView.MINE
    if leader is None:
        return LeaderView.UNREADABLE
    if leader.replica_id == me:
        return LeaderView.STALE_MINE
    return LeaderView.OTHER
