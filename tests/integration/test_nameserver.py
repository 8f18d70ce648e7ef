"""The nameserver as a process: raw gRPC registration and lookups, errors, expiry, the broker's
registration client against two nameservers, health and SIGTERM.

Two nameservers (expiry scan every 200 ms) are shared by the module; each test uses its own
broker and topic names so tests do not see each other's state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rocketq._api.rocketq.v1 import common_pb2, nameserver_pb2, nameserver_pb2_grpc
from rocketq.client.errors import TopicNotFoundError, from_rpc_error
from services.broker.registration import BrokerRegistrar
from tests.integration.cluster import ServiceProcess, start_nameserver
from tests.support.until import until, until_sync

pytestmark = pytest.mark.integration

SCAN_INTERVAL_MS = 200


@pytest.fixture(scope="module")
def nameservers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServiceProcess]]:
    tmp = tmp_path_factory.mktemp("ns")
    started: list[ServiceProcess] = []
    try:
        for i in range(2):
            started.append(
                start_nameserver(
                    tmp, "--scan-interval-ms", str(SCAN_INTERVAL_MS), name=f"namesrv{i}"
                )
            )
        yield started
    finally:
        for ns in started:
            ns.kill()


def stub(addr: str) -> nameserver_pb2_grpc.NameServerStub:
    return nameserver_pb2_grpc.NameServerStub(grpc.insecure_channel(addr))


def topic(name: str, queues: int = 4) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(
        topic_name=name, read_queue_nums=queues, write_queue_nums=queues, perm=6
    )


def register_request(
    name: str, addr: str, topics: list[str], broker_id: int = 0, **fields: object
) -> nameserver_pb2.RegisterBrokerRequest:
    return nameserver_pb2.RegisterBrokerRequest(
        cluster_name="ItCluster",
        broker_name=name,
        broker_id=broker_id,
        broker_addr=addr,
        topic_configs=[topic(t) for t in topics],
        **fields,  # type: ignore[arg-type]
    )


def route_or_none(addr: str, name: str) -> nameserver_pb2.TopicRouteData | None:
    try:
        resp: nameserver_pb2.GetRouteInfoByTopicResponse = stub(addr).GetRouteInfoByTopic(
            nameserver_pb2.GetRouteInfoByTopicRequest(topic=name), timeout=5
        )
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    return resp.route


def test_register_and_lookup(nameservers: list[ServiceProcess]) -> None:
    ns = stub(nameservers[0].addr)
    ns.RegisterBroker(register_request("lk-b", "127.0.0.1:20002", ["LkOrders"]), timeout=5)
    ns.RegisterBroker(register_request("lk-a", "127.0.0.1:20001", ["LkOrders", "LkA"]), timeout=5)
    slave = ns.RegisterBroker(register_request("lk-a", "127.0.0.1:20003", [], 1), timeout=5)
    assert slave.master_addr == "127.0.0.1:20001"

    route = route_or_none(nameservers[0].addr, "LkOrders")
    assert route is not None
    assert [q.broker_name for q in route.queues] == ["lk-a", "lk-b"]
    assert [dict(b.broker_addrs) for b in route.brokers] == [
        {0: "127.0.0.1:20001", 1: "127.0.0.1:20003"},
        {0: "127.0.0.1:20002"},
    ]
    topics = ns.GetAllTopics(nameserver_pb2.GetAllTopicsRequest(cluster_name="ItCluster")).topics
    assert {"LkA", "LkOrders"} <= set(topics)
    info = ns.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest())
    assert {"lk-a", "lk-b"} <= set(info.cluster_addr_table["ItCluster"].broker_names)
    assert info.broker_addr_table["lk-a"].cluster == "ItCluster"
    # The other nameserver knows nothing of it: nameservers never talk to each other.
    assert route_or_none(nameservers[1].addr, "LkOrders") is None

    # Failover: the master at :20001 now has epoch 1; a master claim with epoch 0 is stale.
    ns.RegisterBroker(register_request("lk-a", "127.0.0.1:20001", [], epoch=1), timeout=5)
    with pytest.raises(grpc.RpcError) as info_err:
        ns.RegisterBroker(register_request("lk-a", "127.0.0.1:20009", [], epoch=0), timeout=5)
    assert info_err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "epoch" in (info_err.value.details() or "")


def test_unknown_topic_is_not_found_with_reason(nameservers: list[ServiceProcess]) -> None:
    addr = nameservers[0].addr
    with pytest.raises(grpc.RpcError) as info:
        stub(addr).GetRouteInfoByTopic(
            nameserver_pb2.GetRouteInfoByTopicRequest(topic="NoSuchTopic"), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    err = from_rpc_error(info.value, addr)
    assert isinstance(err, TopicNotFoundError)
    assert err.reason == "TOPIC_NOT_EXIST"
    assert err.metadata == {"topic": "NoSuchTopic"}
    assert "NoSuchTopic" in err.message


def test_malformed_requests_are_refused_and_server_keeps_serving(
    nameservers: list[ServiceProcess],
) -> None:
    addr = nameservers[0].addr
    ns = stub(addr)
    bad_calls: list[Callable[[], object]] = [
        lambda: ns.GetRouteInfoByTopic(nameserver_pb2.GetRouteInfoByTopicRequest(topic="")),
        lambda: ns.GetRouteInfoByTopic(nameserver_pb2.GetRouteInfoByTopicRequest(topic="a b")),
        lambda: ns.RegisterBroker(register_request("", "127.0.0.1:1", [])),
        lambda: ns.RegisterBroker(register_request("mal", "", [])),
        lambda: ns.RegisterBroker(register_request("mal", "127.0.0.1:1", [], broker_id=-1)),
        lambda: ns.RegisterBroker(register_request("mal", "127.0.0.1:1", ["bad/topic"])),
        lambda: ns.UnregisterBroker(nameserver_pb2.UnregisterBrokerRequest()),
        lambda: ns.GetAllTopics(nameserver_pb2.GetAllTopicsRequest(cluster_name="no such")),
    ]
    for call in bad_calls:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert from_rpc_error(info.value).reason == "ILLEGAL_ARGUMENT"
    # Bytes that are not a protobuf message at all.
    raw = grpc.insecure_channel(addr).unary_unary(
        "/rocketq.v1.NameServer/RegisterBroker",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as garbage:
        raw(b"\xff\xff\xff\xff", timeout=5)
    assert garbage.value.code() != grpc.StatusCode.OK
    # Nothing above changed state or hurt the server.
    assert route_or_none(addr, "bad") is None
    assert "mal" not in ns.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest()).broker_addr_table
    ns.RegisterBroker(register_request("mal-ok", "127.0.0.1:20100", ["MalOk"]), timeout=5)
    assert route_or_none(addr, "MalOk") is not None
    assert nameservers[0].alive()


async def test_registrar_with_two_nameservers(nameservers: list[ServiceProcess]) -> None:
    addrs = [ns.addr for ns in nameservers]
    topics = ["RegT1"]

    def build() -> nameserver_pb2.RegisterBrokerRequest:
        return register_request("reg-a", "127.0.0.1:20200", list(topics), ha_server_addr="h:1")

    def build_slave() -> nameserver_pb2.RegisterBrokerRequest:
        return register_request("reg-a", "127.0.0.1:20201", [], broker_id=1)

    def unregister(addr: str, broker_id: int) -> nameserver_pb2.UnregisterBrokerRequest:
        return nameserver_pb2.UnregisterBrokerRequest(
            cluster_name="ItCluster", broker_name="reg-a", broker_id=broker_id, broker_addr=addr
        )

    # A dead nameserver in the list must not stop registration with the live ones.
    dead = "127.0.0.1:1"
    master = BrokerRegistrar([*addrs, dead], build, period_ms=60_000, timeout_ms=1000)
    slave = BrokerRegistrar(addrs, build_slave, period_ms=60_000, timeout_ms=1000)
    try:
        await master.start()
        for addr in addrs:
            route = route_or_none(addr, "RegT1")
            assert route is not None and dict(route.brokers[0].broker_addrs) == {
                0: "127.0.0.1:20200"
            }
        await slave.start()
        assert (slave.last_master_addr, slave.last_ha_server_addr) == ("127.0.0.1:20200", "h:1")
        assert master.last_master_addr == ""
        # A topic change reaches both nameservers on trigger(), long before the 60 s period.
        topics.append("RegT2")
        master.trigger()
        master.trigger()  # coalesced with the first
        await until(
            lambda: all(route_or_none(a, "RegT2") is not None for a in addrs),
            "RegT2 on both nameservers",
        )
        assert master.rounds <= 3
    finally:
        await master.stop(unregister("127.0.0.1:20200", 0))
        await slave.stop(unregister("127.0.0.1:20201", 1))
    for addr in addrs:
        assert route_or_none(addr, "RegT1") is None, "unregistered at once on stop"
    master.trigger()  # harmless after stop
    await master.stop(None)  # idempotent


def test_expiry(nameservers: list[ServiceProcess]) -> None:
    addr = nameservers[1].addr
    started_s = time.monotonic()
    stub(addr).RegisterBroker(
        register_request("exp-a", "127.0.0.1:20300", ["ExpT"], heartbeat_timeout_ms=1000),
        timeout=5,
    )
    assert route_or_none(addr, "ExpT") is not None
    until_sync(lambda: route_or_none(addr, "ExpT") is None, "ExpT expired", timeout_s=10)
    elapsed_s = time.monotonic() - started_s
    assert elapsed_s >= 1.0, f"expired after {elapsed_s:.2f}s, before its 1 s timeout"
    info = stub(addr).GetClusterInfo(nameserver_pb2.GetClusterInfoRequest())
    assert "exp-a" not in info.broker_addr_table
    until_sync(
        lambda: "reason=expired" in nameservers[1].log_tail(200), "expiry logged", timeout_s=5
    )


def test_health_and_sigterm(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path, name="ns-sigterm")
    try:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(ns.addr))
        for service in ("", "rocketq.v1.NameServer"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        assert ns.stop(timeout_s=15) == 0
        assert "nameserver stopped" in ns.log_tail()
    finally:
        ns.kill()
