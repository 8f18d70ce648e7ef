"""The producer against real nameserver and broker processes (SPEC §2.5, §4.3, §5, §7).

Every message a test sends is read back with a raw gRPC Pull and decoded with the shared
record codec, so "sent" always means "stored where the SendResult says".
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from rocketq.client._instance import ClientConfig, ClientInstance
from rocketq.client._nameserver import NameServerClient
from rocketq.client._route import TopicRoute
from rocketq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MessageTooLargeError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from rocketq.client.producer import (
    AccumulatingProducer,
    AccumulatingProducerConfig,
    Producer,
    ProducerConfig,
    SelectMessageQueueByHash,
    SyncAccumulatingProducer,
    SyncProducer,
)
from rocketq.client.producer.selectors import java_hash_code
from rocketq.message import (
    Message,
    MessageQueue,
    ReceivedMessage,
    SendResult,
    SendStatus,
    decode_records,
)
from tests.integration.cluster import (
    restart,
    start_broker,
    start_nameserver,
)
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

FLAG_SUBSCRIPTION = 0x4


# ---- helpers ------------------------------------------------------------------------------


async def pull_queue(addr: str, topic: str, queue_id: int) -> list[ReceivedMessage]:
    """Every stored message of one queue, in queue order (raw gRPC Pull, no long polling)."""
    out: list[ReceivedMessage] = []
    async with RawClient(addr) as c:
        offset = 0
        while True:
            resp = await c.messaging.Pull(
                messaging_pb2.PullRequest(
                    consumer_group="producer_test_reader",
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msg_nums=1024,
                    sys_flag=FLAG_SUBSCRIPTION,
                    subscription="*",
                    expression_type=common_pb2.TAG,
                ),
                timeout=10,
            )
            if resp.status != messaging_pb2.FOUND:
                return out
            out += decode_records(resp.records)
            offset = resp.next_begin_offset


async def pull_topic(route: TopicRoute) -> dict[str, ReceivedMessage]:
    """Every stored message of a topic on every broker of ``route``, by message id."""
    found: dict[str, ReceivedMessage] = {}
    for mq in route.read_queues():
        addr = route.master_addr(mq.broker_name)
        assert addr
        for m in await pull_queue(addr, mq.topic, mq.queue_id):
            m.broker_name = mq.broker_name
            found[m.msg_id] = m
    return found


async def create_topic(addr: str, broker_name: str, topic: str, queue_nums: int = 4) -> None:
    async with RawClient(addr) as c:
        await c.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=broker_name),
                config=common_pb2.TopicConfig(
                    topic_name=topic,
                    read_queue_nums=queue_nums,
                    write_queue_nums=queue_nums,
                    perm=6,
                ),
            ),
            timeout=10,
        )


async def wait_route(namesrv_addrs: list[str], topic: str, brokers: set[str]) -> TopicRoute:
    """Poll the nameserver until ``topic``'s route names exactly ``brokers``."""
    client = NameServerClient(namesrv_addrs)

    async def matching() -> TopicRoute | None:
        try:
            route = await client.get_route(topic)
        except TopicNotFoundError:
            return None
        return route if set(route.brokers) == brokers else None

    try:
        route = await until(matching, f"route of {topic} to show {brokers}", 15, 0.1)
        assert route is not None  # until returns a truthy value only
        return route
    finally:
        await client.close()


def assert_stored(sent: SendResult, got: ReceivedMessage, body: bytes) -> None:
    assert got.body == body
    assert got.queue_id == sent.message_queue.queue_id
    assert got.queue_offset == sent.queue_offset
    assert got.offset_msg_id == sent.offset_msg_id
    assert got.broker_name == sent.message_queue.broker_name


@pytest.fixture(scope="module")
def one_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("one")) as c:
        yield c


# ---- send modes -------------------------------------------------------------------------


async def test_every_send_mode_round_trips(one_broker: Cluster) -> None:
    topic = "RoundTrip"
    sent: list[tuple[SendResult, bytes]] = []

    async def async_sends() -> dict[str, ReceivedMessage]:
        cfg = ProducerConfig("pg_modes", one_broker.namesrv_addrs)
        async with Producer(cfg) as p:
            r = await p.send(
                Message(topic, b"sync", tags="TagA", keys=["k1", "k2"], properties={"a": "1"})
            )
            sent.append((r, b"sync"))
            big = bytes(random.Random(1).randbytes(2000)) * 20  # compressed on the wire
            sent.append((await p.send(Message(topic, big)), big))
            calls: list[tuple[SendResult | None, BaseException | None]] = []
            fut = p.send_async(Message(topic, b"async"), lambda res, exc: calls.append((res, exc)))
            sent.append((await fut, b"async"))
            assert calls == [(fut.result(), None)]
            results = await p.send_batch([Message(topic, b"batch-%d" % i) for i in range(10)])
            assert len({x.message_queue for x in results}) == 1
            offsets = [x.queue_offset for x in results]
            assert offsets == list(range(offsets[0], offsets[0] + 10))
            sent.extend((x, b"batch-%d" % i) for i, x in enumerate(results))
            await p.send_oneway(Message(topic, b"oneway"))
            assert p.instance.stream_addrs() == [one_broker.brokers[0].addr]
            assert await p.instance.heartbeat_now() == [one_broker.brokers[0].addr]
            route = await p.instance.get_route(topic, refresh=True)

        async def with_oneway() -> dict[str, ReceivedMessage]:
            stored = await pull_topic(route)
            return stored if any(m.body == b"oneway" for m in stored.values()) else {}

        return await until(with_oneway, "the oneway message stored", timeout_s=10)

    def blocking_sends() -> None:
        with SyncProducer(ProducerConfig("pg_modes_sync", one_broker.namesrv_addrs)) as sp:
            sent.append((sp.send(Message(topic, b"blocking")), b"blocking"))
            sent.append(
                (sp.send_async(Message(topic, b"blocking-async")).result(10), b"blocking-async")
            )
            [r] = sp.send_batch([Message(topic, b"blocking-batch")])
            sent.append((r, b"blocking-batch"))
        acc_cfg = AccumulatingProducerConfig("pg_modes_acc", one_broker.namesrv_addrs)
        with SyncAccumulatingProducer(acc_cfg) as ap:
            sent.append((ap.send(Message(topic, b"acc")), b"acc"))
            futs = [ap.send_async(Message(topic, b"acc-%d" % i)) for i in range(20)]
            ap.flush()
            sent.extend((f.result(10), b"acc-%d" % i) for i, f in enumerate(futs))

    worker = threading.Thread(target=blocking_sends)
    worker.start()
    await asyncio.to_thread(worker.join, 60)
    stored = await async_sends()
    assert len(sent) == 3 + 10 + 3 + 21
    for result, body in sent:
        assert result.status is SendStatus.SEND_OK
        assert len(result.msg_id) == 32
        assert_stored(result, stored[result.msg_id], body)
    [first_result] = [r for r, body in sent if body == b"sync"]
    first = stored[first_result.msg_id]
    assert first.tags == "TagA" and first.keys == ["k1", "k2"] and first.properties["a"] == "1"
    assert any(m.body == b"oneway" for m in stored.values())
    assert len(stored) == len(sent) + 1


async def test_ordered_send_by_sharding_key_lands_in_one_queue_in_order(
    one_broker: Cluster,
) -> None:
    topic = "OrderStatus"
    broker = one_broker.brokers[0]
    keys = ["T0000001", "T0000002", "T0000003", "order-42"]

    await create_topic(broker.addr, "broker-a", topic, queue_nums=8)
    route = await wait_route(one_broker.namesrv_addrs, topic, {"broker-a"})
    results: dict[str, list[SendResult]] = {k: [] for k in keys}
    async with Producer(ProducerConfig("pg_ordered", one_broker.namesrv_addrs)) as p:
        for step in range(15):
            for k in keys:
                msg = Message(topic, f"{k}:{step}".encode(), keys=k)
                if step % 3 == 0:
                    r = await p.send(msg, selector=SelectMessageQueueByHash(), arg=k)
                else:
                    r = await p.send(msg, sharding_key=k)
                results[k].append(r)
        explicit = MessageQueue(topic, "broker-a", 5)
        r = await p.send(Message(topic, b"explicit"), queue=explicit)
        assert r.message_queue == explicit
    for k in keys:
        expected_qid = abs(java_hash_code(k)) % 8
        assert {r.message_queue.queue_id for r in results[k]} == {expected_qid}
        stored = await pull_queue(broker.addr, topic, expected_qid)
        bodies = [m.body for m in stored if m.keys == [k]]
        assert bodies == [f"{k}:{step}".encode() for step in range(15)]
    assert route.write_queues()[5] == MessageQueue(topic, "broker-a", 5)


async def test_auto_create_through_tbw102(one_broker: Cluster) -> None:
    topic = "BornOnFirstSend"

    cfg = ProducerConfig(
        "pg_autocreate", one_broker.namesrv_addrs, poll_name_server_interval_ms=200
    )
    async with Producer(cfg) as p:
        r = await p.send(Message(topic, b"first"))
        assert r.status is SendStatus.SEND_OK
        borrowed = p.instance.cached_route(topic)
        assert borrowed is not None and borrowed.default_topic == "TBW102"
        assert len(borrowed.write_queues()) == 4

        def real_route() -> TopicRoute | None:
            route = p.instance.cached_route(topic)
            return route if route is not None and not route.default_topic else None

        route = await until(real_route, "the real route to replace TBW102's", timeout_s=15)
        assert route is not None and set(route.brokers) == {"broker-a"}
        r2 = await p.send(Message(topic, b"second"))
        stored = await pull_topic(route)
    assert stored[r.msg_id].body == b"first" and stored[r2.msg_id].body == b"second"


async def test_no_auto_create_means_topic_not_found(tmp_path: Path) -> None:
    with cluster(tmp_path, broker_keys={"autoCreateTopicEnable": False}) as c:
        async with Producer(ProducerConfig("pg_noauto", c.namesrv_addrs)) as p:
            with pytest.raises(TopicNotFoundError, match="create it first"):
                await p.send(Message("NeverCreated", b"x"))


# ---- failures -----------------------------------------------------------------------------


async def test_sync_sends_retry_around_a_killed_broker(tmp_path: Path) -> None:
    topic = "TwoBrokers"

    with cluster(tmp_path, brokers=2) as c:
        for b, name in zip(c.brokers, ("broker-a", "broker-b"), strict=True):
            await create_topic(b.addr, name, topic)
        await wait_route(c.namesrv_addrs, topic, {"broker-a", "broker-b"})
        plain = Producer(ProducerConfig("pg_retry", c.namesrv_addrs))
        faulty = Producer(
            ProducerConfig("pg_retry_fault", c.namesrv_addrs, send_latency_fault_enable=True)
        )
        async with plain, faulty:
            before = [await plain.send(Message(topic, b"before-%d" % i)) for i in range(8)]
            assert {r.message_queue.broker_name for r in before} == {"broker-a", "broker-b"}
            await faulty.send(Message(topic, b"warm"))
            c.brokers[1].kill()
            started = time.monotonic()
            after = [await plain.send(Message(topic, b"after-%d" % i)) for i in range(30)]
            after += [await faulty.send(Message(topic, b"fault-%d" % i)) for i in range(30)]
            after += await plain.send_batch([Message(topic, b"batch-%d" % i) for i in range(5)])
            elapsed_s = time.monotonic() - started
            assert {r.message_queue.broker_name for r in after} == {"broker-a"}
            assert all(r.status is SendStatus.SEND_OK for r in after)
            assert elapsed_s < 20, elapsed_s
            route = await plain.instance.get_route(topic)
        stored = await pull_topic(TopicRoute(topic, route.queues[:1], route.brokers))
        assert all(r.msg_id in stored for r in after)


async def test_not_store_ok_is_returned_or_retried_elsewhere(tmp_path: Path) -> None:
    """broker-a flushes synchronously and every flush then stalls 600 ms: a message written
    during a stall outlives its 100 ms flush timeout and is answered FLUSH_DISK_TIMEOUT (stored,
    but not flushed in time). A background sender keeps broker-a's flusher stalling. The status
    comes back as is, unless the producer asks to retry such sends on another broker."""
    topic = "SlowDisk"
    ns = start_nameserver(tmp_path)
    procs = [ns]
    try:
        procs.append(
            start_broker(
                tmp_path,
                [ns.addr],
                "broker-a",
                {"ROCKETQ_FAILPOINTS": "commitlog_after_flush=sleep(600)"},
                flushDiskType="SYNC_FLUSH",
                syncFlushTimeout=100,
            )
        )
        procs.append(start_broker(tmp_path, [ns.addr], "broker-b"))
        await _not_store_ok_scenario([ns.addr], topic, procs[1].addr, procs[2].addr)
    finally:
        for p in reversed(procs):
            p.kill()


async def _not_store_ok_scenario(ns: list[str], topic: str, addr_a: str, addr_b: str) -> None:
    await create_topic(addr_a, "broker-a", topic, queue_nums=2)
    await create_topic(addr_b, "broker-b", topic, queue_nums=2)
    route = await wait_route(ns, topic, {"broker-a", "broker-b"})
    as_is = Producer(ProducerConfig("pg_as_is", ns, send_msg_timeout_ms=5000))
    retry = Producer(
        ProducerConfig(
            "pg_elsewhere",
            ns,
            send_msg_timeout_ms=5000,
            retry_another_broker_when_not_store_ok=True,
        )
    )
    stall = Producer(ProducerConfig("pg_stall", ns, send_msg_timeout_ms=5000))
    async with as_is, retry, stall:
        stop = asyncio.Event()

        async def keep_flusher_stalled() -> None:
            a0 = MessageQueue(topic, "broker-a", 0)
            while not stop.is_set():
                await stall.send(Message(topic, b"stall"), queue=a0)

        staller = asyncio.create_task(keep_flusher_stalled())
        try:
            await until(lambda: _flush_stalled(addr_a), "broker-a's flusher stalled")
            plain = [await as_is.send(Message(topic, b"p%d" % i)) for i in range(6)]
            retried = [await retry.send(Message(topic, b"r%d" % i)) for i in range(6)]
        finally:
            stop.set()
            await staller
    statuses = {(r.message_queue.broker_name, r.status) for r in plain}
    assert ("broker-a", SendStatus.FLUSH_DISK_TIMEOUT) in statuses
    assert ("broker-b", SendStatus.SEND_OK) in statuses
    assert ("broker-b", SendStatus.FLUSH_DISK_TIMEOUT) not in statuses
    assert {r.status for r in retried} == {SendStatus.SEND_OK}
    stored_a = set(await pull_topic(TopicRoute(topic, route.queues[:1], route.brokers)))
    twice = [
        r for r in retried if r.message_queue.broker_name == "broker-b" and r.msg_id in stored_a
    ]
    assert twice, "no send was stored on broker-a and then resent to broker-b"


async def _flush_stalled(addr: str) -> bool:
    """Whether the broker holds bytes written but not yet flushed (its flusher is stalled)."""
    async with RawClient(addr) as c:
        stats = await c.runtime_stats()
    return stats.commitlog_max_offset > stats.commitlog_flushed_offset


def _ns_first_seed(addrs: list[str], want: str) -> int:
    for seed in range(100):
        if addrs[random.Random(seed).randrange(1 << 30) % len(addrs)] == want:
            return seed
    raise AssertionError("no seed")


async def test_nameserver_failover_and_pseudo_death(tmp_path: Path) -> None:
    with cluster(tmp_path, nameservers=2) as c:
        addrs = c.namesrv_addrs
        await wait_route(addrs[1:], "TBW102", {"broker-a"})
        seed = _ns_first_seed(addrs, addrs[0])
        # Pseudo-death: ns0 hangs without closing TCP; a request timeout moves the client on.
        c.nameservers[0].pause()
        try:
            client = NameServerClient(addrs, timeout_ms=500, rng=random.Random(seed))
            assert client.chooser.current == addrs[0]
            started = time.monotonic()
            route = await client.get_route("TBW102")
            assert set(route.brokers) == {"broker-a"}
            assert time.monotonic() - started < 3
            assert client.chooser.current == addrs[1]
            await client.close()
        finally:
            c.nameservers[0].resume()
        c.nameservers[0].kill()
        for s in range(6):
            client = NameServerClient(addrs, timeout_ms=1000, rng=random.Random(s))
            assert "TBW102" in await client.all_topics()
            await client.close()
        cfg = ProducerConfig("pg_ns_failover", addrs)
        async with Producer(cfg) as p:
            r = await p.send(Message("AfterNamesrvDeath", b"x"))
            assert r.status is SendStatus.SEND_OK


async def test_sync_send_times_out_on_a_stopped_broker(one_broker: Cluster) -> None:
    broker = one_broker.brokers[0]

    async with Producer(ProducerConfig("pg_timeout", one_broker.namesrv_addrs)) as p:
        await p.send(Message("Stalled", b"warm"))
        broker.pause()
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError):
                await p.send(Message("Stalled", b"lost?"), timeout_ms=800)
            elapsed_s = time.monotonic() - started
        finally:
            broker.resume()
        assert 0.7 < elapsed_s < 2.5, elapsed_s
        r = await p.send(Message("Stalled", b"again"))
        assert r.status is SendStatus.SEND_OK


async def test_bad_input_is_refused_client_side(one_broker: Cluster) -> None:
    p = Producer(ProducerConfig("pg_bad", one_broker.namesrv_addrs))
    with pytest.raises(ClientStateError, match="not started"):
        await p.send(Message("T", b"x"))
    async with p:
        cases: list[tuple[Message, type[Exception], str]] = [
            (Message("", b"x"), InvalidArgumentError, "topic name is empty"),
            (Message("has space", b"x"), InvalidArgumentError, "characters outside"),
            (Message("T", b""), InvalidArgumentError, "empty body"),
            (Message("T", b"x" * (4 * 1024 * 1024)), MessageTooLargeError, "4194304"),
            (
                Message("T", b"x", properties={"UNIQ_KEY": "1"}),
                InvalidArgumentError,
                "reserved",
            ),
            (Message("TBW102", b"x"), InvalidArgumentError, "reserved"),
        ]
        for msg, error, text in cases:
            with pytest.raises(error, match=text):
                await p.send(msg)
            with pytest.raises(error, match=text):
                p.send_async(msg)
            with pytest.raises(error, match=text):
                await p.send_oneway(msg)
        with pytest.raises(InvalidArgumentError, match="one topic"):
            await p.send_batch([Message("A", b"x"), Message("B", b"x")])
        with pytest.raises(MessageTooLargeError, match="batch of 5"):
            await p.send_batch([Message("A", b"x" * 1_000_000) for _ in range(5)])
        with pytest.raises(InvalidArgumentError, match="at most one"):
            await p.send(Message("A", b"x"), sharding_key="k", selector=SelectMessageQueueByHash())
        # None of it reached the network: no topic was auto-created.
        assert p.instance.cached_route("A") is None


async def test_accumulating_producer_sends_20k_quickly(one_broker: Cluster) -> None:
    topic = "Firehose"
    count = 20_000

    cfg = AccumulatingProducerConfig("pg_firehose", one_broker.namesrv_addrs)
    async with AccumulatingProducer(cfg) as p:
        started = time.monotonic()
        futs = [await p.enqueue(Message(topic, b"m%06d" % i)) for i in range(count)]
        results = await asyncio.gather(*futs)
        elapsed_s = time.monotonic() - started
        ids = {r.msg_id for r in results}
        assert len(ids) == count
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        single = await p.send(Message(topic, b"one more"))
        route = await p.instance.get_route(topic)
    assert elapsed_s < 30, elapsed_s
    stored = await pull_topic(route)
    assert ids | {single.msg_id} <= set(stored)
    per_queue: dict[int, list[int]] = {}
    for r in results:
        per_queue.setdefault(r.message_queue.queue_id, []).append(r.queue_offset)
    for offsets in per_queue.values():
        assert len(set(offsets)) == len(offsets)


async def test_close_leaves_the_client_instance_reusable(one_broker: Cluster) -> None:
    cfg = ProducerConfig("pg_twice", one_broker.namesrv_addrs)
    first = Producer(cfg)
    await first.start()
    with pytest.raises(ValueError, match="already registered"):
        await Producer(cfg).start()
    await first.close()
    with pytest.raises(ClientStateError):
        await first.send(Message("T", b"x"))
    async with Producer(cfg) as again:  # the group is free again after close
        assert (await again.send(Message("Again", b"x"))).status is SendStatus.SEND_OK


# ---- the client instance ----------------------------------------------------------------


class ProbeConsumer:
    """The smallest ConsumerHandle: one pull-mode group, recording what the instance says."""

    def __init__(self, group: str, topic: str) -> None:
        self.group, self.topic = group, topic
        self.routes: list[TopicRoute] = []

    def consumer_data(self) -> messaging_pb2.ConsumerData:
        return messaging_pb2.ConsumerData(
            consumer_group=self.group,
            consume_type=messaging_pb2.CONSUME_TYPE_PULL,
            message_model=messaging_pb2.CLUSTERING,
            subscriptions=[messaging_pb2.SubscriptionData(topic=self.topic, expression="*")],
        )

    def topics(self) -> list[str]:
        return [self.topic]

    def on_route_changed(self, topic: str, route: TopicRoute) -> None:
        self.routes.append(route)

    def on_consumer_ids_changed(self) -> None:
        pass

    def on_reset_offset(self, topic: str, broker_name: str, offsets: dict[int, int]) -> None:
        pass

    def on_subscription_conflict(self, conflict: common_pb2.SubscriptionConflict) -> None:
        pass


async def consumer_ids(addr: str, group: str) -> list[str]:
    async with RawClient(addr) as c:
        resp = await c.messaging.GetConsumerIdList(
            messaging_pb2.GetConsumerIdListRequest(consumer_group=group), timeout=5
        )
    return list(resp.consumer_ids)


async def test_instance_heartbeats_follow_routes_and_broker_restarts(tmp_path: Path) -> None:
    """Heartbeats carry the consumer data (the broker lists the client in its group), streams
    open to every broker of a route in use, a route change reaches the consumer handle, and a
    broker that comes back on a new port gets a new stream while the old one is dropped."""
    topic, group = "Watched", "cg_probe"

    with cluster(tmp_path, brokers=2) as c:
        a, b = c.brokers
        await create_topic(a.addr, "broker-a", topic)
        await wait_route(c.namesrv_addrs, topic, {"broker-a"})
        config = ClientConfig(tuple(c.namesrv_addrs), "probe", poll_name_server_interval_ms=200)
        inst = ClientInstance.get(config)
        probe = ProbeConsumer(group, topic)
        inst.register_consumer(group, probe)
        await inst.start()
        try:
            await inst.get_route(topic)
            assert await inst.heartbeat_now() == [a.addr]
            assert await consumer_ids(a.addr, group) == [inst.client_id]

            await create_topic(b.addr, "broker-b", topic)

            async def both_brokers() -> bool:
                return bool(probe.routes) and set(probe.routes[-1].brokers) == {
                    "broker-a",
                    "broker-b",
                }

            await until(both_brokers, "a route with both brokers", 15)
            assert inst.stream_addrs() == sorted([a.addr, b.addr])
            assert await inst.heartbeat_now() == sorted([a.addr, b.addr])
            assert await consumer_ids(b.addr, group) == [inst.client_id]

            b.stop()
            b2 = restart(b)
            c.brokers[1] = b2

            async def moved() -> bool:
                route = inst.cached_route(topic)
                return route is not None and route.master_addr("broker-b") == b2.addr

            await until(moved, "broker-b at its new address", 15)
            await until(
                lambda: inst.stream_addrs() == sorted([a.addr, b2.addr]), "streams to a and b2", 15
            )
            assert await inst.heartbeat_now() == sorted([a.addr, b2.addr])
            assert await consumer_ids(b2.addr, group) == [inst.client_id]

            await inst.unregister_consumer(group)

            async def gone() -> bool:
                return await consumer_ids(a.addr, group) == []

            await until(gone, "the consumer gone from broker-a", 15)
        finally:
            await inst.close()
