"""Writing to RocketQ with Spark, exactly once (issue 18): a real local[2,2] SparkSession (failed
tasks are retried) against a real nameserver and two broker groups.

Each test reads what arrived back through the rocketq batch reader and checks every row is
there once: a task failing after it stored half messages, and a micro-batch replayed after its
commit (Spark's own commit log entry removed, as when the driver dies right after the sink
committed) leave no duplicate and lose nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rocketq import Admin
from rocketq.spark.sink import PROP_QUERY
from tests.integration.spark.conftest import create_topic, nameserver, produce
from tests.support.cluster import Cluster
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def read_back(spark: Any, c: Cluster, topic: str) -> list[bytes]:
    df = (
        spark.read.format("rocketq")
        .option("nameserver", nameserver(c))
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return sorted(bytes(r.body) for r in df.select("body").collect())


def pending_halves(c: Cluster, topic: str) -> int:
    async def go() -> int:
        async with Admin(c.namesrv_addrs, timeout_ms=5000) as admin:
            page = await admin.half_messages(topic=topic, max_num=1000)
            return sum(1 for h in page.messages if PROP_QUERY in h.message.properties)

    return asyncio.run(go())


def test_batch_write_with_a_failed_task_attempt_stores_each_row_once(
    env: Cluster, spark: Any
) -> None:
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    create_topic(env, "spark-sink-retry", queues=2)

    @udf("binary")  # no type hints: Spark would try to read a pandas UDF type from them
    def body(i):  # type: ignore[no-untyped-def]
        ctx = TaskContext.get()
        # The first attempt of partition 1 fails two thirds in, after it stored half messages.
        if i == 50 and ctx is not None and ctx.attemptNumber() == 0:
            raise RuntimeError("injected task failure")
        return f"row-{i:03d}".encode()

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5")
    rows = spark.range(0, 60, 1, 2).select(body("id").alias("body"))
    (
        rows.write.format("rocketq")
        .option("nameserver", nameserver(env))
        .option("topic", "spark-sink-retry")
        .mode("append")
        .save()
    )
    assert read_back(spark, env, "spark-sink-retry") == sorted(
        f"row-{i:03d}".encode() for i in range(60)
    )
    # The failed attempt's halves were rolled back by the commit's sweep, none left pending.
    until_sync(lambda: pending_halves(env, "spark-sink-retry") == 0, "no pending halves", 20)


def test_stream_write_replayed_after_commit_is_skipped(
    env: Cluster, spark: Any, tmp_path: Path
) -> None:
    create_topic(env, "spark-sink-in", queues=1)
    create_topic(env, "spark-sink-out", queues=2)
    sent = [f"e{i:02d}".encode() for i in range(30)]
    produce(env, "spark-sink-in", sent)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        query = (
            spark.readStream.format("rocketq")
            .option("nameserver", nameserver(env))
            .option("topic", "spark-sink-in")
            .option("startingOffsets", "earliest")
            .load()
            .select("body", "tags")
            .writeStream.format("rocketq")
            .option("nameserver", nameserver(env))
            .option("topic", "spark-sink-out")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run()
    assert read_back(spark, env, "spark-sink-out") == sorted(sent)
    # The driver "dies" after the sink committed the last batch but before Spark logged it:
    # that batch is replayed on restart, and the sink must not write it again.
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    more = [f"f{i:02d}".encode() for i in range(5)]
    produce(env, "spark-sink-in", more)
    run()
    assert read_back(spark, env, "spark-sink-out") == sorted(sent + more)
