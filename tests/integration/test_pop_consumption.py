"""Pop consumption against real broker processes, through the SDK's SimpleConsumer and raw stubs
(DESIGN.md §7, services/broker/pop).

One nameserver and one master with a slave for most tests, each test on its own topic and group;
the restart scenario starts its own cluster. Messages are sent with raw Send calls; topics are
created with one queue so that every consumer competes for the same queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import grpc
import pytest

from rocketq import PoppedMessage, SimpleConsumer, SimpleConsumerConfig, SyncSimpleConsumer
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.client.consumer import InvalidReceiptHandleError
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient, refused
from tests.support.until import until, until_sync

pytestmark = pytest.mark.integration

BROKER = "broker-a"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("pop"), slaves=1) as cl:
        yield cl
        cl.check_logs()


async def make_topic(c: Cluster, topic: str, queues: int = 1) -> None:
    """Create ``topic`` on the broker, then wait until the nameservers route it: the broker
    registers a new topic on its own time, and a receive looks the route up first."""
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
                ),
            )
        )
    await wait_routed(c.namesrv_addrs, topic, queues)


async def send(addr: str, topic: str, bodies: list[bytes]) -> list[str]:
    """Send each body as its own message; their unique ids."""
    ids = []
    async with RawClient(addr) as raw:
        for body in bodies:
            resp = await raw.messaging.Send(
                messaging_pb2.SendRequest(
                    producer_group="pop-producers",
                    messages=[common_pb2.Message(topic=topic, body=body)],
                )
            )
            ids.append(resp.results[0].msg_id)
    return ids


def consumer(
    cl: Cluster, group: str, topic: str, name: str, await_ms: int = 1_000
) -> SimpleConsumer:
    sc = SimpleConsumer(
        SimpleConsumerConfig(
            group,
            tuple(cl.namesrv_addrs),
            await_duration_ms=await_ms,
            request_timeout_ms=10_000,  # a loaded CI machine, not a slow broker
            instance_name=name,
        )
    )
    sc.subscribe(topic)
    return sc


async def receive_until(
    sc: SimpleConsumer, what: str, want: int = 1, invisible_ms: int = 30_000
) -> list[PoppedMessage]:
    got: list[PoppedMessage] = []

    async def more() -> bool:
        got.extend(await sc.receive(min(32, want - len(got)), invisible_ms))
        return len(got) >= want

    await until(more, what, timeout_s=20)
    return got


async def test_two_consumers_share_one_queue_without_duplicates(c: Cluster) -> None:
    topic, group = "PopShared", "pop-shared"
    await make_topic(c, topic)
    async with (
        consumer(c, group, topic, "one") as first,
        consumer(c, group, topic, "two") as second,
    ):
        # A receive waiting on the empty queue is woken by the first arrival (long polling).
        waiting = asyncio.create_task(first.receive(5, 30_000))
        sent = await send(c.broker.addr, topic, [f"m{i}".encode() for i in range(30)])
        batches = {"one": await waiting, "two": []}
        while sum(len(b) for b in batches.values()) < len(sent):
            a, b = await asyncio.gather(first.receive(5, 30_000), second.receive(5, 30_000))
            batches["one"] += a
            batches["two"] += b
        ids = {k: [m.message.msg_id for m in v] for k, v in batches.items()}
        assert not set(ids["one"]) & set(ids["two"]), "a message went to both consumers"
        assert sorted(ids["one"] + ids["two"]) == sorted(sent)
        assert ids["one"] and ids["two"], ids
        assert all(m.delivery_attempt == 1 for b in batches.values() for m in b)
        for name, sc in (("one", first), ("two", second)):
            for m in batches[name]:
                await sc.ack(m)
        assert await second.receive(5, 30_000) == []  # nothing left, nothing comes back


async def test_unacked_message_comes_back_with_attempt_2(c: Cluster) -> None:
    topic, group = "PopRedeliver", "pop-redeliver"
    await make_topic(c, topic)
    [sent] = await send(c.broker.addr, topic, [b"retry me"])
    async with consumer(c, group, topic, "solo") as sc:
        [first] = await receive_until(sc, "the first delivery", invisible_ms=1_000)
        assert (first.message.msg_id, first.delivery_attempt) == (sent, 1)
        [again] = await receive_until(sc, "the redelivery after the invisible time")
        assert (again.message.msg_id, again.delivery_attempt) == (sent, 2)
        assert again.message.body == b"retry me"
        assert again.message.topic == topic
        with pytest.raises(InvalidReceiptHandleError, match="stale"):
            await sc.ack(first)  # its invisible time passed and it was delivered again
        await sc.ack(again)
        assert await sc.receive(1, 1_000) == []


async def test_stale_forged_and_bad_requests_are_refused(c: Cluster) -> None:
    topic, group = "PopHandles", "pop-handles"
    await make_topic(c, topic)
    await send(c.broker.addr, topic, [b"a", b"b"])
    async with consumer(c, group, topic, "h") as sc:
        got = await receive_until(sc, "two messages", want=2)
        changed = await sc.change_invisible_duration(got[0], 60_000)
        assert changed.receipt_handle != got[0].receipt_handle
        with pytest.raises(InvalidReceiptHandleError, match="newest handle"):
            await sc.ack(got[0])
        await sc.ack(changed)
        await sc.ack(got[1])
        with pytest.raises(InvalidReceiptHandleError):
            await sc.ack(got[1])  # twice
    handle = got[1].receipt_handle
    async with RawClient(c.broker.addr) as raw:

        def ack(h: str, g: str = group) -> messaging_pb2.AckRequest:
            return messaging_pb2.AckRequest(consumer_group=g, topic=topic, receipt_handle=h)

        forged = f"rq1|{BROKER}|{'0' * 32}|0"
        other_broker = handle.replace(BROKER, "broker-z", 1)
        for bad, text in [
            (forged, "stale or unknown"),
            ("not-a-handle", "not a receipt handle"),
            (other_broker, "issued by broker 'broker-z'"),
        ]:
            code, reason, message = await refused(raw.messaging.Ack(ack(bad)))
            assert (code, reason) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                common_pb2.INVALID_RECEIPT_HANDLE,
            )
            assert text in message
        pop = messaging_pb2.PopRequest(consumer_group=group, topic=topic, invisible_time_ms=0)
        code, reason, message = await refused(raw.messaging.Pop(pop))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "invisible_time_ms 0" in message
        pop = messaging_pb2.PopRequest(consumer_group=group, topic="NoSuch", invisible_time_ms=5000)
        code, reason, _ = await refused(raw.messaging.Pop(pop))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, common_pb2.TOPIC_NOT_EXIST)


async def test_past_max_attempts_a_message_goes_to_the_dlq(c: Cluster) -> None:
    topic, group = "PopDead", "pop-dead"
    await make_topic(c, topic)
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.SubscriptionGroupConfig(group_name=group, retry_max_times=1),
            )
        )
    [sent] = await send(c.broker.addr, topic, [b"poison"])
    async with consumer(c, group, topic, "d") as sc:
        attempts = []
        for _ in range(2):  # delivery 1, then the one retry the group allows; never acked
            [m] = await receive_until(sc, "a delivery", invisible_ms=1_000)
            attempts.append(m.delivery_attempt)
        assert attempts == [1, 2]

        async def in_dlq() -> list[common_pb2.StoredMessage]:
            async with RawClient(c.broker.addr) as raw:
                try:
                    resp = await raw.messaging.QueryMessageById(
                        messaging_pb2.QueryMessageByIdRequest(topic=f"%DLQ%{group}", msg_id=sent)
                    )
                except grpc.RpcError:
                    return []
                return list(resp.messages)

        [dead] = await until(in_dlq, "the message in %DLQ%pop-dead")
        assert dead.message.body == b"poison" and dead.reconsume_times == 2
        assert await sc.receive(1, 1_000) == []


async def test_pop_state_survives_a_killed_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    topic, group = "PopRestart", "pop-restart"
    # Killed, not stopped: the checkpoints and acks must come back from the revive log alone.
    keys = {"flushDiskType": "SYNC_FLUSH"}
    with cluster(tmp_path_factory.mktemp("pop_restart"), broker_keys=keys) as cl:
        await make_topic(cl, topic)
        sent = await send(cl.broker.addr, topic, [b"acked", b"unacked", b"later"])
        async with consumer(cl, group, topic, "before") as sc:
            got = await receive_until(sc, "two messages", want=2, invisible_ms=2_000)
            by_body = {m.message.body: m for m in got}
            assert set(by_body) == {b"acked", b"unacked"}
            await sc.ack(by_body[b"acked"])
        cl.broker.kill()
        cl.restart(cl.broker)
        async with consumer(cl, group, topic, "after") as sc:
            got = await receive_until(sc, "the rest after the restart", want=2)
            seen = sorted((m.message.body, m.delivery_attempt) for m in got)
            assert seen == [(b"later", 1), (b"unacked", 2)]
            assert sorted(m.message.msg_id for m in got) == sorted(sent[1:])
            for m in got:
                await sc.ack(m)
            assert await sc.receive(5, 1_000) == []
        cl.check_logs()


async def test_the_slave_follows_the_pop_state_and_refuses_pops(c: Cluster) -> None:
    topic, group = "PopReplicated", "pop-replicated"
    await make_topic(c, topic)
    await send(c.broker.addr, topic, [b"x", b"y"])

    async def in_flight(addr: str) -> int:
        async with RawClient(addr) as raw:
            stats = await raw.admin.GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest())
            return int(stats.extra["pop_in_flight_checkpoints"])

    async def same_on_both() -> int | None:
        master, slave = await in_flight(c.broker.addr), await in_flight(c.slaves[0].addr)
        return master if master == slave else None

    async with consumer(c, group, topic, "r") as sc:
        got = await receive_until(sc, "two messages", want=2)
        before = await until(same_on_both, "the slave applying the checkpoint")
        assert before >= 1
        for m in got:
            await sc.ack(m)
        # One or two checkpoints (one per receive that gave messages) leave on both replicas.
        await until(lambda: _below(same_on_both, before), "the slave applying the acks")
        assert await same_on_both() == before - len({m.receipt_handle.split("|")[2] for m in got})
    async with RawClient(c.slaves[0].addr) as raw:
        pop = messaging_pb2.PopRequest(consumer_group=group, topic=topic, invisible_time_ms=5000)
        code, reason, _ = await refused(raw.messaging.Pop(pop))
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)


async def _below(probe: Callable[[], Awaitable[int | None]], limit: int) -> bool:
    value = await probe()
    return value is not None and value < limit


async def test_fifo_group_holds_the_queue_until_its_batch_is_acked(c: Cluster) -> None:
    topic, group = "PopFifo", "pop-fifo"
    await make_topic(c, topic)
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.SubscriptionGroupConfig(
                    group_name=group, consume_message_orderly=True
                ),
            )
        )
    await send(c.broker.addr, topic, [b"m0", b"m1", b"m2", b"m3"])
    async with consumer(c, group, topic, "a") as a, consumer(c, group, topic, "b") as b:
        [first] = await receive_until(a, "the first message", invisible_ms=3_000)
        assert (first.message.body, first.delivery_attempt) == (b"m0", 1)
        assert await b.receive(4, 30_000) == []  # the queue waits for m0's ack
        [again] = await receive_until(b, "m0 again after its invisible time")
        assert (again.message.body, again.delivery_attempt) == (b"m0", 2)
        with pytest.raises(InvalidReceiptHandleError):
            await a.ack(first)
        await b.ack(again)
        rest: list[PoppedMessage] = []

        async def next_in_order() -> bool:
            got = await b.receive(4, 30_000)
            for m in got:
                await b.ack(m)  # each batch acked before the queue hands out the next
            rest.extend(got)
            return len(rest) >= 3

        await until(next_in_order, "the rest, in order", timeout_s=20)
        assert [(m.message.body, m.delivery_attempt) for m in rest] == [
            (b"m1", 1),
            (b"m2", 1),
            (b"m3", 1),
        ]


async def test_fifo_batch_past_max_attempts_goes_to_the_dlq_and_the_queue_moves_on(
    c: Cluster,
) -> None:
    topic, group = "PopFifoDead", "pop-fifo-dead"
    await make_topic(c, topic)
    async with RawClient(c.broker.addr) as raw:
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.SubscriptionGroupConfig(
                    group_name=group, consume_message_orderly=True, retry_max_times=1
                ),
            )
        )
    [poison, _] = await send(c.broker.addr, topic, [b"poison", b"next"])
    async with consumer(c, group, topic, "f") as sc:
        for attempt in (1, 2):  # never acked
            [m] = await receive_until(sc, f"delivery {attempt}", invisible_ms=1_000)
            assert (m.message.body, m.delivery_attempt) == (b"poison", attempt)
        [m] = await receive_until(sc, "the next message once poison is dead")
        assert (m.message.body, m.delivery_attempt) == (b"next", 1)
        await sc.ack(m)
    async with RawClient(c.broker.addr) as raw:
        resp = await raw.messaging.QueryMessageById(
            messaging_pb2.QueryMessageByIdRequest(topic=f"%DLQ%{group}", msg_id=poison)
        )
        assert [d.message.body for d in resp.messages] == [b"poison"]


def test_blocking_simple_consumer_receives_and_acks(c: Cluster) -> None:
    topic, group = "PopBlocking", "pop-blocking"
    asyncio.run(make_topic(c, topic))
    [sent] = asyncio.run(send(c.broker.addr, topic, [b"no asyncio here"]))
    cfg = SimpleConsumerConfig(
        group, tuple(c.namesrv_addrs), await_duration_ms=1_000, request_timeout_ms=10_000
    )
    with SyncSimpleConsumer(cfg) as sc:
        sc.subscribe(topic)
        got: list[PoppedMessage] = []

        def received() -> bool:
            got.extend(sc.receive(1, 30_000))
            return bool(got)

        until_sync(received, "the message", timeout_s=20)
        [m] = got
        assert (m.message.msg_id, m.message.body) == (sent, b"no asyncio here")
        m = sc.change_invisible_duration(m, 10_000)
        sc.ack(m)
        assert sc.receive(1, 30_000) == []
