"""Messaging benchmark suite: the issue's four targets, measured and printed, never asserted.

    python -m tools.bench.messaging_bench [--namesrv HOST:PORT] [--duration S] [--quick]

Without ``--namesrv`` it starts a local RocketQ exactly as ``rocketq dev up --detach`` does
(nameserver + broker on free ports, data in a temporary directory) and stops it afterwards.
Then, with the same engine as ``rocketq bench`` (:mod:`rocketq.cli._bench`):

| # | what                                                  | target               |
|---|-------------------------------------------------------|----------------------|
| 1 | AccumulatingProducer, 1 KiB messages                  | >= 100 000 msgs/s    |
| 2 | single-message sync send, 1 and 16 concurrent senders | p99 RT < 5 ms        |
| 3 | push consumer draining the backlog of 1               | >= 100 000 msgs/s    |
| 4 | produce-to-consume latency at 10 000 msgs/s           | p99 < 20 ms          |

Each line ends with the target and whether this run met it, for the closing note. Numbers are
one Python client process against one broker on this machine; on a shared or small machine
they say more about the machine than about RocketQ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

from rocketq.cli._bench import (
    ConsumeOptions,
    LatencyOptions,
    ProduceOptions,
    run_consume,
    run_latency,
    run_produce,
)
from rocketq.cli._bench_stats import Summary, format_summary
from services.cli.dev import dev_down, dev_up

TOPIC = "BenchmarkTest"


def _quiet(line: str) -> None:
    print("   ", line, flush=True)


def _verdict(ok: bool, target: str) -> str:
    return f"target {target}: {'met' if ok else 'NOT met'}"


async def suite(namesrv: tuple[str, ...], duration_s: float) -> list[str]:
    lines: list[str] = []

    def report(title: str, s: Summary, label: str, verdict: str) -> None:
        text = f"  {format_summary(s, label)}\n  {verdict}"
        print(text, flush=True)
        lines.append(f"{title}\n{text}")

    print("1. accumulating producer, 1 KiB", flush=True)
    acc = await run_produce(
        ProduceOptions(
            namesrv, topic=TOPIC, accumulate=True, concurrency=64, duration_s=duration_s
        ),
        _quiet,
    )
    report("1. accumulating producer, 1 KiB", acc, "RT", _verdict(acc.tps >= 100_000, ">= 100k/s"))

    for workers in (1, 16):
        title = f"2. sync send, 1 KiB, {workers} sender(s)"
        print(title, flush=True)
        s = await run_produce(
            ProduceOptions(
                namesrv, topic=TOPIC, concurrency=workers, duration_s=max(2.0, duration_s / 2)
            ),
            _quiet,
        )
        report(title, s, "RT", _verdict(s.p99_ms < 5, "p99 < 5 ms"))

    print("3. push consumer draining the backlog", flush=True)
    group = f"rocketq-bench-drain-{os.getpid()}"
    cons = await run_consume(
        ConsumeOptions(namesrv, topic=TOPIC, group=group, duration_s=duration_s), _quiet
    )
    report("3. push consumer", cons, "delay", _verdict(cons.tps >= 100_000, ">= 100k/s"))

    print("4. produce-to-consume latency at 10 000 msgs/s", flush=True)
    sent, e2e = await run_latency(LatencyOptions(namesrv, duration_s=duration_s), _quiet)
    report("4. latency (send side)", sent, "send RT", f"achieved rate {sent.tps:.0f} msgs/s")
    report("4. latency (end to end)", e2e, "e2e", _verdict(e2e.p99_ms < 20, "p99 < 20 ms"))
    return lines


def _start_local(base: Path) -> tuple[str, ...]:
    dev_up.main(
        [
            "--dir",
            str(base),
            "--namesrv-port",
            "0",
            "--broker-port",
            "0",
            "--gateway-port",
            "0",
            "--detach",
            "--no-demo",
        ],
        standalone_mode=False,
    )
    data = json.loads((base / "pids.json").read_text())
    return (str(data["namesrv"]),)


def _stop_local(base: Path) -> None:
    dev_down.main(["--dir", str(base)], standalone_mode=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namesrv", help="bench this cluster instead of starting one")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--quick", action="store_true", help="3-second runs")
    args = parser.parse_args()
    duration_s = 3.0 if args.quick else args.duration
    if args.namesrv:
        asyncio.run(suite((args.namesrv,), duration_s))
        return
    base = Path(tempfile.mkdtemp(prefix="rocketq-bench-"))
    try:
        namesrv = _start_local(base)
        print(f"local RocketQ at {namesrv[0]}, data in {base}", flush=True)
        asyncio.run(suite(namesrv, duration_s))
    finally:
        if (base / "pids.json").exists():
            _stop_local(base)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
