"""Reading with Spark when the cluster loses something (issue 18): offsets deleted by retention
before the query read them (failOnDataLoss both ways), and the master of a broker group down
(the queue is read from its slave).

One broker group (a master and its slave) with 64 KiB commitlog files, so a few hundred 1 KiB
messages roll several files, and retention that looks every 200 ms once a test turns it on at
runtime (fileReservedTime 0, every hour a delete hour)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq import Admin
from rocketq._api.rocketq.v1 import messaging_pb2
from tests.integration.spark.conftest import create_topic, nameserver, produce
from tests.integration.spark.test_spark_read import bodies_of, run_available_now, stream
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until_sync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SMALL_FILES = {"mappedFileSizeCommitLog": 64 * 1024, "cleanResourceInterval": 200}
EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("spark-faults")
    with cluster(root, brokers=1, slaves=1, broker_keys=SMALL_FILES, slave_keys=SMALL_FILES) as c:
        yield c


def queue_offset(addr: str, topic: str, which: str) -> int:
    """The min or max offset of ``topic``'s queue 0 on the broker at ``addr``."""

    async def go() -> int:
        async with RawClient(addr) as rc:
            if which == "min":
                req = messaging_pb2.GetMinOffsetRequest(topic=topic, queue_id=0)
                return int((await rc.messaging.GetMinOffset(req)).offset)
            req2 = messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=0)
            return int((await rc.messaging.GetMaxOffset(req2)).offset)

    return asyncio.run(go())


def set_retention(c: Cluster, hours: str, when: str) -> None:
    async def go() -> None:
        async with Admin(c.namesrv_addrs, timeout_ms=5000) as admin:
            await admin.update_broker_config(
                c.brokers[0].addr, {"fileReservedTime": hours, "deleteWhen": when}
            )

    asyncio.run(go())


def test_offsets_deleted_by_retention_fail_the_query_or_are_skipped(
    env: Cluster, spark: Any, tmp_path: Path
) -> None:
    topic = "spark-loss"
    create_topic(env, topic, queues=1)
    sent = [f"early-{i}".encode() for i in range(5)]
    produce(env, topic, sent)
    ck = tmp_path / "ck"
    reader = stream(spark, env, topic, startingOffsets="earliest")
    assert run_available_now(spark, reader, ck, "loss_1") == [5]
    # While the query is stopped, 300 more messages roll several 64 KiB files and retention
    # deletes every file but the newest: offsets 5.. the query has not read are gone.
    later = [f"late-{i:03d}-".encode() + b"x" * 1024 for i in range(300)]
    produce(env, topic, later)
    sent += later
    master = env.brokers[0].addr
    set_retention(env, "0", EVERY_HOUR)
    lowest = until_sync(
        lambda: queue_offset(master, topic, "min") > 5 and queue_offset(master, topic, "min"),
        "retention deleted the unread offsets",
        30,
    )
    set_retention(env, "72", "04")  # nothing more goes while the query reads
    lowest = queue_offset(master, topic, "min")
    assert 5 < lowest < len(sent)

    # failOnDataLoss=true (the default): the restarted query fails, naming the queue.
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    lost = f"queue {topic}@broker-a#0: offsets 5..{lowest - 1} are no longer stored"
    with pytest.raises(Exception, match=re.escape(lost) + ".*set failOnDataLoss=false"):
        query.awaitTermination(180)

    # failOnDataLoss=false: the same checkpoint skips the lost offsets and reads what is left.
    lenient = stream(spark, env, topic, startingOffsets="earliest", failOnDataLoss="false")
    assert sum(run_available_now(spark, lenient, ck, "loss_2")) == len(sent) - lowest
    # The output holds the first run's rows and then only what retention left.
    assert bodies_of(spark, "loss_2") == sorted(sent[:5] + sent[lowest:])


def test_a_queue_is_read_from_the_slave_while_its_master_is_down(env: Cluster, spark: Any) -> None:
    topic = "spark-slave-read"
    create_topic(env, topic, queues=1)
    sent = [f"s{i:02d}".encode() for i in range(20)]
    produce(env, topic, sent)
    slave = env.slaves[0].addr

    def caught_up() -> bool:
        try:
            return queue_offset(slave, topic, "max") == 20
        except grpc.RpcError as exc:  # NOT_FOUND until the slave syncs the topic's config
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return False

    until_sync(caught_up, "the slave caught up", 30)
    env.brokers[0].kill()  # the last test of the module: the master stays down
    rows = (
        spark.read.format("rocketq")
        .option("nameserver", nameserver(env))
        .option("topic", topic)
        .load()
        .collect()
    )
    assert sorted(bytes(r.body) for r in rows) == sorted(sent)
