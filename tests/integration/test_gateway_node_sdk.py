"""The apache.rocketmq.v2 gateway with the official RocketMQ 5 Node.js SDK as real applications.

The SDK (``rocketmq-client-nodejs`` 1.0.8 from npm, installed by ``make setup`` through
tools/install_node.sh) runs under Debian's ``nodejs`` in its own processes, the applications under
tests/integration/v2_apps/node/. One nameserver, one broker serving the gateway on a free
loopback port (gatewayPort) and a timer wheel for the module; each test has its own topic and
group.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketq import (
    Message,
    Producer,
    ProducerConfig,
    SimpleConsumer,
    SimpleConsumerConfig,
)
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from tests.integration.cluster import free_port
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

APPS = Path(__file__).resolve().parent / "v2_apps" / "node"
APP_TIMEOUT_S = 120
AUTO_RENEW_INVISIBLE_MS = 2_000


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    assert shutil.which("node"), "make setup installs Debian's nodejs"
    assert (APPS / "node_modules" / "rocketmq-client-nodejs").is_dir(), (
        "make setup installs the official Node.js SDK (tools/install_node.sh)"
    )
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


def run_app(app: str, port: int, topic: str, group: str, count: int, *extra: str) -> Any:
    """Run a Node SDK app; its last stdout line is its JSON result."""
    args = [f"127.0.0.1:{port}", topic, group, str(count), *extra]
    run = subprocess.run(
        ["node", str(APPS / app), *args],
        capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=APPS,
    )  # fmt: skip
    assert run.returncode == 0, f"the Node SDK app {app} failed:\n{run.stderr[-4000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


async def test_simple_consumer_acks_changes_invisible_duration_and_gets_redeliveries(
    gw: tuple[Cluster, int],
) -> None:
    c, port = gw
    await make_topic(c, "NodeOrders")
    out = run_app("produce_consume.js", port, "NodeOrders", "node-simple", 4)
    sent = [s["id"] for s in out["sent"]]
    received, changed, alone = out["received"], out["changed"], out["left_alone"]
    assert len(set(sent)) == 4 and all(s["offset"] >= 0 for s in out["sent"])
    assert {r["id"] for r in received} == set(sent)
    assert sorted(r["body"] for r in received if r["attempt"] == 1) == [
        f"node-{i}" for i in range(4)
    ]
    assert all(r["tag"] == "TagA" and r["properties"]["origin"] == "node-sdk" for r in received)
    assert {r["body"]: r["keys"] for r in received} == {f"node-{i}": [f"key-{i}"] for i in range(4)}
    # Its invisible duration changed to 1 s, not acked: back with attempt 2 (then acked).
    assert [r["attempt"] for r in received if r["id"] == changed] == [1, 2], received
    # Received with a 2 s invisible duration and left alone: back by itself with attempt 2.
    assert [(r["attempt"], r["invisible_ms"]) for r in received if r["id"] == alone][:1] == [
        (1, 2_000)
    ], received
    assert [r["attempt"] for r in received if r["id"] == alone] == [1, 2], received
    assert all(r["attempt"] == 1 for r in received if r["id"] not in (changed, alone)), received


async def test_fifo_message_groups_are_received_in_order(gw: tuple[Cluster, int]) -> None:
    c, port = gw
    await make_topic(c, "NodeFifo")
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.SubscriptionGroupConfig(
                    group_name="node-fifo", consume_message_orderly=True
                ),
            )
        )
    out = run_app("fifo.js", port, "NodeFifo", "node-fifo", 8)
    received = out["received"]
    assert sorted(r["id"] for r in received) == sorted(out["sent"])  # each once
    for group in ("order-a", "order-b"):
        bodies = [r["body"] for r in received if r["group"] == group]
        assert bodies == sorted(bodies, key=lambda b: int(b.rsplit("-", 1)[1])), received
        assert len(bodies) == 4
    assert all(r["attempt"] == 1 for r in received)


async def test_delayed_message_is_held_until_its_delivery_time(gw: tuple[Cluster, int]) -> None:
    c, port = gw
    await make_topic(c, "NodeLater")
    out = run_app("delayed.js", port, "NodeLater", "node-later", 2_500)
    first, second = out["received"]
    assert (first["id"], second["id"]) == (out["now"], out["later"])  # the ordinary one first
    # Held by the timer wheel: never handed out before its delivery time (ms, as Node sends).
    assert second["received_ms"] >= out["deliver_ms"]
    assert second["delivery_ms"] == out["deliver_ms"]


async def test_transactions_commit_roll_back_and_are_checked_back(gw: tuple[Cluster, int]) -> None:
    c, port = gw
    await make_topic(c, "NodeTx")
    out = run_app("transactions.js", port, "NodeTx", "node-tx", 6)
    committed, rolled_back, open_ = out["committed"], out["rolled_back"], out["open"]
    assert (len(committed), len(rolled_back), len(open_)) == (2, 2, 2)
    assert sorted(set(out["asked"])) == sorted(open_)  # only open ones are checked back
    # Committed by the client or by its checker's answer; rolled back ones never delivered.
    assert sorted(out["received"]) == sorted(committed + open_)


async def test_push_consumer_failure_is_redelivered_with_attempt_2(
    gw: tuple[Cluster, int],
) -> None:
    c, port = gw
    await make_topic(c, "NodePush")
    out = run_app("push.js", port, "NodePush", "node-push", 3)
    sent, seen, failed = out["sent"], out["seen"], out["failed"]
    assert {s["id"] for s in seen} == set(sent)
    assert [s["attempt"] for s in seen if s["id"] == failed] == [1, 2], seen
    assert sorted(s["attempt"] for s in seen if s["id"] != failed) == [1, 1], seen


async def test_messages_cross_between_rocketq_sdk_and_node_sdk(gw: tuple[Cluster, int]) -> None:
    c, port = gw
    await make_topic(c, "NodeMixed")
    # RocketQ's SDK sends on the native API; the Node SDK receives through the gateway.
    async with Producer(ProducerConfig("node-mixed-producers", c.namesrv_addrs)) as producer:
        ours = [
            await producer.send(
                Message("NodeMixed", f"rq-{i}".encode(), tags="FromRocketQ", keys=[f"k{i}"],
                        properties={"origin": "rocketq"})
            )
            for i in range(2)
        ]  # fmt: skip
    out = run_app("interop.js", port, "NodeMixed", "node-mixed", 2, "receive")
    got = sorted(out["received"], key=lambda r: r["body"])
    assert [r["body"] for r in got] == ["rq-0", "rq-1"]
    assert [r["id"] for r in got] == [r.msg_id for r in ours]
    assert [(r["tag"], r["keys"]) for r in got] == [
        ("FromRocketQ", ["k0"]),
        ("FromRocketQ", ["k1"]),
    ]
    assert all(r["properties"]["origin"] == "rocketq" for r in got)
    # The Node SDK sends through the gateway; RocketQ's SimpleConsumer receives natively.
    sent = run_app("interop.js", port, "NodeMixed", "-", 2, "send")["sent"]
    cfg = SimpleConsumerConfig("node-mixed-rq", tuple(c.namesrv_addrs), await_duration_ms=1_000)
    async with SimpleConsumer(cfg) as sc:
        sc.subscribe("NodeMixed", "FromNode")
        received = []

        async def both() -> bool:
            received.extend(await sc.receive(4, 30_000))
            return len(received) >= 2

        await until(both, "the Node SDK's messages in RocketQ's SimpleConsumer")
        for m in received:
            await sc.ack(m)
    assert sorted(m.message.msg_id for m in received) == sorted(sent)
    assert sorted(m.message.body for m in received) == [b"node-0", b"node-1"]
    assert all(m.message.properties["origin"] == "node-sdk" for m in received)
    assert sorted(m.message.keys for m in received) == [["nk0"], ["nk1"]]


async def test_change_invisible_duration_below_a_second_is_raised_negative_refused(
    gw: tuple[Cluster, int],
) -> None:
    """Raw v2 calls, as the Node PushConsumer makes them after a failure: it reads the backoff
    policy's seconds as milliseconds (1 ms for a 1 s backoff) and retries a refused change
    forever, so the gateway raises it to the 1 s minimum; a negative one is still refused."""
    import grpc
    from google.protobuf import duration_pb2

    from services.broker.gateway._v2api import definition_pb2 as v2
    from services.broker.gateway._v2api import service_pb2 as svc
    from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc

    c, port = gw
    await make_topic(c, "NodeBackoff")
    async with Producer(ProducerConfig("node-backoff-producers", c.namesrv_addrs)) as producer:
        await producer.send(Message("NodeBackoff", b"retry me"))
    group, topic = v2.Resource(name="node-backoff"), v2.Resource(name="NodeBackoff")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = svc_grpc.MessagingServiceStub(channel)

        async def receive() -> list[Any]:
            req = svc.ReceiveMessageRequest(
                group=group,
                message_queue=v2.MessageQueue(topic=topic, id=-1),
                batch_size=1,
                invisible_duration=duration_pb2.Duration(seconds=30),
                long_polling_timeout=duration_pb2.Duration(seconds=5),
            )
            frames = [r async for r in stub.ReceiveMessage(req, timeout=30)]
            return [f.message for f in frames if f.HasField("message")]

        [message] = await receive()

        async def change(ms: int) -> Any:
            return await stub.ChangeInvisibleDuration(
                svc.ChangeInvisibleDurationRequest(
                    group=group,
                    topic=topic,
                    receipt_handle=message.system_properties.receipt_handle,
                    message_id=message.system_properties.message_id,
                    invisible_duration=duration_pb2.Duration(nanos=ms * 1_000_000),
                )
            )

        refused = await change(-1)
        assert refused.status.code == v2.ILLEGAL_INVISIBLE_TIME, refused
        changed = await change(1)
        assert changed.status.code == v2.OK, changed
        assert changed.receipt_handle

        async def again() -> Any:
            return await receive() or None

        [back] = await until(again, "the message back after its raised invisible time", 10)
        assert back.system_properties.message_id == message.system_properties.message_id
        assert back.system_properties.delivery_attempt == 2


async def test_a_producer_of_several_topics_starts(gw: tuple[Cluster, int]) -> None:
    """Its first settings reply can come before the Node SDK waits for it (lost): the gateway
    writes it again a second later, so startup() returns instead of waiting forever."""
    c, port = gw
    topics = [f"NodeMany{i}" for i in range(6)]
    for topic in topics:
        await make_topic(c, topic)
    out = run_app("multi_topic.js", port, topics[0], "-", 1, *topics[1:])
    assert sorted(out["sent"]) == sorted(topics)
    async with RawClient(c.broker.addr) as raw:
        for topic in topics:
            ends = [
                await raw.messaging.GetMaxOffset(
                    messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=q)
                )
                for q in range(2)
            ]
            assert sum(e.offset for e in ends) == 1, topic  # each topic got its message
