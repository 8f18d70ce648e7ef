"""Master-slave replication system tests (issue 7): real nameserver, master and slave processes.

* A load (several topics, every queue, batches of 32 and single sends, 256 KiB commitlog files
  so they roll) under ASYNC_MASTER and under SYNC_MASTER leaves the slave with commitlog files
  byte-identical to the master's (compared after both stopped cleanly), both stores consistent
  (services.store.inspect.verify), and every queue reads the same records from the slave as
  from the master. Under SYNC_MASTER every send is SEND_OK (the slave is in sync throughout).
* A slave SIGKILLed during a load and restarted on its store catches up to identical files.
* A slave refuses every write (UNAVAILABLE, reason NOT_MASTER, a message naming the slave
  role) while serving reads, and is in the topic's route under broker id 1.

Fault cases are in test_replication_failover.py (master killed) and test_replication_cut.py
(the network between master and slave cut by a proxy).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
)
from tests.integration.cluster import restart, start_nameserver
from tests.integration.replication_support import (
    Sent,
    assert_same_commitlogs,
    bodies_of,
    create_group,
    create_topics,
    read_all,
    runtime_stats,
    send_load,
    start_ha_slave,
    start_master,
    status_name,
    wait_in_sync,
    wait_master_view,
    wait_readable,
    wait_replicated,
)
from tests.support.raw_client import RawClient, refused

pytestmark = pytest.mark.integration

TOPICS = ["HaLoadA", "HaLoadB", "HaLoadC"]
QUEUES = 4
GROUP = "ha-reader"


def expected_by_queue(sent: list[Sent]) -> dict[tuple[str, int], list[bytes]]:
    out: dict[tuple[str, int], list[Sent]] = {}
    for s in sent:
        out.setdefault((s.topic, s.queue_id), []).append(s)
    return {k: [s.body for s in sorted(v, key=lambda s: s.queue_offset)] for k, v in out.items()}


async def check_reads(master: str, slave: str, sent: list[Sent]) -> None:
    """Every queue reads the same raw records from both brokers: the messages sent, in order."""
    reads = await wait_readable(master, slave, GROUP, TOPICS, QUEUES)
    expected = expected_by_queue(sent)
    for key, records in reads.items():
        assert bodies_of(records) == expected.get(key, []), f"queue {key} lost or reordered"


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER"])
async def test_load_leaves_byte_identical_commitlogs(tmp_path: Path, role: str) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(tmp_path, [ns.addr], brokerRole=role)
    slave = start_ha_slave(tmp_path, [ns.addr])

    try:
        await create_topics(master.addr, "broker-a", TOPICS, QUEUES)
        await create_group(master.addr, "broker-a", GROUP)
        await wait_in_sync(master.addr)
        sent = await send_load(
            master.addr, TOPICS, QUEUES, batches_per_queue=8, singles_per_queue=8
        )
        statuses = {status_name(s.status) for s in sent}
        assert statuses == {"SEND_OK"}, statuses
        end = await wait_replicated(master.addr, slave.addr, TOPICS, QUEUES)
        await check_reads(master.addr, slave.addr, sent)
        await wait_master_view(master.addr, end)
        assert len(sent) == len(TOPICS) * QUEUES * (8 * 32 + 8)
        assert end > 3 * 256 * 1024, "the load should roll several commitlog files"
        assert slave.stop() == 0
        assert master.stop() == 0
        assert_same_commitlogs(master.workdir / "store", slave.workdir / "store", end)
    finally:
        for sp in (slave, master, ns):
            sp.kill()


async def test_slave_killed_during_load_catches_up(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(tmp_path, [ns.addr])
    slaves = [start_ha_slave(tmp_path, [ns.addr])]
    total = len(TOPICS) * QUEUES * 16 * 32
    events: list[str] = []

    async def chaos(sent_so_far: int) -> None:
        if not events and sent_so_far >= total // 3:
            events.append(f"killed at {sent_so_far}")
            slaves[-1].kill()
        elif len(events) == 1 and sent_so_far >= 2 * total // 3:
            events.append(f"restarting at {sent_so_far}")  # the other senders go on meanwhile
            slaves.append(await asyncio.to_thread(restart, slaves[-1]))

    try:
        await create_topics(master.addr, "broker-a", TOPICS, QUEUES)
        await create_group(master.addr, "broker-a", GROUP)
        await wait_in_sync(master.addr)
        sent = await send_load(master.addr, TOPICS, QUEUES, batches_per_queue=16, on_progress=chaos)
        assert len(events) == 2, events
        end = await wait_replicated(master.addr, slaves[-1].addr, TOPICS, QUEUES)
        await check_reads(master.addr, slaves[-1].addr, sent)
        assert slaves[-1].stop() == 0
        assert master.stop() == 0
        assert_same_commitlogs(master.workdir / "store", slaves[-1].workdir / "store", end)
    finally:
        for sp in (*slaves, master, ns):
            sp.kill()


async def test_slave_refuses_writes_and_serves_reads(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(tmp_path, [ns.addr])
    slave = start_ha_slave(tmp_path, [ns.addr])
    topic = "HaRefuse"

    try:
        await create_topics(master.addr, "broker-a", [topic], 2)
        await create_group(master.addr, "broker-a", GROUP)
        await wait_in_sync(master.addr)
        sent = await send_load(master.addr, [topic], 2, batches_per_queue=1, batch_size=4)
        await wait_replicated(master.addr, slave.addr, [topic], 2)
        async with RawClient(slave.addr) as raw:
            msg = raw.messaging
            adm = raw.admin
            target = admin_pb2.ApplyTarget(broker_name="broker-a")
            tconf = common_pb2.TopicConfig(
                topic_name=topic, read_queue_nums=2, write_queue_nums=2, perm=6
            )
            writes = {
                "Send": msg.Send(
                    messaging_pb2.SendRequest(
                        producer_group="p",
                        queue_id=0,
                        messages=[common_pb2.Message(topic=topic, body=b"no")],
                    ),
                    timeout=5,
                ),
                # The master is reachable, so the slave does not take offsets either.
                "UpdateConsumerOffset": msg.UpdateConsumerOffset(
                    messaging_pb2.UpdateConsumerOffsetRequest(
                        consumer_group=GROUP, topic=topic, queue_id=0, commit_offset=1
                    ),
                    timeout=5,
                ),
                "ConsumerSendBack": msg.ConsumerSendBack(
                    messaging_pb2.ConsumerSendBackRequest(
                        consumer_group=GROUP, commitlog_offset=0, delay_level=1
                    ),
                    timeout=5,
                ),
                "LockBatch": msg.LockBatch(
                    messaging_pb2.LockBatchRequest(
                        consumer_group=GROUP,
                        client_id="127.0.0.1@1",
                        queues=[
                            common_pb2.MessageQueue(topic=topic, broker_name="broker-a", queue_id=0)
                        ],
                    ),
                    timeout=5,
                ),
                "EndTransaction": msg.EndTransaction(
                    messaging_pb2.EndTransactionRequest(
                        producer_group="p",
                        commitlog_offset=0,
                        resolution=messaging_pb2.TRANSACTION_COMMIT,
                    ),
                    timeout=5,
                ),
                "CreateTopic": adm.CreateTopic(
                    admin_pb2.CreateTopicRequest(target=target, config=tconf), timeout=5
                ),
                "UpdateTopic": adm.UpdateTopic(
                    admin_pb2.UpdateTopicRequest(target=target, config=tconf), timeout=5
                ),
                "DeleteTopic": adm.DeleteTopic(
                    admin_pb2.DeleteTopicRequest(target=target, topic=topic), timeout=5
                ),
                "CreateSubscriptionGroup": adm.CreateSubscriptionGroup(
                    admin_pb2.CreateSubscriptionGroupRequest(
                        target=target,
                        config=common_pb2.SubscriptionGroupConfig(group_name="g-new"),
                    ),
                    timeout=5,
                ),
                "DeleteSubscriptionGroup": adm.DeleteSubscriptionGroup(
                    admin_pb2.DeleteSubscriptionGroupRequest(target=target, group_name=GROUP),
                    timeout=5,
                ),
            }
            bad = {}
            for name, call in writes.items():
                code, reason, text = await refused(call)
                if not (
                    code == grpc.StatusCode.UNAVAILABLE
                    and reason == common_pb2.NOT_MASTER
                    and "slave" in text.lower()
                ):
                    bad[name] = (code, common_pb2.ErrorReason.Name(reason), text)  # type: ignore[arg-type]
            assert not bad, f"writes a slave did not refuse as NOT_MASTER: {bad}"

            # Reads work, and the refused writes changed nothing.
            stats = await runtime_stats(slave.addr)
            assert stats.role == admin_pb2.SLAVE and stats.broker_id == 1
            got = await read_all(slave.addr, GROUP, [topic], 2)
            assert sorted(b for r in got.values() for b in bodies_of(r)) == sorted(
                s.body for s in sent
            )
            topics = await adm.ListTopics(admin_pb2.ListTopicsRequest(), timeout=5)
            assert topic in str(topics)
        async with RawClient(ns.addr) as raw:
            route = await raw.nameserver.GetRouteInfoByTopic(
                nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5
            )
        addrs = {b.broker_name: dict(b.broker_addrs) for b in route.route.brokers}
        assert addrs["broker-a"] == {0: master.addr, 1: slave.addr}
    finally:
        for sp in (slave, master, ns):
            sp.kill()
