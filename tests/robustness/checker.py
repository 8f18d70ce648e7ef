"""Validation and report: reopen a crashed store and check it against what the writers saw.

:func:`check_store` reopens the store in this process (``MessageStore.open()`` runs recovery),
reads every consume queue from offset 0 with ``get_messages``, and checks:

* every ACKed message is at its queue offset and physical offset, with the byte-identical body
  (recomputed from its unique key, :func:`tests.robustness.writer.plan`) and the same unique key;
* every queue is dense from 0 — no gap, no duplicate — and each unit's record says it is that
  queue's record at that offset;
* per-queue order: physical offsets increase, store times never go back, runs appear in the
  order they ran, and within one run sequence numbers increase;
* every run's messages that survived are a prefix of what it appended (sequence numbers
  contiguous from its first): the commitlog can lose an unacknowledged tail, never a middle;
* every surviving message, ACKed or not, is found by its unique key in the index (recovery
  rebuilds the index past what it covers), and every ACKed one also by its business key;
* after a clean shutdown, ``verify`` finds nothing wrong — recovery left no torn tail, no unit
  or index entry pointing at nothing.

Unacknowledged messages may survive (a SIGKILL keeps the page cache) or not; both are fine.

Like etcd's ``tests/robustness/report``, a failed check keeps the evidence: the data directory
as the crash left it (before recovery touched it), as recovery left it, the ACKs and the
violations, under ``keep_dir``; the message says where.
"""

from __future__ import annotations

import itertools
import shutil
import traceback
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rocketq import codec
from services.store.inspect import VerifyReport, detect_layout, verify
from services.store.message_store import GetStatus, MessageStore
from services.store.recovery import RecoveryReport
from tests.robustness.writer import Ack, parse_uniq_key, plan, store_config

PULL_BATCH = 32
VIOLATIONS_SHOWN = 30
_ALL_TIME_MS = 2**62
WIDE_QUERY_EVERY = 53
VERIFY_PREFIX = "verify after recovery and clean shutdown: "
INDEX_PREFIX = "index: "


@dataclass(frozen=True, slots=True)
class Seen:
    """One message as read back through its consume queue."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_timestamp_ms: int
    seed: int
    seq: int
    uniq_key: str


@dataclass
class CheckResult:
    store_dir: Path
    violations: list[str] = field(default_factory=list)
    acked: int = 0
    present: int = 0
    queues: int = 0
    recovery: RecoveryReport | None = None
    verify_report: VerifyReport | None = None
    kept_at: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def assert_ok(self) -> None:
        assert self.ok, self.summary()

    def summary(self) -> str:
        rec = self.recovery
        head = (
            f"{self.store_dir}: {self.acked} acked, {self.present} present in {self.queues} "
            f"queues; recovery: "
            + (
                f"abnormal={rec.abnormal} end={rec.commitlog_end} "
                f"truncated={rec.truncated_bytes} redispatched={rec.records_redispatched} "
                f"problems={rec.problems[:3]}"
                if rec
                else "none"
            )
        )
        if self.ok:
            return head
        shown = "\n  ".join(self.violations[:VIOLATIONS_SHOWN])
        more = len(self.violations) - VIOLATIONS_SHOWN
        return (
            f"{head}\n{len(self.violations)} violation(s):\n  {shown}"
            + (f"\n  … and {more} more" if more > 0 else "")
            + f"\ndata directories and logs kept at {self.kept_at}"
        )


async def check_store(
    store_dir: Path,
    acks: Sequence[Ack],
    runs: Sequence[int],
    *,
    keep_dir: Path,
    start_seqs: Mapping[int, int] | None = None,
    logs: Iterable[Path] = (),
) -> CheckResult:
    """Reopen ``store_dir`` and check it against ``acks`` of the writer runs ``runs`` (seeds,
    in the order they ran). On any violation the evidence is copied under ``keep_dir``."""
    result = CheckResult(store_dir, acked=len(acks))
    snapshot = store_dir.with_name(store_dir.name + ".before-recovery")
    shutil.rmtree(snapshot, ignore_errors=True)
    shutil.copytree(store_dir, snapshot)
    try:
        await _check(store_dir, acks, runs, dict(start_seqs or {}), result)
    except Exception:
        result.violations.append("the checker itself failed:\n" + traceback.format_exc())
    if result.violations:
        result.kept_at = _keep(keep_dir, store_dir, snapshot, acks, result, logs)
    shutil.rmtree(snapshot, ignore_errors=True)
    return result


async def _check(
    store_dir: Path,
    acks: Sequence[Ack],
    runs: Sequence[int],
    start_seqs: dict[int, int],
    result: CheckResult,
) -> None:
    bad = result.violations
    store = MessageStore(store_config(store_dir), disk_usage=lambda _path: 0.0)
    try:
        result.recovery = store.open()
    except Exception as exc:
        store.close_files()
        bad.append(f"MessageStore.open() raised {exc!r}")
        return
    try:
        seen = _read_queues(store, result)
        by_position = {(s.topic, s.queue_id, s.queue_offset): s for s in seen}
        _check_acks(store, acks, by_position, bad)
        _check_order(seen, list(runs), bad)
        _check_prefixes(seen, runs, start_seqs, bad)
        _check_index(store, seen, {a.uniq_key for a in acks}, bad)
    finally:
        await store.shutdown()
    report = verify(detect_layout(store_dir))
    result.verify_report = report
    bad.extend(f"{VERIFY_PREFIX}{problem}" for problem in report.problems)


def _read_queues(store: MessageStore, result: CheckResult) -> list[Seen]:
    """Every message of every queue, via get_messages from 0; density and content checked."""
    bad = result.violations
    seen: list[Seen] = []
    for (topic, qid), _cq in sorted(store.queues.queues.items()):
        result.queues += 1
        where = f"{topic}/{qid}"
        lo, hi = int(store.min_offset(topic, qid)), int(store.max_offset(topic, qid))
        if lo != 0:
            bad.append(f"{where}: min offset {lo}, expected 0 (nothing was deleted)")
        offset = 0
        while offset < hi:
            res = store.get_messages(topic, qid, offset, PULL_BATCH)
            if res.status is not GetStatus.FOUND or not res.records:
                bad.append(f"{where}: offset {offset} of [0, {hi}) unreadable: {res.status.name}")
                break
            for qoff, raw in zip(res.queue_offsets, res.records, strict=True):
                if qoff != offset:
                    bad.append(f"{where}: expected queue offset {offset}, got {qoff} (gap/dup)")
                    offset = qoff
                item = _decode(where, qoff, raw, bad)
                if item is not None:
                    seen.append(item)
                offset += 1
            if res.next_begin_offset != offset:
                bad.append(f"{where}: next_begin_offset {res.next_begin_offset}, read to {offset}")
                offset = max(offset, res.next_begin_offset)
    result.present = len(seen)
    return seen


def _decode(where: str, qoff: int, raw: bytes, bad: list[str]) -> Seen | None:
    at = f"{where}@{qoff}"
    try:
        rec = codec.decode_record(raw)
    except codec.CorruptRecord as exc:
        bad.append(f"{at}: unreadable record: {exc}")
        return None
    topic, qid = where.rsplit("/", 1)
    if (rec.topic, rec.queue_id, rec.queue_offset) != (topic, int(qid), qoff):
        bad.append(f"{at}: unit points at {rec.topic}/{rec.queue_id}@{rec.queue_offset}")
    ids = parse_uniq_key(rec.uniq_key)
    if ids is None:
        bad.append(f"{at}: unique key {rec.uniq_key!r} is not one the writer makes")
        return None
    p = plan(*ids)
    if rec.body != p.body:
        bad.append(f"{at}: body of {rec.uniq_key} differs from what the writer sent")
    if (rec.topic, rec.queue_id, rec.keys, rec.tags) != (p.topic, p.queue_id, p.keys, p.tags):
        bad.append(f"{at}: {rec.uniq_key} has topic/queue/keys/tags other than planned")
    return Seen(
        rec.topic,
        rec.queue_id,
        qoff,
        rec.physical_offset,
        rec.store_timestamp_ms,
        ids[0],
        ids[1],
        rec.uniq_key,
    )


def _check_acks(
    store: MessageStore,
    acks: Sequence[Ack],
    by_position: dict[tuple[str, int, int], Seen],
    bad: list[str],
) -> None:
    for ack in acks:
        where = f"ACK {ack.uniq_key} {ack.topic}/{ack.queue_id}@{ack.queue_offset}"
        ids = parse_uniq_key(ack.uniq_key)
        if ids is None or codec.body_crc(plan(*ids).body) != ack.body_crc:
            bad.append(f"{where}: the writer acked a body other than the planned one")
        s = by_position.get((ack.topic, ack.queue_id, ack.queue_offset))
        if s is None:
            bad.append(f"{where}: acknowledged message LOST (no such queue offset)")
            continue
        if s.uniq_key != ack.uniq_key:
            bad.append(f"{where}: holds {s.uniq_key} instead")
        if s.physical_offset != ack.physical_offset:
            bad.append(f"{where}: at physical {s.physical_offset}, acked at {ack.physical_offset}")
        try:
            rec = store.read_record(ack.physical_offset)
        except codec.CorruptRecord as exc:
            bad.append(f"{where}: read_record({ack.physical_offset}) failed: {exc}")
            continue
        if rec is None or rec.uniq_key != ack.uniq_key:
            bad.append(f"{where}: read_record({ack.physical_offset}) does not return it")


def _check_order(seen: Sequence[Seen], runs: list[int], bad: list[str]) -> None:
    per_queue: dict[tuple[str, int], list[Seen]] = defaultdict(list)
    for s in seen:
        if s.seed not in runs:
            bad.append(f"{s.topic}/{s.queue_id}@{s.queue_offset}: message of unknown run {s.seed}")
            continue
        per_queue[(s.topic, s.queue_id)].append(s)
    for (topic, qid), items in per_queue.items():
        for a, b in itertools.pairwise(items):
            at = f"{topic}/{qid}@{b.queue_offset}"
            if b.physical_offset <= a.physical_offset:
                bad.append(
                    f"{at}: physical offset {b.physical_offset} not after {a.physical_offset}"
                )
            if b.store_timestamp_ms < a.store_timestamp_ms:
                bad.append(
                    f"{at}: store time went back ({a.store_timestamp_ms} → {b.store_timestamp_ms})"
                )
            ra, rb = runs.index(a.seed), runs.index(b.seed)
            if rb < ra or (ra == rb and b.seq <= a.seq):
                bad.append(f"{at}: {b.uniq_key} after {a.uniq_key} (per-queue order broken)")


def _check_prefixes(
    seen: Sequence[Seen], runs: Sequence[int], start_seqs: Mapping[int, int], bad: list[str]
) -> None:
    present: dict[int, list[int]] = defaultdict(list)
    for s in seen:
        present[s.seed].append(s.seq)
    for seed in runs:
        seqs = sorted(present.get(seed, []))
        first = start_seqs.get(seed, 0)
        if seqs and seqs != list(range(first, first + len(seqs))):
            holes = sorted(set(range(first, seqs[-1] + 1)) - set(seqs))
            dups = len(seqs) - len(set(seqs))
            bad.append(
                f"run {seed}: surviving messages are not a prefix of what it appended "
                f"(missing seqs {holes[:10]}{'…' if len(holes) > 10 else ''}, {dups} duplicates)"
            )


def _check_index(
    store: MessageStore, seen: Sequence[Seen], acked: set[str], bad: list[str]
) -> None:
    missing_acked: list[str] = []
    missing_unacked: list[str] = []
    for i, s in enumerate(seen):
        # The exact store time as the range, so the time narrowing is checked too; a sample
        # also over all time (every index file is walked then, which is slow).
        ts = s.store_timestamp_ms
        begin, end = (0, _ALL_TIME_MS) if i % WIDE_QUERY_EVERY == 0 else (ts, ts)
        found = store.query_by_key(s.topic, s.uniq_key, 8, begin, end)
        if s.physical_offset not in {r.physical_offset for r in found}:
            (missing_acked if s.uniq_key in acked else missing_unacked).append(s.uniq_key)
            continue
        if s.uniq_key in acked:
            business = f"order-{s.seed}-{s.seq}"
            found = store.query_by_key(s.topic, business, 8, ts, ts)
            if s.physical_offset not in {r.physical_offset for r in found}:
                missing_acked.append(f"{s.uniq_key} (by key {business})")
    for label, keys in (("acked", missing_acked), ("unacked but present", missing_unacked)):
        if keys:
            bad.append(f"{INDEX_PREFIX}{len(keys)} {label} message(s) not found by key: {keys[:8]}")


def _keep(
    keep_dir: Path,
    store_dir: Path,
    snapshot: Path,
    acks: Sequence[Ack],
    result: CheckResult,
    logs: Iterable[Path],
) -> Path:
    target = keep_dir
    n = 1
    while target.exists():
        n += 1
        target = keep_dir.with_name(f"{keep_dir.name}.{n}")
    target.mkdir(parents=True)
    shutil.copytree(snapshot, target / "before-recovery")
    shutil.copytree(store_dir, target / "after-recovery")
    (target / "acks.txt").write_text("".join(a.line() for a in acks))
    (target / "violations.txt").write_text("\n".join(result.violations) + "\n")
    for log in logs:
        if log.exists():
            shutil.copy2(log, target / log.name)
    return target
