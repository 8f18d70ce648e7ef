"""Timer-wheel benchmark: schedule N timers due in the same few seconds, measure, never assert.

    python -m tools.bench.timer_bench [--quick] [--pending N] [--window-s S] [--senders P]
                                      [--lead-s S] [--profile DIR]

It starts its own nameserver, broker and timer-wheel service (:mod:`tests.integration.cluster`,
loopback ports, data in a temporary directory, removed afterwards), then:

| phase     | what happens                                                                        |
|-----------|-------------------------------------------------------------------------------------|
| probe     | 1 % of N (2 000..10 000) timers on a side topic, due 20 s on: the send rate that    |
|           | sets the lead, and a light-load lateness sample                                     |
| schedule  | N timers (1 000 000; 100 000 with ``--quick``), one ``send_async`` each (a delayed  |
|           | message cannot be batched), ``--senders`` processes with many sends in flight, in   |
|           | random order of delivery time; all fall due in a window starting after the sends    |
|           | (lead) and lasting ``--window-s`` (default N / 20 000: 20 000 due every second)     |
| pending   | once the timer-wheel reports all N durable: its RSS (VmRSS of /proc/PID/status)     |
| fire      | the window passes; a consumer process receives every re-put message                 |

Figures (a rich table at the end):

- scheduled/s, send side (acknowledged sends) and timer side (``scheduled_total`` of
  GetTimerStats: read from the broker and made durable);
- fired/s: ``delivered_total`` over the time from the window's start to the last delivery, and
  the busiest second of re-put store timestamps;
- lateness: GetTimerStats' p50/p99/max (its last 10 000 deliveries; the worst values seen while
  firing), and per message from the consumer: broker store time of the re-put − TIMER_OUT_MS
  (the timer-wheel's part) and receive time − TIMER_OUT_MS (including the consumer's lag);
  "on time" means stored at most ``ON_TIME_MS`` after its delivery time;
- the timer-wheel's RSS idle and at N pending, its peak (VmHWM), and bytes per pending timer.

The target to compare against (issue 5): >= 20 000 timers/s fired on time. Everything is
one machine: a Python producer, broker, timer-wheel and consumer share its cores, so the
figures say as much about the machine as about RocketQ. ``--profile DIR`` records py-spy
profiles (collapsed stacks, ``DIR/<process>-<phase>.txt``) of the timer-wheel and the broker
during the schedule and fire phases.

The sender and consumer run as this module in worker mode (``--worker send|consume --spec
JSON``) so the orchestrating process only polls statistics.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table

from rocketq._api.rocketq.v1 import timer_pb2, timer_pb2_grpc
from rocketq.cli._bench import ensure_topic
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.codec import Prop
from rocketq.message import Message, ReceivedMessage
from tests.integration.cluster import (
    ServiceProcess,
    start_broker,
    start_nameserver,
    start_timer_wheel,
)

PENDING_DEFAULT = 1_000_000
PENDING_QUICK = 100_000
TARGET_FIRED_PER_S = 20_000
"""Issue 5's target: timers fired on time per second."""
ON_TIME_MS = 1000
"""A timer stored by its re-put at most this late counts as fired on time."""
QUEUES = 8
BODY_BYTES = 128
IN_FLIGHT_PER_SENDER = 512
"""send_async calls outstanding per sender process."""
SEND_ATTEMPTS_MAX = 3
PROBE_MIN, PROBE_MAX = 2_000, 10_000
PROBE_DELAY_MS = 20_000
"""Probe timers fall due this long after the probe starts: sent and durable well before."""
LEAD_MIN_S = 20.0
LEAD_SLACK = 1.3
"""Lead = estimated send time x this + ENQUEUE_SLACK_S, so every timer is sent before due."""
ENQUEUE_SLACK_S = 15.0
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
STALL_S = 60.0
"""Stop waiting for a phase when nothing moved for this long."""
WORKER_READY_S = 60.0
SEQ_PROP = "bench_seq"
DUE_PROP = "bench_due_ms"
ROOT = Path(__file__).resolve().parents[2]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- sender worker ----------------------------------------------------------------------------
async def send_worker(spec: dict[str, Any]) -> None:
    """Send seqs [first, first + count) due in [window_start_ms, + window_ms), random order."""
    rng = random.Random(spec["seed"])
    first, count = int(spec["first"]), int(spec["count"])
    start_ms, window_ms = int(spec["window_start_ms"]), int(spec["window_ms"])
    progress = Path(spec["progress"])
    body = os.urandom(int(spec["body_bytes"]))
    in_flight = int(spec["in_flight"])
    config = ProducerConfig(
        f"timer-bench-sender-{os.getpid()}",
        tuple(spec["namesrv"]),
        async_in_flight_max=in_flight + 16,
    )
    state: dict[str, Any] = {"sent": 0, "failed": 0, "lost": 0, "overdue": 0, "errors": {}}
    window = asyncio.Semaphore(in_flight)
    order = list(range(first, first + count))
    rng.shuffle(order)
    async with Producer(config) as producer:

        def message(seq: int, due_ms: int) -> Message:
            props = {SEQ_PROP: str(seq), DUE_PROP: str(due_ms)}
            return Message(spec["topic"], body, properties=props, deliver_time_ms=due_ms)

        def launch(seq: int, due_ms: int, attempt: int) -> None:
            fut = producer.send_async(message(seq, due_ms))
            fut.add_done_callback(lambda f: done(f, seq, due_ms, attempt))

        def done(fut: asyncio.Future[Any], seq: int, due_ms: int, attempt: int) -> None:
            if fut.cancelled() or fut.exception() is not None:
                state["failed"] += 1
                kind = "cancelled" if fut.cancelled() else type(fut.exception()).__name__
                state["errors"][kind] = state["errors"].get(kind, 0) + 1
                if attempt < SEND_ATTEMPTS_MAX:
                    launch(seq, due_ms, attempt + 1)
                    return
                state["lost"] += 1
            else:
                state["sent"] += 1
                t = now_ms()
                state["overdue"] += t >= due_ms
                state["last_ms"] = t
            window.release()

        state["first_ms"] = now_ms()
        last_write = 0.0
        for seq in order:
            await window.acquire()
            launch(seq, start_ms + rng.randrange(window_ms), 1)
            if time.monotonic() - last_write > 1.0:
                last_write = time.monotonic()
                _write_json(progress, state)
        for _ in range(in_flight):
            await window.acquire()
    state["done"] = 1
    _write_json(progress, state)


# ---- consumer worker --------------------------------------------------------------------------
@dataclass
class _Receipts:
    """What the consumer saw; lateness in ms against the message's TIMER_OUT_MS."""

    expect: int
    seen: bytearray
    received: int = 0
    dups: int = 0
    early_store: int = 0
    early_recv: int = 0
    out_mismatch: int = 0
    no_out: int = 0
    last_recv_ms: int = 0
    store_late: array.array[int] = field(default_factory=lambda: array.array("q"))
    recv_late: array.array[int] = field(default_factory=lambda: array.array("q"))
    store_seconds: Counter[int] = field(default_factory=Counter)

    def add(self, msgs: list[ReceivedMessage], recv_ms: int) -> None:
        self.last_recv_ms = recv_ms
        for m in msgs:
            self.received += 1
            seq = int(m.properties.get(SEQ_PROP, "-1"))
            if 0 <= seq < self.expect:
                if self.seen[seq]:
                    self.dups += 1
                    continue
                self.seen[seq] = 1
            due = int(m.properties.get(DUE_PROP, "0"))
            out_text = m.properties.get(Prop.TIMER_OUT_MS)
            if out_text is None:
                self.no_out += 1
            elif int(out_text) != due:
                self.out_mismatch += 1
            self.early_store += m.store_timestamp_ms < due
            self.early_recv += recv_ms < due
            self.store_late.append(m.store_timestamp_ms - due)
            self.recv_late.append(recv_ms - due)
            self.store_seconds[m.store_timestamp_ms // 1000] += 1

    def progress(self) -> dict[str, int]:
        return {"received": self.received, "distinct": len(self.store_late), "dups": self.dups}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.progress())
        for name in ("early_store", "early_recv", "out_mismatch", "no_out", "last_recv_ms"):
            out[name] = getattr(self, name)
        for name, values in (("store", self.store_late), ("recv", self.recv_late)):
            a = np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(1, np.int64)
            out[f"{name}_p50_ms"] = float(np.percentile(a, 50))
            out[f"{name}_p99_ms"] = float(np.percentile(a, 99))
            out[f"{name}_p999_ms"] = float(np.percentile(a, 99.9))
            out[f"{name}_max_ms"] = int(a.max())
            out[f"{name}_on_time"] = int((a <= ON_TIME_MS).sum()) if len(values) else 0
        out["store_seconds"] = {str(k): v for k, v in sorted(self.store_seconds.items())}
        return out


async def consume_worker(spec: dict[str, Any]) -> None:
    """Receive the bench topic until ``expect`` distinct timers arrived or SIGTERM."""
    receipts = _Receipts(int(spec["expect"]), bytearray(int(spec["expect"])))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        receipts.add(msgs, now_ms())
        if len(receipts.store_late) >= receipts.expect:
            stop.set()
        return ConsumeResult.CONSUME_SUCCESS

    config = PushConsumerConfig(
        spec["group"],
        tuple(spec["namesrv"]),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=32,
        pull_batch_size=64,
        pull_threshold_for_queue=4000,
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe(spec["topic"])
    progress = Path(spec["progress"])
    async with consumer:
        while not consumer.assigned_queues():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the first long-polling pulls reach the broker
        _write_json(Path(spec["ready"]), {"pid": os.getpid()})
        while not stop.is_set():
            _write_json(progress, receipts.progress())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        _write_json(progress, receipts.progress())
    _write_json(Path(spec["result"]), receipts.summary())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---- processes --------------------------------------------------------------------------------
@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    files: dict[str, Path]
    log: Path

    def read(self, key: str) -> dict[str, Any]:
        return _read_json(self.files[key])

    def check_alive(self) -> None:
        if self.proc.poll() is not None and self.proc.returncode != 0:
            tail = self.log.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}\n" + "\n".join(tail)
            )

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def spawn_worker(base: Path, name: str, kind: str, spec: dict[str, Any]) -> Worker:
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    files = {k: d / f"{k}.json" for k in ("progress", "ready", "result")}
    spec = {**spec, **{k: str(v) for k, v in files.items()}}
    argv = [sys.executable, "-m", "tools.bench.timer_bench", "--worker", kind]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    log = d / "worker.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*argv, "--spec", json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Worker(name, proc, files, log)


def proc_status_kib(pid: int, field_name: str) -> int:
    """A ``/proc/PID/status`` memory field (VmRSS, VmHWM) in KiB; 0 when unreadable."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


class Profiler:
    """py-spy record of one process for one phase (collapsed stacks), when --profile is set."""

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
            out = self.out_dir / f"{name}-{phase}.txt"
            argv = [self.exe, "record", "--pid", str(pid), "--format", "raw", "--rate", "50"]
            self._procs.append(
                subprocess.Popen(
                    [*argv, "--output", str(out), "--nonblocking"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self._procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self._procs.clear()


# ---- timer statistics -------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    t_ms: int
    scheduled: int
    delivered: int
    pending: int
    due_per_s: float
    p50_ms: int
    p99_ms: int
    max_ms: int
    rss_kib: int


class StatsPoller:
    """Polls GetTimerStats and the timer-wheel's RSS every POLL_S into a timeline."""

    def __init__(self, addr: str, pid: int) -> None:
        self.addr = addr
        self.pid = pid
        self.samples: list[Sample] = []
        self.errors = 0

    async def __aenter__(self) -> StatsPoller:
        self._channel = grpc.aio.insecure_channel(self.addr)
        self._stub = timer_pb2_grpc.TimerAdminStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close()

    async def poll(self) -> Sample | None:
        try:
            r = await self._stub.GetTimerStats(timer_pb2.GetTimerStatsRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            self.errors += 1
            return None
        s = Sample(
            now_ms(),
            r.scheduled_total,
            r.delivered_total,
            r.pending_timers,
            r.due_per_second,
            r.lateness_p50_ms,
            r.lateness_p99_ms,
            r.lateness_max_ms,
            proc_status_kib(self.pid, "VmRSS"),
        )
        self.samples.append(s)
        return s

    @property
    def last(self) -> Sample:
        return self.samples[-1] if self.samples else Sample(now_ms(), 0, 0, 0, 0.0, 0, 0, 0, 0)

    async def wait(
        self,
        done: Callable[[Sample], bool],
        what: str,
        *,
        deadline_ms: int = 0,
        progress: Callable[[], object] = lambda: None,
        report: Callable[[Sample], str] | None = None,
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
                now_mark = (s.scheduled, s.delivered, progress())
                if now_mark != mark:
                    moved_at, mark = time.monotonic(), now_mark
                if report is not None and time.monotonic() - printed_at >= PROGRESS_EVERY_S:
                    printed_at = time.monotonic()
                    print("   " + report(s), flush=True)
            if time.monotonic() - moved_at > STALL_S or (deadline_ms and now_ms() > deadline_ms):
                print(f"   gave up waiting for {what}: {self.last}", flush=True)
                return False
            await asyncio.sleep(POLL_S)


# ---- the run ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    pending: int
    window_ms: int
    senders: int
    lead_s: float | None
    body_bytes: int = BODY_BYTES
    profile: Path | None = None

    @property
    def probe(self) -> int:
        return max(PROBE_MIN, min(PROBE_MAX, self.pending // 100))


@dataclass
class Outcome:
    """Everything the table shows."""

    plan: Plan
    lead_s: float = 0.0
    window_start_ms: int = 0
    probe_rate: float = 0.0
    probe_stats: Sample | None = None
    sent: int = 0
    send_failures: int = 0
    send_lost: int = 0
    send_errors: dict[str, int] = field(default_factory=dict)
    overdue_at_send: int = 0
    send_first_ms: int = 0
    send_last_ms: int = 0
    durable_ms: int = 0
    rss_idle_kib: int = 0
    at_pending: Sample | None = None
    delivered_ms: int = 0
    delivered: int = 0
    fire_samples: list[Sample] = field(default_factory=list)
    rss_peak_kib: int = 0
    consumer: dict[str, Any] = field(default_factory=dict)


def _spawn_senders(
    base: Path, phase: str, namesrv: list[str], topic: str, count: int, senders: int, **kw: Any
) -> list[Worker]:
    share, extra = divmod(count, senders)
    workers, first = [], 0
    for i in range(senders):
        n = share + (i < extra)
        spec = {
            "namesrv": namesrv,
            "topic": topic,
            "first": first,
            "count": n,
            "seed": hash((phase, i)) & 0xFFFF_FFFF,
            "in_flight": IN_FLIGHT_PER_SENDER,
            **kw,
        }
        workers.append(spawn_worker(base, f"{phase}-sender{i}", "send", spec))
        first += n
    return workers


def _send_totals(workers: list[Worker]) -> dict[str, Any]:
    progress = [w.read("progress") for w in workers]
    totals: dict[str, Any] = {
        k: sum(int(p.get(k, 0)) for p in progress) for k in ("sent", "failed", "lost", "overdue")
    }
    totals["done"] = all(p.get("done") for p in progress)
    totals["first_ms"] = min((int(p.get("first_ms", 0)) for p in progress), default=0)
    totals["last_ms"] = max((int(p.get("last_ms", 0)) for p in progress), default=0)
    errors: Counter[str] = Counter()
    for p in progress:
        errors.update(p.get("errors", {}))
    totals["errors"] = dict(errors)
    return totals


def _senders_done(workers: list[Worker]) -> bool:
    for w in workers:
        w.check_alive()
    return bool(_send_totals(workers)["done"])


async def probe(
    poller: StatsPoller, base: Path, namesrv: list[str], plan: Plan, out: Outcome
) -> None:
    """Send the probe timers, wait for them to fire: send rate and light-load lateness."""
    workers = _spawn_senders(
        base,
        "probe",
        namesrv,
        "TimerBenchProbe",
        plan.probe,
        plan.senders,
        window_start_ms=now_ms() + PROBE_DELAY_MS,
        window_ms=1_000,
        body_bytes=plan.body_bytes,
    )
    await poller.wait(lambda s: _senders_done(workers), "probe sends")
    t = _send_totals(workers)
    out.probe_rate = t["sent"] / max(1, t["last_ms"] - t["first_ms"]) * 1000
    print(f"   probe: {t['sent']} timers at {out.probe_rate:,.0f}/s; waiting for them", flush=True)
    await poller.wait(
        lambda s: s.delivered >= t["sent"] - t["overdue"],
        "probe deliveries",
        deadline_ms=now_ms() + 60_000,
    )
    out.probe_stats = poller.last


async def schedule(
    poller: StatsPoller, base: Path, namesrv: list[str], topic: str, plan: Plan, out: Outcome
) -> None:
    """Send N timers due in the window, then wait until the timer-wheel holds all durable."""
    base_scheduled = poller.last.scheduled
    workers = _spawn_senders(
        base,
        "main",
        namesrv,
        topic,
        plan.pending,
        plan.senders,
        window_start_ms=out.window_start_ms,
        window_ms=plan.window_ms,
        body_bytes=plan.body_bytes,
    )

    def report(s: Sample) -> str:
        t = _send_totals(workers)
        return (
            f"sent {t['sent']:,}, timer-wheel scheduled {s.scheduled - base_scheduled:,}, "
            f"pending {s.pending:,}, RSS {s.rss_kib / 1024:,.0f} MiB"
        )

    await poller.wait(
        lambda s: _senders_done(workers),
        "sends",
        progress=lambda: _send_totals(workers)["sent"],
        report=report,
    )
    t = _send_totals(workers)
    out.sent, out.send_failures, out.send_lost = t["sent"], t["failed"], t["lost"]
    out.send_errors = t["errors"]
    out.overdue_at_send, out.send_first_ms, out.send_last_ms = (
        t["overdue"],
        t["first_ms"],
        t["last_ms"],
    )
    timers = out.sent - out.overdue_at_send
    if await poller.wait(
        lambda s: s.scheduled - base_scheduled >= timers,
        "durable enqueue",
        deadline_ms=out.window_start_ms,
        report=report,
    ):
        out.durable_ms = poller.last.t_ms
    out.at_pending = poller.last


async def fire(poller: StatsPoller, consumer: Worker, plan: Plan, out: Outcome) -> None:
    """Wait for the window and until the consumer has every timer (or things stall)."""
    base_delivered = out.probe_stats.delivered if out.probe_stats else 0
    expect = out.sent

    def received() -> int:
        consumer.check_alive()
        return int(consumer.read("progress").get("distinct", 0))

    def report(s: Sample) -> str:
        return (
            f"delivered {s.delivered - base_delivered:,}, received {received():,}, pending "
            f"{s.pending:,}, due/s {s.due_per_s:,.0f}, lateness p50/p99/max "
            f"{s.p50_ms}/{s.p99_ms}/{s.max_ms} ms"
        )

    while (wait_ms := out.window_start_ms - now_ms()) > 0:
        await asyncio.sleep(min(PROGRESS_EVERY_S, wait_ms / 1000))
        if now_ms() < out.window_start_ms:
            print(f"   window opens in {(out.window_start_ms - now_ms()) / 1000:.0f} s", flush=True)
    first_sample = len(poller.samples)
    if await poller.wait(
        lambda s: s.delivered - base_delivered >= expect - out.overdue_at_send,
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


async def run(
    plan: Plan, base: Path, namesrv: list[str], timer_addr: str, pids: dict[str, int]
) -> Outcome:
    out = Outcome(plan)
    topic = f"TimerBench{os.getpid()}"
    await ensure_topic(tuple(namesrv), topic, QUEUES)
    await ensure_topic(tuple(namesrv), "TimerBenchProbe", QUEUES)
    spec = {"namesrv": namesrv, "topic": topic, "group": f"timer-bench-{os.getpid()}"}
    consumer = spawn_worker(base, "consumer", "consume", {**spec, "expect": plan.pending})
    profiler = Profiler(plan.profile, pids)
    try:
        deadline = time.monotonic() + WORKER_READY_S
        while not consumer.read("ready"):
            consumer.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumer not ready within {WORKER_READY_S:.0f} s")
            await asyncio.sleep(0.1)
        async with StatsPoller(timer_addr, pids["timer-wheel"]) as poller:
            print(f"probe: {plan.probe} timers", flush=True)
            await probe(poller, base, namesrv, plan, out)
            out.rss_idle_kib = proc_status_kib(pids["timer-wheel"], "VmRSS")
            est_s = plan.pending / max(out.probe_rate, 1.0)
            out.lead_s = plan.lead_s or max(LEAD_MIN_S, est_s * LEAD_SLACK + ENQUEUE_SLACK_S)
            out.window_start_ms = now_ms() + int(out.lead_s * 1000)
            print(
                f"schedule: {plan.pending:,} timers due in {plan.window_ms / 1000:g} s from "
                f"{out.lead_s:.0f} s on, {plan.senders} sender(s)",
                flush=True,
            )
            profiler.start("schedule")
            await schedule(poller, base, namesrv, topic, plan, out)
            profiler.stop()
            print("fire: waiting for the window", flush=True)
            await asyncio.sleep(0)
            profiler.start("fire")
            await fire(poller, consumer, plan, out)
            profiler.stop()
            out.rss_peak_kib = proc_status_kib(pids["timer-wheel"], "VmHWM")
    finally:
        profiler.stop()
        consumer.stop()
    out.consumer = consumer.read("result")
    return out


# ---- report -----------------------------------------------------------------------------------
def _rate(count: int, start_ms: int, end_ms: int) -> str:
    if count <= 0 or end_ms <= start_ms:
        return "-"
    return f"{count / (end_ms - start_ms) * 1000:,.0f}/s"


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB" if kib else "-"


def _lateness(c: dict[str, Any], name: str) -> str:
    if not c:
        return "-"
    return (
        f"{c[f'{name}_p50_ms']:,.0f} / {c[f'{name}_p99_ms']:,.0f} / "
        f"{c[f'{name}_p999_ms']:,.0f} / {c[f'{name}_max_ms']:,} ms"
    )


def _fire_rows(out: Outcome) -> list[tuple[str, str, str]]:
    plan, c = out.plan, out.consumer
    due_rate = plan.pending / (plan.window_ms / 1000)
    seconds = {int(k): v for k, v in c.get("store_seconds", {}).items()}
    busiest = max(seconds.values(), default=0)
    last_store_ms = (max(seconds) + 1) * 1000 if seconds else 0
    fs = out.fire_samples
    worst_p99 = max((s.p99_ms for s in fs), default=0)
    worst_max = max((s.max_ms for s in fs), default=0)
    on_time = int(c.get("store_on_time", 0))
    share = on_time / out.sent * 100 if out.sent else 0.0
    return [
        ("due rate", f"{due_rate:,.0f}/s", f"{plan.pending:,} over {plan.window_ms / 1000:g} s"),
        (
            "fired/s (delivered_total)",
            _rate(out.delivered, out.window_start_ms, out.delivered_ms),
            "window start to last delivery" if out.delivered_ms else "did not finish",
        ),
        (
            "fired/s (re-put store times)",
            _rate(int(c.get("distinct", 0)), out.window_start_ms, last_store_ms),
            f"busiest second {busiest:,}",
        ),
        ("due_per_second (stats, max)", f"{max((s.due_per_s for s in fs), default=0):,.0f}", ""),
        (
            "lateness, GetTimerStats",
            f"{fs[-1].p50_ms} / {fs[-1].p99_ms} / {fs[-1].max_ms} ms" if fs else "-",
            f"p50/p99/max of the last 10 000; worst seen p99 {worst_p99}, max {worst_max} ms",
        ),
        ("lateness, store − due", _lateness(c, "store"), "p50 / p99 / p99.9 / max"),
        ("lateness, receive − due", _lateness(c, "recv"), "includes the consumer's lag"),
        (
            f"fired on time (≤ {ON_TIME_MS} ms)",
            f"{share:.2f} %",
            f"{on_time:,} of {out.sent:,}; {on_time / (plan.window_ms / 1000):,.0f}/s",
        ),
    ]


def print_report(out: Outcome) -> None:
    plan, c = out.plan, out.consumer
    pending = out.at_pending
    rss_delta = (pending.rss_kib - out.rss_idle_kib) * 1024 if pending else 0
    probe = out.probe_stats
    rows: list[tuple[str, str, str]] = [
        (
            "timers",
            f"{plan.pending:,}",
            f"{plan.senders} sender process(es), lead {out.lead_s:.0f} s",
        ),
        (
            "scheduled/s, send side",
            _rate(out.sent, out.send_first_ms, out.send_last_ms),
            f"{out.send_failures} failed attempts {out.send_errors or ''}, {out.send_lost} lost, "
            f"{out.overdue_at_send} acknowledged after their due time",
        ),
        (
            "scheduled/s, timer side (durable)",
            _rate(out.sent - out.overdue_at_send, out.send_first_ms, out.durable_ms),
            "first send to scheduled_total reaching N" if out.durable_ms else "did not finish",
        ),
        ("timer-wheel RSS idle", _mib(out.rss_idle_kib), "after the probe"),
        (
            "timer-wheel RSS at N pending",
            _mib(pending.rss_kib) if pending else "-",
            f"{pending.pending:,} pending; {rss_delta / max(1, pending.pending):,.0f} B/timer"
            if pending
            else "",
        ),
        ("timer-wheel RSS peak (VmHWM)", _mib(out.rss_peak_kib), ""),
        *_fire_rows(out),
        (
            "early deliveries",
            f"{c.get('early_store', '-')} stored / {c.get('early_recv', '-')} received",
            "before TIMER_OUT_MS: must be 0",
        ),
        (
            "missing / duplicates",
            f"{out.sent - int(c.get('distinct', 0)):,} / {c.get('dups', '-')}",
            f"TIMER_OUT_MS absent {c.get('no_out', '-')}, differs {c.get('out_mismatch', '-')}",
        ),
        (
            "light load (probe)",
            f"{probe.p50_ms} / {probe.p99_ms} / {probe.max_ms} ms" if probe else "-",
            f"{plan.probe:,} timers due within 1 s, sent at {out.probe_rate:,.0f}/s",
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
    share = int(c.get("store_on_time", 0)) / out.sent if out.sent else 0.0
    met = due_rate >= TARGET_FIRED_PER_S and share >= 0.99
    console.print(
        f"target >= {TARGET_FIRED_PER_S:,} timers/s fired on time: "
        f"{'met' if met else 'NOT met'} (due rate {due_rate:,.0f}/s, {share:.1%} on time)"
    )


# ---- main -------------------------------------------------------------------------------------
def start_services(base: Path) -> list[ServiceProcess]:
    started: list[ServiceProcess] = []
    ns = start_nameserver(base)
    started.append(ns)
    started.append(start_broker(base, [ns.addr]))
    started.append(start_timer_wheel(base, [ns.addr]))
    return started


def stop_services(started: list[ServiceProcess]) -> None:
    for sp in reversed(started):
        with contextlib.suppress(AssertionError):
            sp.stop(timeout_s=30)


def main() -> None:
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
    plan = Plan(
        pending, int(window_s * 1000), max(1, args.senders), args.lead_s, profile=args.profile
    )
    base = Path(tempfile.mkdtemp(prefix="rocketq-timer-bench-"))
    started: list[ServiceProcess] = []
    try:
        started = start_services(base)
        ns, broker, timer = started
        print(
            f"nameserver {ns.addr}, broker {broker.addr}, timer-wheel {timer.addr}; {base}",
            flush=True,
        )
        pids = {"timer-wheel": timer.pid, "broker": broker.pid}
        out = asyncio.run(run(plan, base, [ns.addr], timer.addr, pids))
        print_report(out)
    finally:
        stop_services(started)
        if args.keep:
            print(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
