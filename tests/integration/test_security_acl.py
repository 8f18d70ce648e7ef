"""Access control against real processes (issue 20, DESIGN.md §11): requests signed in the
RocketMQ 5 ``authorization`` format, per-topic and per-group permissions, default deny, the
services' own calls under an internal user, ``rocketq acl`` changes taking effect live.

One cluster for the module: a nameserver, a master, its slave and a timer wheel with
``aclEnable``, sharing one ACL file whose internal user's secret comes from a file (the
services read it; clients never see it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from rocketq._api.rocketq.v1 import (
    messaging_pb2,
    messaging_pb2_grpc,
    nameserver_pb2,
    nameserver_pb2_grpc,
    replication_pb2,
    replication_pb2_grpc,
)
from rocketq.client.admin import Admin
from rocketq.client.consumer import (
    ConsumeFromWhere,
    LitePullConsumer,
    LitePullConsumerConfig,
    SimpleConsumer,
    SimpleConsumerConfig,
)
from rocketq.client.errors import PermissionDeniedError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.client.security import ClientSecurity, Signer
from rocketq.message import Message
from services.cli.main import cli
from services.common.launch import set_flags
from tests.integration.cluster import (
    ServiceProcess,
    start_broker,
    start_nameserver,
    start_slave,
    start_timer_wheel,
)
from tests.support.cluster import stop_all
from tests.support.until import until

pytestmark = pytest.mark.integration

OPS = ClientSecurity(access_key="ops", secret_key="ops-secret")
APP = ClientSecurity(access_key="app1", secret_key="app1-secret")


class Env:
    def __init__(
        self, acl_file: Path, ns: ServiceProcess, broker: ServiceProcess, slave: ServiceProcess
    ) -> None:
        self.acl_file, self.ns, self.broker, self.slave = acl_file, ns, broker, slave

    @property
    def namesrv(self) -> list[str]:
        return [self.ns.addr]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("acl")
    (root / "internal.secret").write_text("internal-secret\n")
    acl_file = root / "acl.json"
    acl_file.write_text(
        json.dumps(
            {
                "users": {
                    "rq-internal": {
                        "role": "internal",
                        "secretKeyFile": str(root / "internal.secret"),
                    },
                    "ops": {"role": "admin", "secretKey": "ops-secret"},
                    "app1": {
                        "secretKey": "app1-secret",
                        "topics": {"orders": "PUB|SUB"},
                        "groups": {"billing": "SUB"},
                    },
                }
            }
        )
    )
    keys = {"aclEnable": True, "aclFile": acl_file}
    ns = start_nameserver(root, *set_flags(keys))
    procs = [ns]
    try:
        # the brokers register with the nameserver as the internal user (routes prove it) and
        # the slave replicates from its master as that user
        procs.append(start_broker(root, [ns.addr], "broker-a", None, **keys))
        procs.append(start_slave(root, [ns.addr], "broker-a", 1, None, **keys))
        # the timer wheel pulls its system topic and re-puts due messages as that user too
        procs.append(
            start_timer_wheel(root, [ns.addr], "timer-0", None, timerPrecisionMs=100, **keys)
        )
        yield Env(acl_file, ns, procs[1], procs[2])
    finally:
        stop_all(list(reversed(procs)))


async def _route_ready(env: Env, topic: str) -> None:
    async with Admin(env.namesrv, security=OPS) as admin:
        await admin.create_topic(topic)

        async def routed() -> bool:
            try:
                return bool((await admin.route(topic)).queues)
            except Exception:
                return False

        await until(routed, f"a route for {topic}", 15)


async def test_signed_clients_round_trip_within_their_permissions(env: Env) -> None:
    await _route_ready(env, "orders")
    async with Producer(ProducerConfig("pg-orders", env.namesrv, security=APP)) as producer:
        sent = [await producer.send(Message("orders", f"o{i}".encode())) for i in range(4)]
        sent.append(await producer.send(Message("orders", b"o4", delay_ms=300)))
    assert all(r.msg_id for r in sent)
    cfg = LitePullConsumerConfig(
        "billing",
        tuple(env.namesrv),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        security=APP,
    )
    consumer = LitePullConsumer(cfg)
    consumer.subscribe("orders", "*")
    await consumer.start()
    got: list[str] = []
    try:

        async def all_polled() -> bool:
            got.extend(m.body.decode() for m in await consumer.poll(200))
            return len(got) >= 5

        await until(all_polled, "the five orders (one through the timer wheel) consumed", 20)
    finally:
        await consumer.close()
    assert sorted(got) == [f"o{i}" for i in range(5)]

    def max_offsets(addr: str) -> list[int]:
        with grpc.insecure_channel(addr) as ch:
            stub = messaging_pb2_grpc.MessagingStub(ch)
            return [
                stub.GetMaxOffset(
                    messaging_pb2.GetMaxOffsetRequest(topic="orders", queue_id=q),
                    metadata=Signer("app1", "app1-secret").metadata(),
                ).offset
                for q in range(4)
            ]

    master = max_offsets(env.broker.addr)
    await until(lambda: max_offsets(env.slave.addr) == master, "the slave caught up", 15)


async def test_pop_consumption_needs_the_groups_and_the_topics_sub(env: Env) -> None:
    await _route_ready(env, "orders")
    async with Producer(ProducerConfig("pg-orders", env.namesrv, security=APP)) as producer:
        await producer.send(Message("orders", b"popped"))
    granted = SimpleConsumerConfig("billing", tuple(env.namesrv), 2_000, security=APP)
    async with SimpleConsumer(granted) as consumer:
        consumer.subscribe("orders")
        got = []

        async def received() -> bool:
            got.extend(await consumer.receive(16, 30_000))
            return any(p.message.body == b"popped" for p in got)

        await until(received, "the message popped by a granted group", 20)
        for popped in got:
            await consumer.ack(popped)
    refused = SimpleConsumerConfig("audit", tuple(env.namesrv), 0, security=APP)
    async with SimpleConsumer(refused) as consumer:
        consumer.subscribe("orders")
        with pytest.raises(PermissionDeniedError, match="no SUB permission on group 'audit'"):
            await consumer.receive(1, 30_000)


def test_replication_needs_the_internal_role(env: Env) -> None:
    with grpc.insecure_channel(env.broker.addr) as ch:
        stub = replication_pb2_grpc.ReplicationStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            stub.SyncConfig(
                replication_pb2.SyncConfigRequest(), metadata=Signer("ops", "ops-secret").metadata()
            )
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "needs the internal role" in (caught.value.details() or "")


def _raw_call(addr: str, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    with grpc.insecure_channel(addr) as ch:
        stub = nameserver_pb2_grpc.NameServerStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), metadata=metadata)
    return caught.value


def test_missing_and_bad_signatures_are_unauthenticated(env: Env) -> None:
    err = _raw_call(env.ns.addr, ())
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no authorization header" in (err.details() or "")

    forged = Signer("app1", "not-the-secret").metadata()
    err = _raw_call(env.ns.addr, forged)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "signature of access key 'app1' does not match" in (err.details() or "")

    stranger = Signer("nobody", "x").metadata()
    err = _raw_call(env.ns.addr, stranger)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown access key 'nobody'" in (err.details() or "")

    # Apache's Node SDK writes the signature in upper-case hex: accepted
    date, auth = Signer("app1", "app1-secret").metadata()
    upper = (date, (auth[0], auth[1].rsplit("=", 1)[0] + "=" + auth[1].rsplit("=", 1)[1].upper()))
    with grpc.insecure_channel(env.ns.addr) as ch:
        info = nameserver_pb2_grpc.NameServerStub(ch).GetClusterInfo(
            nameserver_pb2.GetClusterInfoRequest(), metadata=upper
        )
    assert "broker-a" in info.broker_addr_table


async def test_missing_permissions_are_denied_naming_the_resource(env: Env) -> None:
    await _route_ready(env, "payments")
    async with Producer(ProducerConfig("pg-pay", env.namesrv, security=APP)) as producer:
        with pytest.raises(PermissionDeniedError, match="no PUB permission on topic 'payments'"):
            await producer.send(Message("payments", b"p"))
        # a batch travels encoded (SendRequest.records): its topic is checked all the same
        with pytest.raises(PermissionDeniedError, match="no PUB permission on topic 'payments'"):
            await producer.send_batch([Message("payments", b"b%d" % i) for i in range(3)])
    async with Admin(env.namesrv, security=APP) as admin:
        with pytest.raises(PermissionDeniedError, match="needs the admin role"):
            await admin.create_topic("app1-made-this")
    # a consumer group app1 was not granted, on a topic it may read
    with grpc.insecure_channel(env.broker.addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            stub.QueryConsumerOffset(
                messaging_pb2.QueryConsumerOffsetRequest(
                    consumer_group="audit", topic="orders", queue_id=0
                ),
                metadata=Signer("app1", "app1-secret").metadata(),
            )
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "no SUB permission on group 'audit'" in (caught.value.details() or "")
    # every refusal is in the audit log, with who and what
    await until(
        lambda: (
            '"refused"' in env.broker.log_path.read_text()
            and "payments" in env.broker.log_path.read_text()
        ),
        "the refusals in the broker's audit log",
        5,
    )


async def test_acl_grant_takes_effect_without_a_restart(env: Env) -> None:
    await _route_ready(env, "refunds")
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "acl",
            "--acl-file",
            str(env.acl_file),
            "grant",
            "app1",
            "--topic",
            "refunds",
            "--perm",
            "PUB",
        ],
    )
    assert result.exit_code == 0, result.output
    listed = runner.invoke(cli, ["acl", "--acl-file", str(env.acl_file), "list"])
    assert "topic refunds=PUB" in listed.output
    assert "app1-secret" not in listed.output  # secrets are never printed
    async with Producer(ProducerConfig("pg-refunds", env.namesrv, security=APP)) as producer:

        async def sent() -> bool:
            try:
                await producer.send(Message("refunds", b"r"))
            except PermissionDeniedError:
                return False  # the broker has not re-read the file yet (within a second)
            return True

        await until(sent, "a send to refunds once the grant is read", 10)
