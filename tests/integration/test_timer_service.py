"""Timer-wheel smoke tests with real processes: a nameserver, a broker and the timer-wheel.

Delayed sends go through the broker into rmq_sys_wheel_timer; the timer-wheel re-puts each to
its real topic no earlier than its delivery time. Covered here: on-time delivery of a spread of
delays, SIGKILL and restart without loss, CancelTimer, GetTimerStats, and a 1-minute delay
level fired in about a second on a scaled clock. (The large system tests live elsewhere.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
    timer_pb2,
)
from rocketq.codec import Prop
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

QUEUES = 4


def timer_service(root: Path, speed: float | None = None) -> AbstractContextManager[Cluster]:
    """Nameserver, broker-a (4 timer queues) and a timer-wheel flushing every 50 ms."""
    return cluster(
        root,
        timer_wheel=True,
        clock_speed=speed,
        broker_keys={"timerTopicQueueNums": QUEUES},
        timer_keys={"timerFlushIntervalMs": 50},
    )


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with timer_service(tmp_path_factory.mktemp("timer_service")) as p:
        yield p
        assert p.timer.alive(), f"timer-wheel died:\n{p.timer.log_tail()}"
        assert "Traceback" not in p.timer.log_path.read_text(errors="replace"), p.timer.log_tail()


async def send_delayed(
    stub: messaging_pb2_grpc.MessagingStub, topic: str, props: dict[str, str], queue_id: int = 0
) -> Any:
    resp = await stub.Send(
        messaging_pb2.SendRequest(
            producer_group="pg",
            default_topic="TBW102",
            queue_id=queue_id,
            messages=[common_pb2.Message(topic=topic, body=b"later", properties=props)],
        )
    )
    return resp.results[0]


async def drain(
    stub: messaging_pb2_grpc.MessagingStub,
    topic: str,
    want: int,
    timeout_s: float,
    offsets: dict[int, int] | None = None,
) -> list[common_pb2.StoredMessage]:
    """Pull every queue of ``topic`` until ``want`` messages arrived (or the timeout)."""
    offsets = offsets if offsets is not None else dict.fromkeys(range(QUEUES), 0)
    got: list[common_pb2.StoredMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for qid in range(QUEUES):
            resp = await stub.Pull(
                messaging_pb2.PullRequest(
                    consumer_group="g-check",
                    topic=topic,
                    queue_id=qid,
                    queue_offset=offsets[qid],
                    sys_flag=0x4,
                    subscription="*",
                    max_msg_nums=256,
                    decoded=True,
                )
            )
            got.extend(resp.messages)
            offsets[qid] = resp.next_begin_offset
        await asyncio.sleep(0.05)
    return got


def check_on_time(msgs: list[common_pb2.StoredMessage], late_ms_max: int) -> None:
    for m in msgs:
        out_ms = int(m.message.properties[Prop.TIMER_OUT_MS])
        assert m.store_timestamp_ms >= out_ms, "delivered early"
        assert m.store_timestamp_ms - out_ms <= late_ms_max, m.store_timestamp_ms - out_ms
        assert m.message.properties[Prop.TIMER_SOURCE]
        assert Prop.REAL_TOPIC not in m.message.properties


async def timer_stats(addr: str) -> timer_pb2.GetTimerStatsResponse:
    async with RawClient(addr) as c:
        stats: timer_pb2.GetTimerStatsResponse = await c.timer.GetTimerStats(
            timer_pb2.GetTimerStatsRequest()
        )
        return stats


async def test_delays_fire_on_time_in_their_queue(procs: Cluster) -> None:
    async with RawClient(procs.broker.addr) as broker:
        stub = broker.messaging
        await send_delayed(stub, "TwOnTime", {})  # creates the topic
        base = await drain(stub, "TwOnTime", 1, 5)
        assert len(base) == 1
        sent = {}
        for i in range(40):
            props = {Prop.TIMER_DELAY_MS: str(1000 + 50 * i), "i": str(i)}
            r = await send_delayed(stub, "TwOnTime", props, queue_id=i % QUEUES)
            sent[r.msg_id] = i % QUEUES
        r = await send_delayed(stub, "TwOnTime", {Prop.DELAY_LEVEL: "1"}, queue_id=1)
        sent[r.msg_id] = 1
        offsets = {q: (1 if q == 0 else 0) for q in range(QUEUES)}
        got = await drain(stub, "TwOnTime", len(sent), 15, offsets)
        assert sorted(m.msg_id for m in got) == sorted(sent)
        assert all(m.queue_id == sent[m.msg_id] for m in got)
        check_on_time(got, 1000)
    stats = await timer_stats(procs.timer.addr)
    assert stats.delivered_total >= len(sent) and stats.scheduled_total >= len(sent)
    assert 0 <= stats.lateness_p50_ms <= stats.lateness_p99_ms <= stats.lateness_max_ms < 1000
    assert [(q.broker_name, q.queue_id) for q in stats.queues] == [
        ("broker-a", q) for q in range(QUEUES)
    ]
    assert stats.slot_precision_ms == 1000 and stats.wheel_slots_total == 604_800


async def test_cancel_timer(procs: Cluster) -> None:
    async with RawClient(procs.broker.addr) as broker, RawClient(procs.timer.addr) as timer:
        stub, timers = broker.messaging, timer.timer
        await send_delayed(stub, "TwCancel", {Prop.TIMER_DELAY_MS: "1"})
        keep = await send_delayed(stub, "TwCancel", {Prop.TIMER_DELAY_MS: "2500"})
        drop = await send_delayed(stub, "TwCancel", {Prop.TIMER_DELAY_MS: "2500"})
        resp = await timers.CancelTimer(
            timer_pb2.CancelTimerRequest(topic="TwCancel", handle=drop.msg_id)
        )
        assert resp.delivery_timestamp_ms > 0
        for topic, handle, code in [
            ("TwCancel", drop.msg_id, grpc.StatusCode.NOT_FOUND),  # already cancelled
            ("Other", keep.msg_id, grpc.StatusCode.NOT_FOUND),
            ("TwCancel", "zz", grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await timers.CancelTimer(timer_pb2.CancelTimerRequest(topic=topic, handle=handle))
            assert err.value.code() == code, err.value.details()
        got = await drain(stub, "TwCancel", 3, 6)
        assert keep.msg_id in {m.msg_id for m in got}
        assert drop.msg_id not in {m.msg_id for m in got}
    stats = await timer_stats(procs.timer.addr)
    assert stats.cancelled_total >= 1


async def test_sigkill_and_restart_lose_nothing(tmp_path: Path) -> None:
    with timer_service(tmp_path) as procs:
        async with RawClient(procs.broker.addr) as broker:
            stub = broker.messaging
            await send_delayed(stub, "TwKill", {})
            first = await drain(stub, "TwKill", 1, 5)
            offsets = {q: (1 if q == first[0].queue_id else 0) for q in range(QUEUES)}
            sent = set()
            for i in range(60):
                r = await send_delayed(
                    stub, "TwKill", {Prop.TIMER_DELAY_MS: str(500 + 60 * i)}, queue_id=i % QUEUES
                )
                sent.add(r.msg_id)
            await asyncio.sleep(1.2)  # deliberate: the first timers fire, the rest are pending
            procs.timer.kill()
            await asyncio.sleep(0.5)  # deliberate: the timer-wheel stays down a while
            procs.restart_timer()
            got = await drain(stub, "TwKill", len(sent), 20, offsets)
            ids = [m.msg_id for m in got]
            assert set(ids) == sent
            duplicates = len(ids) - len(set(ids))
            assert duplicates == 0, duplicates  # the broker drops repeated TIMER_SOURCEs
            for m in got:
                assert m.store_timestamp_ms >= int(m.message.properties[Prop.TIMER_OUT_MS])
        assert "Traceback" not in procs.timer.log_path.read_text(errors="replace")


async def test_hour_long_level_fires_fast_on_a_scaled_clock(tmp_path: Path) -> None:
    speed = 600
    with timer_service(tmp_path, speed) as p:
        async with RawClient(p.broker.addr) as broker:
            stub = broker.messaging
            await send_delayed(stub, "TwFast", {})
            await drain(stub, "TwFast", 1, 5)

            async def owns_every_queue() -> bool:
                return len((await timer_stats(p.timer.addr)).queues) >= QUEUES

            await until(owns_every_queue, "the timer-wheel to own every timer queue", 30)
            r = await send_delayed(stub, "TwFast", {Prop.DELAY_LEVEL: "5"})  # 1 minute
            started = time.monotonic()
            got = await drain(stub, "TwFast", 2, 10)
            real_s = time.monotonic() - started
            [m] = [m for m in got if m.msg_id == r.msg_id]
            check_on_time([m], 1000 * speed)  # within 1 s of real time on a busy machine
            assert 0.05 < real_s < 5, real_s
