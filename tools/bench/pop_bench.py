"""Pop consumption benchmark: RocketQ's SimpleConsumer beside the official RocketMQ 5 Python SDK
on the gateway, against the same local broker. Figures are printed, never asserted.

    python -m tools.bench.pop_bench [--messages N] [--consumers C] [--fifo-groups G]

Starts a local RocketQ as ``rocketq dev up --detach`` does, with the gateway on a free port, and
measures:

| # | what                                                                              |
|---|-----------------------------------------------------------------------------------|
| 1 | RocketQ SimpleConsumer: C concurrent receive(32) + ack loops draining N messages  |
|   | (msgs/s, receive call latency p50/p99)                                            |
| 2 | official SDK (``.venv-rmq5``, its own process): sync sends through the gateway    |
| 3 | official SDK SimpleConsumer: receive(32) + ack draining what 2 sent               |
| 4 | with ``--fifo-groups G``: 1 again for a FIFO consumer group, the messages spread  |
|   | over G message groups (ordered per group, services/broker/pop/fifo.py)            |

One client process per side against one broker: on a shared or small machine the figures say
more about the machine than about RocketQ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rocketq import Message, Producer, ProducerConfig, SimpleConsumer, SimpleConsumerConfig
from rocketq.client.admin import Admin, GroupConfig, TopicConfig
from rocketq.codec import Prop
from services.cli.dev import dev_down, dev_up
from services.common.etcd import free_port

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
SDK_APP = Path(__file__).resolve().parent / "_v2_sdk_bench_app.py"
QUEUES = 4
BODY = b"x" * 1024
SDK_APP_TIMEOUT_S = 600
DRAIN_MAX_S = 300


async def _backlog(namesrv: tuple[str, ...], topic: str, count: int, groups: int = 0) -> None:
    """``count`` messages; with ``groups``, of that many message groups in turn (each to the
    queue its group hashes to, as FIFO producers send)."""
    async with Admin(list(namesrv)) as admin:
        await admin.create_topic(TopicConfig(topic, QUEUES, QUEUES))
    async with Producer(ProducerConfig("pop-bench", namesrv)) as producer:
        for start in range(0, count, 64):
            batch = range(start, min(start + 64, count))
            if not groups:
                await asyncio.gather(*(producer.send(Message(topic, BODY)) for _ in batch))
                continue
            for i in batch:  # in order: one group's messages must keep their order
                group = f"g{i % groups}"
                msg = Message(topic, BODY, properties={Prop.SHARDING_KEY: group})
                await producer.send(msg, sharding_key=group)


async def rocketq_pop(
    namesrv: tuple[str, ...], count: int, consumers: int, fifo_groups: int = 0
) -> str:
    topic = "PopBenchFifo" if fifo_groups else "PopBenchRocketQ"
    group = "pop-bench-fifo" if fifo_groups else "pop-bench"
    if fifo_groups:
        async with Admin(list(namesrv)) as admin:
            await admin.create_group(GroupConfig(group, consume_message_orderly=True))
    await _backlog(namesrv, topic, count, fifo_groups)
    latencies_ms: list[float] = []
    done = 0

    async def loop(name: str) -> None:
        nonlocal done
        cfg = SimpleConsumerConfig(group, namesrv, await_duration_ms=1000, instance_name=name)
        async with SimpleConsumer(cfg) as sc:
            sc.subscribe(topic)
            while done < count and time.perf_counter() < give_up:
                t0 = time.perf_counter()
                got = await sc.receive(32, 30_000)
                latencies_ms.append((time.perf_counter() - t0) * 1000)
                if not got:
                    if fifo_groups:
                        continue  # the other consumers hold every group right now
                    return
                await asyncio.gather(*(sc.ack(m) for m in got))
                done += len(got)

    started = time.perf_counter()
    give_up = started + DRAIN_MAX_S
    await asyncio.gather(*(loop(f"c{i}") for i in range(consumers)))
    took_s = time.perf_counter() - started
    lat = sorted(latencies_ms)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
    what = (
        f"4. RocketQ SimpleConsumer, FIFO over {fifo_groups} message groups"
        if fifo_groups
        else "1. RocketQ SimpleConsumer"
    )
    return (
        f"{what}, {consumers} consumers: {done} msgs in {took_s:.2f} s = "
        f"{done / took_s:.0f} msgs/s; receive p50 {statistics.median(lat or [0]):.1f} ms, "
        f"p99 {p99:.1f} ms"
    )


def official_sdk(namesrv: tuple[str, ...], port: int, count: int) -> list[str]:
    if not SDK_PYTHON.exists():
        return [
            "2-3. skipped: the official SDK is not installed (make setup puts it in .venv-rmq5)"
        ]
    topic = "PopBenchOfficial"
    asyncio.run(_create(namesrv, topic))
    run = subprocess.run(
        [str(SDK_PYTHON), str(SDK_APP), f"127.0.0.1:{port}", topic, "pop-bench-v2", str(count)],
        capture_output=True, text=True, timeout=SDK_APP_TIMEOUT_S, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        return [f"2-3. the SDK app failed:\n{run.stderr[-2000:]}"]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    return [
        f"2. official SDK sync send via the gateway: {r['sent']} msgs in {r['send_s']:.2f} s = "
        f"{r['sent'] / r['send_s']:.0f} msgs/s",
        f"3. official SDK SimpleConsumer: {r['received']} msgs in {r['receive_s']:.2f} s = "
        f"{r['received'] / r['receive_s']:.0f} msgs/s; receive p50 {r['p50_ms']:.1f} ms, "
        f"p99 {r['p99_ms']:.1f} ms",
    ]


async def _create(namesrv: tuple[str, ...], topic: str) -> None:
    async with Admin(list(namesrv)) as admin:
        await admin.create_topic(TopicConfig(topic, QUEUES, QUEUES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--fifo-groups", type=int, default=0)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rocketq-pop-bench-"))
    port = free_port()
    try:
        dev_up.main(
            ["--dir", str(base), "--namesrv-port", "0", "--broker-port", "0", "--detach",
             "--no-demo", "--no-timer", "--set", f"gatewayPort={port}"],
            standalone_mode=False,
        )  # fmt: skip
        namesrv = (str(json.loads((base / "pids.json").read_text())["namesrv"]),)
        lines = [asyncio.run(rocketq_pop(namesrv, args.messages, args.consumers))]
        print(lines[0], flush=True)
        for line in official_sdk(namesrv, port, min(args.messages, 1000)):
            print(line, flush=True)
        if args.fifo_groups > 0:
            fifo = rocketq_pop(namesrv, args.messages, args.consumers, args.fifo_groups)
            print(asyncio.run(fifo), flush=True)
    finally:
        dev_down.main(["--dir", str(base)], standalone_mode=False)
        shutil.rmtree(base, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
