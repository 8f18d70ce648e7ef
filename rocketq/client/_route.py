"""A topic's route as the SDK caches it: which broker groups host its queues, and where they are.

The nameserver answers ``GetRouteInfoByTopic`` with a ``TopicRouteData`` (SPEC §2.2); this module
turns it into plain frozen data and answers the two questions clients ask of it:

- ``write_queues()``: where a producer may send. Queue data with the write perm whose broker
  group has a live master (brokerId 0), ids ``[0, write_queue_nums)``.
- ``read_queues()``: what consumers read. Queue data with the read perm, ids
  ``[0, read_queue_nums)``; no master needed, consumers read from slaves too.

Read and write counts differ on purpose (SPEC §4.3): write 8 / read 4 means producers write
queues 0-7 while consumers read only 0-3, which is how an operator shrinks a topic.

Reading from slaves (DESIGN.md §6, SPEC §4.14, §6.7): ``read_targets()`` orders the brokers of
one group for a read - the id the last pull suggested (RocketMQ's pullFromWhichNodeTable entry;
when that id is not in the route, the master), then the master, then the slaves by id - and
moves the addresses a :class:`BrokerHealth` has seen fail recently to the end, so a consumer
reads from a slave while its master is down but not yet expired from the route, and goes back
to the master once the master answers again.

Failover (controller mode, DESIGN.md §6): replicas keep their addresses, and whichever one is
elected registers as brokerId 0, so a failover shows up in the route as brokerId 0 naming
another address. ``moved_masters()`` says which groups changed master between two routes;
every write reads ``master_addr()`` of the newest cached route, so once the route is refreshed
no write goes to the old master's address again (it stays in the route as a slave, for reads).

Auto-create (SPEC §4.3): when a topic has no route, a producer borrows the route of the template
topic (TBW102), caps each broker's queue count at its ``default_topic_queue_nums`` and caches the
result under the real topic with ``default_topic`` set, so sends ask the broker to create it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rocketq._api.rocketq.v1 import nameserver_pb2
from rocketq.message import MessageQueue
from rocketq.validation import is_readable, is_writeable

MASTER_ID = 0
UNREACHABLE_BACKOFF_MS = 10_000
"""A broker address that failed is tried last for this long (then it is probed again)."""
UNREACHABLE_TRACKED_MAX = 4096
"""Addresses remembered as unreachable; beyond this the oldest marks are forgotten."""


@dataclass(frozen=True, slots=True)
class QueueData:
    """The queues of one topic on one broker group."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(frozen=True)
class TopicRoute:
    """One topic's queues and the addresses of the broker groups hosting them."""

    topic: str
    queues: tuple[QueueData, ...]
    brokers: dict[str, dict[int, str]] = field(default_factory=dict)
    """Broker group name -> broker id -> "host:port"; id 0 is the master."""
    default_topic: str = ""
    """Non-empty for a provisional route borrowed from this template topic (auto-create)."""

    def write_queues(self) -> list[MessageQueue]:
        """Writable queues on broker groups with a live master, sorted."""
        out = [
            MessageQueue(self.topic, qd.broker_name, qid)
            for qd in self.queues
            if is_writeable(qd.perm) and self.master_addr(qd.broker_name)
            for qid in range(qd.write_queue_nums)
        ]
        out.sort()
        return out

    def read_queues(self) -> list[MessageQueue]:
        """Readable queues, sorted."""
        out = [
            MessageQueue(self.topic, qd.broker_name, qid)
            for qd in self.queues
            if is_readable(qd.perm)
            for qid in range(qd.read_queue_nums)
        ]
        out.sort()
        return out

    def master_addr(self, broker_name: str) -> str | None:
        """The master's address of a broker group, or None when it is down."""
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def broker_addr(self, broker_name: str, broker_id: int) -> str | None:
        """That broker's address; else the master's; else the lowest-id slave's; else None."""
        addrs = self.brokers.get(broker_name)
        if not addrs:
            return None
        if broker_id in addrs:
            return addrs[broker_id]
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        return addrs[min(addrs)]

    def all_broker_addrs(self) -> set[str]:
        """Every broker address (masters and slaves) of the route."""
        return {addr for ids in self.brokers.values() for addr in ids.values()}

    def borrowed_for(self, topic: str, queue_nums: int) -> TopicRoute:
        """This (template topic) route reused for ``topic`` until it has its own (SPEC §4.3)."""
        queues = tuple(
            replace(
                qd,
                read_queue_nums=min(queue_nums, qd.read_queue_nums),
                write_queue_nums=min(queue_nums, qd.read_queue_nums),
            )
            for qd in self.queues
        )
        return TopicRoute(topic, queues, self.brokers, default_topic=self.topic)

    @classmethod
    def from_pb(cls, topic: str, pb: nameserver_pb2.TopicRouteData) -> TopicRoute:
        queues = tuple(
            sorted(
                (
                    QueueData(
                        q.broker_name,
                        q.read_queue_nums,
                        q.write_queue_nums,
                        q.perm,
                        q.topic_sys_flag,
                    )
                    for q in pb.queues
                ),
                key=lambda q: q.broker_name,
            )
        )
        brokers = {
            b.broker_name: {int(i): a for i, a in b.broker_addrs.items()} for b in pb.brokers
        }
        return cls(topic, queues, brokers)


def moved_masters(old: TopicRoute, new: TopicRoute) -> dict[str, tuple[str | None, str | None]]:
    """Broker group -> (old master address, new one) for every group of ``new`` whose master
    differs from ``old``'s (None = no live master); groups ``new`` does not have are left out."""
    return {
        name: (old.master_addr(name), new.master_addr(name))
        for name in sorted(new.brokers)
        if old.master_addr(name) != new.master_addr(name)
    }


@dataclass(frozen=True, slots=True)
class ReadTarget:
    """One broker a read of a group's queue can go to."""

    broker_id: int
    addr: str


def read_targets(
    route: TopicRoute,
    broker_name: str,
    wanted_id: int,
    unreachable: Callable[[str], bool] = lambda _addr: False,
) -> list[ReadTarget]:
    """The brokers of ``broker_name`` to read from, best first (see the module docstring).

    ``wanted_id`` is the id the last pull response suggested (0 = master). Addresses for which
    ``unreachable`` is true keep their relative order but come after every other one; an empty
    list means the group has no live broker in the route.
    """
    addrs = route.brokers.get(broker_name) or {}
    order: list[int] = []
    if wanted_id in addrs:
        order.append(wanted_id)
    if MASTER_ID in addrs and MASTER_ID not in order:
        order.append(MASTER_ID)
    order.extend(i for i in sorted(addrs) if i not in order)
    targets = [ReadTarget(i, addrs[i]) for i in order]
    return [t for t in targets if not unreachable(t.addr)] + [
        t for t in targets if unreachable(t.addr)
    ]


def write_targets(
    route: TopicRoute, broker_name: str, unreachable: Callable[[str], bool] = lambda _a: False
) -> list[ReadTarget]:
    """Where a consumer commits offsets of ``broker_name``'s queues: the master, then (while it
    is down, or unreachable from here) the slaves, which accept offset commits when they have
    lost their master too (DESIGN.md §6)."""
    return read_targets(route, broker_name, MASTER_ID, unreachable)


class BrokerHealth:
    """Which broker addresses failed recently (connection refused, UNAVAILABLE, timeout).

    A mark lasts ``backoff_ms``; any successful call clears it at once. ``now_s`` is a monotonic
    clock (injected by tests).
    """

    def __init__(
        self,
        backoff_ms: int = UNREACHABLE_BACKOFF_MS,
        now_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backoff_s = backoff_ms / 1000
        self._now_s = now_s
        self._down_until_s: dict[str, float] = {}

    def mark_unreachable(self, addr: str) -> None:
        """``addr`` just failed: try it last for a while."""
        self._down_until_s.pop(addr, None)
        self._down_until_s[addr] = self._now_s() + self._backoff_s
        while len(self._down_until_s) > UNREACHABLE_TRACKED_MAX:
            del self._down_until_s[next(iter(self._down_until_s))]

    def mark_reachable(self, addr: str) -> None:
        """``addr`` answered: use it normally again."""
        self._down_until_s.pop(addr, None)

    def is_unreachable(self, addr: str) -> bool:
        """True while ``addr``'s last failure is fresher than the backoff."""
        until_s = self._down_until_s.get(addr)
        if until_s is None:
            return False
        if self._now_s() >= until_s:
            del self._down_until_s[addr]
            return False
        return True
