"""Timer-wheel dequeue side: the hand delivers each timer at its own millisecond, never early.

ManualClock, real storage in tmp_path, a fake broker client that records Send requests (and
fails on demand); ``Dequeuer.tick`` is driven directly, so nothing sleeps.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.errors import BrokerUnavailableError, TopicNotFoundError
from rocketq.codec import Prop, SysFlag
from services.common.clock import ManualClock
from services.timer_wheel import TIMER_GROUP
from services.timer_wheel.dequeue import Dequeuer, read_reput
from services.timer_wheel.enqueue import TimerStore
from tests.unit.test_timer_enqueue import (
    BROKER,
    START_MS,
    open_store,
    records,
    timer_config,
    timer_record,
)

pytestmark = pytest.mark.unit


class FakeBroker:
    """Records every Send with the clock time it arrived; fails the next ``fail`` sends."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[tuple[int, str, messaging_pb2.SendRequest]] = []
        self.fail: list[Exception] = []

    async def send(
        self, broker_name: str, request: messaging_pb2.SendRequest
    ) -> messaging_pb2.SendResponse:
        if self.fail:
            raise self.fail.pop(0)
        self.sent.append((self.clock.now_ms(), broker_name, request))
        return messaging_pb2.SendResponse()

    def delivered(self) -> list[tuple[int, str]]:
        """(arrival ms, UNIQ_KEY) of every re-put message."""
        return [
            (at, m.properties[Prop.UNIQ_KEY]) for at, _b, req in self.sent for m in req.messages
        ]


async def no_sleep(_s: float) -> None:
    return None


def make(tmp_path: Path, **changes: object) -> tuple[ManualClock, TimerStore, FakeBroker, Dequeuer]:
    clock = ManualClock(START_MS)
    store = open_store(tmp_path, clock, **changes)
    broker = FakeBroker(clock)
    dq = Dequeuer(store, broker, clock, timer_config(tmp_path, **changes), sleep=no_sleep)
    return clock, store, broker, dq


async def run_until(clock: ManualClock, dq: Dequeuer, end_ms: int, step_ms: int = 10) -> None:
    """Tick every ``step_ms`` of clock time up to ``end_ms``."""
    while True:
        await dq.tick()
        if clock.now_ms() >= end_ms:
            return
        clock.advance_ms(step_ms)


async def test_each_timer_fires_at_its_millisecond_in_order_and_never_early(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path)
    due = {"3" * 32: 2_730, "1" * 32: 2_120, "2" * 32: 2_500, "4" * 32: 4_050}
    store.accept(
        BROKER,
        records(*(timer_record(START_MS + ms, uniq=u) for u, ms in due.items())),
    )
    await run_until(clock, dq, START_MS + 6_000)
    got = broker.delivered()
    assert [u for _at, u in got] == ["1" * 32, "2" * 32, "3" * 32, "4" * 32]
    for at, uniq in got:
        assert START_MS + due[uniq] <= at < START_MS + due[uniq] + 10
    assert store.hand_ms == START_MS + 6_000  # every slot that has ended is done
    c = store.counters
    assert (c.delivered_total, c.pending) == (4, 0)
    assert len(c.lateness_ms) == 4 and max(c.lateness_ms) < 10


async def test_reput_carries_the_record_to_its_real_topic_and_queue(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path)
    body = zlib.compress(b"x" * 1000)
    raw = timer_record(
        START_MS + 1_500,
        topic="%RETRY%g1",
        queue_id=3,
        physical_offset=987_654,
        body=body,
        sys_flag=SysFlag.COMPRESSED,
        reconsume_times=2,
        extra={Prop.TAGS: "t", "user": "v", Prop.RETRY_TOPIC: "Orders"},
    )
    store.accept(BROKER, records(raw))
    await run_until(clock, dq, START_MS + 2_000)
    ((at, broker_name, req),) = broker.sent
    assert broker_name == BROKER and at == START_MS + 1_500
    assert req.producer_group == TIMER_GROUP and req.queue_id == 3
    assert req.sys_flag == SysFlag.COMPRESSED and req.reconsume_times == 2
    (msg,) = req.messages
    assert msg.topic == "%RETRY%g1" and msg.body == body and msg.flag == 7
    props = dict(msg.properties)
    assert Prop.REAL_TOPIC not in props and Prop.REAL_QUEUE_ID not in props
    assert props[Prop.TIMER_SOURCE] == "987654"
    assert props[Prop.TIMER_DEQUEUE_MS] == str(START_MS + 1_500)
    assert props[Prop.TIMER_OUT_MS] == str(START_MS + 1_500)
    assert props["user"] == "v" and props[Prop.TAGS] == "t" and props[Prop.RETRY_TOPIC] == "Orders"


async def test_a_cancel_marker_in_the_slot_skips_its_timer(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path)
    store.accept(
        BROKER,
        records(
            timer_record(START_MS + 3_400, uniq="A" * 32),
            timer_record(START_MS + 3_600, uniq="B" * 32),
        ),
    )
    clock.advance_ms(1_000)
    marker = timer_record(START_MS + 3_400, uniq="A" * 32, extra={Prop.TIMER_DEL_UNIQKEY: "A" * 32})
    store.accept(BROKER, records(marker))
    await run_until(clock, dq, START_MS + 5_000)
    assert [u for _at, u in broker.delivered()] == ["B" * 32]
    assert store.counters.cancelled_total == 1


async def test_arrivals_for_the_open_slot_and_overdue_ones_are_picked_up(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path)
    store.accept(BROKER, records(timer_record(START_MS + 1_900, uniq="L" * 32)))
    await run_until(clock, dq, START_MS + 1_200)  # slot 1000 open, its timer waiting
    assert broker.sent == []
    store.accept(
        BROKER,
        records(
            timer_record(START_MS + 1_300, uniq="N" * 32),
            timer_record(START_MS - 50_000, uniq="O" * 32),
        ),
    )
    await run_until(clock, dq, START_MS + 2_500)
    got = broker.delivered()
    assert [u for _at, u in got] == ["O" * 32, "N" * 32, "L" * 32]
    assert got[0][0] == START_MS + 1_200 and got[1][0] == START_MS + 1_300
    assert got[2][0] == START_MS + 1_900


async def test_rolled_timer_is_relinked_and_fires_on_time(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path, wheel_slots=5)  # 5 s window
    store.accept(BROKER, records(timer_record(START_MS + 12_345, uniq="R" * 32)))
    await run_until(clock, dq, START_MS + 12_300, step_ms=50)
    assert broker.sent == []
    await run_until(clock, dq, START_MS + 13_000, step_ms=5)
    ((at, _u),) = broker.delivered()
    assert START_MS + 12_345 <= at < START_MS + 12_350


async def test_broker_down_holds_the_hand_until_the_send_succeeds(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path)
    store.accept(BROKER, records(timer_record(START_MS + 1_100)))
    broker.fail = [BrokerUnavailableError("down")] * 20
    await run_until(clock, dq, START_MS + 3_000)
    assert len(broker.sent) == 1 and broker.fail == []
    # Refused forever (topic gone): given up after a few attempts, counted.
    store.accept(BROKER, records(timer_record(START_MS + 3_500, uniq="G" * 32)))
    broker.fail = [TopicNotFoundError("gone")] * 10
    await run_until(clock, dq, START_MS + 5_000)
    assert len(broker.sent) == 1 and store.counters.dropped_total == 1


async def test_many_due_at_once_go_out_in_batches_per_queue(tmp_path: Path) -> None:
    clock, store, broker, dq = make(tmp_path, timer_log_file_bytes=52 * 2000 + 16)
    raws = [
        timer_record(START_MS + 1_000 + i % 7, queue_id=i % 2, uniq=f"{i:032X}") for i in range(600)
    ]
    store.accept(BROKER, records(*raws))
    clock.advance_ms(1_500)
    await dq.tick()
    sizes = sorted(len(req.messages) for _at, _b, req in broker.sent)
    assert sum(sizes) == 600 and max(sizes) == 256
    assert {req.queue_id for _at, _b, req in broker.sent} == {0, 1}


async def test_hand_is_checkpointed_and_resumed(tmp_path: Path) -> None:
    clock, store, _broker, dq = make(tmp_path)
    store.accept(BROKER, records(timer_record(START_MS + 1_500), timer_record(START_MS + 4_500)))
    await run_until(clock, dq, START_MS + 3_200)
    store.checkpoint()
    store.close()
    again = open_store(tmp_path, clock)
    assert again.hand_ms == START_MS + 3_000
    assert again.counters.pending == 1  # the 4.5 s timer is still linked
    broker2 = FakeBroker(clock)
    dq2 = Dequeuer(again, broker2, clock, timer_config(tmp_path), sleep=no_sleep)
    await run_until(clock, dq2, START_MS + 5_000)
    assert [at for at, _u in broker2.delivered()] == [START_MS + 4_500]


def test_reput_fields_match_the_full_decoder_for_ipv6_hosts() -> None:
    host = codec.HostAddress(bytes(range(16)), 10911)
    raw = codec.encode_record(
        topic_bytes=b"rmq_sys_wheel_timer",
        body=b"payload",
        properties=codec.encode_properties({Prop.REAL_TOPIC: "T", "k": "v"}),
        queue_id=1,
        flag=3,
        queue_offset=9,
        physical_offset=123_456,
        sys_flag=0,
        born_timestamp_ms=START_MS,
        born_host=host,
        store_timestamp_ms=START_MS,
        store_host=host,
        reconsume_times=5,
    )
    full = codec.decode_record(raw)
    lean = read_reput(raw)
    assert (lean.flag, lean.sys_flag, lean.physical_offset, lean.reconsume_times) == (
        full.flag,
        full.sys_flag,
        full.physical_offset,
        full.reconsume_times,
    )
    assert (lean.body, lean.properties) == (full.body, full.properties)
    with pytest.raises(codec.CorruptRecord):
        read_reput(raw[:-1])
