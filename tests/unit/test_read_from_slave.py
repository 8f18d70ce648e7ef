"""Reading from slaves, client side (DESIGN.md §6, SPEC §6.7, §6.8), with fake brokers (no sockets).

- the route choice: suggested id, then master, then slaves; unreachable addresses last;
- BrokerHealth marks expire on an injected clock and clear on success;
- the Puller follows suggest_which_broker_id per queue, falls back to the master when the
  suggested id is not in the route, and fails over to a slave when the master cannot be
  reached (carrying the commit offset only when the slave would store it);
- offsets: commits go to the master, to a slave while the master is unreachable; a slave's
  NOT_MASTER answer moves on without marking it unreachable; a refusal ends the search;
- the broker's suggestion rule (slaveReadEnable, whichBrokerWhenConsumeSlowly) and the store's
  memory limit from its config.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import status_pb2

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client._route import (
    BrokerHealth,
    ReadTarget,
    TopicRoute,
    read_targets,
    write_targets,
)
from rocketq.client.consumer._api import BrokerApi, is_unreachable
from rocketq.client.consumer._pull import FLAG_COMMIT_OFFSET, Puller
from rocketq.client.consumer._rebalance import PullRequest
from rocketq.client.consumer._subscription import build_subscription
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.errors import (
    BrokerUnavailableError,
    NotFoundError,
    RequestTimeoutError,
    RocketQError,
)
from rocketq.message import MessageQueue
from services.broker.pull_processor import suggest_broker_id
from services.store.config import StoreConfig
from services.store.message_store import MessageStore

pytestmark = pytest.mark.unit

MASTER, SLAVE1, SLAVE2 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
MQ = MessageQueue("T", "broker-a", 0)


def route(ids: dict[int, str] | None = None) -> TopicRoute:
    brokers = {"broker-a": dict(ids if ids is not None else {0: MASTER, 1: SLAVE1, 2: SLAVE2})}
    return TopicRoute("T", (), brokers)


def addrs(targets: list[ReadTarget]) -> list[tuple[int, str]]:
    return [(t.broker_id, t.addr) for t in targets]


# ---- route choice ---------------------------------------------------------------------------


def test_read_targets_start_with_the_suggested_id_then_master_then_slaves() -> None:
    assert addrs(read_targets(route(), "broker-a", 0)) == [(0, MASTER), (1, SLAVE1), (2, SLAVE2)]
    assert addrs(read_targets(route(), "broker-a", 2)) == [(2, SLAVE2), (0, MASTER), (1, SLAVE1)]


def test_a_suggested_id_missing_from_the_route_means_the_master() -> None:
    assert addrs(read_targets(route({0: MASTER, 1: SLAVE1}), "broker-a", 7)) == [
        (0, MASTER),
        (1, SLAVE1),
    ]


def test_without_a_master_in_the_route_reads_go_to_the_slaves_by_id() -> None:
    assert addrs(read_targets(route({2: SLAVE2, 1: SLAVE1}), "broker-a", 0)) == [
        (1, SLAVE1),
        (2, SLAVE2),
    ]
    assert read_targets(route({}), "broker-a", 0) == []
    assert read_targets(route(), "broker-b", 0) == []


def test_unreachable_addresses_go_last_in_their_order() -> None:
    down = {MASTER, SLAVE1}
    targets = read_targets(route(), "broker-a", 1, lambda a: a in down)
    assert addrs(targets) == [(2, SLAVE2), (1, SLAVE1), (0, MASTER)]
    # Everything down: still every broker, in the normal order (someone must be tried).
    targets = read_targets(route(), "broker-a", 0, lambda a: True)
    assert addrs(targets) == [(0, MASTER), (1, SLAVE1), (2, SLAVE2)]


def test_commits_go_to_the_master_first_whatever_the_pull_suggestion() -> None:
    assert addrs(write_targets(route(), "broker-a")) == [(0, MASTER), (1, SLAVE1), (2, SLAVE2)]
    assert addrs(write_targets(route(), "broker-a", lambda a: a == MASTER))[0] == (1, SLAVE1)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_broker_health_marks_expire_and_clear_on_success() -> None:
    clock = FakeClock()
    health = BrokerHealth(backoff_ms=10_000, now_s=clock)
    assert not health.is_unreachable(MASTER)
    health.mark_unreachable(MASTER)
    assert health.is_unreachable(MASTER)
    clock.now_s += 9.9
    assert health.is_unreachable(MASTER)
    clock.now_s += 0.1
    assert not health.is_unreachable(MASTER)  # probed again after the backoff
    health.mark_unreachable(SLAVE1)
    health.mark_reachable(SLAVE1)
    assert not health.is_unreachable(SLAVE1)


def test_unreachable_means_not_reached_not_refused() -> None:
    assert is_unreachable(BrokerUnavailableError("cannot reach", code="UNAVAILABLE"))
    assert is_unreachable(RequestTimeoutError("slow", code="DEADLINE_EXCEEDED"))
    assert not is_unreachable(BrokerUnavailableError("slave", reason="NOT_MASTER"))
    assert not is_unreachable(NotFoundError("none", code="NOT_FOUND"))


# ---- fake brokers behind a real BrokerApi ---------------------------------------------------


def rpc_error(code: grpc.StatusCode, text: str, reason: int | None = None) -> grpc.aio.AioRpcError:
    """A failed call as grpc.aio raises it; with an ErrorDetail when ``reason`` is given."""
    trailing = grpc.aio.Metadata()
    if reason is not None:
        packed = any_pb2.Any()
        packed.Pack(common_pb2.ErrorDetail(reason=reason))  # type: ignore[arg-type]
        status = status_pb2.Status(code=code.value[0], message=text, details=[packed])
        trailing.add("grpc-status-details-bin", status.SerializeToString())
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details=text)


class FakeBroker:
    """One broker's Messaging stub: canned answers, or an error for every call."""

    def __init__(self, suggest: int = 0, error: grpc.aio.AioRpcError | None = None) -> None:
        self.suggest = suggest
        self.error = error
        self.pulls: list[messaging_pb2.PullRequest] = []
        self.commits: list[int] = []
        self.offset = 42

    async def _answer(self, value: Any) -> Any:
        if self.error is not None:
            raise self.error
        return value

    def Pull(self, req: messaging_pb2.PullRequest, timeout: float) -> Awaitable[Any]:
        self.pulls.append(req)
        return self._answer(
            messaging_pb2.PullResponse(
                status=messaging_pb2.NO_NEW_MSG,
                next_begin_offset=req.queue_offset,
                suggest_which_broker_id=self.suggest,
            )
        )

    def UpdateConsumerOffset(
        self, req: messaging_pb2.UpdateConsumerOffsetRequest, timeout: float
    ) -> Awaitable[Any]:
        if self.error is None:
            self.commits.append(req.commit_offset)
        return self._answer(messaging_pb2.UpdateConsumerOffsetResponse())

    def GetConsumerIdList(
        self, req: messaging_pb2.GetConsumerIdListRequest, timeout: float
    ) -> Awaitable[Any]:
        return self._answer(messaging_pb2.GetConsumerIdListResponse(consumer_ids=["c1", "c2"]))

    def QueryConsumerOffset(
        self, req: messaging_pb2.QueryConsumerOffsetRequest, timeout: float
    ) -> Awaitable[Any]:
        return self._answer(messaging_pb2.QueryConsumerOffsetResponse(offset=self.offset))


DOWN = rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
NOT_MASTER = rpc_error(grpc.StatusCode.UNAVAILABLE, "broker is a slave", common_pb2.NOT_MASTER)


class FakeInstance:
    """The client instance a BrokerApi needs: a fixed route and fake stubs."""

    def __init__(self, brokers: dict[int, FakeBroker], route_ids: dict[int, str]) -> None:
        self.route = route(route_ids)
        self.by_addr = {route_ids[i]: b for i, b in brokers.items()}
        self.refreshes = 0

    @property
    def client_id(self) -> str:
        return "c1"

    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        return self.route

    def cached_route(self, topic: str) -> TopicRoute | None:
        return self.route

    def messaging(self, addr: str) -> Any:
        return self.by_addr[addr]

    async def heartbeat_now(self) -> object:
        return None

    async def refresh_routes(self) -> None:
        self.refreshes += 1


def make(
    master: FakeBroker, slave: FakeBroker, *, with_master: bool = True
) -> tuple[FakeInstance, BrokerApi, FakeClock]:
    ids = {0: MASTER, 1: SLAVE1} if with_master else {1: SLAVE1}
    brokers = {0: master, 1: slave} if with_master else {1: slave}
    instance = FakeInstance(brokers, ids)
    api = BrokerApi(instance, "g", 3000)
    clock = FakeClock()
    api.health = BrokerHealth(now_s=clock)
    return instance, api, clock


async def pull(api: BrokerApi, req: PullRequest, commit_offset: int = 5) -> None:
    await Puller(api, "g", 4).pull(
        req,
        build_subscription("T", "*"),
        max_nums=32,
        commit_offset=commit_offset,
        suspend_ms=15000,
        timeout_ms=30000,
    )


async def test_pulls_follow_the_suggested_broker_per_queue_and_return_to_the_master() -> None:
    master, slave = FakeBroker(suggest=1), FakeBroker(suggest=0)
    _, api, _ = make(master, slave)
    req = PullRequest(MQ, ProcessQueue(), 10)
    await pull(api, req)
    assert (len(master.pulls), len(slave.pulls), req.broker_id) == (1, 0, 1)
    await pull(api, req)  # the master said: this queue's backlog is beyond memory, read slave 1
    assert (len(master.pulls), len(slave.pulls), req.broker_id) == (1, 1, 0)
    # The master is up: a slave ignores commit offsets, so the pull does not carry one.
    assert slave.pulls[0].sys_flag & FLAG_COMMIT_OFFSET == 0
    assert master.pulls[0].sys_flag & FLAG_COMMIT_OFFSET and master.pulls[0].commit_offset == 5
    await pull(api, req)  # the slave suggested the master again
    assert (len(master.pulls), len(slave.pulls)) == (2, 1)
    other = PullRequest(MessageQueue("T", "broker-a", 1), ProcessQueue(), 0)
    assert other.broker_id == 0  # the table is per queue


async def test_a_suggested_id_not_in_the_route_pulls_the_master() -> None:
    master, slave = FakeBroker(), FakeBroker()
    _, api, _ = make(master, slave)
    req = PullRequest(MQ, ProcessQueue(), 10, broker_id=3)
    await pull(api, req)
    assert (len(master.pulls), len(slave.pulls)) == (1, 0)


async def test_an_unreachable_master_fails_over_to_the_slave_with_the_commit_offset() -> None:
    master, slave = FakeBroker(error=DOWN), FakeBroker(suggest=0)
    instance, api, clock = make(master, slave)
    req = PullRequest(MQ, ProcessQueue(), 10)
    await pull(api, req, commit_offset=7)
    assert len(master.pulls) == 1 and len(slave.pulls) == 1
    assert instance.refreshes == 1  # the route is asked again once
    # The slave has lost its master too (it may store commits): the pull carries the offset.
    assert slave.pulls[0].sys_flag & FLAG_COMMIT_OFFSET and slave.pulls[0].commit_offset == 7
    # The slave suggests the master, but the master stays skipped while it is marked.
    await pull(api, req)
    assert (len(master.pulls), len(slave.pulls)) == (1, 2)
    # After the backoff the master is probed again, and used as soon as it answers.
    master.error = None
    clock.now_s += 10
    await pull(api, req)
    assert (len(master.pulls), len(slave.pulls)) == (2, 2)


async def test_a_master_gone_from_the_route_is_not_tried() -> None:
    slave = FakeBroker(suggest=0)
    _, api, _ = make(FakeBroker(), slave, with_master=False)
    req = PullRequest(MQ, ProcessQueue(), 10)
    await pull(api, req, commit_offset=7)
    assert len(slave.pulls) == 1 and slave.pulls[0].commit_offset == 7


async def test_every_replica_unreachable_raises() -> None:
    master, slave = FakeBroker(error=DOWN), FakeBroker(error=DOWN)
    _, api, _ = make(master, slave)
    with pytest.raises(BrokerUnavailableError):
        await pull(api, PullRequest(MQ, ProcessQueue(), 10))
    assert (len(master.pulls), len(slave.pulls)) == (1, 1)


async def test_a_refused_pull_is_not_retried_elsewhere() -> None:
    refused = rpc_error(grpc.StatusCode.NOT_FOUND, "no topic", common_pb2.TOPIC_NOT_EXIST)
    master, slave = FakeBroker(error=refused), FakeBroker()
    _, api, _ = make(master, slave)
    with pytest.raises(RocketQError):
        await pull(api, PullRequest(MQ, ProcessQueue(), 10))
    assert len(slave.pulls) == 0


async def test_offsets_commit_to_the_master_else_to_a_slave() -> None:
    master, slave = FakeBroker(), FakeBroker()
    _, api, clock = make(master, slave)
    await api.update_offset(MQ, 11)
    assert (master.commits, slave.commits) == ([11], [])
    master.error = DOWN
    await api.update_offset(MQ, 12)
    assert (master.commits, slave.commits) == ([11], [12])
    # Marked unreachable: the next commit goes straight to the slave.
    await api.update_offset(MQ, 13)
    assert slave.commits == [12, 13]
    # The master is back, and the slave (reconnected to it) refuses with NOT_MASTER: the
    # commit moves on to the master, and the slave is not marked unreachable for reads.
    master.error, slave.error = None, NOT_MASTER
    await api.update_offset(MQ, 14)
    assert master.commits == [11, 14]
    assert not api.health.is_unreachable(SLAVE1)
    clock.now_s += 10
    await api.update_offset(MQ, 15)
    assert master.commits == [11, 14, 15]


async def test_offset_queries_fall_back_to_a_slave_but_a_refusal_is_final() -> None:
    master, slave = FakeBroker(error=DOWN), FakeBroker()
    slave.offset = 77
    _, api, _ = make(master, slave)
    assert await api.query_offset(MQ) == 77
    master.error = rpc_error(grpc.StatusCode.NOT_FOUND, "no offset")
    api.health.mark_reachable(MASTER)
    with pytest.raises(NotFoundError):
        await api.query_offset(MQ)


async def test_offsets_with_every_replica_down_raise_the_first_failure() -> None:
    master, slave = FakeBroker(error=DOWN), FakeBroker(error=NOT_MASTER)
    _, api, _ = make(master, slave)
    with pytest.raises(BrokerUnavailableError) as info:
        await api.update_offset(MQ, 1)
    assert info.value.reason == ""  # the master's failure, not the slave's refusal


async def test_member_lists_come_from_a_slave_while_the_master_is_down() -> None:
    master, slave = FakeBroker(error=DOWN), FakeBroker()
    _, api, _ = make(master, slave)
    assert await api.consumer_ids("T") == ["c1", "c2"]
    assert api.health.is_unreachable(MASTER)
    slave.error = DOWN
    with pytest.raises(BrokerUnavailableError):
        await api.consumer_ids("T")


# ---- broker side: the suggestion and the store's memory limit -------------------------------


def test_the_broker_suggests_a_slave_only_with_slave_reads_enabled_and_a_deep_backlog() -> None:
    def suggest(enable: bool, beyond: bool) -> int:
        return suggest_broker_id(
            slave_read_enable=enable,
            beyond_memory=beyond,
            group_broker_id=0,
            which_broker_when_consume_slowly=2,
        )

    assert suggest(True, True) == 2
    assert suggest(True, False) == 0
    assert suggest(False, True) == 0
    assert suggest(False, False) == 0


def test_the_store_memory_limit_comes_from_its_config(tmp_path: Path) -> None:
    cfg = StoreConfig(
        tmp_path / "s",
        commitlog_file_bytes=64 * 1024,
        access_message_in_memory_max_ratio=50,
        physical_memory_bytes=1000,
    )
    store = MessageStore(cfg)
    assert store.memory_limit_bytes == 500
    assert MessageStore(cfg, memory_bytes=4000).memory_limit_bytes == 2000
