"""The checker: a run's :class:`~tests.robustness.chaos.model.History` against the model.

:func:`validate` runs every check of :mod:`tests.robustness.chaos.model` and returns a
:class:`Verdict`: failures per check (each a sentence naming ids, queues and times relative to
the start of the run, so a failure can be found in the journals), counts, and the recovery time
of every fault. Nothing here starts processes or reads files; the unit tests feed it made-up
histories.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.robustness.chaos.model import (
    MASTER_FAULTS,
    Delivery,
    Expectations,
    Fault,
    History,
    OffsetOp,
    Send,
)

SHOWN_MAX = 15
"""Failures of one check listed in full; the rest are counted."""

QueueKey = tuple[str, str, int]
"""(topic, broker, queue id)."""


@dataclass
class Recovery:
    fault: Fault
    first_ok_ms: float | None
    """Fault start -> end of the first acknowledged send begun after it (to the fault's broker
    group when it names one); None = none followed."""
    longest_gap_ms: float | None = None
    """The longest time without an acknowledged send (to that group) from the fault's start
    until the next fault (or the end): how long writes were really unavailable."""


@dataclass
class Verdict:
    failures: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    recoveries: list[Recovery] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def fail(self, check: str, message: str) -> None:
        self.failures.setdefault(check, []).append(message)

    def summary(self) -> str:
        lines = [" ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))]
        for r in self.recoveries:
            took = "never" if r.first_ok_ms is None else f"{r.first_ok_ms / 1000:.2f} s"
            gap = (
                "" if r.longest_gap_ms is None else f", longest gap {r.longest_gap_ms / 1000:.2f} s"
            )
            lines.append(f"recovery after {r.fault.kind} {r.fault.target}: {took}{gap}")
        for check, msgs in sorted(self.failures.items()):
            if not msgs:
                continue
            lines.append(f"FAILED {check}: {len(msgs)} violation(s)")
            lines += [f"  {m}" for m in msgs[:SHOWN_MAX]]
            if len(msgs) > SHOWN_MAX:
                lines.append(f"  ... and {len(msgs) - SHOWN_MAX} more")
        return "\n".join(lines)


def validate(h: History, exp: Expectations) -> Verdict:
    """Every check; the verdict lists each violation."""
    v = Verdict()
    rel = _Rel(h.t_origin)
    acked = [s for s in h.sends if s.acked]
    v.counts.update(
        sends=len(h.sends),
        acked=len(acked),
        indeterminate=len(h.sends) - len(acked) + len(h.unfinished),
        unfinished=len(h.unfinished),
        in_flight_at_stop=h.in_flight_at_stop,
        deliveries=len(h.deliveries),
        faults=len(h.faults),
        skipped_events=h.skipped,
    )
    _check_loss_and_phantoms(h, exp, acked, v)
    _check_duplicates(h, exp, v)
    _check_send_offsets(acked, rel, v)
    if exp.check_stored:
        _check_stored(h, acked, v)
    _check_consumer_gaps(h, exp, v)
    _check_order(h, exp, acked, rel, v)
    _check_consumer_offsets(h, exp, rel, v)
    _check_timers(h, exp, rel, v)
    _recoveries(h, acked, v)
    return v


class _Rel:
    """Formats monotonic ns as seconds since the start of the run."""

    def __init__(self, origin: int) -> None:
        self.origin = origin

    def __call__(self, t: int) -> str:
        return f"+{(t - self.origin) / 1e9:.3f}s"


def _check_loss_and_phantoms(h: History, exp: Expectations, acked: list[Send], v: Verdict) -> None:
    sent_ids = {s.id for s in h.sends} | h.invoked  # an unfinished send may be stored
    by_group: dict[str, set[str]] = defaultdict(set)
    for d in h.deliveries:
        by_group[d.group].add(d.id)
        if d.id not in sent_ids:
            v.fail("phantom", f"group {d.group} got {d.id!r} ({_where(d)}), which nobody sent")
    for group, topics in sorted(exp.groups.items()):
        got = by_group.get(group, set())
        lost = [s for s in acked if s.topic in topics and s.id not in got]
        v.counts[f"lost[{group}]"] = len(lost)
        for s in lost:
            v.fail(
                "loss",
                f"group {group} never got {s.id} (SEND_OK {s.topic}@{s.broker}#{s.queue} "
                f"offset {s.offset}, sent by {s.proc})",
            )
    if exp.check_stored:
        stored_ids = {st.id for st in h.stored}
        for s in acked:
            if s.id not in stored_ids and s.delay_ms == 0:
                v.fail(
                    "loss",
                    f"{s.id} (SEND_OK {s.topic}@{s.broker}#{s.queue} offset {s.offset}) is "
                    "not stored on the final masters",
                )


def _check_duplicates(h: History, exp: Expectations, v: Verdict) -> None:
    copies = Counter(st.id for st in h.stored)
    per_group: dict[str, Counter[str]] = defaultdict(Counter)
    for d in h.deliveries:
        per_group[d.group][d.id] += 1
    for group in sorted(set(per_group) | set(exp.groups)):
        counter = per_group.get(group, Counter())
        # a message stored twice (a producer retry after a lost answer) is two messages
        dups = sum(max(0, n - max(1, copies.get(i, 1))) for i, n in counter.items())
        v.counts[f"duplicates[{group}]"] = dups
        bound = exp.duplicates_max.get(group)
        if bound is not None and dups > bound:
            worst = ", ".join(f"{i} x{n}" for i, n in counter.most_common(5))
            v.fail(
                "duplicates",
                f"group {group}: {dups} duplicate deliveries > bound {bound} (most: {worst})",
            )
    v.counts["stored_twice"] = sum(1 for n in copies.values() if n > 1)


def _check_send_offsets(acked: list[Send], rel: _Rel, v: Verdict) -> None:
    """Acked offsets unique per queue, and a queue never moves back in real time."""
    per_queue: dict[QueueKey, list[Send]] = defaultdict(list)
    for s in acked:
        if s.delay_ms == 0 and s.queue >= 0:
            per_queue[(s.topic, s.broker, s.queue)].append(s)
    for (topic, broker, q), sends in sorted(per_queue.items()):
        owner: dict[int, Send] = {}
        for s in sends:
            other = owner.setdefault(s.offset, s)
            if other.id != s.id:
                v.fail(
                    "offsets",
                    f"{topic}@{broker}#{q} offset {s.offset} acknowledged twice: {other.id} "
                    f"(at {rel(other.t1)}) and {s.id} (at {rel(s.t1)}); one of them is lost",
                )
        # moving back: a send begun after another's ack must get a higher offset
        by_end = sorted(sends, key=lambda s: s.t1)
        ends = [s.t1 for s in by_end]
        prefix_max: list[Send] = []
        for s in by_end:
            best = prefix_max[-1] if prefix_max else None
            prefix_max.append(s if best is None or s.offset > best.offset else best)
        for s in sends:
            i = bisect.bisect_left(ends, s.t0)  # sends acked strictly before s began
            if i == 0:
                continue
            before = prefix_max[i - 1]
            if s.offset <= before.offset and before.id != s.id:
                v.fail(
                    "offsets",
                    f"{topic}@{broker}#{q} moved back: {before.id} acked at offset "
                    f"{before.offset} ({rel(before.t1)}), then {s.id} begun at {rel(s.t0)} "
                    f"acked at offset {s.offset}",
                )


def _check_stored(h: History, acked: list[Send], v: Verdict) -> None:
    """The final read-back: dense queues, and each acked offset holding its own message."""
    per_queue: dict[QueueKey, dict[int, str]] = defaultdict(dict)
    for st in h.stored:
        per_queue[(st.topic, st.broker, st.queue)][st.offset] = st.id
    for (topic, broker, q), offsets in sorted(per_queue.items()):
        lo, hi = min(offsets), max(offsets)
        missing = [o for o in range(lo, hi + 1) if o not in offsets]
        if missing:
            v.fail(
                "gaps",
                f"{topic}@{broker}#{q} stored offsets {lo}..{hi} miss {len(missing)}: "
                f"{_ranges(missing)}",
            )
    for s in acked:
        if s.delay_ms or s.queue < 0:
            continue
        held = per_queue.get((s.topic, s.broker, s.queue), {}).get(s.offset)
        if held is not None and held != s.id:
            v.fail(
                "offsets",
                f"{s.id} was acked at {s.topic}@{s.broker}#{s.queue} offset {s.offset}, "
                f"which now holds {held}",
            )


def _check_consumer_gaps(h: History, exp: Expectations, v: Verdict) -> None:
    """A group that consumed a queue got every stored offset from its first delivery on."""
    stored: dict[QueueKey, set[int]] = defaultdict(set)
    for st in h.stored:
        stored[(st.topic, st.broker, st.queue)].add(st.offset)
    got: dict[tuple[str, QueueKey], set[int]] = defaultdict(set)
    for d in h.deliveries:
        got[(d.group, (d.topic, d.broker, d.queue))].add(d.offset)
    for (group, qk), offsets in sorted(got.items()):
        if group not in exp.groups or qk not in stored:
            continue
        first = min(offsets)
        skipped = sorted(o for o in stored[qk] if o >= first and o not in offsets)
        if skipped:
            topic, broker, q = qk
            v.fail(
                "gaps",
                f"group {group} skipped {len(skipped)} stored offset(s) of {topic}@{broker}#{q}: "
                f"{_ranges(skipped)}",
            )


def _check_order(h: History, exp: Expectations, acked: list[Send], rel: _Rel, v: Verdict) -> None:
    """Orderly groups: per sharding key, acked messages first arrive in send order; per queue,
    offsets first arrive increasing."""
    seq_of = {s.id: (s.shard, s.seq) for s in acked if s.shard}
    for group in sorted(exp.orderly_groups):
        seen: set[str] = set()
        last: dict[str, tuple[int, Delivery]] = {}
        seen_offsets: set[tuple[QueueKey, int]] = set()
        last_offset: dict[QueueKey, Delivery] = {}
        for d in sorted((d for d in h.deliveries if d.group == group), key=lambda d: d.t):
            qk = (d.topic, d.broker, d.queue)
            if (qk, d.offset) not in seen_offsets:
                seen_offsets.add((qk, d.offset))
                prev_d = last_offset.get(qk)
                if prev_d is not None and d.offset < prev_d.offset:
                    v.fail(
                        "order",
                        f"group {group} {d.topic}@{d.broker}#{d.queue}: offset {d.offset} first "
                        f"delivered at {rel(d.t)} after offset {prev_d.offset} ({rel(prev_d.t)})",
                    )
                last_offset[qk] = d if prev_d is None or d.offset > prev_d.offset else prev_d
            if d.id in seen or d.id not in seq_of:
                continue
            seen.add(d.id)
            shard, seq = seq_of[d.id]
            prev = last.get(shard)
            if prev is not None and seq < prev[0]:
                v.fail(
                    "order",
                    f"group {group} key {shard}: seq {seq} ({d.id}) first delivered at "
                    f"{rel(d.t)}, after seq {prev[0]} ({prev[1].id} at {rel(prev[1].t)})",
                )
            if prev is None or seq > prev[0]:
                last[shard] = (seq, d)


def _check_consumer_offsets(h: History, exp: Expectations, rel: _Rel, v: Verdict) -> None:
    """A fetched offset is not behind a commit acked before the fetch began, except a commit
    acked around a master fault of that broker group (from ``staleness`` before the fault began
    until ``staleness`` after it ended), which a new master may not have synced."""
    commits: dict[tuple[str, QueueKey], list[OffsetOp]] = defaultdict(list)
    fetches: list[OffsetOp] = []
    for op in h.offset_ops:
        key = (op.group, (op.topic, op.broker, op.queue))
        if op.kind == "commit":
            commits[key].append(op)
        elif op.offset >= 0:
            fetches.append(op)
    master_faults = [f for f in h.faults if f.kind in MASTER_FAULTS]
    staleness_ns = exp.offset_staleness_ms * 1_000_000
    for f in fetches:
        qk = (f.topic, f.broker, f.queue)
        prior = [c for c in commits.get((f.group, qk), []) if c.t1 < f.t0]
        if not prior:
            continue
        faults = [m for m in master_faults if m.group in ("", f.broker) and m.t0 < f.t0]
        # a commit is exposed when acked from `staleness` before a master fault began until
        # `staleness` after it ended: a new master may not have synced it
        protected = [
            c
            for c in prior
            if not any(m.t0 - staleness_ns < c.t1 < m.t1 + staleness_ns for m in faults)
        ]
        if not protected:
            continue
        best = max(protected, key=lambda c: c.offset)
        if f.offset < best.offset:
            v.fail(
                "consumer_offsets",
                f"group {f.group} {f.topic}@{f.broker}#{f.queue}: offset read at {rel(f.t0)} "
                f"by {f.proc} is {f.offset}, behind {best.offset} committed by {best.proc} "
                f"(acked at {rel(best.t1)})",
            )


def _check_timers(h: History, exp: Expectations, rel: _Rel, v: Verdict) -> None:
    delayed = {s.id: s for s in h.sends if s.delay_ms > 0}
    slack_ns = exp.timer_early_slack_ms * 1_000_000
    for d in h.deliveries:
        s = delayed.get(d.id)
        if s is not None and d.t < s.t0 + s.delay_ms * 1_000_000 - slack_ns:
            v.fail(
                "timers",
                f"{d.id} (delay {s.delay_ms} ms, sent at {rel(s.t0)}) delivered early at "
                f"{rel(d.t)} to {d.group}",
            )


def _recoveries(h: History, acked: list[Send], v: Verdict) -> None:
    by_end = sorted(acked, key=lambda s: s.t1)
    faults = sorted(h.faults, key=lambda f: f.t0)
    for i, f in enumerate(faults):
        mine = [s for s in by_end if not f.group or s.broker == f.group]
        first = next((s for s in mine if s.t0 >= f.t0), None)
        until = faults[i + 1].t0 if i + 1 < len(faults) else (mine[-1].t1 if mine else f.t1)
        ends = [f.t0] + [s.t1 for s in mine if f.t0 <= s.t1 <= until] + [until]
        gap = max((b - a for a, b in itertools.pairwise(ends)), default=0)
        v.recoveries.append(
            Recovery(f, None if first is None else (first.t1 - f.t0) / 1e6, gap / 1e6)
        )


def _where(d: Delivery) -> str:
    return f"{d.topic}@{d.broker}#{d.queue} offset {d.offset}"


def _ranges(values: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"`` (at most 10 ranges)."""
    out: list[str] = []
    start = prev = None
    for x in sorted(values):
        if start is None:
            start = prev = x
        elif prev is not None and x == prev + 1:
            prev = x
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = x
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(out[:10]) + (f", ... ({len(out)} ranges)" if len(out) > 10 else "")
