"""Writing to RocketQ with Spark, exactly once (issue 18): a real local[2,2] SparkSession (failed
tasks are retried) against a real nameserver, two broker groups and a timer wheel.

Each test reads what arrived back through the rocketq batch reader and checks every row is
there once: a task failing after it stored half messages, and a micro-batch replayed after its
commit (Spark's own commit log entry removed, as when the driver dies right after the sink
committed) leave no duplicate and lose nothing. Delayed rows go out inside batch half messages
and reach the timer wheel only when their micro-batch commits, so they are never visible before
the commit nor before their time, and a replay does not deliver them twice; rows with a
shardingKey land in the queue the SDK's hash selector picks for the key, in write order. The
recovery test drives the sink's functions without Spark: a driver that dies right after
recording a batch leaves its halves to the brokers' check-backs."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rocketq import Admin
from rocketq.client.producer.selectors import java_hash_code
from rocketq.spark import _client
from rocketq.spark.options import sink_options
from rocketq.spark.sink import (
    PROP_QUERY,
    commit_batch,
    ensure_commits_topic,
    record_batch,
    write_task,
)
from tests.integration.spark.conftest import create_topic, nameserver, produce
from tests.support.cluster import Cluster, cluster
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

DELAY_MS = 6000


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two broker groups and a timer wheel (this module's, instead of conftest's); check-backs
    within a couple of seconds."""
    root: Path = tmp_path_factory.mktemp("spark-sink")
    keys = {"transactionTimeout": 2000, "transactionCheckInterval": 500}
    with cluster(
        root, brokers=2, timer_wheel=True, broker_keys=keys, timer_keys={"timerPrecisionMs": 100}
    ) as c:
        yield c


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


def read_rows(spark: Any, c: Cluster, topic: str) -> list[Any]:
    """The topic's rows with where and when they were stored."""
    df = (
        spark.read.format("rocketq")
        .option("nameserver", nameserver(c))
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    cols = ("body", "brokerName", "queueId", "queueOffset", "storeTimestamp")
    return list(df.select(*cols).collect())


def test_delayed_rows_wait_for_their_time_and_a_replay_delivers_them_once(
    env: Cluster, spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, lit, when

    def last_digit(body: Any) -> Any:
        return body.cast("string").substr(3, 1).cast("int")

    create_topic(env, "spark-delay-in", queues=1)
    create_topic(env, "spark-delay-out", queues=2)
    sent = [f"d{i:02d}".encode() for i in range(20)]
    produce(env, "spark-delay-in", sent)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        """One AvailableNow run of the query from its checkpoint."""
        rows = (
            spark.readStream.format("rocketq")
            .option("nameserver", nameserver(env))
            .option("topic", "spark-delay-in")
            .option("startingOffsets", "earliest")
            .load()
        )
        # Even rows (d00, d02, ...) wait DELAY_MS after the commit; odd ones are due at once.
        # One task writes them all, so they are one half, ended at one instant: the store time
        # of its due rows is when its delayed rows' wait starts. (With a task per input queue,
        # the driver ends the halves in parallel, tens of ms apart on a busy machine.)
        out = rows.coalesce(1).select(
            "body",
            when(last_digit(col("body")) % 2 == 0, lit(DELAY_MS)).alias("delayMs"),
        )
        query = (
            out.writeStream.format("rocketq")
            .option("nameserver", nameserver(env))
            .option("topic", "spark-delay-out")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run()
    first = read_rows(spark, env, "spark-delay-out")
    read_at = time.time()
    due = [r for r in first if bytes(r.body) in sent[1::2]]
    # The rows due at once are stored by the commit's append: their store time is the commit's.
    committed = max(r.storeTimestamp.timestamp() for r in due) if due else read_at
    if read_at < committed + DELAY_MS / 1000:  # checkable only while the delay runs
        assert sorted(bytes(r.body) for r in first) == sorted(sent[1::2]), (
            "a delayed row was visible before its time"
        )
    until_sync(
        lambda: len(read_rows(spark, env, "spark-delay-out")) >= len(sent),
        "every delayed row delivered by the timer wheel",
        60,
    )
    got = read_rows(spark, env, "spark-delay-out")
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
    produce(env, "spark-delay-in", more)
    run()
    # A delayed row the replay sent again would arrive DELAY_MS after the replay's commit,
    # before the new batch's delayed rows (committed after it, with the same delay): once
    # those are in, any duplicate would be too.
    until_sync(
        lambda: (
            {b"e00", b"e02"} <= {bytes(r.body) for r in read_rows(spark, env, "spark-delay-out")}
        ),
        "the new batch's delayed rows delivered",
        60,
    )
    final = sorted(bytes(r.body) for r in read_rows(spark, env, "spark-delay-out"))
    assert final == sorted(sent + more)


def test_sharding_key_rows_land_in_one_queue_in_order(env: Cluster, spark: Any) -> None:
    from pyspark.sql.functions import col, concat, format_string, lit

    create_topic(env, "spark-shard-out", queues=2)  # 2 queues on each of the 2 groups
    rows = spark.range(0, 100, 1, 2).select(
        format_string("%03d", col("id")).cast("binary").alias("body"),
        concat(lit("k-"), (col("id") % 5).cast("string")).alias("shardingKey"),
    )
    (
        rows.write.format("rocketq")
        .option("nameserver", nameserver(env))
        .option("topic", "spark-shard-out")
        .mode("append")
        .save()
    )
    got = read_rows(spark, env, "spark-shard-out")
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


RECOVER_TOPIC = "spark-sink-recover"


def rows(prefix: str, n: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"body": [f"{prefix}{i:04d}".encode() for i in range(n)]})]


def stored(c: Cluster) -> list[bytes]:
    """Every body in the topic (all queues, from their first offset)."""
    client = _client.client(nameserver(c), "spark-recover-reader")
    out: list[bytes] = []
    for mq in client.queues(RECOVER_TOPIC):
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
            page = await admin.half_messages(topic=RECOVER_TOPIC, max_num=1000)
            return sum(1 for h in page.messages if h.message.properties.get(PROP_QUERY) == query)

    return asyncio.run(go())


def test_check_backs_finish_a_recorded_batch_and_roll_back_the_rest(env: Cluster) -> None:
    create_topic(env, RECOVER_TOPIC, queues=2)
    opts = sink_options(
        {"nameserver": nameserver(env), "topic": RECOVER_TOPIC, "producerGroup": "spark-recover-pg"}
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
