"""rocketq.spark throughput on a local[2] SparkSession: measured and printed, never asserted.

    python -m tools.bench.spark_bench [--namesrv HOST:PORT] [--messages N] [--quick]
    python -m tools.bench.spark_bench --namesrv HOST:PORT --sink-only [--messages N]

Without ``--namesrv`` it starts a local RocketQ (``rocketq dev up``, as
:mod:`tools.bench.messaging_bench` does) and stops it afterwards. It fills one 8-queue topic
with N messages of 1 KiB, then on local[2] (the issue's goal: >= 100 000 msgs/s read):

| run                 | what is timed                                                      |
|---------------------|--------------------------------------------------------------------|
| read, no Spark      | the reader's ``read()`` of every queue in turn in this process     |
|                     | (pulls and Arrow batches: one Python worker's ceiling)             |
| batch read -> noop  | ``spark.read.format("rocketq")`` of the whole topic into ``noop``   |
| stream read -> noop | a Trigger.AvailableNow query over the topic into ``noop``           |
| parquet -> noop     | the same rows, written once to Parquet, read back into ``noop``     |
| sink                | ``df.write.format("rocketq")`` of N/4 rows (batch halves, commit)   |

"rocketq/parquet" is the read's time over Parquet's. Figures include Spark's job overhead
(seconds per job on a loaded 2-core machine), so small N understates throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from rocketq.cli._bench import ensure_topic
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message
from rocketq.spark import register
from rocketq.spark.options import source_options
from rocketq.spark.reader import SCHEMA_TYPE, RocketQBatchReader, read_range
from tools.bench.messaging_bench import _start_local, _stop_local

TOPIC = "spark-bench"
QUEUES = 8
BODY_BYTES = 1024
SEND_BATCH = 256


async def fill(namesrv: tuple[str, ...], count: int) -> float:
    """Send ``count`` 1 KiB messages (batches of 256); seconds taken."""
    await ensure_topic(namesrv, TOPIC, QUEUES)
    body = os.urandom(BODY_BYTES)
    started = time.perf_counter()
    async with Producer(ProducerConfig(f"spark-bench-{os.getpid()}", namesrv)) as p:
        sends = []
        for i in range(0, count, SEND_BATCH):
            n = min(SEND_BATCH, count - i)
            sends.append(p.send_batch([Message(TOPIC, body) for _ in range(n)]))
            if len(sends) >= 8:
                await asyncio.gather(*sends)
                sends = []
        await asyncio.gather(*sends)
    return time.perf_counter() - started


def session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def timed(what: str, rows: int, run: Any) -> float:
    started = time.perf_counter()
    run()
    took = time.perf_counter() - started
    print(f"{what:<22} {rows:>9} rows {took:>8.2f} s {rows / took:>12,.0f} msgs/s", flush=True)
    return took


def worker_read(namesrv: str, count: int) -> None:
    """What one Spark Python worker does per task, without Spark: pulls turned into Arrow."""
    opts = source_options({"nameserver": namesrv, "topic": TOPIC, "startingOffsets": "earliest"})
    reader = RocketQBatchReader(opts, SCHEMA_TYPE)
    schema = to_arrow_schema(SCHEMA_TYPE, timezone="UTC")

    def run() -> None:
        rows = sum(b.num_rows for p in reader.partitions() for b in read_range(p, schema))
        assert rows == count, f"read {rows} rows, expected {count}"

    timed("read, no Spark", count, run)


def suite(namesrv: str, count: int, work: Path) -> None:
    worker_read(namesrv, count)
    spark = session()
    reads(spark, namesrv, count, work)
    sink(spark, namesrv, count)
    spark.stop()


def reads(spark: Any, namesrv: str, count: int, work: Path) -> None:
    read = spark.read.format("rocketq").option("nameserver", namesrv).option("topic", TOPIC)
    timed(
        "batch read -> noop",
        count,
        lambda: read.load().write.format("noop").mode("overwrite").save(),
    )

    def stream() -> None:
        q = (
            spark.readStream.format("rocketq")
            .option("nameserver", namesrv)
            .option("topic", TOPIC)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    timed("stream read -> noop", count, stream)
    read.load().write.parquet(str(work / "parquet"))
    rq = timed(
        "batch read -> noop",
        count,
        lambda: read.load().write.format("noop").mode("overwrite").save(),
    )
    pq = timed(
        "parquet -> noop",
        count,
        lambda: (
            spark.read.parquet(str(work / "parquet")).write.format("noop").mode("overwrite").save()
        ),
    )
    print(f"rocketq/parquet time ratio: {rq / pq:.1f}", flush=True)


def sink(spark: Any, namesrv: str, count: int) -> None:
    """The sink's figures (sink2): N/4 rows of 1 KiB through ``write.format("rocketq")``, twice:
    the first job also starts the Python workers and their producers, the second finds them
    running (what every micro-batch after the first of a streaming query sees)."""
    sink_rows = max(count // 4, 1000)
    body = "x" * BODY_BYTES
    rows = spark.range(0, sink_rows, 1, 2).selectExpr(f"cast('{body}' as binary) as body")
    for what in ("sink (exactly once)", "sink, workers warm"):
        timed(
            what,
            sink_rows,
            lambda: (
                rows.write.format("rocketq")
                .option("nameserver", namesrv)
                .option("topic", TOPIC + "-out")
                .mode("append")
                .save()
            ),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namesrv", help="bench this cluster instead of starting one")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="20 000 messages, to see it work")
    parser.add_argument("--sink-only", action="store_true", help="time only the sink")
    args = parser.parse_args()
    count = 20_000 if args.quick else args.messages
    if args.sink_only:
        if not args.namesrv:
            parser.error("--sink-only needs --namesrv (a running cluster)")
        asyncio.run(ensure_topic((args.namesrv,), TOPIC + "-out", QUEUES))
        spark = session()
        sink(spark, args.namesrv, count)
        spark.stop()
        return
    base = Path(tempfile.mkdtemp(prefix="rocketq-spark-bench-"))
    try:
        namesrv: tuple[str, ...] = (args.namesrv,) if args.namesrv else ()
        if not namesrv:
            namesrv = _start_local(base / "cluster")
            print(f"local RocketQ at {namesrv[0]}, data in {base}", flush=True)
        took = asyncio.run(fill(namesrv, count))
        print(f"filled {TOPIC}: {count} x {BODY_BYTES} B in {took:.1f} s", flush=True)
        asyncio.run(ensure_topic(namesrv, TOPIC + "-out", QUEUES))  # the sink's target
        suite(namesrv[0], count, base / "spark")
    finally:
        if (base / "cluster" / "pids.json").exists():
            _stop_local(base / "cluster")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
