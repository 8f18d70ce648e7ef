"""Shared pieces of the Spark tests: one SparkSession for the whole directory (it takes 6-20 s
to start on a loaded 2-core machine), local[2,2] so failed tasks are retried once, pinned to
loopback, with rocketq.spark registered; a cluster per module; helpers that produce through the
real SDK."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketq import Admin, SyncProducer
from rocketq.client.admin import TopicConfig
from rocketq.client.producer import ProducerConfig
from rocketq.message import Message
from tests.support.cluster import Cluster, cluster


def spark_session(master: str = "local[2]") -> Any:
    from pyspark.sql import SparkSession

    from rocketq.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master(master)
        .appName("rocketq-spark-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "20s")
        # A loaded CI machine can take longer than the default 15 s to start a Python worker.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    # Spark gives a new Python worker a fixed 10 s to connect back; on a loaded machine the
    # first cold start of Python + pyspark can take longer. One small job warms the page cache
    # (and the worker daemon) before the tests start their streaming readers.
    spark.sparkContext.parallelize([1, 2], 2).map(lambda x: x + 1).collect()
    return spark


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    session = spark_session("local[2,2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A nameserver and two broker groups (queues spread over both)."""
    root: Path = tmp_path_factory.mktemp("spark")
    keys = {"transactionTimeout": 2000, "transactionCheckInterval": 500}
    with cluster(root, brokers=2, broker_keys=keys) as c:
        yield c


def create_topic(c: Cluster, topic: str, queues: int = 2) -> None:
    async def go() -> None:
        async with Admin(c.namesrv_addrs, timeout_ms=5000) as admin:
            await admin.create_topic(TopicConfig(topic, queues, queues))

    asyncio.run(go())


def produce(c: Cluster, topic: str, bodies: list[bytes], tags: str = "") -> None:
    p = SyncProducer(ProducerConfig(group="spark-test-producer", namesrv_addrs=c.namesrv_addrs))
    p.start()
    try:
        for body in bodies:
            p.send(Message(topic=topic, body=body, tags=tags))
    finally:
        p.close()


def nameserver(c: Cluster) -> str:
    return c.namesrv_addrs[0]
