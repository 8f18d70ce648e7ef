"""IndexFile and IndexService: SPEC §4.7/§11.3/§15 vectors, bytes, queries, rolls, crashes, fuzz."""

from __future__ import annotations

import errno
import os
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq.java_hash import (
    index_key_hash,
    index_key_hashes,
    index_key_hashes_of_rows,
    java_string_hash,
    java_string_hashes,
)
from services.common import failpoints
from services.common.clock import ManualClock
from services.store import index_service
from services.store.index_file import (
    DEFAULT_INDEX_NUM,
    DEFAULT_SLOT_NUM,
    ENTRY,
    HEADER,
    SLOT,
    IndexFile,
    entry_position_bytes,
    index_file_size_bytes,
)
from services.store.index_service import (
    IndexService,
    format_index_file_name,
    index_keys_of,
    parse_index_file_name,
)
from services.store.mapped_file import DiskFullError
from services.store.types import DispatchRequest, DispatchRun, PhysicalOffset, QueueOffset

pytestmark = pytest.mark.unit

T0_MS = 1_700_000_000_000  # a whole second, so second-granular time diffs are exact in tests
FAR_FUTURE_MS = 2**62
SMALL: dict[str, int] = {"slot_num": 16, "index_num": 32}

# --- Java String.hashCode ---------------------------------------------------------------


def _reference_java_hash(s: str) -> int:
    """The definition: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 units, mod 2^32, signed."""
    raw = s.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
    n = len(units)
    h = sum(u * pow(31, n - 1 - i, 2**32) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # the famous Integer.MIN_VALUE string
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # one code point, two UTF-16 units
    ],
)
def test_java_hash_known_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected
    assert _reference_java_hash(text) == expected


def test_java_hash_by_definition() -> None:
    for text in ["TopicTest#KEY1", "TopicTest#" + "K" * 300, "é", "日本語#キー", "\ud800x"]:
        assert java_string_hash(text) == _reference_java_hash(text)


def test_index_key_hash_is_abs_and_min_value_maps_to_zero() -> None:
    assert index_key_hash("polygenelubricants") == 0
    negative = "2-TopicTest"
    assert java_string_hash(negative) == _reference_java_hash(negative) < 0
    assert index_key_hash(negative) == -java_string_hash(negative)
    assert index_key_hash("hello") == 99162322


_any_char = st.one_of(
    st.characters(),
    st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]),  # lone surrogates, legal in Java
)
_keys = st.one_of(
    st.text(alphabet=_any_char, max_size=20),
    # Same-length ASCII keys, so the grouped matrix path (>= 8 of one length) runs too.
    st.integers(0, 3).flatmap(lambda n: st.text(alphabet="ab#Z09", min_size=n * 7, max_size=n * 7)),
    st.text(alphabet="xyz", min_size=130, max_size=140),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_keys, max_size=80))
def test_batch_hash_equals_single(keys: list[str]) -> None:
    assert index_key_hashes(keys) == [index_key_hash(k) for k in keys]
    assert java_string_hashes(keys) == [java_string_hash(k) for k in keys]
    assert java_string_hashes(keys) == [_reference_java_hash(k) for k in keys]


def test_batch_hash_many_uniform_keys() -> None:
    keys = [f"TopicTest#{i:032X}" for i in range(5000)] + ["TopicTest#é", "x", "polygenelubricants"]
    assert index_key_hashes(keys) == [index_key_hash(k) for k in keys]
    assert index_key_hashes(keys)[-1] == 0


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="AZaz09_-%|#", max_size=30),
    st.integers(0, 40).flatmap(
        lambda width: st.lists(st.binary(min_size=width, max_size=width), min_size=1, max_size=20)
    ),
)
def test_hashes_of_byte_rows_equal_the_hashes_of_the_strings(prefix: str, ids: list[bytes]) -> None:
    # A slave hashes ``topic#uniq`` from the records' bytes: one row of ASCII bytes per key.
    ascii_ids = [bytes(b & 0x7F for b in raw) for raw in ids]
    rows = np.frombuffer(b"".join(ascii_ids), dtype=np.uint8).reshape(len(ids), -1)
    hashes = index_key_hashes_of_rows(prefix, rows)
    assert hashes is not None
    assert hashes.tolist() == [index_key_hash(prefix + raw.decode("ascii")) for raw in ascii_ids]


def test_hashes_of_byte_rows_decline_a_prefix_that_is_not_ascii() -> None:
    assert index_key_hashes_of_rows("Tópico#", np.zeros((2, 4), dtype=np.uint8)) is None


# --- helpers ----------------------------------------------------------------------------


def _req(
    offset: int, ts_ms: int, *, keys: str = "", uniq: str = "", topic: str = "T", sys_flag: int = 0
) -> DispatchRequest:
    return DispatchRequest(
        topic=topic,
        queue_id=0,
        commitlog_offset=PhysicalOffset(offset),
        msg_size=100,
        tags_code=0,
        store_timestamp_ms=ts_ms,
        queue_offset=QueueOffset(0),
        keys=keys,
        uniq_key=uniq,
        sys_flag=sys_flag,
    )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[IndexService]:
    svc = IndexService(tmp_path / "index", clock=ManualClock(T0_MS), **SMALL)
    svc.load()
    yield svc
    svc.close()


def _chain(f: IndexFile, slot: int) -> list[int]:
    out: list[int] = []
    value = f.slot_value(slot)
    while value and len(out) <= f.index_num:
        out.append(value)
        value = f.read_entry(value).prev_index_no
    return out


# --- SPEC §15 vectors and exact bytes ---------------------------------------------------


def test_default_file_is_420000040_bytes_sparse_and_entry_n_position(tmp_path: Path) -> None:
    path = tmp_path / "20231114221320000"
    f = IndexFile(path)
    try:
        assert index_file_size_bytes() == 420_000_040
        assert (f.slot_num, f.index_num) == (DEFAULT_SLOT_NUM, DEFAULT_INDEX_NUM)
        st_ = os.stat(path)
        assert st_.st_size == 420_000_040
        assert st_.st_blocks * 512 < 1 << 20  # sparse: the tables cost no disk until written
        for n in (1, 2, 12345, DEFAULT_INDEX_NUM - 1):
            assert f.entry_position(n) == 40 + 20_000_000 + n * 20
            assert entry_position_bytes(DEFAULT_SLOT_NUM, n) == 40 + 20_000_000 + n * 20
        assert f.put_key("TopicTest#KEY1", 777, T0_MS)
        with open(path, "rb") as fh:
            fh.seek(40 + 20_000_000 + 1 * 20)
            raw = fh.read(20)
        assert ENTRY.unpack(raw) == (index_key_hash("TopicTest#KEY1"), 777, 0, 0)
    finally:
        f.close()


def test_written_bytes_exact(tmp_path: Path) -> None:
    path = tmp_path / "f"
    f = IndexFile(path, 16, 32)
    key = "T#order-1"
    h = index_key_hash(key)
    assert f.put_key(key, 1234, T0_MS + 123)
    assert f.put_key(key, 5678, T0_MS + 2623)  # 2.5 s later: timeDiff 2 (whole seconds)
    assert f.put_key("T#other", 9999, T0_MS + 100)  # 23 ms before begin: stored as diff 0
    f.close()
    data = path.read_bytes()
    assert index_key_hash("T#other") % 16 != h % 16  # precondition: two slots in use
    assert len(data) == 40 + 16 * 4 + 32 * 20
    # Header: begin = first entry, end = last put, 2 slots used, indexCount = next number (4).
    assert HEADER.unpack_from(data, 0) == (T0_MS + 123, T0_MS + 2623, 1234, 9999, 2, 4)
    assert SLOT.unpack_from(data, 40 + (h % 16) * 4) == (2,)
    entries_at = 40 + 16 * 4
    assert data[entries_at : entries_at + 20] == bytes(20)  # entry 0 is never used
    assert ENTRY.unpack_from(data, entries_at + 1 * 20) == (h, 1234, 0, 0)
    assert ENTRY.unpack_from(data, entries_at + 2 * 20) == (h, 5678, 2, 1)
    other = index_key_hash("T#other")
    assert ENTRY.unpack_from(data, entries_at + 3 * 20) == (other, 9999, 0, 0)
    # Big-endian, as Java writes it.
    assert data[entries_at + 20 : entries_at + 24] == h.to_bytes(4, "big")


def test_entries_iterator_and_readonly(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with_keys = IndexFile(path, 16, 32)
    for i in range(5):
        with_keys.put_key(f"T#k{i % 2}", 100 + i, T0_MS + i * 1000)
    with_keys.close()
    ro = IndexFile(path, 16, 32, readonly=True)
    try:
        listed = list(ro.entries())
        assert [e.index_no for e in listed] == [1, 2, 3, 4, 5]
        assert [e.phy_offset for e in listed] == [100, 101, 102, 103, 104]
        assert [e.time_diff_s for e in listed] == [0, 1, 2, 3, 4]
        assert index_key_hash("T#k0") % 16 != index_key_hash("T#k1") % 16  # precondition
        assert [e.prev_index_no for e in listed] == [0, 0, 1, 2, 3]
        assert ro.select("T#k1", 10, 0, FAR_FUTURE_MS) == [103, 101]
        with pytest.raises(ValueError, match="read-only"):
            ro.put_key("T#k1", 1, T0_MS)
    finally:
        ro.close()


# --- queries ----------------------------------------------------------------------------


def test_query_by_key_and_time_range(service: IndexService) -> None:
    for i in range(6):  # one message per second, all with key "order"
        service.build_index(_req(1000 + i * 100, T0_MS + i * 1000, keys="order"))
    service.build_index(_req(5000, T0_MS + 7000, keys="unrelated"))
    everything = service.query("T", "order", 100, 0, FAR_FUTURE_MS)
    assert everything == [1500, 1400, 1300, 1200, 1100, 1000]  # newest first
    assert service.query("T", "order", 2, 0, FAR_FUTURE_MS) == [1500, 1400]
    assert service.query("T", "order", 100, T0_MS + 2000, T0_MS + 3000) == [1300, 1200]
    assert service.query("T", "order", 100, T0_MS + 9000, FAR_FUTURE_MS) == []
    assert service.query("T", "order", 0, 0, FAR_FUTURE_MS) == []
    assert service.query("OtherTopic", "order", 10, 0, FAR_FUTURE_MS) == []
    assert service.max_indexed_offset == 5000


def test_time_is_known_to_the_second_so_query_never_misses(service: IndexService) -> None:
    service.build_index(_req(0, T0_MS, keys="k"))
    service.build_index(_req(100, T0_MS + 1700, keys="k"))  # stored as diff 1
    # A range starting at the exact store time still finds it (RocketMQ's check would not).
    assert service.query("T", "k", 10, T0_MS + 1700, T0_MS + 1700) == [100]


def test_several_keys_per_message_and_uniq_key(service: IndexService) -> None:
    service.build_index(_req(0, T0_MS, keys="a  b c ", uniq="U1"))  # empty keys are skipped
    f = service.files[0]
    assert f.entry_count == 4
    assert [e.key_hash for e in f.entries()] == [
        index_key_hash(k) for k in ("T#U1", "T#a", "T#b", "T#c")
    ]
    for key in ("a", "b", "c", "U1"):
        assert service.query("T", key, 10, 0, FAR_FUTURE_MS) == [0]
    assert service.query("T", "", 10, 0, FAR_FUTURE_MS) == []


def _hashed_run(first: int, ts_ms: int, uniqs: list[str]) -> DispatchRun:
    """Records at ``first``, ``first + 100``, … of topic T, their index hashes already known
    (as a slave reads them from a producer's batch)."""
    rows = np.frombuffer("".join(uniqs).encode("ascii"), dtype=np.uint8).reshape(len(uniqs), -1)
    phys = [first + 100 * i for i in range(len(uniqs))]
    n = len(uniqs)
    return DispatchRun(
        "T", 0, QueueOffset(0), phys, [100] * n, [0] * n, [ts_ms] * n, [""] * n, uniqs,
        [0] * n, PhysicalOffset(phys[-1] + 100), index_key_hashes_of_rows("T#", rows),
    )  # fmt: skip


@pytest.mark.parametrize("drained_between", [False, True], ids=["one queue", "drained between"])
def test_keys_hashed_from_the_bytes_index_as_their_strings_would(
    tmp_path: Path, drained_between: bool
) -> None:
    # A slave queues hashed runs and, between them, records its batch reader declined (with
    # KEYS, or a chunk's partial record completed): its index files hold the same bytes as
    # when every key is queued as a string.
    uniq_runs = [[f"{r:02d}{i:030X}" for i in range(n)] for r, n in enumerate((40, 3, 700))]
    as_strings, hashed = (
        IndexService(tmp_path / name, clock=ManualClock(T0_MS), **SMALL) for name in ("s", "h")
    )
    for svc in (as_strings, hashed):
        svc.load()
    offset = 0
    for r, uniqs in enumerate(uniq_runs):
        declined = _req(offset, T0_MS + r, keys="order k2", uniq=f"D{r}")
        for svc in (as_strings, hashed):
            svc.build_index(declined)
        offset += 100
        run = _hashed_run(offset, T0_MS + r, uniqs)
        as_strings.build_index_batch(run._replace(index_hashes=None).requests())
        hashed.build_index_run(run)
        offset = run.end_offset
        if drained_between:
            for svc in (as_strings, hashed):
                svc.drain()
    for svc in (as_strings, hashed):
        svc.close()
    names = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "h").iterdir())
    assert len(names) >= 2  # 700 keys roll the small files
    for name in names:
        assert (tmp_path / "h" / name).read_bytes() == (tmp_path / "s" / name).read_bytes()


def test_hash_collisions_return_both_offsets(service: IndexService) -> None:
    # "Aa" and "BB" share a hashCode, so "T#Aa" and "T#BB" do too: the index cannot tell them
    # apart and the caller must compare keys on the records it reads.
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")
    service.build_index(_req(10, T0_MS, keys="Aa"))
    service.build_index(_req(20, T0_MS, keys="BB"))
    assert service.query("T", "Aa", 10, 0, FAR_FUTURE_MS) == [20, 10]
    assert service.query("T", "BB", 10, 0, FAR_FUTURE_MS) == [20, 10]


def test_same_slot_different_hash_is_filtered(service: IndexService) -> None:
    keys = [f"k{i}" for i in range(200)]
    h0 = index_key_hash("T#k0")
    same_slot = [k for k in keys if index_key_hash("T#" + k) % 16 == h0 % 16]
    assert len(same_slot) >= 2
    for i, key in enumerate(same_slot[:2]):
        service.build_index(_req(i * 10, T0_MS, keys=key))
    assert service.query("T", same_slot[0], 10, 0, FAR_FUTURE_MS) == [0]
    assert service.query("T", same_slot[1], 10, 0, FAR_FUTURE_MS) == [10]


def test_only_rollback_records_are_not_indexed(service: IndexService) -> None:
    # RocketMQ 4.x's buildIndex: NOT_TYPE, PREPARED and COMMIT are indexed, ROLLBACK is not.
    for offset, flag in ((0, 0x0), (100, 0x4), (200, 0x8), (300, 0xC), (400, 0x4 | 0x1)):
        service.build_index(_req(offset, T0_MS, keys="tx", sys_flag=flag))
    assert service.query("T", "tx", 10, 0, FAR_FUTURE_MS) == [400, 200, 100, 0]


def test_no_keys_creates_no_file(service: IndexService, tmp_path: Path) -> None:
    service.build_index(_req(0, T0_MS))
    service.build_index_batch([_req(100, T0_MS), _req(200, T0_MS, keys="   ")])
    assert service.files == ()
    assert not (tmp_path / "index").exists()


def test_redispatch_is_skipped_below_end_offset(service: IndexService) -> None:
    for i in range(3):
        service.build_index(_req(i * 100, T0_MS, keys="k"))
    service.build_index_batch([_req(0, T0_MS, keys="k"), _req(100, T0_MS, keys="k")])
    assert service.files[0].entry_count == 3
    # The last record sits *at* endPhyoffset, so it is indexed again; queries dedupe it.
    service.build_index(_req(200, T0_MS, keys="k"))
    assert service.files[0].entry_count == 4
    assert service.query("T", "k", 10, 0, FAR_FUTURE_MS) == [200, 100, 0]


# --- files: roll, names, reload, retention ----------------------------------------------


def test_roll_to_new_files_when_full_and_reload(tmp_path: Path) -> None:
    clock = ManualClock(T0_MS)
    svc = IndexService(tmp_path, slot_num=8, index_num=5, clock=clock)  # 4 entries per file
    svc.load()
    for i in range(10):
        svc.build_index(_req(i * 100, T0_MS + i * 1000, keys=f"k{i % 3}"))
    assert [f.entry_count for f in svc.files] == [4, 4, 2]
    assert all(f.is_full for f in svc.files[:2])
    names = [f.path.name for f in svc.files]
    # Same millisecond on the clock, yet distinct names that sort in creation order.
    assert names == sorted(names) and len(set(names)) == 3
    assert names[0] == format_index_file_name(T0_MS) == "20231114221320000"
    assert parse_index_file_name(names[1]) == T0_MS + 1
    expected = {k: svc.query("T", k, 100, 0, FAR_FUTURE_MS) for k in ("k0", "k1", "k2")}
    assert expected["k0"] == [900, 600, 300, 0]
    window = svc.query("T", "k1", 100, T0_MS + 4000, T0_MS + 7000)
    assert window == [700, 400]
    svc.close()

    again = IndexService(tmp_path, slot_num=8, index_num=5, clock=clock)
    assert again.load() == []
    assert {k: again.query("T", k, 100, 0, FAR_FUTURE_MS) for k in expected} == expected
    assert again.query("T", "k1", 100, T0_MS + 4000, T0_MS + 7000) == window
    assert again.max_indexed_offset == 900
    again.build_index(_req(1000, T0_MS + 10_000, keys="k0"))
    assert again.query("T", "k0", 2, 0, FAR_FUTURE_MS) == [1000, 900]
    again.close()


def test_message_split_across_a_roll(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, slot_num=8, index_num=3, clock=ManualClock(T0_MS))
    svc.build_index(_req(0, T0_MS, keys="a b c d e"))
    assert [f.entry_count for f in svc.files] == [2, 2, 1]
    assert all(f.end_phy_offset == 0 for f in svc.files)
    for key in "abcde":
        assert svc.query("T", key, 10, 0, FAR_FUTURE_MS) == [0]
    svc.close()


def test_delete_files_before_keeps_the_last(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, slot_num=8, index_num=3, clock=ManualClock(T0_MS))
    for i in range(6):
        svc.build_index(_req(i * 100, T0_MS, keys=f"k{i}"))
    assert [f.end_phy_offset for f in svc.files] == [100, 300, 500]
    assert svc.delete_files_before(250) == 1
    assert [f.end_phy_offset for f in svc.files] == [300, 500]
    assert svc.delete_files_before(10**9) == 1
    assert len(svc.files) == 1 and len(list(tmp_path.iterdir())) == 1
    assert svc.query("T", "k5", 10, 0, FAR_FUTURE_MS) == [500]
    svc.flush()
    svc.close()


def test_load_skips_wrong_size_and_foreign_files(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, clock=ManualClock(T0_MS), **SMALL)
    svc.build_index(_req(0, T0_MS, keys="k"))
    svc.close()
    (tmp_path / "20991231235959999").write_bytes(b"\x00" * 100)  # wrong size, sorts last
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "20240101000000000.tmp").write_bytes(b"half-made")
    with pytest.raises(ValueError, match="is 100 bytes, expected"):
        IndexFile(tmp_path / "20991231235959999", 16, 32)

    again = IndexService(tmp_path, clock=ManualClock(T0_MS), **SMALL)
    problems = again.load()
    assert len(problems) == 2 and problems == again.problems
    assert any("20991231235959999" in p and "expected" in p for p in problems)
    assert any("notes.txt" in p for p in problems)
    assert not (tmp_path / "20240101000000000.tmp").exists()
    assert again.query("T", "k", 10, 0, FAR_FUTURE_MS) == [0]
    # A new file must sort after the broken one's name, not collide with it.
    while not again.files[-1].is_full:
        again.build_index(_req(again.max_indexed_offset + 1, T0_MS, keys="x"))
    again.build_index(_req(again.max_indexed_offset + 1, T0_MS, keys="y"))
    assert again.files[-1].path.name > "20991231235959999"
    again.close()


def test_corrupt_header_is_a_clear_value_error(tmp_path: Path) -> None:
    path = tmp_path / "f"
    IndexFile(path, 16, 32).close()
    with open(path, "r+b") as fh:
        fh.seek(36)
        fh.write(struct.pack(">i", 10_000))
    with pytest.raises(ValueError, match="corrupt header"):
        IndexFile(path, 16, 32)


def test_failpoint_dispatch_before_index(service: IndexService) -> None:
    failpoints.reload("dispatch_before_index=error")
    try:
        with pytest.raises(failpoints.FailpointError):
            service.build_index(_req(0, T0_MS, keys="k"))
        with pytest.raises(failpoints.FailpointError):
            service.build_index_batch([_req(0, T0_MS, keys="k")])
    finally:
        failpoints.reload("")
    assert service.files == ()


# --- crash safety -----------------------------------------------------------------------


def _torn_put(f: IndexFile, key: str, offset: int, *, write_slot: bool, ahead: int = 0) -> int:
    """Write entry ``indexCount + ahead`` (and maybe its slot) as a killed put would: no header."""
    h = index_key_hash(key)
    n = f.index_count + ahead
    slot = h % f.slot_num
    fd = os.open(f.path, os.O_RDWR)
    try:
        # The mapping shares the page cache with the file, as after a SIGKILL.
        os.pwrite(fd, ENTRY.pack(h, offset, 0, f.slot_value(slot)), f.entry_position(n))
        if write_slot:
            os.pwrite(fd, SLOT.pack(n), HEADER.size + slot * SLOT.size)
    finally:
        os.close(fd)
    return n


@pytest.mark.parametrize("write_slot", [False, True])
def test_torn_write_then_redispatch_has_no_self_loop(
    service: IndexService, write_slot: bool
) -> None:
    service.build_index(_req(0, T0_MS, keys="k"))
    f = service.files[0]
    n = _torn_put(f, "T#k", 100, write_slot=write_slot)
    assert f.index_count == n  # not committed
    assert service.query("T", "k", 10, 0, FAR_FUTURE_MS) == [0]  # the torn entry is invisible
    service.build_index(_req(100, T0_MS, keys="k"))  # the re-dispatch
    service.drain()  # write it now: the file is read directly below
    entry = f.read_entry(n)
    assert entry.prev_index_no == 1 and entry.phy_offset == 100
    assert _chain(f, index_key_hash("T#k") % f.slot_num) == [2, 1]
    assert service.query("T", "k", 10, 0, FAR_FUTURE_MS) == [100, 0]


def test_torn_slots_rolled_back_on_reload(tmp_path: Path) -> None:
    svc = IndexService(tmp_path, clock=ManualClock(T0_MS), **SMALL)
    svc.build_index(_req(0, T0_MS, keys="k"))
    f = svc.files[0]
    _torn_put(f, "T#k", 100, write_slot=True)
    _torn_put(f, "T#zz", 100, write_slot=True, ahead=1)
    svc.close()
    again = IndexService(tmp_path, clock=ManualClock(T0_MS), **SMALL)
    again.load()
    f = again.files[0]
    assert f.slot_value(index_key_hash("T#k") % 16) == 1
    assert f.slot_value(index_key_hash("T#zz") % 16) in (0, 1)
    again.build_index_batch([_req(100, T0_MS, keys="k zz")])
    assert again.query("T", "k", 10, 0, FAR_FUTURE_MS) == [100, 0]
    assert again.query("T", "zz", 10, 0, FAR_FUTURE_MS) == [100]
    again.close()


# --- batch path equals single path, and both equal a model ------------------------------

_message = st.tuples(
    st.integers(-2, 3),  # seconds after the previous message (negative: the clock stepped back)
    st.lists(st.sampled_from(["a", "b", "c", "Aa", "BB", "k1", "k2"]), max_size=3),
    st.sampled_from(["", "U"]),  # a uniq key "U<offset>" or none
    st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC]),
)


def _build(
    messages: list[tuple[int, list[str], str, int]], *, clock_steps_back: bool
) -> list[DispatchRequest]:
    reqs: list[DispatchRequest] = []
    ts = T0_MS
    for i, (gap_s, keys, uniq, flag) in enumerate(messages):
        ts += (gap_s if clock_steps_back else abs(gap_s)) * 1000
        reqs.append(_req(i * 100, ts, keys=" ".join(keys), uniq=uniq and f"U{i}", sys_flag=flag))
    return reqs


def _model_query(
    reqs: list[DispatchRequest], key: str, max_num: int, begin: int, end: int
) -> list[int]:
    h = index_key_hash("T#" + key)
    hits: list[int] = []
    for r in reversed(reqs):
        if (r.sys_flag & 0xC) == 0xC:
            continue
        keys = [r.uniq_key, *r.keys.split(" ")]
        if (
            any(k and index_key_hash("T#" + k) == h for k in keys)
            and begin <= r.store_timestamp_ms <= end
        ):
            hits.append(r.commitlog_offset)
    return hits[:max_num]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    messages=st.lists(_message, max_size=40),
    batch_sizes=st.lists(st.integers(1, 15), min_size=1, max_size=5),
    redispatch=st.integers(0, 5),
    clock_steps_back=st.booleans(),
    queries=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "Aa", "k2", "U3", "zz"]),
            st.integers(1, 50),
            st.integers(0, 60),
            st.integers(0, 60),
        ),
        max_size=8,
    ),
)
def test_random_puts_match_model_and_batch_equals_single(
    tmp_path_factory: pytest.TempPathFactory,
    messages: list[tuple[int, list[str], str, int]],
    batch_sizes: list[int],
    redispatch: int,
    clock_steps_back: bool,
    queries: list[tuple[str, int, int, int]],
) -> None:
    reqs = _build(messages, clock_steps_back=clock_steps_back)
    base = tmp_path_factory.mktemp("prop")
    geometry = {"slot_num": 4, "index_num": 6}  # tiny: collisions, long chains, many rolls
    single = IndexService(base / "single", clock=ManualClock(T0_MS), **geometry)
    batch = IndexService(base / "batch", clock=ManualClock(T0_MS), **geometry)
    for r in reqs:
        single.build_index(r)
        single.drain()  # each record written on its own
    i, sizes = 0, iter(batch_sizes * 40)
    while i < len(reqs):
        step = next(sizes)
        batch.build_index_batch(reqs[i : i + step])
        if step % 2:  # queued entries written at varied points, several batches at once
            batch.drain()
        i += step
    # Same requests, written in different groups: byte-identical files.
    assert [f.path.name for f in single.files] == [f.path.name for f in batch.files]
    for a, b in zip(single.files, batch.files, strict=True):
        assert a.path.read_bytes() == b.path.read_bytes()
    # Recovery re-dispatches a suffix: only the last indexed record goes in again.
    suffix = reqs[max(0, len(reqs) - redispatch) :]
    batch.build_index_batch(suffix)
    indexed = [r for r in reqs if (r.sys_flag & 0xC) != 0xC and index_keys_of(r)]
    again = len(index_keys_of(indexed[-1])) if indexed and indexed[-1] in suffix else 0
    count = sum(f.entry_count for f in single.files)
    assert sum(f.entry_count for f in batch.files) == count + again
    # The model knows exact store times; the index knows seconds after the file's first entry,
    # so the two agree only while time never goes back (a store's normal case).
    for svc in () if clock_steps_back else (single, batch):
        for key, max_num, b_s, e_s in queries:
            begin, end = T0_MS + b_s * 1000, T0_MS + (b_s + e_s) * 1000
            assert svc.query("T", key, max_num, begin, end) == _model_query(
                reqs, key, max_num, begin, end
            )
    single.close()
    batch.close()


# --- corruption -------------------------------------------------------------------------


def test_self_loop_and_cycle_terminate(tmp_path: Path) -> None:
    path = tmp_path / "f"
    f = IndexFile(path, 16, 32)
    for i in range(5):
        f.put_key("T#k", i * 10, T0_MS)
    h = index_key_hash("T#k")
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, ENTRY.pack(h, 40, 0, 5), f.entry_position(5))  # points at itself
        assert f.select("T#k", 100, 0, FAR_FUTURE_MS) == [40]
        os.pwrite(fd, ENTRY.pack(h, 20, 0, 5), f.entry_position(3))  # 5 -> 3 -> 5 -> ...
        os.pwrite(fd, ENTRY.pack(h, 40, 0, 3), f.entry_position(5))
        assert f.select("T#k", 100, 0, FAR_FUTURE_MS) == [40, 20]
        os.pwrite(fd, SLOT.pack(-7), HEADER.size + (h % 16) * 4)  # negative slot
        assert f.select("T#k", 100, 0, FAR_FUTURE_MS) == []
        os.pwrite(fd, SLOT.pack(10**9), HEADER.size + (h % 16) * 4)  # far out of range
        assert f.select("T#k", 100, 0, FAR_FUTURE_MS) == []
        assert f.put_key("T#k", 60, T0_MS)  # a put over garbage cuts the chain, never loops
        assert f.read_entry(6).prev_index_no == 0
    finally:
        os.close(fd)
        f.close()


def test_repair_of_a_long_uncommitted_chain(tmp_path: Path) -> None:
    slot_num, index_num = 64, 3000
    path = tmp_path / "20240101000000000"
    IndexFile(path, slot_num, index_num).close()
    # Nothing committed (indexCount 1), yet every slot points at a chain through every entry.
    with open(path, "r+b") as fh:
        fh.seek(HEADER.size)
        fh.write(SLOT.pack(index_num - 1) * slot_num)
        fh.write(b"".join(ENTRY.pack(7, i, 0, i - 1) for i in range(index_num)))
    svc = IndexService(tmp_path, slot_num=slot_num, index_num=index_num, clock=ManualClock(T0_MS))
    assert svc.load() == []
    f = svc.files[0]
    assert [f.slot_value(s) for s in range(slot_num)] == [0] * slot_num
    assert f.entry_count == 0 and svc.query("T", "k", 10, 0, FAR_FUTURE_MS) == []
    svc.build_index(_req(0, T0_MS, keys="k"))
    assert f.read_entry(1).prev_index_no == 0
    svc.close()


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32), index_count=st.integers(-5, 40), keep_header=st.booleans())
def test_random_bytes_never_crash_or_hang(
    tmp_path_factory: pytest.TempPathFactory, seed: int, index_count: int, keep_header: bool
) -> None:
    rng = random.Random(seed)
    path = tmp_path_factory.mktemp("fuzz") / "20240101000000000"
    size = index_file_size_bytes(**SMALL)
    data = bytearray(rng.randbytes(size))
    if keep_header:
        data[:40] = HEADER.pack(T0_MS, T0_MS + 5000, 0, 100, 3, index_count)
    path.write_bytes(bytes(data))
    try:
        f = IndexFile(path, 16, 32)
    except ValueError as exc:
        assert "corrupt header" in str(exc)
        return
    try:
        keys = [f"T#k{i}" for i in range(20)] + [rng.randrange(2**31) for _ in range(20)]
        for key in keys:
            got = f.select(key, 1000, -(2**62), 2**62)
            assert len(got) <= 31 and len(set(got)) == len(got)
            assert all(phy >= 0 for phy in got)
        if not f.is_full:
            f.put_key("T#k0", 1, T0_MS)
            assert f.read_entry(f.index_count - 1).prev_index_no < f.index_count - 1
        assert len(list(f.entries())) == f.entry_count
        f.repair_torn_slots()
    finally:
        f.close()
    svc = IndexService(path.parent, clock=ManualClock(T0_MS), **SMALL)
    svc.load()
    svc.query("T", "k1", 100, 0, FAR_FUTURE_MS)
    svc.close()


# --- truncation (recovery cut the commitlog) ------------------------------------------------


def test_truncate_drops_entries_past_the_cut_and_resumes_indexing(service: IndexService) -> None:
    for i in range(6):
        service.build_index(_req(i * 100, T0_MS + i * 1000, keys=f"k{i % 3}"))
    assert service.truncate(300) == 3
    assert service.max_indexed_offset == 200
    assert service.query("T", "k0", 10, 0, FAR_FUTURE_MS) == [0]
    assert service.query("T", "k1", 10, 0, FAR_FUTURE_MS) == [100]
    # the records written in place of the cut ones are indexed, and chains stay sound
    service.build_index(_req(300, T0_MS + 9000, keys="k0"))
    assert service.query("T", "k0", 10, 0, FAR_FUTURE_MS) == [300, 0]
    assert service.files[0].entry_count == 4


def test_truncate_deletes_files_wholly_past_the_cut(service: IndexService) -> None:
    n = SMALL["index_num"] + 5  # rolls into a second file
    for i in range(n):
        service.build_index(_req(i * 10, T0_MS, keys=f"k{i}"))
    assert len(service.files) == 2
    first_of_second = service.files[1].read_entry(1).phy_offset
    service.truncate(first_of_second)
    assert len(service.files) == 1
    assert service.query("T", f"k{n - 1}", 10, 0, FAR_FUTURE_MS) == []


# --- keys are queued and written in bulk ----------------------------------------------------


def test_keys_wait_in_the_queue_until_it_fills_or_a_reader_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_service, "PENDING_KEYS_MAX", 4)
    svc = IndexService(tmp_path / "index", clock=ManualClock(T0_MS), **SMALL)
    for i in range(3):
        svc.build_index(_req(i * 100, T0_MS, keys=f"k{i}"))
    assert not (tmp_path / "index").exists()  # queued: no file written yet

    svc.build_index(_req(300, T0_MS, keys="k3"))  # the fourth key fills the queue
    (written,) = (tmp_path / "index").iterdir()
    reader = IndexFile(written, SMALL["slot_num"], SMALL["index_num"], readonly=True)
    assert reader.entry_count == 4 and reader.end_phy_offset == 300

    svc.build_index(_req(400, T0_MS, keys="k1"))  # queued again
    assert svc.query("T", "k1", 10, 0, FAR_FUTURE_MS) == [400, 100]  # a query writes it first
    svc.build_index(_req(400, T0_MS, keys="k1"))  # a re-dispatch of the record at the end
    svc.build_index(_req(300, T0_MS, keys="k3"))  # below it: already indexed, skipped
    assert svc.max_indexed_offset == 400
    assert sum(f.entry_count for f in svc.files) == 6
    svc.close()


def test_a_full_volume_keeps_the_queue_for_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = IndexService(tmp_path / "index", clock=ManualClock(T0_MS), slot_num=8, index_num=3)
    svc.build_index(_req(0, T0_MS, keys="a b"))
    svc.drain()  # the first file is full: the next key needs a new one
    svc.build_index(_req(100, T0_MS, keys="c d e"))

    def no_room() -> None:
        raise DiskFullError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(svc, "_new_file_name", no_room)
    with pytest.raises(DiskFullError):
        svc.drain()
    assert len(list((tmp_path / "index").iterdir())) == 1
    svc.truncate(PhysicalOffset(200))  # undoing a later write keeps what came before it
    monkeypatch.undo()
    assert svc.query("T", "e", 10, 0, FAR_FUTURE_MS) == [100]
    assert [f.entry_count for f in svc.files] == [2, 2, 1]
    svc.close()
