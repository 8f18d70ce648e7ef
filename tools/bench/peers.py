"""RocketQ side by side with Redis Streams, NATS JetStream and RabbitMQ on this machine.

    python -m tools.bench.peers [--quick] [--only NAME ...] [--cold-memory]   (make bench-peers)

Installs Debian's redis-server, nats-server and rabbitmq-server when missing (apt-get), starts
each on 127.0.0.1 with a fresh data directory, then runs the same three phases against every
system, one system at a time, from this one Python process:

| phase   | what                                                             | figure          |
|---------|------------------------------------------------------------------|-----------------|
| produce | 1 KiB messages, 1 024 in flight (pipelines / batches), 10 s      | msgs/s acked    |
| drain   | read back everything the produce phase stored, bulk reads        | msgs/s, from    |
|         | (a RocketQ PushConsumer), at most 60 s                           | the first read  |
| latency | one outstanding durable send at a time, 2 000 sends              | p50 / p99 ms    |

Rows: RocketQ under ASYNC_FLUSH and SYNC_FLUSH (started through services/common/launch.py),
Redis 7 Streams with AOF everysec and always, NATS JetStream (file store), RabbitMQ (durable
queue, persistent messages, publisher confirms). Everything it started is stopped by pid
(the peer's own session for helpers such as epmd) and its directory removed. One table at the
end, with each figure's ratio to the best peer (for latency, best / figure: above 1 is better).
Before each system starts, free memory about the size of what it will write is touched and
released (``_page_memory.prepare``), so that no system pays for a VM's first touches of memory that
another one did not (``--cold-memory`` skips it; what a new page-cache page costs is printed
either way). ``--quick``: 3 s produce, 20 s drain limit, 300 latency sends. Figures are
printed, never asserted; the machine is shared, so say what else ran when you quote them. Never
run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from services.common import supervisor
from tools.bench import _page_memory
from tools.bench import _peer_systems as systems
from tools.bench._peer_systems import Clock, Driver, Phases
from tools.bench._process_cpu import cpu_s

BODY_BYTES = 1024


@dataclass(frozen=True)
class Plan:
    produce_s: float
    drain_limit_s: float
    latency_sends: int
    warmup_sends: int = 50
    warm_memory: bool = True


FULL = Plan(produce_s=10.0, drain_limit_s=60.0, latency_sends=2000)
QUICK = Plan(produce_s=3.0, drain_limit_s=20.0, latency_sends=300)

Factory = Callable[[Path], Awaitable[Driver]]
SYSTEMS: dict[str, Factory] = {
    "rocketq-async": lambda root: systems.rocketq_driver(root, "ASYNC_FLUSH"),
    "rocketq-sync": lambda root: systems.rocketq_driver(root, "SYNC_FLUSH"),
    "redis-everysec": lambda root: systems.redis_driver(root, "everysec"),
    "redis-always": lambda root: systems.redis_driver(root, "always"),
    "nats": systems.nats_driver,
    "rabbitmq": systems.rabbit_driver,
}


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def _server_cpu_s(driver: Driver) -> float:
    """CPU seconds the system's server processes have used (user + system)."""
    total = 0.0
    for sp in driver.processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += cpu_s(sp.pid)
    return total


class CpuMeter:
    """CPU µs per message of this client process and of the system's servers over one phase:
    where the time goes, and a figure a loaded machine disturbs less than throughput."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._client_s = time.process_time()
        self._server_s = _server_cpu_s(driver)

    def line(self, messages: int) -> str:
        if messages <= 0:
            return ""
        client_us = (time.process_time() - self._client_s) * 1e6 / messages
        server_us = (_server_cpu_s(self._driver) - self._server_s) * 1e6 / messages
        return f"; CPU per msg: client {client_us:.1f} µs, servers {server_us:.1f} µs"


async def run_phases(driver: Driver, plan: Plan) -> Phases:
    out = Phases(driver.name)
    body = os.urandom(BODY_BYTES)
    t0 = time.monotonic()
    cpu = CpuMeter(driver)
    out.produced = await driver.produce(body, plan.produce_s)
    out.produce_tps = out.produced / (time.monotonic() - t0)
    usage = cpu.line(out.produced)
    print(f"  produce: {out.produced} msgs, {out.produce_tps:,.0f} msgs/s{usage}", flush=True)
    clock = Clock()
    cpu = CpuMeter(driver)
    out.consumed = await driver.drain(out.produced, plan.drain_limit_s, clock)
    seconds = clock.seconds()
    out.consume_tps = out.consumed / seconds if seconds > 0 else 0.0
    usage = cpu.line(out.consumed)
    print(f"  drain: {out.consumed} msgs, {out.consume_tps:,.0f} msgs/s{usage}", flush=True)
    if out.consumed < out.produced:
        out.note = f"drained {out.consumed} of {out.produced} within {plan.drain_limit_s:g} s"
    for _ in range(plan.warmup_sends):
        await driver.send_one(body)
    samples: list[float] = []
    for _ in range(plan.latency_sends):
        t = time.perf_counter()
        await driver.send_one(body)
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    out.p50_ms, out.p99_ms = _percentile(samples, 0.5), _percentile(samples, 0.99)
    print(f"  latency: p50 {out.p50_ms:.3f} ms, p99 {out.p99_ms:.3f} ms", flush=True)
    return out


async def bench_one(key: str, plan: Plan, root: Path) -> Phases | None:
    print(f"== {key}", flush=True)
    print(" ", _page_memory.prepare(plan.produce_s, warm_memory=plan.warm_memory), flush=True)
    workdir = root / key
    driver: Driver | None = None
    try:
        driver = await SYSTEMS[key](workdir)
        return await run_phases(driver, plan)
    except Exception:
        traceback.print_exc()
        print(f"  {key} failed; left out of the table", flush=True)
        return None
    finally:
        if driver is not None:
            try:
                await driver.close()
            finally:
                systems.stop(driver.processes)
        shutil.rmtree(workdir, ignore_errors=True)


def _ratio(value: float, best: float, higher_is_better: bool) -> str:
    if best <= 0 or value <= 0:
        return "  -  "
    r = value / best if higher_is_better else best / value
    return f"{r:5.2f}x"


def table(rows: list[Phases], peers: set[str]) -> str:
    peer_rows = [r for r in rows if r.name in peers]
    best_p = max((r.produce_tps for r in peer_rows), default=0.0)
    best_c = max((r.consume_tps for r in peer_rows), default=0.0)
    best_l = min((r.p99_ms for r in peer_rows if r.p99_ms > 0), default=0.0)
    head = [
        "system (mode)",
        "produce msgs/s (vs best peer)",
        "consume msgs/s (vs best peer)",
        "sync send p50 / p99 ms (p99 vs best peer)",
    ]
    cells = [
        [
            r.name,
            f"{r.produce_tps:,.0f} ({_ratio(r.produce_tps, best_p, True).strip()})",
            f"{r.consume_tps:,.0f} ({_ratio(r.consume_tps, best_c, True).strip()})",
            f"{r.p50_ms:.3f} / {r.p99_ms:.3f} ({_ratio(r.p99_ms, best_l, False).strip()})",
        ]
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]

    def line(c: list[str]) -> str:
        return "| " + " | ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)) + " |"

    lines = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [line(c) for c in cells]
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + notes)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


async def main_async(keys: list[str], plan: Plan) -> list[Phases]:
    root = Path(tempfile.mkdtemp(prefix="rocketq-peers-"))
    rows: list[Phases] = []
    try:
        for key in keys:
            result = await bench_one(key, plan, root)
            if result is not None:
                rows.append(result)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    supervisor.children_die_with_this_process()  # a killed bench leaves nothing running
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s produce, 300 latency sends")
    parser.add_argument("--only", nargs="+", choices=sorted(SYSTEMS), help="run only these")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get peers")
    parser.add_argument(
        "--cold-memory", action="store_true", help="do not warm free memory before each system"
    )
    args = parser.parse_args(argv)
    keys = args.only or list(SYSTEMS)
    if not args.no_install and any(not k.startswith("rocketq") for k in keys):
        systems.ensure_installed()
    plan = dataclasses.replace(QUICK if args.quick else FULL, warm_memory=not args.cold_memory)
    print(f"before: {_load()}", flush=True)
    rows = asyncio.run(main_async(keys, plan))
    peers = {r.name for r in rows if not r.name.startswith("RocketQ")}
    print(f"\nafter: {_load()}; python {sys.version.split()[0]}")
    print(f"1 KiB messages, one client process, {plan.produce_s:g} s produce\n")
    print(table(rows, peers))


if __name__ == "__main__":
    main()
