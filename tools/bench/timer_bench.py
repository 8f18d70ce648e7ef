"""Timer-wheel benchmark: schedule N timers due in the same few seconds, measure, never assert.

    python -m tools.bench.timer_bench [--quick] [--pending N] [--window-s S] [--senders P]
                                      [--lead-s S] [--profile DIR] [--keep]

It starts its own nameserver, broker and timer-wheel service (:mod:`tests.integration.cluster`,
loopback ports, data in a temporary directory, removed afterwards), then:

| phase     | what happens                                                                        |
|-----------|-------------------------------------------------------------------------------------|
| probe     | 1 % of N (2 000..10 000) timers on a side topic, due 20 s on: the send rate that    |
|           | sets the lead, and a light-load lateness sample                                     |
| schedule  | N timers (1 000 000; 100 000 with ``--quick``), one ``send_async`` each (a delayed  |
|           | message cannot be batched), ``--senders`` processes with IN_FLIGHT_TOTAL sends in   |
|           | flight, in random order of delivery time; all fall due in a window that opens after |
|           | the sends (the lead) and lasts ``--window-s`` (default N / 20 000 s: 20 000 a second)|
| pending   | once the timer-wheel reports all N durable: its RSS (VmRSS and RssAnon, /proc)      |
| fire      | the window passes; a consumer process receives every re-put message                 |

Figures (a rich table at the end):

- scheduled/s, send side (acknowledged sends) and timer side (``scheduled_total`` of
  GetTimerStats: read from the broker and made durable);
- fired/s: ``delivered_total`` from the window's start to the last delivery, and the re-puts'
  store timestamps (busiest second);
- lateness: GetTimerStats' p50/p99/max (its last 10 000 deliveries; the worst seen while
  firing), and per message from the consumer: broker store time of the re-put − due time (the
  timer-wheel's part) and receive time − due time (with the consumer's lag); "on time" means
  stored at most ``ON_TIME_MS`` after the due time;
- the timer-wheel's RSS idle and at N pending, its peak (VmHWM), and bytes per pending timer.

The target to compare against (issue 5): >= 20 000 timers/s fired on time. Producer, broker,
timer-wheel and consumer share one machine, so the figures say as much about the machine as
about RocketQ (the table shows the load average). ``--profile DIR`` records py-spy profiles
(collapsed stacks, ``DIR/<process>-<phase>.txt``) of the timer-wheel and the broker during the
schedule and fire phases. Sender and consumer run as this module in worker mode (``--worker
send|consume --spec JSON``), so the orchestrating process only polls statistics.

Three modules: this one has the plan, the phases (probe, schedule, fire) and ``main``;
``_timer_bench_load.py`` the load generator (the sender and consumer workers, which run in
other processes, and the handle on them); ``_timer_bench_report.py`` the measurement (the
GetTimerStats/RSS timeline, py-spy) and the table. The names are re-exported here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocketq.cli._bench import ensure_topic
from services.common import launch, supervisor
from services.common.supervisor import Process, StopTimeout
from tools.bench._timer_bench_load import (
    DUE_PROP,
    ON_TIME_MS,
    SEND_ATTEMPTS_MAX,
    SEND_TIMEOUT_MS,
    SEQ_PROP,
    Worker,
    consume_worker,
    now_ms,
    send_totals,
    send_worker,
    senders_done,
    spawn_worker,
    stop_process,
)
from tools.bench._timer_bench_report import (
    POLL_S,
    PROGRESS_EVERY_S,
    STALL_S,
    TARGET_FIRED_PER_S,
    Outcome,
    Profiler,
    Sample,
    StatsPoller,
    print_report,
    proc_status_kib,
)

__all__ = [
    "BODY_BYTES",
    "DUE_PROP",
    "ENQUEUE_SLACK_S",
    "IN_FLIGHT_TOTAL",
    "LEAD_MIN_S",
    "LEAD_SLACK",
    "ON_TIME_MS",
    "PENDING_DEFAULT",
    "PENDING_QUICK",
    "POLL_S",
    "PROBE_DELAY_MS",
    "PROBE_MAX",
    "PROBE_MIN",
    "PROGRESS_EVERY_S",
    "QUEUES",
    "SCHEDULE_POLL_S",
    "SEND_ATTEMPTS_MAX",
    "SEND_TIMEOUT_MS",
    "SEQ_PROP",
    "STALL_S",
    "TARGET_FIRED_PER_S",
    "WORKER_READY_S",
    "Outcome",
    "Plan",
    "Profiler",
    "Run",
    "Sample",
    "StatsPoller",
    "Worker",
    "consume_worker",
    "fire",
    "main",
    "now_ms",
    "print_report",
    "probe",
    "proc_status_kib",
    "run_phases",
    "schedule",
    "send_worker",
    "spawn_worker",
    "start_services",
]

PENDING_DEFAULT = 1_000_000
PENDING_QUICK = 100_000
QUEUES = 8
BODY_BYTES = 128
IN_FLIGHT_TOTAL = 256
"""send_async calls outstanding over all sender processes: enough to keep the broker busy;
more only queues requests in it and times them out on a loaded machine."""
PROBE_MIN, PROBE_MAX = 2_000, 10_000
PROBE_DELAY_MS = 20_000
"""Probe timers fall due this long after the probe starts: sent and durable well before."""
LEAD_MIN_S = 20.0
LEAD_SLACK = 1.5
"""Lead = estimated send time x this + ENQUEUE_SLACK_S, so every timer is sent before due."""
ENQUEUE_SLACK_S = 15.0
SCHEDULE_POLL_S = 5.0
"""GetTimerStats period while scheduling (the scans would slow the enqueue side measured)."""
WORKER_READY_S = 60.0


# ---- the run ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    pending: int
    window_ms: int
    senders: int
    lead_s: float | None
    profile: Path | None = None

    @property
    def probe(self) -> int:
        return max(PROBE_MIN, min(PROBE_MAX, self.pending // 100))


@dataclass
class Run:
    """What the phases share."""

    plan: Plan
    base: Path
    namesrv: list[str]
    poller: StatsPoller
    out: Outcome
    workers: list[Worker]

    def spawn_senders(self, phase: str, topic: str, count: int, **spec: Any) -> list[Worker]:
        senders = self.plan.senders
        share, extra = divmod(count, senders)
        started, first = [], 0
        for i in range(senders):
            n = share + (i < extra)
            spec.update(namesrv=self.namesrv, topic=topic, first=first, count=n, seed=i + count)
            spec.update(in_flight=max(16, IN_FLIGHT_TOTAL // senders), body_bytes=BODY_BYTES)
            started.append(spawn_worker(self.base, f"{phase}-{i}", "send", spec, self.workers))
            first += n
        return started


async def probe(run: Run) -> None:
    """Send the probe timers, wait for them to fire: send rate and light-load lateness."""
    plan, out, poller = run.plan, run.out, run.poller
    due_ms = now_ms() + PROBE_DELAY_MS
    workers = run.spawn_senders("probe", "TimerBenchProbe", plan.probe, window_start_ms=due_ms,
                                window_ms=1_000)  # fmt: skip
    await poller.wait(lambda s: senders_done(workers), "probe sends")
    t = send_totals(workers)
    out.probe_rate = t["sent"] / max(1, t["last_ms"] - t["first_ms"]) * 1000
    print(f"   probe: {t['sent']} timers at {out.probe_rate:,.0f}/s; waiting for them", flush=True)
    expect = t["sent"] - t["overdue"]
    await poller.wait(lambda s: s.delivered >= expect, "probe", deadline_ms=due_ms + 60_000)
    out.probe_stats = poller.last


async def schedule(run: Run, topic: str) -> None:
    """Send N timers due in the window, then wait until the timer-wheel holds all durable."""
    plan, out, poller = run.plan, run.out, run.poller
    base_scheduled = poller.last.scheduled
    workers = run.spawn_senders("main", topic, plan.pending, window_start_ms=out.window_start_ms,
                                window_ms=plan.window_ms)  # fmt: skip

    def report(s: Sample) -> str:
        return (
            f"sent {send_totals(workers)['sent']:,}, timer-wheel scheduled "
            f"{s.scheduled - base_scheduled:,}, pending {s.pending:,}, RSS {s.rss_kib >> 10} MiB"
        )

    def sent() -> int:
        return int(send_totals(workers)["sent"])

    await poller.wait(
        lambda s: senders_done(workers),
        "sends",
        progress=sent,
        report=report,
        poll_s=SCHEDULE_POLL_S,
    )
    out.sends = t = send_totals(workers)
    timers = t["sent"] - t["overdue"]
    if await poller.wait(
        lambda s: s.scheduled - base_scheduled >= timers,
        "durable enqueue",
        deadline_ms=out.window_start_ms,
        report=report,
    ):
        out.durable_ms = poller.last.t_ms
    out.at_pending = poller.last


async def fire(run: Run, consumer: Worker, on_window: Callable[[], None]) -> None:
    """Wait for the window (``on_window()`` a second before it opens), then until the
    consumer has every timer (or things stall)."""
    out, poller = run.out, run.poller
    base_delivered = out.probe_stats.delivered if out.probe_stats else 0
    expect = int(out.sends.get("sent", 0))

    def received() -> int:
        consumer.check_alive()
        return int(consumer.read("progress").get("distinct", 0))

    def report(s: Sample) -> str:
        return (
            f"delivered {s.delivered - base_delivered:,}, received {received():,}, pending "
            f"{s.pending:,}, due/s {s.due_per_s:,.0f}, lateness p50/p99/max "
            f"{s.p50_ms}/{s.p99_ms}/{s.max_ms} ms"
        )

    while (wait_ms := out.window_start_ms - 1000 - now_ms()) > 0:
        await asyncio.sleep(min(PROGRESS_EVERY_S, wait_ms / 1000))
        if wait_ms > PROGRESS_EVERY_S * 1000:
            print(f"   window opens in {(out.window_start_ms - now_ms()) / 1000:.0f} s", flush=True)
    on_window()
    first_sample = len(poller.samples)
    timers = expect - int(out.sends.get("overdue", 0))
    if await poller.wait(
        lambda s: s.delivered - base_delivered >= timers,
        "deliveries",
        progress=received,
        report=report,
    ):
        out.delivered_ms = poller.last.t_ms
    out.delivered = poller.last.delivered - base_delivered
    await poller.wait(
        lambda s: received() >= expect or bool(consumer.read("result")),
        "the consumer",
        progress=received,
    )
    out.fire_samples = poller.samples[first_sample:]


async def run_phases(
    plan: Plan, base: Path, namesrv: list[str], timer_addr: str, pids: dict[str, int]
) -> Outcome:
    out = Outcome(plan, load_start=os.getloadavg()[0])
    topic = f"TimerBench{os.getpid()}"
    await ensure_topic(tuple(namesrv), topic, QUEUES)
    await ensure_topic(tuple(namesrv), "TimerBenchProbe", QUEUES)
    workers: list[Worker] = []
    spec = {"namesrv": namesrv, "topic": topic, "group": f"timer-bench-{os.getpid()}"}
    consumer = spawn_worker(base, "consumer", "consume", {**spec, "expect": plan.pending}, workers)
    profiler = Profiler(plan.profile, pids)
    try:
        deadline = time.monotonic() + WORKER_READY_S
        while not consumer.read("ready"):
            consumer.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumer not ready within {WORKER_READY_S:.0f} s")
            await asyncio.sleep(0.1)
        async with StatsPoller(timer_addr, pids["timer-wheel"]) as poller:
            run = Run(plan, base, namesrv, poller, out, workers)
            print(f"probe: {plan.probe} timers", flush=True)
            await probe(run)
            out.idle = poller.last
            est_s = plan.pending / max(out.probe_rate, 1.0)
            out.lead_s = plan.lead_s or max(LEAD_MIN_S, est_s * LEAD_SLACK + ENQUEUE_SLACK_S)
            out.window_start_ms = now_ms() + int(out.lead_s * 1000)
            print(f"schedule: {plan.pending:,} timers due in {plan.window_ms / 1000:g} s from "
                  f"{out.lead_s:.0f} s on, {plan.senders} sender(s)", flush=True)  # fmt: skip
            profiler.start("schedule")
            await schedule(run, topic)
            profiler.stop()
            out.load_max_schedule, poller.load_max = poller.load_max, 0.0
            print("fire: waiting for the window", flush=True)
            await fire(run, consumer, lambda: profiler.start("fire"))
            profiler.stop()
            out.rss_peak_kib = proc_status_kib(pids["timer-wheel"], "VmHWM")
            out.load_max_fire = poller.load_max
    finally:
        profiler.stop()
        for w in workers:
            stop_process(w.proc, signal.SIGTERM)
    out.consumer = consumer.read("result")
    return out


# ---- main -------------------------------------------------------------------------------------
def start_services(base: Path, started: list[Process]) -> None:
    """Nameserver, broker and timer-wheel, appended to ``started`` as they come up."""
    started.append(launch.start_nameserver(base))
    namesrv = [started[0].addr]
    started.append(launch.start_broker(base, namesrv))
    started.append(launch.start_timer_wheel(base, namesrv))


def main() -> None:
    supervisor.children_die_with_this_process()  # a killed bench leaves nothing running
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{PENDING_QUICK:,} timers")
    parser.add_argument("--pending", type=int, help=f"timers (default {PENDING_DEFAULT:,})")
    parser.add_argument("--window-s", type=float, help="due window (default N / 20 000 s)")
    parser.add_argument("--senders", type=int, default=1, help="sender processes")
    parser.add_argument("--lead-s", type=float, help="window start after scheduling begins")
    parser.add_argument("--profile", type=Path, help="write py-spy profiles here")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--worker", choices=("send", "consume"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        work = send_worker if args.worker == "send" else consume_worker
        asyncio.run(work(json.loads(args.spec)))
        return
    pending = args.pending or (PENDING_QUICK if args.quick else PENDING_DEFAULT)
    window_s = args.window_s or max(1.0, pending / TARGET_FIRED_PER_S)
    plan = Plan(pending, int(window_s * 1000), max(1, args.senders), args.lead_s, args.profile)
    base = Path(tempfile.mkdtemp(prefix="rocketq-timer-bench-"))
    started: list[Process] = []
    try:
        start_services(base, started)
        ns, broker, timer = started
        print(f"nameserver {ns.addr}, broker {broker.addr}, timer-wheel {timer.addr}; {base}")
        pids = {"timer-wheel": timer.pid, "broker": broker.pid}
        print_report(asyncio.run(run_phases(plan, base, [ns.addr], timer.addr, pids)))
    finally:
        for sp in reversed(started):
            with contextlib.suppress(StopTimeout):
                sp.stop(timeout_s=30)
        if args.keep:
            print(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
