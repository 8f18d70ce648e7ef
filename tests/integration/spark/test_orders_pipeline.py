"""The reference pipeline (examples/orders_pipeline.py, issue 18) killed with SIGKILL and started
again: every finished window reaches the results topic and the Parquet output exactly once.

The pipeline runs as its own process (its own Spark driver), against a real nameserver and two
broker groups; the test produces order events, waits until the first windows are out, kills the
whole process group, produces the rest, restarts it and waits for every window."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rocketq.spark import _client
from tests.integration.spark.conftest import create_topic, nameserver
from tests.support.cluster import Cluster
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PIPELINE = Path(__file__).resolve().parents[3] / "examples" / "orders_pipeline.py"
BASE_MS = 1_767_225_600_000  # a minute boundary
EVENTS = 40
WAIT_S = 240.0


def events() -> list[dict[str, object]]:
    """EVENTS orders over 4 minutes of event time, 3 customers, amounts in cents."""
    return [
        {"order": f"o-{i}", "customer": f"c-{i % 3}", "amount": float(i), "ts": BASE_MS + i * 6000}
        for i in range(EVENTS)
    ]


def expected() -> Counter[tuple[int, str, int, float]]:
    windows: dict[tuple[int, str], list[float]] = {}
    for e in events():
        start = int(e["ts"]) // 60_000 * 60_000  # type: ignore[call-overload]
        windows.setdefault((start, str(e["customer"])), []).append(float(e["amount"]))  # type: ignore[arg-type]
    return Counter((s, c, len(a), round(sum(a), 2)) for (s, c), a in windows.items())


def send(c: Cluster, items: list[dict[str, object]]) -> None:
    from rocketq import SyncProducer
    from rocketq.client.producer import ProducerConfig
    from rocketq.message import Message

    p = SyncProducer(ProducerConfig(group="orders-test", namesrv_addrs=c.namesrv_addrs))
    p.start()
    try:
        for e in items:
            p.send(Message(topic="orders", body=json.dumps(e).encode()))
    finally:
        p.close()


def results(c: Cluster) -> list[tuple[int, str, int, float]]:
    """Every message on the results topic, decoded (windowStart in ms)."""
    client = _client.client(nameserver(c), "orders-test-reader")
    out = []
    for mq in client.queues("order-totals"):
        [end] = client.offsets([mq], "max")
        offset = 0
        while offset < end:
            res = client.pull(mq, offset, 256, "*", "TAG", 5000)
            for m in res.messages:
                row = json.loads(m.body)
                start_ms = _ms(row["windowStart"])
                out.append((start_ms, row["customer"], row["orders"], row["amount"]))
            offset = res.next_offset
    return out


def _ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text).timestamp() * 1000)


def parquet_rows(work: Path) -> list[tuple[int, str, int, float]]:
    """Rows of the files Spark's file sink committed (its _spark_metadata log), no others."""
    log = work / "parquet" / "_spark_metadata"
    if not log.exists():
        return []
    files = []
    for entry in sorted(log.iterdir()):
        if entry.name.startswith("."):
            continue
        for line in entry.read_text().splitlines()[1:]:
            files.append(json.loads(line)["path"].removeprefix("file:"))
    out = []
    for f in files:
        for r in pq.read_table(f).to_pylist():
            start_ms = int(r["windowStart"].timestamp() * 1000)
            out.append((start_ms, r["customer"], r["orders"], r["amount"]))
    return out


def start(c: Cluster, work: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    log = (work / "pipeline.log").open("ab")
    return subprocess.Popen(
        [sys.executable, str(PIPELINE), "--nameserver", nameserver(c), "--work", str(work)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: the JVM dies with it
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@pytest.mark.timeout(600)  # two Spark driver starts and a few dozen micro-batches
def test_pipeline_resumes_after_sigkill_without_loss_or_duplicates(
    env: Cluster, tmp_path: Path
) -> None:
    create_topic(env, "orders", queues=1)
    create_topic(env, "order-totals", queues=1)
    half = EVENTS // 2
    send(env, events()[:half])
    proc = start(env, tmp_path)
    try:
        # The first minutes' windows are finished (the watermark passed them): some are out.
        until_sync(
            lambda: len(results(env)) >= 1 or proc.poll() is not None, "first windows", WAIT_S, 1.0
        )
        assert proc.poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
    finally:
        kill(proc)
    closing = {"order": "close", "customer": "-", "amount": 0.0, "ts": BASE_MS + 3_600_000}
    send(env, [*events()[half:], closing])
    proc = start(env, tmp_path)
    want = expected()
    try:
        until_sync(
            lambda: (
                proc.poll() is not None
                or (
                    len(results(env)) >= sum(want.values())
                    and len(parquet_rows(tmp_path)) >= sum(want.values())
                )
            ),
            "every window in the topic and in Parquet",
            WAIT_S,
            1.0,
        )
        assert proc.poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
    finally:
        kill(proc)
    assert Counter(results(env)) == want
    assert Counter(parquet_rows(tmp_path)) == want
