"""Admin service against real processes (admin.proto; SPEC §4.3, §6.12, §6.14).

Topics in broker mode and in cluster mode (two masters, both get the change, the nameserver's
route shows both and drops a deleted topic), read/write queue counts, subscription groups,
consumer progress and offset resets (with a live member told over its ClientStream), broker
config updates that survive a restart, and the errors of each RPC.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
)
from rocketq.client.errors import from_rpc_error
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

OK, NOT_FOUND, ALREADY_EXISTS = 0, 5, 6


def here(name: str = "broker-a") -> admin_pb2.ApplyTarget:
    return admin_pb2.ApplyTarget(broker_name=name)


def in_cluster(name: str = "DefaultCluster") -> admin_pb2.ApplyTarget:
    return admin_pb2.ApplyTarget(cluster_name=name)


def topic_config(name: str, read: int = 4, write: int = 4, perm: int = 6) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(
        topic_name=name, read_queue_nums=read, write_queue_nums=write, perm=perm
    )


def codes(results: Any) -> list[tuple[str, int]]:
    return [(r.broker_name, r.status_code) for r in results]


async def expect_error(
    call: Awaitable[Any], code: grpc.StatusCode, reason: str | None = None
) -> str:
    """Await a call that must fail with ``code`` (and ErrorDetail ``reason``); return its text."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    err = info.value
    assert err.code() == code, err.details()
    if reason is not None:
        assert from_rpc_error(err).reason == reason, err.details()
    return str(err.details())


async def route(namesrv: str, topic: str) -> nameserver_pb2.TopicRouteData | None:
    async with RawClient(namesrv) as rc:
        try:
            resp = await rc.nameserver.GetRouteInfoByTopic(
                nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        out: nameserver_pb2.TopicRouteData = resp.route
        return out


async def route_queues(namesrv: str, topic: str) -> dict[str, tuple[int, int, int]]:
    """broker name -> (read, write, perm) in the nameserver's route; {} when there is none."""
    r = await route(namesrv, topic)
    if r is None:
        return {}
    return {q.broker_name: (q.read_queue_nums, q.write_queue_nums, q.perm) for q in r.queues}


async def send(addr: str, topic: str, queue_id: int, count: int) -> None:
    async with RawClient(addr) as rc:
        stub = rc.messaging
        for i in range(count):
            resp = await stub.Send(
                messaging_pb2.SendRequest(
                    producer_group="admin-test-producer",
                    queue_id=queue_id,
                    messages=[common_pb2.Message(topic=topic, body=f"m{i}".encode())],
                ),
                timeout=5,
            )
            assert resp.results, resp


# -- topics, broker mode ---------------------------------------------------------------------


async def test_topic_lifecycle_broker_mode(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        await _topic_lifecycle(c.brokers[0].addr, c.namesrv_addrs[0])


async def _topic_lifecycle(addr: str, namesrv: str) -> None:
    async with RawClient(addr) as rc:
        admin = rc.admin
        resp = await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(target=here(), config=topic_config("orders"))
        )
        assert codes(resp.results) == [("broker-a", OK)]
        assert resp.results[0].broker_addr == addr
        again = await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(target=here(), config=topic_config("orders"))
        )
        assert codes(again.results) == [("broker-a", ALREADY_EXISTS)]
        assert "exists" in again.results[0].error_message

        async def routed(expected: dict[str, tuple[int, int, int]]) -> bool:
            return await route_queues(namesrv, "orders") == expected

        await until(lambda: routed({"broker-a": (4, 4, 6)}))

        desc = await admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="orders"))
        assert desc.broker_name == "broker-a"
        assert desc.config.topic_name == "orders"
        assert [q.queue_id for q in desc.queues] == [0, 1, 2, 3]
        assert all(q.max_offset == 0 and q.last_update_timestamp_ms == 0 for q in desc.queues)

        before_ms = int(time.time() * 1000)
        await send(addr, "orders", 1, 3)
        desc = await admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="orders"))
        q1 = desc.queues[1]
        assert (q1.min_offset, q1.max_offset) == (0, 3)
        assert before_ms - 1000 <= q1.last_update_timestamp_ms <= int(time.time() * 1000) + 1000

        # write 8 / read 4: eight queues exist, producers use 8, consumers read 4 (SPEC §4.3)
        upd = await admin.UpdateTopic(
            admin_pb2.UpdateTopicRequest(target=here(), config=topic_config("orders", 4, 8))
        )
        assert codes(upd.results) == [("broker-a", OK)]
        desc = await admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="orders"))
        assert (desc.config.read_queue_nums, desc.config.write_queue_nums) == (4, 8)
        assert [q.queue_id for q in desc.queues] == list(range(8))
        assert desc.queues[1].max_offset == 3  # messages survive an update
        await until(lambda: routed({"broker-a": (4, 8, 6)}))

        missing = await admin.UpdateTopic(
            admin_pb2.UpdateTopicRequest(target=here(), config=topic_config("nope"))
        )
        assert codes(missing.results) == [("broker-a", NOT_FOUND)]

        listed = await admin.ListTopics(admin_pb2.ListTopicsRequest())
        assert [t.topic_name for t in listed.topics] == ["orders"]
        everything = await admin.ListTopics(admin_pb2.ListTopicsRequest(include_system_topics=True))
        names = [t.topic_name for t in everything.topics]
        assert names == sorted(names)
        assert {"orders", "TBW102", "SELF_TEST_TOPIC", "DefaultCluster", "broker-a"} <= set(names)

        deleted = await admin.DeleteTopic(
            admin_pb2.DeleteTopicRequest(target=here(), topic="orders")
        )
        assert codes(deleted.results) == [("broker-a", OK)]
        await until(lambda: routed({}))
        await expect_error(
            admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="orders")),
            grpc.StatusCode.NOT_FOUND,
            "TOPIC_NOT_EXIST",
        )
        gone = await admin.DeleteTopic(admin_pb2.DeleteTopicRequest(target=here(), topic="orders"))
        assert codes(gone.results) == [("broker-a", NOT_FOUND)]
        # its consume queues went with it: a re-created topic starts empty
        await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(target=here(), config=topic_config("orders"))
        )
        desc = await admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="orders"))
        assert all(q.max_offset == 0 for q in desc.queues)


async def test_topic_request_errors(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        await _topic_errors(c.brokers[0].addr)


async def _topic_errors(addr: str) -> None:
    bad = grpc.StatusCode.INVALID_ARGUMENT
    async with RawClient(addr) as rc:
        admin = rc.admin

        def create(cfg: common_pb2.TopicConfig, target: Any = "default") -> Any:
            if target == "default":
                target = here()
            return admin.CreateTopic(admin_pb2.CreateTopicRequest(target=target, config=cfg))

        await expect_error(create(topic_config("bad topic")), bad, "ILLEGAL_ARGUMENT")
        await expect_error(create(topic_config("x" * 128)), bad)
        await expect_error(create(topic_config("t", read=0)), bad)
        await expect_error(create(topic_config("t", write=1025)), bad)
        await expect_error(create(topic_config("t", perm=3)), bad)
        await expect_error(create(topic_config("t"), target=None), bad)
        text = await expect_error(create(topic_config("t"), target=here("broker-z")), bad)
        assert "broker-z" in text
        await expect_error(admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="")), bad)
        denied = grpc.StatusCode.PERMISSION_DENIED
        for system in ("%RETRY%g1", "%DLQ%g1", "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102"):
            await expect_error(create(topic_config(system)), denied, "NO_PERMISSION")
        await expect_error(
            admin.DeleteTopic(admin_pb2.DeleteTopicRequest(target=here(), topic="TBW102")), denied
        )
        # nothing was created by the refused calls
        listed = await admin.ListTopics(admin_pb2.ListTopicsRequest())
        assert list(listed.topics) == []


# -- topics and groups, cluster mode -----------------------------------------------------------


async def test_cluster_mode_two_brokers(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=2) as c:
        await _cluster_mode([b.addr for b in c.brokers], c.namesrv_addrs[0])


async def _both_registered(namesrv: str) -> bool:
    async with RawClient(namesrv) as rc:
        info = await rc.nameserver.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest())
    return (
        "DefaultCluster" in info.cluster_addr_table
        and len(info.cluster_addr_table["DefaultCluster"].broker_names) == 2
    )


async def _cluster_mode(addrs: list[str], namesrv: str) -> None:
    await until(lambda: _both_registered(namesrv))
    async with RawClient(addrs[0]) as a_client, RawClient(addrs[1]) as b_client:
        a, b = a_client.admin, b_client.admin
        # broker-b has the topic already; cluster mode reports that per broker, not as an error
        await b.CreateTopic(
            admin_pb2.CreateTopicRequest(target=here("broker-b"), config=topic_config("pre"))
        )
        resp = await a.CreateTopic(
            admin_pb2.CreateTopicRequest(target=in_cluster(), config=topic_config("pre", 2, 2))
        )
        assert codes(resp.results) == [("broker-a", OK), ("broker-b", ALREADY_EXISTS)]
        assert [r.broker_addr for r in resp.results] == addrs

        resp = await a.CreateTopic(
            admin_pb2.CreateTopicRequest(target=in_cluster(), config=topic_config("wide", 6, 6))
        )
        assert codes(resp.results) == [("broker-a", OK), ("broker-b", OK)]
        for stub in (a, b):
            desc = await stub.DescribeTopic(admin_pb2.DescribeTopicRequest(topic="wide"))
            assert len(desc.queues) == 6

        async def wide_route(expected: dict[str, tuple[int, int, int]]) -> bool:
            return await route_queues(namesrv, "wide") == expected

        await until(lambda: wide_route({"broker-a": (6, 6, 6), "broker-b": (6, 6, 6)}))

        # from broker-b this time: every master, itself included
        upd = await b.UpdateTopic(
            admin_pb2.UpdateTopicRequest(target=in_cluster(), config=topic_config("wide", 4, 8))
        )
        assert codes(upd.results) == [("broker-a", OK), ("broker-b", OK)]
        await until(lambda: wide_route({"broker-a": (4, 8, 6), "broker-b": (4, 8, 6)}))

        dup = await a.CreateTopic(
            admin_pb2.CreateTopicRequest(target=in_cluster(), config=topic_config("wide"))
        )
        assert codes(dup.results) == [("broker-a", ALREADY_EXISTS), ("broker-b", ALREADY_EXISTS)]

        deleted = await a.DeleteTopic(
            admin_pb2.DeleteTopicRequest(target=in_cluster(), topic="wide")
        )
        assert codes(deleted.results) == [("broker-a", OK), ("broker-b", OK)]
        await until(lambda: wide_route({}))

        await expect_error(
            a.CreateTopic(
                admin_pb2.CreateTopicRequest(
                    target=in_cluster("NoSuchCluster"), config=topic_config("x")
                )
            ),
            grpc.StatusCode.NOT_FOUND,
        )

        # subscription groups go to every master the same way
        group = common_pb2.SubscriptionGroupConfig(group_name="cg", retry_max_times=5)
        made = await a.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(target=in_cluster(), config=group)
        )
        assert codes(made.results) == [("broker-a", OK), ("broker-b", OK)]
        listed = await b.ListSubscriptionGroups(admin_pb2.ListSubscriptionGroupsRequest())
        assert [(g.group_name, g.retry_max_times) for g in listed.groups] == [("cg", 5)]
        again = await b.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(target=in_cluster(), config=group)
        )
        assert codes(again.results) == [("broker-a", ALREADY_EXISTS), ("broker-b", ALREADY_EXISTS)]
        gone = await a.DeleteSubscriptionGroup(
            admin_pb2.DeleteSubscriptionGroupRequest(target=in_cluster(), group_name="cg")
        )
        assert codes(gone.results) == [("broker-a", OK), ("broker-b", OK)]
        listed = await b.ListSubscriptionGroups(admin_pb2.ListSubscriptionGroupsRequest())
        assert list(listed.groups) == []


# -- subscription groups, broker mode ----------------------------------------------------------


async def test_subscription_groups_broker_mode(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        await _groups(c.brokers[0].addr)


async def _groups(addr: str) -> None:
    async with RawClient(addr) as rc:
        admin = rc.admin
        made = await admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=here(), config=common_pb2.SubscriptionGroupConfig(group_name="g1")
            )
        )
        assert codes(made.results) == [("broker-a", OK)]
        listed = await admin.ListSubscriptionGroups(admin_pb2.ListSubscriptionGroupsRequest())
        (g1,) = [g for g in listed.groups if g.group_name == "g1"]
        # every optional field is set, with SPEC §6.14's defaults
        assert g1.HasField("retry_max_times") and g1.retry_max_times == 16
        assert (g1.retry_queue_nums, g1.consume_enable, g1.which_broker_when_consume_slowly) == (
            1,
            True,
            1,
        )
        dup = await admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=here(), config=common_pb2.SubscriptionGroupConfig(group_name="g1")
            )
        )
        assert codes(dup.results) == [("broker-a", ALREADY_EXISTS)]
        upd = await admin.UpdateSubscriptionGroup(
            admin_pb2.UpdateSubscriptionGroupRequest(
                target=here(),
                config=common_pb2.SubscriptionGroupConfig(
                    group_name="g1", consume_enable=False, retry_max_times=-1
                ),
            )
        )
        assert codes(upd.results) == [("broker-a", OK)]
        listed = await admin.ListSubscriptionGroups(admin_pb2.ListSubscriptionGroupsRequest())
        (g1,) = [g for g in listed.groups if g.group_name == "g1"]
        assert (g1.consume_enable, g1.retry_max_times, g1.retry_queue_nums) == (False, -1, 1)
        missing = await admin.UpdateSubscriptionGroup(
            admin_pb2.UpdateSubscriptionGroupRequest(
                target=here(), config=common_pb2.SubscriptionGroupConfig(group_name="nope")
            )
        )
        assert codes(missing.results) == [("broker-a", NOT_FOUND)]
        for bad in (
            common_pb2.SubscriptionGroupConfig(group_name="g2", retry_max_times=-2),
            common_pb2.SubscriptionGroupConfig(group_name="g2", retry_queue_nums=-1),
            common_pb2.SubscriptionGroupConfig(group_name="g2", broker_id=-1),
            common_pb2.SubscriptionGroupConfig(group_name="bad group"),
        ):
            await expect_error(
                admin.CreateSubscriptionGroup(
                    admin_pb2.CreateSubscriptionGroupRequest(target=here(), config=bad)
                ),
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        deleted = await admin.DeleteSubscriptionGroup(
            admin_pb2.DeleteSubscriptionGroupRequest(target=here(), group_name="g1")
        )
        assert codes(deleted.results) == [("broker-a", OK)]
        again = await admin.DeleteSubscriptionGroup(
            admin_pb2.DeleteSubscriptionGroupRequest(target=here(), group_name="g1")
        )
        assert codes(again.results) == [("broker-a", NOT_FOUND)]


# -- consumer progress and offset reset ------------------------------------------------------


async def test_consume_stats_and_reset_offset(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        await _progress(c.brokers[0].addr)


async def _progress(addr: str) -> None:
    async with RawClient(addr) as rc:
        admin = rc.admin
        msg = rc.messaging
        await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(target=here(), config=topic_config("progress", 2, 2))
        )
        await admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=here(), config=common_pb2.SubscriptionGroupConfig(group_name="pg")
            )
        )
        await send(addr, "progress", 0, 6)
        await asyncio.sleep(0.02)  # a real interval: the second batch is stored strictly later
        middle_ms = int(time.time() * 1000)
        await asyncio.sleep(0.02)  # (and the reset time lies strictly between the two)
        await send(addr, "progress", 0, 4)
        await send(addr, "progress", 1, 3)
        await expect_error(
            admin.GetConsumeStats(admin_pb2.GetConsumeStatsRequest(consumer_group="pg")),
            grpc.StatusCode.NOT_FOUND,
        )
        await msg.UpdateConsumerOffset(
            messaging_pb2.UpdateConsumerOffsetRequest(
                consumer_group="pg", topic="progress", queue_id=0, commit_offset=4
            )
        )
        stats = await admin.GetConsumeStats(
            admin_pb2.GetConsumeStatsRequest(consumer_group="pg", topic="progress")
        )
        rows = [(q.queue_id, q.broker_offset, q.consumer_offset, q.lag) for q in stats.queues]
        assert rows == [(0, 10, 4, 6), (1, 3, -1, 3)]
        assert stats.total_lag == 9
        assert stats.queues[0].last_consumed_timestamp_ms > 0
        assert stats.queues[1].last_consumed_timestamp_ms == 0
        assert all(q.topic == "progress" and q.broker_name == "broker-a" for q in stats.queues)
        every = await admin.GetConsumeStats(admin_pb2.GetConsumeStatsRequest(consumer_group="pg"))
        assert [q.topic for q in every.queues] == ["progress", "progress"]

        # by offset, clamped into [min, max]
        reset = await admin.ResetOffset(
            admin_pb2.ResetOffsetRequest(consumer_group="pg", topic="progress", queue_offset=2)
        )
        assert [(r.queue_id, r.old_offset, r.new_offset) for r in reset.queues] == [
            (0, 4, 2),
            (1, -1, 2),
        ]
        assert reset.notified_clients == 0
        reset = await admin.ResetOffset(
            admin_pb2.ResetOffsetRequest(
                consumer_group="pg", topic="progress", queue_offset=100, queue_id=1
            )
        )
        assert [(r.queue_id, r.old_offset, r.new_offset) for r in reset.queues] == [(1, 2, 3)]
        # by time: the first message stored at or after the time
        reset = await admin.ResetOffset(
            admin_pb2.ResetOffsetRequest(
                consumer_group="pg", topic="progress", timestamp_ms=middle_ms, queue_id=0
            )
        )
        assert [(r.queue_id, r.new_offset) for r in reset.queues] == [(0, 6)]
        reset = await admin.ResetOffset(
            admin_pb2.ResetOffsetRequest(consumer_group="pg", topic="progress", timestamp_ms=0)
        )
        assert [r.new_offset for r in reset.queues] == [0, 0]
        got = await msg.QueryConsumerOffset(
            messaging_pb2.QueryConsumerOffsetRequest(
                consumer_group="pg", topic="progress", queue_id=0
            )
        )
        assert got.offset == 0

        bad = grpc.StatusCode.INVALID_ARGUMENT
        await expect_error(
            admin.ResetOffset(admin_pb2.ResetOffsetRequest(consumer_group="pg", topic="progress")),
            bad,
        )
        await expect_error(
            admin.ResetOffset(
                admin_pb2.ResetOffsetRequest(consumer_group="pg", topic="progress", queue_offset=-1)
            ),
            bad,
        )
        await expect_error(
            admin.ResetOffset(
                admin_pb2.ResetOffsetRequest(
                    consumer_group="pg", topic="progress", queue_offset=0, queue_id=2
                )
            ),
            bad,
        )
        await expect_error(
            admin.ResetOffset(
                admin_pb2.ResetOffsetRequest(consumer_group="pg", topic="nope", queue_offset=0)
            ),
            grpc.StatusCode.NOT_FOUND,
            "TOPIC_NOT_EXIST",
        )
        await expect_error(
            admin.ResetOffset(
                admin_pb2.ResetOffsetRequest(
                    consumer_group="no-group", topic="progress", queue_offset=0
                )
            ),
            grpc.StatusCode.NOT_FOUND,
            "SUBSCRIPTION_GROUP_NOT_EXIST",
        )


async def test_reset_offset_tells_live_members(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        await _reset_notice(c.brokers[0].addr)


async def _reset_notice(addr: str) -> None:
    async with RawClient(addr) as rc:
        admin = rc.admin
        msg = rc.messaging
        await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(target=here(), config=topic_config("notice", 1, 1))
        )
        await admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=here(), config=common_pb2.SubscriptionGroupConfig(group_name="ng")
            )
        )
        await send(addr, "notice", 0, 5)
        outbox: asyncio.Queue[messaging_pb2.ClientStreamRequest | None] = asyncio.Queue()

        async def requests() -> Any:
            while (item := await outbox.get()) is not None:
                yield item

        stream = msg.ClientStream(requests())
        await outbox.put(
            messaging_pb2.ClientStreamRequest(
                heartbeat=messaging_pb2.Heartbeat(
                    client_id="127.0.0.1@test",
                    consumers=[
                        messaging_pb2.ConsumerData(
                            consumer_group="ng",
                            subscriptions=[
                                messaging_pb2.SubscriptionData(topic="notice", expression="*")
                            ],
                        )
                    ],
                )
            )
        )
        try:
            first = await asyncio.wait_for(stream.read(), 5)
            assert first.WhichOneof("command") == "heartbeat_ack"
            reset = await admin.ResetOffset(
                admin_pb2.ResetOffsetRequest(consumer_group="ng", topic="notice", queue_offset=3)
            )
            assert reset.notified_clients == 1
            while True:
                pushed = await asyncio.wait_for(stream.read(), 5)
                if pushed.WhichOneof("command") == "reset_offset":
                    break
            assert pushed.reset_offset.consumer_group == "ng"
            assert pushed.reset_offset.topic == "notice"
            assert dict(pushed.reset_offset.queue_offsets) == {0: 3}
        finally:
            await outbox.put(None)
            stream.cancel()


# -- broker config and runtime stats -----------------------------------------------------------


async def test_broker_config_update_survives_restart(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        broker = c.brokers[0]
        await _config_update(broker.addr)
        assert broker.stop() == 0
        again = c.restart(broker)
        cfg = await _get_config(again.addr)
        assert float(cfg["fileReservedTime"]) == 48
        assert cfg["longPollingEnable"] == "false"
        assert cfg["brokerName"] == "broker-a"
        props = (tmp_path / "broker-a" / "store" / "config" / "broker.properties").read_text()
        assert "fileReservedTime=48" in props


async def _get_config(addr: str) -> dict[str, str]:
    async with RawClient(addr) as rc:
        resp = await rc.admin.GetBrokerConfig(admin_pb2.GetBrokerConfigRequest())
    return dict(resp.config)


async def _config_update(addr: str) -> None:
    async with RawClient(addr) as rc:
        admin = rc.admin
        before = await _get_config(addr)
        assert float(before["fileReservedTime"]) == 72
        assert before["brokerClusterName"] == "DefaultCluster"
        resp = await admin.UpdateBrokerConfig(
            admin_pb2.UpdateBrokerConfigRequest(
                updates={"fileReservedTime": "48", "longPollingEnable": "false"}
            )
        )
        assert float(resp.config["fileReservedTime"]) == 48
        assert resp.config["longPollingEnable"] == "false"
        failed = grpc.StatusCode.FAILED_PRECONDITION
        await expect_error(
            admin.UpdateBrokerConfig(
                admin_pb2.UpdateBrokerConfigRequest(updates={"brokerName": "x"})
            ),
            failed,
        )
        bad = grpc.StatusCode.INVALID_ARGUMENT
        await expect_error(
            admin.UpdateBrokerConfig(
                admin_pb2.UpdateBrokerConfigRequest(updates={"noSuchKey": "1"})
            ),
            bad,
        )
        # all or nothing: a bad value leaves the good one unapplied
        await expect_error(
            admin.UpdateBrokerConfig(
                admin_pb2.UpdateBrokerConfigRequest(
                    updates={"fileReservedTime": "24", "diskMaxUsedSpaceRatio": "lots"}
                )
            ),
            bad,
        )
        await expect_error(
            admin.UpdateBrokerConfig(
                admin_pb2.UpdateBrokerConfigRequest(updates={"brokerPermission": "5"})
            ),
            bad,
        )
        after = await _get_config(addr)
        assert float(after["fileReservedTime"]) == 48
        assert after["diskMaxUsedSpaceRatio"] == before["diskMaxUsedSpaceRatio"]

        stats = await admin.GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest())
        assert (stats.cluster_name, stats.broker_name, stats.broker_id) == (
            "DefaultCluster",
            "broker-a",
            0,
        )
        assert stats.role == admin_pb2.ASYNC_MASTER
        assert 0 < stats.start_timestamp_ms <= int(time.time() * 1000)
        assert stats.commitlog_min_offset <= stats.commitlog_max_offset
        assert stats.connected_clients == 0
        assert 0.0 <= stats.disk_used_ratio <= 1.0


async def test_slave_refuses_changes(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=1) as c:
        slave = c.start_broker("broker-a-s1", brokerId=1, brokerRole="SLAVE")
        await _slave(slave.addr)


async def _slave(addr: str) -> None:
    async with RawClient(addr) as rc:
        admin = rc.admin
        unavailable = grpc.StatusCode.UNAVAILABLE
        await expect_error(
            admin.CreateTopic(
                admin_pb2.CreateTopicRequest(target=here("broker-a-s1"), config=topic_config("t"))
            ),
            unavailable,
            "NOT_MASTER",
        )
        await expect_error(
            admin.CreateSubscriptionGroup(
                admin_pb2.CreateSubscriptionGroupRequest(
                    target=here("broker-a-s1"),
                    config=common_pb2.SubscriptionGroupConfig(group_name="g"),
                )
            ),
            unavailable,
            "NOT_MASTER",
        )
        # reads work everywhere
        stats = await admin.GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest())
        assert stats.role == admin_pb2.SLAVE
        await admin.ListTopics(admin_pb2.ListTopicsRequest())
