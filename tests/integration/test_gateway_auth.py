"""Access control on the RocketMQ 5 gateway: the official Python SDK's signed requests checked
against RocketQ's ACL file, with the broker port's rules.

One nameserver and one broker, both with ``aclEnable``; the broker serves its gateway on a free
port. The SDK (``.venv-rmq5``) runs tests/integration/v2_apps/credentials.py as its own process:
it sends one message and receives it, and reports what the SDK raised. A right key works; a
wrong secret or an unknown key is UNAUTHORIZED (40100), a key without the group's permission is
FORBIDDEN (40300), as the protocol's Code table says.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq.client.admin import Admin
from rocketq.client.security import ClientSecurity, Signer
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from services.common.launch import set_flags
from tests.integration.cluster import ServiceProcess, free_port, start_broker, start_nameserver
from tests.support.cluster import stop_all
from tests.support.until import until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APP = Path(__file__).resolve().parent / "v2_apps" / "credentials.py"
APP_TIMEOUT_S = 120
TOPIC, GROUP = "V2Auth", "v2-auth"
OPS = ClientSecurity(access_key="ops", secret_key="ops-secret")


@dataclass
class Env:
    namesrv: ServiceProcess
    broker: ServiceProcess
    gateway: str


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    root = tmp_path_factory.mktemp("gwauth")
    acl_file = root / "acl.json"
    users = {
        "rocketq-internal": {"secretKey": "internal-secret", "role": "internal"},
        "ops": {"role": "admin", "secretKey": "ops-secret"},
        "app1": {
            "secretKey": "app1-secret",
            "topics": {TOPIC: "PUB|SUB"},
            "groups": {GROUP: "SUB"},
        },
        "pubonly": {"secretKey": "pubonly-secret", "topics": {TOPIC: "PUB"}},
    }
    acl_file.write_text(json.dumps({"users": users}))
    keys = {"aclEnable": True, "aclFile": acl_file}
    port = free_port()
    procs = [start_nameserver(root, *set_flags(keys))]
    try:
        procs.append(
            start_broker(root, [procs[0].addr], "broker-a", None, gatewayPort=port, **keys)
        )
        yield Env(procs[0], procs[1], f"127.0.0.1:{port}")
    finally:
        stop_all(list(reversed(procs)))


async def make_topic(env: Env) -> None:
    async with Admin([env.namesrv.addr], security=OPS) as admin:
        await admin.create_topic(TOPIC)

        async def routed() -> bool:
            try:
                return bool((await admin.route(TOPIC)).queues)
            except Exception:
                return False

        await until(routed, f"a route for {TOPIC}", 15)


def run_app(env: Env, ak: str, sk: str, cwd: Path) -> Any:
    run = subprocess.run(
        [str(SDK_PYTHON), str(APP), env.gateway, TOPIC, GROUP, ak, sk],
        capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=cwd,
    )  # fmt: skip
    assert run.returncode == 0, f"the SDK app failed:\n{run.stderr[-4000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def said(out: dict[str, Any]) -> str:
    """What the application saw: the errors it got and the ones its SDK logged (the SDK logs a
    refused route query at start-up and raises a generic "failed to fetch route")."""
    return "\n".join([str(out["send"]), str(out["receive"]), *out["sdk_errors"]])


async def test_sdk_with_the_right_key_sends_and_receives(env: Env, tmp_path: Path) -> None:
    await make_topic(env)
    out = run_app(env, "app1", "app1-secret", tmp_path)
    assert (out["send"], out["receive"]) == ("ok", "ok"), out


async def test_wrong_secret_and_unknown_key_are_unauthorized(env: Env, tmp_path: Path) -> None:
    await make_topic(env)
    wrong = run_app(env, "app1", "not-the-secret", tmp_path)
    assert wrong["send"] != "ok" and "wrong secret key" in said(wrong), wrong
    assert "40100" in said(wrong), wrong
    unknown = run_app(env, "nobody", "whatever", tmp_path)
    assert unknown["send"] != "ok" and "unknown access key" in said(unknown), unknown
    assert "40100" in said(unknown), unknown


async def test_key_without_the_group_permission_is_forbidden(env: Env, tmp_path: Path) -> None:
    """pubonly may publish to the topic but not consume as the group."""
    await make_topic(env)
    out = run_app(env, "pubonly", "pubonly-secret", tmp_path)
    assert out["send"] == "ok", out
    assert "40300" in out["receive"] and f"group '{GROUP}'" in out["receive"], out


async def test_raw_unsigned_and_forbidden_calls_get_v2_statuses(env: Env) -> None:
    """Below the SDK: no authorization header at all, and a stream (PullMessage) refused."""
    await make_topic(env)
    async with grpc.aio.insecure_channel(env.gateway) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        route = await stub.QueryRoute(
            svc.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10
        )
        assert route.status.code == v2.UNAUTHORIZED, route.status
        assert "no authorization header" in route.status.message
        signer = Signer("pubonly", "pubonly-secret")
        pull = svc.PullMessageRequest(
            group=v2.Resource(name=GROUP),
            message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=0),
        )
        frames = [f async for f in stub.PullMessage(pull, metadata=signer.metadata(), timeout=10)]
        assert [f.status.code for f in frames] == [v2.FORBIDDEN], frames
