"""No acknowledged SYNC_FLUSH message is lost to a crash (DESIGN.md §4, Recovery).

Four kinds of crash, each followed by :func:`check_store` (reopen, read everything, compare
with the ACKs, verify the files):

1. SIGKILL of the writer at a random moment;
2. SIGKILL from inside, at each named failpoint of the write path (``crash@N``), and in the
   middle of recovery itself (``recovery_before_truncate``: recovery must be re-entrant);
3. torn and garbage tails written over a cleanly stopped store (what a power cut leaves:
   a SIGKILL keeps the page cache, so it seldom leaves a torn record by itself);
4. repeated kill and restart on one directory;
5. regression targets for what the random kills found.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rocketq import codec
from services.common import failpoints
from services.store import mapped_file
from services.store.inspect import detect_layout, iter_commitlog, verify
from services.store.mapped_file import file_name
from tests.robustness.checker import check_store
from tests.robustness.harness import (
    SIGKILLED,
    BaseStore,
    WriterProcess,
    run_and_sigkill,
    run_clean,
)
from tests.robustness.writer import COMMITLOG_FILE_BYTES, Ack, parse_uniq_key

pytestmark = pytest.mark.robustness

FAILPOINT_WAIT_S = 30.0


# -- 1. SIGKILL at a random moment ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("seed", [101, 102, 103, 104])
async def test_sigkill_at_random_moment(seed: int, tmp_path: Path, keep_dir: Path) -> None:
    delay_s = random.Random(seed).uniform(0.2, 1.5)
    writer = run_and_sigkill(tmp_path / "store", seed, tmp_path / "logs", delay_s)
    acks = writer.acks()
    assert acks, f"no message acknowledged in {delay_s:.2f} s\n{writer.describe()}"
    logs = [writer.out_path, writer.err_path]
    (await check_store(tmp_path / "store", acks, [seed], keep_dir=keep_dir, logs=logs)).assert_ok()


# -- 2. failpoints ---------------------------------------------------------------------------------
WRITE_PATH_FAILPOINTS = {
    # name: the N of crash@N to try (the N-th time the point is reached)
    "commitlog_after_append": (3, 40),
    "commitlog_before_flush": (3, 40),
    "commitlog_after_flush": (3, 40),
    "dispatch_before_consume_queue": (3, 40),
    # Regression target: a crash between the consume-queue write and the index write left
    # records that recovery did not re-index (recovery now also starts from endPhyoffset).
    "dispatch_before_index": (3, 40),
    # Reached once per consume-queue/index flush (every 50 ms plus the flush itself), so a
    # smaller second N keeps the run, and the volume the checker reads back, short.
    "checkpoint_before_write": (3, 12),
}
RECOVERY_FAILPOINTS = {"recovery_before_truncate"}  # test_crash_inside_recovery
UNREACHABLE_FAILPOINTS = {
    # Atomic writes of the broker's JSON config files (topics, consumerOffset, …): the broker
    # does them, MessageStore never does, so the writer cannot reach this point.
    "config_before_rename",
    # Retention deletes only files older than 72 h, or any file under disk pressure; the writer
    # reports 0 % disk use because the checker needs every acknowledged message kept. A crash
    # during deletion needs its own scenario, whose checker expects the deleted prefix gone.
    "retention_before_delete",
    # The timer-wheel service's own files (TimerLog flush, checkpoint save): MessageStore never
    # reaches them. tests/unit/test_timer_storage.py crashes at both, and
    # tests/integration/test_timer_crash.py SIGKILLs the service mid-enqueue and mid-delivery.
    "timer_log_before_flush",
    "timer_before_checkpoint",
    # The broker's EndTransaction path: MessageStore never reaches it. The committed message and
    # its op record are one append, so a crash there stores neither;
    # tests/integration/test_transaction_broker.py crashes a broker at it and commits once
    # after the restart.
    "transaction_before_end_put",
}


def test_every_failpoint_is_covered_or_explained() -> None:
    covered = set(WRITE_PATH_FAILPOINTS) | RECOVERY_FAILPOINTS | UNREACHABLE_FAILPOINTS
    assert covered == set(failpoints.KNOWN), (
        "a failpoint was added or removed: give it a crash scenario here or say why it has none"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [f"{name}=crash@{n}" for name, ns in WRITE_PATH_FAILPOINTS.items() for n in ns],
)
async def test_crash_at_failpoint(spec: str, tmp_path: Path, keep_dir: Path) -> None:
    seed = 200 + sum(map(ord, spec))
    with WriterProcess(tmp_path / "store", seed, tmp_path / "logs", failpoint=spec) as writer:
        rc = writer.wait(FAILPOINT_WAIT_S)
    assert rc == SIGKILLED, f"the failpoint did not kill the writer\n{writer.describe()}"
    logs = [writer.out_path, writer.err_path]
    (
        await check_store(tmp_path / "store", writer.acks(), [seed], keep_dir=keep_dir, logs=logs)
    ).assert_ok()


@pytest.mark.slow
async def test_crash_inside_recovery(
    base_store: BaseStore, fresh_copy: Callable[[], Path], tmp_path: Path, keep_dir: Path
) -> None:
    """Recovery killed just before it truncates a torn tail; the next recovery finishes it."""
    store = fresh_copy()
    end = _write_garbage_tail(store, random.Random(5))
    for attempt in range(2):
        spec = "recovery_before_truncate=crash"
        # count=0: if the failpoint never fires, the writer stops at once instead of writing.
        with WriterProcess(
            store, 300 + attempt, tmp_path / "logs", count=0, failpoint=spec
        ) as writer:
            rc = writer.wait(FAILPOINT_WAIT_S)
        assert rc == SIGKILLED, writer.describe()
        assert not writer.acks()
        # Killed before truncating: the torn tail is still there for the next attempt.
        report = verify(detect_layout(store))
        assert report.commitlog_end == end
        assert any("non-zero bytes after the last whole record" in p for p in report.problems)
    result = await check_store(store, base_store.acks, [base_store.seed], keep_dir=keep_dir)
    result.assert_ok()
    assert result.recovery is not None and result.recovery.truncated_bytes > 0


# -- 3. torn and garbage tails -----------------------------------------------------------------
def _last_record(store: Path) -> dict[str, Any]:
    problems: list[str] = []
    records = [r for r in iter_commitlog(detect_layout(store), problems) if not r.get("blank")]
    assert records and not problems, problems
    return records[-1]


def _commitlog_end(store: Path) -> int:
    last = _last_record(store)
    return int(last["offset"]) + int(last["size"])


def _room_at(physical_offset: int) -> int:
    return COMMITLOG_FILE_BYTES - physical_offset % COMMITLOG_FILE_BYTES


def _write_at(store: Path, physical_offset: int, data: bytes) -> None:
    """Write ``data`` into the commitlog at a physical offset, as a torn write would."""
    assert len(data) <= _room_at(physical_offset), "a record never spans two files"
    path = store / "commitlog" / file_name(physical_offset - physical_offset % COMMITLOG_FILE_BYTES)
    if not path.exists():  # the end fell on a file boundary and the next file was not made
        path.write_bytes(bytes(COMMITLOG_FILE_BYTES))
    with path.open("r+b") as f:
        f.seek(physical_offset % COMMITLOG_FILE_BYTES)
        f.write(data)
    (store / "abort").touch()  # a torn tail comes with an unclean stop


def _read_at(store: Path, physical_offset: int, size: int) -> bytes:
    path = store / "commitlog" / file_name(physical_offset - physical_offset % COMMITLOG_FILE_BYTES)
    with path.open("rb") as f:
        f.seek(physical_offset % COMMITLOG_FILE_BYTES)
        return f.read(size)


def _write_garbage_tail(store: Path, rng: random.Random) -> int:
    end = _commitlog_end(store)
    garbage = bytearray(rng.randbytes(rng.randint(1, min(4000, _room_at(end)))))
    garbage[0] |= 0x80  # at least one non-zero byte, and a negative TOTALSIZE to boot
    _write_at(store, end, bytes(garbage))
    return end


async def _check_torn(store: Path, acks: list[Ack], seed: int, keep_dir: Path) -> None:
    result = await check_store(store, acks, [seed], keep_dir=keep_dir)
    result.assert_ok()
    assert result.recovery is not None and result.recovery.truncated_bytes > 0, result.summary()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_garbage_after_the_last_record(
    seed: int, base_store: BaseStore, fresh_copy: Callable[[], Path], keep_dir: Path
) -> None:
    store = fresh_copy()
    _write_garbage_tail(store, random.Random(seed))
    await _check_torn(store, base_store.acks, base_store.seed, keep_dir)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_half_written_record_at_the_end(
    seed: int, base_store: BaseStore, fresh_copy: Callable[[], Path], keep_dir: Path
) -> None:
    """The first N bytes of a plausible next record: right size, magic, offset fields."""
    store = fresh_copy()
    rng = random.Random(seed)
    last = _last_record(store)
    at, size = int(last["offset"]), int(last["size"])
    end = at + size
    record = bytearray(_read_at(store, at, size))
    # Make it the record that would come next: its own physical offset and queue offset.
    record[codec.OFFSET_PHYSICALOFFSET : codec.OFFSET_PHYSICALOFFSET + 8] = end.to_bytes(8, "big")
    qoff = int(last["queue_offset"]) + 1
    record[codec.OFFSET_QUEUEOFFSET : codec.OFFSET_QUEUEOFFSET + 8] = qoff.to_bytes(8, "big")
    cut = rng.randint(8, min(size - 1, _room_at(end)))
    _write_at(store, end, bytes(record[:cut]))
    await _check_torn(store, base_store.acks, base_store.seed, keep_dir)


async def test_flipped_byte_in_the_last_record(
    base_store: BaseStore, fresh_copy: Callable[[], Path], keep_dir: Path
) -> None:
    """A CRC mismatch in the last record: it is cut, every earlier ACK survives."""
    store = fresh_copy()
    last = _last_record(store)
    at = int(last["offset"])
    _flip_body_byte(store, at, int(last["body_bytes"]) // 2)
    kept = [a for a in base_store.acks if a.physical_offset != at]
    assert len(kept) == len(base_store.acks) - 1
    await _check_torn(store, kept, base_store.seed, keep_dir)


@pytest.mark.slow
async def test_writes_after_a_deep_truncation_are_indexed(
    base_store: BaseStore, fresh_copy: Callable[[], Path], tmp_path: Path, keep_dir: Path
) -> None:
    """A CRC mismatch 20 records before the end (a torn multi-record write); writing resumes."""
    store = fresh_copy()
    problems: list[str] = []
    records = [r for r in iter_commitlog(detect_layout(store), problems) if not r.get("blank")]
    victim = records[-20]
    at = int(victim["offset"])
    _flip_body_byte(store, at, 0)
    kept = [a for a in base_store.acks if a.physical_offset < at]
    writer = run_clean(store, 401, tmp_path / "logs", 200)
    ready = writer.stdout_text().split("\n", 1)[0].split()  # READY <end> <truncated bytes>
    assert int(ready[1]) == at and int(ready[2]) > 0, f"recovery did not cut at {at}: {ready}"
    # no violation at all, the index included (recovery cuts the index with the log)
    (
        await check_store(store, kept + writer.acks(), [base_store.seed, 401], keep_dir=keep_dir)
    ).assert_ok()


def _flip_body_byte(store: Path, record_at: int, index: int) -> None:
    # Both hosts are IPv4 (the writer's), so the body starts after the v4 fixed part and
    # its 4-byte length.
    body_at = record_at + codec.FIXED_BYTES_V4 + 4 + index
    byte = _read_at(store, body_at, 1)[0]
    _write_at(store, body_at, bytes([byte ^ 0x5A]))


# -- 4. kill and restart, again and again -------------------------------------------------------
@pytest.mark.slow
async def test_kill_and_restart_repeatedly(tmp_path: Path, keep_dir: Path) -> None:
    store = tmp_path / "store"
    rng = random.Random(4)
    runs = [501, 502, 503, 504]
    acks: list[Ack] = []
    logs: list[Path] = []
    for seed in runs:
        writer = run_and_sigkill(store, seed, tmp_path / "logs", rng.uniform(0.2, 0.6))
        acks += writer.acks()
        logs += [writer.out_path, writer.err_path]
    acked_runs = {parse_uniq_key(a.uniq_key)[0] for a in acks}  # type: ignore[index]
    assert acked_runs == set(runs), f"only runs {acked_runs} acknowledged anything"
    (await check_store(store, acks, runs, keep_dir=keep_dir, logs=logs)).assert_ok()


# -- 5. regression targets -----------------------------------------------------------------------
class _Killed(BaseException):
    """Stands for a SIGKILL at one exact instruction (no failpoint sits there)."""


def test_a_mapped_file_is_never_visible_at_the_wrong_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill between creating a mapped file and sizing it left a real-named empty file that
    every later load reported as damaged (found by test_sigkill_at_random_moment)."""

    def killed(_fd: int, _size: int) -> None:
        raise _Killed

    directory = tmp_path / "queue"
    monkeypatch.setattr(mapped_file.os, "ftruncate", killed)
    with pytest.raises(_Killed):
        mapped_file.MappedFileQueue(directory, 4096).writable_file()
    monkeypatch.undo()
    assert not [p.name for p in directory.iterdir() if not p.name.endswith(".tmp")]
    reloaded = mapped_file.MappedFileQueue(directory, 4096)
    assert reloaded.load() == []
    assert reloaded.writable_file().file_size_bytes == 4096
    reloaded.close()
