"""Reading RocketQ topics with Spark (issue 18): the directory's SparkSession (conftest) against
a real nameserver and two broker groups; each test has its own topics."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from rocketq import Admin
from rocketq.client.admin import TopicConfig
from tests.integration.spark.conftest import (
    create_topic,
    nameserver,
    produce,
)
from tests.support.cluster import Cluster
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def run_available_now(spark: Any, reader: Any, checkpoint: Path, table: str) -> list[int]:
    """Run one Trigger.AvailableNow query into Parquet under ``checkpoint``'s parent and make
    what it committed so far readable as the view ``table``; the rows each micro-batch read.
    (Spark's file sink is exactly once: its log lists only committed files.)"""
    out = checkpoint.parent / "out"
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    if (out / "_spark_metadata").exists():
        spark.read.parquet(str(out)).createOrReplaceTempView(table)
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
        .option("group", "spark-read-limit-group")
    )
    sizes = run_available_now(spark, reader, tmp_path / "ck", "read_limit")
    assert bodies_of(spark, "read_limit") == sorted(sent)
    assert sizes == [15, 15, 10], sizes
    row = spark.sql("select * from read_limit limit 1").collect()[0]
    assert row.topic == "spark-read-limit" and row.brokerName in ("broker-a", "broker-b")
    assert row.storeTimestamp is not None and row.queueOffset >= 0
    # Progress shows under the group option (rocketq group describe): every queue at its end.
    until_sync(lambda: group_lag(env, "spark-read-limit-group") == (40, 0), "progress stored", 20)


def group_lag(c: Cluster, group: str) -> tuple[int, int]:
    """(messages the group has consumed, its lag) summed over queues."""

    async def go() -> tuple[int, int]:
        async with Admin(c.namesrv_addrs, timeout_ms=5000) as admin:
            stats = await admin.consume_stats(group)
        return sum(max(q.consumer_offset, 0) for q in stats.queues), stats.total_lag

    return asyncio.run(go())


def update_topic_queues(c: Cluster, topic: str, queues: int) -> None:
    async def go() -> None:
        async with Admin(c.namesrv_addrs, timeout_ms=5000) as admin:
            await admin.update_topic(TopicConfig(topic, queues, queues))

    asyncio.run(go())


def stream(spark: Any, c: Cluster, topic: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("rocketq")
        .option("nameserver", nameserver(c))
        .option("topic", topic)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader


def test_restart_from_checkpoint_reads_on_once_and_picks_up_new_queues(
    env: Cluster, spark: Any, tmp_path: Path
) -> None:
    create_topic(env, "spark-read-grow", queues=1)
    first = [f"a{i:02d}".encode() for i in range(10)]
    produce(env, "spark-read-grow", first)
    reader = stream(spark, env, "spark-read-grow", startingOffsets="earliest")
    run_available_now(spark, reader, tmp_path / "ck", "read_grow_1")
    assert bodies_of(spark, "read_grow_1") == sorted(first)
    # The topic gains queues (1 -> 3 on each broker); the restarted query reads them from
    # their earliest offset and nothing it read before.
    update_topic_queues(env, "spark-read-grow", 3)
    second = [f"b{i:02d}".encode() for i in range(12)]
    produce(env, "spark-read-grow", second)
    assert sum(run_available_now(spark, reader, tmp_path / "ck", "read_grow_2")) == len(second)
    got = spark.sql("select body, queueId from read_grow_2").collect()
    assert sorted(bytes(r.body) for r in got) == sorted(first + second)
    assert {r.queueId for r in got if bytes(r.body) in second} > {0}, "nothing from a new queue"


def test_a_start_resolved_from_latest_does_not_move_before_the_first_commit(
    env: Cluster, spark: Any, tmp_path: Path
) -> None:
    create_topic(env, "spark-read-latest", queues=1)
    produce(env, "spark-read-latest", [b"old-1", b"old-2"])
    reader = stream(spark, env, "spark-read-latest", group="spark-read-latest-group")
    # Nothing new: no batch runs, nothing is committed in the checkpoint.
    assert run_available_now(spark, reader, tmp_path / "ck", "read_latest_1") == []
    produce(env, "spark-read-latest", [b"new-1", b"new-2"])
    # Restarted before any commit, Spark asks for the initial offset again: it is the one
    # resolved the first time (stored under the group), not today's latest.
    assert run_available_now(spark, reader, tmp_path / "ck", "read_latest_2") == [2]
    assert bodies_of(spark, "read_latest_2") == [b"new-1", b"new-2"]


def test_batch_reads_by_offsets_and_by_timestamps(env: Cluster, spark: Any) -> None:
    create_topic(env, "spark-read-range", queues=1)  # one queue on each broker
    produce(env, "spark-read-range", [f"x{i:02d}".encode() for i in range(10)])
    between_ms = int(time.time() * 1000) + 1
    until_sync(lambda: int(time.time() * 1000) > between_ms + 5, "the clock moved on")
    produce(env, "spark-read-range", [f"y{i:02d}".encode() for i in range(6)])

    def read(**options: str) -> list[Any]:
        r = spark.read.format("rocketq").option("nameserver", nameserver(env))
        r = r.option("topic", "spark-read-range")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load().collect()

    everything = read(startingOffsets="earliest")
    assert len(everything) == 16
    by_queue = {(r.brokerName, r.queueId): 0 for r in everything}
    bounds = {b: {str(q): 2 for (bb, q) in by_queue if bb == b} for b, _ in by_queue}
    ends = {b: {str(q): 4 for (bb, q) in by_queue if bb == b} for b, _ in by_queue}
    rows = read(
        startingOffsets=json.dumps({"spark-read-range": bounds}),
        endingOffsets=json.dumps({"spark-read-range": ends}),
    )
    assert len(by_queue) == 2
    assert sorted(r.queueOffset for r in rows) == [2, 2, 3, 3]
    later = read(startingTimestamp=str(between_ms))
    assert sorted(bytes(r.body) for r in later) == [f"y{i:02d}".encode() for i in range(6)]
    earlier = read(startingOffsets="earliest", endingTimestamp=str(between_ms))
    assert sorted(bytes(r.body) for r in earlier) == [f"x{i:02d}".encode() for i in range(10)]
    # Per queue, as Kafka's *OffsetsByTimestamp: broker-a's queue from the second send on,
    # broker-b's from its start (left out: earliest), each up to the second send.
    queue_a = {"broker-a": {"0": between_ms}}
    mixed = read(
        startingOffsetsByTimestamp=json.dumps({"spark-read-range": queue_a}),
        endingOffsetsByTimestamp=json.dumps({"spark-read-range": {"broker-b": {"0": between_ms}}}),
    )
    ys_on_a = sorted(
        bytes(r.body) for r in everything if r.brokerName == "broker-a" and r.body[:1] == b"y"
    )
    xs_on_b = sorted(
        bytes(r.body) for r in everything if r.brokerName == "broker-b" and r.body[:1] == b"x"
    )
    assert sorted(bytes(r.body) for r in mixed) == sorted(ys_on_a + xs_on_b)
    # maxRecordsPerPartition splits each queue's range into even Spark partitions.
    split = spark.read.format("rocketq").option("nameserver", nameserver(env))
    split = split.option("topic", "spark-read-range").option("maxRecordsPerPartition", "3").load()
    per_queue = [sum(1 for r in everything if r.brokerName == b) for b in ("broker-a", "broker-b")]
    assert split.rdd.getNumPartitions() == sum(-(-n // 3) for n in per_queue)
    assert sorted(bytes(r.body) for r in split.collect()) == sorted(
        bytes(r.body) for r in everything
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topik": "t"}, "unknown option 'topik'"),
        ({"startingOffsets": "{not json"}, "option startingOffsets is not valid JSON"),
        ({"topic": "no-such-topic-here"}, "option topic: 'no-such-topic-here'"),
        ({"maxOffsetsPerTrigger": "lots"}, "option maxOffsetsPerTrigger must be an integer"),
        (
            {"nameserver": "127.0.0.1:1"},
            "option topic: 'spark-read-limit' cannot be read from nameserver 127.0.0.1:1",
        ),
    ],
)
def test_bad_options_fail_at_query_start_naming_the_option(
    env: Cluster, spark: Any, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    base = {"nameserver": nameserver(env), "topic": "spark-read-limit"}
    reader = spark.readStream.format("rocketq")
    for k, v in {**base, **options}.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=message):
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)


def test_a_trigger_waits_for_min_offsets_per_trigger(env: Cluster, spark: Any) -> None:
    create_topic(env, "spark-read-min", queues=1)
    produce(env, "spark-read-min", [b"first"])
    # Spark reports a trigger that found nothing to run every 100 ms instead of every 10 s.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    query = (
        stream(spark, env, "spark-read-min", startingOffsets="earliest")
        .option("minOffsetsPerTrigger", "4")
        .option("maxTriggerDelay", "1h")
        .load()
        .writeStream.format("memory")
        .queryName("read_min")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        until_sync(lambda: query_rows(spark, "read_min") == 1, "the first batch (never held)", 120)
        produce(env, "spark-read-min", [b"second", b"third"])
        # A trigger that saw only these two ran no batch: Spark reported it idle.
        seen = len(query.recentProgress)
        until_sync(
            lambda: any(p["numInputRows"] == 0 for p in query.recentProgress[seen:]),
            "an idle trigger after two new messages",
            60,
        )
        produce(env, "spark-read-min", [b"fourth", b"fifth"])
        until_sync(lambda: query_rows(spark, "read_min") == 5, "the batch of four", 60)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert sizes == [1, 4], sizes
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def query_rows(spark: Any, table: str) -> int:
    return int(spark.sql(f"select count(*) as n from {table}").collect()[0].n)
