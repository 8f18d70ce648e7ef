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
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

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
from tests.integration import cluster

PENDING_DEFAULT = 1_000_000
PENDING_QUICK = 100_000
TARGET_FIRED_PER_S = 20_000
"""Issue 5's target: timers fired on time per second."""
ON_TIME_MS = 1000
"""A timer stored by its re-put at most this late counts as fired on time."""
QUEUES = 8
BODY_BYTES = 128
IN_FLIGHT_TOTAL = 256
"""send_async calls outstanding over all sender processes: enough to keep the broker busy;
more only queues requests in it and times them out on a loaded machine."""
SEND_TIMEOUT_MS = 10_000
SEND_ATTEMPTS_MAX = 3
PROBE_MIN, PROBE_MAX = 2_000, 10_000
PROBE_DELAY_MS = 20_000
"""Probe timers fall due this long after the probe starts: sent and durable well before."""
LEAD_MIN_S = 20.0
LEAD_SLACK = 1.5
"""Lead = estimated send time x this + ENQUEUE_SLACK_S, so every timer is sent before due."""
ENQUEUE_SLACK_S = 15.0
POLL_S = 1.0
"""GetTimerStats period while timers are due. Not shorter: with no slot open, a stats call
scans the whole wheel (~75 ms of the timer-wheel's CPU)."""
SCHEDULE_POLL_S = 5.0
"""GetTimerStats period while scheduling (the scans would slow the enqueue side measured)."""
PROGRESS_EVERY_S = 5.0
STALL_S = 60.0
"""Stop waiting for a phase when nothing moved for this long."""
WORKER_READY_S = 60.0
SEQ_PROP = "bench_seq"
DUE_PROP = "bench_due_ms"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- sender worker ----------------------------------------------------------------------------
async def send_worker(spec: dict[str, Any]) -> None:
    """Send seqs [first, first + count) due in [window_start_ms, + window_ms), random order;
    a failed send is sent again (a new message id) up to SEND_ATTEMPTS_MAX times."""
    rng = random.Random(spec["seed"])
    start_ms, window_ms = int(spec["window_start_ms"]), int(spec["window_ms"])
    body, in_flight = os.urandom(int(spec["body_bytes"])), int(spec["in_flight"])
    config = ProducerConfig(
        f"timer-bench-sender-{os.getpid()}", tuple(spec["namesrv"]), async_in_flight_max=in_flight
    )
    state: dict[str, Any] = {"sent": 0, "failed": 0, "lost": 0, "overdue": 0, "errors": {}}
    window = asyncio.Semaphore(in_flight)
    order = list(range(int(spec["first"]), int(spec["first"]) + int(spec["count"])))
    rng.shuffle(order)
    async with Producer(config) as producer:

        def launch(seq: int, due_ms: int, attempt: int) -> None:
            props = {SEQ_PROP: str(seq), DUE_PROP: str(due_ms)}
            msg = Message(spec["topic"], body, properties=props, deliver_time_ms=due_ms)
            fut = producer.send_async(msg, timeout_ms=SEND_TIMEOUT_MS)
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
                state["last_ms"] = now_ms()
                state["overdue"] += state["last_ms"] >= due_ms
            window.release()

        state["first_ms"] = now_ms()
        written_at = 0.0
        for seq in order:
            await window.acquire()
            launch(seq, start_ms + rng.randrange(window_ms), 1)
            if time.monotonic() - written_at > 1.0:
                written_at = time.monotonic()
                _write_json(Path(spec["progress"]), state)
        for _ in range(in_flight):
            await window.acquire()
    _write_json(Path(spec["progress"]), {**state, "done": 1})


# ---- consumer worker --------------------------------------------------------------------------
@dataclass
class _Receipts:
    """What the consumer saw. Lateness (ms) is measured against the due time the sender put on
    the message, for messages that went through the timer-wheel (they carry TIMER_OUT_MS); one
    acknowledged after its due time was stored directly ("direct"). A seq seen twice is a
    redelivery when the message id repeats, else a producer resend of a failed send."""

    expect: int
    seen_crc: np.ndarray[Any, np.dtype[np.uint32]]
    """crc32(msg id) | 1 per seq once seen; 0 = not yet."""
    received: int = 0
    distinct: int = 0
    redelivered: int = 0
    resent: int = 0
    direct: int = 0
    early_store: int = 0
    early_recv: int = 0
    out_mismatch: int = 0
    store_last_ms: int = 0
    store_late: array.array[int] = field(default_factory=lambda: array.array("q"))
    recv_late: array.array[int] = field(default_factory=lambda: array.array("q"))
    store_seconds: Counter[int] = field(default_factory=Counter)

    def add(self, msgs: list[ReceivedMessage], recv_ms: int) -> None:
        for m in msgs:
            self.received += 1
            seq = int(m.properties.get(SEQ_PROP, "-1"))
            if not 0 <= seq < self.expect:
                continue
            crc = zlib.crc32(m.msg_id.encode()) | 1
            if self.seen_crc[seq]:
                self.redelivered += self.seen_crc[seq] == crc
                self.resent += self.seen_crc[seq] != crc
                continue
            self.seen_crc[seq] = crc
            self.distinct += 1
            due = int(m.properties.get(DUE_PROP, "0"))
            out_text = m.properties.get(Prop.TIMER_OUT_MS)
            if out_text is None:
                self.direct += 1
                continue
            self.out_mismatch += int(out_text) != due
            self.early_store += m.store_timestamp_ms < due
            self.early_recv += recv_ms < due
            self.store_late.append(m.store_timestamp_ms - due)
            self.recv_late.append(recv_ms - due)
            self.store_seconds[m.store_timestamp_ms // 1000] += 1
            self.store_last_ms = max(self.store_last_ms, m.store_timestamp_ms)

    def summary(self) -> dict[str, Any]:
        names = ("received", "distinct", "redelivered", "resent", "direct", "early_store")
        out: dict[str, Any] = {n: getattr(self, n) for n in (*names, "early_recv", "out_mismatch")}
        out["timed"], out["store_last_ms"] = len(self.store_late), self.store_last_ms
        for name, values in (("store", self.store_late), ("recv", self.recv_late)):
            a = np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(1, np.int64)
            for q in (50, 99, 99.9):
                out[f"{name}_p{q:g}_ms".replace(".", "")] = float(np.percentile(a, q))
            out[f"{name}_max_ms"] = int(a.max())
            out[f"{name}_on_time"] = int((a <= ON_TIME_MS).sum()) if len(values) else 0
        out["store_seconds"] = {str(k): v for k, v in sorted(self.store_seconds.items())}
        return out


async def consume_worker(spec: dict[str, Any]) -> None:
    """Receive the bench topic until ``expect`` distinct timers arrived or SIGTERM."""
    receipts = _Receipts(int(spec["expect"]), np.zeros(int(spec["expect"]), np.uint32))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        receipts.add(msgs, now_ms())
        if receipts.distinct >= receipts.expect:
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
        while True:
            _write_json(progress, {"received": receipts.received, "distinct": receipts.distinct})
            if stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
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
def _end(proc: subprocess.Popen[bytes], sig: int, timeout_s: float = 30.0) -> None:
    """Signal ``proc`` and wait; SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Worker:
    """A sender or consumer process of this module; it reports through JSON files."""

    name: str
    proc: subprocess.Popen[bytes]
    files: dict[str, Path]
    log: Path

    def read(self, key: str) -> dict[str, Any]:
        return _read_json(self.files[key])

    def check_alive(self) -> None:
        if self.proc.poll() not in (None, 0):
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}\n{tail}")


def spawn_worker(
    base: Path, name: str, kind: str, spec: dict[str, Any], workers: list[Worker]
) -> Worker:
    """Start a worker and add it to ``workers`` (the run stops them all at the end)."""
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    files = {k: d / f"{k}.json" for k in ("progress", "ready", "result")}
    spec = {**spec, **{k: str(v) for k, v in files.items()}}
    env = dict(os.environ)
    env["PYTHONPATH"] = str(cluster.ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "tools.bench.timer_bench", "--worker", kind]
    with open(d / "worker.log", "ab") as log:
        proc = subprocess.Popen(
            [*argv, "--spec", json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    workers.append(Worker(name, proc, files, d / "worker.log"))
    return workers[-1]


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
            _end(p, signal.SIGINT)  # py-spy writes its output on SIGINT
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
class Outcome:
    """Everything the table shows."""

    plan: Plan
    load_start: float
    lead_s: float = 0.0
    window_start_ms: int = 0
    probe_rate: float = 0.0
    probe_stats: Sample | None = None
    sends: dict[str, Any] = field(default_factory=dict)
    """Sender totals (:func:`_send_totals`)."""
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


async def probe(run: Run) -> None:
    """Send the probe timers, wait for them to fire: send rate and light-load lateness."""
    plan, out, poller = run.plan, run.out, run.poller
    due_ms = now_ms() + PROBE_DELAY_MS
    workers = run.spawn_senders("probe", "TimerBenchProbe", plan.probe, window_start_ms=due_ms,
                                window_ms=1_000)  # fmt: skip
    await poller.wait(lambda s: _senders_done(workers), "probe sends")
    t = _send_totals(workers)
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
            f"sent {_send_totals(workers)['sent']:,}, timer-wheel scheduled "
            f"{s.scheduled - base_scheduled:,}, pending {s.pending:,}, RSS {s.rss_kib >> 10} MiB"
        )

    def sent() -> int:
        return int(_send_totals(workers)["sent"])

    await poller.wait(
        lambda s: _senders_done(workers),
        "sends",
        progress=sent,
        report=report,
        poll_s=SCHEDULE_POLL_S,
    )
    out.sends = t = _send_totals(workers)
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
            _end(w.proc, signal.SIGTERM)
    out.consumer = consumer.read("result")
    return out


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


# ---- main -------------------------------------------------------------------------------------
def start_services(base: Path, started: list[cluster.ServiceProcess]) -> None:
    """Nameserver, broker and timer-wheel, appended to ``started`` as they come up."""
    started.append(cluster.start_nameserver(base))
    namesrv = [started[0].addr]
    started.append(cluster.start_broker(base, namesrv))
    started.append(cluster.start_timer_wheel(base, namesrv))


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
    plan = Plan(pending, int(window_s * 1000), max(1, args.senders), args.lead_s, args.profile)
    base = Path(tempfile.mkdtemp(prefix="rocketq-timer-bench-"))
    started: list[cluster.ServiceProcess] = []
    try:
        start_services(base, started)
        ns, broker, timer = started
        print(f"nameserver {ns.addr}, broker {broker.addr}, timer-wheel {timer.addr}; {base}")
        pids = {"timer-wheel": timer.pid, "broker": broker.pid}
        print_report(asyncio.run(run_phases(plan, base, [ns.addr], timer.addr, pids)))
    finally:
        for sp in reversed(started):
            with contextlib.suppress(AssertionError):
                sp.stop(timeout_s=30)
        if args.keep:
            print(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
