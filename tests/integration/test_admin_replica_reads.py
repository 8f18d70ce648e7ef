"""Admin reads while a group's master is down (issue 15, part 2).

The nameserver keeps a SIGKILLed master in routes and cluster info for up to 120 s, so a read
that asks "the master" keeps failing although its slave holds every acknowledged message. Every
read-only admin call - topic describe, group describe (consume stats, members), message query
and view, the dead-letter list - moves on to a live slave within the call's timeout, and says
which replica answered (``Admin.replica_fallbacks``; the CLI prints a note on stderr).

Real processes: a nameserver, broker-a's master and its slave (ASYNC_MASTER), the SDK and the
installed ``rocketq`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rocketq import Message, Producer, ProducerConfig, SendResult
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.errors import TopicNotFoundError
from tests.integration.cluster import ServiceProcess, start_nameserver
from tests.integration.replication_support import (
    start_ha_slave,
    start_master,
    wait_in_sync,
    wait_replicated,
)
from tests.support.cli import rocketq
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "ReplicaReads"
GROUP = "replica-reads"
QUEUES = 4
MESSAGES = 8


@dataclass
class Replicated:
    namesrv: ServiceProcess
    master: ServiceProcess
    slave: ServiceProcess
    sent: list[SendResult]


@pytest.fixture
async def master_killed(tmp_path: Path) -> AsyncIterator[Replicated]:
    """broker-a's master and slave with :data:`MESSAGES` keyed messages on both; then the
    master is SIGKILLed (the nameserver still lists it)."""
    namesrv = start_nameserver(tmp_path)
    started = [namesrv]
    try:
        master = start_master(tmp_path, [namesrv.addr])
        started.append(master)
        slave = start_ha_slave(tmp_path, [namesrv.addr])
        started.append(slave)
        await wait_in_sync(master.addr)
        sent = await produce(namesrv.addr)
        await wait_replicated(master.addr, slave.addr, [TOPIC], QUEUES)
        master.kill()
        yield Replicated(namesrv, master, slave, sent)
    finally:
        for sp in reversed(started):
            if sp.alive():
                with contextlib.suppress(AssertionError):
                    sp.stop(timeout_s=15)


async def produce(namesrv: str) -> list[SendResult]:
    async with Admin([namesrv]) as admin:
        [created] = await admin.create_topic(TopicConfig(TOPIC, QUEUES, QUEUES), broker="broker-a")
        assert created.ok, created

        async def routed() -> bool:
            with contextlib.suppress(TopicNotFoundError):
                return bool((await admin.route(TOPIC)).queues)
            return False

        await until(routed, f"the route of {TOPIC}", 15)
    async with Producer(ProducerConfig("replica-reads-pg", [namesrv])) as producer:
        return [
            await producer.send(Message(TOPIC, f"body-{i}".encode(), keys=f"k-{i}"))
            for i in range(MESSAGES)
        ]


def answered_by_slave(admin: Admin) -> bool:
    """Every read since the last look was answered by slave 1 of broker-a; clears the list."""
    fallbacks, admin.replica_fallbacks[:] = list(admin.replica_fallbacks), []
    return bool(fallbacks) and all(
        (f.broker_name, f.replica_id) == ("broker-a", 1) for f in fallbacks
    )


async def test_reads_are_answered_by_the_slave(master_killed: Replicated) -> None:
    c = master_killed
    async with Admin([c.namesrv.addr]) as admin:
        desc = await admin.describe_topic(TOPIC)
        assert not desc.errors, desc.errors
        [broker] = desc.brokers
        assert broker.broker_addr == c.slave.addr
        assert sum(q.max_offset for q in broker.queues) == MESSAGES
        assert answered_by_slave(admin)

        [by_key] = await admin.query_by_key(TOPIC, "k-3", 0, None, 32)
        assert by_key.body == b"body-3"
        [by_id] = await admin.query_by_id(TOPIC, c.sent[5].msg_id)
        assert by_id.body == b"body-5"
        assert answered_by_slave(admin)

        viewed = await admin.view_message(c.sent[6].offset_msg_id)
        assert viewed.body == b"body-6" and viewed.broker_name == "broker-a"
        assert answered_by_slave(admin)

        stats = await admin.consume_stats(GROUP, TOPIC)
        assert not stats.errors, stats.errors
        letters = await admin.dead_letters(GROUP, None, None, 10)
        assert not letters.errors, letters.errors
        assert answered_by_slave(admin)


async def test_cli_topic_describe_says_which_replica_answered(master_killed: Replicated) -> None:
    c = master_killed
    proc = await asyncio.to_thread(
        rocketq, "topic", "describe", TOPIC, "-n", c.namesrv.addr, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert f"answered by slave 1 at {c.slave.addr}" in proc.stderr
    assert f"the master {c.master.addr} did not answer" in proc.stderr
    assert c.slave.addr in proc.stdout
