"""RecallMessage (services/broker/gateway/recall.py): a delayed message cancelled before it is due.

One nameserver, two brokers serving the v2 gateway on free ports and a timer wheel for the
module (the second broker group for a recall that reaches the other group's gateway first);
the restart scenario starts its own (a process restarted inside a test is reaped when
the test ends). The official Python SDK 5.1.2 (``Producer.recall_message``) runs as its own
application (tests/integration/v2_apps/recall.py); the bad handles and the restart go through
raw v2 calls with the gateway's generated classes (the SDK cannot be imported beside them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    timer_pb2,
)
from rocketq.codec import Prop
from rocketq.validation import TIMER_TOPIC
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from tests.integration.cluster import free_port
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

BROKER = "broker-a"
REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APPS = Path(__file__).resolve().parent / "v2_apps"
APP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int, int]]:
    """The cluster, broker-a's gateway port, broker-b's."""
    with gateway_cluster(tmp_path_factory.mktemp("recall")) as (c, port):
        port_b = free_port()
        c.start_broker("broker-b", gatewayPort=port_b)
        yield c, port, port_b
        c.check_logs()


@contextlib.contextmanager
def gateway_cluster(root: Path) -> Iterator[tuple[Cluster, int]]:
    """A nameserver, a broker with its gateway on a free port, a timer wheel."""
    port = free_port()
    with cluster(root, broker_keys={"gatewayPort": port}, timer_wheel=True) as c:
        yield c, port


async def make_topic(c: Cluster, topic: str, broker: int = 0) -> None:
    async with RawClient(c.brokers[broker].addr) as raw:
        await raw.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=f"broker-{'ab'[broker]}"),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=6
                ),
            )
        )


def handle_of(topic: str, broker: str, deliver_ms: int, message_id: str) -> str:
    """A recall handle in Apache RocketMQ's v1 form, built here independently of the broker."""
    raw = f"v1 {topic} {broker} {deliver_ms} {message_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


async def send_delayed(stub: Any, topic: str, body: bytes, deliver_ms: int) -> Any:
    message = v2.Message(
        topic=v2.Resource(name=topic),
        body=body,
        system_properties=v2.SystemProperties(
            message_id=uuid.uuid4().hex.upper(),
            message_type=v2.DELAY,
            body_encoding=v2.IDENTITY,
            delivery_timestamp=timestamp_pb2.Timestamp(
                seconds=deliver_ms // 1000, nanos=(deliver_ms % 1000) * 1_000_000
            ),
        ),
    )
    resp = await stub.SendMessage(svc.SendMessageRequest(messages=[message]))
    [entry] = resp.entries
    assert entry.status.code == v2.OK, entry.status.message
    return entry


async def recall(stub: Any, topic: str, handle: str) -> Any:
    req = svc.RecallMessageRequest(topic=v2.Resource(name=topic), recall_handle=handle)
    return await stub.RecallMessage(req)


async def timer_stats(c: Cluster) -> timer_pb2.GetTimerStatsResponse:
    async with RawClient(c.timer.addr) as raw:
        stats: timer_pb2.GetTimerStatsResponse = await raw.timer.GetTimerStats(
            timer_pb2.GetTimerStatsRequest()
        )
    return stats


async def test_official_sdk_recalls_a_delayed_message(
    gw: tuple[Cluster, int, int], tmp_path: Path
) -> None:
    c, port, _ = gw
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    topic = "RecallSdk"
    await make_topic(c, topic)
    cancelled_before = (await timer_stats(c)).cancelled_total
    run = subprocess.run(
        [str(SDK_PYTHON), str(APPS / "recall.py"), f"127.0.0.1:{port}", topic, "recall-sdk", "3"],
        capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, f"the SDK app failed:\n{run.stderr[-4000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["has_handle"], out
    assert out["recalled"] == out["drop"], json.dumps(out)
    assert out["again"] in ("", None)  # MESSAGE_NOT_FOUND: the SDK answers "no message id"
    assert out["received"] == ["keep"]
    stats = await timer_stats(c)
    assert stats.cancelled_total == cancelled_before + 1  # the wheel skipped "drop"


async def test_bad_recall_handles_get_the_protocol_statuses(gw: tuple[Cluster, int, int]) -> None:
    c, port, _ = gw
    topic = "RecallBad"
    await make_topic(c, topic)
    later_ms = int(time.time() * 1000) + 60_000
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        entry = await send_delayed(stub, topic, b"pending", later_ms)
        assert entry.recall_handle == handle_of(topic, BROKER, later_ms, entry.message_id)
        plain = await stub.SendMessage(
            svc.SendMessageRequest(
                messages=[v2.Message(topic=v2.Resource(name=topic), body=b"now")]
            )
        )
        assert plain.entries[0].recall_handle == ""  # nothing to recall
        forged = "0" * 32
        for handle, code, text in [
            ("", v2.BAD_REQUEST, "not one"),
            ("%%not base64%%", v2.BAD_REQUEST, "not one"),
            (base64.urlsafe_b64encode(b"v9 a b 1 c").decode(), v2.BAD_REQUEST, "not one"),
            (handle_of("Other", BROKER, later_ms, forged), v2.BAD_REQUEST, "topic Other"),
            (handle_of(topic, BROKER, later_ms, forged), v2.MESSAGE_NOT_FOUND, "no delayed"),
            (handle_of(topic, BROKER, later_ms - 120_000, entry.message_id),
             v2.MESSAGE_NOT_FOUND, "delivered already"),
            (handle_of(topic, "broker-z", later_ms, forged), v2.NOT_FOUND, "broker-z"),
        ]:  # fmt: skip
            resp = await recall(stub, topic, handle)
            assert resp.status.code == code, (handle, resp.status)
            assert text in resp.status.message
        resp = await recall(stub, "NoSuchTopic", handle_of("NoSuchTopic", BROKER, later_ms, forged))
        assert resp.status.code == v2.TOPIC_NOT_FOUND
        # The real handle still works after all that, once.
        resp = await recall(stub, topic, entry.recall_handle)
        assert (resp.status.code, resp.message_id) == (v2.OK, entry.message_id)
        resp = await recall(stub, topic, entry.recall_handle)
        assert resp.status.code == v2.MESSAGE_NOT_FOUND and "already" in resp.status.message


async def test_a_recall_through_another_groups_gateway_reaches_the_timers_group(
    gw: tuple[Cluster, int, int],
) -> None:
    c, port, port_b = gw
    topic = "RecallOtherGroup"
    await make_topic(c, topic, broker=1)  # only broker-b has it
    await wait_routed(c.namesrv_addrs, topic, 1)
    later_ms = int(time.time() * 1000) + 60_000
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port_b}") as channel:
        entry = await send_delayed(svc_grpc.MessagingServiceStub(channel), topic, b"b", later_ms)
    assert entry.recall_handle == handle_of(topic, "broker-b", later_ms, entry.message_id)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:  # broker-a's
        stub = svc_grpc.MessagingServiceStub(channel)
        resp = await recall(stub, topic, entry.recall_handle)
        assert (resp.status.code, resp.message_id) == (v2.OK, entry.message_id)
        resp = await recall(stub, topic, entry.recall_handle)
        assert resp.status.code == v2.MESSAGE_NOT_FOUND and "already" in resp.status.message
    async with RawClient(c.brokers[1].addr) as raw:  # the marker is in broker-b's timer topic
        found = await raw.messaging.QueryMessageById(
            messaging_pb2.QueryMessageByIdRequest(topic=TIMER_TOPIC, msg_id=entry.message_id)
        )
    markers = [m for m in found.messages if Prop.TIMER_DEL_UNIQKEY in m.message.properties]
    assert len(markers) == 1


async def test_a_recall_survives_a_timer_wheel_restart(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with gateway_cluster(tmp_path_factory.mktemp("recall_restart")) as (c, port):
        await _restart_scenario(c, port)
        c.check_logs()


async def _restart_scenario(c: Cluster, port: int) -> None:
    topic = "RecallRestart"
    await make_topic(c, topic)
    deliver_ms = int(time.time() * 1000) + 5_000
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        keep = await send_delayed(stub, topic, b"keep", deliver_ms)
        drop = await send_delayed(stub, topic, b"drop", deliver_ms)
        resp = await recall(stub, topic, drop.recall_handle)
        assert resp.status.code == v2.OK, resp.status.message

    async def wheel_holds_everything() -> bool:  # two timers and the marker
        return sum(q.committed_offset for q in (await timer_stats(c)).queues) >= 3

    # Both timers and the cancel marker are in the wheel's own storage: kill it, start it again.
    await until(wheel_holds_everything, "the timer wheel checkpointing the marker")
    c.timer.kill()
    c.restart_timer()
    received: list[bytes] = []
    async with RawClient(c.broker.addr) as raw:

        async def popped() -> bool:
            resp = await raw.messaging.Pop(
                messaging_pb2.PopRequest(
                    consumer_group="recall-check", topic=topic, invisible_time_ms=60_000,
                    poll_time_ms=1_000,
                )
            )  # fmt: skip
            received.extend(m.message.message.body for m in resp.messages)
            return b"keep" in received

        await until(popped, "the kept message at its time", timeout_s=30)
        await until(lambda: _cancelled(c), "the restarted wheel skipping the recalled timer")
        assert (await timer_stats(c)).cancelled_total == 1
        await popped()  # anything else due with "keep" is there by now
        assert received == [b"keep"]
        assert keep.message_id != drop.message_id  # two timers in one slot, one skipped


async def _cancelled(c: Cluster) -> timer_pb2.GetTimerStatsResponse | None:
    stats = await timer_stats(c)
    return stats if stats.cancelled_total else None
