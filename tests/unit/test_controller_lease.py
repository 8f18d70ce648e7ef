"""The controller's lease and write fence (services.broker.controller.lease) on a ManualClock
with a fake etcd session: the fence deadline, renewal, expiry and loss, without sleeping."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from services.broker.controller.lease import FENCE_MARGIN_S, Lease
from services.broker.controller.session import EtcdUnavailable, ProblemLog
from services.common.clock import ManualClock

pytestmark = pytest.mark.unit

T = TypeVar("T")
TTL_S = 2
LEASE_ID = 0x51


class FakeEtcd:
    """The lease calls of an aetcd client; ``during_call`` runs while a request is out."""

    def __init__(self) -> None:
        self.ttl_answer = TTL_S
        self.fail: EtcdUnavailable | None = None
        self.during_call: Callable[[], None] = lambda: None
        self.revoked: list[int] = []
        self.calls: list[str] = []

    async def call(
        self, fn: Callable[[Any], Awaitable[T]], what: str, timeout_s: float | None = None
    ) -> T:
        self.calls.append(what)
        self.during_call()
        if self.fail is not None:
            raise self.fail
        return await fn(self)

    async def lease(self, ttl: int) -> Any:
        return SimpleNamespace(id=LEASE_ID, ttl=ttl)

    async def refresh_lease(self, lease_id: int) -> Any:
        return SimpleNamespace(TTL=self.ttl_answer)

    async def revoke_lease(self, lease_id: int) -> None:
        self.revoked.append(lease_id)


class Harness:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.etcd = FakeEtcd()
        self.granted = 0
        self.lost: list[str] = []
        self.lease = Lease(
            self.etcd,
            TTL_S,
            self.clock,
            name="test lease",
            problems=ProblemLog(logging.getLogger(__name__), "test"),
            on_granted=self._granted,
            on_lost=self.lost.append,
        )

    def _granted(self) -> None:
        self.granted += 1

    def at(self, mono_s: float) -> None:
        """Move the clock forward to ``mono_s`` monotonic seconds."""
        self.clock.advance_ms(round((mono_s - self.clock.monotonic_s()) * 1000))


@pytest.fixture
def h() -> Any:
    harness = Harness()
    yield harness
    harness.lease.cancel_timer()


async def test_grant_opens_the_fence_until_send_time_plus_ttl_minus_margin(h: Harness) -> None:
    assert not h.lease.fence_open() and not h.lease.held()
    h.at(10.0)
    await h.lease.grant()
    assert h.lease.lease_id == LEASE_ID and h.granted == 1
    assert h.lease.write_lease_until == pytest.approx(10.0 + TTL_S - FENCE_MARGIN_S)
    h.at(11.499)
    assert h.lease.held() and h.lease.remaining_s() == pytest.approx(0.001)
    h.lease.check()
    assert h.lost == []  # still inside the fence: nothing happens
    h.at(11.5)
    assert not h.lease.fence_open() and not h.lease.held()


async def test_a_timer_run_early_is_armed_again_for_what_remains(h: Harness) -> None:
    """asyncio may run a timer up to its clock resolution early; the loss must still be told."""
    await h.lease.grant()
    h.at(1.499)
    h.lease.fence_timer.cancel()
    h.lease.check()  # the timer's callback, a millisecond before the fence closes
    assert h.lost == []
    rearmed = h.lease.fence_timer
    assert rearmed is not None and not rearmed.cancelled()
    h.at(1.5)
    h.lease.check()  # what the re-armed timer runs
    assert h.lost == ["the lease was not refreshed in time"]


async def test_expiry_without_renewal_drops_the_lease_once(h: Harness) -> None:
    await h.lease.grant()
    h.at(1.6)
    h.lease.check()  # what the fence timer (or a failed keepalive) runs
    assert h.lost == ["the lease was not refreshed in time"]
    assert h.lease.lease_id is None and h.lease.old_leases == [LEASE_ID]
    assert h.lease.remaining_s() == 0.0
    h.lease.check()
    assert len(h.lost) == 1


async def test_renewal_moves_the_fence_from_the_time_the_keepalive_was_sent(h: Harness) -> None:
    await h.lease.grant()
    h.at(0.6)
    h.etcd.during_call = lambda: h.clock.advance_ms(400)  # the answer takes 400 ms
    await h.lease.keepalive()
    # sent at 0.6, not answered at 1.0: etcd may have renewed it as early as 0.6
    assert h.lease.write_lease_until == pytest.approx(0.6 + TTL_S - FENCE_MARGIN_S)
    h.at(2.0)
    h.lease.check()
    assert h.lease.held() and h.lost == []  # would have closed at 1.5 without the renewal
    h.at(2.1)
    assert not h.lease.fence_open()


async def test_keepalive_answered_with_no_ttl_means_expired_in_etcd(h: Harness) -> None:
    await h.lease.grant()
    h.etcd.ttl_answer = 0
    await h.lease.keepalive()
    assert h.lost == ["the lease expired in etcd"] and h.lease.lease_id is None


async def test_a_late_keepalive_answer_does_not_revive_a_dropped_lease(h: Harness) -> None:
    await h.lease.grant()
    until = h.lease.write_lease_until
    h.at(0.6)
    h.etcd.during_call = lambda: h.lease.lost("dropped meanwhile")
    await h.lease.keepalive()
    assert h.lease.lease_id is None and h.lease.write_lease_until == until


async def test_failed_keepalive_keeps_the_fence_until_its_deadline(h: Harness) -> None:
    await h.lease.grant()
    h.etcd.fail = EtcdUnavailable("lease keepalive timed out", "no answer")
    h.at(1.0)
    with pytest.raises(EtcdUnavailable):
        await h.lease.keepalive()
    assert h.lease.held()  # etcd cannot have expired it yet
    h.at(1.5)
    h.lease.check()
    assert h.lost == ["the lease was not refreshed in time"]


async def test_abandoned_leases_are_revoked_before_a_new_grant(h: Harness) -> None:
    await h.lease.grant()
    h.lease.lost("test")
    h.etcd.fail = EtcdUnavailable("lease revoke timed out", "no answer")
    with pytest.raises(EtcdUnavailable):
        await h.lease.revoke_old()
    assert h.lease.old_leases == [LEASE_ID]  # kept for the next try
    h.etcd.fail = EtcdUnavailable("lease revoke", "requested lease not found")
    await h.lease.revoke_old()  # etcd expired it already: done
    assert h.lease.old_leases == []
    h.etcd.fail = None
    h.lease.lost("again")  # no lease held: nothing queued, the owner told again
    assert h.lease.old_leases == [] and h.lost == ["test", "again"]


async def test_revoke_on_stop_frees_the_lease(h: Harness) -> None:
    await h.lease.grant()
    await h.lease.revoke()
    assert h.etcd.revoked == [LEASE_ID] and h.lease.lease_id is None
    assert h.lease.fence_timer is None
