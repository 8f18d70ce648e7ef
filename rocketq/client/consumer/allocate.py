"""Queue allocation strategies: which queues of a topic this consumer of a group pulls (SPEC §6.10).

In clustering mode every consumer of a group runs the same strategy on the same two sorted lists
— all queues of the topic and all consumer ids the broker knows for the group — and keeps only
its own share. No coordinator is involved, so the one invariant a strategy must keep is that,
for identical inputs, the shares of all consumers are **pairwise disjoint** and (for every
built-in strategy except :class:`AllocateByConfig`, which is whatever the user configured)
**cover every queue**. Consumers beyond the queue count get nothing and sit idle.

| strategy                    | name                      | how                                  |
|-----------------------------|---------------------------|--------------------------------------|
| AllocateAveragely (default) | ``AVG``                   | consecutive blocks; the first        |
|                             |                           | ``Q % C`` consumers get one extra    |
| AllocateAveragelyByCircle   | ``AVG_BY_CIRCLE``         | deal queues round-robin              |
| AllocateConsistentHash      | ``CONSISTENT_HASH``       | MD5 ring with virtual nodes; a queue |
|                             |                           | goes to the next node clockwise      |
| AllocateByConfig            | ``CONFIG``                | a fixed list of queues               |
| AllocateByMachineRoom       | ``MACHINE_ROOM``          | only brokers ``room@name`` of the    |
|                             |                           | consumer's rooms, in blocks          |
| AllocateMachineRoomNearby   | ``MACHINE_ROOM_NEARBY-…`` | own room first; rooms without        |
|                             |                           | consumers spread over everyone       |

Worked example (SPEC §6.10 Example A): queues b1_q0..b1_q3, b2_q0..b2_q3 and consumers c1..c3
give, with AVG, c1: b1_q0 b1_q1 b1_q2 / c2: b1_q3 b2_q0 b2_q1 / c3: b2_q2 b2_q3, and with
AVG_BY_CIRCLE, c1: b1_q0 b1_q3 b2_q2 / c2: b1_q1 b2_q0 b2_q3 / c3: b1_q2 b2_q1.

The caller sorts and de-duplicates both lists (SPEC §6.10 step 4); the built-in strategies do it
again, because a consumer that saw a different order would silently overlap with its peers.
A custom strategy is any object with a ``name`` and an ``allocate`` method of the same signature.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from rocketq.message import MessageQueue

log = logging.getLogger(__name__)

#: Separator of RocketMQ's machine-room naming convention for brokers: ``"{room}@{name}"``.
MACHINE_ROOM_SEPARATOR = "@"


@runtime_checkable
class AllocateStrategy(Protocol):
    """Chooses this consumer's share of a topic's queues. Must be deterministic in its inputs."""

    name: str

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        """Queues ``current_cid`` should pull, given every queue and every consumer id."""
        ...


def _prepare(
    current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
) -> tuple[list[MessageQueue], list[str], int] | None:
    """Sorted, de-duplicated copies of the inputs and the index of ``current_cid``.

    Returns None (after a warning) when ``current_cid`` is not among the consumers: the broker
    has not seen its heartbeat yet, so it must not take queues its peers think are theirs.
    """
    if not current_cid:
        raise ValueError("current consumer id is empty; the consumer must be started first")
    if not mq_all:
        raise ValueError("no message queue to allocate: the topic's route has no readable queue")
    if not cid_all:
        raise ValueError("the consumer id list is empty: no broker reported this group's members")
    cids = sorted(set(cid_all))
    if current_cid not in cids:
        log.warning(
            "consumer id %s is not among the group's consumers %s; taking no queue until the "
            "brokers see its heartbeat",
            current_cid,
            cids,
        )
        return None
    return sorted(set(mq_all)), cids, cids.index(current_cid)


class AllocateAveragely:
    """The default: each consumer takes one consecutive block of about ``Q / C`` queues.

    When ``Q`` is not a multiple of ``C`` the first ``Q % C`` consumers take one extra queue.
    Blocks follow the sorted queue order, so a consumer tends to get the queues of one broker;
    when one broker is much busier, :class:`AllocateAveragelyByCircle` spreads better.
    """

    name = "AVG"

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids, idx = prepared
        q, c = len(mqs), len(cids)
        extra = q % c
        if q <= c:
            size = 1
        elif idx < extra:
            size = q // c + 1
        else:
            size = q // c
        start = idx * size if idx < extra else idx * size + extra
        count = max(0, min(size, q - start))
        return mqs[start : start + count]


class AllocateAveragelyByCircle:
    """Deals the sorted queues round-robin: consumer ``i`` takes queues ``i, i + C, i + 2C, …``."""

    name = "AVG_BY_CIRCLE"

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids, idx = prepared
        return mqs[idx :: len(cids)]


def md5_hash(key: str) -> int:
    """The ring position of ``key``: the first 8 bytes of its MD5 digest, big-endian, unsigned."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:8], "big")


class AllocateConsistentHash:
    """A hash ring: few queues move when a consumer joins or leaves, at the price of balance.

    Every consumer id is placed on the ring ``virtual_nodes`` times (at the hash of
    ``"{cid}-{i}"``); a queue (hashed by ``str(mq)``) belongs to the first node at or after its
    own position, wrapping around. When one consumer joins, only the queues whose nearest node
    becomes one of its virtual nodes move — about ``Q / (C + 1)`` of them.
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_nodes: int = 10, hash_fn: Callable[[str], int] = md5_hash) -> None:
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be at least 1, got {virtual_nodes}")
        self.virtual_nodes = virtual_nodes
        self.hash_fn = hash_fn

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids, _ = prepared
        # Ties between two nodes at one position go to the smaller id, the same on every peer.
        ring = sorted(
            (self.hash_fn(f"{cid}-{i}"), cid) for cid in cids for i in range(self.virtual_nodes)
        )
        positions = [pos for pos, _ in ring]
        mine = []
        for mq in mqs:
            at = bisect.bisect_left(positions, self.hash_fn(str(mq)))
            if ring[at % len(ring)][1] == current_cid:
                mine.append(mq)
        return mine


class AllocateByConfig:
    """A fixed set of queues, whatever the group looks like (SPEC §6.10 item 4).

    Only configured queues that exist in ``mq_all`` are returned: a strategy runs once per
    subscribed topic, and a queue of another topic or a broker gone from the route cannot be
    pulled. Keeping the configurations of a group's consumers disjoint is the user's job.
    """

    name = "CONFIG"

    def __init__(self, queues: Iterable[MessageQueue]) -> None:
        self.queues = tuple(dict.fromkeys(queues))

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        if not current_cid:
            raise ValueError("current consumer id is empty; the consumer must be started first")
        present = set(mq_all)
        return [mq for mq in self.queues if mq in present]


def machine_room_of(broker_name: str) -> str:
    """The room of a broker named by RocketMQ's convention ``"{room}@{name}"``.

    A name without ``@`` is its own room, so such brokers are only served by consumers that
    list the whole name among their rooms.
    """
    return broker_name.split(MACHINE_ROOM_SEPARATOR, 1)[0]


class AllocateByMachineRoom:
    """Only queues of brokers in the consumer's rooms, split into consecutive blocks.

    Every consumer of the group is expected to be given the same ``consumer_rooms``. The
    matching queues are split into ``C`` blocks of ``M // C``; the ``M % C`` left over at the
    end go one each to the first consumers.
    """

    name = "MACHINE_ROOM"

    def __init__(self, consumer_rooms: Iterable[str]) -> None:
        self.consumer_rooms = frozenset(consumer_rooms)
        if not self.consumer_rooms:
            raise ValueError("AllocateByMachineRoom needs at least one machine room")

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids, idx = prepared
        in_rooms = [mq for mq in mqs if machine_room_of(mq.broker_name) in self.consumer_rooms]
        c = len(cids)
        block = len(in_rooms) // c
        mine = in_rooms[idx * block : (idx + 1) * block]
        if idx < len(in_rooms) % c:
            mine.append(in_rooms[block * c + idx])
        return mine


class AllocateMachineRoomNearby:
    """Pull from brokers in your own machine room; orphaned rooms are shared by everyone.

    The queues of each room that has consumers are allocated, with ``strategy``, among the
    consumers of that room only. The queues of all rooms with no consumer at all are pooled
    and allocated, with the same strategy, among all consumers of the group. The two callables
    name the room of a queue's broker and of a consumer id (e.g. from a host-name convention).
    """

    def __init__(
        self,
        strategy: AllocateStrategy,
        machine_room_of_broker: Callable[[MessageQueue], str],
        machine_room_of_consumer: Callable[[str], str],
    ) -> None:
        self.strategy = strategy
        self.machine_room_of_broker = machine_room_of_broker
        self.machine_room_of_consumer = machine_room_of_consumer
        self.name = f"MACHINE_ROOM_NEARBY-{strategy.name}"

    def allocate(
        self, group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids, _ = prepared
        mqs_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            mqs_by_room.setdefault(self.machine_room_of_broker(mq), []).append(mq)
        cids_by_room: dict[str, list[str]] = {}
        for cid in cids:
            cids_by_room.setdefault(self.machine_room_of_consumer(cid), []).append(cid)

        mine: list[MessageQueue] = []
        my_room = self.machine_room_of_consumer(current_cid)
        if mqs_by_room.get(my_room):
            mine += self.strategy.allocate(
                group, current_cid, mqs_by_room[my_room], cids_by_room[my_room]
            )
        # All orphaned queues in one list, so that several orphaned rooms do not each hand
        # their first block to the same consumers.
        orphans = [
            mq
            for room, room_mqs in mqs_by_room.items()
            if room not in cids_by_room
            for mq in room_mqs
        ]
        if orphans:
            mine += self.strategy.allocate(group, current_cid, orphans, cids)
        return mine
