"""Transactional messages from the `rocketq` command, as a user runs them (SPEC §9): a real
nameserver and broker (tests/integration/cluster.py), every command a separate `rocketq`
process.

- `produce --transaction commit` makes the message visible to `consume`; `--transaction
  rollback` never does, and neither does a half message left unknown;
- `transaction list` shows a half message left UNKNOW (topic, id, group) until it is resolved;
- `produce --transaction unknown --check-answer commit --wait-s S` stays up, the broker's
  check-back (transactionTimeout and transactionCheckInterval of 1 s here) asks it, it answers
  commit, and the message becomes visible and leaves `transaction list`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import Cluster, cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ROCKETQ = [sys.executable, "-c", "from services.cli.main import main; main()"]
CHECK_MS = 1000


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Cli:
    def __init__(self, c: Cluster) -> None:
        self.namesrv = c.namesrv

    def run(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ROCKETQ, *args, "-n", self.namesrv],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def __call__(self, *args: str, timeout_s: float = 60) -> str:
        out = self.run(*args, timeout_s=timeout_s)
        assert out.returncode == 0, f"rocketq {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def bodies(self, topic: str, wait_s: float = 3) -> list[str]:
        """Every message body of ``topic`` from the first offset (read only, no group)."""
        out = self("consume", topic, "--from", "first", "--timeout", str(wait_s), "--json")
        return [m["body"] for m in json_lines(out)]

    def pending(self, topic: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(self("transaction", "list", topic, "--json"))[
            "messages"
        ]
        return rows


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    keys = {"transactionTimeout": CHECK_MS, "transactionCheckInterval": CHECK_MS}
    with cluster(tmp_path_factory.mktemp("tx-e2e"), **keys) as c:
        yield Cli(c)


def test_commit_is_consumed_rollback_and_unknown_never(cli: Cli) -> None:
    topic = "TxCliCommit"
    cli("topic", "create", topic, "-q", "2")
    [committed] = json_lines(
        cli("produce", topic, "--body", "committed", "--transaction", "commit", "--json")
    )
    assert committed["status"] == "SEND_OK" and committed["local_state"] == "COMMIT_MESSAGE"
    assert committed["transaction_id"] == committed["msg_id"]
    [rolled] = json_lines(
        cli("produce", topic, "--body", "rolled-back", "--transaction", "rollback", "--json")
    )
    assert rolled["local_state"] == "ROLLBACK_MESSAGE"
    # Left unknown by a group nobody answers for: the check finds no live producer.
    cli("produce", topic, "--body", "unknown", "--transaction", "unknown", "-g", "tx-gone")
    cli("produce", topic, "--body", "plain")  # a normal message after them all
    assert sorted(cli.bodies(topic)) == ["committed", "plain"]


def test_transaction_list_shows_a_pending_unknown_one(cli: Cli) -> None:
    topic = "TxCliPending"
    cli("topic", "create", topic, "-q", "2")
    out = cli(
        "produce", topic, "--body", "maybe", "--transaction", "unknown", "-g", "tx-list", "--json"
    )
    [sent] = json_lines(out)
    assert sent["local_state"] == "UNKNOW"
    rows = cli.pending(topic)
    assert [r["transaction_id"] for r in rows] == [sent["transaction_id"]]
    [row] = rows
    assert row["producer_group"] == "tx-list" and row["message"]["topic"] == topic
    assert row["message"]["body"] == "maybe" and row["check_times"] >= 0
    table = cli("transaction", "list", topic)
    assert sent["transaction_id"] in table and "tx-list" in table and topic in table
    every = json.loads(cli("transaction", "list", "--json"))["messages"]
    assert sent["transaction_id"] in [r["transaction_id"] for r in every]
    assert cli.bodies(topic, wait_s=1) == []


def test_unknown_is_committed_by_the_check_back(cli: Cli) -> None:
    topic = "TxCliCheck"
    cli("topic", "create", topic, "-q", "2")
    started = time.monotonic()
    out = cli.run(
        "produce",
        topic,
        "--body",
        "checked",
        "--transaction",
        "unknown",
        "--check-answer",
        "commit",
        "--wait-s",
        "30",
        "-g",
        "tx-check",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    [sent] = json_lines(out.stdout)
    assert sent["local_state"] == "UNKNOW"
    assert f"check-back: transaction {sent['transaction_id']}" in out.stderr
    assert "every transaction of this run is resolved" in out.stderr
    assert time.monotonic() - started < 30  # it stopped early, once resolved
    assert cli.bodies(topic) == ["checked"]
    assert cli.pending(topic) == []
