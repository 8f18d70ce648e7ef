"""Client side of failover without sockets: which failures refresh a route, how often, how long
a retry waits, that a producer's retry and a consumer's offset commit and queue lock go to the
newly elected master, and how the admin folds replica reports into a group's HA status."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rocketq.client._admin_ha import DOWN, check_switchover_args, summarize_group
from rocketq.client._admin_types import RuntimeStats, SlaveInfo
from rocketq.client._route import QueueData, TopicRoute, moved_masters
from rocketq.client.consumer._api import BrokerApi
from rocketq.client.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    PermissionDeniedError,
    RequestTimeoutError,
    ResourceExhaustedError,
    TopicNotFoundError,
)
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer._failover import (
    REFRESH_MIN_INTERVAL_MS,
    RETRY_POLL_MS,
    RefreshGate,
    refresh_cause,
    route_offers_something_new,
    wait_before_retry_ms,
)
from rocketq.client.producer._sender import PreparedMessage, prepare_message
from rocketq.client.producer.config import ProducerConfig
from rocketq.message import Message, MessageQueue, SendResult, SendStatus
from services.common.clock import ManualClock

pytestmark = pytest.mark.unit

OLD, NEW, THIRD = "127.0.0.1:10911", "127.0.0.1:10912", "127.0.0.1:10913"


def _route(masters: dict[str, str | None], slaves: dict[str, dict[int, str]] | None = None,
           topic: str = "T", queues: int = 2) -> TopicRoute:  # fmt: skip
    brokers: dict[str, dict[int, str]] = {}
    for name, master in masters.items():
        ids = dict((slaves or {}).get(name, {}))
        if master is not None:
            ids[0] = master
        brokers[name] = ids
    qds = tuple(QueueData(name, queues, queues, 6) for name in sorted(masters))
    return TopicRoute(topic, qds, brokers)


def _not_master(addr: str) -> BrokerUnavailableError:
    return BrokerUnavailableError(
        "this broker is a slave", code="UNAVAILABLE", reason="NOT_MASTER", target=addr
    )


def _refused(addr: str) -> BrokerUnavailableError:
    return BrokerUnavailableError(f"cannot reach {addr}", code="UNAVAILABLE", target=addr)


# ---- which failures refresh, and how often ----------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (_not_master(OLD), "not-master"),
        (_refused(OLD), "unreachable"),
        (BrokerUnavailableError("x", code="CANCELLED"), "unreachable"),
        (
            BrokerUnavailableError("x", code="UNAVAILABLE", reason="SERVICE_NOT_AVAILABLE"),
            "unavailable",
        ),
        (BrokerUnavailableError("broker 'a' has no live master"), "no-master"),
        (RequestTimeoutError("slow", code="DEADLINE_EXCEEDED"), "timeout"),
        (ResourceExhaustedError("flow control", code="RESOURCE_EXHAUSTED"), None),
        (PermissionDeniedError("no write perm", code="PERMISSION_DENIED"), None),
        (TopicNotFoundError("no topic", code="NOT_FOUND"), None),
        (InvalidArgumentError("bad body", code="INVALID_ARGUMENT"), None),
        (ValueError("not an SDK error"), None),
    ],
)
def test_refresh_cause_table(exc: BaseException, cause: str | None) -> None:
    assert refresh_cause(exc) == cause


def test_refresh_gate_spaces_refreshes_per_topic_and_remembers_stale_routes() -> None:
    clock = ManualClock()
    gate = RefreshGate(now_ms=lambda: int(clock.monotonic_s() * 1000))
    assert gate.try_acquire("A")
    assert not gate.try_acquire("A")  # a burst of failures asks once
    assert gate.try_acquire("B")  # topics are independent
    clock.advance_ms(REFRESH_MIN_INTERVAL_MS - 1)
    assert not gate.try_acquire("A")
    clock.advance_ms(1)
    assert gate.try_acquire("A")
    gate.mark_stale("A")
    assert gate.is_stale("A") and not gate.is_stale("B")
    clock.advance_ms(REFRESH_MIN_INTERVAL_MS)
    assert gate.try_acquire("A")
    assert not gate.is_stale("A")  # a refresh clears the mark


def test_moved_masters_names_groups_whose_broker_id_0_changed_address() -> None:
    before = _route({"a": OLD, "b": THIRD}, {"a": {2: NEW}})
    after = _route({"a": NEW, "b": THIRD}, {"a": {1: OLD}})
    assert moved_masters(before, after) == {"a": (OLD, NEW)}
    assert moved_masters(before, before) == {}
    gone = _route({"a": None, "b": THIRD}, {"a": {1: OLD}})
    assert moved_masters(before, gone) == {"a": (OLD, None)}
    # The old master stays in the route as a slave (reads), but writes use the new one.
    assert after.master_addr("a") == NEW and after.brokers["a"][1] == OLD


def test_retry_waits_for_a_new_master_only_while_the_route_offers_nothing_new() -> None:
    stale = _route({"a": OLD})
    moved = _route({"a": NEW})
    none = _route({"a": None}, {"a": {2: NEW}})
    two_groups = _route({"a": OLD, "b": THIRD})
    assert route_offers_something_new(stale, moved, "a")
    assert route_offers_something_new(stale, none, "a")  # the dead master left the route
    assert route_offers_something_new(two_groups, two_groups, "a")  # "b" takes the retry
    assert not route_offers_something_new(stale, stale, "a")
    assert wait_before_retry_ms(stale, moved, "a", 0, 9000) == 0
    assert wait_before_retry_ms(two_groups, two_groups, "a", 0, 9000) == 0
    # Polling every RETRY_POLL_MS for at most half the time left when the wait began.
    assert wait_before_retry_ms(stale, stale, "a", 0, 9000) == RETRY_POLL_MS
    waited, remaining, waits = 0, 2000, []
    while (w := wait_before_retry_ms(stale, stale, "a", waited, remaining)) > 0:
        waits.append(w)
        waited, remaining = waited + w, remaining - w
    assert sum(waits) == 1000 and max(waits) == RETRY_POLL_MS
    assert wait_before_retry_ms(stale, stale, "a", 0, 0) == 0


# ---- the producer's retry goes to the new master ----------------------------------------------
class FakeInstance:
    """The client instance as the producer and consumer see it: a route cache over a fake
    nameserver whose answer the test changes (an election)."""

    client_id = "127.0.0.1@test"

    def __init__(self, nameserver_route: TopicRoute) -> None:
        self.nameserver_route = nameserver_route
        self.routes: dict[str, TopicRoute] = {}
        self.nameserver_calls = 0
        self.stubs: dict[str, Any] = {}

    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        if not refresh and topic in self.routes:
            return self.routes[topic]
        self.nameserver_calls += 1
        self.routes[topic] = self.nameserver_route
        return self.nameserver_route

    def cached_route(self, topic: str) -> TopicRoute | None:
        return self.routes.get(topic)

    def put_route(self, route: TopicRoute) -> None:
        self.routes[route.topic] = route

    async def refresh_routes(self) -> None:
        for topic in list(self.routes):
            await self.get_route(topic, refresh=True)

    async def heartbeat_now(self) -> object:
        return []

    def messaging(self, addr: str) -> Any:
        return self.stubs[addr]


class FakeSendHandler:
    """Answers sends by address: NOT_MASTER / refused from the old master, OK elsewhere."""

    def __init__(self, failing: dict[str, BrokerUnavailableError]) -> None:
        self.failing = failing
        self.sent_to: list[str] = []

    async def send(
        self, addr: str, mq: MessageQueue, req: Any, timeout_ms: int, msg_ids: Any = None
    ) -> list[Any]:
        self.sent_to.append(addr)
        if addr in self.failing:
            raise self.failing[addr]
        return [SendResult(SendStatus.SEND_OK, "id", "off", mq, 7)]


def _core(instance: FakeInstance, failing: dict[str, BrokerUnavailableError],
          fault: bool = False) -> tuple[ProducerCore, FakeSendHandler]:  # fmt: skip
    config = ProducerConfig("pg", ["127.0.0.1:9876"], send_latency_fault_enable=fault)
    core = ProducerCore(config)
    core._instance = instance  # type: ignore[assignment]
    core._state = "running"
    handler = FakeSendHandler(failing)
    core._handler = handler  # type: ignore[assignment]
    return core, handler


def _items() -> list[PreparedMessage]:
    return [prepare_message(Message("T", b"x"), create_topic_key="TBW102", max_size_bytes=1 << 20)]


@pytest.mark.parametrize("failure", [_not_master(OLD), _refused(OLD)])
async def test_send_retry_refreshes_the_route_and_goes_to_the_new_master(
    failure: BrokerUnavailableError,
) -> None:
    instance = FakeInstance(_route({"a": OLD}, {"a": {2: NEW}}))
    core, handler = _core(instance, {OLD: failure}, fault=True)
    await instance.get_route("T")  # cached: the old master
    instance.nameserver_route = _route({"a": NEW}, {"a": {1: OLD}})  # elected meanwhile
    [result] = await core.send_with_retries("T", _items(), timeout_ms=3000, retries=2)
    assert result.status is SendStatus.SEND_OK
    assert handler.sent_to == [OLD, NEW]
    assert instance.nameserver_calls == 2  # the first lookup, then one refresh
    assert core.fault is not None and core.fault.is_available("a")  # old master's failure


async def test_send_that_fails_for_another_reason_does_not_refresh() -> None:
    instance = FakeInstance(_route({"a": OLD, "b": THIRD}))
    flow = ResourceExhaustedError("busy", code="RESOURCE_EXHAUSTED")
    core, handler = _core(instance, {OLD: flow})  # type: ignore[dict-item]
    await core.send_with_retries("T", _items(), timeout_ms=3000, retries=2)
    assert instance.nameserver_calls == 1
    assert handler.sent_to[-1] == THIRD


async def test_ordered_send_failure_makes_the_next_send_refresh_first() -> None:
    instance = FakeInstance(_route({"a": OLD}))
    core, handler = _core(instance, {OLD: _not_master(OLD)})
    mq = MessageQueue("T", "a", 1)
    with pytest.raises(BrokerUnavailableError):
        await core.send_to_queue(mq, _items(), 3000)  # one attempt, no retry
    instance.nameserver_route = _route({"a": NEW})
    [result] = await core.send_to_queue(mq, _items(), 3000)
    assert result.status is SendStatus.SEND_OK
    assert handler.sent_to == [OLD, NEW]
    [again] = await core.send_to_queue(mq, _items(), 3000)
    assert again.status is SendStatus.SEND_OK and instance.nameserver_calls == 2


# ---- the consumer's commits and locks follow the new master -----------------------------------
class FakeStub:
    """Messaging calls answered by one replica: as master (OK) or as slave (NOT_MASTER)."""

    def __init__(self, addr: str, master: bool) -> None:
        self.addr, self.master = addr, master
        self.calls: list[str] = []

    def _answer(self, name: str, response: object) -> Callable[..., Awaitable[object]]:
        async def call(req: object, timeout: float) -> object:
            self.calls.append(name)
            if not self.master:
                raise _not_master(self.addr)
            return response

        return call

    def __getattr__(self, name: str) -> Any:
        from rocketq._api.rocketq.v1 import messaging_pb2

        responses = {
            "UpdateConsumerOffset": messaging_pb2.UpdateConsumerOffsetResponse(),
            "LockBatch": messaging_pb2.LockBatchResponse(),
        }
        return self._answer(name, responses[name])


def _api_after_switchover() -> tuple[BrokerApi, FakeInstance]:
    """A consumer whose cached route still names OLD as master; OLD is now a slave of NEW."""
    instance = FakeInstance(_route({"a": OLD}, {"a": {2: NEW}}))
    instance.routes["T"] = instance.nameserver_route
    instance.nameserver_route = _route({"a": NEW}, {"a": {1: OLD}})
    instance.stubs = {OLD: FakeStub(OLD, master=False), NEW: FakeStub(NEW, master=True)}
    return BrokerApi(instance, "cg", 3000), instance


async def test_offset_commit_refused_by_a_stale_master_refreshes_and_goes_to_the_new_one() -> None:
    api, instance = _api_after_switchover()
    await api.update_offset(MessageQueue("T", "a", 0), 42)
    assert instance.stubs[OLD].calls == ["UpdateConsumerOffset"]
    assert instance.stubs[NEW].calls == ["UpdateConsumerOffset"]
    assert instance.nameserver_calls == 1
    assert instance.routes["T"].master_addr("a") == NEW
    await api.update_offset(MessageQueue("T", "a", 0), 43)  # straight to the new master
    assert instance.stubs[OLD].calls == ["UpdateConsumerOffset"]
    assert instance.stubs[NEW].calls == ["UpdateConsumerOffset"] * 2


async def test_queue_lock_refused_by_a_stale_master_is_retried_on_the_new_one() -> None:
    api, instance = _api_after_switchover()
    await api.lock_batch("a", [MessageQueue("T", "a", 0)])
    assert instance.stubs[OLD].calls == ["LockBatch"]
    assert instance.stubs[NEW].calls == ["LockBatch"]


async def test_queue_lock_refused_with_no_new_master_raises_not_master() -> None:
    api, instance = _api_after_switchover()
    instance.nameserver_route = instance.routes["T"]  # nobody elected yet
    with pytest.raises(BrokerUnavailableError) as info:
        await api.lock_batch("a", [MessageQueue("T", "a", 0)])
    assert info.value.reason == "NOT_MASTER"
    assert instance.stubs[NEW].calls == []


# ---- admin: a group's HA status ---------------------------------------------------------------
def _stats(replica_id: int, *, master: bool, epoch: int = 3, max_offset: int = 1000,
           isr: tuple[int, ...] = (1, 2, 3), controller: bool = True,
           slaves: tuple[SlaveInfo, ...] = ()) -> RuntimeStats:  # fmt: skip
    return RuntimeStats(
        cluster_name="DefaultCluster",
        broker_name="broker-a",
        broker_id=0 if master else replica_id,
        role="SYNC_MASTER" if master else "SLAVE",
        epoch=epoch,
        version="test",
        start_timestamp_ms=0,
        commitlog_min_offset=0,
        commitlog_max_offset=max_offset,
        commitlog_flushed_offset=max_offset,
        confirm_offset=max_offset,
        dispatch_behind_bytes=0,
        put_messages_per_second=0.0,
        get_messages_per_second=0.0,
        held_pull_requests=0,
        disk_used_ratio=0.0,
        commitlog_disk_bytes=0,
        connected_clients=0,
        slaves=slaves,
        extra={},
        replica_id=replica_id,
        controller_mode=controller,
        in_sync_replica_ids=isr,
        lease_remaining_ms=2500,
        leader_addr=OLD,
    )


def test_ha_status_names_master_epoch_isr_and_lag() -> None:
    group = summarize_group(
        "DefaultCluster",
        "broker-a",
        {0: OLD, 2: NEW, 3: THIRD},
        {
            OLD: _stats(1, master=True, max_offset=1000),
            NEW: _stats(2, master=False, max_offset=900),
            THIRD: _stats(3, master=False, max_offset=1000, epoch=2),
        },
    )
    assert (group.master_replica_id, group.master_addr, group.epoch) == (1, OLD, 3)
    assert group.in_sync_replica_ids == (1, 2, 3) and group.controller_mode
    assert [(r.replica_id, r.role, r.in_isr, r.lag_bytes) for r in group.replicas] == [
        (1, "SYNC_MASTER", True, 0),
        (2, "SLAVE", True, 100),
        (3, "SLAVE", True, 0),
    ]
    assert group.warnings == ()


def test_ha_status_reports_down_replicas_two_claimants_and_no_master() -> None:
    group = summarize_group(
        "c",
        "broker-a",
        {0: NEW, 1: OLD, 3: THIRD},
        {
            NEW: _stats(2, master=True, epoch=4, isr=(2, 3)),
            OLD: _stats(1, master=True, epoch=3),  # the old master, not yet told
            THIRD: "cannot reach 127.0.0.1:10913",
        },
    )
    assert group.master_replica_id == 2 and group.epoch == 4
    assert group.in_sync_replica_ids == (2, 3)  # the newest master's
    down = [r for r in group.replicas if r.role == DOWN]
    assert [(r.replica_id, r.addr, r.in_isr) for r in down] == [(3, THIRD, True)]
    assert any("also report being master" in w for w in group.warnings)
    assert any("did not answer" in w for w in group.warnings)

    leaderless = summarize_group(
        "c", "broker-a", {2: NEW}, {NEW: _stats(2, master=False, isr=(1, 2))}
    )
    assert leaderless.master_replica_id is None and leaderless.master_addr == ""
    assert [r.replica_id for r in leaderless.replicas] == [1, 2]  # ISR member 1 is down
    assert any("no replica is master" in w for w in leaderless.warnings)


def test_ha_status_with_static_roles_uses_the_masters_in_sync_slaves() -> None:
    slaves = (SlaveInfo(1, NEW, 1000, True, 0), SlaveInfo(2, THIRD, 10, False, 0))
    group = summarize_group(
        "c",
        "broker-a",
        {0: OLD, 1: NEW, 2: THIRD},
        {
            OLD: _stats(0, master=True, epoch=0, isr=(), controller=False, slaves=slaves),
            NEW: _stats(1, master=False, epoch=0, isr=(), controller=False),
            THIRD: _stats(2, master=False, epoch=0, isr=(), controller=False, max_offset=10),
        },
    )
    assert not group.controller_mode
    assert group.in_sync_replica_ids == (0, 1)
    assert [r.in_isr for r in group.replicas] == [True, True, False]


def test_switchover_arguments_are_checked_before_any_call() -> None:
    check_switchover_args(0, 10_000)
    check_switchover_args(3, 120_000)
    for target, timeout in ((-1, 10_000), (1, 0), (1, 120_001)):
        with pytest.raises(InvalidArgumentError):
            check_switchover_args(target, timeout)
