"""The apache.rocketmq.v2 gateway with the official RocketMQ 5 Python SDK as real applications.

The SDK (``rocketmq-python-client`` 5.1.2, installed by ``make setup`` into ``.venv-rmq5``) runs
in its own processes, the applications under tests/integration/v2_apps/. One nameserver and one
broker serving the gateway on a free loopback port (gatewayPort) for the module; each test has its
own topic and group; a timer wheel delivers the delayed messages.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq import (
    Message,
    Producer,
    ProducerConfig,
    SimpleConsumer,
    SimpleConsumerConfig,
)
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2, nameserver_pb2
from tests.integration.cluster import free_port
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APPS = Path(__file__).resolve().parent / "v2_apps"
APP_TIMEOUT_S = 120
AUTO_RENEW_INVISIBLE_MS = 2_000


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    port = free_port()
    # Transactions left open are checked after 1 s, every second (defaults: 6 s, 60 s).
    # Push consumers' messages are hidden 2 s at a time (60 s by default) and renewed.
    keys = {
        "gatewayPort": port,
        "transactionTimeout": 1000,
        "transactionCheckInterval": 1000,
        "gatewayAutoRenewInvisibleMs": AUTO_RENEW_INVISIBLE_MS,
    }
    with cluster(tmp_path_factory.mktemp("gateway"), broker_keys=keys, timer_wheel=True) as c:
        yield c, port
        c.check_logs()


async def make_topic(c: Cluster, topic: str) -> None:
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=2, write_queue_nums=2, perm=6
                ),
            )
        )


def run_app(
    app: str,
    port: int,
    topic: str,
    group: str,
    count: int,
    cwd: Path,
    *mode: str,
    extra: tuple[str, ...] = (),
) -> Any:
    """Run an official-SDK app (``mode`` before and ``extra`` after its usual arguments)."""
    args = [*mode, f"127.0.0.1:{port}", topic, group, str(count), *extra]
    run = subprocess.run(
        [str(SDK_PYTHON), str(APPS / app), *args],
        capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=cwd,
    )  # fmt: skip
    assert run.returncode == 0, f"the SDK app {app} failed:\n{run.stderr[-4000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


async def test_simple_consumer_receives_acks_and_gets_an_unacked_message_again(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Orders")
    out = run_app("simple_roundtrip.py", port, "V2Orders", "v2-simple", 3, tmp_path)
    sent, received = out["sent"], out["received"]
    assert len(sent) == 3
    assert {r["id"] for r in received} == set(sent)
    assert all(r["tag"] == "TagA" for r in received)
    first = received[0]["id"]
    assert [r["attempt"] for r in received if r["id"] == first] == [1, 2], received
    assert [r["attempt"] for r in received if r["id"] != first] == [1, 1], received


async def test_push_consumer_failure_is_redelivered_with_attempt_2(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Push")
    out = run_app("push_retry.py", port, "V2Push", "v2-push", 3, tmp_path)
    sent, seen = out["sent"], out["seen"]
    assert {s["id"] for s in seen} == set(sent)
    failed = seen[0]["id"]
    assert [s["attempt"] for s in seen if s["id"] == failed] == [1, 2], seen
    assert sorted(s["attempt"] for s in seen if s["id"] != failed) == [1, 1], seen


async def test_delayed_message_is_delivered_at_its_time(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Later")
    out = run_app("delayed.py", port, "V2Later", "v2-later", 2, tmp_path)
    assert out["got"] is not None, "the delayed message never arrived"
    assert out["got"]["id"] == out["sent"]
    # Held by the timer wheel: never handed out before its delivery time.
    assert out["got"]["received_ms"] >= out["deliver_ms"]


async def test_bad_requests_get_the_protocol_status_codes(gw: tuple[Cluster, int]) -> None:
    """Raw v2 calls (the gateway's own generated classes, no SDK in this process)."""
    from google.protobuf import duration_pb2

    from services.broker.gateway._v2api import definition_pb2 as v2
    from services.broker.gateway._v2api import service_pb2 as svc
    from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc

    c, port = gw
    await make_topic(c, "V2Bad")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = svc_grpc.MessagingServiceStub(channel)

        async def receive(**fields: Any) -> list[Any]:
            req = svc.ReceiveMessageRequest(
                group=v2.Resource(name="v2-bad"),
                message_queue=v2.MessageQueue(topic=v2.Resource(name="V2Bad"), id=-1),
                batch_size=1,
                **fields,
            )
            return [r async for r in stub.ReceiveMessage(req, timeout=30)]

        def secs(s: int) -> duration_pb2.Duration:
            return duration_pb2.Duration(seconds=s)

        # A receive before any Telemetry settings works with defaults; nothing there yet.
        [only] = await receive(invisible_duration=secs(10), long_polling_timeout=secs(5))
        assert only.status.code == v2.MESSAGE_NOT_FOUND
        [only] = await receive(invisible_duration=secs(10), long_polling_timeout=secs(1))
        assert only.status.code == v2.ILLEGAL_POLLING_TIME
        [only] = await receive(invisible_duration=secs(0), long_polling_timeout=secs(5))
        assert only.status.code == v2.ILLEGAL_INVISIBLE_TIME
        route = await stub.QueryRoute(svc.QueryRouteRequest(topic=v2.Resource(name="NoSuch")))
        assert route.status.code == v2.TOPIC_NOT_FOUND
        ack = await stub.AckMessage(
            svc.AckMessageRequest(
                group=v2.Resource(name="v2-bad"),
                topic=v2.Resource(name="V2Bad"),
                entries=[svc.AckMessageEntry(message_id="x", receipt_handle="forged")],
            )
        )
        assert ack.status.code == v2.INVALID_RECEIPT_HANDLE
        assert ack.entries[0].status.code == v2.INVALID_RECEIPT_HANDLE


async def test_messages_cross_between_rocketq_sdk_and_official_sdk(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Mixed")
    # RocketQ's SDK sends on the native API; the official SDK receives through the gateway.
    async with Producer(ProducerConfig("mixed-producers", c.namesrv_addrs)) as producer:
        ours = [
            await producer.send(
                Message("V2Mixed", f"rq-{i}".encode(), tags="FromRocketQ", keys=[f"k{i}"],
                        properties={"origin": "rocketq"})
            )
            for i in range(2)
        ]  # fmt: skip
    out = run_app("interop.py", port, "V2Mixed", "mixed-v2", 2, tmp_path, "receive")
    got = sorted(out["received"], key=lambda r: r["body"])
    assert [r["body"] for r in got] == ["rq-0", "rq-1"]
    assert [r["id"] for r in got] == [r.msg_id for r in ours]
    assert [(r["tag"], r["keys"]) for r in got] == [
        ("FromRocketQ", ["k0"]),
        ("FromRocketQ", ["k1"]),
    ]
    assert all(r["properties"]["origin"] == "rocketq" for r in got)
    # The official SDK sends through the gateway; RocketQ's SimpleConsumer receives natively.
    sent = run_app("interop.py", port, "V2Mixed", "-", 2, tmp_path, "send")["sent"]
    cfg = SimpleConsumerConfig("mixed-rq", tuple(c.namesrv_addrs), await_duration_ms=1_000)
    async with SimpleConsumer(cfg) as sc:
        sc.subscribe("V2Mixed", "FromV2")
        received = []

        async def both() -> bool:
            received.extend(await sc.receive(4, 30_000))
            return len(received) >= 2

        await until(both, "the official SDK's messages in RocketQ's SimpleConsumer")
        for m in received:
            await sc.ack(m)
    assert sorted(m.message.msg_id for m in received) == sorted(sent)
    assert sorted(m.message.body for m in received) == [b"v2-0", b"v2-1"]
    assert all(m.message.properties["origin"] == "official-sdk" for m in received)


async def test_a_namespace_isolates_its_resources_by_prefix(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "tenant1%V2Ns")  # what namespace tenant1's topic V2Ns is on RocketQ
    out = run_app("simple_roundtrip.py", port, "V2Ns", "v2-ns", 2, tmp_path, extra=("tenant1",))
    assert {r["id"] for r in out["received"]} == set(out["sent"])
    async with RawClient(c.broker.addr) as raw:
        stored = [
            await raw.messaging.GetMaxOffset(
                messaging_pb2.GetMaxOffsetRequest(topic="tenant1%V2Ns", queue_id=q)
            )
            for q in range(2)
        ]
        assert sum(o.offset for o in stored) == 2
        code, _, _ = await refused(
            raw.messaging.GetMaxOffset(messaging_pb2.GetMaxOffsetRequest(topic="V2Ns"))
        )
        assert code == grpc.StatusCode.NOT_FOUND  # nothing outside the namespace


async def test_any_gateway_routes_every_broker_group(tmp_path: Path) -> None:
    """Two broker groups, each with its gateway: the SDK starts at broker-b's gateway only, and
    sends to and receives from both groups through the route."""
    topic = "V2Spread"
    with cluster(tmp_path, gateway=True) as c:  # a free gateway port per broker
        c.start_broker("broker-b")
        assert c.gateway_ports is not None
        ports = dict(c.gateway_ports)
        for b, name in zip(c.brokers, ports, strict=True):
            async with RawClient(b.addr) as raw:
                await raw.admin.CreateTopic(
                    admin_pb2.CreateTopicRequest(
                        target=admin_pb2.ApplyTarget(broker_name=name),
                        config=common_pb2.TopicConfig(
                            topic_name=topic, read_queue_nums=2, write_queue_nums=2, perm=6
                        ),
                    )
                )

        async def both_routed() -> bool:
            async with RawClient(c.nameserver.addr) as raw:
                try:
                    resp = await raw.nameserver.GetRouteInfoByTopic(
                        nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic)
                    )
                except grpc.RpcError:
                    return False
            gateways = {b.broker_name: b.gateway_addrs.get(0) for b in resp.route.brokers}
            return gateways == {n: f"127.0.0.1:{p}" for n, p in ports.items()}

        await until(both_routed, "both groups and their gateways in the route")
        out = run_app("simple_roundtrip.py", ports["broker-b"], topic, "v2-spread", 4, tmp_path)
        assert {r["id"] for r in out["received"]} == set(out["sent"])
        for b in c.brokers:
            async with RawClient(b.addr) as raw:
                stored = [
                    await raw.messaging.GetMaxOffset(
                        messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=q)
                    )
                    for q in range(2)
                ]
            assert sum(o.offset for o in stored) > 0, f"nothing was sent to {b.name}"
        c.check_logs()


async def test_transactions_commit_and_roll_back(gw: tuple[Cluster, int], tmp_path: Path) -> None:
    c, port = gw
    await make_topic(c, "V2Tx")
    out = run_app("transactions.py", port, "V2Tx", "v2-tx", 4, tmp_path)
    assert len(out["committed"]) == 2 and len(out["rolled_back"]) == 2
    assert sorted(out["received"]) == sorted(out["committed"])  # rolled back: never delivered


async def test_open_transactions_are_checked_back_through_telemetry(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Orphans")
    out = run_app("orphans.py", port, "V2Orphans", "v2-orphans", 2, tmp_path)
    assert out["asked"] == sorted(out["sent"])  # the checker heard about each one
    assert sorted(out["received"]) == sorted(out["sent"])  # and its COMMIT answer was applied


async def test_forward_to_dead_letter_queue_moves_and_acks(gw: tuple[Cluster, int]) -> None:
    """Raw v2 calls, as a FIFO push consumer makes them when its local retries are used up."""
    from google.protobuf import duration_pb2

    from services.broker.gateway._v2api import definition_pb2 as v2
    from services.broker.gateway._v2api import service_pb2 as svc
    from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc

    c, port = gw
    await make_topic(c, "V2Forward")
    async with RawClient(c.broker.addr) as raw:
        sent = await raw.messaging.Send(
            messaging_pb2.SendRequest(
                queue_id=0, messages=[common_pb2.Message(topic="V2Forward", body=b"give up")]
            )
        )
    msg_id = sent.results[0].msg_id
    group, topic = v2.Resource(name="v2-forward"), v2.Resource(name="V2Forward")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        req = svc.ReceiveMessageRequest(
            group=group,
            message_queue=v2.MessageQueue(topic=topic, id=-1),
            batch_size=1,
            invisible_duration=duration_pb2.Duration(seconds=30),
            long_polling_timeout=duration_pb2.Duration(seconds=5),
        )
        frames = [r async for r in stub.ReceiveMessage(req, timeout=30)]
        [message] = [f.message for f in frames if f.HasField("message")]
        handle = message.system_properties.receipt_handle
        forward = svc.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=handle, message_id=msg_id,
            delivery_attempt=3, max_delivery_attempts=3,
        )  # fmt: skip
        assert (await stub.ForwardMessageToDeadLetterQueue(forward)).status.code == v2.OK
        again = await stub.ForwardMessageToDeadLetterQueue(forward)
        assert again.status.code == v2.INVALID_RECEIPT_HANDLE  # acked by the first
    async with RawClient(c.broker.addr) as raw:
        found = await raw.messaging.QueryMessageById(
            messaging_pb2.QueryMessageByIdRequest(topic="%DLQ%v2-forward", msg_id=msg_id)
        )
    assert [(m.message.body, m.reconsume_times) for m in found.messages] == [(b"give up", 3)]


async def test_a_slow_push_listener_keeps_its_message_by_auto_renew(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Slow")
    slow_s = 3 * AUTO_RENEW_INVISIBLE_MS / 1000  # past the invisible time, renewed meanwhile
    out = run_app("push_slow.py", port, "V2Slow", "v2-slow", 2, tmp_path, extra=(str(slow_s),))
    sent, seen = out["sent"], out["seen"]
    assert sorted(s["id"] for s in seen) == sorted(sent), seen  # each delivered exactly once
    assert all(s["attempt"] == 1 for s in seen), seen


async def test_fifo_message_group_is_received_in_order(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Fifo")
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.SubscriptionGroupConfig(
                    group_name="v2-fifo", consume_message_orderly=True
                ),
            )
        )
    out = run_app("fifo.py", port, "V2Fifo", "v2-fifo", 6, tmp_path)
    assert out["received"] == [[f"step-{i}", 1] for i in range(6)]
