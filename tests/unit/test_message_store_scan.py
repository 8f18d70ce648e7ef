"""The read of a pull (services/store/pull_scan.py) against SPEC §6.7's unit-by-unit rules.

The scan decides whole segments of units at once; every scenario here checks its result
against ``per_unit_read`` below — the rules spelled out one unit at a time, as the store read
before segments — field for field and byte for byte, and checks what the scenario is about
(where a segment stops and why) explicitly. Real stores on small files in a temp dir.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq import codec
from services.common.clock import ManualClock
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.consume_queue import CQ_UNIT, CQ_UNIT_BYTES, PRE_BLANK_SIZE
from services.store.message_store import GetResult, GetStatus, MessageStore
from services.store.types import PhysicalOffset, QueueOffset

pytestmark = pytest.mark.unit

CL_FILE_BYTES = 8192
START_MS = 1_700_000_000_000
Filters = dict[str, Any]


def _open(root: Path, memory_bytes: int = 1 << 34, **config: object) -> MessageStore:
    fields: dict[str, object] = {
        "commitlog_file_bytes": CL_FILE_BYTES,
        "consume_queue_units_per_file": 64,
        "max_transfer_count_in_memory": 256,
        "message_index_enable": False,
    }
    fields.update(config)
    cfg = StoreConfig(store_dir=root / "store", **fields)  # type: ignore[arg-type]
    store = MessageStore(
        cfg, clock=ManualClock(START_MS), disk_usage=lambda _p: 0.1, memory_bytes=memory_bytes
    )
    store.open()
    return store


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[..., MessageStore]]:
    opened: list[MessageStore] = []

    def make(**kw: Any) -> MessageStore:
        store = _open(tmp_path / str(len(opened)), **kw)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close_files()


def _msg(queue_id: int, body: bytes, tags: str = "") -> MessageToStore:
    props = {codec.Prop.TAGS: tags} if tags else {}
    return MessageToStore(
        topic="T",
        queue_id=queue_id,
        body=body,
        properties=codec.encode_properties(props),
        tags_code=codec.tags_hash(tags),
    )


def _batch(queue_id: int, count: int, size: int = 100, tags: str = "") -> list[MessageToStore]:
    return [_msg(queue_id, f"{queue_id}:{i}:".encode() + b"x" * size, tags) for i in range(count)]


def per_unit_read(
    store: MessageStore, queue_id: int, offset: int, max_msgs: int, **filters: Any
) -> tuple[Any, ...]:
    """SPEC §6.7's read of queue ("T", ``queue_id``), one unit and one commitlog read at a
    time: what the store returned before reads took segments."""
    tags_filter, record_filter = filters.get("tags_filter"), filters.get("record_filter")
    cq = store.queues.find("T", queue_id)
    assert cq is not None
    lo, hi = int(cq.min_offset), int(cq.max_offset)
    assert lo <= offset < hi, "scenarios read inside the queue"
    units = cq.units_from(QueueOffset(offset), max(800, max_msgs * 20))
    cfg, cl = store.config, store.commitlog
    max_py, limit, confirm = cl.max_offset, store.memory_limit_bytes, store.confirm_offset
    status, records, offsets = GetStatus.NO_MATCHED_MESSAGE, [], []
    next_file_start = total = last_py = 0
    consumed = 0
    for i, (phys, size, tags) in enumerate(CQ_UNIT.iter_unpack(units)):
        consumed = i + 1
        if size == PRE_BLANK_SIZE or phys < next_file_start:
            continue
        if confirm is not None and phys + size > confirm:
            consumed = i
            status = GetStatus.OFFSET_OVERFLOW_ONE if i == 0 else status
            break
        on_disk = max_py - phys > limit
        most = cfg.max_transfer_count_on_disk if on_disk else cfg.max_transfer_count_in_memory
        cap = cfg.max_transfer_bytes_on_disk if on_disk else cfg.max_transfer_bytes_in_memory
        n = len(records)
        if n and (n >= max_msgs or n >= most or total + size > cap):
            consumed = i
            break
        if tags_filter is not None and not tags_filter(tags):
            continue
        data = cl.read(phys, size)
        if data is None:
            status = GetStatus.MESSAGE_WAS_REMOVING if not records else status
            next_file_start = cl.next_file_start(phys)
            continue
        if record_filter is not None and not record_filter(data):
            continue
        records.append(bytes(data))
        offsets.append(offset + i)
        status, total, last_py = GetStatus.FOUND, total + size, phys
    suggest = bool(last_py) and max_py - last_py > limit
    return status, offset + consumed, lo, hi, records, offsets, suggest


def _fields(res: GetResult) -> tuple[Any, ...]:
    return (
        res.status,
        res.next_begin_offset,
        res.min_offset,
        res.max_offset,
        res.records,
        res.queue_offsets,
        res.suggest_pull_from_slave,
    )


def read(
    store: MessageStore, queue_id: int, offset: int, max_msgs: int = 256, **filters: Any
) -> GetResult:
    """get_messages, checked field for field against the per-unit read."""
    got = store.get_messages("T", queue_id, offset, max_msgs, **filters)
    assert _fields(got) == per_unit_read(store, queue_id, offset, max_msgs, **filters)
    assert all(type(r) is bytes for r in got.records)  # copies: no view pins a mapped file
    return got


def _bodies(res: GetResult) -> list[bytes]:
    return [codec.decode_record(r).body for r in res.records]


def _read_all(store: MessageStore, queue_id: int, max_msgs: int = 256, **f: Any) -> list[bytes]:
    """Every body of the queue, pull after pull, each pull checked."""
    out: list[bytes] = []
    offset, end = int(store.min_offset("T", queue_id)), int(store.max_offset("T", queue_id))
    while offset < end:
        res = read(store, queue_id, offset, max_msgs, **f)
        assert res.next_begin_offset > offset
        out += _bodies(res)
        offset = res.next_begin_offset
    return out


# ---- segments---------------------------------------------------------------------------------
def test_interleaved_batches_read_as_segments_equal_the_per_unit_read(
    stores: Callable[..., MessageStore],
) -> None:
    store = stores()
    want: dict[int, list[bytes]] = {0: [], 1: []}
    for k in range(12):  # batches of two queues alternate: each queue's runs are 5-9 long
        batch = _batch(k % 2, 5 + k % 5, size=40 + k)
        want[k % 2] += [m.body for m in batch]
        store.append(batch)
    for qid, bodies in want.items():
        assert _read_all(store, qid) == bodies
        assert _read_all(store, qid, max_msgs=3) == bodies
        for offset in range(len(bodies)):  # a pull may start anywhere in a run
            read(store, qid, offset, 7)


def test_a_run_broken_by_a_filtered_unit(stores: Callable[..., MessageStore]) -> None:
    store = stores()
    store.append([_msg(0, f"{i}{t}".encode(), t) for i, t in enumerate("aabaacaa")])
    want = codec.tags_hash("a")
    res = read(store, 0, 0, tags_filter=lambda code: code == want)
    assert _bodies(res) == [b"0a", b"1a", b"3a", b"4a", b"6a", b"7a"]
    assert res.queue_offsets == [0, 1, 3, 4, 6, 7]
    # Many filtered units before a match: the scan decodes units a window at a time, and a
    # run found in a later window keeps its queue offsets.
    long = stores(consume_queue_units_per_file=1000, max_transfer_count_in_memory=32)
    long.append(_batch(0, 150, size=10, tags="b") + _batch(0, 4, size=10, tags="a"))
    later = read(long, 0, 0, tags_filter=lambda code: code == want)
    assert later.queue_offsets == [150, 151, 152, 153]
    by_record = read(store, 0, 0, record_filter=lambda raw: codec.decode_record(raw).tags == "a")
    assert _bodies(by_record) == _bodies(res)


def test_a_run_cut_by_the_byte_cap_and_the_count_cap(stores: Callable[..., MessageStore]) -> None:
    record_bytes = stores().append(_batch(0, 1))[0].size_bytes  # every record of _batch's size
    store = stores(
        max_transfer_bytes_in_memory=3 * record_bytes + record_bytes // 2,
        max_transfer_count_in_memory=5,
    )
    batch = _batch(0, 10)
    store.append(batch)
    first = read(store, 0, 0)
    assert first.queue_offsets == [0, 1, 2] and first.next_begin_offset == 3  # bytes cap
    assert read(store, 0, 3, max_msgs=2).queue_offsets == [3, 4]  # the pull's own count
    assert _read_all(store, 0) == [m.body for m in batch]
    # The count cap, with room in bytes: five records a pull.
    roomy = stores(max_transfer_count_in_memory=5)
    roomy.append(batch)
    assert read(roomy, 0, 0).queue_offsets == [0, 1, 2, 3, 4]
    # A record bigger than the byte cap still comes alone: a pull's first is never capped.
    tiny = stores(max_transfer_bytes_in_memory=record_bytes // 2)
    tiny.append(batch)
    assert read(tiny, 0, 4).queue_offsets == [4]


def test_a_run_cut_by_the_confirm_offset(stores: Callable[..., MessageStore]) -> None:
    store = stores()
    results = store.append(_batch(0, 8))
    fifth = results[4]
    store.set_confirm_offset(PhysicalOffset(fifth.physical_offset + fifth.size_bytes))
    res = read(store, 0, 0)
    assert res.queue_offsets == [0, 1, 2, 3, 4] and res.next_begin_offset == 5
    held = read(store, 0, 5)  # the next record is not on every in-sync replica yet
    assert held.status is GetStatus.OFFSET_OVERFLOW_ONE and held.next_begin_offset == 5
    # A bound inside a record stops before it.
    store.set_confirm_offset(PhysicalOffset(results[6].physical_offset + 1))
    assert read(store, 0, 0).queue_offsets == [0, 1, 2, 3, 4, 5]
    store.set_confirm_offset(None)
    assert read(store, 0, 0).queue_offsets == list(range(8))


def test_a_run_in_a_file_removed_under_the_reader(stores: Callable[..., MessageStore]) -> None:
    store = stores()
    store.append(_batch(0, 70, size=200))  # ~300-byte records: files 0-2 hold them
    first_file_end = CL_FILE_BYTES
    assert store.commitlog.max_offset > 2 * CL_FILE_BYTES
    # Retention deleted the first commitlog file; the consume queue is not corrected yet.
    store.commitlog.files.delete_first(1)
    res = read(store, 0, 0)
    gone = [o for o in range(70) if _unit(store, o)[0] < first_file_end]
    assert gone and res.status is GetStatus.FOUND
    assert res.queue_offsets[0] == len(gone)  # the removed file's units are skipped
    only_gone = read(store, 0, 0, max_msgs=1, tags_filter=lambda _code: True)
    assert only_gone.status is GetStatus.FOUND
    # Units only in the removed file: MESSAGE_WAS_REMOVING, and the pull moves past them.
    small = stores(consume_queue_units_per_file=8)
    small.append(_batch(0, 40, size=200))
    small.commitlog.files.delete_first(1)
    removing = read(small, 0, 0)
    assert removing.status is GetStatus.MESSAGE_WAS_REMOVING
    assert removing.records == [] and removing.next_begin_offset == 8


def _unit(store: MessageStore, queue_offset: int) -> tuple[int, int, int]:
    cq = store.queues.find("T", 0)
    assert cq is not None
    return CQ_UNIT.unpack(cq.units_from(QueueOffset(queue_offset), 1))


def test_segments_across_commitlog_files(stores: Callable[..., MessageStore]) -> None:
    store = stores()
    batch = _batch(0, 60, size=200)  # one batch over three files: each file's end breaks it
    store.append(batch)
    assert _read_all(store, 0) == [m.body for m in batch]
    # Units made contiguous across a file's end: the last unit of file 0 covers its BLANK
    # tail, so the next unit starts exactly at file 1. A segment must still stop at the file.
    tail = max(o for o in range(60) if _unit(store, o)[0] < CL_FILE_BYTES)
    phys, _size, tags = _unit(store, tail)
    crafted = store.queues.find_or_create("T", 5)
    crafted.put(QueueOffset(0), phys, CL_FILE_BYTES - phys, tags)
    for i, o in enumerate(range(tail + 1, tail + 4)):
        p, s, t = _unit(store, o)
        crafted.put(QueueOffset(1 + i), p, s, t)
    res = read(store, 5, 0)
    assert res.queue_offsets == [0, 1, 2, 3]
    assert res.records[0] == bytes(
        store.commitlog.read(PhysicalOffset(phys), CL_FILE_BYTES - phys) or b""
    )
    assert res.records[1:] == [_raw(store, o) for o in range(tail + 1, tail + 4)]


def _raw(store: MessageStore, queue_offset: int) -> bytes:
    phys, size, _tags = _unit(store, queue_offset)
    return bytes(store.commitlog.read(PhysicalOffset(phys), size) or b"")


def test_a_unit_reaching_past_its_file_is_a_record_gone(
    stores: Callable[..., MessageStore],
) -> None:
    store = stores()
    store.append(_batch(0, 60, size=200))
    tail = max(o for o in range(60) if _unit(store, o)[0] < CL_FILE_BYTES)
    phys, _size, tags = _unit(store, tail)
    crafted = store.queues.find_or_create("T", 5)
    crafted.put(QueueOffset(0), *_unit(store, tail - 1))
    crafted.put(QueueOffset(1), phys, CL_FILE_BYTES - phys + 10, tags)  # 10 bytes too long
    crafted.put(QueueOffset(2), *_unit(store, tail + 2))  # records in order after it
    crafted.put(QueueOffset(3), *_unit(store, tail + 3))
    res = read(store, 5, 0)
    assert res.queue_offsets == [0, 2, 3]
    assert res.records == [_raw(store, tail - 1), _raw(store, tail + 2), _raw(store, tail + 3)]


def test_pre_blank_units_break_a_run(stores: Callable[..., MessageStore]) -> None:
    store = stores()
    store.append(_batch(0, 4))
    units = [_unit(store, o) for o in range(4)]
    gappy = store.queues.find_or_create("T", 3)
    gappy.put(QueueOffset(0), *units[0])
    gappy.put(QueueOffset(1), *units[1])
    gappy.put(QueueOffset(4), *units[2])  # offsets 2 and 3 become pre-blank units
    gappy.put(QueueOffset(5), *units[3])
    assert _unit_of(gappy, 2)[1] == PRE_BLANK_SIZE
    res = read(store, 3, 0)
    assert res.queue_offsets == [0, 1, 4, 5] and res.next_begin_offset == 6


def _unit_of(cq: Any, queue_offset: int) -> tuple[int, int, int]:
    return CQ_UNIT.unpack(cq.units_from(QueueOffset(queue_offset), 1))


def test_units_out_of_order_or_damaged_are_walked_one_by_one(
    stores: Callable[..., MessageStore],
) -> None:
    store = stores()
    store.append(_batch(0, 6))
    u = [_unit(store, o) for o in range(6)]
    # Backwards (r2 r3 then r0 r1), a unit repeated, a unit overlapping the next record:
    # none of these is a contiguous run, each must come out as the per-unit read has it.
    odd = [u[2], u[3], u[0], u[1], u[1], u[2], (u[2][0] + 1, u[2][1], 0), u[4], u[5]]
    crafted = store.queues.find_or_create("T", 6)
    for i, unit in enumerate(odd):
        crafted.put(QueueOffset(i), *unit)
    res = read(store, 6, 0)
    assert res.queue_offsets == list(range(9))
    assert res.records[:2] == [_raw(store, 2), _raw(store, 3)]
    assert res.records[2:6] == [_raw(store, 0), _raw(store, 1), _raw(store, 1), _raw(store, 2)]
    # Bounded by a confirm offset: the first unit whose record ends past it ends the read.
    store.set_confirm_offset(PhysicalOffset(u[2][0] + u[2][1]))
    assert read(store, 6, 0).queue_offsets == [0]
    store.set_confirm_offset(None)
    # A unit of size 0 reads as an empty record, taken as it is.
    empty = store.queues.find_or_create("T", 8)
    for i, unit in enumerate([u[0], u[1], (u[2][0], 0, 0), u[2], u[3]]):
        empty.put(QueueOffset(i), *unit)
    assert read(store, 8, 0).records[2] == b""
    # A damaged unit (negative size) reads as a record that is gone: the rest of its file is
    # skipped, as for a removed file.
    broken = store.queues.find_or_create("T", 7)
    for i, unit in enumerate([u[0], u[1], (u[1][0] + u[1][1], -5, 0), u[2], u[3]]):
        broken.put(QueueOffset(i), *unit)
    assert read(store, 7, 0).queue_offsets == [0, 1]


def test_a_run_half_on_disk_takes_the_disk_caps_then_the_memory_caps(
    stores: Callable[..., MessageStore],
) -> None:
    probe = stores()
    probe.append(_batch(0, 40))
    end = probe.commitlog.max_offset
    # ~40 % of memory_bytes counts as in memory: the newest ~half of the records.
    store = stores(memory_bytes=end * 100 // 40 // 2, max_transfer_count_on_disk=3)
    store.append(_batch(0, 40))
    old = read(store, 0, 0)
    assert old.queue_offsets == [0, 1, 2] and old.suggest_pull_from_slave
    boundary = next(o for o in range(40) if end - _unit(store, o)[0] <= store.memory_limit_bytes)
    # Each unit takes its own caps: from just below the boundary, one record on disk, then
    # the memory caps for the rest; from further below, the disk caps end the pull first.
    across = read(store, 0, boundary - 1)
    assert across.queue_offsets == list(range(boundary - 1, 40))
    assert read(store, 0, boundary - 5).queue_offsets == list(range(boundary - 5, boundary - 2))
    # Disk caps larger than memory caps (allowed): the memory part is capped by its own.
    odd = stores(memory_bytes=end * 100 // 40 // 2, max_transfer_count_in_memory=2)
    odd.append(_batch(0, 40))
    assert read(odd, 0, boundary - 3).queue_offsets == list(range(boundary - 3, boundary))
    new = read(store, 0, boundary)
    assert new.queue_offsets == list(range(boundary, 40)) and not new.suggest_pull_from_slave
    assert _read_all(store, 0)[:1] == [b"0:0:" + b"x" * 100]


# ---- any mix of the above ----------------------------------------------------------------------
_batches = st.lists(
    st.tuples(st.integers(0, 1), st.integers(1, 12), st.integers(0, 400), st.sampled_from("ab")),
    min_size=1,
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=_batches,
    max_msgs=st.integers(1, 40),
    caps=st.tuples(st.integers(1, 12), st.integers(200, 6000), st.integers(1, 6)),
    memory_percent=st.integers(0, 100),
    confirm_percent=st.one_of(st.none(), st.integers(0, 100)),
    removed_files=st.integers(0, 2),
    tags=st.sampled_from([None, "a", "b"]),
)
def test_any_store_reads_as_the_per_unit_read(
    batches: list[tuple[int, int, int, str]],
    max_msgs: int,
    caps: tuple[int, int, int],
    memory_percent: int,
    confirm_percent: int | None,
    removed_files: int,
    tags: str | None,
) -> None:
    with tempfile.TemporaryDirectory() as d:
        count_in_memory, bytes_cap, count_on_disk = caps
        # A 1-byte "machine" puts everything on disk; a big one nothing.
        memory_bytes = 1 + (1 << 20) * memory_percent // 100
        store = _open(
            Path(d),
            memory_bytes=memory_bytes,
            max_transfer_count_in_memory=count_in_memory,
            max_transfer_bytes_in_memory=bytes_cap,
            max_transfer_count_on_disk=count_on_disk,
            max_transfer_bytes_on_disk=bytes_cap // 2,
        )
        try:
            for qid, count, size, tag in batches:
                store.append(_batch(qid, count, size, tag))
            end = store.commitlog.max_offset
            if confirm_percent is not None:
                store.set_confirm_offset(PhysicalOffset(end * confirm_percent // 100))
            store.commitlog.files.delete_first(removed_files)
            filters: Filters = {}
            if tags is not None:
                code = codec.tags_hash(tags)
                filters["tags_filter"] = lambda c: c == code
            for qid in (0, 1):
                cq = store.queues.find("T", qid)
                if cq is None:
                    continue
                for offset in range(int(cq.min_offset), int(cq.max_offset)):
                    read(store, qid, offset, max_msgs, **filters)
        finally:
            store.close_files()


def test_units_are_read_by_the_window_struct() -> None:
    # The scan decodes a window of units with one struct call: same values as unit by unit.
    from services.store.pull_scan import _units_struct

    raw = b"".join(CQ_UNIT.pack(i * 1000, 100 + i, -i) for i in range(5))
    one_by_one = list(CQ_UNIT.iter_unpack(raw))
    flat = _units_struct(5, True).unpack(raw)
    assert list(zip(flat[0::3], flat[1::3], flat[2::3], strict=True)) == one_by_one
    flat = _units_struct(5, False).unpack(raw)
    assert list(zip(flat[0::2], flat[1::2], strict=True)) == [u[:2] for u in one_by_one]
    assert _units_struct(5, False).size == 5 * CQ_UNIT_BYTES
