"""Timer storage (SPEC §8.2, §11.4): TimerLog units, TimerWheel slots, MessageLog, Checkpoint."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common import failpoints
from services.timer_wheel.checkpoint import Checkpoint, CheckpointError
from services.timer_wheel.message_log import MessageLog
from services.timer_wheel.timer_log import (
    BLANK_MAGIC_CODE,
    MAGIC_DEFAULT,
    MAGIC_DELETE,
    MAGIC_ROLL,
    UNIT_SIZE,
    PositionError,
    TimerLog,
    TimerUnit,
    TornRecordError,
)
from services.timer_wheel.wheel import EMPTY_SLOT, SLOT_SIZE, Slot, TimerWheel

pytestmark = pytest.mark.unit

# Four units fit a file (the fifth would leave less than a 16-byte blank), then a 30-byte blank.
SMALL_LOG_BYTES = 4 * UNIT_SIZE + 30


@pytest.fixture
def no_failpoints() -> Iterator[None]:
    failpoints.reload("")
    yield
    failpoints.reload("")


def unit(n: int, prev_pos: int = -1, magic: int = MAGIC_DEFAULT) -> TimerUnit:
    return TimerUnit(
        prev_pos=prev_pos,
        magic=magic,
        curr_write_time_ms=1_700_000_000_000 + n,
        delayed_time_ms=1000 * n,
        offset_py=100 * n,
        size_py=10 + n,
        hash_topic=-n,
    )


def append_n(log: TimerLog, count: int) -> list[int]:
    return [log.append(unit(i)) for i in range(count)]


# ---- TimerLog ------------------------------------------------------------------------------
def test_unit_bytes_follow_the_spec_table(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    u = TimerUnit(
        prev_pos=7,
        magic=MAGIC_DEFAULT | MAGIC_ROLL,
        curr_write_time_ms=1_700_000_000_123,
        delayed_time_ms=-5,
        offset_py=1 << 40,
        size_py=321,
        hash_topic=-123456,
    )
    assert log.append(u) == 0
    assert log.read(0) == u
    assert u.deliver_ms == 1_700_000_000_118
    log.flush()
    log.close()
    raw = (tmp_path / "timerlog" / "00000000000000000000").read_bytes()[:UNIT_SIZE]
    fields = struct.unpack(">iqiqiqiiq", raw)
    assert fields == (52, 7, 3, 1_700_000_000_123, -5, 1 << 40, 321, -123456, 0)


def test_units_roll_to_the_next_file_after_a_blank(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    positions = append_n(log, 10)
    f = SMALL_LOG_BYTES
    assert positions == [0, 52, 104, 156, f, f + 52, f + 104, f + 156, 2 * f, 2 * f + 52]
    assert [log.read(p) for p in positions] == [unit(i) for i in range(10)]
    with pytest.raises(TornRecordError, match="blank"):
        log.read(208)
    names = sorted(p.name for p in (tmp_path / "timerlog").iterdir())
    assert names[:3] == ["00000000000000000000", f"{f:020d}", f"{2 * f:020d}"]
    raw = (tmp_path / "timerlog" / names[0]).read_bytes()
    assert struct.unpack_from(">iqi", raw, 208) == (30, 0, BLANK_MAGIC_CODE)
    assert [p for p, _ in log.iter_units(0)] == positions
    assert [p for p, _ in log.iter_units(104, f + 104)] == [104, 156, f, f + 52]
    assert log.max_pos == 2 * f + 104


def test_reads_outside_or_between_units_fail_clearly(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    append_n(log, 2)
    with pytest.raises(PositionError, match="written up to 104"):
        log.read(104)
    with pytest.raises(PositionError, match="boundary"):
        log.read(26)
    with pytest.raises(PositionError):
        log.read(-52)


def test_a_torn_unit_reads_as_an_error_and_reopening_ends_the_log_before_it(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    append_n(log, 3)
    log.flush()
    first_file = directory / "00000000000000000000"
    # A crash tore unit 1 (its magic never reached the disk) while unit 2 did.
    fd = os.open(first_file, os.O_WRONLY)
    os.pwrite(fd, bytes(4), 52 + 12)
    os.close(fd)
    with pytest.raises(TornRecordError, match="torn"):
        log.read(52)
    log.close()
    reopened = TimerLog(directory, SMALL_LOG_BYTES)
    assert reopened.max_pos == 52
    assert reopened.append(unit(9)) == 52
    assert reopened.read(52) == unit(9)


def test_invalid_units_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    with pytest.raises(ValueError, match="invalid"):
        log.append(unit(1, magic=MAGIC_ROLL))  # MAGIC_DEFAULT missing
    with pytest.raises(ValueError, match="invalid"):
        log.append(unit(1, magic=8 | MAGIC_DEFAULT))
    too_far = TimerUnit(
        prev_pos=-1,
        magic=MAGIC_DEFAULT,
        curr_write_time_ms=0,
        delayed_time_ms=1 << 31,  # does not fit the signed int32 field
        offset_py=0,
        size_py=1,
        hash_topic=0,
    )
    with pytest.raises(ValueError, match="out of range"):
        log.append(too_far)
    assert log.max_pos == 0
    assert log.append(unit(1, magic=MAGIC_DEFAULT | MAGIC_DELETE)) == 0


def test_truncate_to_drops_the_tail_and_appends_reuse_its_positions(tmp_path: Path) -> None:
    directory = tmp_path / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    positions = append_n(log, 7)
    assert log.truncate_to(positions[2]) == positions[6] + UNIT_SIZE - positions[2]
    assert log.max_pos == positions[2]
    with pytest.raises(PositionError):
        log.read(positions[2])
    assert not (directory / f"{SMALL_LOG_BYTES:020d}").exists()
    assert log.append(unit(20)) == positions[2]
    with pytest.raises(PositionError, match="boundary"):
        log.truncate_to(10)
    with pytest.raises(PositionError, match="ends at"):
        log.truncate_to(log.max_pos + 52)
    log.flush()
    log.close()
    reopened = TimerLog(directory, SMALL_LOG_BYTES)
    assert reopened.max_pos == positions[2] + 52
    assert [u for _, u in reopened.iter_units(0)] == [unit(0), unit(1), unit(20)]


def test_truncate_to_a_file_boundary_and_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    append_n(log, 6)
    dropped = log.truncate_to(SMALL_LOG_BYTES)
    assert dropped == 2 * UNIT_SIZE
    assert log.max_pos == SMALL_LOG_BYTES
    log.close()
    reopened = TimerLog(directory, SMALL_LOG_BYTES)
    assert reopened.max_pos == SMALL_LOG_BYTES
    assert reopened.append(unit(6)) == SMALL_LOG_BYTES
    assert [u for _, u in reopened.iter_units(0)] == [*[unit(i) for i in range(4)], unit(6)]


def test_reopen_finds_the_end_past_precreated_files(tmp_path: Path) -> None:
    directory = tmp_path / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    positions = append_n(log, 4)  # exactly one full file; the next is created ahead, empty
    log.close()
    reopened = TimerLog(directory, SMALL_LOG_BYTES)
    assert reopened.max_pos == positions[-1] + UNIT_SIZE
    assert reopened.append(unit(4)) == SMALL_LOG_BYTES  # the blank goes in, the unit rolls
    assert [u for _, u in reopened.iter_units(0)] == [unit(i) for i in range(5)]


def test_delete_files_before_removes_whole_files_only(tmp_path: Path) -> None:
    directory = tmp_path / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    positions = append_n(log, 10)  # files 0, 1 full; file 2 being written
    assert log.delete_files_before(positions[5]) == 1  # file 1 still holds positions[5]
    assert log.min_pos == SMALL_LOG_BYTES
    with pytest.raises(PositionError, match="deleted"):
        log.read(positions[0])
    assert log.read(positions[4]) == unit(4)
    assert log.delete_files_before(10**9) == 1  # the file being written is kept
    assert log.read(positions[9]) == unit(9)
    log.close()
    reopened = TimerLog(directory, SMALL_LOG_BYTES)
    assert reopened.min_pos == 2 * SMALL_LOG_BYTES
    assert reopened.max_pos == positions[9] + UNIT_SIZE


def test_timer_log_flush_failpoint(tmp_path: Path, no_failpoints: None) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    append_n(log, 2)
    failpoints.reload("timer_log_before_flush=error")
    with pytest.raises(failpoints.FailpointError):
        log.flush()
    failpoints.reload("")
    assert log.flush() == 2 * UNIT_SIZE


# ---- TimerWheel ----------------------------------------------------------------------------
def test_wheel_file_size_and_slot_bytes(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=10, precision_ms=1000)
    assert wheel.window_ms == 10_000
    wheel.put_slot(12_345, 52, 104, 2, magic=3)
    wheel.flush()
    wheel.close()
    raw = (tmp_path / "timerwheel").read_bytes()
    assert len(raw) == 10 * 2 * SLOT_SIZE
    index = 12_345 // 1000 % 20
    assert struct.unpack_from(">qqqii", raw, index * SLOT_SIZE) == (12, 52, 104, 2, 3)
    reopened = TimerWheel(tmp_path / "timerwheel", slots_total=10, precision_ms=1000)
    assert reopened.get_slot(12_999) == Slot(12_000, 52, 104, 2, 3)
    with pytest.raises(ValueError, match="timerWheelSlots"):
        TimerWheel(tmp_path / "timerwheel", slots_total=11)


def test_default_wheel_is_the_spec_size(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "timerwheel")
    assert (tmp_path / "timerwheel").stat().st_size == 38_707_200
    assert wheel.window_ms == 7 * 86_400_000
    wheel.close()


def test_slot_of_another_turn_reads_empty(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=10, precision_ms=1000)
    t = 1_700_000_003_500
    wheel.put_slot(t, 0, 52, 2)
    turn_ms = 2 * wheel.window_ms  # the file holds twice the window
    assert wheel.slot_index(t + turn_ms) == wheel.slot_index(t)
    assert wheel.get_slot(t + turn_ms) == EMPTY_SLOT
    assert wheel.get_slot(t - turn_ms) == EMPTY_SLOT
    assert wheel.slot_index(t + wheel.window_ms) != wheel.slot_index(t)
    assert wheel.get_slot(t + wheel.window_ms) == EMPTY_SLOT
    assert wheel.get_slot(t + 1000) == EMPTY_SLOT
    assert wheel.get_slot(t - 500) == Slot(1_700_000_003_000, 0, 52, 2, 0)
    # Reusing the index one turn later overwrites the old turn's slot.
    wheel.put_slot(t + turn_ms, 104, 104, 1)
    assert wheel.get_slot(t) == EMPTY_SLOT
    assert wheel.get_slot(t + turn_ms).first_pos == 104


def test_prev_pos_chain_walks_a_slot_backwards(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=60, precision_ms=1000)
    base = 1_700_000_000_000
    expected: dict[int, list[int]] = {5_000: [], 7_000: []}
    for n in range(9):  # interleave two slots, across file roll-overs
        slot_ms = base + (5_000 if n % 3 else 7_000) + n  # several ms inside one slot
        prev = wheel.get_slot(slot_ms).last_pos
        pos = log.append(unit(n, prev_pos=prev))
        wheel.link(slot_ms, pos)
        expected[5_000 if n % 3 else 7_000].append(pos)
    for offset_ms, chain in expected.items():
        slot = wheel.get_slot(base + offset_ms)
        assert (slot.time_ms, slot.first_pos, slot.last_pos, slot.num) == (
            base + offset_ms,
            chain[0],
            chain[-1],
            len(chain),
        )
        walked = []
        pos = slot.last_pos
        while pos != -1:
            walked.append(pos)
            pos = log.read(pos).prev_pos
        assert walked == chain[::-1]


def test_unlink_last_undoes_links_past_a_checkpoint(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=60, precision_ms=1000)
    t1, t2 = 10_000, 12_000
    for n, t in enumerate([t1, t1, t2, t1, t2]):
        pos = log.append(unit(n, prev_pos=wheel.get_slot(t).last_pos))
        wheel.link(t, pos)
        if n == 1:
            checkpoint_pos = log.max_pos
    # Recovery: undo the units past the checkpoint, newest first, then truncate.
    tail = list(log.iter_units(checkpoint_pos))
    slot_of = {2: t2, 3: t1, 4: t2}
    for i, (pos, u) in reversed(list(enumerate(tail))):
        assert wheel.unlink_last(slot_of[i + 2], pos, u.prev_pos)
    log.truncate_to(checkpoint_pos)
    assert wheel.get_slot(t2) == EMPTY_SLOT
    assert wheel.get_slot(t1) == Slot(t1, 0, 52, 2, 0)
    assert not wheel.unlink_last(t1, 999 * 52, 52)  # not the newest: nothing changes


def test_rewind_unlinks_every_unit_past_the_checkpoint(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "timerlog", SMALL_LOG_BYTES)
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=60, precision_ms=1000)
    t1, t2, t3 = 10_000, 12_000, 30_000
    placed: dict[int, list[int]] = {t1: [], t2: [], t3: []}
    for n, t in enumerate([t1, t2, t1, t2, t3, t1, t2, t3]):
        pos = log.append(unit(n, prev_pos=wheel.get_slot(t).last_pos))
        wheel.link(t, pos)
        placed[t].append(pos)
        if n == 2:
            checkpoint_pos = log.max_pos
    result = wheel.rewind(checkpoint_pos, log)
    log.truncate_to(checkpoint_pos)
    assert (result.slots_rewound, result.units_dropped, result.broken_slots) == (3, 5, [])
    assert wheel.get_slot(t1) == Slot(t1, placed[t1][0], placed[t1][1], 2, 0)
    assert wheel.get_slot(t2) == Slot(t2, placed[t2][0], placed[t2][0], 1, 0)
    assert wheel.get_slot(t3) == EMPTY_SLOT
    # The reused positions now belong to new units; the old slots do not reach them.
    pos = log.append(unit(50, prev_pos=wheel.get_slot(t3).last_pos))
    wheel.link(t3, pos)
    assert wheel.get_slot(t1).last_pos < checkpoint_pos
    assert wheel.get_slot(t3) == Slot(t3, checkpoint_pos, checkpoint_pos, 1, 0)


def test_rewind_clears_a_slot_whose_chain_is_torn(tmp_path: Path) -> None:
    directory = tmp_path / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=60, precision_ms=1000)
    for n in range(3):
        wheel.link(5_000, log.append(unit(n, prev_pos=wheel.get_slot(5_000).last_pos)))
    fd = os.open(directory / "00000000000000000000", os.O_WRONLY)
    os.pwrite(fd, bytes(4), 2 * UNIT_SIZE)  # the newest unit's size field never made it
    os.close(fd)
    result = wheel.rewind(52, log)
    assert [s.time_ms for s in result.broken_slots] == [5_000]
    assert wheel.get_slot(5_000) == EMPTY_SLOT


def test_scan_lists_non_empty_slots_in_time_order(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "timerwheel", slots_total=100, precision_ms=100)
    base = 50_000_000
    for offset_ms in (900, 100, 5_000):
        wheel.link(base + offset_ms, offset_ms)
    wheel.put_slot(base + 300 - 2 * wheel.window_ms, 1, 1, 1)  # another turn: not listed
    found = wheel.scan(base, base + 5_001)
    assert [(s.time_ms, s.last_pos) for s in found] == [
        (base + 100, 100),
        (base + 900, 900),
        (base + 5_000, 5_000),
    ]
    assert wheel.scan(base, base + 5_000)[-1].time_ms == base + 900
    wheel.clear_slot(base + 900)
    assert [s.time_ms for s in wheel.scan(base, base + 1_000)] == [base + 100]
    assert wheel.scan(base, base) == []


# ---- MessageLog ----------------------------------------------------------------------------
def test_message_log_round_trip_roll_over_and_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "messagelog"
    log = MessageLog(directory, file_bytes=200)
    entries = [("broker-a", b"x" * 50), ("broker-ü", b""), ("b", bytes(range(100)))]
    entries += [("broker-b", os.urandom(n)) for n in (60, 120, 7)]
    placed = [log.append(name, record) for name, record in entries]
    assert [log.read(pos, size) for pos, size in placed] == entries
    starts = sorted({pos // 200 for pos, _ in placed})
    assert len(starts) > 1  # rolled over
    for pos, size in placed:
        assert pos // 200 == (pos + size - 1) // 200  # never straddles a file
    log.flush()
    log.close()
    reopened = MessageLog(directory, file_bytes=200)
    assert reopened.max_pos == placed[-1][0] + placed[-1][1]
    assert [reopened.read(pos, size) for pos, size in placed] == entries


def test_message_log_detects_torn_and_mismatched_entries(tmp_path: Path) -> None:
    directory = tmp_path / "messagelog"
    log = MessageLog(directory, file_bytes=4096)
    pos, size = log.append("broker-a", b"hello world")
    pos2, size2 = log.append("broker-a", b"second")
    with pytest.raises(TornRecordError, match="expected"):
        log.read(pos, size + 1)
    with pytest.raises(PositionError):
        log.read(pos2 + size2, 20)
    fd = os.open(directory / "00000000000000000000", os.O_WRONLY)
    os.pwrite(fd, b"J", pos + size - 5)  # a byte of the record never made it to disk
    os.close(fd)
    with pytest.raises(TornRecordError, match="CRC"):
        log.read(pos, size)
    with pytest.raises(ValueError, match="exceeds"):
        log.append("broker-a", bytes(4096))


def test_message_log_truncate_and_retention(tmp_path: Path) -> None:
    directory = tmp_path / "messagelog"
    log = MessageLog(directory, file_bytes=100)
    placed = [log.append("b", bytes([n]) * 40) for n in range(6)]  # one entry per file
    assert [pos for pos, _ in placed] == [0, 100, 200, 300, 400, 500]
    assert log.truncate_to(300) == placed[-1][0] + placed[-1][1] - 300
    assert log.delete_files_before(200) == 2
    with pytest.raises(PositionError, match="deleted"):
        log.read(*placed[0])
    log.close()
    reopened = MessageLog(directory, file_bytes=100)
    assert (reopened.min_pos, reopened.max_pos) == (200, 300)
    assert reopened.read(*placed[2]) == ("b", bytes([2]) * 40)
    assert reopened.append("b", b"again") == (300, 20)


# ---- Checkpoint ----------------------------------------------------------------------------
def filled_checkpoint(path: Path) -> Checkpoint:
    cp = Checkpoint(path)
    cp.timer_log_pos = 5200
    cp.message_log_pos = 123_456
    cp.hand_ms = 1_700_000_000_000
    cp.queue_offsets = {("broker-a", 0): 17, ("broker-b", 3): 4}
    cp.extra = {"rolled": 2}
    return cp


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "timercheck"
    fresh = Checkpoint(path)
    assert fresh.load() is False
    assert (fresh.timer_log_pos, fresh.hand_ms, fresh.queue_offsets) == (0, 0, {})
    filled_checkpoint(path).save()
    loaded = Checkpoint(path)
    assert loaded.load() is True
    assert loaded.to_json() == filled_checkpoint(path).to_json()
    assert loaded.queue_offsets[("broker-a", 0)] == 17
    assert json.loads(path.read_text())["version"] == 1


def test_checkpoint_survives_a_crash_mid_save(tmp_path: Path, no_failpoints: None) -> None:
    path = tmp_path / "timercheck"
    filled_checkpoint(path).save()
    newer = filled_checkpoint(path)
    newer.timer_log_pos = 9999
    failpoints.reload("timer_before_checkpoint=error")
    with pytest.raises(failpoints.FailpointError):
        newer.save()
    failpoints.reload("")
    tmp = path.with_name("timercheck.tmp")
    assert tmp.exists()  # what a crash at that point leaves behind
    loaded = Checkpoint(path)
    assert loaded.load()
    assert loaded.timer_log_pos == 5200
    assert not tmp.exists()
    # A garbage temp file from a crash before the rename is ignored the same way.
    tmp.write_bytes(b'{"version": 1, "timer_lo')
    assert Checkpoint(path).load()
    newer.save()
    again = Checkpoint(path)
    again.load()
    assert again.timer_log_pos == 9999


def test_checkpoint_refuses_a_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "timercheck"
    path.write_text('{"version": 2, "timer_log_pos": 0}')
    with pytest.raises(CheckpointError, match="version"):
        Checkpoint(path).load()
    path.write_text("not json")
    with pytest.raises(CheckpointError):
        Checkpoint(path).load()
    doc = filled_checkpoint(path).to_json()
    doc["hand_ms"] = "soon"
    path.write_text(json.dumps(doc))
    cp = Checkpoint(path)
    with pytest.raises(CheckpointError, match="integer"):
        cp.load()
    assert cp.hand_ms == 0  # a failed load changes nothing


# ---- model check ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "truncate", "reopen"]), st.integers(0, 30))))
def test_timer_log_matches_a_list_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    directory = tmp_path_factory.mktemp("model") / "timerlog"
    log = TimerLog(directory, SMALL_LOG_BYTES)
    model: list[tuple[int, TimerUnit]] = []
    try:
        for op, n in ops:
            if op == "append":
                u = unit(n, prev_pos=model[-1][0] if model else -1)
                model.append((log.append(u), u))
            elif op == "truncate" and model:
                keep = n % (len(model) + 1)
                cut = model[keep][0] if keep < len(model) else log.max_pos
                log.truncate_to(cut)
                del model[keep:]
            elif op == "reopen":
                log.close()
                log = TimerLog(directory, SMALL_LOG_BYTES)
            assert list(log.iter_units(0)) == model
    finally:
        log.close()
