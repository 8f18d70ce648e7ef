"""Client CPU per message of a PushConsumer draining a backlog (issue 16, consume side).

Starts a nameserver and a broker on loopback (fresh data dirs, stopped by pid at the end),
stores ``--messages`` messages of ``--body-bytes`` once, then drains them ``--rounds`` times,
each round with a new consumer group reading from the first offset. Per round it prints the
drain rate and the CPU this process and the broker spent per message between the listener's
first and last message (the broker's read from /proc): consumer start-up (routes, rebalance,
offsets) is left out, so rounds of different sizes and code versions compare; the start-up's
own CPU is printed beside it. Run it a few
times, old and new code interleaved, on a machine that is otherwise as quiet as it gets; say
the load (printed) with any figure.

    .venv/bin/python -m tools.bench.drain_bench --messages 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rocketq.cli._bench import ensure_topic
from rocketq.client.consumer import (
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message
from services.common import launch, supervisor
from tools.bench._process_cpu import cpu_s

TOPIC = "DrainBench"
QUEUES = 8
SEND_BATCH = 128
SENDS_IN_FLIGHT = 8
ROUND_LIMIT_S = 300.0
"""A round that has not drained by then is reported as what it got."""


async def _produce(namesrv: tuple[str, ...], count: int, body: bytes) -> None:
    producer = Producer(ProducerConfig("drain-bench", namesrv))
    await producer.start()
    left = [count]

    async def worker() -> None:
        while left[0] > 0:
            n = min(SEND_BATCH, left[0])
            left[0] -= n
            await producer.send_batch([Message(TOPIC, body, tags="bench") for _ in range(n)])

    try:
        await asyncio.gather(*(worker() for _ in range(SENDS_IN_FLIGHT)))
    finally:
        await producer.close()


async def _drain(
    namesrv: tuple[str, ...], group: str, count: int, batch: int, broker_pid: int
) -> str:
    done = asyncio.Event()
    n = 0
    # process CPU, wall time and the broker's CPU at the first message, and at the last
    first: list[float] = []
    last: list[float] = []

    async def listener(msgs: list[Any], _ctx: Any) -> ConsumeResult:
        nonlocal n
        if not first:
            first.extend((time.process_time(), time.perf_counter(), cpu_s(broker_pid)))
        n += len(msgs)
        if n >= count and not last:
            last.extend((time.process_time(), time.perf_counter(), cpu_s(broker_pid)))
            done.set()
        return ConsumeResult.CONSUME_SUCCESS

    config = PushConsumerConfig(
        group,
        namesrv,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=batch,
    )
    start_cpu_s = time.process_time()
    consumer = PushConsumer(config, listener)
    consumer.subscribe(TOPIC)
    async with consumer:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), ROUND_LIMIT_S)
    whole_us = (time.process_time() - start_cpu_s) * 1e6 / max(n, 1)
    if not last:
        return f"{group}: drained {n} of {count} in {ROUND_LIMIT_S:.0f} s"
    cpu_us = (last[0] - first[0]) * 1e6 / n
    rate = n / max(last[1] - first[1], 1e-9)
    broker_us = (last[2] - first[2]) * 1e6 / n
    start_ms = (first[0] - start_cpu_s) * 1e3
    return (
        f"{group}: {n} msgs, {rate:,.0f} msgs/s; CPU per msg: client {cpu_us:.2f} µs, "
        f"broker {broker_us:.2f} µs (client start-up to the first message: {start_ms:.0f} ms "
        f"CPU; start to close: {whole_us:.2f} µs per msg)"
    )


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="drain-bench-") as tmp:
        base = Path(tmp)
        ns = launch.start_nameserver(base)
        started = [ns]
        try:
            broker = launch.start_broker(base, [ns.addr])
            started.append(broker)
            namesrv = (ns.addr,)
            await ensure_topic(namesrv, TOPIC, QUEUES)
            await _produce(namesrv, args.messages, os.urandom(args.body_bytes))
            for r in range(args.rounds):
                load = os.getloadavg()[0]
                line = await _drain(
                    namesrv, f"drain-bench-{r}", args.messages, args.batch, broker.pid
                )
                print(f"  {line} (load {load:.1f})", flush=True)
        finally:
            for sp in reversed(started):
                with contextlib.suppress(supervisor.StopTimeout):
                    sp.stop()


def main() -> None:
    supervisor.children_die_with_this_process()  # a killed bench leaves nothing running
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1, help="consume_message_batch_max_size")
    args = parser.parse_args()
    print(f"drain bench: {args.messages} x {args.body_bytes} B, listener batch {args.batch}")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
