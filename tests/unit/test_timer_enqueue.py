"""Timer-wheel enqueue side: linking timer records into real storage, checkpoint, recovery.

ManualClock, real TimerLog / MessageLog / TimerWheel / Checkpoint in tmp_path, no sockets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketq import codec
from rocketq.codec import Prop
from services.common.clock import ManualClock
from services.timer_wheel import config as config_mod
from services.timer_wheel.config import TimerConfig
from services.timer_wheel.enqueue import TimerStore, split_records
from services.timer_wheel.timer_log import MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL

pytestmark = pytest.mark.unit

START_MS = 1_700_000_000_000
BROKER = "broker-a"


def timer_config(tmp_path: Path, **changes: object) -> TimerConfig:
    base = TimerConfig(
        data_dir=tmp_path / "data",
        wheel_slots=60,
        timer_log_file_bytes=52 * 200 + 16,
        message_log_file_bytes=1024 * 1024,
    )
    return TimerConfig(**{**base.__dict__, **changes})


def timer_record(
    out_ms: int | None,
    *,
    topic: str = "Orders",
    queue_id: int = 1,
    uniq: str = "A" * 32,
    physical_offset: int = 1000,
    extra: dict[str, str] | None = None,
    body: bytes = b"hello",
    sys_flag: int = 0,
    reconsume_times: int = 0,
) -> bytes:
    props = {Prop.REAL_TOPIC: topic, Prop.REAL_QUEUE_ID: str(queue_id), Prop.UNIQ_KEY: uniq}
    if out_ms is not None:
        props[Prop.TIMER_OUT_MS] = str(out_ms)
    props.update(extra or {})
    return codec.encode_record(
        topic_bytes=b"rmq_sys_wheel_timer",
        body=body,
        properties=codec.encode_properties(props),
        queue_id=0,
        flag=7,
        queue_offset=0,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=START_MS,
        born_host=codec.LOCALHOST,
        store_timestamp_ms=START_MS,
        store_host=codec.LOCALHOST,
        reconsume_times=reconsume_times,
    )


def records(*raws: bytes) -> list[tuple[bytes, codec.Record]]:
    return split_records(b"".join(raws))


def open_store(tmp_path: Path, clock: ManualClock, **changes: object) -> TimerStore:
    store = TimerStore(timer_config(tmp_path, **changes), clock)
    store.open()
    return store


def chain(store: TimerStore, slot_ms: int) -> list[int]:
    """deliver_ms of the slot's units, newest first."""
    slot = store.wheel.get_slot(slot_ms)
    out, pos = [], slot.last_pos
    while pos >= 0:
        unit = store.timer_log.read(pos)
        out.append(unit.deliver_ms)
        pos = unit.prev_pos
    return out


def test_records_link_into_their_slots_with_their_own_millisecond(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    store = open_store(tmp_path, clock)
    assert store.hand_ms == START_MS
    batch = records(
        timer_record(START_MS + 5_250, uniq="1" * 32),
        timer_record(START_MS + 5_900, uniq="2" * 32),
        timer_record(START_MS + 7_001, uniq="3" * 32),
    )
    assert store.accept(BROKER, batch) == 3
    assert chain(store, START_MS + 5_000) == [START_MS + 5_900, START_MS + 5_250]
    assert chain(store, START_MS + 7_000) == [START_MS + 7_001]
    unit = store.timer_log.read(store.wheel.get_slot(START_MS + 7_000).last_pos)
    assert unit.curr_write_time_ms == START_MS + 7_000 and unit.magic == MAGIC_DEFAULT
    broker, raw = store.message_log.read(unit.offset_py, unit.size_py)
    assert broker == BROKER and raw == batch[2][0]
    assert store.counters.scheduled_total == 3 and store.counters.pending == 3
    assert store.counters.overdue_on_arrival_total == 0


def test_overdue_and_unparsable_timers_go_to_the_hand_slot(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    store = open_store(tmp_path, clock)
    clock.advance_ms(3_500)
    store.hand_ms = START_MS + 3_000
    woken: list[int] = []
    store.on_hand_slot_linked = lambda: woken.append(1)
    store.accept(
        BROKER,
        records(
            timer_record(START_MS - 60_000),
            timer_record(None),
            timer_record(START_MS + 3_000, extra={Prop.TIMER_OUT_MS: "soon"}),
        ),
    )
    assert chain(store, START_MS + 3_000) == [START_MS + 3_500, START_MS + 3_500, START_MS - 60_000]
    assert len(woken) == 3
    assert store.counters.overdue_on_arrival_total == 3


def test_beyond_the_window_is_rolled_into_the_farthest_slot(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    store = open_store(tmp_path, clock)
    store.accept(BROKER, records(timer_record(START_MS + 500_000)))
    farthest = START_MS + 59_000
    slot = store.wheel.get_slot(farthest)
    unit = store.timer_log.read(slot.last_pos)
    assert unit.magic == MAGIC_DEFAULT | MAGIC_ROLL
    assert unit.curr_write_time_ms == farthest and unit.deliver_ms == START_MS + 500_000


def test_cancel_markers_get_magic_delete_and_do_not_count_as_pending(tmp_path: Path) -> None:
    store = open_store(tmp_path, ManualClock(START_MS))
    store.accept(
        BROKER,
        records(timer_record(START_MS + 9_000, extra={Prop.TIMER_DEL_UNIQKEY: "B" * 32})),
    )
    unit = store.timer_log.read(store.wheel.get_slot(START_MS + 9_000).last_pos)
    assert unit.magic == MAGIC_DEFAULT | MAGIC_DELETE
    assert store.counters.pending == 0 and store.counters.scheduled_total == 0


def test_record_without_real_topic_is_dropped(tmp_path: Path) -> None:
    store = open_store(tmp_path, ManualClock(START_MS))
    raw = timer_record(START_MS + 9_000, topic="")
    assert store.accept(BROKER, records(raw)) == 0
    assert store.counters.dropped_total == 1 and store.timer_log.max_pos == 0


def test_recovery_undoes_everything_after_the_checkpoint(tmp_path: Path) -> None:
    clock = ManualClock(START_MS)
    store = open_store(tmp_path, clock)
    store.accept(BROKER, records(timer_record(START_MS + 5_100), timer_record(START_MS + 6_100)))
    store.read_offsets[(BROKER, 0)] = 2
    assert store.checkpoint() == {(BROKER, 0): 2}
    durable_pos = store.timer_log.max_pos
    # After the checkpoint: more links into an old and a new slot, then a crash (no flush).
    store.accept(BROKER, records(timer_record(START_MS + 5_200), timer_record(START_MS + 8_100)))
    store.read_offsets[(BROKER, 0)] = 4
    store.hand_ms = START_MS + 1_000
    store.close()

    again = open_store(tmp_path, clock)
    assert again.timer_log.max_pos == durable_pos
    assert again.hand_ms == START_MS
    assert again.ckpt.queue_offsets == {(BROKER, 0): 2}
    assert chain(again, START_MS + 5_000) == [START_MS + 5_100]
    assert chain(again, START_MS + 6_000) == [START_MS + 6_100]
    assert again.wheel.get_slot(START_MS + 8_000).empty
    assert again.counters.pending == 2
    # New links continue the recovered chains.
    again.accept(BROKER, records(timer_record(START_MS + 5_300)))
    assert chain(again, START_MS + 5_000) == [START_MS + 5_300, START_MS + 5_100]


def test_config_keys_and_errors() -> None:
    cfg = config_mod.load(
        {"timerPrecisionMs": "500", "timerwheelslots": "3600", "namesrvAddr": "a:1;b:2"},
        environ={"ROCKETQ_TIMER_WHEEL_TIMER_FLUSH_INTERVAL_MS": "50", "ROCKETQ_OTHER": "x"},
    )
    assert (cfg.precision_ms, cfg.wheel_slots, cfg.flush_interval_ms) == (500, 3600, 50)
    assert cfg.namesrv_addrs == ["a:1", "b:2"] and cfg.window_ms == 1_800_000
    with pytest.raises(ValueError, match="unknown timer-wheel key 'timerBogus'"):
        config_mod.load({"timerBogus": "1"}, environ={})
    with pytest.raises(ValueError, match="timerPrecisionMs='0'"):
        config_mod.load({"timerPrecisionMs": "0"}, environ={})
    with pytest.raises(ValueError, match="divisor or multiple of 1000"):
        config_mod.load({"timerPrecisionMs": "300"}, environ={})
