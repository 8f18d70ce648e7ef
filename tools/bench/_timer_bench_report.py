"""Measurement and report of the timer-wheel benchmark (:mod:`tools.bench.timer_bench`).

What the orchestrating process watches while the load runs, and the table it prints at the end:

- :class:`StatsPoller` polls the timer-wheel's ``GetTimerStats`` (scheduled, delivered, pending,
  due per second, lateness p50/p99/max) and its RSS from ``/proc`` into a timeline of
  :class:`Sample`, and waits on it: a phase ends when a condition holds, when nothing moved for
  STALL_S, or at a deadline;
- :class:`Profiler` records py-spy profiles of the services for one phase (``--profile``);
- :class:`Outcome` gathers every figure, and :func:`print_report` turns it into the rich table
  and the verdict against issue 5's target (TARGET_FIRED_PER_S fired on time).

Kept apart from ``timer_bench.py`` (the plan and the phases that drive the run) and
``_timer_bench_load.py`` (the sender and consumer processes): this side only observes and
reports, so the figures and how they are computed can be read in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
from rich.console import Console
from rich.table import Table

from rocketq._api.rocketq.v1 import timer_pb2, timer_pb2_grpc
from tools.bench._timer_bench_load import ON_TIME_MS, now_ms, stop_process

if TYPE_CHECKING:
    from tools.bench.timer_bench import Plan

TARGET_FIRED_PER_S = 20_000
"""Issue 5's target: timers fired on time per second."""
POLL_S = 1.0
"""GetTimerStats period while timers are due. Not shorter: with no slot open, a stats call
scans the whole wheel (~75 ms of the timer-wheel's CPU)."""
PROGRESS_EVERY_S = 5.0
STALL_S = 60.0
"""Stop waiting for a phase when nothing moved for this long."""


# ---- processes --------------------------------------------------------------------------------
def proc_status_kib(pid: int, field_name: str) -> int:
    """A ``/proc/PID/status`` memory field (VmRSS, VmHWM) in KiB; 0 when unreadable."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


class Profiler:
    """py-spy record of the target processes for one phase (collapsed stacks) with --profile."""

    def __init__(self, out_dir: Path | None, targets: dict[str, int]) -> None:
        self.out_dir = out_dir
        self.targets = targets
        self._procs: list[subprocess.Popen[bytes]] = []
        exe = Path(sys.executable).with_name("py-spy")
        self.exe = str(exe) if exe.exists() else shutil.which("py-spy")

    def start(self, phase: str) -> None:
        if self.out_dir is None or self.exe is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.targets.items():
            argv = [self.exe, "record", "--pid", str(pid), "--format", "raw", "--rate", "50"]
            argv += ["--nonblocking", "--output", str(self.out_dir / f"{name}-{phase}.txt")]
            self._procs.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

    def stop(self) -> None:
        for p in self._procs:
            stop_process(p, signal.SIGINT)  # py-spy writes its output on SIGINT
        self._procs.clear()


# ---- timer statistics -------------------------------------------------------------------------
class Sample(NamedTuple):
    t_ms: int
    scheduled: int
    delivered: int
    pending: int
    due_per_s: float
    p50_ms: int
    p99_ms: int
    max_ms: int
    rss_kib: int
    anon_kib: int
    """RssAnon: the heap; the rest of VmRSS is mapped file pages (logs, wheel)."""


class StatsPoller:
    """Polls GetTimerStats and the timer-wheel's RSS into a timeline, and waits on it."""

    def __init__(self, addr: str, pid: int) -> None:
        self.addr = addr
        self.pid = pid
        self.samples: list[Sample] = []
        self.load_max = 0.0
        """Highest 1-minute load average seen (the machine may be shared)."""

    async def __aenter__(self) -> StatsPoller:
        self._channel = grpc.aio.insecure_channel(self.addr)
        self._stub = timer_pb2_grpc.TimerAdminStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close()

    async def poll(self) -> Sample | None:
        self.load_max = max(self.load_max, os.getloadavg()[0])
        try:
            r = await self._stub.GetTimerStats(timer_pb2.GetTimerStatsRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            return None
        rss, anon = proc_status_kib(self.pid, "VmRSS"), proc_status_kib(self.pid, "RssAnon")
        s = Sample(now_ms(), r.scheduled_total, r.delivered_total, r.pending_timers,
                   r.due_per_second, r.lateness_p50_ms, r.lateness_p99_ms, r.lateness_max_ms,
                   rss, anon)  # fmt: skip
        self.samples.append(s)
        return s

    @property
    def last(self) -> Sample:
        return self.samples[-1] if self.samples else Sample(now_ms(), 0, 0, 0, 0.0, 0, 0, 0, 0, 0)

    async def wait(
        self,
        done: Callable[[Sample], bool],
        what: str,
        *,
        deadline_ms: int = 0,
        progress: Callable[[], object] = lambda: None,
        report: Callable[[Sample], str] | None = None,
        poll_s: float = POLL_S,
    ) -> bool:
        """Poll until ``done(sample)``. False after STALL_S without movement (timer counters
        or ``progress()``) or past ``deadline_ms``. ``report`` makes a progress line."""
        moved_at = printed_at = time.monotonic()
        mark: object = None
        while True:
            s = await self.poll()
            if s is not None:
                if done(s):
                    return True
                if (s.scheduled, s.delivered, progress()) != mark:
                    moved_at, mark = time.monotonic(), (s.scheduled, s.delivered, progress())
                if report is not None and time.monotonic() - printed_at >= PROGRESS_EVERY_S:
                    printed_at = time.monotonic()
                    print("   " + report(s), flush=True)
            if time.monotonic() - moved_at > STALL_S or (deadline_ms and now_ms() > deadline_ms):
                print(f"   gave up waiting for {what}: {self.last}", flush=True)
                return False
            await asyncio.sleep(poll_s)


@dataclass
class Outcome:
    """Everything the table shows."""

    plan: Plan
    load_start: float
    lead_s: float = 0.0
    window_start_ms: int = 0
    probe_rate: float = 0.0
    probe_stats: Sample | None = None
    sends: dict[str, Any] = field(default_factory=dict)
    """Sender totals (:func:`send_totals`)."""
    durable_ms: int = 0
    idle: Sample | None = None
    """After the probe."""
    at_pending: Sample | None = None
    delivered_ms: int = 0
    delivered: int = 0
    fire_samples: list[Sample] = field(default_factory=list)
    rss_peak_kib: int = 0
    load_max_schedule: float = 0.0
    load_max_fire: float = 0.0
    consumer: dict[str, Any] = field(default_factory=dict)


# ---- report -----------------------------------------------------------------------------------
def _rate(count: int, start_ms: int, end_ms: int) -> str:
    return f"{count / (end_ms - start_ms) * 1000:,.0f}/s" if count > 0 < end_ms - start_ms else "-"


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB" if kib else "-"


def _rss(s: Sample | None) -> str:
    return f"{_mib(s.rss_kib)} (heap {_mib(s.anon_kib)})" if s else "-"


def _per_timer(idle: Sample | None, s: Sample) -> str:
    """Growth from idle per pending timer: all of RSS, and the heap (RssAnon) alone."""
    n = max(1, s.pending - (idle.pending if idle else 0))
    rss, anon = (s.rss_kib - idle.rss_kib, s.anon_kib - idle.anon_kib) if idle else (0, 0)
    return f"{rss * 1024 / n:,.0f} B (heap {anon * 1024 / n:,.0f} B)"


def _lateness(c: dict[str, Any], name: str) -> str:
    if not c:
        return "-"
    values = [c[f"{name}_{k}_ms"] for k in ("p50", "p99", "p999", "max")]
    return " / ".join(f"{v:,.0f}" for v in values) + " ms"


def _fire_rows(out: Outcome) -> list[tuple[str, str, str]]:
    plan, c, fs = out.plan, out.consumer, out.fire_samples
    window_s = plan.window_ms / 1000
    seconds = {int(k): v for k, v in c.get("store_seconds", {}).items()}
    timed, on_time = int(c.get("timed", 0)), int(c.get("store_on_time", 0))
    worst = f"worst seen p99 {max((s.p99_ms for s in fs), default=0)}, max " + str(
        max((s.max_ms for s in fs), default=0)
    )
    return [
        ("due rate", f"{plan.pending / window_s:,.0f}/s", f"{plan.pending:,} over {window_s:g} s"),
        (
            "fired/s (delivered_total)",
            _rate(out.delivered, out.window_start_ms, out.delivered_ms),
            f"window start to last delivery (±{POLL_S:g} s)" if out.delivered_ms else "unfinished",
        ),
        (
            "fired/s (re-put store times)",
            _rate(timed, out.window_start_ms, int(c.get("store_last_ms", 0))),
            f"busiest second {max(seconds.values(), default=0):,}",
        ),
        (
            "due_per_second (stats, max)",
            f"{max((s.due_per_s for s in fs), default=0):,.0f}",
            "GetTimerStats averages over 10 s",
        ),
        (
            "lateness, GetTimerStats",
            f"{fs[-1].p50_ms} / {fs[-1].p99_ms} / {fs[-1].max_ms} ms" if fs else "-",
            f"p50/p99/max of the last 10 000; {worst}",
        ),
        ("lateness, store − due", _lateness(c, "store"), "p50 / p99 / p99.9 / max"),
        ("lateness, receive − due", _lateness(c, "recv"), "with the consumer's lag"),
        (
            f"fired on time (≤ {ON_TIME_MS} ms)",
            f"{on_time / max(1, timed):.2%}",
            f"{on_time:,} of {timed:,} delivered by the wheel; {on_time / window_s:,.0f}/s",
        ),
    ]


def _send_rows(out: Outcome) -> list[tuple[str, str, str]]:
    t, pending = out.sends, out.at_pending
    errors = ", ".join(f"{k} {v}" for k, v in sorted(t.get("errors", {}).items()))
    note = (
        f"{t.get('failed', 0)} failed attempts{f' ({errors})' if errors else ''}, "
        f"{t.get('lost', 0)} given up, {t.get('overdue', 0)} acknowledged after due"
    )
    sent, first_ms = int(t.get("sent", 0)), int(t.get("first_ms", 0))
    idle = out.idle
    return [
        ("scheduled/s, send side", _rate(sent, first_ms, int(t.get("last_ms", 0))), note),
        (
            "scheduled/s, timer side (durable)",
            _rate(sent - int(t.get("overdue", 0)), first_ms, out.durable_ms),
            "first send to scheduled_total reaching N" if out.durable_ms else "did not finish",
        ),
        ("timer-wheel RSS idle", _rss(idle), "after the probe"),
        (
            "timer-wheel RSS at N pending",
            _rss(pending),
            f"{pending.pending:,} pending; per timer {_per_timer(idle, pending)}"
            if pending
            else "",
        ),
        ("timer-wheel RSS peak (VmHWM)", _mib(out.rss_peak_kib), ""),
    ]


def print_report(out: Outcome) -> None:
    plan, c, probe_s = out.plan, out.consumer, out.probe_stats
    rows: list[tuple[str, str, str]] = [
        ("timers", f"{plan.pending:,}", f"{plan.senders} sender(s), lead {out.lead_s:.0f} s"),
        *_send_rows(out),
        *_fire_rows(out),
        (
            "early deliveries",
            f"{c.get('early_store', '-')} stored / {c.get('early_recv', '-')} received",
            "before their due time: must be 0",
        ),
        (
            "missing / redelivered",
            f"{plan.pending - int(c.get('distinct', 0)):,} / {c.get('redelivered', '-')}",
            f"resent by the producer {c.get('resent', '-')}, stored directly (sent after due) "
            f"{c.get('direct', '-')}, TIMER_OUT_MS differs {c.get('out_mismatch', '-')}",
        ),
        (
            "light load (probe)",
            f"{probe_s.p50_ms} / {probe_s.p99_ms} / {probe_s.max_ms} ms" if probe_s else "-",
            f"GetTimerStats p50/p99/max; {plan.probe:,} timers, sent at {out.probe_rate:,.0f}/s",
        ),
        (
            "load average (1 min)",
            f"{out.load_start:.1f} / {out.load_max_schedule:.1f} / {out.load_max_fire:.1f}",
            f"at start / max while scheduling / max while firing; {os.cpu_count()} cores",
        ),
    ]
    table = Table(title=f"Timer-wheel benchmark, {plan.pending:,} timers, one broker")
    for name in ("figure", "value", "note"):
        table.add_column(name, justify="right" if name == "value" else "left")
    for row in rows:
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(table)
    due_rate = plan.pending / (plan.window_ms / 1000)
    share = int(c.get("store_on_time", 0)) / max(1, int(c.get("timed", 0)))
    met = due_rate >= TARGET_FIRED_PER_S and share >= 0.99
    console.print(
        f"target >= {TARGET_FIRED_PER_S:,} timers/s fired on time: "
        f"{'met' if met else 'NOT met'} (due rate {due_rate:,.0f}/s, {share:.1%} on time)"
    )
    if out.sends.get("overdue"):
        console.print(
            f"{out.sends['overdue']:,} timers were acknowledged after their due time (sending "
            "was slower than the probe); a larger --lead-s avoids that"
        )
    busy = 2 * (os.cpu_count() or 1)
    if max(out.load_max_schedule, out.load_max_fire) > busy:
        console.print(
            "the machine was busy with other work while "
            + ("timers fired" if out.load_max_fire > busy else "scheduling")
            + ": these figures understate RocketQ"
        )
