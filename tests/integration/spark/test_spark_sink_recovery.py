"""The sink's recovery paths on real brokers, driven through its functions without a
SparkSession (the Spark tests beside this one drive the same code through Spark).

The driver records a micro-batch and dies before it ends a single half: the brokers' check-
backs, answered by a live sink process from the commit record, commit exactly the recorded
halves and roll back a failed attempt's. The replay that follows writes nothing and its commit
changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pyarrow as pa
import pytest

from rocketq import Admin
from rocketq.spark import _client
from rocketq.spark.options import sink_options
from rocketq.spark.sink import (
    PROP_QUERY,
    commit_batch,
    ensure_commits_topic,
    record_batch,
    write_task,
)
from tests.integration.spark.conftest import create_topic, nameserver
from tests.support.cluster import Cluster
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TOPIC = "spark-sink-recover"


def rows(prefix: str, n: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"body": [f"{prefix}{i:04d}".encode() for i in range(n)]})]


def stored(c: Cluster) -> list[bytes]:
    """Every body in the topic (all queues, from their first offset)."""
    client = _client.client(nameserver(c), "spark-recover-reader")
    out: list[bytes] = []
    for mq in client.queues(TOPIC):
        offset = 0
        while True:
            got = client.pull(mq, offset, 1024, "*", "TAG", 5000)
            if not got.messages:
                break
            out += [m.body for m in got.messages]
            offset = got.next_offset
    return sorted(out)


def pending(c: Cluster, query: str) -> int:
    async def go() -> int:
        async with Admin(c.namesrv_addrs, timeout_ms=5000) as admin:
            page = await admin.half_messages(topic=TOPIC, max_num=1000)
            return sum(1 for h in page.messages if h.message.properties.get(PROP_QUERY) == query)

    return asyncio.run(go())


def test_check_backs_finish_a_recorded_batch_and_roll_back_the_rest(env: Cluster) -> None:
    create_topic(env, TOPIC, queues=2)
    opts = sink_options(
        {"nameserver": nameserver(env), "topic": TOPIC, "producerGroup": "spark-recover-pg"}
    )
    _client.loop().run(ensure_commits_topic(opts))
    query = f"q-{uuid.uuid4().hex[:8]}"
    kept = write_task(opts, query, 7, iter(rows("a", 1200)))  # the attempt Spark committed
    failed = write_task(opts, query, 7, iter(rows("b", 300)))  # one that failed: never handed on
    assert len(kept.halves) >= 3 and failed.halves  # several batch halves, spread over queues
    assert stored(env) == []  # nothing visible before the commit

    # The driver writes the record, the commit point, and dies before ending any half.
    record_batch(opts, [kept], 7)
    until_sync(lambda: pending(env, query) == 0, "every half settled by a check-back", 60)
    expected = sorted(f"a{i:04d}".encode() for i in range(1200))
    assert stored(env) == expected

    # The restarted driver replays batch 7: its tasks find the record and send nothing, and
    # its commit ends the recorded halves again, which changes nothing.
    replay: Any = write_task(opts, query, 7, iter(rows("c", 50)))
    assert replay.skipped and not replay.halves
    commit_batch(opts, [replay], 7)
    assert stored(env) == expected
