"""Read-only inspection of a store directory: dump records, units and index entries; verify.

Everything here maps files read-only and never takes the store's lock, so it is safe to run
against a live broker's directory (it then sees a moment's snapshot) and can never repair or
damage anything. File sizes are read off the files themselves: the commitlog file size is the
first file's size, a consume-queue file holds ``size / 20`` units, and an index file's slot and
entry counts follow from its size when they keep RocketMQ's 1 : 4 ratio (else pass them).

``verify`` checks, and reports every violation with its offset:

* every commitlog record is whole, has the right magic, body CRC and physical-offset field, a
  blank record appears only at a file's end, and nothing but zeros follows the last record;
* queue offsets in the commitlog are dense per (topic, queue);
* every consume-queue unit points at the start of a record of its own topic and queue, with
  the record's size and the unit's own queue offset, and no record is missing from its queue -
  except records of topics the broker deleted (absent from ``config/topics.json``; their
  queues went with them), which are counted, not reported as problems;
* every index entry points at a record start (or below the commitlog minimum, after retention)
  whose ``topic#key`` hash equals the entry's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketq import codec
from rocketq.java_hash import index_key_hash
from services.store.commitlog import NOT_QUEUED, TRANSACTION_MASK, CommitLog
from services.store.config_files import TOPICS, ConfigFileError, read_json
from services.store.consume_queue import CQ_UNIT_BYTES, PRE_BLANK_SIZE, ConsumeQueue
from services.store.index_file import IndexFile
from services.store.mapped_file import MappedFileQueue
from services.store.recovery import scan
from services.store.types import PhysicalOffset


@dataclass
class StoreLayout:
    """Sizes of a store directory's files, as read off the files."""

    root: Path
    commitlog_file_bytes: int
    units_per_file: int
    index_slot_num: int
    index_num: int


def detect_layout(
    root: Path, index_slot_num: int | None = None, index_num: int | None = None
) -> StoreLayout:
    """Read file sizes off the directory; raise ValueError if it is not a store."""
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    cl_files = sorted(p for p in (root / "commitlog").glob("[0-9]" * 20) if p.is_file())
    if not cl_files and not (root / "consumequeue").is_dir():
        raise ValueError(
            f"{root} has no commitlog/ or consumequeue/: not a RocketQ store directory"
        )
    cl_size = cl_files[0].stat().st_size if cl_files else 1024**3
    cq_file = next((p for p in (root / "consumequeue").glob("*/*/" + "[0-9]" * 20)), None)
    units = cq_file.stat().st_size // CQ_UNIT_BYTES if cq_file else 300_000
    if index_slot_num is None or index_num is None:
        idx = next(iter(sorted((root / "index").glob("*"))), None)
        if idx is not None and idx.is_file():
            # RocketMQ keeps 4 entries per slot: size = 40 + 4 s + 20 × 4 s = 40 + 84 s.
            s = (idx.stat().st_size - 40) // 84
            index_slot_num, index_num = index_slot_num or s, index_num or 4 * s
        else:
            index_slot_num, index_num = index_slot_num or 5_000_000, index_num or 20_000_000
    return StoreLayout(root, cl_size, max(units, 1), index_slot_num, index_num)


def _open_commitlog(layout: StoreLayout, problems: list[str]) -> CommitLog:
    cl = CommitLog(layout.root / "commitlog", file_size_bytes=layout.commitlog_file_bytes)
    cl.files = MappedFileQueue(
        layout.root / "commitlog", layout.commitlog_file_bytes, create_ahead=False, readonly=True
    )
    problems.extend(cl.files.load())
    return cl


def _open_queues(layout: StoreLayout, problems: list[str]) -> list[ConsumeQueue]:
    out: list[ConsumeQueue] = []
    root = layout.root / "consumequeue"
    if not root.is_dir():
        return out
    for tdir in sorted(p for p in root.iterdir() if p.is_dir()):
        for qdir in sorted(p for p in tdir.iterdir() if p.is_dir() and p.name.isdigit()):
            cq = ConsumeQueue(qdir, tdir.name, int(qdir.name), layout.units_per_file)
            cq.files = MappedFileQueue(
                qdir, layout.units_per_file * CQ_UNIT_BYTES, create_ahead=False, readonly=True
            )
            problems.extend(cq.files.load())
            cq.find_written_end()
            if cq.files.first is not None:
                cq.min_logic_offset = cq.files.first.file_from_offset
            out.append(cq)
    return out


def iter_commitlog(layout: StoreLayout, problems: list[str]) -> Iterator[dict[str, Any]]:
    """Every record (and blank) of the commitlog as a plain dict, in order."""
    cl = _open_commitlog(layout, problems)
    try:
        for item in scan(cl, cl.min_offset, problems):
            rec = item.record
            if rec is None:
                yield {"offset": item.offset, "size": item.size, "blank": True}
                continue
            yield {
                "offset": item.offset,
                "size": item.size,
                "topic": rec.topic,
                "queue_id": rec.queue_id,
                "queue_offset": rec.queue_offset,
                "store_timestamp_ms": rec.store_timestamp_ms,
                "born_timestamp_ms": rec.born_timestamp_ms,
                "sys_flag": rec.sys_flag,
                "reconsume_times": rec.reconsume_times,
                "tags": rec.tags,
                "keys": rec.keys,
                "uniq_key": rec.uniq_key,
                "offset_msg_id": rec.offset_msg_id,
                "body_bytes": len(rec.body),
                "body_crc": rec.body_crc,
                "properties": rec.properties,
            }
    finally:
        cl.close()


def iter_consume_queues(layout: StoreLayout, problems: list[str]) -> Iterator[dict[str, Any]]:
    """Every consume-queue unit as a dict."""
    for cq in _open_queues(layout, problems):
        try:
            for qoff, off, size, tags in cq.iter_units():
                yield {
                    "topic": cq.topic,
                    "queue_id": cq.queue_id,
                    "queue_offset": qoff,
                    "commitlog_offset": off,
                    "size": size,
                    "tags_code": tags,
                    "pre_blank": size == PRE_BLANK_SIZE,
                }
        finally:
            cq.close()


def iter_index(layout: StoreLayout, problems: list[str]) -> Iterator[dict[str, Any]]:
    """Every index entry as a dict, file by file."""
    root = layout.root / "index"
    if not root.is_dir():
        return
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        try:
            f = IndexFile(path, layout.index_slot_num, layout.index_num, readonly=True)
        except (ValueError, OSError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        try:
            for no, key_hash, phy, diff_s, prev in f.entries():
                yield {
                    "file": path.name,
                    "index_no": no,
                    "key_hash": key_hash,
                    "commitlog_offset": phy,
                    "time_diff_s": diff_s,
                    "prev_index_no": prev,
                }
        finally:
            f.close()


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`."""

    records: int = 0
    units: int = 0
    index_entries: int = 0
    commitlog_min: int = 0
    commitlog_end: int = 0
    deleted_topic_records: int = 0
    """Records of topics no longer in the topic table: kept until retention, never queued."""
    unclean_shutdown: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(layout: StoreLayout, *, max_problems: int = 1000) -> VerifyReport:
    """Check the whole store; see the module docstring for what is checked."""
    report = VerifyReport(unclean_shutdown=(layout.root / "abort").exists())
    problems = report.problems
    cl = _open_commitlog(layout, problems)
    try:
        records, unqueued = _verify_commitlog(cl, report)
        _verify_queues(layout, records, unqueued, report)
        _verify_index(layout, cl, records, report)
    finally:
        cl.close()
    del problems[max_problems:]
    return report


_Rec = tuple[str, int, int, int, str, str]  # topic, queue id, queue offset, size, keys, uniq


def _verify_commitlog(cl: CommitLog, report: VerifyReport) -> tuple[dict[int, _Rec], set[int]]:
    records: dict[int, _Rec] = {}
    unqueued: set[int] = set()
    next_qoff: dict[tuple[str, int], int] = {}
    report.commitlog_min = cl.min_offset
    end = cl.min_offset
    for item in scan(cl, cl.min_offset, report.problems):
        end = PhysicalOffset(item.offset + item.size)
        rec = item.record
        if rec is None:
            continue
        report.records += 1
        records[item.offset] = (
            rec.topic,
            rec.queue_id,
            rec.queue_offset,
            item.size,
            rec.keys,
            rec.uniq_key,
        )
        if rec.sys_flag & TRANSACTION_MASK in NOT_QUEUED:
            unqueued.add(item.offset)  # half / rollback records have no unit, by design
            continue
        key = (rec.topic, rec.queue_id)
        want = next_qoff.get(key)
        if want is not None and rec.queue_offset != want:
            report.problems.append(
                f"commitlog {item.offset}: {rec.topic}/{rec.queue_id} queue offset "
                f"{rec.queue_offset}, expected {want} (offsets must be dense)"
            )
        next_qoff[key] = rec.queue_offset + 1
    report.commitlog_end = end
    mf = cl.files.find(end)
    if mf is not None:
        tail = bytes(mf.view[end - mf.file_from_offset : end - mf.file_from_offset + (1 << 20)])
        if tail.strip(b"\0"):
            report.problems.append(
                f"commitlog {end}: non-zero bytes after the last whole record "
                "(a torn write; the broker's recovery truncates it)"
            )
    return records, unqueued


def _topic_table(layout: StoreLayout, problems: list[str]) -> set[str] | None:
    """Topics in the broker's topic table; None for a store without one (a bare engine's,
    e.g. a benchmark's), where every record is expected in a queue."""
    path = layout.root / "config" / TOPICS
    try:
        table = read_json(path, None)
    except ConfigFileError as exc:
        problems.append(f"{path}: {exc}")
        return None
    if not isinstance(table, dict):
        return None
    return set(table.get("topicConfigTable", {}))


def _verify_queues(
    layout: StoreLayout, records: dict[int, _Rec], unqueued: set[int], report: VerifyReport
) -> None:
    seen: set[int] = set()
    problems = report.problems
    for cq in _open_queues(layout, problems):
        try:
            for qoff, off, size, _tags in cq.iter_units():
                report.units += 1
                if size == PRE_BLANK_SIZE or off < report.commitlog_min:
                    continue
                rec = records.get(off)
                where = f"consumequeue {cq.topic}/{cq.queue_id} unit {qoff}"
                if rec is None:
                    problems.append(f"{where}: points at {off}, which is not a record start")
                elif (rec[0], rec[1], rec[2], rec[3]) != (cq.topic, cq.queue_id, qoff, size):
                    problems.append(
                        f"{where}: points at a record of {rec[0]}/{rec[1]} offset {rec[2]} "
                        f"size {rec[3]}, unit says size {size}"
                    )
                else:
                    seen.add(off)
        finally:
            cq.close()
    missing = [phys for phys in records if phys not in seen and phys not in unqueued]
    live_topics = _topic_table(layout, problems)
    if live_topics is not None:
        deleted = [phys for phys in missing if records[phys][0] not in live_topics]
        report.deleted_topic_records = len(deleted)
        missing = [phys for phys in missing if records[phys][0] in live_topics]
    for phys in missing[:20]:
        t, q, qo, _s, _k, _u = records[phys]
        problems.append(f"commitlog {phys}: {t}/{q} offset {qo} is in no consume queue unit")
    if len(missing) > 20:
        problems.append(f"… and {len(missing) - 20} more records missing from consume queues")


def _verify_index(
    layout: StoreLayout, cl: CommitLog, records: dict[int, _Rec], report: VerifyReport
) -> None:
    for entry in iter_index(layout, report.problems):
        report.index_entries += 1
        off = entry["commitlog_offset"]
        if off < report.commitlog_min:
            continue
        rec = records.get(off)
        where = f"index {entry['file']} entry {entry['index_no']}"
        if rec is None:
            report.problems.append(f"{where}: points at {off}, which is not a record start")
            continue
        # As index_keys_of indexes them: the unique key whole (it may hold a space), then
        # each KEYS key.
        keys = [k for k in rec[4].split(" ") if k] + ([rec[5]] if rec[5] else [])
        hashes = {index_key_hash(f"{rec[0]}#{k}") for k in keys}
        if entry["key_hash"] not in hashes:
            report.problems.append(f"{where}: key hash matches no key of the record at {off}")


def describe_record(rec: codec.Record) -> str:
    """One line for humans."""
    return f"{rec.topic}/{rec.queue_id}@{rec.queue_offset} {len(rec.body)}B tags={rec.tags!r}"
