"""The Admin SDK client against two real brokers: what it adds over the broker's Admin service
is the fan-out (describe, consume stats, offset reset, queries over every broker of a topic,
consumer connections merged over brokers), target resolution (cluster mode, broker mode by
name), partial-failure reporting, and dead letters (listed per broker, paged, resent)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rocketq.client.admin import Admin, ConsumerConnectionInfo, GroupConfig, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    NotFoundError,
    TopicNotFoundError,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.codec import Prop
from rocketq.message import Message, ReceivedMessage
from tests.integration.cluster import ServiceProcess
from tests.support.cluster import cluster
from tests.support.until import until

pytestmark = pytest.mark.integration


async def _wait_route(admin: Admin, topic: str, brokers: int) -> None:
    async def routed() -> bool:
        try:
            return len((await admin.route(topic)).brokers) == brokers
        except TopicNotFoundError:
            return False

    await until(routed, f"route of {topic} to show {brokers} brokers", 10)


async def test_fan_out_over_two_brokers(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=2) as c:
        await _fan_out(c.namesrv_addrs, c.brokers[1])


async def _fan_out(namesrv: list[str], broker_b: ServiceProcess) -> None:
    async with Admin(namesrv) as admin:
        info = await admin.cluster_info()
        assert info.clusters == {"DefaultCluster": ("broker-a", "broker-b")}
        assert sorted(info.masters()) == ["broker-a", "broker-b"]

        # cluster mode (the only cluster is the default target) reaches both masters
        results = await admin.create_topic(TopicConfig("fan", 2, 2))
        assert [(r.broker_name, r.code) for r in results] == [
            ("broker-a", "OK"),
            ("broker-b", "OK"),
        ]
        # broker mode, by name: only broker-b
        only_b = await admin.create_topic(TopicConfig("only-b", 3, 3), broker="broker-b")
        assert [(r.broker_name, r.code) for r in only_b] == [("broker-b", "OK")]
        await _wait_route(admin, "fan", 2)
        await _wait_route(admin, "only-b", 1)
        per_broker = await admin.broker_topics()
        assert "only-b" not in {t.topic_name for t in per_broker["broker-a"]}
        assert "only-b" in {t.topic_name for t in per_broker["broker-b"]}
        assert {"fan", "only-b"} <= set(await admin.list_topics())

        # messages land on both brokers; queries and stats gather them from both
        async with Producer(ProducerConfig("admin-it", namesrv)) as producer:
            sent = [
                await producer.send(Message("fan", f"m{i}".encode(), keys=["k-fan"]))
                for i in range(8)
            ]
        assert {r.message_queue.broker_name for r in sent} == {"broker-a", "broker-b"}
        desc = await admin.describe_topic("fan")
        assert [b.broker_name for b in desc.brokers] == ["broker-a", "broker-b"]
        assert sum(q.max_offset for b in desc.brokers for q in b.queues) == 8
        assert not desc.errors

        found = await admin.query_by_key("fan", "k-fan")
        assert {m.msg_id for m in found} == {r.msg_id for r in sent}
        assert {m.broker_name for m in found} == {"broker-a", "broker-b"}
        stamps = [m.store_timestamp_ms for m in found]
        assert stamps == sorted(stamps, reverse=True)
        assert len(await admin.query_by_key("fan", "k-fan", max_num=3)) == 3
        by_id = await admin.query_by_id("fan", sent[5].msg_id)
        assert [m.body for m in by_id] == [b"m5"]
        viewed = await admin.view_message(sent[6].offset_msg_id)
        assert viewed.body == b"m6"
        assert viewed.broker_name == sent[6].message_queue.broker_name
        with pytest.raises(MessageNotFoundError):
            await admin.query_by_id("fan", "0" * 32)

        # a group on both brokers: create, list, progress, reset to the end
        assert all(r.ok for r in await admin.create_group(GroupConfig("fan-g", retry_max_times=3)))
        groups = await admin.list_groups()
        assert {g.group_name: g.retry_max_times for g in groups["broker-b"]}["fan-g"] == 3
        reset = await admin.reset_offset("fan-g", "fan", queue_offset=0)
        assert {q.broker_name for q in reset.queues} == {"broker-a", "broker-b"}
        stats = await admin.consume_stats("fan-g", "fan")
        assert stats.total_lag == 8
        assert {q.broker_name for q in stats.queues} == {"broker-a", "broker-b"}
        end = await admin.reset_offset("fan-g", "fan", timestamp_ms=int(time.time() * 1000) + 1000)
        assert all(q.new_offset >= q.old_offset for q in end.queues)
        assert (await admin.consume_stats("fan-g", "fan")).total_lag == 0
        assert await admin.consumer_ids("fan-g") == []

        # mistakes are reported as such, before or by the brokers
        with pytest.raises(InvalidArgumentError):
            await admin.create_topic(TopicConfig("bad name"))
        with pytest.raises(InvalidArgumentError):
            await admin.create_topic(TopicConfig("q0", 0, 0))
        with pytest.raises(NotFoundError, match="no broker named"):
            await admin.create_topic("x", broker="broker-zz")
        with pytest.raises(NotFoundError, match="no cluster named"):
            await admin.create_topic("x", cluster="Nope")
        with pytest.raises(TopicNotFoundError):
            await admin.describe_topic("never-created")
        stats_b = await admin.runtime_stats("broker-b")
        assert (stats_b.broker_name, stats_b.role) == ("broker-b", "ASYNC_MASTER")
        config = await admin.broker_config("broker-a")
        assert config["brokerName"] == "broker-a"

        # a broker that stops answering is reported per broker, the rest still described
        broker_b.kill()
        partial = await admin.describe_topic("fan")
        assert [b.broker_name for b in partial.brokers] == ["broker-a"]
        assert "broker-b" in partial.errors
        assert (await admin.query_by_key("fan", "k-fan")) != []


async def test_consumer_connection_merges_members_conflicts_and_locks(tmp_path: Path) -> None:
    """Two orderly members that subscribe to a topic on two brokers differently: both brokers
    report the conflict, each member is seen by both, and every queue lock is listed with its
    broker."""
    with cluster(tmp_path, brokers=2) as c:
        await _consumer_connection(c.namesrv_addrs)


async def _consumer_connection(namesrv: list[str]) -> None:
    def listener(msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS

    async with Admin(namesrv) as admin:
        await admin.create_topic(TopicConfig("conn", 2, 2))
        await _wait_route(admin, "conn", 2)
        with pytest.raises(InvalidArgumentError):
            await admin.consumer_connection("bad group!")
        with pytest.raises(NotFoundError, match="no live member"):
            await admin.consumer_connection("conn-g")
        members = []
        for expression in ("A || B", "C"):
            consumer = PushConsumer(
                PushConsumerConfig("conn-g", tuple(namesrv)), listener, orderly=True
            )
            consumer.subscribe("conn", expression)
            await consumer.start()
            members.append(consumer)
        try:
            ids = sorted(m.client_id for m in members)
            conn_queues = {(b, q) for b in ("broker-a", "broker-b") for q in (0, 1)}

            def conn_locks(info: ConsumerConnectionInfo) -> set[tuple[str, int]]:
                return {(lk.broker_name, lk.queue_id) for lk in info.locks if lk.topic == "conn"}

            async def complete() -> ConsumerConnectionInfo | None:
                info = await admin.consumer_connection("conn-g")
                ready = (
                    [m.client_id for m in info.members] == ids
                    and all(m.broker_names == ("broker-a", "broker-b") for m in info.members)
                    and [c.broker_names for c in info.conflicts] == [("broker-a", "broker-b")]
                    and conn_locks(info) == conn_queues
                )
                return info if ready else None

            info = await until(complete, "the consumer connection to be complete", 15, 0.1)
            assert info is not None
            assert info.consume_orderly and info.message_model == "CLUSTERING"
            assert not info.errors
            [conflict] = info.conflicts
            assert conflict.topic == "conn" and conflict.pulls_refused
            by_id = {m.client_id: m.expression for m in conflict.members}
            assert by_id == {members[0].client_id: "A || B", members[1].client_id: "C"}
            assert all(lk.client_id in ids and lk.last_lock_ms > 0 for lk in info.locks)
            for m in info.members:
                assert m.addr.startswith("127.0.0.1:") and m.last_heartbeat_ms > 0
                [sub] = [s for s in m.subscriptions if s.topic == "conn"]
                assert (sub.expression_type, sub.sub_version > 0) == ("TAG", True)
        finally:
            for consumer in members:
                await consumer.close()


# ---- dead letters -------------------------------------------------------------------------------
async def test_dead_letters_listed_per_broker_paged_and_resent(tmp_path: Path) -> None:
    """A group whose listener always fails, with no redelivery allowed, sends every message of a
    topic on two brokers to its DLQ on each; the admin lists them per broker (oldest first, with
    where they came from), pages one broker by offset, and resends one to its original topic as
    a new message while it stays in the DLQ."""
    with cluster(tmp_path, brokers=2) as c:
        await _dead_letters(c.namesrv_addrs)


async def _fail_into_dlq(namesrv: list[str], topic: str, group: str, bodies: list[bytes]) -> None:
    failed: set[bytes] = set()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        failed.update(m.body for m in msgs)
        return ConsumeResult.RECONSUME_LATER

    config = PushConsumerConfig(
        group,
        tuple(namesrv),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        max_reconsume_times=0,  # the first failure makes a dead letter (no timer needed)
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe(topic, "*")
    await consumer.start()
    try:
        async with Admin(namesrv) as admin:

            async def all_dead() -> bool:
                return (await admin.dead_letters(group)).total >= len(bodies)

            try:
                await until(all_dead, "every message in the DLQ", 20, 0.1)
            except AssertionError:
                raise AssertionError(f"only {failed} failed into the DLQ") from None
    finally:
        await consumer.close()


async def _dead_letters(namesrv: list[str]) -> None:
    async with Admin(namesrv) as admin:
        await admin.create_topic(TopicConfig("dl", 2, 2))
        await _wait_route(admin, "dl", 2)
        assert (await admin.dead_letters("dl-g")).total == 0  # unknown group: empty, no error
        async with Producer(ProducerConfig("dl-p", namesrv)) as producer:
            sent = [
                await producer.send(Message("dl", f"d{i}".encode(), tags="T", keys=[f"k{i}"]))
                for i in range(6)
            ]
        by_broker = {
            b: sorted(r.msg_id for r in sent if r.message_queue.broker_name == b)
            for b in ("broker-a", "broker-b")
        }
        assert all(by_broker.values()), "round robin should reach both brokers"
        bodies = [f"d{i}".encode() for i in range(6)]
        await _fail_into_dlq(namesrv, "dl", "dl-g", bodies)

        letters = await admin.dead_letters("dl-g")
        assert not letters.errors
        assert [p.broker_name for p in letters.pages] == ["broker-a", "broker-b"]
        assert sorted(m.body for m in letters.messages) == sorted(bodies)
        for page in letters.pages:
            assert page.total == len(page.messages) == len(by_broker[page.broker_name])
            assert [m.queue_offset for m in page.messages] == list(range(page.total))
            assert page.next_offset == page.total
            for m in page.messages:
                assert m.topic == "%DLQ%dl-g" and m.broker_name == page.broker_name
                assert m.properties[Prop.RETRY_TOPIC] == "dl"
                assert m.tags == "T" and m.keys == [f"k{m.body.decode()[1:]}"]
            origins = sorted(
                m.properties.get(Prop.ORIGIN_MESSAGE_ID, m.msg_id) for m in page.messages
            )
            assert origins == by_broker[page.broker_name]

        # one broker, paged: offset and max_num
        a_total = letters.pages[0].total
        first = await admin.dead_letters("dl-g", broker="broker-a", max_num=1)
        assert [p.broker_name for p in first.pages] == ["broker-a"]
        assert [m.queue_offset for m in first.messages] == [0] and first.pages[0].next_offset == 1
        rest = await admin.dead_letters("dl-g", broker="broker-a", offset=1)
        assert [m.queue_offset for m in rest.messages] == list(range(1, a_total))

        # resend one: a new message in the original topic, the dead letter stays
        dead = letters.pages[1].messages[0]
        resent = await admin.resend_dead_letter("dl-g", dead.offset_msg_id)
        assert (resent.topic, resent.broker_name) == ("dl", "broker-b")
        assert resent.msg_id and resent.msg_id != dead.msg_id
        back = await admin.query_by_id("dl", resent.msg_id)
        assert [(m.body, m.reconsume_times, m.tags) for m in back] == [(dead.body, 0, "T")]
        assert back[0].queue_offset == resent.queue_offset
        assert (await admin.dead_letters("dl-g")).total == len(bodies)

        # mistakes
        with pytest.raises(InvalidArgumentError):
            await admin.dead_letters("bad group!")
        with pytest.raises(InvalidArgumentError):
            await admin.dead_letters("dl-g", max_num=257)
        with pytest.raises(InvalidArgumentError):
            await admin.resend_dead_letter("dl-g", "not-an-id")
        with pytest.raises(MessageNotFoundError):  # a real message, but not a dead letter
            await admin.resend_dead_letter("dl-g", sent[0].offset_msg_id)
