"""A reference Spark pipeline over RocketQ: order events -> per-customer totals per minute.

    python examples/orders_pipeline.py --nameserver 127.0.0.1:9876 --work /tmp/orders \\
        [--orders orders] [--results order-totals] [--produce 1000]

Order events are JSON bodies on the topic ``--orders``:
``{"order": "o-1", "customer": "c-3", "amount": 12.5, "ts": 1767225600000}`` (``ts`` in ms, the
event time). The pipeline reads them with ``format("rocketq")``, keeps a 10 s watermark on the
event time, sums each customer's orders per one-minute window, and writes every finished window
once, in append mode, to two places:

- Parquet files under ``WORK/parquet`` (Spark's file sink: exactly once through its own log);
- the results topic ``--results`` as JSON bodies (rocketq's sink: exactly once through half
  messages and the commit record, see rocketq.spark.sink), tagged with the customer.

Each query keeps its checkpoint under ``WORK/checkpoints``; kill the process at any moment
(SIGKILL included) and start it again with the same ``--work``: it resumes from the checkpoints
without losing or repeating a window. ``--produce N`` first sends N random order events (handy
for a demo: the events span a few minutes of event time from now, and a last event far ahead
closes every window).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as fn

from rocketq import SyncProducer
from rocketq.client.producer import ProducerConfig
from rocketq.message import Message
from rocketq.spark import register

ORDER_SCHEMA = "order string, customer string, amount double, ts long"
WATERMARK = "10 seconds"
WINDOW = "1 minute"
TRIGGER = "2 seconds"


def produce(nameserver: str, topic: str, count: int) -> None:
    """``count`` random order events over five minutes of event time, then one far ahead."""
    start_ms = int(time.time() * 1000)
    rng = random.Random(7)
    producer = SyncProducer(ProducerConfig(group="orders-pipeline-demo", namesrv_addrs=nameserver))
    producer.start()
    try:
        for i in range(count):
            event = {
                "order": f"o-{i}",
                "customer": f"c-{rng.randrange(5)}",
                "amount": round(rng.uniform(1, 100), 2),
                "ts": start_ms + i * 300_000 // max(count, 1),
            }
            producer.send(Message(topic=topic, body=json.dumps(event).encode()))
        closing = {"order": "close", "customer": "-", "amount": 0.0, "ts": start_ms + 3_600_000}
        producer.send(Message(topic=topic, body=json.dumps(closing).encode()))
    finally:
        producer.close()


def session() -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        # local[2,4]: two cores, and a failed task is tried up to 4 times (plain local[N] never
        # retries); the rocketq sink stays exactly once across those retries.
        SparkSession.builder.master("local[2,4]")
        .appName("orders-pipeline")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def totals(spark: SparkSession, nameserver: str, orders: str) -> DataFrame:
    """Finished per-customer, per-minute totals (the watermark decides when a window ends)."""
    events = (
        spark.readStream.format("rocketq")
        .option("nameserver", nameserver)
        .option("topic", orders)
        .option("startingOffsets", "earliest")
        .load()
        .select(fn.from_json(fn.col("body").cast("string"), ORDER_SCHEMA).alias("e"))
        .select("e.*")
        .withColumn("eventTime", fn.timestamp_millis("ts"))
    )
    return (
        # No filter before the aggregation: Spark pushes filters below the watermark, and a
        # dropped closing event would then not move it. The closing event's own window is
        # never finished (nothing comes after it), so it is never written.
        events.withWatermark("eventTime", WATERMARK)
        .groupBy(fn.window("eventTime", WINDOW).alias("w"), "customer")
        .agg(fn.count("*").alias("orders"), fn.round(fn.sum("amount"), 2).alias("amount"))
        .select(fn.col("w.start").alias("windowStart"), "customer", "orders", "amount")
    )


def run(nameserver: str, orders: str, results: str, work: Path) -> None:
    spark = session()
    parquet = (
        totals(spark, nameserver, orders)
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(work / "parquet"))
        .option("checkpointLocation", str(work / "checkpoints" / "parquet"))
        .trigger(processingTime=TRIGGER)
        .start()
    )
    topic = (
        totals(spark, nameserver, orders)
        .select(
            fn.to_json(fn.struct("windowStart", "customer", "orders", "amount")).alias("body"),
            fn.col("customer").alias("tags"),
        )
        .writeStream.format("rocketq")
        .outputMode("append")
        .option("nameserver", nameserver)
        .option("topic", results)
        .option("checkpointLocation", str(work / "checkpoints" / "topic"))
        .trigger(processingTime=TRIGGER)
        .start()
    )
    print("orders pipeline running", flush=True)
    spark.streams.awaitAnyTermination()
    for query in (parquet, topic):
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nameserver", required=True)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--orders", default="orders")
    parser.add_argument("--results", default="order-totals")
    parser.add_argument("--produce", type=int, default=0)
    args = parser.parse_args()
    if args.produce:
        produce(args.nameserver, args.orders, args.produce)
    run(args.nameserver, args.orders, args.results, args.work)


if __name__ == "__main__":
    main()
