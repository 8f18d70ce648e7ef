"""Which queue a send goes to: round-robin, retries that avoid the last failed broker, and
latency fault tolerance (SPEC §5.3; RocketMQ's MQFaultStrategy + LatencyFaultToleranceImpl).

**Round-robin.** Each topic has a counter; a send takes ``queues[counter++ % n]``. A retry
skips queues on the broker that failed last time, falling back to plain round-robin when that
broker is the only one (then a different queue of it is tried).

**Latency fault tolerance** (``send_latency_fault_enable``, off by default). After every send
the broker's latency decides how long it is avoided, from these tables (RocketMQ's real ones;
the seed's "550 ms -> 3000 ms" is a typo for 30000, SPEC §14.9):

| latency >= (ms)        | 50 | 100 | 550    | 1000   | 2000    | 3000    | 15000   |
|------------------------|----|-----|--------|--------|---------|---------|---------|
| not available for (ms) | 0  | 0   | 30 000 | 60 000 | 120 000 | 180 000 | 600 000 |

A failed send counts as 30 000 ms of latency ("isolation"), i.e. 10 minutes out. A send then
takes the next round-robin queue whose broker is available; when none is, it picks among the
better half of brokers (sorted available first, then by latency, then by when they come back)
in turn, and sends to one of that broker's queues.

Time comes from an injected ``now_ms`` so unit tests walk the tables with a manual clock.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rocketq.message import MessageQueue

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
#: The latency a failed send is charged with.
ISOLATION_LATENCY_MS = 30_000
assert len(LATENCY_MAX_MS) == len(NOT_AVAILABLE_DURATION_MS)


def not_available_duration_ms(latency_ms: int) -> int:
    """How long a broker with this send latency is avoided (the table above)."""
    for bound, duration in zip(
        reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_DURATION_MS), strict=True
    ):
        if latency_ms >= bound:
            return duration
    return 0


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class FaultItem:
    broker_name: str
    latency_ms: int
    available_from_ms: int


class LatencyFaultTolerance:
    """Per-broker latency and the time from which it may be chosen again."""

    def __init__(self, now_ms: Callable[[], int] = _monotonic_ms) -> None:
        self._now_ms = now_ms
        self._items: dict[str, FaultItem] = {}
        self._which_worst = itertools.count(1)

    def update(self, broker_name: str, latency_ms: int, isolation: bool) -> None:
        """Record a send's latency (or a failure, ``isolation``) for ``broker_name``."""
        latency = ISOLATION_LATENCY_MS if isolation else latency_ms
        until = self._now_ms() + not_available_duration_ms(latency)
        item = self._items.get(broker_name)
        if item is None:
            self._items[broker_name] = FaultItem(broker_name, latency, until)
        else:
            item.latency_ms = latency
            item.available_from_ms = until

    def is_available(self, broker_name: str) -> bool:
        item = self._items.get(broker_name)
        return item is None or self._now_ms() >= item.available_from_ms

    def remove(self, broker_name: str) -> None:
        self._items.pop(broker_name, None)

    def pick_one_at_least(self) -> str | None:
        """A broker from the better half (available first, lower latency, back sooner), in turn."""
        if not self._items:
            return None
        now = self._now_ms()
        ranked = sorted(
            self._items.values(),
            key=lambda it: (now < it.available_from_ms, it.latency_ms, it.available_from_ms),
        )
        half = len(ranked) // 2
        if half <= 0:
            return ranked[0].broker_name
        return ranked[next(self._which_worst) % half].broker_name


class QueueChooser:
    """Round-robin queue choice for one topic, with the fault strategy when enabled."""

    def __init__(self, fault: LatencyFaultTolerance | None, start: int = 0) -> None:
        self._fault = fault
        self._counter = itertools.count(start)

    def _next(self) -> int:
        return next(self._counter)

    def choose(self, queues: Sequence[MessageQueue], last_broker: str | None) -> MessageQueue:
        """The queue for the next attempt; ``last_broker`` is where the previous attempt failed."""
        if not queues:
            raise ValueError("no writable queue")
        n = len(queues)
        if self._fault is None:
            if last_broker is not None:
                for _ in range(n):
                    mq = queues[self._next() % n]
                    if mq.broker_name != last_broker:
                        return mq
            return queues[self._next() % n]
        for _ in range(n):
            mq = queues[self._next() % n]
            if self._fault.is_available(mq.broker_name):
                return mq
        not_best = self._fault.pick_one_at_least()
        if not_best is not None:
            of_broker = [q for q in queues if q.broker_name == not_best]
            if of_broker:
                return of_broker[self._next() % len(of_broker)]
            self._fault.remove(not_best)  # no longer in the route
        return queues[self._next() % n]
