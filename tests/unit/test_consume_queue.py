"""ConsumeQueue: 20-byte units, addressed like an array across files (SPEC §4.6, §11.2, §15)."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.consume_queue import (
    CQ_UNIT,
    CQ_UNIT_BYTES,
    DEFAULT_UNITS_PER_FILE,
    PRE_BLANK_SIZE,
    ConsumeQueue,
)
from services.store.consume_queue_store import ConsumeQueueStore
from services.store.mapped_file import file_name

pytestmark = pytest.mark.unit

UNITS = 10
FILE_BYTES = UNITS * CQ_UNIT_BYTES


def _cq(path: Path, units: int = UNITS) -> ConsumeQueue:
    return ConsumeQueue(path, "T", 0, units)


def _reopen(path: Path, units: int = UNITS) -> ConsumeQueue:
    cq = _cq(path, units)
    assert cq.files.load() == []
    return cq


def _unit(i: int) -> tuple[int, int, int]:
    """The unit the tests put at queue offset ``i``: records 100 bytes apart."""
    return i * 100, 100, 1000 + i


def _fill(cq: ConsumeQueue, start: int, stop: int) -> None:
    for i in range(start, stop):
        assert cq.put(i, *_unit(i))


def _raw_unit(path: Path, i: int, units: int = UNITS) -> tuple[int, int, int]:
    """Read unit ``i`` straight from the file SPEC §15 says holds it."""
    name = file_name((i // units) * units * CQ_UNIT_BYTES)
    raw = (path / name).read_bytes()
    off, size, tags = struct.unpack_from(">qiq", raw, (i % units) * 20)
    return off, size, tags


# ---- layout ----------------------------------------------------------------------------------
def test_unit_layout_is_20_bytes_big_endian() -> None:
    assert CQ_UNIT_BYTES == 20
    assert CQ_UNIT.pack(0x0102030405060708, 0x0A0B0C0D, -1) == (
        bytes.fromhex("0102030405060708") + bytes.fromhex("0A0B0C0D") + b"\xff" * 8
    )


def test_unit_i_is_at_i_mod_n_times_20_in_file_i_div_n(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 35)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [file_name(k * FILE_BYTES) for k in range(4)]
    assert names[1] == "00000000000000000200"
    for i in range(35):
        assert _raw_unit(tmp_path, i) == _unit(i)
        assert cq.unit(i) == _unit(i)
    assert all(os.path.getsize(tmp_path / n) == FILE_BYTES for n in names)
    assert (cq.min_offset, cq.max_offset) == (0, 35)
    cq.close()


def test_default_file_is_6_000_000_bytes(tmp_path: Path) -> None:
    assert DEFAULT_UNITS_PER_FILE == 300_000
    cq = ConsumeQueue(tmp_path, "T", 0)
    n = DEFAULT_UNITS_PER_FILE + 2
    units = b"".join(CQ_UNIT.pack(*_unit(i)) for i in range(n))
    assert cq.put_many(0, units, n * 100)
    first = tmp_path / "00000000000000000000"
    second = tmp_path / "00000000000006000000"
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, second.name]
    assert os.path.getsize(first) == 6_000_000
    assert os.path.getsize(second) == 6_000_000
    for i in (0, 1, 299_999, 300_000, 300_001):
        assert cq.unit(i) == _unit(i)
        assert _raw_unit(tmp_path, i, DEFAULT_UNITS_PER_FILE) == _unit(i)
    with second.open("rb") as f:
        f.seek((300_001 % 300_000) * 20)
        assert struct.unpack(">qiq", f.read(20)) == _unit(300_001)
    assert cq.max_offset == n
    cq.close()


# ---- puts ------------------------------------------------------------------------------------
def test_put_is_idempotent(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 5)
    assert not cq.put(2, 999_999, 1, 1)  # re-dispatch of an existing unit: skipped
    assert not cq.put(4, 999_999, 1, 1)
    assert cq.unit(2) == _unit(2)
    assert cq.max_offset == 5
    # A run overlapping the end writes only the new part.
    run = b"".join(CQ_UNIT.pack(*_unit(i)) for i in range(3, 8))
    assert cq.put_many(3, run, 800)
    assert [cq.unit(i) for i in range(8)] == [_unit(i) for i in range(8)]
    assert cq.max_physical_end == 800
    assert not cq.put_many(3, run, 800)
    assert cq.max_offset == 8
    cq.close()


def test_pre_blank_fill_when_queue_starts_past_zero(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    assert cq.put(25, *_unit(25))
    # The file holding unit 25 starts at unit 20; units 20..24 are pre-blank.
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(2 * FILE_BYTES)]
    for i in range(20, 25):
        assert _raw_unit(tmp_path, i) == (0, PRE_BLANK_SIZE, 0)
    assert _raw_unit(tmp_path, 25) == _unit(25)
    assert (cq.min_offset, cq.max_offset) == (25, 26)
    assert cq.unit(24) is None
    assert cq.unit(25) == _unit(25)
    assert cq.unit(26) is None
    assert list(cq.iter_units()) == [(25, *_unit(25))]
    _fill(cq, 26, 33)
    assert [u[0] for u in cq.iter_units()] == list(range(25, 33))
    cq.close()


def test_pre_blank_fill_of_a_gap_inside_a_queue(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 3)
    assert cq.put(14, *_unit(14))
    for i in range(3, 14):
        assert cq.unit(i) == (0, PRE_BLANK_SIZE, 0)
    assert cq.unit(14) == _unit(14)
    assert cq.max_offset == 15
    cq.close()


def test_pre_blank_queue_min_offset_survives_reopen(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 25, 28)
    cq.close()
    again = _reopen(tmp_path)
    again.recover(10**9)
    again.correct_min_offset(0)
    assert (again.min_offset, again.max_offset) == (25, 28)
    assert again.unit(25) == _unit(25)
    again.close()


# ---- offset by time --------------------------------------------------------------------------
def test_offset_by_time_binary_search(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 23)
    stamps = {i * 100: 1000 + 10 * i for i in range(23)}
    probes: list[int] = []

    def store_time(offset: int, size: int) -> int | None:
        assert size == 100
        probes.append(offset)
        return stamps.get(offset)

    assert cq.offset_by_time(0, store_time) == 0
    assert cq.offset_by_time(1000, store_time) == 0
    assert cq.offset_by_time(1001, store_time) == 1
    assert cq.offset_by_time(1035, store_time) == 4
    assert cq.offset_by_time(1040, store_time) == 4
    assert cq.offset_by_time(1220, store_time) == 22
    assert cq.offset_by_time(1221, store_time) == 23  # all older: max offset
    probes.clear()
    cq.offset_by_time(1100, store_time)
    assert len(probes) <= 6  # binary, not linear
    # Records the commitlog no longer has count as "before".
    del stamps[0], stamps[100]
    assert cq.offset_by_time(0, store_time) == 2
    cq.close()


def test_offset_by_time_skips_leading_pre_blank_units(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 23, 29)  # the file starts at unit 20: units 20..22 are pre-blank
    cq.close()
    cq = _reopen(tmp_path)
    cq.recover(10**9)
    assert cq.min_offset == 20  # the pre-blanks are visible until correct_min_offset
    ts = {i * 100: 10 * i for i in range(29)}

    def store_time(offset: int, size: int) -> int | None:
        assert size != PRE_BLANK_SIZE
        return ts.get(offset)

    assert cq.offset_by_time(0, store_time) == 23
    assert cq.offset_by_time(255, store_time) == 26
    assert cq.offset_by_time(10**6, store_time) == 29
    cq.close()


# ---- recovery --------------------------------------------------------------------------------
def test_recover_finds_the_end_by_binary_search(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 27)
    cq.close()
    again = _reopen(tmp_path)
    assert again.max_offset == 3 * UNITS  # before recovery every loaded file counts as full
    again.recover(10**9)
    assert (again.min_offset, again.max_offset) == (0, 27)
    assert again.max_physical_end == 26 * 100 + 100
    assert [again.unit(i) for i in range(27)] == [_unit(i) for i in range(27)]
    assert again.put(27, *_unit(27))
    assert again.unit(27) == _unit(27)
    again.close()


def test_recover_on_a_file_boundary_drops_the_empty_next_file(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 20)
    cq.files.writable_file(20 * CQ_UNIT_BYTES)  # an empty file after a full one
    cq.close()
    again = _reopen(tmp_path)
    again.recover(10**9)
    assert again.max_offset == 20
    assert not (tmp_path / file_name(2 * FILE_BYTES)).exists()
    assert again.put(20, *_unit(20))
    assert again.unit(20) == _unit(20)
    again.close()


def test_recover_truncates_units_past_the_commitlog_end(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 25)
    cq.close()
    again = _reopen(tmp_path)
    # The commitlog ends inside record 12 (at 1250): units 12.. point at a torn tail.
    again.recover(1250)
    assert again.max_offset == 12
    assert again.unit(11) == _unit(11)
    assert again.unit(12) is None
    assert again.max_physical_end == 1200
    assert not (tmp_path / file_name(2 * FILE_BYTES)).exists()
    raw = (tmp_path / file_name(FILE_BYTES)).read_bytes()
    assert raw[2 * 20 :] == bytes(FILE_BYTES - 40)
    # Re-dispatch from there fills the same positions again.
    assert again.put(12, 1200, 50, 7)
    assert again.unit(12) == (1200, 50, 7)
    again.close()


def test_recover_everything_past_the_end_empties_the_queue(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 5)
    cq.close()
    again = _reopen(tmp_path)
    again.recover(0)
    assert again.max_offset == 0
    assert again.max_physical_end == 0
    assert again.put(0, *_unit(0))
    assert again.unit(0) == _unit(0)
    again.close()


def test_correct_min_offset_skips_deleted_records(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 25)
    cq.correct_min_offset(1000)  # the commitlog now starts at record 10
    assert cq.min_offset == 10
    assert cq.unit(9) is None
    assert cq.unit(10) == _unit(10)
    cq.correct_min_offset(1050)  # mid-record: record 10 is gone too
    assert cq.min_offset == 11
    cq.correct_min_offset(10**9)  # everything gone
    assert cq.min_offset == cq.max_offset == 25
    cq.close()


def test_delete_files_before_keeps_the_newest_file(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    _fill(cq, 0, 25)
    assert cq.delete_files_before(1500) == 1  # file 0 points below 1000 only
    assert not (tmp_path / file_name(0)).exists()
    assert cq.min_offset == 15
    assert cq.delete_files_before(10**9) == 1  # file 1; file 2 is the newest and stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(2 * FILE_BYTES)]
    assert cq.min_offset == cq.max_offset == 25
    cq.close()


def test_consume_queue_store_layout_and_reload(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, units_per_file=UNITS)
    store.find_or_create("TopicA", 3).put(0, *_unit(0))
    store.find_or_create("TopicB", 0).put(0, *_unit(1))
    assert store.find("TopicA", 4) is None
    assert (tmp_path / "TopicA" / "3" / file_name(0)).exists()
    store.close()
    again = ConsumeQueueStore(tmp_path, units_per_file=UNITS)
    assert again.load() == []
    assert set(again.queues) == {("TopicA", 3), ("TopicB", 0)}
    assert set(again.topic_queues("TopicA")) == {3}
    again.delete_topic("TopicA")
    assert not (tmp_path / "TopicA").exists()
    assert set(again.queues) == {("TopicB", 0)}
    again.close()


# ---- model-based -----------------------------------------------------------------------------
_op = st.one_of(
    st.tuples(st.just("next"), st.integers(1, 7)),  # the next run of units
    st.tuples(st.just("redo"), st.integers(1, 7)),  # re-dispatch from an earlier offset
    st.tuples(st.just("jump"), st.integers(1, 9)),  # a gap (pre-blank) then one unit
)


@settings(max_examples=60, deadline=None)
@given(
    units_per_file=st.integers(1, 6),
    first=st.integers(0, 12),
    ops=st.lists(_op, min_size=1, max_size=12),
    data=st.data(),
)
def test_puts_then_lookups_match_a_list_model(
    units_per_file: int,
    first: int,
    ops: list[tuple[str, int]],
    data: st.DataObject,
) -> None:
    blank = (0, PRE_BLANK_SIZE, 0)
    model: dict[int, tuple[int, int, int]] = {}
    counter = [0]

    def new_unit() -> tuple[int, int, int]:
        counter[0] += 1
        return counter[0] * 1000, 10 + counter[0], counter[0] - 5

    with tempfile.TemporaryDirectory() as d:
        cq = _cq(Path(d), units_per_file)
        end = first
        for kind, n in ops:
            if kind == "next" or not model:
                start, count = end, n
            elif kind == "redo":
                start = data.draw(st.integers(first, end - 1))
                count = n
            else:
                for i in range(end, end + n):
                    model[i] = blank
                start, count = end + n, 1
            units = [new_unit() for _ in range(count)]
            packed = b"".join(CQ_UNIT.pack(*u) for u in units)
            wrote = cq.put_many(start, packed, units[-1][0] + units[-1][1])
            assert wrote == (start + count > end)
            for k, u in enumerate(units):
                model.setdefault(start + k, u)
            end = max(end, start + count)
        assert (cq.min_offset, cq.max_offset) == (first, end)
        for i in range(max(0, first - 2), end + 3):
            assert cq.unit(i) == model.get(i)
        assert [(q, o, s, t) for q, o, s, t in cq.iter_units()] == [
            (i, *model[i]) for i in range(first, end)
        ]
        file_bytes = units_per_file * CQ_UNIT_BYTES
        for p in Path(d).iterdir():
            assert int(p.name) % file_bytes == 0
            assert p.stat().st_size == file_bytes
        cq.close()
        # The same content after a reopen and recovery.
        again = _reopen(Path(d), units_per_file)
        again.recover(10**12)
        assert again.max_offset == end
        assert again.min_offset <= first  # leading pre-blanks until correct_min_offset runs
        for i in range(first, end):
            assert again.unit(i) == model[i]
        again.close()
