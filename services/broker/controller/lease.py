"""This replica's etcd lease and the write fence it gives (the fencing rule of DESIGN.md §6).

The fence: ``write_lease_until`` is the time (on the injected clock's monotonic reading) at
which the last SUCCESSFUL keepalive was SENT, plus the TTL etcd answered, minus
``FENCE_MARGIN_S``. etcd cannot expire the lease before that moment: the keepalive reached it
after we sent it. So a replica that checks ``fence_open()`` before acknowledging a write never
acknowledges one after another replica could have been elected, even when it wakes from a
SIGSTOP: the check reads the clock, no timer needs to have run. The timer armed at each renewal
only makes the loss prompt (``on_lost`` fires at the deadline, not at the next failed call).

A lease once lost is never resumed: it is queued for revocation (once etcd answers again) and a
new one is granted, so whatever hung on the old one (the leader key, the member key) goes away
and leadership comes back only through a new election.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from rocketq.backoff import Backoff
from services.broker.controller.session import EtcdUnavailable, ProblemLog
from services.common.clock import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")

FENCE_MARGIN_S = 0.5
"""The write fence closes this long before etcd could expire the lease."""
OLD_LEASES_MAX = 8
"""Abandoned leases waiting to be revoked (each holds keys until revoked or expired)."""
REVOKE_TIMEOUT_S = 1.0
RETRY_MIN_S = 0.1
"""First retry after a failed grant or keepalive (they back off up to the refresh interval)."""


class LeaseSession(Protocol):
    """What the lease needs of :class:`~services.broker.controller.session.EtcdSession`."""

    async def call(
        self, fn: Callable[[Any], Awaitable[T]], what: str, timeout_s: float | None = None
    ) -> T: ...


class Lease:
    """Grant, keep alive, fence and drop one etcd lease at a time."""

    def __init__(
        self,
        session: LeaseSession,
        ttl_s: int,
        clock: Clock,
        *,
        name: str,
        problems: ProblemLog,
        on_granted: Callable[[], None],
        on_lost: Callable[[str], None],
    ) -> None:
        """``on_granted()`` after each new lease; ``on_lost(reason)`` when one is dropped (the
        owner demotes at once: the fence is closed by then)."""
        self.ttl_s = ttl_s
        self.clock = clock
        self.lease_id: int | None = None
        self.write_lease_until = 0.0
        """Monotonic time (``clock.monotonic_s()``) until which the lease is surely valid."""
        self.old_leases: list[int] = []
        self.fence_timer: asyncio.TimerHandle | None = None
        self._session = session
        self._name = name
        self._problems = problems
        self._on_granted = on_granted
        self._on_lost = on_lost

    @property
    def refresh_interval_s(self) -> float:
        return self.ttl_s / 3

    def fence_open(self) -> bool:
        """True until ``write_lease_until`` (whether or not a lease is held now)."""
        return self.clock.monotonic_s() < self.write_lease_until

    def held(self) -> bool:
        """A lease is held and surely still valid in etcd: keys may hang on it."""
        return self.lease_id is not None and self.fence_open()

    def remaining_s(self) -> float:
        """How long the fence stays open (0 without a lease)."""
        if self.lease_id is None:
            return 0.0
        return max(0.0, self.write_lease_until - self.clock.monotonic_s())

    async def run(
        self, stopping: Callable[[], bool], keepalive: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Grant a lease (after revoking abandoned ones), refresh it every TTL/3, retry failed
        calls with backoff; until ``stopping()``. ``keepalive`` replaces :meth:`keepalive`
        (the owner's seam for tests that cut the link to etcd)."""
        backoff = Backoff(RETRY_MIN_S, max(RETRY_MIN_S, self.refresh_interval_s))
        while not stopping():
            try:
                if self.lease_id is None:
                    await self.revoke_old()
                    await self.grant()
                else:
                    await (keepalive or self.keepalive)()
                self._problems.resolve("lease")
                backoff.reset()
                await asyncio.sleep(self.refresh_interval_s)
            except EtcdUnavailable as exc:
                self._problems.report("lease", exc.problem, exc.detail)
                self.check()
                await asyncio.sleep(backoff.next_delay_s())

    async def grant(self) -> None:
        sent_s = self.clock.monotonic_s()
        lease = await self._session.call(lambda c: c.lease(self.ttl_s), "lease grant")
        self.lease_id = int(lease.id)
        self.renewed(sent_s, int(lease.ttl))
        log.info("%s: lease %x granted (ttl %ss)", self._name, lease.id, lease.ttl)
        self._on_granted()

    async def keepalive(self) -> None:
        """One refresh; the fence moves to its send time + the TTL etcd answered."""
        lease_id = self.lease_id
        sent_s = self.clock.monotonic_s()
        reply = await self._session.call(
            lambda c: c.refresh_lease(lease_id), "lease keepalive", self.refresh_interval_s
        )
        if lease_id != self.lease_id:
            return  # dropped while the request was out: a late success must not revive it
        ttl_s = int(reply.TTL) if reply is not None else 0
        if ttl_s <= 0:
            self.lost("the lease expired in etcd")
            return
        self.renewed(sent_s, ttl_s)

    def renewed(self, sent_s: float, ttl_s: int) -> None:
        """etcd confirmed the lease for ``ttl_s`` from a request sent at ``sent_s``: move the
        fence, and arm the timer that reports the loss should no renewal follow."""
        self.write_lease_until = sent_s + ttl_s - FENCE_MARGIN_S
        self.arm_timer()

    def arm_timer(self) -> None:
        self.cancel_timer()
        delay_s = max(0.0, self.write_lease_until - self.clock.monotonic_s())
        self.fence_timer = asyncio.get_running_loop().call_later(delay_s, self.check)

    def check(self) -> None:
        """Drop the lease if the fence has passed (timer callback, and after a failed call).
        asyncio may run a timer up to its clock resolution early, when the fence is still open
        by a hair: the timer is armed again then, or the loss would go unreported until the
        next failed call."""
        if self.lease_id is None:
            return
        if not self.fence_open():
            self.lost("the lease was not refreshed in time")
        else:
            self.arm_timer()

    def lost(self, reason: str) -> None:
        """Drop the lease (revoked once etcd answers) and tell the owner."""
        if self.lease_id is not None:
            self.old_leases.append(self.lease_id)
            del self.old_leases[:-OLD_LEASES_MAX]
            log.warning("%s: lease lost: %s", self._name, reason)
        self.lease_id = None
        self._on_lost(reason)

    async def revoke_old(self) -> None:
        """Revoke abandoned leases, oldest first (one etcd no longer knows counts as done)."""
        while self.old_leases:
            lease_id = self.old_leases[0]
            try:
                await self._session.call(_revoker(lease_id), "lease revoke")
            except EtcdUnavailable as exc:
                if "not found" not in exc.detail:
                    raise
            self.old_leases.pop(0)

    async def revoke(self) -> None:
        """On a clean stop: revoke the current lease so its keys vanish at once (best effort)."""
        self.cancel_timer()
        lease_id, self.lease_id = self.lease_id, None
        if lease_id is None:
            return
        try:
            await self._session.call(_revoker(lease_id), "lease revoke", REVOKE_TIMEOUT_S)
        except EtcdUnavailable as exc:
            log.info("%s: lease not revoked (%s)", self._name, exc)

    def cancel_timer(self) -> None:
        if self.fence_timer is not None:
            self.fence_timer.cancel()
            self.fence_timer = None


def _revoker(lease_id: int) -> Callable[[Any], Awaitable[Any]]:
    async def revoke(client: Any) -> Any:
        return await client.revoke_lease(lease_id)

    return revoke
