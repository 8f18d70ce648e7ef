"""``rocketq bench produce|consume|latency``: load a running RocketQ and print what it does.

A thin layer over :mod:`rocketq.cli._bench` (which ``tools/bench/messaging_bench.py`` also
drives for ``make bench``). Output, like RocketMQ's benchmark/producer.sh: a progress line
every ``--interval`` seconds and one final ``SUMMARY`` line::

    [    2.0s] send TPS      10234 | RT avg   1.552 ms max   12.021 ms | failed 0
    SUMMARY produce: 51170 msgs in 5.00 s | TPS 10234 | RT avg 1.552 ms max 12.021 ms ...

``--json`` prints the summary as JSON instead of the SUMMARY line. Exit code 1 if every
operation failed (nothing measured).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from rocketq.cli._bench import (
    ConsumeOptions,
    LatencyOptions,
    ProduceOptions,
    run_consume,
    run_latency,
    run_produce,
)
from rocketq.cli._bench_stats import Summary, format_summary
from rocketq.cli._common import echo_json, namesrv_list, namesrv_option, run


def _finish(summaries: list[tuple[Summary, str]], as_json: bool) -> None:
    if as_json:
        echo_json(
            [dataclasses.asdict(s) | {"tps": s.tps, "latency": label} for s, label in summaries]
        )
    else:
        for s, label in summaries:
            click.echo(format_summary(s, label))
    if all(s.count == 0 for s, _ in summaries):
        raise SystemExit(1)


def _common(f: Any) -> Any:
    f = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")(f)
    f = click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds.")(f)
    f = click.option(
        "-d", "--duration", type=click.FloatRange(min=0.1), default=10.0, show_default=True
    )(f)
    return namesrv_option(f)


@click.group()
def bench() -> None:
    """Benchmarks in the style of RocketMQ's benchmark/producer.sh and consumer.sh."""


@bench.command("produce")
@click.option("-t", "--topic", default="BenchmarkTest", show_default=True)
@click.option(
    "-s", "--size", type=click.IntRange(1, 4 * 1024 * 1024), default=1024, show_default=True
)
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("-b", "--batch", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option("--async", "async_send", is_flag=True, help="send_async, --concurrency in flight.")
@click.option("--accumulate", is_flag=True, help="AccumulatingProducer (batches by linger).")
@click.option("--linger-ms", type=click.IntRange(min=0), default=5, show_default=True)
@_common
def bench_produce(
    topic: str,
    size: int,
    concurrency: int,
    batch: int,
    async_send: bool,
    accumulate: bool,
    linger_ms: int,
    duration: float,
    interval: float,
    as_json: bool,
    namesrv: str,
) -> None:
    """Send SIZE-byte messages to TOPIC for --duration seconds (created if missing)."""
    if async_send and accumulate:
        raise click.UsageError("choose --async or --accumulate, not both")
    opts = ProduceOptions(
        tuple(namesrv_list(namesrv)),
        topic=topic,
        size_bytes=size,
        concurrency=concurrency,
        batch=batch,
        async_send=async_send,
        accumulate=accumulate,
        linger_ms=linger_ms,
        duration_s=duration,
        interval_s=interval,
    )
    summary = run(run_produce(opts, click.echo))
    _finish([(summary, "RT")], as_json)


@bench.command("consume")
@click.option("-t", "--topic", default="BenchmarkTest", show_default=True)
@click.option("-g", "--group", default="rocketq-bench-consumer", show_default=True)
@click.option("--from", "start", type=click.Choice(["first", "last"]), default="first")
@click.option("--batch", type=click.IntRange(1, 1024), default=32, show_default=True)
@click.option("--pull-batch", type=click.IntRange(1, 1024), default=64, show_default=True)
@_common
def bench_consume(
    topic: str,
    group: str,
    start: str,
    batch: int,
    pull_batch: int,
    duration: float,
    interval: float,
    as_json: bool,
    namesrv: str,
) -> None:
    """Consume TOPIC with a push consumer for --duration seconds (RT = born to consumed)."""
    opts = ConsumeOptions(
        tuple(namesrv_list(namesrv)),
        topic=topic,
        group=group,
        duration_s=duration,
        interval_s=interval,
        from_first=start == "first",
        batch=batch,
        pull_batch=pull_batch,
    )
    summary = run(run_consume(opts, click.echo))
    _finish([(summary, "delay")], as_json)


@bench.command("latency")
@click.option("-t", "--topic", default="BenchmarkLatency", show_default=True)
@click.option("-r", "--rate", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option(
    "-s", "--size", type=click.IntRange(1, 4 * 1024 * 1024), default=256, show_default=True
)
@click.option(
    "--accumulate/--no-accumulate",
    default=True,
    show_default=True,
    help="Batch sends with a 1 ms linger, or one async send per message.",
)
@_common
def bench_latency(
    topic: str,
    rate: int,
    size: int,
    accumulate: bool,
    duration: float,
    interval: float,
    as_json: bool,
    namesrv: str,
) -> None:
    """Produce at --rate msgs/s and measure produce-to-consume latency in this process."""
    opts = LatencyOptions(
        tuple(namesrv_list(namesrv)),
        topic=topic,
        rate=rate,
        size_bytes=size,
        duration_s=duration,
        interval_s=interval,
        accumulate=accumulate,
    )
    sent, e2e = run(run_latency(opts, click.echo))
    _finish([(sent, "send RT"), (e2e, "e2e")], as_json)


BENCH_COMMANDS = (bench,)
