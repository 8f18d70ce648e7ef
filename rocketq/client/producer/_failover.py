"""When a failed send makes the producer ask the nameserver again, and how long its retry waits
(DESIGN.md §6, failover in controller mode).

A broker group's master can change at any moment: the elected replica registers as brokerId 0
under its own address, and the old master (if alive) answers sends with UNAVAILABLE NOT_MASTER.
Waiting for the 30 s route poll would fail every send of those 30 s, so a send whose failure
says "the master is not where the route says" refreshes the topic's route before its retry:

| failure (SDK error)                                           | cause       | refresh |
|---------------------------------------------------------------|-------------|---------|
| BrokerUnavailableError, reason NOT_MASTER                     | not-master  | yes     |
| BrokerUnavailableError, UNAVAILABLE/CANCELLED without reason  | unreachable | yes     |
| BrokerUnavailableError, reason SERVICE_NOT_AVAILABLE          | unavailable | yes     |
| BrokerUnavailableError raised by the client (no live master)  | no-master   | yes     |
| RequestTimeoutError (a paused or partitioned master)          | timeout     | yes     |
| anything else (bad message, flow control, permission, ...)    | -           | no      |

Refreshes of one topic are at least ``REFRESH_MIN_INTERVAL_MS`` apart (:class:`RefreshGate`),
so a burst of failing sends asks the nameserver a few times, not once per send; concurrent
misses already share one request in the client instance.

**Riding out an election.** While a group elects its new master the route still names the dead
one (or none); retrying at once would spend every attempt within milliseconds. So when the
refreshed route offers nothing new - the failed group's master address is unchanged and no
other group is writable - the retry waits, asking the nameserver again every
``RETRY_POLL_MS``, until the route changes or half of the send's remaining time is spent
(``wait_before_retry_ms``). A send whose timeout outlasts the election (a few seconds: the
lease TTL plus the ranking delay) then succeeds on the new master; one with a shorter timeout
fails no later than it would have anyway. A moved master or another writable group is tried
at once.

Everything here is pure (time is injected) so the unit tests walk it without sockets.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rocketq.client._route import TopicRoute
from rocketq.client.errors import BrokerUnavailableError, RequestTimeoutError

REFRESH_MIN_INTERVAL_MS = 100
"""Least time between two failure-driven route refreshes of one topic."""
RETRY_POLL_MS = 250
"""While a retry waits for a new master, the route is asked for again this often."""
TOPICS_TRACKED_MAX = 4096
"""Topics whose last refresh time is remembered; beyond this the oldest are forgotten."""

_UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "CANCELLED"})


def refresh_cause(exc: BaseException) -> str | None:
    """Why ``exc`` suggests the route's master is stale (the table above), else None."""
    if isinstance(exc, RequestTimeoutError):
        return "timeout"
    if not isinstance(exc, BrokerUnavailableError):
        return None
    if exc.reason == "NOT_MASTER":
        return "not-master"
    if exc.reason == "SERVICE_NOT_AVAILABLE":
        return "unavailable"
    if not exc.code:
        return "no-master"  # raised by the client: the route has no master for the group
    if exc.code in _UNREACHABLE_CODES and not exc.reason:
        return "unreachable"
    return None


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RefreshGate:
    """Per topic: whether a failure-driven refresh may ask the nameserver now, and whether a
    failed send without a retry (ordered, oneway) left the route marked stale for the next one.
    """

    def __init__(
        self,
        now_ms: Callable[[], int] = _monotonic_ms,
        min_interval_ms: int = REFRESH_MIN_INTERVAL_MS,
    ) -> None:
        self._now_ms = now_ms
        self._min_interval_ms = min_interval_ms
        self._last_ms: dict[str, int] = {}
        self._stale: set[str] = set()

    def try_acquire(self, topic: str) -> bool:
        """True (and recorded) when ``topic`` was not refreshed this way in the last interval."""
        now = self._now_ms()
        last = self._last_ms.get(topic)
        if last is not None and now - last < self._min_interval_ms:
            return False
        self._last_ms.pop(topic, None)
        self._last_ms[topic] = now
        while len(self._last_ms) > TOPICS_TRACKED_MAX:
            del self._last_ms[next(iter(self._last_ms))]
        self._stale.discard(topic)
        return True

    def mark_stale(self, topic: str) -> None:
        """A send of ``topic`` failed with no retry to refresh for: the next send refreshes."""
        if len(self._stale) < TOPICS_TRACKED_MAX:
            self._stale.add(topic)

    def is_stale(self, topic: str) -> bool:
        return topic in self._stale


def route_offers_something_new(before: TopicRoute, after: TopicRoute, failed_broker: str) -> bool:
    """Whether a retry after a failure at ``failed_broker`` can go somewhere new: that group's
    master moved (or appeared, or vanished), or another group has a writable queue."""
    if after.master_addr(failed_broker) != before.master_addr(failed_broker):
        return True
    return any(mq.broker_name != failed_broker for mq in after.write_queues())


def wait_before_retry_ms(
    before: TopicRoute, after: TopicRoute, failed_broker: str, waited_ms: int, remaining_ms: int
) -> int:
    """How much longer to wait (then refresh the route again) before retrying a send that
    failed at ``failed_broker``: 0 once ``after`` offers something new, or once ``waited_ms``
    reaches half of the time left when the wait began (``waited_ms + remaining_ms``)."""
    if route_offers_something_new(before, after, failed_broker):
        return 0
    budget_ms = (waited_ms + remaining_ms) // 2
    return max(0, min(RETRY_POLL_MS, budget_ms - waited_ms))


__all__ = [
    "REFRESH_MIN_INTERVAL_MS",
    "RETRY_POLL_MS",
    "RefreshGate",
    "refresh_cause",
    "route_offers_something_new",
    "wait_before_retry_ms",
]
