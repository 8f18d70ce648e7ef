"""The sink's delay and sharding-key columns (issue 18), exactly once: a real local[2,2]
SparkSession against a nameserver, two broker groups and a timer wheel.

Delayed rows go out inside batch half messages and are handed to the timer wheel only when the
micro-batch commits, so a delayed row is never visible before its batch commits nor before its
time, and a replayed micro-batch does not deliver it twice. Rows with a shardingKey land in the
queue the SDK's hash selector picks for the key, in the order they were written."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketq.client.producer.selectors import java_hash_code
from tests.integration.spark.conftest import create_topic, nameserver, produce
from tests.support.cluster import Cluster, cluster
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

DELAY_MS = 6000


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two broker groups and a timer wheel; check-backs within a couple of seconds."""
    root: Path = tmp_path_factory.mktemp("spark-delays")
    keys = {"transactionTimeout": 2000, "transactionCheckInterval": 500}
    with cluster(
        root, brokers=2, timer_wheel=True, broker_keys=keys, timer_keys={"timerPrecisionMs": 100}
    ) as c:
        yield c


def read_back(spark: Any, c: Cluster, topic: str) -> list[Any]:
    df = (
        spark.read.format("rocketq")
        .option("nameserver", nameserver(c))
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return list(
        df.select("body", "brokerName", "queueId", "queueOffset", "storeTimestamp").collect()
    )


def test_delayed_rows_wait_for_their_time_and_a_replay_delivers_them_once(
    timed: Cluster, spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, lit, when

    def last_digit(body: Any) -> Any:
        return body.cast("string").substr(3, 1).cast("int")

    create_topic(timed, "spark-delay-in", queues=1)
    create_topic(timed, "spark-delay-out", queues=2)
    sent = [f"d{i:02d}".encode() for i in range(20)]
    produce(timed, "spark-delay-in", sent)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        """One AvailableNow run of the query from its checkpoint."""
        rows = (
            spark.readStream.format("rocketq")
            .option("nameserver", nameserver(timed))
            .option("topic", "spark-delay-in")
            .option("startingOffsets", "earliest")
            .load()
        )
        # Even rows (d00, d02, ...) wait DELAY_MS after the commit; odd ones are due at once.
        out = rows.select(
            "body",
            when(last_digit(col("body")) % 2 == 0, lit(DELAY_MS)).alias("delayMs"),
        )
        query = (
            out.writeStream.format("rocketq")
            .option("nameserver", nameserver(timed))
            .option("topic", "spark-delay-out")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run()
    first = read_back(spark, timed, "spark-delay-out")
    read_at = time.time()
    due = [r for r in first if bytes(r.body) in sent[1::2]]
    # The rows due at once are stored by the commit's append: their store time is the commit's.
    committed = max(r.storeTimestamp.timestamp() for r in due) if due else read_at
    if read_at < committed + DELAY_MS / 1000:  # checkable only while the delay runs
        assert sorted(bytes(r.body) for r in first) == sorted(sent[1::2]), (
            "a delayed row was visible before its time"
        )
    until_sync(
        lambda: len(read_back(spark, timed, "spark-delay-out")) >= len(sent),
        "every delayed row delivered by the timer wheel",
        60,
    )
    got = read_back(spark, timed, "spark-delay-out")
    assert sorted(bytes(r.body) for r in got) == sorted(sent)
    for r in got:
        if bytes(r.body) in sent[0::2]:  # stored by the timer wheel's re-put, never early
            assert r.storeTimestamp.timestamp() >= committed + DELAY_MS / 1000 - 0.05

    # The driver "dies" after the sink committed the last batch, before Spark logged it: the
    # replay must deliver none of its rows again, delayed ones included.
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    more = [f"e{i:02d}".encode() for i in range(4)]
    produce(timed, "spark-delay-in", more)
    run()
    # A delayed row the replay sent again would arrive DELAY_MS after the replay's commit,
    # before the new batch's delayed rows (committed after it, with the same delay): once
    # those are in, any duplicate would be too.
    until_sync(
        lambda: (
            {b"e00", b"e02"} <= {bytes(r.body) for r in read_back(spark, timed, "spark-delay-out")}
        ),
        "the new batch's delayed rows delivered",
        60,
    )
    final = sorted(bytes(r.body) for r in read_back(spark, timed, "spark-delay-out"))
    assert final == sorted(sent + more)


def test_sharding_key_rows_land_in_one_queue_in_order(timed: Cluster, spark: Any) -> None:
    from pyspark.sql.functions import col, concat, format_string, lit

    create_topic(timed, "spark-shard-out", queues=2)  # 2 queues on each of the 2 groups
    rows = spark.range(0, 100, 1, 2).select(
        format_string("%03d", col("id")).cast("binary").alias("body"),
        concat(lit("k-"), (col("id") % 5).cast("string")).alias("shardingKey"),
    )
    (
        rows.write.format("rocketq")
        .option("nameserver", nameserver(timed))
        .option("topic", "spark-shard-out")
        .mode("append")
        .save()
    )
    got = read_back(spark, timed, "spark-shard-out")
    assert sorted(int(bytes(r.body)) for r in got) == list(range(100))
    queues = sorted({(r.brokerName, r.queueId) for r in got})
    by_key: dict[int, list[Any]] = {}
    for r in got:
        by_key.setdefault(int(bytes(r.body)) % 5, []).append(r)
    for k, items in by_key.items():
        where = {(r.brokerName, r.queueId) for r in items}
        assert len(where) == 1, f"key k-{k} spread over {where}"
        in_queue = [int(bytes(r.body)) for r in sorted(items, key=lambda r: r.queueOffset)]
        assert in_queue == sorted(in_queue), f"key k-{k} out of order: {in_queue}"
        assert len(queues) == 4
        expected = queues[abs(java_hash_code(f"k-{k}")) % 4]
        assert where == {expected}, f"key k-{k}: the SDK's hash selector picks {expected}"
