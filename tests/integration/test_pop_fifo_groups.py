"""FIFO pop consumption per message group (services/broker/pop/fifo.py), against real processes.

One nameserver, one broker (the v2 gateway on a free port) and its slave for the module, and
one more broker (SYNC_FLUSH, so a kill -9 loses nothing acknowledged) for the restart; each
test has its own topic (one queue, so the message groups share it) and FIFO consumer group.
Messages name their message group with the ``__SHARDINGKEY`` property, as the v2 gateway stores
a FIFO message's ``message_group``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq import PoppedMessage, SimpleConsumer, SimpleConsumerConfig
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.codec import Prop
from tests.integration.cluster import free_port
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

BROKER = "broker-a"
REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
APPS = Path(__file__).resolve().parent / "v2_apps"
APP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    port = free_port()
    keys: dict[str, object] = {"gatewayPort": port}
    with cluster(tmp_path_factory.mktemp("pop_fifo"), broker_keys=keys, slaves=1) as cl:
        yield cl, port
        cl.check_logs()


async def fifo_topic(cl: Cluster, topic: str, group: str) -> None:
    """A topic of one queue and a FIFO consumer group."""
    async with RawClient(cl.broker.addr) as raw:
        await raw.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=6
                ),
            )
        )
        await raw.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.SubscriptionGroupConfig(
                    group_name=group, consume_message_orderly=True
                ),
            )
        )
    # The broker registers a new topic on its own time; a receive looks the route up first.
    await wait_routed(cl.namesrv_addrs, topic, 1)


async def send(cl: Cluster, topic: str, bodies: list[str]) -> None:
    """Each body ``{group}-{n}`` as its own message of message group ``{group}``, in order."""
    async with RawClient(cl.broker.addr) as raw:
        for body in bodies:
            group = body.split("-")[0]
            await raw.messaging.Send(
                messaging_pb2.SendRequest(
                    producer_group="fifo-producers",
                    messages=[
                        common_pb2.Message(
                            topic=topic, body=body.encode(), properties={Prop.SHARDING_KEY: group}
                        )
                    ],
                )
            )


def consumer(cl: Cluster, group: str, topic: str, name: str) -> SimpleConsumer:
    sc = SimpleConsumer(
        SimpleConsumerConfig(
            group,
            tuple(cl.namesrv_addrs),
            await_duration_ms=1_000,
            request_timeout_ms=10_000,
            instance_name=name,
        )
    )
    sc.subscribe(topic)
    return sc


def seen(messages: list[PoppedMessage]) -> list[tuple[str, int]]:
    return [(m.message.body.decode(), m.delivery_attempt) for m in messages]


async def receive_until(
    sc: SimpleConsumer, what: str, want: int, most: int = 32, invisible_ms: int = 30_000
) -> list[PoppedMessage]:
    got: list[PoppedMessage] = []

    async def more() -> bool:
        got.extend(await sc.receive(min(most, want - len(got)), invisible_ms))
        return len(got) >= want

    await until(more, what, timeout_s=20)
    return got


async def test_two_message_groups_on_one_queue_go_to_two_consumers(
    c: tuple[Cluster, int],
) -> None:
    cl, _ = c
    topic, group = "FifoTwoGroups", "fifo-two-groups"
    await fifo_topic(cl, topic, group)
    await send(cl, topic, ["A-0", "B-0", "A-1", "B-1", "A-2", "B-2"])
    async with consumer(cl, group, topic, "one") as one, consumer(cl, group, topic, "two") as two:
        first = await receive_until(one, "the queue's first message", want=1, most=1)
        assert seen(first) == [("A-0", 1)]
        # A-0 is in flight: A waits, B goes to the other consumer, in order.
        others = await receive_until(two, "group B", want=3)
        assert seen(others) == [("B-0", 1), ("B-1", 1), ("B-2", 1)]
        assert await two.receive(32, 30_000) == []  # A-1 waits for A-0, B-3 for B-2
        await send(cl, topic, ["B-3"])
        for m in others:
            await two.ack(m)
        # B acked ahead of the unacked A-0: the slave follows that state from the revive log
        # (what a promoted slave would go on from).
        assert await until(lambda: _same_fifo_state(cl), "the slave's FIFO state") == ("1", "3")
        later = await receive_until(two, "B-3 once B is acked, while A waits", want=1)
        assert seen(later) == [("B-3", 1)]
        await one.ack(first[0])
        rest = await receive_until(two, "the rest of group A", want=2)
        assert seen(rest) == [("A-1", 1), ("A-2", 1)]
        for m in [*later, *rest]:
            await two.ack(m)
        assert await one.receive(32, 30_000) == []


async def _fifo_state(addr: str) -> tuple[str, str]:
    async with RawClient(addr) as raw:
        extra = (await raw.runtime_stats()).extra
    return extra["pop_fifo_in_flight"], extra["pop_fifo_acked_ahead"]


async def _same_fifo_state(cl: Cluster) -> tuple[str, str] | None:
    master, slave = await _fifo_state(cl.broker.addr), await _fifo_state(cl.slaves[0].addr)
    return master if master == slave else None


async def test_an_unacked_message_comes_back_before_the_rest_of_its_group(
    c: tuple[Cluster, int],
) -> None:
    cl, _ = c
    topic, group = "FifoRevive", "fifo-revive"
    await fifo_topic(cl, topic, group)
    await send(cl, topic, ["A-0", "A-1", "B-0"])
    async with consumer(cl, group, topic, "slow") as slow, consumer(cl, group, topic, "b") as b:
        [lost] = await receive_until(slow, "A-0", want=1, most=1, invisible_ms=1_500)
        assert seen([lost]) == [("A-0", 1)]
        assert seen(await receive_until(b, "B-0 while A-0 is out", want=1)) == [("B-0", 1)]
        # Never acked: after its invisible time A-0 comes back, A-1 still behind it.
        again = await receive_until(b, "A-0 again", want=1, most=1)
        assert seen(again) == [("A-0", 2)]
        await b.ack(again[0])
        assert seen(await receive_until(b, "A-1", want=1)) == [("A-1", 1)]


async def test_official_sdk_fifo_consumer_gets_one_group_while_the_other_waits(
    c: tuple[Cluster, int], tmp_path: Path
) -> None:
    cl, port = c
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    topic, group = "FifoSdkGroups", "fifo-sdk-groups"
    await fifo_topic(cl, topic, group)
    run = subprocess.run(
        [str(SDK_PYTHON), str(APPS / "fifo_groups.py"), f"127.0.0.1:{port}", topic, group, "3"],
        capture_output=True, text=True, timeout=APP_TIMEOUT_S, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, f"the SDK app failed:\n{run.stderr[-4000:]}"
    held, others, rest = json.loads(run.stdout.strip().splitlines()[-1])["receives"]
    assert held == [["g1-0", 1, "g1"]]
    assert others == [["g2-0", 1, "g2"], ["g2-1", 1, "g2"], ["g2-2", 1, "g2"]]
    assert rest == [["g1-1", 1, "g1"], ["g1-2", 1, "g1"]]


async def test_a_killed_broker_keeps_each_groups_order_and_acks(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    topic, group = "FifoRestart", "fifo-restart"
    # Its own cluster: a process restarted inside a test is reaped when the test ends.
    keys: dict[str, object] = {"flushDiskType": "SYNC_FLUSH"}
    with cluster(tmp_path_factory.mktemp("pop_fifo_restart"), broker_keys=keys) as cl:
        await _killed_broker_scenario(cl, topic, group)
        cl.check_logs()


async def _killed_broker_scenario(cl: Cluster, topic: str, group: str) -> None:
    await fifo_topic(cl, topic, group)
    await send(cl, topic, ["A-0", "B-0", "A-1", "B-1"])
    async with consumer(cl, group, topic, "before") as sc:
        got = await receive_until(sc, "A-0 and B-0", want=2, most=2, invisible_ms=3_000)
        assert seen(got) == [("A-0", 1), ("B-0", 1)]
        await sc.ack(got[1])  # B-0 acked out of order; A-0 in flight
    cl.broker.kill()
    cl.restart(cl.broker)
    async with consumer(cl, group, topic, "after") as sc:
        after: list[PoppedMessage] = []

        async def one_more() -> bool:  # one at a time, each acked before the next
            for m in await sc.receive(1, 30_000):
                await sc.ack(m)
                after.append(m)
            return len(after) >= 3

        await until(one_more, "the rest after the restart", timeout_s=20)
        order = [body for body, _ in seen(after)]
        # B-0 stays acked; A-0 was still in flight (attempt 2 now) and A-1 stayed behind it.
        assert sorted(seen(after)) == [("A-0", 2), ("A-1", 1), ("B-1", 1)]
        assert order.index("A-0") < order.index("A-1")
        assert await sc.receive(32, 30_000) == []
