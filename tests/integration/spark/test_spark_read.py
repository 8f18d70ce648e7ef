"""Reading RocketQ topics with Spark (issue 18): a real local[2] SparkSession against a real
nameserver and two broker groups. One session for the module; each test has its own topics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.spark.conftest import (
    create_topic,
    nameserver,
    produce,
    spark_session,
)
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]")
    yield session
    session.stop()


def run_available_now(spark: Any, reader: Any, checkpoint: Path, table: str) -> list[int]:
    """Run one Trigger.AvailableNow query into the memory table ``table``; the rows each
    micro-batch read."""
    query = (
        reader.load()
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def bodies_of(spark: Any, table: str) -> list[bytes]:
    return sorted(bytes(r.body) for r in spark.sql(f"select body from {table}").collect())


def test_stream_reads_every_message_once_within_the_trigger_limit(
    env: Cluster, spark: Any, tmp_path: Path
) -> None:
    create_topic(env, "spark-read-limit", queues=2)  # 2 queues on each of 2 brokers
    sent = [f"m{i:03d}".encode() for i in range(40)]
    produce(env, "spark-read-limit", sent)
    reader = (
        spark.readStream.format("rocketq")
        .option("nameserver", nameserver(env))
        .option("topic", "spark-read-limit")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "15")
    )
    sizes = run_available_now(spark, reader, tmp_path / "ck", "read_limit")
    assert bodies_of(spark, "read_limit") == sorted(sent)
    assert sizes == [15, 15, 10], sizes
    row = spark.sql("select * from read_limit limit 1").collect()[0]
    assert row.topic == "spark-read-limit" and row.brokerName in ("broker-a", "broker-b")
    assert row.storeTimestamp is not None and row.queueOffset >= 0
