"""Topic message types and server-built settings on the apache.rocketmq.v2 gateway.

A topic of one message type (``rocketq topic create --message-type FIFO``) is announced in the
route with that type only; the official Python SDK (its own process, tests/integration/v2_apps/)
then refuses to send another type itself, and a raw v2 SendMessage of another type is refused by
the gateway with MESSAGE_PROPERTY_CONFLICT_WITH_TYPE. An untyped or MIXED topic takes every type,
and RocketQ's own protocol is not checked. The Telemetry settings follow the broker's keys and
the consumer group's retry policy. One nameserver and one broker for the module.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from services.cli.main import cli
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APPS = Path(__file__).resolve().parent / "v2_apps"
APP_TIMEOUT_S = 120
KEYS = {
    "messageDelayLevel": "1s 3s 9s",
    "gatewayProducerMaxAttempts": 5,
    "gatewayProducerBackoffInitialMs": 50,
    "gatewayReceiveBatchSize": 8,
    "gatewayLongPollingTimeoutMs": 12_000,
}
ALL_FOUR = [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster with four topics made by the CLI: TypedFifo, TypedNormal, Untyped, Mixed."""
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    with cluster(tmp_path_factory.mktemp("msgtypes"), broker_keys=KEYS, gateway=True) as c:
        make_topic(c, "TypedFifo", "FIFO")
        make_topic(c, "TypedNormal", "normal")  # any case
        make_topic(c, "Untyped", None)
        make_topic(c, "Mixed", "MIXED")
        yield c
        c.check_logs()


def cli_ok(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def make_topic(c: Cluster, topic: str, message_type: str | None) -> None:
    typed = ("--message-type", message_type) if message_type else ()
    cli_ok("topic", "create", topic, "-q", "2", *typed, "-b", "broker-a", "-n", c.namesrv_addrs[0])


def v2_message(topic: str, **sp: Any) -> Any:
    return v2.Message(
        topic=v2.Resource(name=topic), body=b"x", system_properties=v2.SystemProperties(**sp)
    )


NORMAL = {"message_id": "01N"}
FIFO = {"message_id": "01F", "message_group": "g1"}
HALF = {"message_id": "01T", "message_type": v2.TRANSACTION}


async def send(stub: Any, topic: str, sp: dict[str, Any]) -> Any:
    return await stub.SendMessage(svc.SendMessageRequest(messages=[v2_message(topic, **sp)]))


async def accepted(stub: Any, topic: str) -> list[int]:
    route = await stub.QueryRoute(svc.QueryRouteRequest(topic=v2.Resource(name=topic)))
    assert route.status.code == v2.OK, route.status
    return sorted(route.message_queues[0].accept_message_types)


def test_the_cli_describes_and_updates_the_message_type(gw: Cluster) -> None:
    assert "message type on broker-a: FIFO" in cli_ok(
        "topic", "describe", "TypedFifo", "-n", gw.namesrv_addrs[0]
    )
    ns = gw.namesrv_addrs[0]
    cli_ok("topic", "update", "TypedNormal", "-q", "3", "-n", ns)  # the type is kept
    assert "message type on broker-a: NORMAL" in cli_ok(
        "topic", "describe", "TypedNormal", "-n", ns
    )
    assert "message type on broker-a: MIXED" in cli_ok("topic", "describe", "Untyped", "-n", ns)
    refused = CliRunner().invoke(cli, ["topic", "update", "Mixed", "--message-type", "LITE"])
    assert refused.exit_code != 0 and "transaction" in refused.output.lower()


async def test_a_typed_topic_refuses_other_types_with_the_protocols_code(gw: Cluster) -> None:
    async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        assert await accepted(stub, "TypedFifo") == [v2.FIFO]
        assert await accepted(stub, "TypedNormal") == [v2.NORMAL]
        assert (await send(stub, "TypedFifo", FIFO)).entries[0].status.code == v2.OK
        assert (await send(stub, "TypedNormal", NORMAL)).entries[0].status.code == v2.OK
        for topic, sp, kind, topic_type in (
            ("TypedFifo", NORMAL, "NORMAL", "FIFO"),
            ("TypedNormal", FIFO, "FIFO", "NORMAL"),
            ("TypedFifo", HALF, "TRANSACTION", "FIFO"),
        ):
            out = await send(stub, topic, sp)
            assert out.status.code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, out
            entry = out.entries[0]
            assert entry.status.code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
            assert f"accepts {topic_type} messages only" in entry.status.message
            assert f"this message is {kind}" in entry.status.message
            assert entry.message_id == sp["message_id"] and not entry.transaction_id
    async with RawClient(gw.broker.addr) as raw:
        desc = await raw.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="TypedFifo"))
        assert sum(q.max_offset for q in desc.queues) == 1  # only the FIFO message was stored
        assert desc.config.message_type == common_pb2.FIFO
        # RocketQ's own protocol stays type-agnostic (as Apache's broker: the proxy checks)
        v1 = await raw.messaging.Send(
            messaging_pb2.SendRequest(
                queue_id=0, messages=[common_pb2.Message(topic="TypedFifo", body=b"v1")]
            )
        )
        assert v1.results[0].msg_id


async def test_a_changed_type_reaches_the_route_of_every_gateway(gw: Cluster) -> None:
    """The type travels with the broker's registration to the nameserver's route."""
    ns = gw.namesrv_addrs[0]
    await asyncio.to_thread(make_topic, gw, "Retyped", None)
    async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        assert await accepted(stub, "Retyped") == ALL_FOUR
        await asyncio.to_thread(
            cli_ok, "topic", "update", "Retyped", "--message-type", "DELAY", "-n", ns
        )

        async def delay_only() -> bool:
            return await accepted(stub, "Retyped") == [v2.DELAY]

        await until(delay_only, "the route announcing DELAY only", timeout_s=10)


async def test_untyped_and_mixed_topics_accept_every_type(gw: Cluster) -> None:
    async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        for topic in ("Untyped", "Mixed"):
            assert await accepted(stub, topic) == ALL_FOUR
            for sp in (NORMAL, FIFO, HALF):
                out = await send(stub, topic, sp)
                assert out.entries[0].status.code == v2.OK, (topic, sp, out)


def test_the_official_sdk_checks_the_routes_types_before_sending(
    gw: Cluster, tmp_path: Path
) -> None:
    run = subprocess.run(
        [str(SDK_PYTHON), str(APPS / "message_types.py"), gw.gateway_addr(gw.broker),
         "TypedFifo", "TypedNormal", "Untyped"],
        capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["TypedFifo"]["fifo"] == "sent" and out["TypedNormal"]["normal"] == "sent"
    assert out["Untyped"] == {"normal": "sent", "fifo": "sent"}
    for refusal in (out["TypedFifo"]["normal"], out["TypedNormal"]["fifo"]):
        assert refusal.startswith("refused: IllegalArgumentException"), refusal
        assert "not match with queue accept message types" in refusal


async def first_settings(stub: Any, settings: Any) -> Any:
    """The gateway's reply to ``settings`` on a Telemetry stream (then the stream is closed)."""
    done = asyncio.Event()

    async def commands() -> AsyncIterator[Any]:
        yield svc.TelemetryCommand(settings=settings)
        await done.wait()

    call = stub.Telemetry(commands())
    try:
        reply = await asyncio.wait_for(call.read(), 10)
        assert reply.status.code == v2.OK, reply
        return reply.settings
    finally:
        done.set()
        call.cancel()


async def test_settings_come_from_the_broker_keys_and_the_groups_retries(gw: Cluster) -> None:
    async with RawClient(gw.broker.addr) as raw:
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.SubscriptionGroupConfig(group_name="typed-g", retry_max_times=2),
            )
        )
    async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        producer = await first_settings(
            stub,
            v2.Settings(
                client_type=v2.PRODUCER,
                publishing=v2.Publishing(topics=[v2.Resource(name="TypedFifo")]),
            ),
        )
        consumer = await first_settings(
            stub,
            v2.Settings(
                client_type=v2.PUSH_CONSUMER,
                subscription=v2.Subscription(group=v2.Resource(name="typed-g")),
                user_agent=v2.UA(language=v2.PYTHON),
            ),
        )
    pb = producer.backoff_policy
    assert pb.max_attempts == 5 and pb.exponential_backoff.initial.ToMilliseconds() == 50
    assert producer.publishing.validate_message_type is True
    cb = consumer.backoff_policy
    assert cb.max_attempts == 3  # retryMaxTimes 2, + the first delivery
    assert [d.ToSeconds() for d in cb.customized_backoff.next] == [1, 3, 9]  # messageDelayLevel
    assert consumer.subscription.receive_batch_size == 8
    assert consumer.subscription.long_polling_timeout.ToMilliseconds() == 12_000
    assert consumer.subscription.fifo is False


async def test_a_runtime_update_of_a_key_reaches_the_next_settings(gw: Cluster) -> None:
    consumer = v2.Settings(
        client_type=v2.SIMPLE_CONSUMER,
        subscription=v2.Subscription(group=v2.Resource(name="typed-h")),
    )
    async with RawClient(gw.broker.addr) as raw:
        with pytest.raises(grpc.aio.AioRpcError, match=r"gatewayReceiveBatchSize 99: 1\.\.32"):
            await raw.set_config("gatewayReceiveBatchSize", "99")
        await raw.set_config("gatewayReceiveBatchSize", "4")
        try:
            async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
                stub = svc_grpc.MessagingServiceStub(channel)
                after = await first_settings(stub, consumer)
        finally:
            await raw.set_config("gatewayReceiveBatchSize", str(KEYS["gatewayReceiveBatchSize"]))
    assert after.subscription.receive_batch_size == 4
