"""The apache.rocketmq.v2 gateway with the official RocketMQ 5 Python SDK as a real application.

The SDK (``rocketmq-python-client`` 5.1.2, installed by ``make setup`` into ``.venv-rmq5``) runs
in its own process: tests/integration/v2_apps/simple_roundtrip.py produces, then receives with a
SimpleConsumer, leaves one message unacked with a short invisible duration, and acks the rest.
The broker serves the gateway on a free loopback port (gatewayPort).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from tests.integration.cluster import free_port
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APPS = Path(__file__).resolve().parent / "v2_apps"
APP_TIMEOUT_S = 120


async def test_official_python_sdk_produces_and_receives_through_the_gateway(
    tmp_path: Path,
) -> None:
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    port = free_port()
    topic, group = "V2Orders", "v2-workers"
    with cluster(tmp_path, broker_keys={"gatewayPort": port}) as c:
        async with RawClient(c.broker.addr) as raw:
            await raw.admin.CreateTopic(
                admin_pb2.CreateTopicRequest(
                    target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                    config=common_pb2.TopicConfig(
                        topic_name=topic, read_queue_nums=2, write_queue_nums=2, perm=6
                    ),
                )
            )
        run = subprocess.run(
            [str(SDK_PYTHON), str(APPS / "simple_roundtrip.py"), f"127.0.0.1:{port}", topic,
             group, "3"],
            capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, f"the SDK app failed:\n{run.stderr[-4000:]}"
        out = json.loads(run.stdout.strip().splitlines()[-1])
        sent, received = out["sent"], out["received"]
        assert len(sent) == 3
        assert {r["id"] for r in received} == set(sent)
        assert all(r["tag"] == "TagA" for r in received)
        first = received[0]["id"]
        attempts = [r["attempt"] for r in received if r["id"] == first]
        assert attempts == [1, 2], received  # left unacked once, then came back
        others = [r["attempt"] for r in received if r["id"] != first]
        assert others == [1, 1], received
        c.check_logs()
