"""What a slave holds, and when: the state a failover would promote.

* A SYNC_MASTER acknowledges a ConsumerSendBack only once an in-sync slave holds the copy. The
consumer moves its offset past a message once its send-back succeeds, so a retry copy that
only the master held would be lost with the master. The slave is paused (SIGSTOP) while the
send-back is in flight: the call must still be waiting a second later (an unreplicated copy is
not acknowledged), and once the slave runs again the call succeeds and the slave's commitlog
already ends past the copy when the answer arrives.
* A topic or subscription group created on the master is on the slave at once (the master's
  ConfirmOffset carries a config version; the slave syncs when it changes), not only at the
  slave's next ``slaveSyncConfigInterval`` round (set to 10 minutes here).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from tests.integration.cluster import start_nameserver
from tests.integration.replication_support import (
    create_group,
    create_topics,
    runtime_stats,
    start_ha_slave,
    start_master,
    wait_in_sync,
)
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "HaSendBack"
GROUP = "ha-send-back"


async def test_sync_master_send_back_waits_for_the_slave(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(tmp_path, [ns.addr], brokerRole="SYNC_MASTER", syncFlushTimeout=20000)
    slave = start_ha_slave(tmp_path, [ns.addr])

    try:
        await create_topics(master.addr, "broker-a", [TOPIC], 1)
        await create_group(master.addr, "broker-a", GROUP)
        await wait_in_sync(master.addr)
        async with RawClient(master.addr) as c:
            stub = c.messaging
            sent = await stub.Send(
                messaging_pb2.SendRequest(
                    producer_group="p",
                    queue_id=0,
                    messages=[common_pb2.Message(topic=TOPIC, body=b"fails once")],
                ),
                timeout=10,
            )
            assert sent.results[0].status == messaging_pb2.SEND_OK
            offset = int(sent.results[0].offset_msg_id[-16:], 16)
            slave.pause()
            try:
                call = asyncio.ensure_future(
                    stub.ConsumerSendBack(
                        messaging_pb2.ConsumerSendBackRequest(
                            consumer_group=GROUP, commitlog_offset=offset, delay_level=1
                        ),
                        timeout=30,
                    )
                )
                done, _ = await asyncio.wait({call}, timeout=1.5)
                assert not done, "send-back acknowledged while the only slave was paused"
            finally:
                slave.resume()
            await asyncio.wait_for(call, 25)
        master_end = (await runtime_stats(master.addr)).commitlog_max_offset
        slave_end = (await runtime_stats(slave.addr)).commitlog_max_offset
        assert slave_end >= master_end > offset, (master_end, slave_end)
    finally:
        for sp in (slave, master, ns):
            sp.kill()


async def _slave_tables(addr: str) -> tuple[set[str], set[str]]:
    async with RawClient(addr) as c:
        stub = c.admin
        topics = await stub.ListTopics(admin_pb2.ListTopicsRequest(), timeout=5)
        groups = await stub.ListSubscriptionGroups(
            admin_pb2.ListSubscriptionGroupsRequest(), timeout=5
        )
    return {t.topic_name for t in topics.topics}, {g.group_name for g in groups.groups}


async def test_new_topic_and_group_reach_the_slave_at_once(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(tmp_path, [ns.addr])
    slave = start_ha_slave(tmp_path, [ns.addr], slaveSyncConfigInterval=600_000)

    try:
        await wait_in_sync(master.addr)
        # The first sync runs as the stream connects (before the slave is in sync); once the
        # slave's tables match the master's, what follows can only come from the version change.

        async def first_sync_done() -> bool:
            return await _slave_tables(slave.addr) == await _slave_tables(master.addr)

        await until(first_sync_done, "the slave's tables to match the master's", timeout_s=5)
        await create_topics(master.addr, "broker-a", ["HaFreshTopic"], 2)
        await until(
            lambda: _has(slave.addr, "HaFreshTopic", None), "the topic on the slave", timeout_s=5
        )
        await _make_fifo(master.addr, "HaFreshTopic")  # a field of this round: synced too
        await until(
            lambda: _message_type(slave.addr, "HaFreshTopic", common_pb2.FIFO),
            "the topic's message type on the slave",
            timeout_s=5,
        )
        await create_group(master.addr, "broker-a", "ha-fresh-group")
        await until(
            lambda: _has(slave.addr, None, "ha-fresh-group"), "the group on the slave", timeout_s=5
        )
    finally:
        for sp in (slave, master, ns):
            sp.kill()


async def _has(addr: str, topic: str | None, group: str | None) -> bool:
    topics, groups = await _slave_tables(addr)
    return (topic is None or topic in topics) and (group is None or group in groups)


async def _make_fifo(addr: str, topic: str) -> None:
    async with RawClient(addr) as c:
        await c.admin.UpdateTopic(
            admin_pb2.UpdateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=topic,
                    read_queue_nums=2,
                    write_queue_nums=2,
                    perm=6,
                    message_type=common_pb2.FIFO,
                ),
            ),
            timeout=5,
        )


async def _message_type(addr: str, topic: str, expected: int) -> bool:
    async with RawClient(addr) as c:
        desc = await c.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic=topic), timeout=5)
    return desc.config.message_type == expected
