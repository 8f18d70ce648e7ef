"""Delayed sends on a real broker (messaging.proto Send, SPEC §8): where they are stored, who
may read them, re-put dedup, refusals. No timer-wheel runs here: these are the broker's halves.

One nameserver and one broker (timerTopicQueueNums=4) for the module; each test uses its own
topic names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from rocketq.codec import Prop
from rocketq.validation import TIMER_TOPIC
from services.broker.timer_put import TIMER_CONSUMER_GROUP, timer_queue_id
from tests.integration.cluster import ServiceProcess
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient, refused

pytestmark = pytest.mark.integration

TIMER_QUEUES = 4


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, str]]:
    root: Path = tmp_path_factory.mktemp("delayed_send")
    with cluster(root, broker_keys={"timerTopicQueueNums": TIMER_QUEUES}) as c:
        yield c.broker, c.nameserver.addr
        c.check_logs()


async def send(c: RawClient, topic: str, props: dict[str, str], queue_id: int = 0) -> Any:
    resp = await c.messaging.Send(
        messaging_pb2.SendRequest(
            producer_group="pg",
            default_topic="TBW102",
            queue_id=queue_id,
            messages=[common_pb2.Message(topic=topic, body=b"later", properties=props)],
        )
    )
    return resp.results[0]


async def pull(c: RawClient, topic: str, queue_id: int, group: str) -> messaging_pb2.PullResponse:
    resp: messaging_pb2.PullResponse = await c.messaging.Pull(
        messaging_pb2.PullRequest(
            consumer_group=group,
            topic=topic,
            queue_id=queue_id,
            sys_flag=0x4,
            subscription="*",
            max_msg_nums=32,
            decoded=True,
        )
    )
    return resp


async def test_delayed_send_waits_in_the_timer_topic(procs: tuple[ServiceProcess, str]) -> None:
    broker, _ = procs
    async with RawClient(broker.addr) as c:
        await send(c, "DsPlain", {})  # creates the topic (4 queues)
        props = {Prop.DELAY_LEVEL: "3", Prop.TAGS: "T1", Prop.KEYS: "k-ds", "u": "v"}
        sent = await send(c, "DsPlain", props, queue_id=2)
        assert sent.status == messaging_pb2.SEND_OK and sent.queue_id == 2
        qid = timer_queue_id(sent.msg_id, TIMER_QUEUES)
        got = await pull(c, TIMER_TOPIC, qid, TIMER_CONSUMER_GROUP)
        [timer] = [m for m in got.messages if m.msg_id == sent.msg_id]
        assert timer.offset_msg_id == sent.offset_msg_id
        assert timer.queue_offset == sent.queue_offset
        p = dict(timer.message.properties)
        assert (p[Prop.REAL_TOPIC], p[Prop.REAL_QUEUE_ID]) == ("DsPlain", "2")
        assert (p[Prop.TAGS], p[Prop.KEYS], p["u"]) == ("T1", "k-ds", "v")
        assert Prop.DELAY_LEVEL not in p
        lag_ms = timer.store_timestamp_ms - (int(p[Prop.TIMER_OUT_MS]) - 10_000)
        assert 0 <= lag_ms < 1000, lag_ms
        # invisible to consumers of the real topic until the timer-wheel re-puts it
        real = await pull(c, "DsPlain", 2, "g-ds")
        assert real.max_offset == 0 and not real.messages
        # absolute and relative times; a time already past is stored at once
        for extra in ({Prop.TIMER_DELAY_MS: "90000"}, {Prop.TIMER_DELIVER_MS: "1"}):
            await send(c, "DsPlain", extra, queue_id=1)
        real = await pull(c, "DsPlain", 1, "g-ds")
        assert [m.message.body for m in real.messages] == [b"later"]
        assert Prop.TIMER_DELIVER_MS not in real.messages[0].message.properties


async def test_timer_topic_is_routed_but_only_the_timer_wheel_pulls_it(
    procs: tuple[ServiceProcess, str],
) -> None:
    broker, namesrv = procs
    async with RawClient(broker.addr) as c:
        desc = await c.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(topic=TIMER_TOPIC))
        assert (desc.config.write_queue_nums, desc.config.perm) == (TIMER_QUEUES, 6)
        async with RawClient(namesrv) as ns:
            route = await ns.route(TIMER_TOPIC)
            assert [q.read_queue_nums for q in route.route.queues] == [TIMER_QUEUES]
        code, _, message = await refused(pull(c, TIMER_TOPIC, 0, "g-nosy"))
        assert code == grpc.StatusCode.PERMISSION_DENIED and TIMER_CONSUMER_GROUP in message
        code, _, _ = await refused(send(c, TIMER_TOPIC, {}))
        assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_reput_with_the_same_source_is_stored_once(procs: tuple[ServiceProcess, str]) -> None:
    broker, _ = procs
    async with RawClient(broker.addr) as c:
        await send(c, "DsReput", {})
        props = {
            Prop.TIMER_SOURCE: "123456",
            Prop.TIMER_OUT_MS: "1700000000000",
            Prop.REAL_TOPIC: "DsReput",
            Prop.REAL_QUEUE_ID: "3",
            Prop.UNIQ_KEY: "7F0000010000AAAABBBB00000000DDDD",
        }
        first = await send(c, "DsReput", props, queue_id=3)
        again = await send(c, "DsReput", props, queue_id=3)
        assert again == first
        got = await pull(c, "DsReput", 3, "g-reput")
        [m] = got.messages
        assert m.msg_id == props[Prop.UNIQ_KEY]
        assert m.message.properties[Prop.TIMER_OUT_MS] == "1700000000000"
        other = await send(c, "DsReput", {**props, Prop.TIMER_SOURCE: "123457"}, queue_id=3)
        assert other.queue_offset == first.queue_offset + 1


@pytest.mark.parametrize(
    "props",
    [
        {Prop.TIMER_DELAY_MS: str(3 * 86_400_000 + 1000)},
        {Prop.DELAY_LEVEL: "19"},
        {Prop.DELAY_LEVEL: "1", Prop.TIMER_DELAY_MS: "5"},
        {Prop.TIMER_DELIVER_MS: "noon"},
    ],
)
async def test_bad_delays_are_refused(
    procs: tuple[ServiceProcess, str], props: dict[str, str]
) -> None:
    broker, _ = procs
    async with RawClient(broker.addr) as c:
        code, reason, message = await refused(send(c, "DsBad", props))
        assert (code, reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            common_pb2.ILLEGAL_ARGUMENT,
        ), message
        if Prop.TIMER_DELAY_MS in props and len(props) == 1:
            assert "timerMaxDelaySec=259200" in message
