"""A clean shutdown and restart keeps topics, groups, offsets and messages (issue 3).

Raw gRPC against real processes: create a topic and a group, send, commit an offset, stop the
broker with SIGTERM, start it again on the same store, and read everything back. A second test
does the same after SIGKILL for the messages (offsets may lag by up to one persist interval,
which is RocketMQ's documented behaviour; messages acknowledged under SYNC_FLUSH are never lost).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
)
from rocketq.message import decode_records
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.integration

TOPIC = "RestartTopic"
GROUP = "restart-group"


async def _setup_and_send(addr: str, count: int) -> list[str]:
    async with RawClient(addr) as rc:
        admin = rc.admin
        await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=TOPIC, read_queue_nums=2, write_queue_nums=2, perm=6
                ),
            )
        )
        await admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.SubscriptionGroupConfig(group_name=GROUP, retry_max_times=3),
            )
        )
        msg = rc.messaging
        ids = []
        for i in range(count):
            resp = await msg.Send(
                messaging_pb2.SendRequest(
                    producer_group="p",
                    queue_id=i % 2,
                    messages=[
                        common_pb2.Message(
                            topic=TOPIC, body=f"m{i}".encode(), properties={"KEYS": f"k{i}"}
                        )
                    ],
                )
            )
            ids.append(resp.results[0].msg_id)
        await msg.UpdateConsumerOffset(
            messaging_pb2.UpdateConsumerOffsetRequest(
                consumer_group=GROUP, topic=TOPIC, queue_id=0, commit_offset=3
            )
        )
        return ids


async def _read_back(
    addr: str,
) -> tuple[list[bytes], int, admin_pb2.ListSubscriptionGroupsResponse]:
    async with RawClient(addr) as rc:
        msg = rc.messaging
        bodies: list[bytes] = []
        for qid in (0, 1):
            resp = await msg.Pull(
                messaging_pb2.PullRequest(
                    consumer_group=GROUP,
                    topic=TOPIC,
                    queue_id=qid,
                    queue_offset=0,
                    max_msg_nums=64,
                    sys_flag=0x4,
                    subscription="*",
                )
            )
            bodies += [m.body for m in decode_records(resp.records)]
        try:
            stored = await msg.QueryConsumerOffset(
                messaging_pb2.QueryConsumerOffsetRequest(
                    consumer_group=GROUP, topic=TOPIC, queue_id=0
                )
            )
            offset = stored.offset
        except grpc.aio.AioRpcError as exc:  # after a SIGKILL the 5 s persist may not have run
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            offset = -1
        groups = await rc.admin.ListSubscriptionGroups(admin_pb2.ListSubscriptionGroupsRequest())
        return bodies, offset, groups


async def _route(namesrv: str) -> nameserver_pb2.GetRouteInfoByTopicResponse:
    async with RawClient(namesrv) as rc:
        return await rc.route(TOPIC)


async def test_clean_restart_keeps_topics_groups_offsets_and_messages(tmp_path: Path) -> None:
    with cluster(tmp_path) as c:
        broker = c.brokers[0]
        await _setup_and_send(broker.addr, 10)
        assert broker.stop() == 0
        again = c.restart(broker)
        try:
            bodies, offset, groups = await _read_back(again.addr)
            assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(10))
            assert offset == 3
            mine = [g for g in groups.groups if g.group_name == GROUP]
            assert mine and mine[0].retry_max_times == 3
            route = await _route(c.namesrv_addrs[0])
            assert [q.write_queue_nums for q in route.route.queues] == [2]
            assert (again.workdir / "store" / "abort").exists()  # running: not clean yet
        finally:
            assert again.stop() == 0
        assert not (again.workdir / "store" / "abort").exists()


async def test_killed_broker_restarts_with_its_messages(tmp_path: Path) -> None:
    with cluster(tmp_path, broker_keys={"flushDiskType": "SYNC_FLUSH"}) as c:
        broker = c.brokers[0]
        await _setup_and_send(broker.addr, 10)
        broker.kill()
        again = c.restart(broker)
        try:
            bodies, _, _ = await _read_back(again.addr)
            assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(10))
        finally:
            again.stop()
