"""Damaged files are reported, never fatal: ``rocketq store verify``, ``open()`` and readers.

Each case damages one file of a cleanly stopped store, then:

* ``rocketq store verify DIR`` (the real CLI, in a subprocess) exits 1 with a ``problem:`` line
  naming the damaged file or physical offset;
* ``MessageStore.open()`` does not raise, and reports the damage in ``RecoveryReport.problems``
  or repairs it by truncation — except where noted: open() re-verifies only its recovery
  window (the last three commitlog files after a clean stop, from the checkpoint after a
  crash, like RocketMQ), and does not read index entries (they are hash candidates that
  ``query_by_key`` re-checks against the record); deep checks are ``verify``'s job;
* readers raise nothing unexpected: ``get_messages`` over every queue, ``query_by_key`` and
  ``read_record`` for every acknowledged message. ``read_record`` may raise ``CorruptRecord``
  for a damaged record — that is its documented contract; ``query_by_key`` must swallow it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rocketq import codec
from services.store.index_file import HEADER, INDEX_COUNT_AT, entry_position_bytes
from services.store.inspect import detect_layout, iter_commitlog
from services.store.mapped_file import file_name
from services.store.message_store import GetStatus, MessageStore, PutStatus
from services.store.recovery import RecoveryReport
from tests.robustness.harness import REPO_ROOT, BaseStore
from tests.robustness.writer import (
    COMMITLOG_FILE_BYTES,
    INDEX_SLOT_NUM,
    plan,
    store_config,
    to_store,
)

pytestmark = pytest.mark.robustness

_ALL_TIME_MS = 2**62


@dataclass(frozen=True)
class Damage:
    """What a corruption did: the text a report must name, and whether open() must see it."""

    names: str
    """A file name or physical offset that must appear in the problem line."""
    open_detects: bool = True
    queue: tuple[str, int] | None = None
    """The consume queue damaged, if one was."""


# -- helpers -------------------------------------------------------------------------------------
def _records(store: Path) -> list[dict[str, Any]]:
    problems: list[str] = []
    recs = [r for r in iter_commitlog(detect_layout(store), problems) if not r.get("blank")]
    assert not problems, problems
    return recs


def _commitlog_path(store: Path, physical_offset: int) -> Path:
    start = physical_offset - physical_offset % COMMITLOG_FILE_BYTES
    return store / "commitlog" / file_name(start)


def _patch(path: Path, pos: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(pos)
        f.write(data)


def _middle_record(store: Path, which_file: str) -> dict[str, Any]:
    """The middle record of the last commitlog file holding data, or of the second file."""
    recs = _records(store)
    files = sorted({r["offset"] // COMMITLOG_FILE_BYTES for r in recs})
    assert len(files) >= 6, "the base store must outgrow open()'s three-file recovery window"
    target = files[-1] if which_file == "last" else files[1]
    in_file = [r for r in recs if r["offset"] // COMMITLOG_FILE_BYTES == target]
    return in_file[len(in_file) // 2]


def _queue_of(cq_file: Path) -> tuple[str, int]:
    return cq_file.parent.parent.name, int(cq_file.parent.name)


def _queue_files(store: Path) -> list[Path]:
    """Consume-queue files of the queue with the most files (at least three)."""
    qdirs = [q for t in (store / "consumequeue").iterdir() for q in t.iterdir()]
    best = max(qdirs, key=lambda q: len(list(q.iterdir())))
    files = sorted(best.iterdir())
    assert len(files) >= 3, "the base store must give some queue three consume-queue files"
    return files


def _index_files(store: Path) -> list[Path]:
    files = sorted((store / "index").iterdir())
    assert len(files) >= 3, "the base store must have three index files"
    return files


# -- the corruptions -----------------------------------------------------------------------------
def bad_magic(which_file: str) -> Callable[[Path], Damage]:
    def damage(store: Path) -> Damage:
        rec = _middle_record(store, which_file)
        at = rec["offset"]
        _patch(_commitlog_path(store, at), at % COMMITLOG_FILE_BYTES + 4, b"\xde\xad\xbe\xef")
        return Damage(str(at), open_detects=which_file == "last")

    return damage


def crc_mismatch(which_file: str) -> Callable[[Path], Damage]:
    def damage(store: Path) -> Damage:
        rec = _middle_record(store, which_file)
        at = rec["offset"]
        body_at = at + codec.FIXED_BYTES_V4 + 4 + rec["body_bytes"] // 2  # both hosts IPv4
        path = _commitlog_path(store, body_at)
        old = path.read_bytes()[body_at % COMMITLOG_FILE_BYTES]
        _patch(path, body_at % COMMITLOG_FILE_BYTES, bytes([old ^ 0x01]))
        return Damage(str(at), open_detects=which_file == "last")

    return damage


def truncated_cq_file(store: Path) -> Damage:
    victim = _queue_files(store)[1]
    with victim.open("r+b") as f:
        f.truncate(victim.stat().st_size // 2 + 3)  # not even a whole number of units
    return Damage(victim.name, queue=_queue_of(victim))


def cq_file_of_wrong_size(store: Path) -> Damage:
    victim = _queue_files(store)[0]
    with victim.open("ab") as f:
        f.write(b"\x00" * 20)  # one unit too many: a file of another units-per-file setting
    return Damage(victim.name, queue=_queue_of(victim))


def index_file_of_wrong_size(store: Path) -> Damage:
    victim = _index_files(store)[1]  # not the first: verify reads the geometry off that one
    with victim.open("r+b") as f:
        f.truncate(victim.stat().st_size - 1000)
    return Damage(victim.name)


def garbage_over_index_entries(store: Path) -> Damage:
    victim = _index_files(store)[1]
    raw = victim.read_bytes()
    count = int.from_bytes(raw[INDEX_COUNT_AT : INDEX_COUNT_AT + 4], "big")
    assert count > 100 and len(raw) > HEADER.size
    start = entry_position_bytes(INDEX_SLOT_NUM, 1)
    end = entry_position_bytes(INDEX_SLOT_NUM, count)
    _patch(victim, start, random.Random(7).randbytes(end - start))
    # open() does not read index entries; queries re-check every candidate against its record.
    return Damage(victim.name, open_detects=False)


CASES: dict[str, Callable[[Path], Damage]] = {
    "bad-magic-last-file": bad_magic("last"),
    "bad-magic-older-file": bad_magic("older"),
    "crc-mismatch-last-file": crc_mismatch("last"),
    "crc-mismatch-older-file": crc_mismatch("older"),
    "truncated-cq-file": truncated_cq_file,
    "cq-file-of-wrong-size": cq_file_of_wrong_size,
    "index-file-of-wrong-size": index_file_of_wrong_size,
    "garbage-over-index-entries": garbage_over_index_entries,
}


# -- the checks ----------------------------------------------------------------------------------
def _cli_verify(store: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("rocketq")
    argv = [str(script)] if script.exists() else [sys.executable, "-c", _CLI_MAIN]
    return subprocess.run(
        [*argv, "store", "verify", str(store)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


_CLI_MAIN = "from services.cli.main import main; main()"


def _report_names(report: RecoveryReport, damage: Damage) -> bool:
    return any(damage.names in p for p in report.problems)


def _read_everything(store: MessageStore, base: BaseStore) -> int:
    """Every reader over everything; returns how many records raised CorruptRecord."""
    corrupt = 0
    for (topic, qid), _cq in sorted(store.queues.queues.items()):
        offset, end = int(store.min_offset(topic, qid)), int(store.max_offset(topic, qid))
        while offset < end:
            res = store.get_messages(topic, qid, offset, 32)
            for raw in res.records:
                try:
                    codec.decode_record(raw)
                except codec.CorruptRecord:
                    corrupt += 1
            if res.status is not GetStatus.FOUND and res.next_begin_offset <= offset:
                break  # nothing more to read here
            offset = max(res.next_begin_offset, offset + 1)
    for ack in base.acks:
        for rec in store.query_by_key(ack.topic, ack.uniq_key, 4, 0, _ALL_TIME_MS):
            assert rec.topic == ack.topic and ack.uniq_key in (rec.uniq_key, *rec.keys.split())
        try:
            store.read_record(ack.physical_offset)
        except codec.CorruptRecord:
            corrupt += 1
    return corrupt


@pytest.mark.parametrize("case", list(CASES))
def test_corruption_is_reported_and_never_fatal(
    case: str, base_store: BaseStore, fresh_copy: Callable[[], Path]
) -> None:
    path = fresh_copy()
    damage = CASES[case](path)

    cli = _cli_verify(path)
    problem_lines = [ln for ln in cli.stdout.splitlines() if ln.startswith("problem:")]
    assert cli.returncode == 1, f"verify exit {cli.returncode}\n{cli.stdout}\n{cli.stderr}"
    assert any(damage.names in ln for ln in problem_lines), (
        f"no problem line names {damage.names}:\n{cli.stdout}"
    )

    store = MessageStore(store_config(path), disk_usage=lambda _path: 0.0)
    try:
        report = store.open()  # must not raise
        if damage.open_detects:
            assert _report_names(report, damage), f"open() did not report {damage.names}: {report}"
        _read_everything(store, base_store)
    finally:
        store.close_files()


@pytest.mark.parametrize("case", ["truncated-cq-file", "cq-file-of-wrong-size"])
def test_writes_to_a_damaged_queue_continue_its_offsets(
    case: str, fresh_copy: Callable[[], Path]
) -> None:
    path = fresh_copy()
    damage = CASES[case](path)
    assert damage.queue is not None
    topic, qid = damage.queue
    highest = max(
        r["queue_offset"] for r in _records(path) if (r["topic"], r["queue_id"]) == damage.queue
    )

    async def put_one() -> None:
        store = MessageStore(store_config(path), disk_usage=lambda _path: 0.0)
        store.open()
        await store.start()
        try:
            planned = dataclasses.replace(plan(9, 0), topic=topic, queue_id=qid)
            result = await store.put([to_store(planned, 0)])
            assert result.status is PutStatus.PUT_OK
            assert result.results[0].queue_offset == highest + 1, "queue offset reused"
            got = store.get_messages(topic, qid, highest + 1, 1)
            assert got.status is GetStatus.FOUND
        finally:
            await store.shutdown()

    asyncio.run(put_one())
