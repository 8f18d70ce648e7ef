"""Store primitives for replication (issue 7): a master store copied into a slave store.

The master takes random batches (small commitlog files, so BLANK fillers and file roll-over
happen; transactional PREPARED / ROLLBACK records that get no queue unit; keys and unique ids for
the index; IPv6 born hosts). The slave is fed with ``read_replica`` / ``append_replica`` in
random chunk sizes that end mid-record. Both must then hold byte-identical commitlogs, the same
consume-queue units, queue offsets and key-query answers, through truncations, corrupt bytes,
clean restarts and crashes in the middle.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq import codec
from rocketq.java_hash import index_key_hash
from rocketq.validation import TRANS_HALF_TOPIC
from services.common.clock import ManualClock
from services.store import replica
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.message_store import (
    GetStatus,
    MessageStore,
    ReplicaCorruptError,
    ReplicaRangeError,
    StoreError,
)
from services.store.recovery import scan
from services.store.types import DispatchRequest, DispatchRun

pytestmark = pytest.mark.unit

CL_FILE_BYTES = 16 * 1024
CQ_UNITS = 40
TOPICS = ("TopicA", "TopicB", "TopicC")
SysFlag = codec.SysFlag
V6_HOST = codec.HostAddress(b"\x20\x01" + bytes(13) + b"\x07", 4321)


class Pair:
    """A master and a slave store on one manual clock."""

    def __init__(self, root: Path, *, seed: int = 0) -> None:
        self.root = root
        self.clock = ManualClock()
        self.rng = random.Random(seed)
        self.opened: list[MessageStore] = []
        self.master = self.open("master")
        self.slave = self.open("slave")
        self.seq = 0
        self.keys: list[str] = []
        self.plain = False
        """Only IPv4 hosts, non-empty bodies and no transactions: the records numpy reads in
        one gather."""
        self.uniform = False
        """Producer batches: every record's properties the same but for its UNIQ_KEY (read
        once for a chunk), every batch of one queue (a run dispatched as columns)."""
        self.body_bytes: int | None = None
        """One body length for every message: with ``uniform``, records all of one size (the
        numpy read's guess that every record has the first one's size holds)."""
        self.batch_keys = "k1 k2"
        """With ``uniform``: the KEYS of every message ("": none, so a slave hashes the index
        keys of a chunk of one topic from its bytes)."""
        self.topics = TOPICS

    def config(self, name: str) -> StoreConfig:
        return StoreConfig(
            store_dir=self.root / name,
            commitlog_file_bytes=CL_FILE_BYTES,
            consume_queue_units_per_file=CQ_UNITS,
            index_slot_num=64,
            index_num=512,
            slave=name != "master",
        )

    def open(self, name: str) -> MessageStore:
        store = MessageStore(self.config(name), clock=self.clock, disk_usage=lambda _p: 0.1)
        store.open()
        self.opened.append(store)
        return store

    async def restart_slave(self, *, crash: bool = False) -> None:
        """Clean shutdown (or kill -9: files unmapped, ``abort`` left) and reopen."""
        if crash:
            self.slave.close_files()
        else:
            await self.slave.shutdown()
        self.slave = self.open("slave")

    # -- master writes ---------------------------------------------------------------------
    def message(self, queue: tuple[str, int] | None = None) -> MessageToStore:
        rng = self.rng
        self.seq += 1
        props: dict[str, str] = {codec.Prop.UNIQ_KEY: f"U{self.seq:06d}"}
        tags = rng.choice(["", "TagA", "TagB", "x||y"])
        if tags:
            props[codec.Prop.TAGS] = tags
        keys = " ".join(f"k{rng.randrange(50)}" for _ in range(rng.randrange(3)))
        if keys:
            props[codec.Prop.KEYS] = keys
            self.keys.extend(keys.split(" "))
        if rng.random() < 0.3:
            props["userProp"] = "v" * rng.randrange(40)
        if self.uniform:  # a producer's batch: one tag and key set, a unique id each
            tags, keys = "TagA", self.batch_keys
            props = {codec.Prop.TAGS: tags, codec.Prop.UNIQ_KEY: f"U{self.seq:06d}"}
            if keys:
                props[codec.Prop.KEYS] = keys
        topic, sys_flag, prepared = rng.choice(self.topics), 0, 0
        kind = 1.0 if self.plain else rng.random()  # plain: no transactions
        if kind < 0.1:
            topic, sys_flag = TRANS_HALF_TOPIC, SysFlag.TRANSACTION_PREPARED
        elif kind < 0.15:
            sys_flag, prepared = SysFlag.TRANSACTION_ROLLBACK, rng.randrange(1, 1 << 20)
        elif kind < 0.2:
            sys_flag, prepared = SysFlag.TRANSACTION_COMMIT, rng.randrange(1, 1 << 20)
        queue_id = rng.randrange(4)
        if queue is not None:
            topic, queue_id = queue
        return MessageToStore(
            topic=topic,
            queue_id=queue_id,
            body=rng.randbytes(
                self.body_bytes or rng.choice([0, 1, 10, 200, 200, 700, 1500][self.plain :])
            ),
            properties=codec.encode_properties(props),
            tags_code=codec.tags_hash(tags),
            keys=keys,
            uniq_key=props[codec.Prop.UNIQ_KEY],
            sys_flag=sys_flag,
            born_host=V6_HOST if rng.random() < 0.2 and not self.plain else codec.LOCALHOST,
            prepared_transaction_offset=prepared,
        )

    def write(self, batches: int) -> None:
        rng = self.rng
        for _ in range(batches):
            queue = (rng.choice(self.topics), rng.randrange(4)) if self.uniform else None
            self.master.append([self.message(queue) for _ in range(rng.randint(1, 12))])
            self.clock.advance_ms(self.rng.randrange(3))

    # -- replication -----------------------------------------------------------------------
    def copy(self, max_chunk: int = 300 * 1024, *, until: int | None = None) -> int:
        """Stream master -> slave in random chunk sizes; returns the chunks sent."""
        chunks = 0
        end = self.master.commitlog.max_offset if until is None else until
        while (at := self.slave.commitlog.max_offset) < end:
            size = min(self.rng.randint(1, max_chunk), end - at)
            data = self.master.read_replica(at, size)
            assert data, f"nothing to read at {at} below {end}"
            assert self.slave.append_replica(at, data) == at + len(data)
            chunks += 1
        return chunks

    def boundaries(self) -> list[int]:
        """Start offsets of every record and BLANK on the master."""
        problems: list[str] = []
        out = [item.offset for item in scan(self.master.commitlog, 0, problems)]
        assert not problems
        return out

    # -- checks ----------------------------------------------------------------------------
    def assert_identical(self, upto: int | None = None) -> None:
        m, s = self.master, self.slave
        end = m.commitlog.max_offset if upto is None else upto
        assert s.commitlog.max_offset == end
        assert s.replica_dispatched_offset == end
        assert commitlog_bytes(s, end) == commitlog_bytes(m, end)
        whole = upto is None
        for key, mq in m.queues.queues.items():
            m_units = [u for u in mq.iter_units() if u[1] + u[2] <= end]
            sq = s.queues.find(*key)
            s_units = list(sq.iter_units()) if sq else []
            assert s_units == m_units, key
            if whole:
                assert s.max_offset(*key) == m.max_offset(*key)
                assert s.commitlog.queue_offsets.get(key, 0) == m.commitlog.queue_offsets[key]
        for key, sq in s.queues.queues.items():
            assert key in m.queues.queues or sq.max_offset == 0, key
        uniqs = [f"U{seq:06d}" for seq in range(1, self.seq + 1, max(1, self.seq // 12))]
        for business_key in sorted(set(self.keys))[:12] + uniqs:
            for topic in TOPICS:
                got = s.query_by_key(topic, business_key, 64, 0, 1 << 62)
                want = m.query_by_key(topic, business_key, 64, 0, 1 << 62)
                assert [r.physical_offset for r in got] == [
                    r.physical_offset for r in want if r.physical_offset + r.total_size <= end
                ], (topic, business_key)


def commitlog_bytes(store: MessageStore, end: int) -> bytes:
    return b"".join(
        bytes(mf.view[: min(mf.file_size_bytes, end - mf.file_from_offset)])
        for mf in store.commitlog.files
        if mf.file_from_offset < end
    )


@pytest.fixture
def make_pair(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(seed: int = 0) -> Pair:
        pair = Pair(tmp_path / f"pair{len(made)}", seed=seed)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        for store in pair.opened:
            store.close_files()


# ---- copying -----------------------------------------------------------------------------------
@pytest.mark.parametrize("max_chunk", [1, 37, 1000, 300 * 1024])
def test_random_chunks_make_identical_stores(
    make_pair: Callable[..., Pair], max_chunk: int
) -> None:
    pair = make_pair(seed=max_chunk)
    seen: dict[str, list[DispatchRequest]] = {"master": [], "slave": []}
    pair.master.dispatcher.listeners.append(seen["master"].extend)
    pair.slave.dispatcher.listeners.append(seen["slave"].extend)
    pair.write(60 if max_chunk > 1 else 15)
    assert len(pair.master.commitlog.files.files) >= 3 or max_chunk == 1  # roll-over happened
    pair.copy(max_chunk)
    pair.assert_identical()
    pair.write(20)  # and it goes on from there
    pair.copy(max_chunk)
    pair.assert_identical()
    # Arrival listeners (held pulls) see exactly what the master's saw, field by field.
    assert seen["slave"] == seen["master"]
    assert any(r.keys for r in seen["slave"])
    assert any(r.sys_flag & SysFlag.TRANSACTION_MASK for r in seen["slave"])


@pytest.mark.parametrize("max_chunk", [4000, 300 * 1024])
def test_a_slave_indexes_the_ids_of_producer_batches_from_their_bytes(
    make_pair: Callable[..., Pair], max_chunk: int
) -> None:
    # Batches of one topic with no KEYS: the slave's batch reader hands the index the hashes of
    # topic#UNIQ_KEY, computed from the records' bytes; its index answers as the master's does.
    pair = make_pair(seed=11)
    pair.plain = pair.uniform = True
    pair.batch_keys, pair.topics = "", TOPICS[:1]
    hashed: list[int] = []
    index = pair.slave.dispatcher.index
    assert index is not None
    build_run = index.build_index_run

    def spy(run: DispatchRun) -> None:
        if run.index_hashes is not None:
            hashed.extend(run.index_hashes.tolist())
            assert run.index_hashes.tolist() == [
                index_key_hash(f"{run.topic}#{uniq}") for uniq in run.uniq_keys
            ]
        build_run(run)

    index.build_index_run = spy  # type: ignore[method-assign]
    pair.write(60)
    pair.copy(max_chunk)
    pair.assert_identical()
    # Most records took the hashed path; in small chunks fewer (a chunk of a few records is
    # read record by record, and the index hashes those keys as strings).
    assert len(hashed) > (pair.seq // 2 if max_chunk > 100_000 else 0)


def test_fixed_width_strings_cut_their_text_only_when_read() -> None:
    ids = replica.FixedWidthStrings("aaabbbcccddd", 3, 4)
    assert list(ids) == ["aaa", "bbb", "ccc", "ddd"] and len(ids) == 4
    assert (ids[0], ids[-1]) == ("aaa", "ddd")
    middle = ids[1:3]
    assert list(middle) == ["bbb", "ccc"] and middle[-1] == "ccc"
    assert list(ids[::2]) == ["aaa", "ccc"] and list(ids[5:]) == []
    with pytest.raises(IndexError):
        middle[2]
    assert list(replica.FixedWidthStrings("", 0, 3)) == ["", "", ""]


def test_chunks_end_inside_records_and_wait_for_the_rest(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair()
    pair.write(5)
    first_end = pair.boundaries()[1]
    data = pair.master.read_replica(0, first_end + 50)
    assert pair.slave.append_replica(0, data[:30]) == 30  # inside the first header
    assert pair.slave.replica_dispatched_offset == 0
    assert pair.slave.get_messages(TOPICS[0], 0, 0, 32).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert pair.slave.append_replica(30, data[30:]) == len(data)
    assert pair.slave.replica_dispatched_offset == first_end
    pair.copy()
    pair.assert_identical()


def test_read_replica_never_crosses_a_file_end_and_stops_at_the_max(
    make_pair: Callable[..., Pair],
) -> None:
    pair = make_pair()
    pair.write(40)
    m = pair.master
    assert len(m.read_replica(CL_FILE_BYTES - 10, 1 << 20)) == 10
    assert m.read_replica(m.commitlog.max_offset, 100) == b""
    with pytest.raises(ReplicaRangeError):
        m.read_replica(m.commitlog.max_offset + 1, 100)
    m.commitlog.files.delete_first(1)  # retention
    with pytest.raises(ReplicaRangeError):
        m.read_replica(CL_FILE_BYTES - 1, 100)
    assert m.read_replica(CL_FILE_BYTES, 8)[4:8] == codec.MESSAGE_MAGIC.to_bytes(4, "big")


def test_a_chunk_at_the_wrong_offset_is_refused(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair()
    pair.write(3)
    data = pair.master.read_replica(0, 100)
    pair.slave.append_replica(0, data)
    with pytest.raises(ValueError, match="ends at 100"):
        pair.slave.append_replica(99, pair.master.read_replica(99, 10))
    with pytest.raises(ValueError):
        pair.slave.append_replica(101, pair.master.read_replica(101, 10))
    # A new stream restarting at the last whole record (0 here) drops the partial tail.
    pair.slave.append_replica(0, pair.master.read_replica(0, 10))
    pair.copy()
    pair.assert_identical()


# ---- truncation --------------------------------------------------------------------------------
def test_truncate_to_random_boundaries_and_copy_again(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(seed=7)
    pair.write(80)
    pair.copy()
    bounds = pair.boundaries()
    for _ in range(6):
        cut = pair.rng.choice(bounds)
        pair.slave.truncate_replica(cut)
        pair.assert_identical(upto=cut)
        if pair.rng.random() < 0.5:  # copy part of the way back, then cut again
            pair.copy(5000, until=pair.rng.choice([b for b in bounds if b >= cut]))
        pair.copy(pair.rng.choice([1000, 300 * 1024]))
        pair.assert_identical()


def test_truncate_to_zero_empties_every_queue(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair()
    pair.write(30)
    pair.copy()
    pair.slave.truncate_replica(0)
    assert pair.slave.commitlog.max_offset == 0
    assert all(pair.slave.max_offset(t, q) == 0 for t in TOPICS for q in range(4))
    assert pair.slave.query_by_key(TOPICS[0], pair.keys[0], 10, 0, 1 << 62) == []
    pair.copy()
    pair.assert_identical()


def test_truncate_inside_the_partial_tail_and_out_of_range(
    make_pair: Callable[..., Pair],
) -> None:
    pair = make_pair()
    pair.write(5)
    second = pair.boundaries()[1]
    pair.slave.append_replica(0, pair.master.read_replica(0, second + 40))
    pair.slave.truncate_replica(second + 20)  # keeps 20 bytes of the partial record
    assert pair.slave.commitlog.max_offset == second + 20
    assert pair.slave.replica_dispatched_offset == second
    with pytest.raises(ReplicaRangeError):
        pair.slave.truncate_replica(second + 21)
    pair.copy()
    pair.assert_identical()


def test_truncate_at_the_oldest_retained_file_keeps_the_position(
    make_pair: Callable[..., Pair],
) -> None:
    pair = make_pair()
    pair.write(60)
    pair.copy()
    s = pair.slave
    s.commitlog.files.delete_first(2)  # retention on the slave
    oldest = s.commitlog.min_offset
    with pytest.raises(ReplicaRangeError):
        s.truncate_replica(oldest - 1)
    s.truncate_replica(oldest)
    assert s.commitlog.max_offset == s.commitlog.min_offset == oldest
    pair.copy()
    end = pair.master.commitlog.max_offset
    assert commitlog_bytes(s, end) == commitlog_bytes(pair.master, end)[oldest:]


# ---- corruption --------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["body", "size", "magic", "physical_offset", "blank"])
def test_corrupt_bytes_are_refused_and_the_slave_stays_consistent(
    make_pair: Callable[..., Pair], where: str
) -> None:
    pair = make_pair(seed=3)
    pair.write(40)
    bounds = pair.boundaries()
    m = pair.master
    if where == "blank":
        bad_at = next(b for b in bounds if _is_blank(m, b))
    else:
        bad_at = next(b for b in bounds[5:] if not _is_blank(m, b) and _has_body(m, b))
    start = bounds[bounds.index(bad_at) - 3]
    pair.copy(until=start)
    data = bytearray(m.read_replica(start, 1 << 20))
    rel = bad_at - start
    if where == "body":
        flip = rel + _body_pos(m, bad_at)
    else:
        flip = rel + {"size": 2, "magic": 5, "physical_offset": 35, "blank": 3}[where]
    data[flip] ^= 0x10
    with pytest.raises(ReplicaCorruptError):
        pair.slave.append_replica(start, bytes(data))
    assert pair.slave.commitlog.max_offset == bad_at
    pair.assert_identical(upto=bad_at)
    pair.copy()  # the slave reconnects from its end
    pair.assert_identical()


def _magic(value: int) -> bytes:
    return value.to_bytes(4, "big")


def _is_blank(store: MessageStore, offset: int) -> bool:
    head = store.commitlog.read(offset, 8)
    assert head is not None
    return bytes(head[4:8]) == _magic(codec.BLANK_MAGIC)


def _has_body(store: MessageStore, offset: int) -> bool:
    rec = store.read_record(offset)
    return rec is not None and len(rec.body) > 0


def _body_pos(store: MessageStore, offset: int) -> int:
    rec = store.read_record(offset)
    assert rec is not None
    fixed = codec.FIXED_BYTES_V4 + (12 if rec.sys_flag & SysFlag.BORNHOST_V6 else 0)
    assert rec.body, "pick a record with a body"
    return fixed + 4


def test_a_corrupt_partial_tail_is_caught_when_it_completes(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(seed=5)
    pair.write(10)
    bounds = pair.boundaries()
    rec_at, rec_end = bounds[3], bounds[4]
    pair.copy(until=rec_at + 10)
    rest = bytearray(pair.master.read_replica(rec_at + 10, rec_end - rec_at))
    rest[-1] ^= 0xFF  # the last properties byte or body byte: a length or the CRC no longer fits
    rest[rec_end - rec_at - 10 - 30] ^= 0xFF
    with pytest.raises(ReplicaCorruptError):
        pair.slave.append_replica(rec_at + 10, bytes(rest))
    assert pair.slave.commitlog.max_offset == rec_at
    pair.copy()
    pair.assert_identical()


# ---- restarts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("crash", [False, True])
async def test_slave_restart_with_a_partial_record_loses_nothing(
    make_pair: Callable[..., Pair], crash: bool
) -> None:
    pair = make_pair(seed=11)
    pair.write(50)
    bounds = pair.boundaries()
    for _ in range(4):
        # Stop inside a record's properties: the bytes that could pass a CRC check if cut.
        rec_at = pair.rng.choice(bounds[len(bounds) // 4 :])
        rec = pair.master.read_record(rec_at)
        if rec is None or rec_at < pair.slave.commitlog.max_offset:
            continue
        pair.copy(7000, until=rec_at + rec.total_size - 2)
        await pair.restart_slave(crash=crash)
        assert pair.slave.commitlog.max_offset == rec_at  # the partial record is gone
        pair.assert_identical(upto=rec_at)
    pair.copy()
    await pair.restart_slave(crash=crash)
    pair.assert_identical()


async def test_a_slave_store_starts_with_no_epoch_and_a_master_with_epoch_zero(
    make_pair: Callable[..., Pair],
) -> None:
    pair = make_pair()
    assert pair.slave.epochs.entries == []
    assert [tuple(e) for e in pair.master.epochs.entries] == [(0, 0)]
    pair.write(5)
    pair.copy()
    await pair.restart_slave()
    assert pair.slave.epochs.entries == []


def test_a_damaged_epoch_file_refuses_to_open(tmp_path: Path) -> None:
    config = StoreConfig(store_dir=tmp_path / "s", commitlog_file_bytes=CL_FILE_BYTES)
    config.store_dir.mkdir()
    (config.store_dir / "epoch").write_text("0 0\nbanana\n")
    with pytest.raises(StoreError, match="banana"):
        MessageStore(config, disk_usage=lambda _p: 0.1).open()
    (config.store_dir / "epoch").write_text("3 100\n")
    store = MessageStore(config, disk_usage=lambda _p: 0.1)  # the lock was released
    store.open()
    assert store.epochs.last_epoch == 3
    store.close_files()


# ---- confirm offset ----------------------------------------------------------------------------
def test_confirm_offset_bounds_reads(make_pair: Callable[..., Pair]) -> None:
    m = make_pair().master
    results = m.append([MessageToStore("C", 0, f"b{i}".encode(), b"") for i in range(6)])
    m.set_confirm_offset(results[2].physical_offset + results[2].size_bytes + 5)
    got = m.get_messages("C", 0, 0, 32)
    assert got.status is GetStatus.FOUND
    assert [codec.decode_record(r).body for r in got.records] == [b"b0", b"b1", b"b2"]
    assert got.next_begin_offset == 3
    assert got.max_offset == m.max_offset("C", 0) == 6  # max offsets stay truthful
    at_bound = m.get_messages("C", 0, 3, 32)
    assert at_bound.status is GetStatus.OFFSET_OVERFLOW_ONE  # as if the queue ended: held
    assert at_bound.next_begin_offset == 3
    assert at_bound.records == []
    m.set_confirm_offset(results[4].physical_offset + results[4].size_bytes)
    assert m.get_messages("C", 0, 3, 32).queue_offsets == [3, 4]
    m.set_confirm_offset(None)
    assert m.get_messages("C", 0, 3, 32).queue_offsets == [3, 4, 5]


def test_confirm_offset_stops_after_filtered_units_without_skipping_unconfirmed_ones(
    make_pair: Callable[..., Pair],
) -> None:
    pair = make_pair()
    m = pair.master
    msgs = [MessageToStore("T", 0, b"x", b"", tags_code=i) for i in range(5)]
    results = m.append(msgs)
    m.set_confirm_offset(results[2].physical_offset + results[2].size_bytes)
    got = m.get_messages("T", 0, 0, 32, tags_filter=lambda code: code == 4)
    assert got.status is GetStatus.NO_MATCHED_MESSAGE
    assert got.next_begin_offset == 3  # past the filtered confirmed units, not past 3 and 4
    m.set_confirm_offset(results[4].physical_offset + results[4].size_bytes)
    got = m.get_messages("T", 0, 3, 32, tags_filter=lambda code: code == 4)
    assert got.queue_offsets == [4]


def test_confirm_listeners_fire_once_per_advance(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair()
    m = pair.master
    pair.write(3)
    seen: list[int] = []
    m.confirm_listeners.append(seen.append)
    m.set_confirm_offset(100)  # from unbounded to a bound: nothing new to read
    m.set_confirm_offset(200)
    m.set_confirm_offset(200)
    m.set_confirm_offset(150)  # back (a slave re-bounding): not an advance
    m.set_confirm_offset(300)
    m.set_confirm_offset(None)  # unbounded: everything is readable
    m.set_confirm_offset(None)
    assert seen == [200, 300, m.commitlog.max_offset]
    assert m.confirm_offset is None


# ---- property-based ----------------------------------------------------------------------------
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["write", "copy", "truncate", "restart", "crash"]),
            st.integers(1, 300 * 1024),
        ),
        min_size=1,
        max_size=10,
    ),
)
async def test_any_interleaving_ends_identical(
    make_pair: Callable[..., Pair], seed: int, steps: list[tuple[str, int]]
) -> None:
    pair = make_pair(seed=seed)
    for action, n in steps:
        if action == "write":
            pair.write(1 + n % 25)
        elif action == "copy":
            mx = pair.master.commitlog.max_offset
            pair.copy(n, until=min(mx, pair.slave.commitlog.max_offset + n * 3))
        elif action == "truncate":
            whole = pair.slave.replica_dispatched_offset
            cut = max((b for b in pair.boundaries() if b <= whole), default=0)
            if n % 2:  # somewhere back, at a record boundary
                cut = pair.rng.choice([b for b in pair.boundaries() if b <= whole] or [0])
            pair.slave.truncate_replica(cut)
            pair.assert_identical(upto=cut)
        else:
            await pair.restart_slave(crash=action == "crash")
    pair.copy()
    pair.assert_identical()


_FIELDS = ("size", "magic", "crc", "queue_id", "queue_offset", "physical_offset", "sys_flag",
           "body_length", "body", "topic_length", "topic", "properties_length", "properties",
           "last")  # fmt: skip


def _field_at(store: MessageStore, offset: int, name: str) -> int:
    """Where field ``name`` of the record at ``offset`` lies, from the record's start (the
    last byte of a multi-byte number, so that a low bit flips)."""
    raw = store.commitlog.read(offset, 8)
    assert raw is not None
    total = int.from_bytes(raw[:4], "big")
    rec = bytes(store.commitlog.read(offset, total) or b"")
    sys_flag = int.from_bytes(rec[36:40], "big")
    body_at, body_end, topic_at, _topic_end, props_at = codec.record_spans(rec, 0, total, sys_flag)
    return {
        "size": 3, "magic": 7, "crc": 11, "queue_id": 15, "queue_offset": 27,
        "physical_offset": 35, "sys_flag": 39,
        "body_length": body_at - 1, "body": body_at, "topic_length": body_end,
        "topic": topic_at, "properties_length": props_at - 1, "properties": props_at,
        "last": total - 1,
    }[name]  # fmt: skip


def _decoded(
    data: bytes, at: int, file_bytes: int, *, fast: bool
) -> tuple[int, list[DispatchRequest], str | None]:
    """decode_chunk of ``data`` with the numpy read where it applies, or record by record."""
    topics = {t.encode(): t for t in (*TOPICS, TRANS_HALF_TOPIC)}  # as if seen before
    fast_min = replica.FAST_RECORDS_MIN if fast else 1 << 30
    with mock.patch.object(replica, "FAST_RECORDS_MIN", fast_min):
        got = replica.decode_chunk(data, at, file_bytes, topics, replica.TagCodes())
    return got.good, got.all_requests(), got.problem


@pytest.mark.parametrize("lengths", [[40] * 2, [40] * 7, [40] * 8, [40, 41, 40]])
def test_bodies_of_one_length_are_checked_against_their_crcs_together(lengths: list[int]) -> None:
    # A slave folds the bodies of one length into one CRC (a CRC-32 is linear but for a
    # constant of the length, which an even count leaves in); other lengths are checked one
    # by one. Either way, every changed byte of any body, and every changed CRC, is caught.
    rng = random.Random(len(lengths) * 100 + lengths[-1])
    gap = 5  # bytes between bodies, as a record's other fields lie between them
    bodies = [rng.randbytes(n) for n in lengths]
    buf = bytearray(b"".join(bytes(gap) + body for body in bodies))
    starts = [gap + sum(lengths[:i]) + gap * i for i in range(len(lengths))]
    body_at, body_len = np.array(starts, np.int64), np.array(lengths, np.int64)
    crcs = np.array([codec.crc32(body) & 0x7FFFFFFF for body in bodies], np.int64)

    assert replica._crcs_hold(bytes(buf), body_at, body_len, crcs)
    for rec, at in enumerate(starts):
        for pos in range(at, at + lengths[rec], 7):
            buf[pos] ^= 1 << (pos % 8)
            assert not replica._crcs_hold(bytes(buf), body_at, body_len, crcs), (rec, pos)
            buf[pos] ^= 1 << (pos % 8)
        wrong = crcs.copy()
        wrong[rec] ^= 1 << (rec % 31)
        assert not replica._crcs_hold(bytes(buf), body_at, body_len, wrong), rec


@pytest.mark.parametrize("body_bytes", [None, 200], ids=["sizes vary", "one size"])
@pytest.mark.parametrize("name", _FIELDS)
def test_a_bad_field_inside_a_producer_batch_decodes_as_record_by_record(
    make_pair: Callable[..., Pair], name: str, body_bytes: int | None
) -> None:
    # Runs of one queue are dispatched as columns: a record in the middle of one whose field
    # differs (a jump in queue offsets, another queue, a bad CRC...) must give what the
    # record-by-record read gives, never be taken for one more record of the run. With
    # records of one size, a bad size or magic also stops the guess that all share the first
    # record's size, halfway.
    for seed in range(4):
        pair = make_pair(seed=seed)
        pair.plain = pair.uniform = True
        pair.body_bytes = body_bytes
        pair.write(30)
        m = pair.master
        buf = bytearray(m.read_replica(0, 64 * 1024))
        records = [b for b in pair.boundaries() if b < len(buf) and not _is_blank(m, b)]
        rec = records[len(records) // 2]
        buf[rec + _field_at(m, rec, name)] ^= 1
        file_bytes = m.commitlog.file_size_bytes
        fast = _decoded(bytes(buf), 0, file_bytes, fast=True)
        assert fast == _decoded(bytes(buf), 0, file_bytes, fast=False)


@pytest.mark.parametrize("body_bytes", [None, 200], ids=["sizes vary", "one size"])
def test_the_numpy_read_takes_every_whole_record_of_producer_batches(
    make_pair: Callable[..., Pair], body_bytes: int | None
) -> None:
    # Records of one size are read through strided views of the chunk, others by gathers;
    # both must take every whole record (not decline and leave them to the slow path) and
    # give what the record-by-record read gives.
    pair = make_pair(seed=7)
    pair.plain = pair.uniform = True
    pair.body_bytes = body_bytes
    pair.write(40)
    m = pair.master
    file_bytes = m.commitlog.file_size_bytes
    bounds = pair.boundaries()
    record_end = dict(zip(bounds, [*bounds[1:], m.commitlog.max_offset], strict=True))
    for at in bounds[:: max(1, len(bounds) // 8)]:
        data = m.read_replica(at, file_bytes)  # up to the file's end: records, then a BLANK
        topics = {t.encode(): t for t in TOPICS}
        fast = replica._decode_fast(data, at, file_bytes, topics, replica.TagCodes())
        whole = [b for b in bounds if at <= b < at + len(data) and not _is_blank(m, b)]
        if len(whole) < replica.FAST_RECORDS_MIN:
            continue
        assert fast is not None, at
        end, runs = fast
        assert sum(len(run.physical_offsets) for run in runs) == len(whole)
        assert at + end == record_end[whole[-1]]
        assert _decoded(data, at, file_bytes, fast=True) == _decoded(
            data, at, file_bytes, fast=False
        )


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    start=st.integers(0, 1 << 20),
    size=st.integers(1, 64 * 1024),
    flip=st.one_of(
        st.none(),
        st.tuples(st.integers(0, 1 << 20), st.sampled_from(_FIELDS), st.integers(0, 7)),
        st.tuples(st.integers(0, 1 << 20), st.sampled_from(_FIELDS), st.integers(0, 7)),
    ),
    kind=st.sampled_from(["plain", "uniform", "uniform", "one size", "mixed"]),
)
def test_chunks_decode_alike_with_and_without_the_numpy_header_read(
    make_pair: Callable[..., Pair],
    seed: int,
    start: int,
    size: int,
    flip: tuple[int, str, int] | None,
    kind: str,
) -> None:
    pair = make_pair(seed=seed)
    pair.plain = kind != "mixed"
    pair.uniform = kind in ("uniform", "one size")
    pair.body_bytes = 300 if kind == "one size" else None
    pair.write(30)
    m = pair.master
    bounds = pair.boundaries()
    at = bounds[start % len(bounds)]
    buf = bytearray(m.read_replica(at, size))
    records = [b - at for b in bounds if at <= b < at + len(buf) and not _is_blank(m, b)]
    if flip is not None and records:  # one bit of one field of one record
        pick, name, bit = flip
        rec = records[pick % len(records)]
        buf[min(len(buf) - 1, rec + _field_at(m, at + rec, name))] ^= 1 << bit
    data = bytes(buf)
    file_bytes = m.commitlog.file_size_bytes

    assert _decoded(data, at, file_bytes, fast=True) == _decoded(data, at, file_bytes, fast=False)
    if pair.plain and flip is None:
        # The numpy read took every whole record of a plain chunk of enough records.
        ends = [*bounds[1:], m.commitlog.max_offset]
        whole = 0
        for b, end in zip(bounds, ends, strict=True):
            if b < at:
                continue
            if end > at + len(data) or _is_blank(m, b):
                break
            whole += 1
        topics = {t.encode(): t for t in (*TOPICS, TRANS_HALF_TOPIC)}
        fast = replica._decode_fast(data, at, file_bytes, topics, replica.TagCodes())
        assert (fast is not None) == (whole >= replica.FAST_RECORDS_MIN), whole
