"""`rocketq dev up --slaves 1` end to end (issue 7): a master and its slave as real processes,
roles and replication lag in `rocketq cluster list`, the master suggesting the slave for a
backlog beyond (a pretended 2000 bytes of) memory, and a consumer group that keeps reading from
the slave after the master is SIGKILLed, as a user would see it from the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ROCKETQ = [sys.executable, "-c", "from services.cli.main import main; main()"]
TOPIC = "ReplicatedOrders"
MESSAGES = 20
CATCH_UP_WAIT_S = 20.0


PHYSICAL_MEMORY_BYTES = 2000
"""The brokers pretend to have this much memory: a backlog beyond 40 % of it (800 bytes, a few
records) makes the master suggest the slave (slaveReadEnable, SPEC §6.7)."""


def rocketq(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "COLUMNS": "220",
        "ROCKETQ_PHYSICAL_MEMORY_BYTES": str(PHYSICAL_MEMORY_BYTES),
    }
    return subprocess.run(
        [*ROCKETQ, *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


class Dev:
    def __init__(self, base: Path, up_stdout: str) -> None:
        self.base = base
        self.up_stdout = up_stdout
        data = json.loads((base / "pids.json").read_text())
        self.namesrv: str = data["namesrv"]
        self.processes: dict[str, dict[str, Any]] = data["processes"]

    def __call__(self, *args: str, timeout_s: float = 60) -> str:
        out = rocketq(*args, "-n", self.namesrv, timeout_s=timeout_s)
        assert out.returncode == 0, f"rocketq {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def brokers(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(self("cluster", "list", "--json"))
        return sorted(rows, key=lambda r: (r["broker_name"], r["broker_id"]))


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    base = tmp_path_factory.mktemp("dev-ha") / "rq"
    up = rocketq(
        *("dev", "up", "--dir", str(base), "--namesrv-port", "0", "--broker-port", "0"),
        *("--detach", "--no-timer", "--slaves", "1", "--set", "slaveSyncConfigInterval=1000"),
        *("--set", "slaveReadEnable=true"),
        *(
            "--set",
            "mappedFileSizeCommitLog=67108864",
            "--set",
            "mappedFileUnitsConsumeQueue=30000",
        ),
    )
    assert up.returncode == 0, f"dev up failed:\n{up.stdout}\n{up.stderr}"
    d = Dev(base, up.stdout)
    try:
        yield d
    finally:
        rocketq("dev", "down", "--dir", str(base))
        for p in d.processes.values():  # never leak a server, whatever happened above
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p["pid"]), signal.SIGKILL)


def test_dev_up_starts_a_slave_with_its_own_store(dev: Dev) -> None:
    assert set(dev.processes) == {"namesrv", "broker", "slave-1"}
    slave_addr = dev.processes["slave-1"]["addr"]
    assert f"slave 1     {slave_addr}" in dev.up_stdout
    assert (dev.base / "store-slave-1").is_dir()
    rows = dev.brokers()
    assert [(r["broker_name"], r["broker_id"], r["addr"]) for r in rows] == [
        ("broker-a", 0, dev.processes["broker"]["addr"]),
        ("broker-a", 1, slave_addr),
    ]
    assert [r["stats"]["role"] for r in rows] == ["ASYNC_MASTER", "SLAVE"]


def test_cluster_list_shows_each_slaves_acked_offset_and_lag(dev: Dev) -> None:
    dev("topic", "create", TOPIC, "-q", "2")
    dev("produce", TOPIC, "--body", "replicate me", "--count", str(MESSAGES))
    deadline = time.monotonic() + CATCH_UP_WAIT_S
    master: dict[str, Any] = {}
    while time.monotonic() < deadline:
        master = dev.brokers()[0]["stats"]
        slaves = master["slaves"]
        if slaves and slaves[0]["acked_offset"] == master["commitlog_max_offset"]:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the slave did not catch up within {CATCH_UP_WAIT_S} s: {master}")
    (slave,) = master["slaves"]
    assert slave["broker_id"] == 1
    assert slave["broker_addr"] == dev.processes["slave-1"]["addr"]
    assert slave["in_sync"] is True
    assert slave["lag_bytes"] == 0 and slave["lag_seconds"] == 0
    table = dev("cluster", "list")
    assert "replication (as each master sees its slaves)" in table
    assert "1 slave(s), 1 in sync" in table
    slave_addr = dev.processes["slave-1"]["addr"]
    replication = table[table.index("replication (as each master") :]
    row = next(r for r in replication.splitlines() if slave_addr in r)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    max_offset = str(master["commitlog_max_offset"])
    # broker, master max, slave id, address, acked, in sync, lag bytes, lag s, last ack
    assert cells[:8] == ["broker-a", max_offset, "1", slave_addr, max_offset, "yes", "0", "0.000"]


def pull_suggestion(addr: str, offset: int) -> int:
    """suggest_which_broker_id of a one-message pull of TOPIC queue 0 at ``offset``."""
    with grpc.insecure_channel(addr) as channel:
        stub = messaging_pb2_grpc.MessagingStub(channel)
        req = messaging_pb2.PullRequest(
            consumer_group="e2e-suggested",
            topic=TOPIC,
            queue_id=0,
            queue_offset=offset,
            max_msg_nums=1,
            sys_flag=0x4,  # FLAG_SUBSCRIPTION
            subscription="*",
        )
        resp = stub.Pull(req, timeout=5)
    assert resp.status == messaging_pb2.FOUND
    return int(resp.suggest_which_broker_id)


def test_the_master_suggests_the_slave_for_a_backlog_beyond_memory(dev: Dev) -> None:
    master = dev.processes["broker"]["addr"]
    assert pull_suggestion(master, 0) == 1  # ~18 records behind the end: beyond 800 bytes
    assert pull_suggestion(master, MESSAGES // 2 - 1) == 0  # the queue's last: within them


def slave_messages(addr: str, queues: int) -> int:
    """Messages of TOPIC the slave serves (0 while it does not know the topic yet)."""
    total = 0
    with grpc.insecure_channel(addr) as channel:
        stub = messaging_pb2_grpc.MessagingStub(channel)
        for qid in range(queues):
            req = messaging_pb2.GetMaxOffsetRequest(topic=TOPIC, queue_id=qid)
            try:
                total += stub.GetMaxOffset(req, timeout=5).offset
            except grpc.RpcError:
                return 0
    return total


def test_a_group_keeps_consuming_from_the_slave_after_the_master_is_killed(dev: Dev) -> None:
    # The slave learns the topic from its config sync (slaveSyncConfigInterval, 1 s here).
    deadline = time.monotonic() + CATCH_UP_WAIT_S
    while slave_messages(dev.processes["slave-1"]["addr"], 2) < MESSAGES:
        assert time.monotonic() < deadline, "the slave never served the topic's messages"
        time.sleep(0.2)
    os.kill(int(dev.processes["broker"]["pid"]), signal.SIGKILL)
    out = dev(
        *("consume", TOPIC, "-g", "e2e-slave-readers", "--from", "first"),
        *("--count", str(MESSAGES), "--timeout", "30", "--json"),
        timeout_s=90,
    )
    got = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(got) == MESSAGES
    assert {m["body"] for m in got} == {"replicate me"}
