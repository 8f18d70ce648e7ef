"""``rocketq dev up --tls`` end to end: a throwaway CA, mutual TLS on every port, a demo round
trip over it, and the printed client environment that the CLI then uses (issue 20)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import dev_up, rocketq

pytestmark = pytest.mark.e2e


def test_dev_up_tls_serves_mutual_tls_and_tells_clients_how(tmp_path: Path) -> None:
    base = tmp_path / "rq"
    ports = ("--namesrv-port", "0", "--broker-port", "0", "--timer-port", "0")
    with dev_up(
        base, *ports, "--detach", "--tls", "--set", "mappedFileSizeCommitLog=67108864"
    ) as up:
        assert "consumed 3 back" in up.stdout  # the demo round trip ran over mutual TLS
        exported = re.search(r"export (ROCKETQ_TLS_CA_FILE=\S+ \S+ \S+)", up.stdout)
        assert exported is not None, up.stdout
        env = dict(item.split("=", 1) for item in exported.group(1).split())
        namesrv = json.loads((base / "pids.json").read_text())["namesrv"]

        plain = rocketq("cluster", "list", "-n", namesrv)
        assert plain.returncode != 0
        assert "if it serves TLS, give the client its CA" in plain.stderr

        secure = rocketq("cluster", "list", "-n", namesrv, env=env, check=True)
        assert "broker-a" in secure.stdout
        flags = (
            *("--tls-ca", env["ROCKETQ_TLS_CA_FILE"]),
            *("--tls-cert", env["ROCKETQ_TLS_CERT_FILE"]),
            *("--tls-key", env["ROCKETQ_TLS_KEY_FILE"]),
        )
        produced = rocketq(*flags, "produce", "DemoTopic", "-n", namesrv, stdin="x\n", check=True)
        assert "SEND_OK" in produced.stdout
