"""Election rules as tables (services/broker/controller/election.py) and the etcd value codecs
(keys.py): who may lead, in which order replicas campaign, what a leader key means to a replica.
"""

from __future__ import annotations

import pytest

from services.broker.controller.election import (
    FRESH_GROUP_WAIT_MS,
    HANDOVER_WAIT_TTLS,
    RANK_STEP_MS,
    LeaderView,
    Verdict,
    candidates,
    classify_leader,
    isr_after_win,
    plan_campaign,
)
from services.broker.controller.keys import (
    GroupKeys,
    HandoverRecord,
    IsrRecord,
    KeyValue,
    LeaderInfo,
    MemberState,
    decode_isr,
    decode_leader,
    decode_member,
    encode_epoch,
    encode_handover,
    encode_isr,
    encode_leader,
    encode_member,
    parse_snapshot,
)

pytestmark = pytest.mark.unit

TTL_S = 3


def m(
    replica_id: int,
    max_offset: int = 0,
    last_epoch: int = 1,
    priority: int = 0,
    eligible: bool = True,
) -> MemberState:
    return MemberState(replica_id, f"h:{replica_id}", max_offset, last_epoch, priority, eligible)


def members(*ms: MemberState) -> dict[int, MemberState]:
    return {x.replica_id: x for x in ms}


def isr(*ids: int, epoch: int = 1) -> IsrRecord:
    return IsrRecord(epoch, frozenset(ids))


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        # newer epoch beats more bytes: bytes of an older epoch may be a divergent tail
        ([m(1, 900, last_epoch=1), m(2, 100, last_epoch=2)], [2, 1]),
        # same epoch: more bytes first
        ([m(1, 100), m(2, 300), m(3, 200)], [2, 3, 1]),
        # equally up to date: lower priority value first, then lower replica id
        ([m(3, 100, priority=0), m(1, 100, priority=5), m(2, 100, priority=0)], [2, 3, 1]),
        ([m(4), m(2), m(3)], [2, 3, 4]),
        # observers never rank
        ([m(1, 999, eligible=False), m(2)], [2]),
    ],
)
def test_ranking(group: list[MemberState], expected: list[int]) -> None:
    ranked = candidates(members(*group), None)
    assert [x.replica_id for x in ranked] == expected


def test_only_isr_members_rank() -> None:
    group = members(m(1, 900), m(2, 100), m(3, 50))
    assert [x.replica_id for x in candidates(group, isr(2, 3))] == [2, 3]
    assert candidates(group, isr(4)) == []


@pytest.mark.parametrize(
    ("me", "group", "record", "verdict", "delay_ms"),
    [
        # rank k waits k steps
        (1, [m(1, 300), m(2, 200), m(3, 100)], isr(1, 2, 3), Verdict.CAMPAIGN, 0),
        (2, [m(1, 300), m(2, 200), m(3, 100)], isr(1, 2, 3), Verdict.CAMPAIGN, RANK_STEP_MS),
        (3, [m(1, 300), m(2, 200), m(3, 100)], isr(1, 2, 3), Verdict.CAMPAIGN, 2 * RANK_STEP_MS),
        # the most data does not help outside P/isr
        (3, [m(1, 100), m(2, 100), m(3, 900)], isr(1, 2), Verdict.NOT_CANDIDATE, 0),
        # a dead rank 0 is not counted: ranks are over live members only
        (3, [m(2, 100), m(3, 90)], isr(1, 2, 3), Verdict.CAMPAIGN, RANK_STEP_MS),
        (3, [m(3, 90)], isr(1, 2, 3), Verdict.CAMPAIGN, 0),
        # an observer never campaigns
        (4, [m(1), m(4, 999, eligible=False)], isr(1, 4), Verdict.NOT_CANDIDATE, 0),
        # nobody in P/isr alive: no master rather than an out-of-sync one
        (3, [m(3, 900)], isr(1, 2), Verdict.NO_CANDIDATE, 0),
        (4, [m(4, eligible=False)], None, Verdict.NO_CANDIDATE, 0),
        # a fresh group (no P/isr): every eligible member, after the fresh-group wait
        (2, [m(1, eligible=False), m(2), m(3)], None, Verdict.CAMPAIGN, FRESH_GROUP_WAIT_MS),
        (
            3,
            [m(1, eligible=False), m(2), m(3)],
            None,
            Verdict.CAMPAIGN,
            FRESH_GROUP_WAIT_MS + RANK_STEP_MS,
        ),
    ],
)
def test_plan_campaign(
    me: int,
    group: list[MemberState],
    record: IsrRecord | None,
    verdict: Verdict,
    delay_ms: int,
) -> None:
    live = members(*group)
    plan = plan_campaign(live[me], live, record, None, 7, TTL_S)
    assert plan.verdict is verdict, plan.reason
    assert plan.delay_ms == delay_ms


def test_no_candidate_reason_names_the_risk() -> None:
    plan = plan_campaign(m(3), members(m(3)), isr(1, 2), None, 1, TTL_S)
    assert "no in-sync replica alive" in plan.reason
    assert "could lose acknowledged messages" in plan.reason


def test_plan_uses_my_fresh_state_over_my_published_key() -> None:
    # etcd still has 2's key from a second ago (offset 100); its fresh offset is 500
    published = members(m(1, 300), m(2, 100))
    plan = plan_campaign(m(2, 500), published, isr(1, 2), None, 1, TTL_S)
    assert plan.rank == 0
    assert plan.delay_ms == 0
    # and a replica without a key yet still ranks itself
    plan = plan_campaign(m(3, 50), published, isr(1, 2, 3), None, 1, TTL_S)
    assert (plan.verdict, plan.rank) == (Verdict.CAMPAIGN, 2)


@pytest.mark.parametrize(
    ("me", "handover", "delay_ms"),
    [
        # the target goes first whatever its rank
        (3, HandoverRecord(3, 7), 0),
        # everybody else waits HANDOVER_WAIT_TTLS lease TTLs on top of their rank
        (1, HandoverRecord(3, 7), HANDOVER_WAIT_TTLS * TTL_S * 1000),
        (2, HandoverRecord(3, 7), HANDOVER_WAIT_TTLS * TTL_S * 1000 + RANK_STEP_MS),
        # a handover of an older epoch is over: ranks as usual
        (1, HandoverRecord(3, 6), 0),
        (3, HandoverRecord(3, 6), 2 * RANK_STEP_MS),
        # a target that is not a live candidate is not waited for
        (1, HandoverRecord(9, 7), 0),
    ],
)
def test_handover_waits(me: int, handover: HandoverRecord, delay_ms: int) -> None:
    live = members(m(1, 300), m(2, 200), m(3, 100))
    plan = plan_campaign(live[me], live, isr(1, 2, 3), handover, 7, TTL_S)
    assert plan.verdict is Verdict.CAMPAIGN
    assert plan.delay_ms == delay_ms


def test_handover_to_a_replica_outside_isr_does_not_make_it_a_candidate() -> None:
    live = members(m(1), m(2), m(3))
    plan = plan_campaign(live[3], live, isr(1, 2), HandoverRecord(3, 7), 7, TTL_S)
    assert plan.verdict is Verdict.NOT_CANDIDATE


def test_winner_isr_is_itself() -> None:
    assert isr_after_win(2) == frozenset({2})


@pytest.mark.parametrize(
    ("present", "leader", "raw", "held", "view"),
    [
        (False, None, b"", None, LeaderView.NONE),
        (False, None, b"", b"x", LeaderView.NONE),
        (True, LeaderInfo(1, "a", 3), b"L13", b"L13", LeaderView.MINE),
        # my id but not the value I hold (an older term, or I hold nothing): stale
        (True, LeaderInfo(1, "a", 2), b"L12", b"L13", LeaderView.STALE_MINE),
        (True, LeaderInfo(1, "a", 3), b"L13", None, LeaderView.STALE_MINE),
        (True, LeaderInfo(2, "b", 3), b"L23", None, LeaderView.OTHER),
        (True, LeaderInfo(2, "b", 3), b"L23", b"L12", LeaderView.OTHER),
        (True, None, b"{garbage", None, LeaderView.UNREADABLE),
    ],
)
def test_classify_leader(
    present: bool, leader: LeaderInfo | None, raw: bytes, held: bytes | None, view: LeaderView
) -> None:
    assert classify_leader(1, present, leader, raw, held) is view


def test_codecs_round_trip() -> None:
    leader = LeaderInfo(2, "127.0.0.1:10911", 5)
    assert decode_leader(encode_leader(leader)) == leader
    member = m(3, 1 << 40, 4, -1, False)
    assert decode_member(encode_member(member)) == member
    assert decode_isr(encode_isr(isr(3, 1, 2, epoch=4))) == isr(1, 2, 3, epoch=4)
    assert encode_isr(isr(3, 1, 2, epoch=4)) == b'{"epoch":4,"replica_ids":[1,2,3]}'


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"replica_id": 1, "addr": "a"}',
        b'{"replica_id": "1", "addr": "a", "epoch": 1}',
        b'{"replica_id": true, "addr": "a", "epoch": 1}',
    ],
)
def test_leader_decode_is_strict(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_leader(raw)


def test_parse_snapshot() -> None:
    keys = GroupKeys("/rocketq/", "C", "broker-a")
    assert keys.leader == b"/rocketq/C/broker-a/leader"
    assert keys.member(3) == b"/rocketq/C/broker-a/members/3"
    kvs = [
        KeyValue(keys.leader, encode_leader(LeaderInfo(2, "h:2", 5)), 40, lease=77),
        KeyValue(keys.epoch, encode_epoch(5), 40),
        KeyValue(keys.isr, encode_isr(isr(2, 3, epoch=5)), 41),
        KeyValue(keys.handover, encode_handover(HandoverRecord(3, 4)), 30),
        KeyValue(keys.member(2), encode_member(m(2)), 50),
        KeyValue(keys.member(3), encode_member(m(3)), 51),
        KeyValue(keys.member(4), encode_member(m(5)), 52),  # names another replica: ignored
        KeyValue(keys.member(6), b"{", 53),
    ]
    snap = parse_snapshot(keys, 60, kvs)
    assert snap.leader == LeaderInfo(2, "h:2", 5)
    assert (snap.leader_mod_revision, snap.leader_lease) == (40, 77)
    assert (snap.epoch, snap.epoch_mod_revision) == (5, 40)
    assert snap.isr == isr(2, 3, epoch=5)
    assert snap.handover == HandoverRecord(3, 4)
    assert sorted(snap.members) == [2, 3]
    assert len(snap.problems) == 2


def test_unreadable_epoch_is_not_treated_as_absent() -> None:
    # a campaign compares P/epoch's mod revision: 0 would let it overwrite the key with epoch 1
    keys = GroupKeys("/p", "C", "b")
    snap = parse_snapshot(keys, 9, [KeyValue(keys.epoch, b'{"epoch": -1}', 8)])
    assert snap.problems
    assert snap.epoch_mod_revision == 0
    assert snap.epoch == 0
    # ...so the campaign's guard (mod == 0) fails against the existing key and nobody wins
    unreadable_leader = parse_snapshot(keys, 9, [KeyValue(keys.leader, b"?", 8)])
    assert unreadable_leader.leader_present
    assert unreadable_leader.leader is None
