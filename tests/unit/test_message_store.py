"""MessageStore end to end on small files: puts, pulls (SPEC §6.7), keys, recovery, locking."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import struct
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq import codec
from services.common import failpoints
from services.common.clock import ManualClock
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.flush import FlushDiskType
from services.store.inspect import detect_layout, verify
from services.store.mapped_file import ZERO_AHEAD_BYTES, file_name
from services.store.message_store import (
    GetStatus,
    MessageStore,
    PutStatus,
    StoreError,
)
from tests.support.until import until

pytestmark = pytest.mark.unit

CL_FILE_BYTES = 8192
CQ_UNITS = 16
START_MS = 1_700_000_000_000


def _config(root: Path, **kw: object) -> StoreConfig:
    fields: dict[str, object] = {
        "commitlog_file_bytes": CL_FILE_BYTES,
        "consume_queue_units_per_file": CQ_UNITS,
        "index_slot_num": 64,
        "index_num": 256,
    }
    fields.update(kw)
    return StoreConfig(store_dir=root / "store", **fields)  # type: ignore[arg-type]


def _msg(
    topic: str = "T",
    queue_id: int = 0,
    body: bytes = b"body",
    *,
    tags: str = "",
    keys: str = "",
    uniq: str = "",
) -> MessageToStore:
    props: dict[str, str] = {}
    if tags:
        props[codec.Prop.TAGS] = tags
    if keys:
        props[codec.Prop.KEYS] = keys
    if uniq:
        props[codec.Prop.UNIQ_KEY] = uniq
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=codec.encode_properties(props),
        tags_code=codec.tags_hash(tags),
        keys=keys,
        uniq_key=uniq,
    )


class Harness:
    """Opens stores on one directory with one manual clock."""

    def __init__(self, root: Path, **config: object) -> None:
        self.config = _config(root, **config)
        self.clock = ManualClock(START_MS)
        self.open_stores: list[MessageStore] = []

    def open(self, memory_bytes: int = 1 << 34) -> MessageStore:
        store = MessageStore(
            self.config, clock=self.clock, disk_usage=lambda _p: 0.1, memory_bytes=memory_bytes
        )
        store.open()
        self.open_stores.append(store)
        return store

    async def shutdown(self, store: MessageStore) -> None:
        await store.shutdown()

    def crash(self, store: MessageStore) -> None:
        """Stop like kill -9: files unmapped, nothing flushed, ``abort`` left behind."""
        store.close_files()

    @property
    def commitlog_first_file(self) -> Path:
        return self.config.commitlog_dir / file_name(0)


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**config: object) -> Harness:
        harness = Harness(tmp_path / str(len(made)), **config)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        for store in harness.open_stores:
            store.close_files()


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()


def _bodies(result_records: list[bytes]) -> list[bytes]:
    return [codec.decode_record(r).body for r in result_records]


def _all_bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = int(store.min_offset(topic, queue_id))
    while True:
        res = store.get_messages(topic, queue_id, offset, 32)
        if res.status is not GetStatus.FOUND:
            return out
        out += _bodies(res.records)
        offset = res.next_begin_offset


# ---- round trip ------------------------------------------------------------------------------
def test_append_then_get_messages_round_trip(h: Harness) -> None:
    store = h.open()
    results = store.append([_msg(body=f"m{i}".encode(), tags="a") for i in range(5)])
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
    res = store.get_messages("T", 0, 0, 32)
    assert res.status is GetStatus.FOUND
    assert _bodies(res.records) == [f"m{i}".encode() for i in range(5)]
    assert res.queue_offsets == [0, 1, 2, 3, 4]
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (5, 0, 5)
    recs = [codec.decode_record(r) for r in res.records]
    assert [r.physical_offset for r in recs] == [r.physical_offset for r in results]
    assert all(r.store_timestamp_ms == START_MS for r in recs)
    assert all(r.tags == "a" for r in recs)
    # A read from the middle.
    mid = store.get_messages("T", 0, 3, 1)
    assert _bodies(mid.records) == [b"m3"]
    assert mid.next_begin_offset == 4


def test_messages_across_many_files_and_queues(h: Harness) -> None:
    store = h.open()
    expected: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for i in range(300):
        qid = i % 3
        body = f"msg-{i}".encode() * (1 + i % 5)
        store.append([_msg(queue_id=qid, body=body)])
        expected[qid].append(body)
    assert store.commitlog.max_offset > 3 * CL_FILE_BYTES
    for qid, bodies in expected.items():
        assert store.max_offset("T", qid) == len(bodies)
        assert _all_bodies(store, "T", qid) == bodies


def test_read_record_by_offset_msg_id(h: Harness) -> None:
    store = h.open()
    [res] = store.append([_msg(body=b"by-id")])
    host, phys = codec.decode_offset_msg_id(res.offset_msg_id)
    assert host == h.config.store_host
    rec = store.read_record(phys)
    assert rec is not None
    assert rec.body == b"by-id"


def test_offset_by_time(h: Harness) -> None:
    store = h.open()
    for i in range(10):
        h.clock.advance_ms(1000)
        store.append([_msg(body=bytes([i]))])
    assert store.offset_by_time("T", 0, START_MS) == 0
    assert store.offset_by_time("T", 0, START_MS + 4500) == 4
    assert store.offset_by_time("T", 0, START_MS + 99_000) == 10
    assert store.offset_by_time("nope", 0, START_MS) == 0


# ---- SPEC §6.7 statuses -----------------------------------------------------------------------
def test_no_matched_logic_queue(h: Harness) -> None:
    store = h.open()
    store.append([_msg(topic="T", queue_id=0)])
    for topic, qid in (("Other", 0), ("T", 1)):
        res = store.get_messages(topic, qid, 0, 32)
        assert res.status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert res.records == []


def test_no_message_in_queue(h: Harness) -> None:
    store = h.open()
    store.queues.find_or_create("Empty", 0)
    res = store.get_messages("Empty", 0, 5, 32)
    assert res.status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (0, 0, 0)


def test_no_message_in_queue_after_recovery_cut_everything(h: Harness) -> None:
    store = h.open()
    store.append([_msg()])
    h.crash(store)
    with h.commitlog_first_file.open("r+b") as f:  # destroy the only record's magic
        f.seek(4)
        f.write(b"\0\0\0\1")
    store = h.open()
    assert store.recovery is not None
    assert store.recovery.truncated_bytes > 0
    res = store.get_messages("T", 0, 0, 32)
    assert res.status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert res.next_begin_offset == 0


def test_offset_overflow_one(h: Harness) -> None:
    store = h.open()
    store.append([_msg() for _ in range(3)])
    res = store.get_messages("T", 0, 3, 32)
    assert res.status is GetStatus.OFFSET_OVERFLOW_ONE
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (3, 0, 3)
    assert res.records == []


def test_offset_overflow_badly_with_min_zero_goes_to_zero(h: Harness) -> None:
    store = h.open()
    store.append([_msg() for _ in range(3)])
    res = store.get_messages("T", 0, 10, 32)
    assert res.status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (0, 0, 3)


def _store_with_retained_prefix(h: Harness) -> tuple[MessageStore, int, int]:
    """A store whose oldest commitlog files were deleted; returns (store, min, max)."""
    store = h.open()
    for i in range(200):
        store.append([_msg(body=f"r{i}".encode() * 8)])
    newest = store.commitlog.files.last_written()
    older = store.commitlog.files.files.index(newest)  # type: ignore[arg-type]
    assert older >= 2
    store.retention.disk_usage = lambda _p: 0.86  # forcibly: oldest files, expired or not
    result = store.retention.run_once()
    assert result.commitlog_files_deleted == older
    store.retention.disk_usage = lambda _p: 0.1
    lo, hi = int(store.min_offset("T", 0)), int(store.max_offset("T", 0))
    assert 0 < lo < hi == 200
    return store, lo, hi


def test_offset_too_small_after_retention(h: Harness) -> None:
    store, lo, hi = _store_with_retained_prefix(h)
    res = store.get_messages("T", 0, 0, 32)
    assert res.status is GetStatus.OFFSET_TOO_SMALL
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (lo, lo, hi)
    res = store.get_messages("T", 0, lo - 1, 32)
    assert res.status is GetStatus.OFFSET_TOO_SMALL
    found = store.get_messages("T", 0, lo, 32)
    assert found.status is GetStatus.FOUND
    assert codec.decode_record(found.records[0]).body == f"r{lo}".encode() * 8
    assert codec.decode_record(found.records[0]).physical_offset >= store.commitlog.min_offset


def test_offset_overflow_badly_with_min_above_zero_goes_to_max(h: Harness) -> None:
    store, lo, hi = _store_with_retained_prefix(h)
    res = store.get_messages("T", 0, hi + 5, 32)
    assert res.status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (hi, lo, hi)


def test_found_and_no_matched_message_with_tags_filter(h: Harness) -> None:
    store = h.open()
    tags = ["a", "b", "a", "c", "b", "a"]
    store.append([_msg(body=f"{i}{t}".encode(), tags=t) for i, t in enumerate(tags)])
    want_a = codec.tags_hash("a")
    res = store.get_messages("T", 0, 0, 32, tags_filter=lambda code: code == want_a)
    assert res.status is GetStatus.FOUND
    assert _bodies(res.records) == [b"0a", b"2a", b"5a"]
    assert res.queue_offsets == [0, 2, 5]
    assert res.next_begin_offset == 6
    none = store.get_messages("T", 0, 0, 32, tags_filter=lambda code: code == codec.tags_hash("z"))
    assert none.status is GetStatus.NO_MATCHED_MESSAGE
    assert none.records == []
    assert none.next_begin_offset == 6  # the scanned units are skipped, not re-read
    by_record = store.get_messages(
        "T", 0, 0, 32, record_filter=lambda raw: codec.decode_record(raw).tags == "c"
    )
    assert by_record.status is GetStatus.FOUND
    assert _bodies(by_record.records) == [b"3c"]


def test_batches_are_at_most_32_messages(make_harness: Callable[..., Harness]) -> None:
    # Consume-queue files big enough that a file's end does not cut the batch first.
    store = make_harness(consume_queue_units_per_file=128).open()
    store.append([_msg(body=str(i).encode()) for i in range(50)])
    res = store.get_messages("T", 0, 0, 64)
    assert res.status is GetStatus.FOUND
    assert len(res.records) == 32
    assert res.next_begin_offset == 32
    rest = store.get_messages("T", 0, 32, 64)
    assert len(rest.records) == 18
    assert rest.next_begin_offset == 50
    assert len(store.get_messages("T", 0, 0, 5).records) == 5


def test_batches_from_disk_are_at_most_8_messages(h: Harness) -> None:
    store = h.open(memory_bytes=1)  # everything counts as "in disk"
    store.append([_msg(body=str(i).encode()) for i in range(20)])
    res = store.get_messages("T", 0, 0, 32)
    assert len(res.records) == 8
    assert res.next_begin_offset == 8
    assert res.suggest_pull_from_slave


# ---- query by key ----------------------------------------------------------------------------
def test_query_by_key_and_unique_key(h: Harness) -> None:
    store = h.open()
    store.append(
        [
            _msg(body=b"one", keys="order-1 cust-9", uniq="UNIQ-1"),
            _msg(body=b"two", keys="order-2", uniq="UNIQ-2"),
            _msg(topic="Other", body=b"other", keys="order-1", uniq="UNIQ-3"),
            _msg(body=b"three", keys="cust-9"),
        ]
    )
    window = (START_MS - 1000, START_MS + 1000)

    def bodies(topic: str, key: str) -> set[bytes]:
        return {r.body for r in store.query_by_key(topic, key, 32, *window)}

    assert bodies("T", "order-1") == {b"one"}
    assert bodies("T", "cust-9") == {b"one", b"three"}
    assert bodies("T", "UNIQ-2") == {b"two"}
    assert bodies("Other", "order-1") == {b"other"}
    assert bodies("T", "UNIQ-3") == set()
    assert bodies("T", "missing") == set()
    assert store.query_by_key("T", "order-1", 32, START_MS + 5000, START_MS + 9000) == []
    assert len(store.query_by_key("T", "cust-9", 1, *window)) == 1


async def test_query_by_key_survives_reopen(h: Harness) -> None:
    store = h.open()
    store.append([_msg(body=b"kept", keys="K1")])
    await h.shutdown(store)
    store = h.open()
    found = store.query_by_key("T", "K1", 32, START_MS - 1, START_MS + 1)
    assert [r.body for r in found] == [b"kept"]


# ---- shutdown, crash, recovery ---------------------------------------------------------------
def _fill(store: MessageStore, n: int) -> dict[tuple[str, int], list[bytes]]:
    expected: dict[tuple[str, int], list[bytes]] = {}
    for i in range(n):
        key = ("T" if i % 4 else "U", i % 3)
        body = f"payload-{i}".encode() * (1 + i % 7)
        store.append([_msg(key[0], key[1], body, keys=f"key-{i}")])
        expected.setdefault(key, []).append(body)
    return expected


def _check(store: MessageStore, expected: dict[tuple[str, int], list[bytes]]) -> None:
    for (topic, qid), bodies in expected.items():
        assert store.max_offset(topic, qid) == len(bodies)
        assert _all_bodies(store, topic, qid) == bodies


async def test_clean_shutdown_then_reopen(h: Harness) -> None:
    store = h.open()
    expected = _fill(store, 150)
    end = store.commitlog.max_offset
    await h.shutdown(store)
    assert not h.config.abort_path.exists()
    store = h.open()
    report = store.recovery
    assert report is not None
    assert not report.abnormal
    assert report.truncated_bytes == 0
    assert report.commitlog_end == end
    assert store.commitlog.max_offset == end
    _check(store, expected)
    assert h.config.abort_path.exists()  # running again
    # Appends continue both offsets densely.
    [res] = store.append([_msg("T", 1, b"after")])
    assert res.physical_offset == end
    assert res.queue_offset == len(expected[("T", 1)])
    assert (
        store.query_by_key("T", "key-5", 8, START_MS - 1, START_MS + 1)[0].body
        == (expected[("T", 2)][1])
    )


def test_reopen_after_crash_is_abnormal_and_keeps_everything(h: Harness) -> None:
    store = h.open()
    expected = _fill(store, 150)
    end = store.commitlog.max_offset
    h.crash(store)
    assert h.config.abort_path.exists()
    store = h.open()
    report = store.recovery
    assert report is not None
    assert report.abnormal
    assert report.truncated_bytes == 0
    assert store.commitlog.max_offset == end
    _check(store, expected)
    [res] = store.append([_msg("U", 0, b"after")])
    assert res.physical_offset == end
    assert res.queue_offset == len(expected[("U", 0)])


@pytest.mark.parametrize("tail", ["garbage", "torn_record"])
def test_torn_tail_is_truncated(h: Harness, tail: str) -> None:
    store = h.open()
    expected = _fill(store, 20)
    end = store.commitlog.max_offset
    assert end < CL_FILE_BYTES - 600
    [last] = store.append([_msg("T", 1, b"will be torn" * 10)])
    record = bytes(store.commitlog.read(last.physical_offset, last.size_bytes) or b"")
    h.crash(store)
    with h.commitlog_first_file.open("r+b") as f:
        f.seek(end)
        if tail == "garbage":
            f.write(b"\xde\xad\xbe\xef" * 40)
        else:  # the record's first half made it to disk, its second half did not
            f.write(record[: len(record) // 2] + bytes(len(record) - len(record) // 2))
    store = h.open()
    report = store.recovery
    assert report is not None
    assert report.abnormal
    assert report.truncated_bytes > 0
    assert report.commitlog_end == end
    assert report.problems
    assert store.commitlog.max_offset == end
    _check(store, expected)  # the torn message is not in its queue; all earlier ones are
    raw = h.commitlog_first_file.read_bytes()
    assert raw[end:] == bytes(CL_FILE_BYTES - end)
    [res] = store.append([_msg("T", 1, b"next")])
    assert res.physical_offset == end
    assert res.queue_offset == len(expected[("T", 1)])


def test_bad_crc_in_last_record_is_truncated(h: Harness) -> None:
    store = h.open()
    expected = _fill(store, 10)
    end = store.commitlog.max_offset
    [last] = store.append([_msg("T", 1, b"flipped")])
    h.crash(store)
    with h.commitlog_first_file.open("r+b") as f:
        f.seek(last.physical_offset + 84 + 4)  # first body byte (IPv4 hosts)
        f.write(b"F")
    store = h.open()
    assert store.recovery is not None
    assert store.recovery.commitlog_end == end
    assert any("CRC" in p for p in store.recovery.problems)
    _check(store, expected)


async def test_consume_queue_dir_deleted_is_rebuilt(h: Harness) -> None:
    store = h.open()
    expected = _fill(store, 120)
    await h.shutdown(store)
    shutil.rmtree(h.config.consume_queue_dir)
    store = h.open()
    report = store.recovery
    assert report is not None
    assert report.records_redispatched == 120
    _check(store, expected)
    assert (h.config.consume_queue_dir / "T" / "1" / file_name(0)).exists()
    # The rebuilt units are byte-identical in meaning: offsets and sizes match the records.
    cq = store.queues.find("T", 1)
    assert cq is not None
    for qoff, phys, size, tags in cq.iter_units():
        rec = store.commitlog.read_record(phys)
        assert rec is not None
        assert (rec.queue_offset, rec.total_size, rec.topic, rec.queue_id) == (qoff, size, "T", 1)
        assert tags == 0


def test_reopen_twice_does_not_duplicate_units(h: Harness) -> None:
    store = h.open()
    expected = _fill(store, 40)
    h.crash(store)
    store = h.open()
    h.crash(store)
    store = h.open()
    _check(store, expected)


# ---- flush and locking -----------------------------------------------------------------------
async def test_sync_flush_put_is_acknowledged_after_fsync(tmp_path: Path) -> None:
    config = _config(tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH)

    store = MessageStore(config, clock=ManualClock(START_MS), disk_usage=lambda _p: 0.1)
    await store.start()
    try:
        res = await store.put([_msg(body=b"durable")])
        assert res.status is PutStatus.PUT_OK
        assert store.flusher.fsync_count >= 1
        last = res.results[-1]
        assert store.flusher.flushed_offset >= last.physical_offset + last.size_bytes
        many = await asyncio.gather(*(store.put([_msg(body=b"x")]) for _ in range(20)))
        assert all(r.status is PutStatus.PUT_OK for r in many)
    finally:
        await store.shutdown()

    store = MessageStore(config, clock=ManualClock(START_MS), disk_usage=lambda _p: 0.1)
    report = store.open()
    try:
        assert not report.abnormal
        assert store.max_offset("T", 0) == 21
    finally:
        store.close_files()


async def test_sync_flush_store_reopened_appends_after_its_data_and_zeroes_none_of_it(
    make_harness: Callable[..., Harness],
) -> None:
    """SYNC_FLUSH reserves commitlog space by writing zeros ahead of the writer; after a
    reopen the reservation starts over, and it must start at the recovered end, never below."""
    h = make_harness(flush_disk_type=FlushDiskType.SYNC_FLUSH, commitlog_file_bytes=64 * 1024)
    assert h.config.zero_ahead_commitlog
    bodies = [f"m{i:03d}".encode() * 50 for i in range(60)]
    for part in (bodies[:30], bodies[30:]):
        store = h.open()
        await store.start()
        res = await store.put([_msg(body=b) for b in part])
        assert res.status is PutStatus.PUT_OK
        await h.shutdown(store)
    store = h.open()
    assert _all_bodies(store, "T", 0) == bodies
    report = verify(detect_layout(h.config.store_dir))
    assert report.ok, report.problems[:5]


def test_zeros_ahead_leave_no_hole_below_the_reservation(
    make_harness: Callable[..., Harness],
) -> None:
    """What zeroing buys: the blocks ahead of the writer are written, so the fsyncs that
    reach them write data only (a fallocated or sparse range reads as a hole here)."""
    h = make_harness(warm_mapped_files=True, commitlog_file_bytes=4 * 1024 * 1024)
    store = h.open()
    store.append([_msg(body=b"x" * 1000) for _ in range(10)])
    first = store.commitlog.files.files[0]
    assert first.reserved_position - first.wrote_position >= ZERO_AHEAD_BYTES
    fd = os.open(first.path, os.O_RDONLY)
    try:
        os.fsync(fd)
        assert os.lseek(fd, 0, os.SEEK_HOLE) >= first.reserved_position
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def _sync_store_with_stuck_fsync(
    tmp_path: Path, *, timeout_ms: int, stuck_ms: int
) -> AsyncIterator[MessageStore]:
    """A started SYNC_FLUSH store whose fsyncs each hang ``stuck_ms`` (until the failpoint is
    cleared); writers give up after ``timeout_ms``."""
    config = _config(
        tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=timeout_ms
    )
    store = MessageStore(config, clock=ManualClock(START_MS), disk_usage=lambda _p: 0.1)
    await store.start()
    failpoints.reload(f"commitlog_before_flush=sleep({stuck_ms})")
    try:
        yield store
    finally:
        failpoints.reload("")
        await store.shutdown()


async def test_sync_flush_timeout_is_reported_while_a_slow_fsync_is_still_running(
    tmp_path: Path,
) -> None:
    """A stuck fsync must not turn FLUSH_DISK_TIMEOUT into a late SEND_OK (regression)."""
    async with _sync_store_with_stuck_fsync(tmp_path, timeout_ms=50, stuck_ms=600) as store:
        loop = asyncio.get_running_loop()
        started = loop.time()
        res = await store.put([_msg(body=b"slow disk")])
        assert res.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert loop.time() - started < 0.5  # answered at its deadline, not after the fsync


async def test_sync_flush_writers_behind_a_stuck_fsync_time_out_then_the_next_is_acknowledged(
    tmp_path: Path,
) -> None:
    """Two writers wait behind one stuck fsync: each is answered FLUSH_DISK_TIMEOUT at its
    deadline (not before, not when the fsync ends), their messages stay stored and the fsync
    makes them durable when it ends; a writer after that is acknowledged by the next fsync."""
    async with _sync_store_with_stuck_fsync(tmp_path, timeout_ms=100, stuck_ms=700) as store:
        loop = asyncio.get_running_loop()

        async def timed_put(body: bytes) -> tuple[PutStatus, float]:
            started = loop.time()
            res = await store.put([_msg(body=body)])
            return res.status, loop.time() - started

        answers = await asyncio.gather(timed_put(b"first"), timed_put(b"second"))
        for status, waited_s in answers:
            assert status is PutStatus.FLUSH_DISK_TIMEOUT
            assert 0.09 <= waited_s < 0.5  # at the 100 ms deadline, long before the 700 ms fsync
        failpoints.reload("")
        stored_end = store.commitlog.max_offset  # timed out, yet stored: the fsync covers them
        await until(lambda: store.flusher.flushed_offset >= stored_end, "the stuck fsync ended")
        res = await store.put([_msg(body=b"after the disk answered")])
        assert res.status is PutStatus.PUT_OK
        last = res.results[-1]
        assert store.flusher.flushed_offset >= last.physical_offset + last.size_bytes


async def test_async_flush_put_returns_ok(tmp_path: Path) -> None:
    config = _config(tmp_path)

    store = MessageStore(config, clock=ManualClock(START_MS), disk_usage=lambda _p: 0.1)
    await store.start()
    try:
        res = await store.put([_msg(body=b"async")])
        assert res.status is PutStatus.PUT_OK
    finally:
        await store.shutdown()


async def test_second_store_on_same_dir_is_locked_out(h: Harness) -> None:
    store = h.open()
    other = MessageStore(h.config, clock=h.clock, disk_usage=lambda _p: 0.1)
    with pytest.raises(StoreError, match="in use"):
        other.open()
    await h.shutdown(store)
    again = h.open()  # the lock is released by a clean shutdown
    assert again.recovery is not None


async def test_append_on_closed_store_raises(h: Harness) -> None:
    store = h.open()
    await h.shutdown(store)
    with pytest.raises(StoreError, match="not open"):
        store.append([_msg()])


async def test_checkpoint_written_on_shutdown(h: Harness) -> None:
    store = h.open()
    h.clock.advance_ms(5)
    store.append([_msg()])
    await h.shutdown(store)
    raw = h.config.checkpoint_path.read_bytes()
    assert len(raw) == 4096
    physic, logics, index = struct.unpack_from(">3q", raw)
    assert physic == logics == index == START_MS + 5


# ---- model-based: appends, crashes and clean restarts in any order --------------------------
_batch = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 700)), min_size=1, max_size=12)
_step = st.one_of(
    st.tuples(st.just("append"), _batch),
    st.tuples(st.sampled_from(["crash", "shutdown", "torn"]), st.just([])),
)


async def _restart(h: Harness, store: MessageStore, kind: str) -> MessageStore:
    """Stop ``store`` as ``kind`` says (torn: a crash that left junk after the last record)."""
    end = store.commitlog.max_offset
    if kind == "shutdown":
        await h.shutdown(store)
    else:
        h.crash(store)
    path = h.config.commitlog_dir / file_name(end - end % CL_FILE_BYTES)
    room = CL_FILE_BYTES - end % CL_FILE_BYTES
    if kind == "torn" and path.exists():
        with path.open("r+b") as f:
            f.seek(end % CL_FILE_BYTES)
            f.write(b"\x5a" * min(room, 50))
    store = h.open()
    assert store.recovery is not None
    assert store.recovery.abnormal == (kind != "shutdown")
    assert store.commitlog.max_offset == end
    return store


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_step, min_size=1, max_size=10))
async def test_restarts_keep_every_acknowledged_message(steps: list[tuple[str, list[Any]]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        h = Harness(Path(d))
        try:
            store = h.open()
            model: dict[tuple[str, int], list[bytes]] = {}
            for kind, batch in steps:
                if kind != "append":
                    store = await _restart(h, store, kind)
                    continue
                msgs, want = [], []
                for qid, size in batch:
                    body = f"{sum(map(len, model.values()))}:".encode() + b"x" * size
                    want.append(len(model.setdefault(("T", qid), [])))
                    model[("T", qid)].append(body)
                    msgs.append(_msg("T", qid, body))
                assert [r.queue_offset for r in store.append(msgs)] == want
            _check(store, model)
        finally:
            for s in h.open_stores:
                s.close_files()
