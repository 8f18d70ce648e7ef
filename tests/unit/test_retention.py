"""Retention by age and disk pressure (SPEC §4.11), with a manual clock and a fake disk."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq import codec
from services.common.clock import ManualClock
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.mapped_file import MappedFile
from services.store.message_store import GetStatus, MessageStore, StoreFullError

pytestmark = pytest.mark.unit

HOUR_MS = 3600 * 1000
CL_FILE_BYTES = 4096


def _local_ms(hour: int, day: int = 10) -> int:
    """A wall-clock instant at ``hour``:30 local time (retention reads deleteWhen locally)."""
    return int(time.mktime((2024, 1, day, hour, 30, 0, 0, 0, -1))) * 1000


class FakeDisk:
    """Disk use as a settable fraction; records every path it was asked about."""

    def __init__(self, ratio: float = 0.1) -> None:
        self.ratio = ratio
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> float:
        self.paths.append(path)
        return self.ratio


class Env:
    def __init__(self, root: Path, **config: object) -> None:
        fields: dict[str, object] = {
            "commitlog_file_bytes": CL_FILE_BYTES,
            "consume_queue_units_per_file": 8,
            "index_slot_num": 16,
            "index_num": 16,
        }
        fields.update(config)
        self.config = StoreConfig(store_dir=root / "store", **fields)  # type: ignore[arg-type]
        self.clock = ManualClock(_local_ms(13))
        self.disk = FakeDisk()
        self.store = MessageStore(
            self.config, clock=self.clock, disk_usage=self.disk, memory_bytes=1 << 34
        )
        self.store.open()
        self.sent = 0

    def send(self, n: int, topic: str = "T") -> None:
        for _ in range(n):
            body = f"message-{self.sent}".encode() * 10
            props = codec.encode_properties({codec.Prop.KEYS: f"k{self.sent}"})
            self.store.append([MessageToStore(topic, 0, body, props, keys=f"k{self.sent}")])
            self.sent += 1

    def fill_files(self, n_files: int) -> None:
        """Send until the commitlog has ``n_files`` files holding data."""
        while self.written_files_count() < n_files:
            self.send(1)

    def advance_to_hour(self, hour: int) -> None:
        """Move the clock forward to the next ``hour``:30 local time."""
        day = 10
        while _local_ms(hour, day) <= self.clock.now_ms():
            day += 1
        self.clock.advance_ms(_local_ms(hour, day) - self.clock.now_ms())
        assert time.localtime(self.clock.now_ms() / 1000).tm_hour == hour

    @property
    def files(self) -> list[MappedFile]:
        return self.store.commitlog.files.files

    def written_files_count(self) -> int:
        newest = self.store.commitlog.files.last_written()
        return self.files.index(newest) + 1 if newest is not None else 0

    def names(self) -> list[str]:
        return sorted(p.name for p in self.config.commitlog_dir.iterdir())

    def age(self, mf: MappedFile, hours: float) -> None:
        """Set the file's mtime ``hours`` before the clock's now."""
        ns = (self.clock.now_ms() - int(hours * HOUR_MS)) * 1_000_000
        os.utime(mf.path, ns=(ns, ns))

    def age_all_but_newest(self, hours: float) -> None:
        for mf in self.files[: self.written_files_count() - 1]:
            self.age(mf, hours)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.store.close_files()


# ---- by age ----------------------------------------------------------------------------------
def test_expired_files_kept_outside_delete_hour(env: Env) -> None:
    env.fill_files(4)
    env.age_all_but_newest(73)
    before = env.names()
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted == 0
    assert env.names() == before
    assert env.disk.paths == [env.config.commitlog_dir]


def test_expired_files_deleted_at_delete_hour(env: Env) -> None:
    env.fill_files(4)
    env.advance_to_hour(4)
    first_two = [env.files[0].path.name, env.files[1].path.name]
    env.age(env.files[0], 80)
    env.age(env.files[1], 73)
    env.age(env.files[2], 71)  # not yet expired: the run stops here
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted == 2
    assert not any(n in env.names() for n in first_two)
    assert env.store.commitlog.min_offset == 2 * CL_FILE_BYTES


def test_unexpired_files_kept_even_at_delete_hour(env: Env) -> None:
    env.fill_files(3)
    env.advance_to_hour(4)
    env.age_all_but_newest(71)
    assert env.store.retention.run_once().commitlog_files_deleted == 0


def test_delete_when_lists_several_hours(tmp_path: Path) -> None:
    e = Env(tmp_path, delete_when="02;13")
    try:
        e.fill_files(3)
        e.age_all_but_newest(100)
        assert e.store.retention.run_once().commitlog_files_deleted == 2  # 13:30 is listed
    finally:
        e.store.close_files()


def test_file_reserved_time_is_configurable(tmp_path: Path) -> None:
    e = Env(tmp_path, file_reserved_time_hours=1)
    try:
        e.fill_files(3)
        e.advance_to_hour(4)
        e.age_all_but_newest(1.5)
        assert e.store.retention.run_once().commitlog_files_deleted == 2
    finally:
        e.store.close_files()


# ---- by disk use -----------------------------------------------------------------------------
def test_usage_75_percent_deletes_expired_at_any_hour(env: Env) -> None:
    env.fill_files(4)
    env.age_all_but_newest(73)
    env.disk.ratio = 0.74
    assert env.store.retention.run_once().commitlog_files_deleted == 0
    env.disk.ratio = 0.75
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted == 3
    assert result.writable


def test_usage_75_percent_keeps_unexpired(env: Env) -> None:
    env.fill_files(4)
    env.age_all_but_newest(10)
    env.disk.ratio = 0.80
    assert env.store.retention.run_once().commitlog_files_deleted == 0


def test_usage_85_percent_deletes_oldest_even_unexpired(env: Env) -> None:
    env.fill_files(4)
    env.disk.ratio = 0.85
    oldest = env.files[0].path.name
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted == 3
    assert oldest not in env.names()
    assert result.writable


def test_forced_deletion_is_capped_per_run(tmp_path: Path) -> None:
    e = Env(tmp_path, delete_files_per_run=1)
    try:
        e.fill_files(4)
        e.disk.ratio = 0.88
        names = [mf.path.name for mf in e.files]
        assert e.store.retention.run_once().commitlog_files_deleted == 1
        assert e.names()[0] == names[1]
        assert e.store.retention.run_once().commitlog_files_deleted == 1
        assert e.names()[0] == names[2]
    finally:
        e.store.close_files()


def test_usage_90_percent_refuses_writes_until_it_drops(env: Env) -> None:
    env.send(3)
    env.disk.ratio = 0.90
    result = env.store.retention.run_once()
    assert not result.writable
    with pytest.raises(StoreFullError) as err:
        env.send(1)
    message = str(err.value)
    assert "90%" in message
    assert "refused" in message
    assert str(env.config.store_dir) in message
    assert env.store.max_offset("T", 0) == 3  # nothing written
    env.disk.ratio = 0.5
    assert env.store.retention.run_once().writable
    env.send(1)
    assert env.store.max_offset("T", 0) == 4


def test_usage_90_percent_recovers_in_the_same_run_when_deletion_frees_space(env: Env) -> None:
    env.fill_files(4)
    cl_dir = env.config.commitlog_dir

    def usage(_path: Path) -> float:  # each file costs 24 % of the disk
        return 0.24 * len(list(cl_dir.iterdir()))

    env.store.retention.disk_usage = usage
    assert usage(cl_dir) >= 0.90
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted == 3
    assert result.writable
    env.send(1)


# ---- what is never deleted -------------------------------------------------------------------
def test_newest_file_is_never_deleted(env: Env) -> None:
    env.fill_files(3)
    for mf in env.files:
        env.age(mf, 1000)
    env.advance_to_hour(4)
    env.disk.ratio = 0.99
    newest = env.store.commitlog.files.last_written()
    assert newest is not None
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted == 2
    assert newest.path.exists()
    assert env.store.retention.run_once().commitlog_files_deleted == 0
    assert newest.path.exists()
    # The newest file's messages are still readable.
    lo = int(env.store.min_offset("T", 0))
    got = env.store.get_messages("T", 0, lo, 32)
    assert got.status is GetStatus.FOUND
    assert codec.decode_record(got.records[-1]).body == f"message-{env.sent - 1}".encode() * 10


def test_single_file_is_never_deleted(env: Env) -> None:
    env.send(2)
    for mf in env.files:
        env.age(mf, 1000)
    env.disk.ratio = 0.99
    assert env.store.retention.run_once().commitlog_files_deleted == 0
    assert env.store.get_messages("T", 0, 0, 32).status is GetStatus.FOUND


# ---- consume queues and index follow ---------------------------------------------------------
def test_consume_queues_and_index_cleaned_with_the_commitlog(env: Env) -> None:
    env.fill_files(5)
    env.send(5, topic="Other")
    index = env.store.index
    assert index is not None
    index_files_before = len(index.files)
    assert index_files_before > 2
    cq = env.store.queues.find("T", 0)
    assert cq is not None
    cq_files_before = len(cq.files.files)
    max_before = int(cq.max_offset)
    env.disk.ratio = 0.86
    result = env.store.retention.run_once()
    assert result.commitlog_files_deleted >= 3
    cl_min = env.store.commitlog.min_offset
    assert cl_min > 0
    # Consume queue: whole files gone, min offset moved to the first surviving record.
    assert result.consume_queue_files_deleted > 0
    assert len(cq.files.files) < cq_files_before
    lo = int(env.store.min_offset("T", 0))
    assert lo > 0
    assert env.store.max_offset("T", 0) == max_before
    unit = cq.unit(lo)
    assert unit is not None
    assert unit[0] >= cl_min
    assert cq.unit(lo - 1) is None
    # Pulls below the new minimum are told where to go.
    res = env.store.get_messages("T", 0, 0, 32)
    assert res.status is GetStatus.OFFSET_TOO_SMALL
    assert res.next_begin_offset == lo
    res = env.store.get_messages("T", 0, lo, 32)
    assert res.status is GetStatus.FOUND
    assert all(codec.decode_record(r).physical_offset >= cl_min for r in res.records)
    # Index: files wholly below the commitlog minimum are gone, the rest still answer.
    assert result.index_files_deleted > 0
    assert len(index.files) == index_files_before - result.index_files_deleted
    assert all(f.end_phy_offset >= cl_min for f in index.files[:-1])
    window = (0, env.clock.now_ms() + 1)
    assert env.store.query_by_key("T", "k0", 4, *window) == []
    last_key = f"k{env.sent - 1}"
    assert [r.topic for r in env.store.query_by_key("Other", last_key, 4, *window)] == ["Other"]


def test_retention_state_survives_reopen(tmp_path: Path) -> None:
    e = Env(tmp_path)
    e.fill_files(4)
    e.disk.ratio = 0.86
    e.store.retention.run_once()
    lo = int(e.store.min_offset("T", 0))
    hi = int(e.store.max_offset("T", 0))
    e.store.close_files()
    again = MessageStore(e.config, clock=e.clock, disk_usage=FakeDisk(), memory_bytes=1 << 34)
    again.open()
    try:
        assert (again.min_offset("T", 0), again.max_offset("T", 0)) == (lo, hi)
        assert again.get_messages("T", 0, 0, 32).status is GetStatus.OFFSET_TOO_SMALL
        assert again.get_messages("T", 0, lo, 32).status is GetStatus.FOUND
    finally:
        again.close_files()


def test_the_broker_key_clean_resource_interval_sets_how_often_retention_runs() -> None:
    # spark2: tests that need retention to act set it low instead of waiting 10 s.
    from services.broker import config as broker_config

    cfg = broker_config.load(None, {"cleanResourceInterval": "200"}, {})
    assert cfg.store_config(10911).clean_resource_interval_ms == 200
    assert broker_config.load(None, {}, {}).store_config(10911).clean_resource_interval_ms == 10_000
    with pytest.raises(ValueError, match=r"cleanResourceInterval 5: 100\.\.3600000 ms"):
        broker_config.load(None, {"cleanResourceInterval": "5"}, {})
    assert "cleanResourceInterval" in broker_config.STARTUP_ONLY_KEYS
