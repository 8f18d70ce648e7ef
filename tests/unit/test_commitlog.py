"""CommitLog: file naming and rollover (SPEC §4.5, §15), blank tails, dense offsets, reads."""

from __future__ import annotations

import ipaddress
import itertools
import os
import struct
from pathlib import Path

import pytest

from rocketq import codec
from rocketq.codec import BLANK_MAGIC, MESSAGE_MAGIC, HostAddress
from services.common.clock import ManualClock
from services.store.commitlog import (
    DEFAULT_COMMITLOG_FILE_BYTES,
    CommitLog,
    MessageTooLarge,
    MessageToStore,
)
from services.store.mapped_file import file_name

pytestmark = pytest.mark.unit

SMALL_FILE_BYTES = 4096
STORE_HOST = HostAddress(bytes([10, 0, 0, 9]), 10911)


def _msg(
    topic: str = "T", queue_id: int = 0, body: bytes = b"x" * 100, **kw: object
) -> MessageToStore:
    props = codec.encode_properties({"TAGS": "tagA"})
    return MessageToStore(topic=topic, queue_id=queue_id, body=body, properties=props, **kw)  # type: ignore[arg-type]


def _open(
    path: Path, file_size: int = SMALL_FILE_BYTES, clock: ManualClock | None = None
) -> CommitLog:
    cl = CommitLog(
        path, file_size_bytes=file_size, store_host=STORE_HOST, clock=clock or ManualClock()
    )
    cl.files.load()
    return cl


class SteppingClock:
    """A wall clock that can be set anywhere, backwards included (ManualClock refuses)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def now_ms(self) -> int:
        return self.now

    def monotonic_s(self) -> float:
        return 0.0


def _walk(cl: CommitLog) -> list[tuple[int, int, int]]:
    """(offset, size, magic) of every record and blank, following TOTALSIZE from offset 0."""
    out = []
    pos = cl.min_offset
    while pos < cl.max_offset:
        head = cl.read(pos, 8)
        assert head is not None
        size, magic = codec.peek_size_magic(head)
        assert size > 0
        out.append((pos, size, magic))
        pos += size
    assert pos == cl.max_offset
    return out


# ---- naming ----------------------------------------------------------------------------------
def test_file_name_is_20_digit_start_offset() -> None:
    assert DEFAULT_COMMITLOG_FILE_BYTES == 1_073_741_824
    assert file_name(0) == "00000000000000000000"
    assert file_name(DEFAULT_COMMITLOG_FILE_BYTES) == "00000000001073741824"
    assert file_name(2 * DEFAULT_COMMITLOG_FILE_BYTES) == "00000000002147483648"
    assert len(file_name(10**19)) == 20


def test_roll_names_second_file_by_file_size(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    results = []
    while len({r.physical_offset // SMALL_FILE_BYTES for r in results}) < 2:
        results += cl.append_batch([_msg()])[0]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[:2] == [file_name(0), file_name(SMALL_FILE_BYTES)]
    assert names[1] == "00000000000000004096"
    assert all(os.path.getsize(tmp_path / n) == SMALL_FILE_BYTES for n in names)
    assert results[-1].physical_offset == SMALL_FILE_BYTES
    cl.close()


def test_real_one_gib_file_is_sparse_and_named_zero(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path, store_host=STORE_HOST, clock=ManualClock())
    cl.files.load()
    [res], _ = cl.append_batch([_msg(body=b"hello")])
    first = tmp_path / "00000000000000000000"
    assert first.exists()
    assert os.path.getsize(first) == 1_073_741_824
    assert res.physical_offset == 0
    assert cl.max_offset == res.size_bytes
    rec = cl.read_record(0)
    assert rec is not None
    assert rec.body == b"hello"
    # Sparse: a 1 GiB file holding one small record does not occupy a gigabyte.
    assert os.stat(first).st_blocks * 512 < 64 * 1024 * 1024
    cl.close()


# ---- blank tail ------------------------------------------------------------------------------
def test_blank_record_fills_the_file_tail(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    results = []
    for _ in range(100):
        results += cl.append_batch([_msg()])[0]
        if results[-1].physical_offset >= SMALL_FILE_BYTES:
            break
    rolled = results[-1]
    before = results[-2]
    assert rolled.physical_offset == SMALL_FILE_BYTES
    blank_at = before.physical_offset + before.size_bytes
    blank_len = SMALL_FILE_BYTES - blank_at
    # The rolled record did not fit beside the 8 bytes a blank needs.
    assert rolled.size_bytes + codec.END_FILE_MIN_BLANK_BYTES > blank_len
    raw = (tmp_path / file_name(0)).read_bytes()
    assert struct.unpack_from(">iI", raw, blank_at) == (blank_len, BLANK_MAGIC)
    assert raw[blank_at + 8 :] == bytes(blank_len - 8)
    assert struct.unpack_from(">I", raw[:8], 4)[0] == MESSAGE_MAGIC
    assert [m for _, _, m in _walk(cl)].count(BLANK_MAGIC) == 1
    cl.close()


def test_blank_needs_eight_bytes_so_exact_fit_rolls(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    [first], _ = cl.append_batch([_msg(body=b"a")])
    # A body sized so the second record ends exactly at the file end: it must roll instead.
    body_len = SMALL_FILE_BYTES - first.size_bytes - (first.size_bytes - 1)
    [second], _ = cl.append_batch([_msg(body=b"b" * body_len)])
    assert second.physical_offset == SMALL_FILE_BYTES
    raw = (tmp_path / file_name(0)).read_bytes()
    assert struct.unpack_from(">iI", raw, first.size_bytes) == (
        SMALL_FILE_BYTES - first.size_bytes,
        BLANK_MAGIC,
    )
    cl.close()
    # Eight bytes short of the end fits, leaving room for exactly an 8-byte blank.
    other = _open(tmp_path / "other")
    other.append_batch([_msg(body=b"a")])
    [third], _ = other.append_batch([_msg(body=b"c" * (body_len - 8))])
    assert third.physical_offset == first.size_bytes
    assert third.physical_offset + third.size_bytes == SMALL_FILE_BYTES - 8
    other.close()


def test_batch_spanning_a_roll_keeps_offsets_dense(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    results, requests = cl.append_batch([_msg(queue_id=i % 2) for i in range(60)])
    assert results[-1].physical_offset > SMALL_FILE_BYTES
    walked = _walk(cl)
    records = [(off, size) for off, size, magic in walked if magic == MESSAGE_MAGIC]
    assert records == [(r.physical_offset, r.size_bytes) for r in results]
    for (off, size, magic), nxt in itertools.pairwise(walked):
        assert nxt[0] == off + size
        if magic == BLANK_MAGIC:
            assert nxt[0] % SMALL_FILE_BYTES == 0
    assert [r.commitlog_offset for r in requests] == [r.physical_offset for r in results]
    cl.close()


# ---- offsets ---------------------------------------------------------------------------------
def test_physical_offsets_dense_within_a_file(tmp_path: Path) -> None:
    cl = _open(tmp_path, file_size=1 << 20)
    results = []
    for i in range(20):
        batch = [_msg(body=bytes([i]) * (i * 7 + 1)) for _ in range(i % 3 + 1)]
        results += cl.append_batch(batch)[0]
    assert results[0].physical_offset == 0
    for a, b in itertools.pairwise(results):
        assert b.physical_offset == a.physical_offset + a.size_bytes
    assert cl.max_offset == results[-1].physical_offset + results[-1].size_bytes
    cl.close()


def test_queue_offsets_dense_per_topic_and_queue(tmp_path: Path) -> None:
    cl = _open(tmp_path, file_size=1 << 20)
    keys = [("A", 0), ("A", 1), ("B", 0), ("A", 0), ("B", 0), ("A", 0), ("B", 1)]
    got: dict[tuple[str, int], list[int]] = {}
    for topic, qid in keys:
        [res], [req] = cl.append_batch([_msg(topic=topic, queue_id=qid)])
        got.setdefault((topic, qid), []).append(res.queue_offset)
        assert req.queue_offset == res.queue_offset
        assert (req.topic, req.queue_id) == (topic, qid)
    results, _ = cl.append_batch([_msg(topic="A", queue_id=0), _msg(topic="A", queue_id=0)])
    got[("A", 0)] += [r.queue_offset for r in results]
    for offsets in got.values():
        assert offsets == list(range(len(offsets)))
    assert cl.queue_offsets[("A", 0)] == 5
    # The queue offset is in the record itself, too.
    for r in results:
        rec = cl.read_record(r.physical_offset)
        assert rec is not None
        assert rec.queue_offset == r.queue_offset
    cl.close()


def test_store_timestamps_never_go_backwards(tmp_path: Path) -> None:
    clock = SteppingClock(1_000_000)
    cl = CommitLog(tmp_path, file_size_bytes=1 << 20, clock=clock)
    cl.files.load()
    [a], _ = cl.append_batch([_msg()])
    clock.now = 999_500  # the wall clock steps back (NTP)
    [b], _ = cl.append_batch([_msg()])
    assert b.store_timestamp_ms == a.store_timestamp_ms == 1_000_000
    clock.now = 1_000_700
    [c], _ = cl.append_batch([_msg()])
    assert c.store_timestamp_ms == 1_000_700
    cl.close()


# ---- rejection -------------------------------------------------------------------------------
def test_too_large_message_raises_and_leaves_no_trace(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    [ok], _ = cl.append_batch([_msg(topic="T", queue_id=0)])
    snapshot = (tmp_path / file_name(0)).read_bytes()
    offsets_before = dict(cl.queue_offsets)
    max_before = cl.max_offset
    big = _msg(topic="T", queue_id=0, body=b"z" * SMALL_FILE_BYTES)
    with pytest.raises(MessageTooLarge, match="cannot fit"):
        cl.append_batch([_msg(topic="T", queue_id=0), big])
    assert cl.max_offset == max_before
    assert cl.queue_offsets == offsets_before
    assert (tmp_path / file_name(0)).read_bytes() == snapshot
    [after], _ = cl.append_batch([_msg(topic="T", queue_id=0)])
    assert after.queue_offset == ok.queue_offset + 1
    assert after.physical_offset == ok.physical_offset + ok.size_bytes
    cl.close()


def test_largest_message_that_fits(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    empty = codec.record_size(0, 1, len(_msg().properties), False, False)
    fits = SMALL_FILE_BYTES - codec.END_FILE_MIN_BLANK_BYTES - empty
    [res], _ = cl.append_batch([_msg(body=b"f" * fits)])
    assert res.size_bytes == SMALL_FILE_BYTES - codec.END_FILE_MIN_BLANK_BYTES
    with pytest.raises(MessageTooLarge):
        cl.append_batch([_msg(body=b"f" * (fits + 1))])
    cl.close()


def test_too_long_topic_rejected(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    with pytest.raises(ValueError, match="limit"):
        cl.append_batch([_msg(topic="t" * 128)])
    assert cl.max_offset == 0
    assert cl.queue_offsets == {}
    cl.close()


# ---- reads -----------------------------------------------------------------------------------
def test_read_record_round_trip(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_123_456)
    cl = _open(tmp_path, file_size=1 << 16, clock=clock)
    born = HostAddress(ipaddress.ip_address("2001:db8::1").packed, 5555)
    props = codec.encode_properties({"TAGS": "t1", "KEYS": "k1 k2", "UNIQ_KEY": "U"})
    m = MessageToStore(
        topic="Topic",
        queue_id=3,
        body=b"payload",
        properties=props,
        tags_code=codec.tags_hash("t1"),
        keys="k1 k2",
        uniq_key="U",
        flag=9,
        sys_flag=codec.SysFlag.TRANSACTION_PREPARED,
        born_timestamp_ms=1_700_000_000_000,
        born_host=born,
        reconsume_times=4,
        prepared_transaction_offset=77,
    )
    [res], [req] = cl.append_batch([m])
    rec = cl.read_record(res.physical_offset)
    assert rec is not None
    assert rec.topic == "Topic"
    assert rec.queue_id == 3
    assert rec.body == b"payload"
    assert rec.properties == {"TAGS": "t1", "KEYS": "k1 k2", "UNIQ_KEY": "U"}
    assert rec.flag == 9
    assert rec.sys_flag == codec.SysFlag.TRANSACTION_PREPARED | codec.SysFlag.BORNHOST_V6
    assert rec.born_host == born
    assert rec.store_host == STORE_HOST
    assert rec.born_timestamp_ms == 1_700_000_000_000
    assert rec.store_timestamp_ms == res.store_timestamp_ms == 1_700_000_123_456
    assert rec.reconsume_times == 4
    assert rec.prepared_transaction_offset == 77
    assert rec.physical_offset == res.physical_offset
    assert rec.total_size == res.size_bytes
    assert rec.offset_msg_id == res.offset_msg_id
    assert codec.decode_offset_msg_id(res.offset_msg_id) == (STORE_HOST, res.physical_offset)
    assert req.tags_code == codec.tags_hash("t1")
    assert (req.keys, req.uniq_key, req.msg_size) == ("k1 k2", "U", res.size_bytes)
    assert req.sys_flag == rec.sys_flag
    raw = cl.read(res.physical_offset, res.size_bytes)
    assert raw is not None
    with raw:  # a zero-copy view of the map: released before the map can close
        assert codec.decode_record(raw).body == b"payload"
    cl.close()


def test_read_outside_the_log_returns_none(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    assert cl.read_record(0) is None
    [res], _ = cl.append_batch([_msg()])
    assert cl.read(res.physical_offset, res.size_bytes + 1) is None  # past the written end
    assert cl.read_record(res.physical_offset + res.size_bytes) is None
    assert cl.read_record(10 * SMALL_FILE_BYTES) is None
    assert cl.read_store_timestamp(10 * SMALL_FILE_BYTES, 100) is None
    cl.close()


def test_read_record_at_blank_or_garbage_raises_corrupt(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    results = []
    while not results or results[-1].physical_offset < SMALL_FILE_BYTES:
        results += cl.append_batch([_msg()])[0]
    blank_at = results[-2].physical_offset + results[-2].size_bytes
    with pytest.raises(codec.CorruptRecord):
        cl.read_record(blank_at)
    with pytest.raises(codec.CorruptRecord):
        cl.read_record(results[0].physical_offset + 1)
    cl.close()


def test_read_store_timestamp(tmp_path: Path) -> None:
    clock = ManualClock(5_000)
    cl = _open(tmp_path, file_size=1 << 16, clock=clock)
    v6 = HostAddress(ipaddress.ip_address("::1").packed, 1)
    stamps = []
    for born in (codec.LOCALHOST, v6, codec.LOCALHOST):
        clock.advance_ms(1234)
        [res], _ = cl.append_batch([_msg(born_host=born)])
        stamps.append((res, clock.now_ms()))
    for res, ts in stamps:
        assert cl.read_store_timestamp(res.physical_offset, res.size_bytes) == ts
    res = stamps[0][0]
    assert cl.read_store_timestamp(res.physical_offset, 20) is None  # too short to hold it
    cl.close()


def test_next_file_start(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    assert cl.next_file_start(0) == SMALL_FILE_BYTES
    assert cl.next_file_start(SMALL_FILE_BYTES - 1) == SMALL_FILE_BYTES
    assert cl.next_file_start(SMALL_FILE_BYTES) == 2 * SMALL_FILE_BYTES
    cl.close()


# ---- reopen, truncate, raw append ------------------------------------------------------------
def test_truncate_drops_later_bytes_and_files(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    results = cl.append_batch([_msg() for _ in range(60)])[0]
    cut = results[5].physical_offset
    cl.truncate(cut)
    assert cl.max_offset == cut
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(0)]
    raw = (tmp_path / file_name(0)).read_bytes()
    assert raw[cut:] == bytes(SMALL_FILE_BYTES - cut)
    cl.close()


def test_append_raw_must_continue_at_the_end(tmp_path: Path) -> None:
    src = _open(tmp_path / "master")
    results = src.append_batch([_msg() for _ in range(50)])[0]
    data = bytes(src.read(0, SMALL_FILE_BYTES) or b"")
    dst = _open(tmp_path / "slave")
    with pytest.raises(ValueError, match="ends at 0"):
        dst.append_raw(100, data)
    dst.append_raw(0, data)
    assert dst.max_offset == SMALL_FILE_BYTES
    first = dst.read_record(results[0].physical_offset)
    assert first is not None
    assert first.queue_offset == 0
    src.close()
    dst.close()


def test_reloaded_files_count_as_full_until_recovered(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    cl.append_batch([_msg()])
    cl.close()
    again = _open(tmp_path)
    # load() alone does not know where data ends; recovery sets it (see test_message_store).
    assert again.files.files[0].wrote_position == SMALL_FILE_BYTES
    again.close()


def test_load_removes_a_creation_cut_short_but_a_reader_leaves_it(tmp_path: Path) -> None:
    from services.store.mapped_file import MappedFileQueue, file_name

    leftover = tmp_path / (file_name(4096) + ".tmp")
    leftover.write_bytes(b"")
    assert MappedFileQueue(tmp_path, 4096, readonly=True).load() == []
    assert leftover.exists()
    assert MappedFileQueue(tmp_path, 4096).load() == []
    assert not leftover.exists()
