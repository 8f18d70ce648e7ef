"""Orderly consumption units: settings, queue locks in the rebalance, locked pulls, and
subscription-conflict handling (SPEC §6.15, §6.17); split from test_consumer_units."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import pytest

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.consumer import LitePullConsumer, PushConsumer
from rocketq.client.consumer._common import SubscriptionConflicts, conflict_from_pb
from rocketq.client.consumer._pull import (
    PullResult,
    PullService,
    PullSettings,
)
from rocketq.client.consumer._rebalance import (
    PullRequest,
    RebalanceImpl,
    RebalanceService,
)
from rocketq.client.consumer._subscription import build_subscription
from rocketq.client.consumer.allocate import AllocateAveragely
from rocketq.client.consumer.config import (
    ConsumeOrderlyStatus,
    LitePullConsumerConfig,
    MessageModel,
    PushConsumerConfig,
    SubscriptionConflict,
    clamp_suspend_ms,
)
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.errors import BrokerUnavailableError, FailedPreconditionError
from rocketq.message import MessageQueue
from tests.unit.consumer_doubles import MQ, MemoryOffsets, ids_of, qs

pytestmark = pytest.mark.unit


# ---- orderly: configuration, locks in the rebalance, locked pulls (SPEC §6.15, §6.18) --------


def test_consume_batch_must_fit_in_a_pull() -> None:
    cfg = PushConsumerConfig("g", ("a:1",), consume_message_batch_max_size=256)
    assert cfg.pull_batch_size == 256
    with pytest.raises(ValueError, match=r"consume_message_batch_max_size.*pull_batch_size"):
        PushConsumerConfig("g", ("a:1",), consume_message_batch_max_size=8, pull_batch_size=4)


def test_orderly_settings_are_validated() -> None:
    cfg = PushConsumerConfig("g", ("a:1",))
    assert cfg.suspend_current_queue_time_ms == 1000
    assert (cfg.rebalance_lock_interval_ms, cfg.rebalance_lock_max_live_ms) == (20_000, 30_000)
    for bad in (9, 30_001):
        with pytest.raises(ValueError, match="suspend_current_queue_time_ms"):
            PushConsumerConfig("g", ("a:1",), suspend_current_queue_time_ms=bad)
    with pytest.raises(ValueError, match="rebalance_lock_max_live_ms"):
        PushConsumerConfig(
            "g", ("a:1",), rebalance_lock_interval_ms=5000, rebalance_lock_max_live_ms=5000
        )
    with pytest.raises(ValueError, match="rebalance_lock_interval_ms"):
        PushConsumerConfig("g", ("a:1",), rebalance_lock_interval_ms=0)


def test_clamp_suspend_ms() -> None:
    assert clamp_suspend_ms(-1, 1000) == 1000
    assert (clamp_suspend_ms(0, 1000), clamp_suspend_ms(40_000, 1000)) == (10, 30_000)


def test_heartbeat_says_orderly() -> None:
    cfg = PushConsumerConfig("g", ("a:1",))
    listener = lambda msgs, ctx: ConsumeOrderlyStatus.SUCCESS  # noqa: E731
    assert PushConsumer(cfg, listener, orderly=True)._consumer_data().consume_orderly
    assert not PushConsumer(cfg, listener)._consumer_data().consume_orderly


class FakeLocker:
    """Broker locks of one group: queue -> holder; ``me`` asks."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.holders: dict[MessageQueue, str] = {}
        self.calls: list[tuple[str, list[int]]] = []
        self.down = False

    async def lock_batch(
        self, broker_name: str, queues: Iterable[MessageQueue]
    ) -> set[MessageQueue]:
        mqs = list(queues)
        self.calls.append(("lock", [mq.queue_id for mq in mqs]))
        if self.down:
            raise BrokerUnavailableError("down")
        held = set()
        for mq in mqs:
            if self.holders.setdefault(mq, self.me) == self.me:
                held.add(mq)
        return held

    async def unlock_batch(self, broker_name: str, queues: Iterable[MessageQueue]) -> None:
        mqs = list(queues)
        self.calls.append(("unlock", [mq.queue_id for mq in mqs]))
        for mq in mqs:
            if self.holders.get(mq) == self.me:
                del self.holders[mq]


def orderly_rebalancer(
    cids: list[str], me: str, locker: FakeLocker, events: list[str], now: list[int]
) -> tuple[RebalanceImpl, list[PullRequest]]:
    dispatched: list[PullRequest] = []

    async def queues_of(topic: str) -> list[MessageQueue]:
        return qs(4)

    async def compute(mq: MessageQueue) -> int:
        events.append(f"compute {mq.queue_id}")
        return 0

    async def remove(mq: MessageQueue, pq: ProcessQueue) -> bool:
        events.append(f"persist {mq.queue_id} dropped={pq.dropped}")
        return True

    async def unlock(broker_name: str, queues: Iterable[MessageQueue]) -> None:
        mqs = list(queues)
        events.append(f"unlock {[mq.queue_id for mq in mqs]}")
        await FakeLocker.unlock_batch(locker, broker_name, mqs)

    locker.unlock_batch = unlock  # type: ignore[method-assign]
    rb = RebalanceImpl(
        group="g",
        client_id=me,
        message_model=MessageModel.CLUSTERING,
        strategy=AllocateAveragely(),
        queues_of=queues_of,
        consumer_ids=ids_of(cids),
        compute_offset=compute,
        remove_queue=remove,
        dispatch=dispatched.extend,
        clock=lambda: now[0],
        locker=locker,
        consume_lock_wait_s=0.0,
    )
    rb.topics = {"T"}
    return rb, dispatched


async def test_orderly_rebalance_locks_before_owning_and_skips_queues_held_elsewhere() -> None:
    locker, events, now = FakeLocker("c1"), [], [1_000_000]  # type: ignore[var-annotated]
    locker.holders[qs(4)[2]] = "c2"  # the previous owner has not released it yet
    rb, dispatched = orderly_rebalancer(["c1"], "c1", locker, events, now)
    assert await rb.do_rebalance() is False  # unbalanced: the next one comes soon
    assert locker.calls[0] == ("lock", [0, 1, 2, 3])  # one LockBatch for the broker
    assert rb.owned() == [qs(4)[i] for i in (0, 1, 3)]
    assert "compute 2" not in events  # never started: not ours on the broker
    assert all(r.process_queue.locked for r in dispatched)
    assert all(r.process_queue.last_lock_timestamp_ms == now[0] for r in dispatched)
    del locker.holders[qs(4)[2]]  # released: the next rebalance takes it
    assert await rb.do_rebalance() is True
    assert rb.owned() == qs(4) and locker.calls[-1] == ("lock", [2])


def test_rebalance_service_retries_an_unbalanced_rebalance_sooner() -> None:
    async def rebalance() -> bool:
        return True

    svc = RebalanceService(rebalance, 20_000, "g", min_interval_ms=1000)
    assert (svc.next_wait_s(False), svc.next_wait_s(True), svc.next_wait_s(None)) == (1, 20, 20)
    assert RebalanceService(rebalance, 500, "g").next_wait_s(False) == 0.5  # never longer


async def test_orderly_release_waits_for_the_running_call_then_persists_then_unlocks() -> None:
    locker, events, now = FakeLocker("c1"), [], [1_000_000]  # type: ignore[var-annotated]
    rb, _ = orderly_rebalancer(["c1"], "c1", locker, events, now)

    await rb.do_rebalance()
    pq3 = rb.process_queue_table[qs(4)[3]]
    assert pq3.consume_lock.acquire()  # a listener call is running on queue 3
    rb._consumer_ids = ids_of(["c1", "c2"])  # c2 joins: c1 keeps 0-1
    events.clear()
    await rb.do_rebalance()
    assert rb.owned() == [qs(4)[0], qs(4)[1], qs(4)[3]]  # 3 kept for now
    assert pq3.try_unlock_times == 1 and not pq3.dropped
    assert events == ["persist 2 dropped=True", "unlock [2]"]
    pq3.consume_lock.release()  # the call ended
    events.clear()
    await rb.do_rebalance()
    assert rb.owned() == qs(2)
    assert events == ["persist 3 dropped=True", "unlock [3]"] and pq3.dropped
    assert qs(4)[3] not in locker.holders


async def test_lock_renewal_refreshes_held_queues_and_drops_lost_ones_unpersisted() -> None:
    locker, events, now = FakeLocker("c1"), [], [1_000_000]  # type: ignore[var-annotated]
    forgotten: list[MessageQueue] = []
    rb, dispatched = orderly_rebalancer(["c1"], "c1", locker, events, now)
    rb._forget_offset = forgotten.append

    await rb.do_rebalance()
    pqs = dict(rb.process_queue_table)
    now[0] += 20_000
    # our lock of queue 1 lapsed on the broker and c2 took it
    locker.holders[qs(4)[1]] = "c2"
    events.clear()
    await rb.lock_all()
    assert locker.calls[-1] == ("lock", [0, 1, 2, 3])
    assert pqs[qs(4)[0]].locked and pqs[qs(4)[0]].last_lock_timestamp_ms == now[0]
    assert pqs[qs(4)[1]].dropped and qs(4)[1] not in rb.process_queue_table
    assert forgotten == [qs(4)[1]] and events == []  # not persisted, not unlocked
    locker.down = True  # a failed renewal changes nothing (the lock then ages out)
    await rb.lock_all()
    assert pqs[qs(4)[0]].locked
    assert not await rb.lock_one(qs(4)[1])  # not ours any more
    locker.down = False
    await rb.do_rebalance()  # still allocated here, but c2 holds it: not taken
    assert qs(4)[1] not in rb.process_queue_table
    del locker.holders[qs(4)[1]]
    await rb.do_rebalance()  # released: a fresh queue from the broker's offset
    fresh = rb.process_queue_table[qs(4)[1]]
    assert fresh is not pqs[qs(4)[1]] and fresh.locked and "compute 1" in events
    assert dispatched[-1].process_queue is fresh
    pqs[qs(4)[0]].locked = False
    assert await rb.lock_one(qs(4)[0]) and pqs[qs(4)[0]].locked
    busy = rb.process_queue_table[qs(4)[3]]
    assert busy.consume_lock.acquire()  # a call outlived the close's wait
    await rb.unlock_all()
    assert set(locker.holders) == {qs(4)[3]}  # left to lapse on the broker
    assert not any(pq.locked for pq in rb.process_queue_table.values())


def orderly_pull_service(
    offsets: MemoryOffsets, broker_offset: int, refused: list[str], beats: list[int]
) -> PullService:
    async def heartbeat() -> None:
        beats.append(1)

    async def compute(mq: MessageQueue) -> int:
        return broker_offset

    settings = PullSettings(
        clustering=True,
        pull_batch_size=32,
        pull_interval_ms=0,
        pull_threshold_for_queue=1000,
        pull_threshold_size_for_queue_mib=100,
        consume_concurrently_max_span=None,
        broker_suspend_max_time_ms=15000,
        consumer_timeout_when_suspend_ms=30000,
        orderly=True,
        rebalance_lock_max_live_ms=30_000,
    )

    async def remove(mq: MessageQueue) -> None:
        pass

    return PullService(
        group="g",
        puller=None,  # type: ignore[arg-type]
        settings=settings,
        offset_store=offsets,
        subscription_of=lambda t: build_subscription(t, "*"),
        submit=lambda msgs, pq, mq, dispatch: None,
        remove_queue=remove,
        on_offset_illegal=lambda: None,
        heartbeat=heartbeat,
        compute_offset=compute,
        on_refused=lambda topic, exc: refused.append(topic),
    )


class OnePull:
    """A Puller returning one canned result, or raising."""

    def __init__(self, result: PullResult | Exception) -> None:
        self.result = result
        self.offsets: list[int] = []
        self.commits: list[int] = []

    async def pull(self, req: PullRequest, sub: Any, **kw: Any) -> PullResult:
        self.offsets.append(req.next_offset)
        self.commits.append(kw["commit_offset"])
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_orderly_pulls_only_a_locked_queue_and_rereads_its_offset_first() -> None:
    refused: list[str] = []
    beats: list[int] = []
    offsets = MemoryOffsets()
    offsets.table[MQ] = 40
    svc = orderly_pull_service(offsets, 42, refused, beats)
    puller = OnePull(PullResult(messaging_pb2.NO_NEW_MSG, 42, 0, 42, [], -1))
    svc._puller = puller  # type: ignore[assignment]
    req = PullRequest(MQ, ProcessQueue(), 7)

    assert await svc._pull_once(req) == 3.0 and puller.offsets == []  # not locked
    req.process_queue.locked = True
    req.process_queue.last_lock_timestamp_ms = 0  # locked, but long ago: expired
    assert await svc._pull_once(req) == 3.0 and puller.offsets == []
    req.process_queue.last_lock_timestamp_ms = int(time.time() * 1000)
    assert await svc._pull_once(req) == 0.0
    assert puller.offsets == [42] and req.locked_first  # the broker's offset, not 7
    req.next_offset = 50
    await svc._pull_once(req)
    assert puller.offsets == [42, 50]  # only the first locked pull re-reads
    # orderly pulls carry the in-memory offset like concurrent ones (brokers only let a
    # pull's commit offset move forward, so a stale one cannot undo a release's persist)
    assert puller.commits == [40, 42]


async def test_a_pull_refused_for_inconsistent_subscriptions_waits_without_heartbeats() -> None:
    refused: list[str] = []
    beats: list[int] = []
    svc = orderly_pull_service(MemoryOffsets(), 0, refused, beats)
    err = FailedPreconditionError("members disagree", reason="SUBSCRIPTION_INCONSISTENT")
    svc._puller = OnePull(err)  # type: ignore[assignment]
    req = PullRequest(MQ, ProcessQueue(), 0, locked_first=True)
    req.process_queue.locked = True
    assert await svc._pull_once(req) == 3.0
    assert refused == ["T"] and beats == []
    svc._puller = OnePull(FailedPreconditionError("subscribe first"))  # type: ignore[assignment]
    assert await svc._pull_once(req) == 3.0
    assert refused == ["T"] and beats == [1]  # an unknown subscription: heartbeat first


def conflict_pb(
    topic: str, members: list[tuple[str, str | None]]
) -> common_pb2.SubscriptionConflict:
    return common_pb2.SubscriptionConflict(
        consumer_group="g",
        topic=topic,
        members=[
            common_pb2.MemberSubscription(
                client_id=cid, subscribed=expr is not None, expression=expr or ""
            )
            for cid, expr in members
        ],
        pulls_refused=True,
    )


def test_subscription_conflicts_are_kept_per_topic_until_resolved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = SubscriptionConflicts("g", logging.getLogger("test-conflicts"))
    c.on_notice(conflict_pb("U", [("c2", "B"), ("c1", "A")]))
    c.on_notice(conflict_pb("T", [("c1", "A"), ("c2", None)]))
    c.on_notice(conflict_pb("T", [("c1", "A"), ("c2", "B")]))  # the latest wins
    got = c.current()
    assert [x.topic for x in got] == ["T", "U"]
    assert got[0] == SubscriptionConflict("g", "T", (("c1", "A"), ("c2", "B")), True)
    assert got[1].members == (("c1", "A"), ("c2", "B"))  # sorted by client id
    assert conflict_from_pb(conflict_pb("V", [("c1", None)])).members == (("c1", None),)
    c.on_notice(common_pb2.SubscriptionConflict(consumer_group="g", topic="U"))  # resolved
    assert [x.topic for x in c.current()] == ["T"]
    other = conflict_pb("W", [("c1", "A")])
    other.consumer_group = "another-group"
    c.on_notice(other)  # not this consumer's group
    assert [x.topic for x in c.current()] == ["T"]
    with caplog.at_level(logging.ERROR, logger="test-conflicts"):
        for _ in range(5):
            c.log_refused_pull("T", RuntimeError("refused"))
    assert len(caplog.records) == 1  # at most one ERROR per topic per 30 s


def test_push_consumer_stores_conflict_notices() -> None:
    consumer = PushConsumer(PushConsumerConfig("g", ("a:1",)), lambda msgs, ctx: None)
    consumer._handle.on_subscription_conflict(conflict_pb("T", [("c1", "A"), ("c2", "B")]))
    assert [x.topic for x in consumer.subscription_conflicts()] == ["T"]
    lite = LitePullConsumer(LitePullConsumerConfig("g", ("a:1",)))
    lite._handle.on_subscription_conflict(conflict_pb("T", [("c1", "A"), ("c2", "B")]))
    assert lite.subscription_conflicts()[0].pulls_refused
