"""Orderly consume throughput on a 16-queue topic: measured and printed, never asserted.

    python -m tools.bench.orderly_bench [--namesrv HOST:PORT] [--messages N] [--quick]
                                        [--batch N] [--async-listener]

Without ``--namesrv`` it starts a local RocketQ as :mod:`tools.bench.messaging_bench` does
(``rocketq dev up``: nameserver + broker on free ports, data in a temporary directory) and stops
it afterwards. Then:

1. creates a 16-queue topic and preloads it with N messages (200 000; 20 000 with ``--quick``),
   128-byte bodies, N/16 per queue, in ``send_batch`` calls of 256;
2. drains that backlog with a fresh consumer group for each run:

| run        | consumers                    | listener                                  |
|------------|------------------------------|-------------------------------------------|
| orderly    | 1 process                    | orderly, one message per call (batch 1)   |
| orderly    | 2 processes                  | the same, 8 queues each after rebalancing |
| concurrent | 1 process                    | concurrent, one message per call          |

Every consumer is its own process (:mod:`tests.integration.workers.orderly_worker` with
``--stats-file``, no history, an instant listener), as it would be deployed; throughput is N
divided by the time from the first listener call of the run to the last. The concurrent run
drains the same backlog, so "orderly / concurrent" is the price of per-queue order: one call at
a time per queue, and a broker lock per queue.

Numbers are Python client processes against one broker on this machine; on a shared or small
machine they say more about the machine than about RocketQ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rocketq.cli._bench import ensure_topic
from rocketq.client.admin import Admin
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue
from services.common import supervisor
from services.common.supervisor import Process, StopTimeout
from tools.bench.messaging_bench import _start_local, _stop_local

QUEUES = 16
MESSAGES_DEFAULT = 200_000
MESSAGES_QUICK = 20_000
BODY_BYTES = 128
SEND_BATCH = 256
WORKER_MODULE = "tests.integration.workers.orderly_worker"
READY_TIMEOUT_S = 30.0
DRAIN_FLOOR_MSGS_PER_S = 500
"""A run is abandoned when it would drain slower than this (plus a fixed grace)."""
DRAIN_GRACE_S = 30.0
POLL_S = 0.2


@dataclass(frozen=True)
class Run:
    title: str
    mode: str
    consumers: int
    batch: int = 1
    """consume_message_batch_max_size: messages per listener call."""
    async_listener: bool = False
    """A coroutine listener on the event loop instead of a function on the thread pool."""


@dataclass
class Result:
    run: Run
    messages: int
    drain_s: float
    """First listener call to last listener call end, over all consumers."""
    wall_s: float
    """Process start to the last message."""

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.drain_s if self.drain_s > 0 else 0.0


def runs(batch: int, async_listener: bool) -> list[Run]:
    return [
        Run("orderly, 1 consumer", "orderly", 1, batch, async_listener),
        Run("orderly, 2 consumers", "orderly", 2, batch, async_listener),
        Run("concurrent, 1 consumer", "concurrent", 1, batch, async_listener),
    ]


# ---- preload ----------------------------------------------------------------------------------
async def preload(namesrv: tuple[str, ...], topic: str, messages: int) -> float:
    """Send ``messages`` spread evenly over the topic's queues; returns msgs/s."""
    await ensure_topic(namesrv, topic, QUEUES)
    body = os.urandom(BODY_BYTES)
    config = ProducerConfig(f"orderly-bench-loader-{os.getpid()}", namesrv)
    async with Admin(namesrv) as admin:
        route = await admin.route(topic)
    queues = sorted(
        MessageQueue(topic, rq.broker_name, qid)
        for rq in route.queues
        for qid in range(rq.write_queue_nums)
    )
    if not queues:
        raise RuntimeError(f"no writable queue for {topic}")
    async with Producer(config) as producer:
        t0 = time.perf_counter()

        async def fill(mq: MessageQueue, count: int) -> None:
            seq = 0
            while seq < count:
                n = min(SEND_BATCH, count - seq)
                msgs = [
                    Message(topic, body, properties={"order_seq": str(seq + i)}) for i in range(n)
                ]
                await producer.send_batch(msgs, queue=mq)
                seq += n

        share, extra = divmod(messages, len(queues))
        await asyncio.gather(
            *(fill(mq, share + (1 if i < extra else 0)) for i, mq in enumerate(queues))
        )
        return messages / (time.perf_counter() - t0)


# ---- one drain run ----------------------------------------------------------------------------
@dataclass
class _Worker:
    process: Process
    stats: Path

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process.proc

    def log_tail(self, lines: int = 20) -> str:
        return self.process.log_tail(lines)


def _spawn(base: Path, name: str, namesrv: str, topic: str, group: str, run: Run) -> _Worker:
    """Start a worker (not waited for: :func:`_wait_ready` waits for all of them at once)."""
    d = base / name
    ready, stats, log_path = d / "ready.json", d / "stats.json", d / "worker.log"
    argv = [
        sys.executable,
        "-m",
        WORKER_MODULE,
        "--namesrv",
        namesrv,
        "--group",
        group,
        "--topic",
        topic,
        "--stats-file",
        str(stats),
        "--ready-file",
        str(ready),
        "--mode",
        run.mode,
        "--batch",
        str(run.batch),
        "--log-level",
        "WARNING",
        *(["--async-listener"] if run.async_listener else []),
    ]

    def is_ready(_sp: Process) -> str | None:
        return "ready" if _read_json(ready) is not None else None

    process = supervisor.launch(
        name, argv, d, is_ready, log_path=log_path, ready_file=ready, wait=False
    )
    return _Worker(process, stats)


def _read_json(path: Path) -> dict[str, int] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _wait_ready(workers: list[_Worker]) -> None:
    supervisor.wait_ready([w.process for w in workers], READY_TIMEOUT_S)


def _stop(workers: list[_Worker]) -> None:
    for w in workers:  # all at once: they leave the group in parallel
        if w.process.alive():
            w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        with contextlib.suppress(StopTimeout):
            w.process.stop(20)


def drain(base: Path, namesrv: str, topic: str, messages: int, run: Run, n: int) -> Result:
    """Start ``run.consumers`` fresh-group workers and time how long the backlog takes."""
    group = f"orderly-bench-{os.getpid()}-{n}"
    t_start = time.monotonic()
    workers = [
        _spawn(base, f"run{n}-w{i}", namesrv, topic, group, run) for i in range(run.consumers)
    ]
    try:
        _wait_ready(workers)
        deadline = t_start + DRAIN_GRACE_S + messages / DRAIN_FLOOR_MSGS_PER_S
        while True:
            stats = [_read_json(w.stats) or {} for w in workers]
            done = sum(s.get("messages", 0) for s in stats)
            if done >= messages:
                break
            for w in workers:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"a worker died with {w.proc.returncode}\n{w.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{run.title}: only {done}/{messages} consumed; giving up")
            time.sleep(POLL_S)
        wall_s = time.monotonic() - t_start
        first_ns = min(s["first_ns"] for s in stats if s.get("first_ns"))
        last_ns = max(s.get("last_ns", 0) for s in stats)
        return Result(run, done, (last_ns - first_ns) / 1e9, wall_s)
    finally:
        _stop(workers)


# ---- report -----------------------------------------------------------------------------------
def print_table(results: list[Result], messages: int, preload_rate: float) -> None:
    console = Console()
    first = results[0].run
    listener = "coroutine" if first.async_listener else "thread-pool"
    table = Table(
        title=f"Orderly consume throughput, {QUEUES}-queue topic, {messages} messages, "
        f"{listener} listener, {first.batch} per call"
    )
    table.add_column("run")
    table.add_column("msgs", justify="right")
    table.add_column("drain s", justify="right")
    table.add_column("msgs/s", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("vs concurrent", justify="right")
    concurrent = next((r for r in results if r.run.mode == "concurrent"), None)
    for r in results:
        ratio = f"{r.msgs_per_s / concurrent.msgs_per_s:.2f}" if concurrent else "-"
        table.add_row(
            r.run.title,
            str(r.messages),
            f"{r.drain_s:.2f}",
            f"{r.msgs_per_s:,.0f}",
            f"{r.wall_s:.2f}",
            ratio,
        )
    console.print(table)
    console.print(
        f"preload: {messages} x {BODY_BYTES} B in batches of {SEND_BATCH}: "
        f"{preload_rate:,.0f} msgs/s. Drain = first to last listener call; wall includes "
        "process start, rebalance and locking."
    )


def suite(
    namesrv: tuple[str, ...],
    messages: int,
    base: Path,
    batch: int = 1,
    async_listener: bool = False,
) -> list[Result]:
    topic = f"OrderlyBench{os.getpid()}"
    print(f"preloading {messages} messages into {topic} ({QUEUES} queues)", flush=True)
    preload_rate = asyncio.run(preload(namesrv, topic, messages))
    results = []
    for n, run in enumerate(runs(batch, async_listener)):
        print(f"{run.title}: draining", flush=True)
        r = drain(base, ";".join(namesrv), topic, messages, run, n)
        print(f"  {r.msgs_per_s:,.0f} msgs/s ({r.drain_s:.2f} s)", flush=True)
        results.append(r)
    print_table(results, messages, preload_rate)
    return results


def main() -> None:
    supervisor.children_die_with_this_process()  # a killed bench leaves nothing running
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namesrv", help="bench this cluster instead of starting one")
    parser.add_argument("--messages", type=int, help=f"backlog size (default {MESSAGES_DEFAULT})")
    parser.add_argument("--quick", action="store_true", help=f"{MESSAGES_QUICK} messages")
    parser.add_argument("--batch", type=int, default=1, help="messages per listener call")
    parser.add_argument(
        "--async-listener", action="store_true", help="coroutine listener (default: thread pool)"
    )
    args = parser.parse_args()
    messages = args.messages or (MESSAGES_QUICK if args.quick else MESSAGES_DEFAULT)
    base = Path(tempfile.mkdtemp(prefix="rocketq-orderly-bench-"))
    try:
        namesrv: tuple[str, ...] = (args.namesrv,) if args.namesrv else ()
        if not namesrv:
            namesrv = _start_local(base / "cluster")
            print(f"local RocketQ at {namesrv[0]}, data in {base}", flush=True)
        suite(namesrv, messages, base, args.batch, args.async_listener)
    finally:
        if (base / "cluster" / "pids.json").exists():
            _stop_local(base / "cluster")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
