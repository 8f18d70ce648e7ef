"""What a correct RocketQ queue allows: the history's types and the rules the checker applies.

A run's journals (:mod:`tests.robustness.chaos.recorder`) become a :class:`History`. The model
of a correct system, in the manner of Jepsen's queue workload and openmessaging-chaos:

* **acknowledged** = a send that answered ``SEND_OK``. Every other outcome (a non-OK status, a
  timeout, NOT_MASTER after a fence, a connection error) is *indeterminate*: the message may
  or may not be stored, and may be delivered or not; nothing is promised about it.
* **no loss**: every acknowledged message is delivered to every consumer group of its topic
  (after the final drain), and the final masters store it.
* **no phantom**: nothing is delivered that no producer invoked a send of. A producer journals
  each send's invocation before the call, so a send that never finished (cancelled, or its
  process killed) is indeterminate like a failed one; only an id never invoked is a phantom.
* **at-least-once**: duplicates are allowed but bounded (see :func:`duplicate_bound`).
* **queue offsets**: a stored queue is dense (offsets ``min..max-1`` each holding one message);
  an acknowledged send's reported (broker, queue, offset) holds that very message; once a send
  on a queue was acknowledged at offset N, a send on that queue that *starts* later is never
  acknowledged at an offset <= N (the queue never moves back); a consumer never skips an offset
  of the stored sequence.
* **orderly groups**: per sharding key, acknowledged messages are first delivered in send order.
* **consumer offsets**: an offset read back from the broker is never behind an offset push the
  broker acknowledged earlier - except a push acknowledged around a fault that can change the
  master (from ``offset_staleness_ms`` before it began to as long after it ended): a new master
  holds the offsets of its last config sync.
* **timers**: a delayed message is never delivered before its delay has passed since its send
  began.
* **replicas**: after healing, each slave's commitlog is a byte prefix of its master's (checked by
  the scenario on the stopped stores; failures are added to the verdict).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SEND_OK = "SEND_OK"
ERROR = "ERROR"

MASTER_FAULTS = frozenset(
    {
        "kill-master",
        "pause-master",
        "kill-etcd",
        "kill-etcd-quorum",
        "partition-master-slave",
        "partition-master-etcd",
    }
)
"""Fault kinds that may change a group's master (or leave it without one for a while): the
windows in which a consumer-offset regression down to the last config sync is allowed."""


@dataclass(frozen=True, slots=True)
class Send:
    proc: str
    id: str
    topic: str
    shard: str
    """Sharding key of an ordered send, "" for a round-robin one."""
    seq: int
    """Number of the message within its sharding key (0, 1, ...), -1 without one."""
    delay_ms: int
    t0: int
    t1: int
    outcome: str
    err: str = ""
    broker: str = ""
    queue: int = -1
    offset: int = -1

    @property
    def acked(self) -> bool:
        return self.outcome == SEND_OK


@dataclass(frozen=True, slots=True)
class Delivery:
    proc: str
    group: str
    id: str
    topic: str
    broker: str
    queue: int
    offset: int
    t: int
    reconsume: int = 0


@dataclass(frozen=True, slots=True)
class OffsetOp:
    """An acknowledged offset push (``commit``) or an offset read (``fetch``)."""

    kind: str
    proc: str
    group: str
    topic: str
    broker: str
    queue: int
    offset: int
    t0: int
    t1: int


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    target: str
    group: str
    t0: int
    t1: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class Stored:
    topic: str
    broker: str
    queue: int
    offset: int
    id: str


@dataclass
class History:
    sends: list[Send] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    offset_ops: list[OffsetOp] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    stored: list[Stored] = field(default_factory=list)
    invoked: set[str] = field(default_factory=set)
    """Ids of every send a producer began (its ``invoke`` event), finished or not."""
    in_flight_at_stop: int = 0
    """Sends the producers were still awaiting when told to stop (``stopped`` events)."""
    skipped: int = 0
    """Events of an unknown kind or with missing fields."""

    @classmethod
    def from_events(cls, events: Iterable[Mapping[str, Any]]) -> History:
        h = cls()
        for e in events:
            try:
                h._add(e)
            except (KeyError, TypeError, ValueError):
                h.skipped += 1
        return h

    def _add(self, e: Mapping[str, Any]) -> None:
        ev = e["ev"]
        if ev == "invoke":
            self.invoked.add(e["id"])
        elif ev == "stopped":
            self.in_flight_at_stop += int(e["in_flight"])
        elif ev == "send":
            self.sends.append(
                Send(
                    e["proc"], e["id"], e["topic"], e.get("shard", ""), int(e.get("seq", -1)),
                    int(e.get("delay_ms", 0)), int(e["t0"]), int(e["t1"]), e["outcome"],
                    e.get("err", ""), e.get("broker", ""), int(e.get("queue", -1)),
                    int(e.get("offset", -1)),
                )
            )  # fmt: skip
        elif ev == "deliver":
            self.deliveries.append(
                Delivery(
                    e["proc"], e["group"], e["id"], e["topic"], e["broker"], int(e["queue"]),
                    int(e["offset"]), int(e["t"]), int(e.get("reconsume", 0)),
                )
            )  # fmt: skip
        elif ev in ("commit", "fetch"):
            self.offset_ops.append(
                OffsetOp(
                    ev, e["proc"], e["group"], e["topic"], e["broker"], int(e["queue"]),
                    int(e["offset"]), int(e["t0"]), int(e["t1"]),
                )
            )  # fmt: skip
        elif ev == "fault":
            self.faults.append(
                Fault(
                    e["kind"], e["target"], e.get("group", ""), int(e["t0"]), int(e["t1"]),
                    e.get("note", ""),
                )
            )  # fmt: skip
        elif ev == "stored":
            self.stored.append(
                Stored(e["topic"], e["broker"], int(e["queue"]), int(e["offset"]), e["id"])
            )
        else:
            self.skipped += 1

    @property
    def unfinished(self) -> set[str]:
        """Ids invoked that never got a ``send`` event: indeterminate, stored or not."""
        return self.invoked - {s.id for s in self.sends}

    @property
    def t_origin(self) -> int:
        """The first time of the history (failures print times relative to it)."""
        times = [s.t0 for s in self.sends] + [f.t0 for f in self.faults]
        times += [d.t for d in self.deliveries]
        return min(times) if times else 0


@dataclass(frozen=True)
class Expectations:
    """What the run promises; the scenario fills it in from its configuration."""

    groups: Mapping[str, frozenset[str]]
    """Consumer group -> the topics it consumes (every acked send of those must reach it)."""
    orderly_groups: frozenset[str] = frozenset()
    duplicates_max: Mapping[str, int] = field(default_factory=dict)
    """Per group, the most duplicate deliveries accepted (see :func:`duplicate_bound`);
    a group not named gets no bound check (its count is still reported)."""
    offset_staleness_ms: int = 3000
    """How old a new master's copy of the consumer offsets may be (config sync interval plus
    a round trip): a fetch inside a master-fault window may be this far behind."""
    timer_early_slack_ms: int = 50
    check_stored: bool = True
    """Whether the final read-back (``stored`` events) is part of the history."""


def duplicate_bound(
    *,
    rate_per_s: float,
    disruptions: int,
    persist_interval_ms: int,
    staleness_ms: int,
    slack_ms: int = 2000,
    floor: int = 20,
) -> int:
    """The most duplicate deliveries a group may see, and why.

    A duplicate arises when a queue's consumption restarts from an offset older than what was
    consumed: a consumer that dies or loses a queue before its periodic offset push (at most
    ``persist_interval_ms`` of consumption), or a new master whose offsets are a config sync old
    (``staleness_ms``). Each *disruption* (a fault, a consumer restart, a rebalance) can thus
    replay at most ``rate × (persist + staleness + slack)`` messages, where ``slack_ms`` covers
    the push in flight and pull batches already fetched. Producer retries that stored a message
    twice are not counted here (the scenario reads the stores and subtracts them)."""
    window_s = (persist_interval_ms + staleness_ms + slack_ms) / 1000
    return max(floor, int((disruptions + 1) * rate_per_s * window_s))
