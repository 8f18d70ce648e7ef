"""Consumption histories: what every consumer process did, when, and a checker of the orderly
guarantees over them (SPEC §6.15).

Every consumer process (:mod:`tests.integration.workers.orderly_worker`) appends to its own
history file one line per message when a listener call starts and one per message when it
ends, each written with a single ``os.write`` on an ``O_APPEND`` descriptor: a SIGKILL loses at
most the call in progress (its end lines), never a line already written, and a torn last line
is skipped. Each line is a JSON object:

| field    | meaning                                                                    |
|----------|----------------------------------------------------------------------------|
| ``ev``   | ``"start"`` or ``"end"``                                                   |
| ``client``, ``pid`` | the consumer's client id and process id                         |
| ``call`` | the listener call's number in this process (pairs start and end lines)     |
| ``topic``, ``broker``, ``queue`` | the message queue                                  |
| ``offset`` | the message's queue offset                                               |
| ``key``, ``seq`` | the order key and the message's number within it (0, 1, 2, ...)    |
| ``ns``   | ``time.monotonic_ns()`` at call start / end                                |

``CLOCK_MONOTONIC`` is one clock for every process of a host, so times of different workers
compare directly; the test takes its kill times from the same clock.

:func:`check_history` checks, given what was sent and which workers were killed when:

* **exclusive queues**: on each queue no two listener calls overlap in time — neither calls
  of two consumers nor two calls of one consumer. A call with a start and no end (its worker
  was SIGKILLed mid-call) lasts until the kill time; such a call in a worker that was *not*
  killed is a failure of its own.
* **order**: per key, taking start lines in time order, each seq first appears right after
  its predecessor (0, 1, 2, ...): no reorder, no gap. Re-appearances are duplicates.
* **queue order**: per queue, offsets first appear in increasing order.
* **no loss**: every sent (key, seq) was in a call that ended; nothing unsent was consumed.
* **duplicates** are counted; a duplicate is *explained* when the message's first appearance
  was in a worker that was later killed (its offset may not have reached the broker). With
  ``duplicates_only_after_kill`` an unexplained duplicate fails the check: a clean hand-over
  persists the offset before it releases the lock.
* every key's messages were in one queue (the premise of per-key order), and every call took
  messages of one queue only (an orderly batch never mixes queues).

Failures read like ``queue Orders@broker-a#3: call 17 of 10.0.0.1@123#1 (pid 123) from
+1.204 s to +1.260 s overlaps call 4 of 10.0.0.1@456#1 (pid 456) from +1.230 s to +1.290 s
(killed)``; times are relative to the first event of the history.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KEY_PROPERTY = "order_key"
"""User property holding a message's order key (also its sharding key)."""
SEQ_PROPERTY = "order_seq"
"""User property holding a message's number within its key, from 0."""

START = "start"
END = "end"
SHOWN_MAX = 20
"""Failures of one kind listed in full; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to a listener call, as a worker records it."""

    topic: str
    broker: str
    queue: int
    offset: int
    key: str
    seq: int


def encode_lines(
    ev: str, client: str, pid: int, call: int, deliveries: Sequence[Delivery], ns: int
) -> bytes:
    """The history lines of one call's start or end, for one ``os.write``."""
    assert ev in (START, END)
    out = []
    for d in deliveries:
        out.append(
            json.dumps(
                {
                    "ev": ev,
                    "client": client,
                    "pid": pid,
                    "call": call,
                    "topic": d.topic,
                    "broker": d.broker,
                    "queue": d.queue,
                    "offset": d.offset,
                    "key": d.key,
                    "seq": d.seq,
                    "ns": ns,
                },
                separators=(",", ":"),
            )
        )
    return ("\n".join(out) + "\n").encode() if out else b""


def append_fd(path: str | Path) -> int:
    """An ``O_APPEND`` descriptor for :func:`encode_lines` output (one write = whole lines)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


@dataclass(frozen=True, slots=True)
class Event:
    """One parsed history line."""

    ev: str
    client: str
    pid: int
    call: int
    topic: str
    broker: str
    queue: int
    offset: int
    key: str
    seq: int
    ns: int
    line: int
    """Line number in its file: orders the messages of one call (same ``ns``)."""

    @property
    def queue_name(self) -> str:
        return f"{self.topic}@{self.broker}#{self.queue}"

    def sort_key(self) -> tuple[int, int, int]:
        return (self.ns, self.pid, self.line)


@dataclass
class History:
    """The events of several history files."""

    events: list[Event] = field(default_factory=list)
    torn_lines: int = 0
    """Lines that did not parse (a kill landing mid-write would leave one at a file's end)."""


def parse_history(text: str, into: History | None = None) -> History:
    """Parse one worker's history file content."""
    hist = into if into is not None else History()
    for n, raw in enumerate(text.splitlines()):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
            hist.events.append(
                Event(
                    str(d["ev"]),
                    str(d["client"]),
                    int(d["pid"]),
                    int(d["call"]),
                    str(d["topic"]),
                    str(d["broker"]),
                    int(d["queue"]),
                    int(d["offset"]),
                    str(d["key"]),
                    int(d["seq"]),
                    int(d["ns"]),
                    n,
                )
            )
        except (ValueError, KeyError, TypeError):
            hist.torn_lines += 1
    return hist


def load_histories(paths: Iterable[str | Path]) -> History:
    """Parse every existing file of ``paths`` (a worker killed before its first call has none)."""
    hist = History()
    for p in paths:
        path = Path(p)
        if path.exists():
            parse_history(path.read_text(errors="replace"), hist)
    return hist


# ---- the checker ------------------------------------------------------------------------------


@dataclass
class ConsumerStats:
    """What one worker did."""

    client: str
    pid: int
    calls: int = 0
    messages: int = 0
    """Messages in completed calls."""
    queues: set[str] = field(default_factory=set)
    first_ns: int = 0
    last_ns: int = 0
    killed_ns: int | None = None
    open_calls: int = 0
    """Calls started and never ended (only a killed worker may have one)."""


@dataclass
class _Call:
    pid: int
    client: str
    call: int
    queues: set[str]
    start_ns: int
    end_ns: int | None
    killed: bool = False

    def label(self, fmt: _Times) -> str:
        end = "(killed)" if self.killed else ""
        stop = fmt(self.end_ns) if self.end_ns is not None else "?"
        return (
            f"call {self.call} of {self.client} (pid {self.pid}) from {fmt(self.start_ns)} "
            f"to {stop}{' ' + end if end else ''}"
        )


class _Times:
    """Formats monotonic ns relative to the history's first event."""

    def __init__(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns

    def __call__(self, ns: int) -> str:
        return f"+{(ns - self.t0_ns) / 1e9:.3f} s"


@dataclass
class HistoryReport:
    """Counts and failures of :func:`check_history`; ``ok`` when nothing failed."""

    consumers: dict[int, ConsumerStats] = field(default_factory=dict)
    events: int = 0
    calls: int = 0
    expected: int = 0
    """Distinct (key, seq) sent."""
    consumed: int = 0
    """Distinct sent (key, seq) in a completed call."""
    duplicates: int = 0
    """Start appearances of a (key, seq) after its first one."""
    duplicates_unexplained: int = 0
    """Duplicates whose first appearance was not in a killed worker."""
    span_ns: int = 0
    torn_lines: int = 0
    overlaps: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    lost: list[tuple[str, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Everything else that fails: unexplained duplicates, unsent messages, calls never ended
    by a live worker, keys in several queues, calls over several queues."""

    @property
    def ok(self) -> bool:
        return not (self.overlaps or self.order_violations or self.lost or self.problems)

    def failures(self) -> list[str]:
        out: list[str] = []
        for title, items in (
            ("overlapping calls on one queue", self.overlaps),
            ("order violations", self.order_violations),
            ("other problems", self.problems),
        ):
            if items:
                out.append(f"{title} ({len(items)}):")
                out += [f"  {s}" for s in items[:SHOWN_MAX]]
                if len(items) > SHOWN_MAX:
                    out.append(f"  ... and {len(items) - SHOWN_MAX} more")
        if self.lost:
            shown = ", ".join(f"{k}/{s}" for k, s in self.lost[:SHOWN_MAX])
            more = (
                f" ... and {len(self.lost) - SHOWN_MAX} more" if len(self.lost) > SHOWN_MAX else ""
            )
            out.append(f"lost ({len(self.lost)} of {self.expected}): {shown}{more}")
        return out

    def summary(self) -> str:
        """A few lines: totals, then one line per consumer."""
        lines = [
            f"history: {self.events} events, {self.calls} calls over {self.span_ns / 1e9:.2f} s; "
            f"consumed {self.consumed}/{self.expected}, duplicates {self.duplicates} "
            f"({self.duplicates_unexplained} unexplained), overlaps {len(self.overlaps)}, "
            f"order violations {len(self.order_violations)}, lost {len(self.lost)}, "
            f"torn lines {self.torn_lines}"
        ]
        t0 = min((c.first_ns for c in self.consumers.values()), default=0)
        for c in sorted(self.consumers.values(), key=lambda c: c.first_ns):
            killed = f", killed at +{(c.killed_ns - t0) / 1e9:.2f} s" if c.killed_ns else ""
            lines.append(
                f"  {c.client} (pid {c.pid}): {c.messages} msgs in {c.calls} calls, "
                f"{len(c.queues)} queues, active +{(c.first_ns - t0) / 1e9:.2f} s .. "
                f"+{(c.last_ns - t0) / 1e9:.2f} s{killed}"
            )
        return "\n".join(lines)

    def assert_ok(self) -> None:
        assert self.ok, (
            "history check failed:\n" + "\n".join(self.failures()) + "\n\n" + (self.summary())
        )


def check_history(
    history: History | Sequence[Event],
    sent: Iterable[tuple[str, int]],
    killed: Mapping[int, int] | None = None,
    *,
    duplicates_only_after_kill: bool = True,
) -> HistoryReport:
    """Check ``history`` against the acknowledged sends ``sent`` ((key, seq) pairs).

    ``killed`` maps the pid of every SIGKILLed worker to a monotonic ns taken after the kill
    returned (an upper bound of its last moment).
    """
    if isinstance(history, History):
        events, torn = history.events, history.torn_lines
    else:
        events, torn = list(history), 0
    killed = dict(killed or {})
    events = sorted(events, key=Event.sort_key)
    rep = HistoryReport(events=len(events), torn_lines=torn)
    if events:
        rep.span_ns = events[-1].ns - events[0].ns
    fmt = _Times(events[0].ns if events else 0)
    calls = _collect_calls(events, killed, rep, fmt)
    rep.calls = len(calls)
    _check_overlaps(calls, rep, fmt)
    _check_order(events, killed, rep, fmt, duplicates_only_after_kill)
    _check_queue_order(events, rep, fmt)
    _check_loss(events, set(sent), rep)
    return rep


def _collect_calls(
    events: list[Event], killed: Mapping[int, int], rep: HistoryReport, fmt: _Times
) -> list[_Call]:
    calls: dict[tuple[int, int], _Call] = {}
    for e in events:
        stats = rep.consumers.get(e.pid)
        if stats is None:
            stats = rep.consumers[e.pid] = ConsumerStats(e.client, e.pid, first_ns=e.ns)
            stats.killed_ns = killed.get(e.pid)
        stats.last_ns = max(stats.last_ns, e.ns)
        stats.queues.add(e.queue_name)
        c = calls.get((e.pid, e.call))
        if c is None:
            c = calls[(e.pid, e.call)] = _Call(e.pid, e.client, e.call, set(), e.ns, None)
        c.queues.add(e.queue_name)
        if e.ev == START:
            c.start_ns = min(c.start_ns, e.ns)
        else:
            c.end_ns = e.ns if c.end_ns is None else max(c.end_ns, e.ns)
            stats.messages += 1
    for c in calls.values():
        rep.consumers[c.pid].calls += 1
        if len(c.queues) > 1:
            rep.problems.append(
                f"{c.label(fmt)} took messages of several queues: {', '.join(sorted(c.queues))}"
            )
        if c.end_ns is not None:
            continue
        rep.consumers[c.pid].open_calls += 1
        if c.pid in killed:
            c.end_ns, c.killed = killed[c.pid], True
        else:
            rep.problems.append(
                f"{c.label(fmt)} on {', '.join(sorted(c.queues))} never ended, "
                "though its worker was not killed"
            )
            c.end_ns = c.start_ns
    return sorted(calls.values(), key=lambda c: (c.start_ns, c.pid, c.call))


def _check_overlaps(calls: list[_Call], rep: HistoryReport, fmt: _Times) -> None:
    by_queue: dict[str, list[_Call]] = defaultdict(list)
    for c in calls:
        for q in c.queues:
            by_queue[q].append(c)
    for q in sorted(by_queue):
        latest: _Call | None = None  # the call with the latest end so far
        for c in by_queue[q]:  # sorted by start
            assert c.end_ns is not None
            if latest is not None:
                assert latest.end_ns is not None
                if latest.end_ns > c.start_ns:
                    rep.overlaps.append(f"queue {q}: {latest.label(fmt)} overlaps {c.label(fmt)}")
            if latest is None or c.end_ns > (latest.end_ns or 0):
                latest = c


def _check_order(
    events: list[Event],
    killed: Mapping[int, int],
    rep: HistoryReport,
    fmt: _Times,
    duplicates_only_after_kill: bool,
) -> None:
    next_seq: dict[str, int] = defaultdict(int)
    first: dict[tuple[str, int], Event] = {}
    queues_of_key: dict[str, set[str]] = defaultdict(set)
    unexplained: list[str] = []
    for e in events:
        if e.ev != START:
            continue
        queues_of_key[e.key].add(e.queue_name)
        seen = first.get((e.key, e.seq))
        if seen is not None:
            rep.duplicates += 1
            if seen.pid not in killed:
                rep.duplicates_unexplained += 1
                unexplained.append(
                    f"key {e.key} seq {e.seq} (offset {e.offset} of {e.queue_name}) consumed "
                    f"again by {e.client} (pid {e.pid}) at {fmt(e.ns)}; first by {seen.client} "
                    f"(pid {seen.pid}) at {fmt(seen.ns)}, which was not killed"
                )
            continue
        first[(e.key, e.seq)] = e
        expected = next_seq[e.key]
        if e.seq != expected:
            what = "late (after a later one)" if e.seq < expected else f"before seq {expected}"
            rep.order_violations.append(
                f"key {e.key}: seq {e.seq} (offset {e.offset} of {e.queue_name}) first consumed "
                f"at {fmt(e.ns)} by {e.client} (pid {e.pid}), {what}"
            )
        next_seq[e.key] = max(expected, e.seq + 1)
    if duplicates_only_after_kill:
        rep.problems += [f"unexplained duplicate: {u}" for u in unexplained]
    for key in sorted(queues_of_key):
        if len(queues_of_key[key]) > 1:
            rep.problems.append(
                f"key {key} was consumed from several queues: "
                f"{', '.join(sorted(queues_of_key[key]))} (per-key order needs one queue)"
            )


def _check_queue_order(events: list[Event], rep: HistoryReport, fmt: _Times) -> None:
    seen: dict[str, set[int]] = defaultdict(set)
    highest: dict[str, Event] = {}
    for e in events:
        if e.ev != START or e.offset in seen[e.queue_name]:
            continue
        seen[e.queue_name].add(e.offset)
        top = highest.get(e.queue_name)
        if top is not None and e.offset < top.offset:
            rep.order_violations.append(
                f"queue {e.queue_name}: offset {e.offset} first consumed at {fmt(e.ns)} by "
                f"{e.client} (pid {e.pid}), after offset {top.offset} at {fmt(top.ns)} by "
                f"{top.client} (pid {top.pid})"
            )
            continue
        highest[e.queue_name] = e


def _check_loss(events: list[Event], sent: set[tuple[str, int]], rep: HistoryReport) -> None:
    done = {(e.key, e.seq) for e in events if e.ev == END}
    rep.expected = len(sent)
    rep.consumed = len(done & sent)
    rep.lost = sorted(sent - done)
    unsent = sorted(done - sent)
    if unsent:
        shown = ", ".join(f"{k}/{s}" for k, s in unsent[:SHOWN_MAX])
        rep.problems.append(f"{len(unsent)} consumed messages were never sent: {shown}")
