"""Telemetry benchmark: what traces and metrics cost produce and consume throughput.

    python -m tools.bench.telemetry_bench [--duration S] [--quick]

Four modes, each on a fresh local RocketQ started as ``rocketq dev up --detach`` does (data in a
temporary directory) and a fresh client process:

| mode      | broker and client                                                          |
|-----------|----------------------------------------------------------------------------|
| plain     | the defaults: no metrics endpoint, no tracer provider                      |
| off       | metrics on (``metricsPort``, scraped once a second), tracing off           |
| sampled   | metrics on, 1 % of traces recorded (broker ``traceSampleRatio=0.01``, client   |
|           | sampler ``ParentBased(TraceIdRatioBased(0.01))``)                          |
| always-on | metrics on, every send, store and process span recorded                    |

Spans go to JSON-lines files (the broker's ``traceExporter=file``, the same exporter in the
client) in the run's directory: a real exporter whose cost is local disk writes. Each mode
runs: the AccumulatingProducer (1 KiB, 64 in flight: the batched path), 16 sync senders (one
message per request: the per-request cost shows most), and a push consumer draining the
backlog. The modes are run ``--rounds`` times, interleaved, and the median of each figure is
kept, so a burst of load from another process does not land on one mode only.

Printed per run: msgs/s and its ratio to plain (goal >= 0.9 at 1 %), and the CPU time the
client process and the broker process spent per message (µs, from /proc and
``time.process_time``): on a shared machine throughput swings with other processes' load, CPU
per message much less. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.cli._bench import ConsumeOptions, ProduceOptions, run_consume, run_produce
from rocketq.cli._bench_stats import Summary
from rocketq.client import _tracing
from rocketq.client.producer._sender import prepare_message
from rocketq.message import Message, MessageQueue, ReceivedMessage
from rocketq.validation import AUTO_CREATE_TOPIC_KEY, MESSAGE_MAX_BYTES
from services.cli.dev import dev_down, dev_up
from services.common.etcd import free_port
from services.common.telemetry import messaging as server_hooks
from services.common.telemetry import setup as telemetry_setup
from tools.bench._process_cpu import cpu_s

TOPIC = "TelemetryBench"
MODES = ("plain", "off", "sampled", "always-on")
SAMPLE_RATIO = {"sampled": 0.01, "always-on": 1.0}
RUNS = ("accumulate", "sync16", "consume")
Figures = dict[str, dict[str, float]]
"""run -> {tps, client_us, broker_us}."""


# ---- the client side, in a child process (a tracer provider is installed once per process) ----


def _install_telemetry(mode: str, spans_file: str) -> None:
    """This process's providers as a service's would be (services.common.telemetry.setup):
    the meter provider (no endpoint bound) and, when traced, a tracer provider writing
    ``spans_file`` with the mode's parent-based ratio sampler."""
    if mode == "plain":
        return
    cfg = SimpleNamespace(
        metrics_port=1,  # installs the meter provider; the endpoint is never started here
        trace_exporter="file" if mode in SAMPLE_RATIO else "none",
        trace_file=spans_file,
        trace_sample_ratio=SAMPLE_RATIO.get(mode, -1.0),
    )
    telemetry_setup.setup("bench-client", cfg)


def _hook_costs_us(calls: int = 20_000) -> dict[str, float]:
    """Wall µs per call of the hooks alone, in this process (this mode's providers): the
    client's send span (one message), the broker's Send wrapper (a one-message request that
    carries the trace context), the consumer's process span (one message)."""
    props: dict[str, str] = {}
    item = prepare_message(
        Message(TOPIC, b"x" * 1024),
        create_topic_key=AUTO_CREATE_TOPIC_KEY,
        max_size_bytes=MESSAGE_MAX_BYTES,
    )
    with _tracing.send_span(TOPIC, [item]):
        props.update(item.props)
    request = messaging_pb2.SendRequest(messages=[item.pb])
    response = messaging_pb2.SendResponse()
    response.results.add(msg_id="0")
    mq = MessageQueue(TOPIC, "broker-a", 0)
    msg = ReceivedMessage(TOPIC, item.body, dict(props), 0, 0, 0, "0", "", 0, 0, "", "")

    async def stored(_req: object, _peer: str) -> messaging_pb2.SendResponse:
        return response

    async def broker_side() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            await server_hooks.send(stored, request, "ipv4:127.0.0.1:1")
        return time.perf_counter() - start

    async def bare() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            await stored(request, "ipv4:127.0.0.1:1")
        return time.perf_counter() - start

    start = time.perf_counter()
    for _ in range(calls):
        with _tracing.send_span(TOPIC, [item]):
            pass
    send_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        with _tracing.process_span("g", mq, [msg]):
            pass
    process_s = time.perf_counter() - start
    broker_s = asyncio.run(broker_side()) - asyncio.run(bare())
    return {
        "send_span": send_s / calls * 1e6,
        "store_hook": max(broker_s, 0.0) / calls * 1e6,
        "process_span": process_s / calls * 1e6,
    }


def _client(mode: str, namesrv: str, broker_pid: int, duration_s: float, spans: str) -> Figures:

    _install_telemetry(mode, spans)
    hooks = _hook_costs_us()
    ns = (namesrv,)
    group = f"telemetry-bench-{os.getpid()}"
    runs: dict[str, Callable[[], Awaitable[Summary]]] = {
        "accumulate": lambda: run_produce(
            ProduceOptions(ns, topic=TOPIC, accumulate=True, concurrency=64, duration_s=duration_s),
            _quiet,
        ),
        "sync16": lambda: run_produce(
            ProduceOptions(ns, topic=TOPIC, concurrency=16, duration_s=duration_s), _quiet
        ),
        # Half as long as the produce runs, so it is less likely to drain the backlog (a
        # drained backlog caps msgs/s at what this mode produced; CPU per message is unaffected).
        "consume": lambda: run_consume(
            ConsumeOptions(ns, topic=TOPIC, group=group, duration_s=duration_s / 2), _quiet
        ),
    }

    async def measure() -> Figures:
        out: Figures = {}
        for name, run in runs.items():
            client0, broker0 = time.process_time(), cpu_s(broker_pid)
            summary = await run()
            count = max(summary.count, 1)
            out[name] = {
                "tps": summary.tps,
                "client_us": (time.process_time() - client0) / count * 1e6,
                "broker_us": (cpu_s(broker_pid) - broker0) / count * 1e6,
            }
        out["hooks_us"] = hooks
        return out

    return asyncio.run(measure())


def _quiet(_line: str) -> None:
    pass


# ---- the parent: one cluster per mode and round ------------------------------------------------


def _start(base: Path, mode: str) -> tuple[str, int, int]:
    """dev up for ``mode``: (nameserver address, broker pid, metrics port or 0)."""
    args = [
        "--dir",
        str(base),
        "--namesrv-port",
        "0",
        "--broker-port",
        "0",
        "--gateway-port",
        "0",
        "--detach",
    ]
    args += ["--no-demo", "--no-timer"]
    metrics_port = 0
    if mode != "plain":
        metrics_port = free_port()
        args += ["--set", f"metricsPort={metrics_port}"]
    if mode in SAMPLE_RATIO:
        args += ["--set", "traceExporter=file", "--set", f"traceFile={base / 'broker-spans.jsonl'}"]
        args += ["--set", f"traceSampleRatio={SAMPLE_RATIO[mode]}"]
    dev_up.main(args, standalone_mode=False)
    data = json.loads((base / "pids.json").read_text())
    return str(data["namesrv"]), int(data["processes"]["broker"]["pid"]), metrics_port


def _scrape_loop(port: int, stop: threading.Event) -> None:
    """Scrape like Prometheus would (every second), so the endpoint's cost is in the figures."""
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
        except OSError:
            pass


def run_mode(mode: str, duration_s: float) -> Figures:
    base = Path(tempfile.mkdtemp(prefix=f"rocketq-telbench-{mode}-"))
    stop = threading.Event()
    try:
        namesrv, broker_pid, metrics_port = _start(base, mode)
        if metrics_port:
            threading.Thread(target=_scrape_loop, args=(metrics_port, stop), daemon=True).start()
        child = subprocess.run(
            [sys.executable, "-m", "tools.bench.telemetry_bench", "--child", mode,
             "--namesrv", namesrv, "--broker-pid", str(broker_pid), "--duration", str(duration_s),
             "--spans", str(base / "client-spans.jsonl")],
            capture_output=True, text=True, check=False, timeout=duration_s * 10 + 60,
        )  # fmt: skip
        if child.returncode != 0:
            raise RuntimeError(f"client of mode {mode} failed:\n{child.stderr[-2000:]}")
        figures: Figures = json.loads(child.stdout.strip().splitlines()[-1])
        return figures
    finally:
        stop.set()
        if (base / "pids.json").exists():
            dev_down.main(["--dir", str(base)], standalone_mode=False)
        shutil.rmtree(base, ignore_errors=True)


def median_figures(rounds: list[Figures]) -> Figures:
    return {
        run: {k: statistics.median(r[run][k] for r in rounds) for k in rounds[0][run]}
        for run in (*RUNS, "hooks_us")
    }


def report(results: dict[str, Figures]) -> list[str]:
    plain = results["plain"]
    lines = []
    for run in RUNS:
        lines.append(f"{run}: {'mode':<10} {'msgs/s':>9} {'ratio':>6} {'client µs/msg':>14} "
                     f"{'broker µs/msg':>14}")  # fmt: skip
        for mode, figures in results.items():
            f, base = figures[run], plain[run]["tps"]
            ratio = f["tps"] / base if base else 0.0
            lines.append(
                f"{'':{len(run) + 2}}{mode:<10} {f['tps']:>9.0f} {ratio:>5.2f}x "
                f"{f['client_us']:>14.1f} {f['broker_us']:>14.1f}"
            )
    lines.append(f"hook cost, µs per call: {'mode':<10} {'send span':>10} {'store hook':>11} "
                 f"{'process span':>13}")  # fmt: skip
    for mode, figures in results.items():
        h = figures["hooks_us"]
        lines.append(f"{'':24}{mode:<10} {h['send_span']:>10.2f} {h['store_hook']:>11.2f} "
                     f"{h['process_span']:>13.2f}")  # fmt: skip
    sampled = results.get("sampled")
    if sampled is not None:
        worst = min(sampled[r]["tps"] / plain[r]["tps"] for r in RUNS if plain[r]["tps"])
        lines.append(
            f"goal: >= 0.9 of plain throughput at 1 % sampling: worst ratio {worst:.2f} "
            f"({'met' if worst >= 0.9 else 'NOT met'})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median kept)")
    parser.add_argument("--quick", action="store_true", help="2-second runs, one round")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--namesrv", help=argparse.SUPPRESS)
    parser.add_argument("--broker-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spans", help=argparse.SUPPRESS)
    args = parser.parse_args()
    duration_s = 2.0 if args.quick else args.duration
    rounds = 1 if args.quick else max(1, args.rounds)
    if args.child:
        figures = _client(args.child, args.namesrv, args.broker_pid, duration_s, args.spans)
        print(json.dumps(figures), flush=True)
        return
    collected: dict[str, list[Figures]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in MODES:
            print(f"round {r + 1}/{rounds}, mode {mode} ...", flush=True)
            collected[mode].append(run_mode(mode, duration_s))
    results = {mode: median_figures(rs) for mode, rs in collected.items()}
    print(f"median of {rounds} round(s), {duration_s:g} s per run:")
    print("\n".join(report(results)), flush=True)


if __name__ == "__main__":
    main()
