"""The official RocketMQ 5 Python SDK keeps consuming through the gateway across a master failover.

Real processes: a nameserver, an etcd and three replicas of ``broker-a`` in controller mode
(SYNC_MASTER, lease TTL 2 s), each serving the apache.rocketmq.v2 gateway on its own free port.
The official SDK (``.venv-rmq5``) runs two applications, tests/integration/v2_apps/ha_traffic.py:
a producer sending all along and a SimpleConsumer receiving all along, both configured with every
gateway. The master is SIGKILLed; a slave is elected and registers its gateway; the SDK finds it
through its periodic route refresh (every 30 s in the Python SDK). Consumption goes on, and every
send the producer saw acknowledged is received (at least once: duplicates allowed, no loss).
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.integration.cluster import free_port
from tests.integration.failover_support import (
    ELECTION_BOUND_S,
    GROUP_KEYS,
    TOPIC,
    prepare,
    wait_master,
)
from tests.support.cluster import Group, cluster
from tests.support.until import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APP = Path(__file__).resolve().parent / "v2_apps" / "ha_traffic.py"
REPLICAS = 3
BACKLOG = 100
ROUTE_REFRESH_BOUND_S = 30 + ELECTION_BOUND_S + 15
"""The SDK asks for routes every 30 s; the new master must be elected and registered first, and
unacked messages come back after the consumer's 10 s invisible time."""


class App:
    """An ha_traffic.py process; its JSON lines are collected as they come."""

    def __init__(self, mode: str, endpoints: str, group: str) -> None:
        self.records: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [str(SDK_PYTHON), str(APP), mode, endpoints, TOPIC, group],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream: IO[str], records: bool) -> None:
        for line in stream:
            if records and line.startswith("{"):
                self.records.append(json.loads(line))
            elif not records:
                self.stderr.append(line)

    def values(self, key: str) -> list[str]:
        return [r[key] for r in list(self.records) if key in r]

    def stop(self) -> None:
        """Close its stdin (it stops), wait for it; killed when it hangs."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._readers:
            t.join(timeout=5)

    def tail(self) -> str:
        return "".join(self.stderr[-20:])


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[tuple[Group, dict[int, int]]]:
    """Three replicas in controller mode, each with its own gateway port."""
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    ports = {rid: free_port() for rid in range(1, REPLICAS + 1)}
    with cluster(tmp_path, brokers=0, etcd=True) as c:
        assert c.nameserver is not None and c.etcd is not None
        # The group by hand (not cluster(replicas=...)): each replica gets its own gatewayPort.
        c.group = Group(tmp_path, c.nameserver, c.etcd, "broker-a", dict(GROUP_KEYS))
        for rid, port in ports.items():
            c.group.start_replica(rid, gatewayPort=port)
        yield c.group, ports


async def test_official_consumer_keeps_consuming_across_master_failover(
    ha: tuple[Group, dict[int, int]],
) -> None:
    g, ports = ha
    m1 = await prepare(g)
    endpoints = ";".join(f"127.0.0.1:{p}" for p in ports.values())
    producer = App("send", endpoints, "-")
    consumer: App | None = None
    try:
        # A backlog first: the consumer is still working through it when the master dies.
        await until(lambda: len(producer.values("ok")) >= BACKLOG, "a backlog of sends", 30)
        consumer = App("receive", endpoints, "v2-failover")
        await until(lambda: consumer.values("got"), "the consumer's first messages", 30, 0.01)
        g.replicas[m1].kill()
        m2 = await wait_master(g, ELECTION_BOUND_S, not_rid=m1, converged=False)
        new_gateway = f"127.0.0.1:{ports[m2]}"

        def through_new_master(key: str) -> set[str]:
            return {r[key] for r in list(consumer.records + producer.records)
                    if key in r and new_gateway in r["via"]}  # fmt: skip

        # Sends acknowledged by the new master are received from it: consumption goes on.
        await until(
            lambda: len(through_new_master("ok") & through_new_master("got")) >= 5,
            f"messages sent and received through the new master's gateway {new_gateway}",
            ROUTE_REFRESH_BOUND_S,
        )
        producer.stop()
        acked = set(producer.values("ok"))

        def missing() -> set[str]:
            return acked - set(consumer.values("got"))

        await until(
            lambda: not missing(), "every acknowledged message received", ROUTE_REFRESH_BOUND_S
        )
    except AssertionError as exc:
        logs = consumer.tail() if consumer is not None else ""
        raise AssertionError(
            f"{exc}\nproducer stderr:\n{producer.tail()}\nconsumer stderr:\n{logs}"
        ) from None
    finally:
        producer.stop()
        if consumer is not None:
            consumer.stop()
    got = consumer.values("got")
    old_gateway = f"127.0.0.1:{ports[m1]}"
    before = {r["ok"] for r in producer.records if "ok" in r and old_gateway in r["via"]}
    after = {r["got"] for r in consumer.records if "got" in r and new_gateway in r["via"]}
    print(
        f"killed replica {m1}, elected {m2}: {len(acked)} sends acknowledged "
        f"({len(before)} by the old master), {len(got)} deliveries "
        f"({len(got) - len(set(got))} duplicates), {len(before & after)} of the old master's "
        "received from the new one"
    )
    assert acked <= set(got)  # no loss (duplicates allowed)
    # The backlog crossed the failover: acknowledged by the old master, received from the new.
    assert before & after
