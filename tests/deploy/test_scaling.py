"""Scaling broker groups, with real processes (what the chart's StatefulSet scale does):
a joining master takes the cluster-mode topics (and only those), and a leaving one is drained
by its preStop command — write off, wait for every group to consume it, unregister — with
nothing acknowledged lost."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2, admin_pb2_grpc
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.errors import RocketQError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, ReceivedMessage, SendResult
from tests.integration.cluster import reap_since, spawned_count
from tests.support.cluster import Cluster, cluster
from tests.support.until import until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = {"learnClusterTopics": True, "registerNameServerPeriod": 1000}


@pytest.fixture
def scaled(tmp_path: Path) -> Iterator[Cluster]:
    """Two broker groups that learn cluster topics, as the chart configures them."""
    mark = spawned_count()
    try:
        with cluster(tmp_path, brokers=2, broker_keys=KEYS) as c:
            yield c
    finally:
        reap_since(mark)


async def route_queues(admin: Admin, topic: str) -> dict[str, tuple[int, int]]:
    """broker name → (write queues, perm) of ``topic``'s route ({} while none)."""
    try:
        route = await admin.route(topic)
    except RocketQError:
        return {}
    return {q.broker_name: (q.write_queue_nums, q.perm) for q in route.queues}


async def test_a_joining_group_takes_cluster_mode_topics_and_traffic(scaled: Cluster) -> None:
    async with Admin(scaled.namesrv_addrs) as admin:
        await admin.create_topic(TopicConfig("orders", 3, 3))  # cluster mode: every master
        await admin.create_topic(TopicConfig("only-a", 2, 2), broker="broker-a")
        await until(
            lambda: _has(admin, "orders", {"broker-a", "broker-b"}), "orders routed", 15, 0.1
        )

        scaled.start_broker("broker-c", **KEYS)  # kubectl scale ... --replicas=3

        await until(
            lambda: _has(admin, "orders", {"broker-a", "broker-b", "broker-c"}),
            "broker-c hosting orders",
            20,
            0.1,
        )
        assert (await route_queues(admin, "orders"))["broker-c"] == (3, 6)
        assert set(await route_queues(admin, "only-a")) == {"broker-a"}

    async with Producer(ProducerConfig("scale-p", scaled.namesrv_addrs)) as producer:
        results = [await producer.send(Message("orders", b"m%d" % i)) for i in range(30)]
    assert {r.message_queue.broker_name for r in results} == {"broker-a", "broker-b", "broker-c"}
    scaled.check_logs()


async def test_draining_a_group_waits_for_every_consumer_then_unregisters(
    scaled: Cluster,
) -> None:
    leaving = scaled.start_broker("broker-c", **KEYS)
    every = {"broker-a", "broker-b", "broker-c"}
    async with Admin(scaled.namesrv_addrs) as admin:
        await admin.create_topic(TopicConfig("pay", 2, 2))
        await until(lambda: _has(admin, "pay", every), "pay routed", 15, 0.1)
    consumed: set[bytes] = set()
    consumer = await _consumer("billing", consumed, scaled.namesrv_addrs)
    try:
        await _send("pay", range(40), scaled.namesrv_addrs)
        await until(lambda: len(consumed) == 40, "the first 40 consumed", 20, 0.1)
    finally:
        await consumer.close()  # commits what it consumed
    later = await _send("pay", range(40, 60), scaled.namesrv_addrs)
    unread_on_c = sum(r.message_queue.broker_name == "broker-c" for r in later)

    # Nobody consumes now: a short drain answers what "billing" still has to read there.
    partial = await _drain_rpc(leaving.addr, timeout_ms=300, unregister=False)
    assert (partial.drained, partial.unregistered) == (unread_on_c == 0, False)
    assert partial.pending_messages == unread_on_c
    if unread_on_c:
        assert [(p.group, p.topic) for p in partial.pending] == [("billing", "pay")]

    # Write is off: broker-c is routed read-only and new producers leave it out.
    async with Admin(scaled.namesrv_addrs) as admin:
        await until(lambda: _perm(admin, "pay", "broker-c", 4), "broker-c read-only", 15, 0.1)
    last = await _send("pay", range(60, 80), scaled.namesrv_addrs)
    assert "broker-c" not in {r.message_queue.broker_name for r in last}

    # The preStop command, with the consumer back: drained, then unregistered.
    consumer = await _consumer("billing", consumed, scaled.namesrv_addrs)
    try:
        # asynchronously: the consumer runs on this event loop meanwhile
        drain = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.broker.drain"),
            *("--addr", leaving.addr, "--timeout-s", "30"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(drain.communicate(), 60)
        assert drain.returncode == 0, err.decode()
        assert out.decode().startswith(f"drained {leaving.addr}")
        await until(lambda: len(consumed) == 80, "every message consumed", 20, 0.1)
    finally:
        await consumer.close()
    assert consumed == {b"p%d" % i for i in range(80)}  # nothing acknowledged is lost
    async with Admin(scaled.namesrv_addrs) as admin:
        await until(lambda: _gone(admin, "pay", "broker-c"), "broker-c out of the route", 15, 0.1)
    leaving.stop()
    scaled.brokers.remove(leaving)
    scaled.check_logs()


async def test_a_drain_answers_at_once_with_the_default_heartbeat_period(tmp_path: Path) -> None:
    """Write off triggers a registration and unregistering cancels the heartbeat loop right
    after: the cancellation must not be lost (the answer would wait a 30 s period)."""
    mark = spawned_count()
    try:
        with cluster(tmp_path, brokers=2) as c:
            leaving = c.brokers[1]
            answer = await _drain_rpc(leaving.addr, timeout_ms=0, unregister=True)
            assert (answer.drained, answer.unregistered) == (True, True)
            async with Admin(c.namesrv_addrs) as admin:

                async def gone() -> bool:
                    return "broker-b" not in (await admin.cluster_info()).brokers

                await until(gone, "broker-b unregistered", 5, 0.1)
            c.check_logs()
    finally:
        reap_since(mark)


async def test_drain_refuses_a_bad_timeout_and_a_slave(tmp_path: Path) -> None:
    mark = spawned_count()
    try:
        with cluster(tmp_path, brokers=1, slaves=1) as c:
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await _drain_rpc(c.broker.addr, timeout_ms=-1, unregister=False)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "timeout_ms -1" in (bad.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as slave:
                await _drain_rpc(c.slaves[0].addr, timeout_ms=0, unregister=False)
            assert slave.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "slave" in (slave.value.details() or "")
            c.check_logs()
    finally:
        reap_since(mark)


async def _has(admin: Admin, topic: str, brokers: set[str]) -> bool:
    return set(await route_queues(admin, topic)) == brokers


async def _perm(admin: Admin, topic: str, broker: str, perm: int) -> bool:
    return (await route_queues(admin, topic)).get(broker, (0, 0))[1] == perm


async def _gone(admin: Admin, topic: str, broker: str) -> bool:
    queues = await route_queues(admin, topic)
    return bool(queues) and broker not in queues


async def _send(topic: str, numbers: range, namesrv: list[str]) -> list[SendResult]:
    """Send ``p<n>`` for each n with a new producer (it reads the current routes)."""
    async with Producer(ProducerConfig("drain-p", namesrv)) as producer:
        return [await producer.send(Message(topic, b"p%d" % i)) for i in numbers]


async def _consumer(group: str, into: set[bytes], namesrv: list[str]) -> PushConsumer:
    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        into.update(m.body for m in msgs)
        return ConsumeResult.CONSUME_SUCCESS

    config = PushConsumerConfig(
        group, tuple(namesrv), consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe("pay", "*")
    await consumer.start()
    return consumer


async def _drain_rpc(
    addr: str, *, timeout_ms: int, unregister: bool
) -> admin_pb2.DrainBrokerResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        response: admin_pb2.DrainBrokerResponse = await admin_pb2_grpc.AdminStub(
            channel
        ).DrainBroker(
            admin_pb2.DrainBrokerRequest(timeout_ms=timeout_ms, unregister=unregister),
            timeout=10,  # far below the 30 s heartbeat period
        )
        return response
