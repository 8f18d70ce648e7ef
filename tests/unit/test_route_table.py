"""RouteTable on a ManualClock: registration, replacement, slaves, expiry, epochs, validation."""

from __future__ import annotations

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2, nameserver_pb2
from services.common.clock import ManualClock
from services.common.errors import ServiceError
from services.nameserver.route_table import RouteTable

pytestmark = pytest.mark.unit

SCAN_INTERVAL_MS = 10_000


def topic(name: str, read: int = 4, write: int = 4, perm: int = 6) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(
        topic_name=name, read_queue_nums=read, write_queue_nums=write, perm=perm
    )


def reg(
    name: str = "broker-a",
    broker_id: int = 0,
    addr: str = "10.0.0.1:10911",
    topics: list[common_pb2.TopicConfig] | None = None,
    cluster: str = "DefaultCluster",
    **fields: object,
) -> nameserver_pb2.RegisterBrokerRequest:
    return nameserver_pb2.RegisterBrokerRequest(
        cluster_name=cluster,
        broker_name=name,
        broker_id=broker_id,
        broker_addr=addr,
        topic_configs=topics or [],
        **fields,  # type: ignore[arg-type]
    )


def unreg(
    name: str = "broker-a", broker_id: int = 0, addr: str = "10.0.0.1:10911"
) -> nameserver_pb2.UnregisterBrokerRequest:
    return nameserver_pb2.UnregisterBrokerRequest(
        cluster_name="DefaultCluster", broker_name=name, broker_id=broker_id, broker_addr=addr
    )


def refused(call: object, *args: object) -> ServiceError:
    with pytest.raises(ServiceError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def table(clock: ManualClock) -> RouteTable:
    return RouteTable(clock)


def test_register_then_route(table: RouteTable) -> None:
    assert table.register(reg(topics=[topic("orders", read=8, write=4, perm=6)])) == ("", "")
    route = table.route("orders")
    assert route is not None
    assert [
        (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queues
    ] == [("broker-a", 8, 4, 6)]
    assert [(b.cluster, b.broker_name, dict(b.broker_addrs)) for b in route.brokers] == [
        ("DefaultCluster", "broker-a", {0: "10.0.0.1:10911"})
    ]
    assert table.route("payments") is None


def test_register_replaces_the_groups_topics(table: RouteTable) -> None:
    table.register(reg(topics=[topic("orders"), topic("old")]))
    table.register(reg(topics=[topic("orders", read=2, write=2), topic("new")]))
    assert table.route("old") is None
    route = table.route("orders")
    assert route is not None and route.queues[0].read_queue_nums == 2
    assert table.all_topics() == ["new", "orders"]


def test_same_data_version_still_rebuilds(table: RouteTable) -> None:
    # A drained broker masks perms without bumping its version; the change must still show.
    v1 = common_pb2.DataVersion(timestamp_ms=1, counter=1)
    table.register(reg(topics=[topic("orders", perm=6), topic("w", perm=2)], data_version=v1))
    table.register(reg(topics=[topic("orders", perm=4), topic("w", perm=0)], data_version=v1))
    route = table.route("orders")
    assert route is not None and route.queues[0].perm == 4
    route = table.route("w")
    assert route is not None and route.queues[0].perm == 0
    live = table.cluster_info().live_brokers[0]
    assert (live.data_version.timestamp_ms, live.data_version.counter) == (1, 1)


def test_slave_registration_adds_address_only(table: RouteTable) -> None:
    table.register(reg(topics=[topic("orders")], ha_server_addr="10.0.0.1:10912"))
    master, ha = table.register(reg(broker_id=1, addr="10.0.0.2:10911", topics=[topic("x")]))
    assert (master, ha) == ("10.0.0.1:10911", "10.0.0.1:10912")
    assert table.route("x") is None, "a slave's topic list does not define routes"
    route = table.route("orders")
    assert route is not None
    assert dict(route.brokers[0].broker_addrs) == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}


def test_slave_without_master_gets_empty_master_addr(table: RouteTable) -> None:
    assert table.register(reg(broker_id=1, addr="10.0.0.2:10911")) == ("", "")


def test_master_gone_slaves_still_route_read_only(table: RouteTable) -> None:
    table.register(reg(topics=[topic("orders", perm=6)]))
    table.register(reg(broker_id=1, addr="10.0.0.2:10911"))
    assert table.unregister(unreg()) is not None
    route = table.route("orders")
    assert route is not None
    assert dict(route.brokers[0].broker_addrs) == {1: "10.0.0.2:10911"}
    assert route.queues[0].perm == 4, "no master: consumers read, producers must not write"
    table.unregister(unreg(broker_id=1, addr="10.0.0.2:10911"))
    assert table.route("orders") is None
    assert table.all_topics() == []
    info = table.cluster_info()
    assert not info.broker_addr_table and not info.cluster_addr_table and not info.live_brokers


def test_unregister_is_idempotent_and_matches_identity(table: RouteTable) -> None:
    table.register(reg(topics=[topic("orders")]))
    assert table.unregister(unreg(name="broker-b")) is None, "wrong name: not this broker"
    assert table.unregister(unreg(broker_id=1)) is None, "wrong id: not this broker"
    assert table.route("orders") is not None
    removed = table.unregister(unreg())
    assert removed is not None and removed.reason == "unregistered"
    assert table.unregister(unreg()) is None
    assert table.route("orders") is None


def test_expiry_after_120_s_with_10_s_scan(table: RouteTable, clock: ManualClock) -> None:
    table.register(reg(topics=[topic("orders")]))
    table.register(reg(name="broker-b", addr="10.0.0.3:10911", topics=[topic("orders")]))
    expired_at_ms = None
    for step in range(1, 20):
        clock.advance_ms(SCAN_INTERVAL_MS)
        if step * SCAN_INTERVAL_MS <= 60_000:
            # broker-b keeps heartbeating every 30 s-ish; broker-a has gone silent.
            table.register(reg(name="broker-b", addr="10.0.0.3:10911", topics=[topic("orders")]))
        removed = table.scan_expired()
        if removed:
            assert [(r.broker_name, r.reason) for r in removed] == [("broker-a", "expired")]
            assert removed[0].silent_ms == 130_000
            expired_at_ms = step * SCAN_INTERVAL_MS
            break
        route = table.route("orders")
        assert route is not None and [q.broker_name for q in route.queues] == [
            "broker-a",
            "broker-b",
        ]
    assert expired_at_ms == 130_000, "first scan after 120 s of silence removes it"
    route = table.route("orders")
    assert route is not None and [q.broker_name for q in route.queues] == ["broker-b"]
    clock.advance_ms(120_000)
    assert [r.broker_name for r in table.scan_expired()] == ["broker-b"]
    assert table.route("orders") is None


def test_heartbeat_resets_expiry_and_custom_timeout(table: RouteTable, clock: ManualClock) -> None:
    table.register(reg(topics=[topic("orders")], heartbeat_timeout_ms=1000))
    clock.advance_ms(900)
    table.register(reg(topics=[topic("orders")], heartbeat_timeout_ms=1000))
    clock.advance_ms(900)
    assert table.scan_expired() == []
    clock.advance_ms(200)
    assert [r.reason for r in table.scan_expired()] == ["expired"]


def test_expiry_uses_monotonic_time(table: RouteTable, clock: ManualClock) -> None:
    table.register(reg(topics=[topic("orders")]))
    clock._now_ms += 10 * 120_000  # the wall clock jumps forward; no real time passed
    assert table.scan_expired() == []


def test_epoch_refuses_stale_master(table: RouteTable) -> None:
    table.register(reg(addr="10.0.0.2:10911", topics=[topic("orders")], epoch=3))
    err = refused(table.register, reg(addr="10.0.0.1:10911", topics=[topic("stale")], epoch=2))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "epoch 2" in err.message and "epoch 3" in err.message
    assert table.route("stale") is None
    route = table.route("orders")
    assert route is not None and dict(route.brokers[0].broker_addrs) == {0: "10.0.0.2:10911"}
    # The old master rejoins as a slave and learns where the master is.
    assert table.register(reg(broker_id=1, addr="10.0.0.1:10911", epoch=3))[0] == "10.0.0.2:10911"


def test_newer_or_equal_epoch_master_takes_over(table: RouteTable) -> None:
    table.register(reg(addr="10.0.0.1:10911", topics=[topic("a")], epoch=1))
    table.register(reg(addr="10.0.0.2:10911", topics=[topic("b")], epoch=2))
    table.register(reg(addr="10.0.0.3:10911", topics=[topic("c")], epoch=2))
    assert table.all_topics() == ["c"]
    info = table.cluster_info()
    assert [lb.broker_addr for lb in info.live_brokers] == ["10.0.0.3:10911"]
    assert dict(info.broker_addr_table["broker-a"].broker_addrs) == {0: "10.0.0.3:10911"}


def test_address_reused_under_another_id_drops_old_identity(table: RouteTable) -> None:
    table.register(reg(topics=[topic("orders")]))
    table.register(reg(broker_id=1, addr="10.0.0.2:10911"))
    # The slave is promoted: same address, now id 0.
    table.register(reg(addr="10.0.0.2:10911", topics=[topic("orders")], epoch=1))
    route = table.route("orders")
    assert route is not None and dict(route.brokers[0].broker_addrs) == {0: "10.0.0.2:10911"}


def test_routes_sorted_by_broker_name(table: RouteTable) -> None:
    for i, name in enumerate(["broker-c", "broker-a", "broker-b"]):
        table.register(reg(name=name, addr=f"10.0.0.{i}:10911", topics=[topic("orders")]))
    route = table.route("orders")
    assert route is not None
    assert [q.broker_name for q in route.queues] == ["broker-a", "broker-b", "broker-c"]
    assert [b.broker_name for b in route.brokers] == ["broker-a", "broker-b", "broker-c"]


def test_all_topics_filter_by_cluster(table: RouteTable) -> None:
    table.register(reg(name="a", addr="h:1", cluster="c1", topics=[topic("t1"), topic("both")]))
    table.register(reg(name="b", addr="h:2", cluster="c2", topics=[topic("t2"), topic("both")]))
    assert table.all_topics() == ["both", "t1", "t2"]
    assert table.all_topics("c1") == ["both", "t1"]
    assert table.all_topics("c2") == ["both", "t2"]
    assert table.all_topics("nope") == []
    info = table.cluster_info()
    assert {c: list(n.broker_names) for c, n in info.cluster_addr_table.items()} == {
        "c1": ["a"],
        "c2": ["b"],
    }


def test_cluster_info_lists_live_brokers_sorted(table: RouteTable, clock: ManualClock) -> None:
    table.register(reg(name="b", addr="h:3", topics=[topic("t")], epoch=5, heartbeat_timeout_ms=9))
    table.register(reg(name="a", broker_id=1, addr="h:2"))
    table.register(reg(name="a", addr="h:1", ha_server_addr="h:11"))
    info = table.cluster_info()
    assert [(lb.broker_name, lb.broker_id) for lb in info.live_brokers] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]
    b = info.live_brokers[2]
    assert (b.epoch, b.heartbeat_timeout_ms, b.last_update_timestamp_ms) == (5, 9, clock.now_ms())
    assert info.live_brokers[0].ha_server_addr == "h:11"
    assert info.live_brokers[1].heartbeat_timeout_ms == 120_000


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (reg(cluster=""), "cluster name is empty"),
        (reg(name=""), "broker name is empty"),
        (reg(name="bad name"), "broker name"),
        (reg(addr=""), "broker_addr is empty"),
        (reg(addr="no-port"), "host:port"),
        (reg(addr="h:0"), "host:port"),
        (reg(broker_id=-1), "broker_id is -1"),
        (reg(heartbeat_timeout_ms=0), "heartbeat_timeout_ms is 0"),
        (reg(epoch=-1), "epoch is -1"),
        (reg(topics=[topic("bad topic!")]), "characters outside"),
        (reg(topics=[topic("t", read=0)]), "read_queue_nums is 0"),
        (reg(topics=[topic("t", write=1025)]), "write_queue_nums is 1025"),
        (reg(topics=[topic("t", perm=7)]), "perm is 7"),
        (reg(topics=[topic("t"), topic("t")]), "appears twice"),
    ],
)
def test_invalid_registrations(
    table: RouteTable, request_: nameserver_pb2.RegisterBrokerRequest, needle: str
) -> None:
    err = refused(table.register, request_)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.reason == common_pb2.ILLEGAL_ARGUMENT
    assert needle in err.message
    assert table.cluster_info().live_brokers == [], "a refused request changes nothing"


def test_system_topics_may_carry_inherit_perm(table: RouteTable) -> None:
    table.register(
        reg(topics=[topic("TBW102", perm=7), topic("DefaultCluster", 1, 1, perm=7), topic("t")])
    )
    assert table.all_topics() == ["DefaultCluster", "TBW102", "t"]


def test_invalid_lookups(table: RouteTable) -> None:
    assert refused(table.route, "").code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused(table.route, "a/b").code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused(table.all_topics, "bad cluster").code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused(table.unregister, unreg(addr="")).code == grpc.StatusCode.INVALID_ARGUMENT
