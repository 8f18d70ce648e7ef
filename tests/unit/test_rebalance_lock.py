"""RebalanceLockManager: lock, renew, contention, expiry takeover, unlock, bounds (SPEC §6.15)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from services.broker.config import BrokerConfig
from services.broker.rebalance_lock import (
    QUEUES_PER_REQUEST_MAX,
    QueueLockInfo,
    RebalanceLockManager,
)
from services.common.clock import ManualClock
from services.common.errors import ServiceError

pytestmark = pytest.mark.unit

Q0 = ("T", 0)
Q1 = ("T", 1)
Q2 = ("T", 2)


def manager(entries_max: int = 1_000_000, live_ms: int = 60_000) -> RebalanceLockManager:
    config = BrokerConfig(rebalance_lock_max_live_time_ms=live_ms)
    return RebalanceLockManager(config, ManualClock(), entries_max=entries_max)


def advance(m: RebalanceLockManager, delta_ms: int) -> None:
    clock = m.clock
    assert isinstance(clock, ManualClock)
    clock.advance_ms(delta_ms)


def test_lock_free_queues_and_renew() -> None:
    m = manager()
    assert m.try_lock_batch("g", "c1", [Q0, Q1, Q0]) == [Q0, Q1]
    first = m.locks_of_group("g")
    assert first == [
        QueueLockInfo("T", 0, "c1", first[0].last_lock_ms),
        QueueLockInfo("T", 1, "c1", first[0].last_lock_ms),
    ]
    advance(m, 50_000)
    assert m.try_lock_batch("g", "c1", [Q1]) == [Q1]
    renewed = {(i.topic, i.queue_id): i.last_lock_ms for i in m.locks_of_group("g")}
    assert renewed[Q1] == renewed[Q0] + 50_000
    # Q0 was not renewed: it expires first; Q1 lives on.
    advance(m, 20_000)
    assert not m.is_locked_by("g", "T", 0, "c1")
    assert m.is_locked_by("g", "T", 1, "c1")
    assert len(m) == 2  # expired entries stay until purged or taken over


def test_held_by_other_live_client_is_left_out() -> None:
    m = manager()
    assert m.try_lock_batch("g", "c1", [Q0]) == [Q0]
    assert m.try_lock_batch("g", "c2", [Q0, Q1]) == [Q1]
    assert m.is_locked_by("g", "T", 0, "c1")
    assert not m.is_locked_by("g", "T", 0, "c2")
    assert m.is_locked_by("g", "T", 1, "c2")


def test_expired_lock_is_taken_over_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    m = manager(live_ms=1000)
    m.try_lock_batch("g", "c1", [Q0])
    advance(m, 1000)
    assert m.try_lock_batch("g", "c2", [Q0]) == []  # exactly at the limit: still live
    advance(m, 1)
    with caplog.at_level(logging.INFO, logger="services.broker.rebalance_lock"):
        assert m.try_lock_batch("g", "c2", [Q0]) == [Q0]
    assert "taken over by c2 from c1" in caplog.text
    assert [i.client_id for i in m.locks_of_group("g")] == ["c2"]
    assert not m.is_locked_by("g", "T", 0, "c1")
    assert len(m) == 1


def test_expiry_follows_config_changes_at_once() -> None:
    m = manager(live_ms=60_000)
    m.try_lock_batch("g", "c1", [Q0])
    advance(m, 5000)
    assert m.try_lock_batch("g", "c2", [Q0]) == []
    m.config.rebalance_lock_max_live_time_ms = 1000  # UpdateBrokerConfig mutates in place
    assert m.try_lock_batch("g", "c2", [Q0]) == [Q0]


def test_unlock_by_holder_and_by_non_holder() -> None:
    m = manager()
    m.try_lock_batch("g", "c1", [Q0, Q1])
    m.unlock_batch("g", "c2", [Q0])  # not the holder: ignored
    assert m.is_locked_by("g", "T", 0, "c1")
    m.unlock_batch("g", "c1", [Q0, Q2])  # Q2 was never locked: ignored
    assert not m.is_locked_by("g", "T", 0, "c1")
    assert [(i.topic, i.queue_id) for i in m.locks_of_group("g")] == [Q1]
    assert m.try_lock_batch("g", "c2", [Q0]) == [Q0]
    m.unlock_batch("g", "c1", [Q1])
    m.unlock_batch("g", "c2", [Q0])
    m.unlock_batch("unknown", "c1", [Q0])
    assert len(m) == 0
    assert m.locks_of_group("g") == []


def test_groups_are_independent() -> None:
    m = manager()
    assert m.try_lock_batch("g1", "c1", [Q0]) == [Q0]
    assert m.try_lock_batch("g2", "c2", [Q0]) == [Q0]
    m.unlock_batch("g2", "c1", [Q0])
    assert m.is_locked_by("g1", "T", 0, "c1")
    assert m.is_locked_by("g2", "T", 0, "c2")
    assert not m.is_locked_by("g2", "T", 0, "c1")


def test_locks_of_group_sorted_and_without_expired() -> None:
    m = manager(live_ms=1000)
    m.try_lock_batch("g", "c1", [("B", 1), ("A", 3), ("B", 0)])
    advance(m, 600)
    m.try_lock_batch("g", "c2", [("A", 0)])
    assert [(i.topic, i.queue_id, i.client_id) for i in m.locks_of_group("g")] == [
        ("A", 0, "c2"),
        ("A", 3, "c1"),
        ("B", 0, "c1"),
        ("B", 1, "c1"),
    ]
    advance(m, 600)
    assert [(i.topic, i.queue_id) for i in m.locks_of_group("g")] == [("A", 0)]


def test_per_request_limit() -> None:
    m = manager()
    ok = [("T", i) for i in range(QUEUES_PER_REQUEST_MAX)]
    assert len(m.try_lock_batch("g", "c1", ok)) == QUEUES_PER_REQUEST_MAX
    with pytest.raises(ServiceError) as err:
        m.try_lock_batch("g", "c1", [*ok, ("T", QUEUES_PER_REQUEST_MAX)])
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServiceError):
        m.unlock_batch("g", "c1", [*ok, Q0])
    assert m.try_lock_batch("g", "c1", []) == []


def test_table_cap_refuses_new_locks_but_renews() -> None:
    m = manager(entries_max=3, live_ms=1000)
    assert m.try_lock_batch("g1", "c1", [Q0, Q1]) == [Q0, Q1]
    with pytest.raises(ServiceError) as err:
        m.try_lock_batch("g2", "c2", [Q0, Q1])  # 2 new locks, room for 1: nothing locked
    assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert m.locks_of_group("g2") == []
    assert m.try_lock_batch("g2", "c2", [Q0]) == [Q0]
    assert m.try_lock_batch("g1", "c1", [Q0, Q1]) == [Q0, Q1]  # renewals need no room
    with pytest.raises(ServiceError):
        m.try_lock_batch("g3", "c3", [Q0])
    # A full table purges expired entries before refusing.
    advance(m, 1001)
    m.try_lock_batch("g1", "c1", [Q0])
    assert m.try_lock_batch("g3", "c3", [Q0, Q1]) == [Q0, Q1]
    assert len(m) == 3


def test_purge_expired() -> None:
    m = manager(live_ms=1000)
    m.try_lock_batch("g1", "c1", [Q0, Q1])
    advance(m, 500)
    m.try_lock_batch("g2", "c2", [Q0])
    advance(m, 501)
    assert m.purge_expired() == 2
    assert len(m) == 1
    assert m.locks_of_group("g1") == []
    assert m.is_locked_by("g2", "T", 0, "c2")
    advance(m, 500)
    assert m.purge_expired() == 1
    assert len(m) == 0
    assert m.purge_expired() == 0


async def test_purge_loop_runs_and_stops_on_cancel() -> None:
    m = manager(live_ms=1000)
    m.try_lock_batch("g", "c1", [Q0])
    advance(m, 2000)
    task = asyncio.create_task(m.run_purge_loop(interval_ms=0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(m) == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
