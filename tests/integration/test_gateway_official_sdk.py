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

import pytest

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from tests.integration.cluster import free_port
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APPS = Path(__file__).resolve().parent / "v2_apps"
APP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    port = free_port()
    keys = {"gatewayPort": port}
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


def run_app(app: str, port: int, topic: str, group: str, count: int, cwd: Path) -> Any:
    run = subprocess.run(
        [str(SDK_PYTHON), str(APPS / app), f"127.0.0.1:{port}", topic, group, str(count)],
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
