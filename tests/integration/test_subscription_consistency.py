"""SPEC §6.17's subscription-consistency pitfall, reproduced against real nameserver and broker
processes with the rocketq SDK.

Group G: consumer 1 subscribes topicA with "tag1 || tag2", consumer 2 with "tag3"; the producer
sends 10 messages of each tag. RocketMQ shares topicA's queues between them whatever they
subscribe to, so each member's filter skips (and commits past) what the other wanted.

- strictSubscriptionConsistency=true (the default): the conflict is reported (Admin, each
  consumer's client), the group's pulls of topicA are refused, nothing is consumed and no
  committed offset moves; once a rolling change of the subscription completes (consumer 2
  replaced by one with "tag1 || tag2 || tag3", then consumer 1 re-subscribing alike) the members
  agree and every message is consumed: nothing is lost.
- strictSubscriptionConsistency=false: reported only, and the loss RocketMQ shows happens: the
  group's offsets reach the end of every queue while some tag3 messages never reach consumer 2.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.admin import Admin, ConsumerConnectionInfo, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.errors import (
    NotFoundError,
    RocketQError,
    SubscriptionInconsistentError,
    from_rpc_error,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, ReceivedMessage
from tests.support.cluster import cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

GROUP = "G"
TOPIC = "topicA"
QUEUES = 4
PER_TAG = 10
TAGS = ("tag1", "tag2", "tag3")
#: How long "nothing is consumed" is watched: consumers retry a refused pull every 3 s.
QUIET_S = 3.5
FLAG_SUBSCRIPTION = 0x4


class Deliveries:
    """Bodies each consumer's listener got (listeners run on the event loop or in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_consumer: dict[str, list[str]] = {}

    def listener(
        self, name: str
    ) -> Callable[[list[ReceivedMessage], ConsumeContext], ConsumeResult]:
        def on_messages(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            with self._lock:
                self._by_consumer.setdefault(name, []).extend(m.body.decode() for m in msgs)
            return ConsumeResult.CONSUME_SUCCESS

        return on_messages

    def of(self, name: str | None = None) -> list[str]:
        with self._lock:
            if name is not None:
                return list(self._by_consumer.get(name, []))
            return [b for bodies in self._by_consumer.values() for b in bodies]


async def make_topic(admin: Admin, namesrv: list[str]) -> None:
    await admin.create_topic(TopicConfig(TOPIC, QUEUES, QUEUES))
    await wait_routed(namesrv, TOPIC, QUEUES)


async def start_consumer(
    namesrv: list[str], deliveries: Deliveries, name: str, expression: str
) -> PushConsumer:
    config = PushConsumerConfig(
        GROUP,
        tuple(namesrv),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        persist_consumer_offset_interval_ms=500,
    )
    consumer = PushConsumer(config, deliveries.listener(name))
    consumer.subscribe(TOPIC, expression)
    await consumer.start()
    return consumer


async def send_interleaved(namesrv: list[str]) -> dict[str, set[str]]:
    """10 messages of each tag, tags interleaved so every queue holds every tag."""
    sent: dict[str, set[str]] = {tag: set() for tag in TAGS}
    async with Producer(ProducerConfig("pg-consistency", namesrv)) as producer:
        for i in range(PER_TAG * len(TAGS)):
            tag = TAGS[i % len(TAGS)]
            body = f"{tag}-{i}"
            await producer.send(Message(TOPIC, body.encode(), tags=tag))
            sent[tag].add(body)
    return sent


def conflict_views(conn: ConsumerConnectionInfo) -> dict[str, list[tuple[str, str | None]]]:
    return {c.topic: [(m.client_id, m.expression) for m in c.members] for c in conn.conflicts}


async def committed(admin: Admin) -> list[int]:
    """The group's committed offsets of topicA's queues (-1 = none; empty list if no queue
    has one yet)."""
    stats = await admin.consume_stats(GROUP, TOPIC)
    return [q.consumer_offset for q in stats.queues if q.topic == TOPIC]


async def all_committed(admin: Admin) -> bool:
    """Whether the group's offsets reached the end of every queue of topicA."""
    return sum(await committed(admin)) == PER_TAG * len(TAGS)


def conflict_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """ERROR lines the SDK logged about a conflict on topicA in group G."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rocketq.client._instance"
        and r.levelno == logging.ERROR
        and f"group {GROUP}: members subscribe to {TOPIC} differently" in r.getMessage()
    ]


async def raw_pull(admin: Admin, expression: str) -> RocketQError | None:
    """One Messaging.Pull of topicA queue 0 by group G; the SDK error it failed with, if any."""
    addr = (await admin.cluster_info()).masters()["broker-a"]
    request = messaging_pb2.PullRequest(
        consumer_group=GROUP,
        topic=TOPIC,
        queue_id=0,
        sys_flag=FLAG_SUBSCRIPTION,
        subscription=expression,
        expression_type=common_pb2.TAG,
    )
    async with RawClient(addr) as raw:
        try:
            await raw.messaging.Pull(request, timeout=5)
        except grpc.aio.AioRpcError as err:
            return from_rpc_error(err, addr)
    return None


def known_conflicts(consumer: PushConsumer) -> list[tuple[str, tuple[tuple[str, str | None], ...]]]:
    """The consumer's own view of the notices (PushConsumer.subscription_conflicts)."""
    return [(c.topic, c.members) for c in consumer.subscription_conflicts()]


def owned(consumer: PushConsumer) -> int:
    """How many of topicA's queues the consumer owns."""
    return sum(mq.topic == TOPIC for mq in consumer.assigned_queues())


def owns_half(consumer: PushConsumer) -> Callable[[], bool]:
    return lambda: owned(consumer) == QUEUES // 2


def knows(
    consumer: PushConsumer, want: list[tuple[str, tuple[tuple[str, str | None], ...]]]
) -> Callable[[], bool]:
    return lambda: known_conflicts(consumer) == want


async def test_strict_refuses_pulls_until_members_agree_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rocketq.client._instance")
    with cluster(tmp_path) as c:
        await _strict(c.namesrv_addrs, caplog)


async def _check_reported(
    admin: Admin, caplog: pytest.LogCaptureFixture, c1: PushConsumer, c2: PushConsumer
) -> None:
    """Admin shows the conflict and each member's subscriptions; both clients got the notice."""
    assert c1.client_id != c2.client_id
    expected = sorted([(c1.client_id, "tag1 || tag2"), (c2.client_id, "tag3")])

    async def reported() -> bool:
        return conflict_views(await admin.consumer_connection(GROUP)) == {TOPIC: expected}

    await until(reported, "Admin to report the conflict", timeout_s=20.0)
    conn = await admin.consumer_connection(GROUP)
    [conflict] = conn.conflicts
    assert conflict.pulls_refused and conflict.broker_names == ("broker-a",)
    assert (conn.consume_type, conn.message_model) == ("CONSUME_TYPE_PUSH", "CLUSTERING")
    subs = {m.client_id: {s.topic: s.expression for s in m.subscriptions} for m in conn.members}
    assert subs == {
        c1.client_id: {TOPIC: "tag1 || tag2", f"%RETRY%{GROUP}": "*"},
        c2.client_id: {TOPIC: "tag3", f"%RETRY%{GROUP}": "*"},
    }
    # each consumer's client heard the notice, logged it at ERROR and keeps it
    await until(lambda: len(conflict_errors(caplog)) >= 2, "both clients to log it", timeout_s=20.0)
    assert all("refuses the group's pulls" in line for line in conflict_errors(caplog))
    for consumer in (c1, c2):
        await until(
            knows(consumer, [(TOPIC, tuple(expected))]), "the notice to be kept", timeout_s=20.0
        )
    # a pull of the topic by the group is refused with a reason the SDK maps to its own error
    refused = await raw_pull(admin, "tag1 || tag2")
    assert isinstance(refused, SubscriptionInconsistentError)
    assert (refused.reason, refused.code) == ("SUBSCRIPTION_INCONSISTENT", "FAILED_PRECONDITION")
    assert refused.metadata["consumer_group"] == GROUP and refused.metadata["topic"] == TOPIC
    assert c1.client_id in refused.metadata["members"] and "'tag3'" in refused.metadata["members"]


async def _strict(namesrv: list[str], caplog: pytest.LogCaptureFixture) -> None:
    deliveries = Deliveries()
    async with Admin(namesrv) as admin:
        await make_topic(admin, namesrv)
        with pytest.raises(NotFoundError, match="no live member"):
            await admin.consumer_connection(GROUP)
        c1 = await start_consumer(namesrv, deliveries, "c1", "tag1 || tag2")
        c2: PushConsumer | None = None
        c3: PushConsumer | None = None  # consumer 2's replacement, later
        try:
            # Consumer 1 alone owns every queue and has pulls held (long polling) on the broker
            # when consumer 2 joins: those pulls must not be served once the conflict exists.
            await until(
                lambda: owned(c1) == QUEUES, "consumer 1 to own every queue", timeout_s=20.0
            )

            async def held() -> bool:
                return (await admin.runtime_stats("broker-a")).held_pull_requests >= QUEUES

            await until(held, "consumer 1's pulls to be held", timeout_s=20.0)
            c2 = await start_consumer(namesrv, deliveries, "c2", "tag3")
            await _check_reported(admin, caplog, c1, c2)

            sent = await send_interleaved(namesrv)
            await asyncio.sleep(QUIET_S)
            assert deliveries.of() == [], "a pull of a topic in conflict was served"
            assert all(o <= 0 for o in await committed(admin)), "offsets moved"

            # A rolling change: consumer 2 is replaced by one that wants every tag, started
            # before consumer 2 leaves (were consumer 1 ever alone, it would rightly consume as
            # the whole group). Consumer 1 still subscribes "tag1 || tag2": they still disagree.
            c3 = await start_consumer(namesrv, deliveries, "c3", "tag1 || tag2 || tag3")
            await c2.close()
            still = sorted([(c1.client_id, "tag1 || tag2"), (c3.client_id, "tag1 || tag2 || tag3")])

            async def changed() -> bool:
                return conflict_views(await admin.consumer_connection(GROUP)) == {TOPIC: still}

            await until(changed, "the conflict to name consumer 3", timeout_s=20.0)
            await asyncio.sleep(QUIET_S)
            assert deliveries.of() == []

            # Consumer 1 re-subscribes like consumer 3: they agree, consumption resumes by itself.
            c1.subscribe(TOPIC, "tag1 || tag2 || tag3")

            async def agreed() -> bool:
                return (await admin.consumer_connection(GROUP)).conflicts == ()

            await until(agreed, "the conflict to end", timeout_s=20.0)
            everything = set().union(*sent.values())
            await until(
                lambda: set(deliveries.of()) >= everything,
                "every message to be consumed",
                timeout_s=30,
            )
            assert set(deliveries.of()) == everything
            assert known_conflicts(c1) == [] and known_conflicts(c3) == []
            await until(
                lambda: all_committed(admin), "offsets to reach every queue's end", timeout_s=20.0
            )
        finally:
            for left in [c1, c2, c3]:
                if left is not None:
                    await left.close()


async def test_lenient_only_reports_and_the_loss_happens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rocketq.client._instance")
    with cluster(tmp_path, broker_keys={"strictSubscriptionConsistency": False}) as c:
        await _lenient(c.namesrv_addrs, caplog)


async def _lenient(namesrv: list[str], caplog: pytest.LogCaptureFixture) -> None:
    deliveries = Deliveries()
    async with Admin(namesrv) as admin:
        await make_topic(admin, namesrv)
        c1 = await start_consumer(namesrv, deliveries, "c1", "tag1 || tag2")
        c2 = await start_consumer(namesrv, deliveries, "c2", "tag3")
        try:

            async def reported() -> bool:
                return bool((await admin.consumer_connection(GROUP)).conflicts)

            await until(reported, "Admin to report the conflict", timeout_s=20.0)
            [conflict] = (await admin.consumer_connection(GROUP)).conflicts
            assert conflict.topic == TOPIC and not conflict.pulls_refused
            assert await raw_pull(admin, "tag3") is None  # served: reported only
            await until(
                lambda: len(conflict_errors(caplog)) >= 2, "both clients to log it", timeout_s=20.0
            )
            assert all("only reports it" in line for line in conflict_errors(caplog))
            for consumer in (c1, c2):
                await until(
                    owns_half(consumer), "each consumer to own half of the queues", timeout_s=20.0
                )

            sent = await send_interleaved(namesrv)
            # The group's offsets reach the end of every queue: as far as the broker knows,
            # everything was consumed...
            await until(
                lambda: all_committed(admin), "offsets to reach every queue's end", timeout_s=20.0
            )
            # A member records a delivery before its offset moves past it: nothing to wait for.
            got1, got2 = set(deliveries.of("c1")), set(deliveries.of("c2"))
            assert got1 <= sent["tag1"] | sent["tag2"] and got2 <= sent["tag3"]
            # ...yet each member only saw its own tags of the queues it was given: the tag3
            # messages of consumer 1's queues (and the tag1/tag2 ones of consumer 2's) are lost.
            assert got2 and len(got2) < PER_TAG, f"consumer 2 got {len(got2)} of {PER_TAG}"
            assert got1 and len(got1) < 2 * PER_TAG
        finally:
            await c1.close()
            await c2.close()
