"""Queue allocation strategies (SPEC §6.10, §15): the seed examples exactly, and the invariant
every strategy keeps — all consumers' shares are disjoint and cover every queue."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketq.client.consumer.allocate import (
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocateByConfig,
    AllocateByMachineRoom,
    AllocateConsistentHash,
    AllocateMachineRoomNearby,
    AllocateStrategy,
    machine_room_of,
)
from rocketq.message import MessageQueue

pytestmark = pytest.mark.unit

GROUP = "g"
CIDS = ["c1", "c2", "c3"]


def mq(broker: str, qid: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, broker, qid)


# Example A: b1_q0..b1_q3, b2_q0..b2_q3
EXAMPLE_A = [mq("b1", i) for i in range(4)] + [mq("b2", i) for i in range(4)]
# Example B: q1..q8 (q1 is queue id 0)
EXAMPLE_B = [mq("b", i) for i in range(8)]


def q(n: int) -> MessageQueue:
    """Example B's q{n}."""
    return mq("b", n - 1)


def shares(
    strategy: AllocateStrategy, mqs: list[MessageQueue], cids: list[str]
) -> dict[str, list[MessageQueue]]:
    return {cid: strategy.allocate(GROUP, cid, mqs, cids) for cid in cids}


def test_avg_example_a() -> None:
    assert shares(AllocateAveragely(), EXAMPLE_A, CIDS) == {
        "c1": [mq("b1", 0), mq("b1", 1), mq("b1", 2)],
        "c2": [mq("b1", 3), mq("b2", 0), mq("b2", 1)],
        "c3": [mq("b2", 2), mq("b2", 3)],
    }


def test_avg_by_circle_example_a() -> None:
    assert shares(AllocateAveragelyByCircle(), EXAMPLE_A, CIDS) == {
        "c1": [mq("b1", 0), mq("b1", 3), mq("b2", 2)],
        "c2": [mq("b1", 1), mq("b2", 0), mq("b2", 3)],
        "c3": [mq("b1", 2), mq("b2", 1)],
    }


def test_avg_example_b() -> None:
    assert shares(AllocateAveragely(), EXAMPLE_B, CIDS) == {
        "c1": [q(1), q(2), q(3)],
        "c2": [q(4), q(5), q(6)],
        "c3": [q(7), q(8)],
    }


def test_avg_by_circle_example_b() -> None:
    assert shares(AllocateAveragelyByCircle(), EXAMPLE_B, CIDS) == {
        "c1": [q(1), q(4), q(7)],
        "c2": [q(2), q(5), q(8)],
        "c3": [q(3), q(6)],
    }


@pytest.mark.parametrize("strategy", [AllocateAveragely(), AllocateAveragelyByCircle()])
def test_more_consumers_than_queues_leaves_the_extra_ones_idle(
    strategy: AllocateStrategy,
) -> None:
    mqs = [mq("b", i) for i in range(3)]
    cids = [f"c{i}" for i in range(1, 6)]
    got = shares(strategy, mqs, cids)
    assert got == {"c1": [mqs[0]], "c2": [mqs[1]], "c3": [mqs[2]], "c4": [], "c5": []}


def test_inputs_in_another_order_give_the_same_answer() -> None:
    shuffled_mqs = list(reversed(EXAMPLE_A))
    shuffled_cids = ["c3", "c1", "c2"]
    for strategy in (AllocateAveragely(), AllocateAveragelyByCircle(), AllocateConsistentHash()):
        for cid in CIDS:
            assert strategy.allocate(GROUP, cid, shuffled_mqs, shuffled_cids) == strategy.allocate(
                GROUP, cid, EXAMPLE_A, CIDS
            )


def test_unknown_consumer_gets_nothing_and_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rocketq.client.consumer.allocate"):
        assert AllocateAveragely().allocate(GROUP, "c9", EXAMPLE_A, CIDS) == []
    assert "c9" in caplog.text


@pytest.mark.parametrize(
    "strategy",
    [
        AllocateAveragely(),
        AllocateAveragelyByCircle(),
        AllocateConsistentHash(),
        AllocateByMachineRoom(["b"]),
        AllocateMachineRoomNearby(AllocateAveragely(), lambda m: "r", lambda c: "r"),
    ],
)
def test_empty_inputs_are_refused(strategy: AllocateStrategy) -> None:
    with pytest.raises(ValueError, match="consumer id is empty"):
        strategy.allocate(GROUP, "", EXAMPLE_A, CIDS)
    with pytest.raises(ValueError, match="no message queue"):
        strategy.allocate(GROUP, "c1", [], CIDS)
    with pytest.raises(ValueError, match="consumer id list is empty"):
        strategy.allocate(GROUP, "c1", EXAMPLE_A, [])


def test_strategy_names() -> None:
    assert AllocateAveragely().name == "AVG"
    assert AllocateAveragelyByCircle().name == "AVG_BY_CIRCLE"
    assert AllocateConsistentHash().name == "CONSISTENT_HASH"
    assert AllocateByConfig([]).name == "CONFIG"
    assert AllocateByMachineRoom(["r"]).name == "MACHINE_ROOM"
    nearby = AllocateMachineRoomNearby(AllocateAveragelyByCircle(), lambda m: "", lambda c: "")
    assert nearby.name == "MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE"


# ---- the invariant, for every strategy ------------------------------------------------------

ROOMS = ["east", "west", "north"]


def room_of_consumer(cid: str) -> str:
    return cid.split("@", 1)[0]


def strategies_for(rooms_in_use: list[str]) -> list[AllocateStrategy]:
    def room_of_broker(m: MessageQueue) -> str:
        return machine_room_of(m.broker_name)

    return [
        AllocateAveragely(),
        AllocateAveragelyByCircle(),
        AllocateConsistentHash(),
        AllocateConsistentHash(virtual_nodes=1),
        AllocateByMachineRoom(rooms_in_use),
        AllocateMachineRoomNearby(AllocateAveragely(), room_of_broker, room_of_consumer),
        AllocateMachineRoomNearby(AllocateAveragelyByCircle(), room_of_broker, room_of_consumer),
    ]


@settings(max_examples=60, deadline=None)
@given(
    queue_counts=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=4),
    consumer_rooms=st.lists(st.sampled_from(ROOMS), min_size=1, max_size=12),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_every_strategy_partitions_the_queues(
    queue_counts: list[int], consumer_rooms: list[str], seed: int
) -> None:
    # brokers "room@broker-i", each in a room picked at random; consumers "room@client-i"
    rnd = random.Random(seed)
    mqs = [
        mq(f"{rnd.choice(ROOMS)}@broker-{b}", i)
        for b, count in enumerate(queue_counts)
        for i in range(count)
    ]
    cids = [f"{room}@client-{i}" for i, room in enumerate(consumer_rooms)]
    mqs.sort()
    cids.sort()
    for strategy in strategies_for(ROOMS):
        got = shares(strategy, mqs, cids)
        seen: list[MessageQueue] = [m for share in got.values() for m in share]
        assert len(seen) == len(set(seen)), f"{strategy.name}: a queue went to two consumers"
        assert set(seen) == set(mqs), f"{strategy.name}: some queue went to nobody"
    sizes = [len(share) for share in shares(AllocateAveragely(), mqs, cids).values()]
    assert max(sizes) - min(sizes) <= 1


def test_consistent_hash_moves_only_to_the_new_consumer() -> None:
    mqs = sorted(mq(f"broker-{b}", i) for b in range(4) for i in range(25))
    before_cids = [f"10.0.0.{i}@{1000 + i}" for i in range(10)]
    after_cids = sorted([*before_cids, "10.0.0.99@7"])
    strategy = AllocateConsistentHash()
    owner_before = {m: c for c, share in shares(strategy, mqs, before_cids).items() for m in share}
    owner_after = {m: c for c, share in shares(strategy, mqs, after_cids).items() for m in share}
    moved = [m for m in mqs if owner_before[m] != owner_after[m]]
    assert all(owner_after[m] == "10.0.0.99@7" for m in moved)
    # about 100 / 11 expected; AVG would move most of the 100
    assert 0 < len(moved) <= 30
    avg_before = shares(AllocateAveragely(), mqs, before_cids)
    avg_after = shares(AllocateAveragely(), mqs, after_cids)
    avg_moved = sum(1 for c in before_cids for m in avg_before[c] if m not in avg_after.get(c, []))
    assert avg_moved > len(moved)


def test_consistent_hash_needs_a_virtual_node() -> None:
    with pytest.raises(ValueError, match="virtual_nodes"):
        AllocateConsistentHash(virtual_nodes=0)


def test_machine_room_takes_only_its_rooms_in_blocks() -> None:
    mqs = sorted(
        [mq("hz@broker-a", i) for i in range(5)] + [mq("sh@broker-b", i) for i in range(4)]
    )
    strategy = AllocateByMachineRoom(["hz"])
    got = shares(strategy, mqs, ["c1", "c2"])
    # 5 matching queues over 2 consumers: blocks of 2, the leftover to the first consumer
    assert got == {
        "c1": [mq("hz@broker-a", 0), mq("hz@broker-a", 1), mq("hz@broker-a", 4)],
        "c2": [mq("hz@broker-a", 2), mq("hz@broker-a", 3)],
    }
    assert machine_room_of("plain-broker") == "plain-broker"


def test_machine_room_nearby_prefers_the_own_room_and_shares_orphans() -> None:
    mqs = sorted(
        [mq("hz@a", i) for i in range(4)]
        + [mq("sh@b", i) for i in range(2)]
        + [mq("bj@c", i) for i in range(3)]  # no consumer in bj
    )
    cids = ["hz@1", "hz@2", "sh@1"]
    strategy = AllocateMachineRoomNearby(
        AllocateAveragely(),
        machine_room_of_broker=lambda m: machine_room_of(m.broker_name),
        machine_room_of_consumer=room_of_consumer,
    )
    got = shares(strategy, mqs, cids)
    # own rooms: hz's 4 queues over hz@1, hz@2; sh's 2 to sh@1.
    # orphans (bj's 3 queues) over all three consumers, one each.
    assert got == {
        "hz@1": [mq("hz@a", 0), mq("hz@a", 1), mq("bj@c", 0)],
        "hz@2": [mq("hz@a", 2), mq("hz@a", 3), mq("bj@c", 1)],
        "sh@1": [mq("sh@b", 0), mq("sh@b", 1), mq("bj@c", 2)],
    }


def test_by_config_returns_the_configured_queues_that_exist() -> None:
    gone = mq("b9", 0)
    strategy = AllocateByConfig([mq("b1", 3), mq("b1", 0), gone, mq("b1", 3)])
    assert strategy.allocate(GROUP, "c1", EXAMPLE_A, CIDS) == [mq("b1", 3), mq("b1", 0)]
    # whatever the group looks like, even a consumer the brokers do not know yet
    assert strategy.allocate(GROUP, "c7", EXAMPLE_A, ["c1"]) == [mq("b1", 3), mq("b1", 0)]
    with pytest.raises(ValueError):
        strategy.allocate(GROUP, "", EXAMPLE_A, CIDS)


class LastQueueToFirstConsumer:
    """A user strategy: the first consumer takes only the last queue, the second the rest."""

    name = "CUSTOM"

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        if current_cid == cid_all[0]:
            return mq_all[-1:]
        if len(cid_all) > 1 and current_cid == cid_all[1]:
            return mq_all[:-1]
        return []


def test_custom_strategy_fits_the_protocol_and_composes() -> None:
    custom = LastQueueToFirstConsumer()
    assert isinstance(custom, AllocateStrategy)
    assert shares(custom, EXAMPLE_B, ["c1", "c2"]) == {"c1": [q(8)], "c2": EXAMPLE_B[:-1]}
    nearby = AllocateMachineRoomNearby(custom, lambda m: "r", lambda c: "r")
    assert nearby.name == "MACHINE_ROOM_NEARBY-CUSTOM"
    assert nearby.allocate(GROUP, "c1", EXAMPLE_B, ["c1", "c2"]) == [q(8)]
