"""Filtered pull throughput: SQL92 and TAG filters against an unfiltered pull, as ratios.

    python -m tools.bench.filter_bench [--namesrv HOST:PORT] [--messages N] [--quick]

Without ``--namesrv`` it starts a local RocketQ like ``rocketq dev up --detach`` does, with
``enablePropertyFilter=true`` (the broker refuses SQL92 otherwise), and stops it afterwards.
It preloads one topic (4 queues; 200 000 messages, 20 000 with ``--quick``; 128-byte bodies,
tag ``T{i % 10}``, user property ``a = i % 100``), then reads the whole backlog with raw Pull
calls (32 messages per pull, one reader per queue, like a consumer's pull loops; the best of
``--rounds`` reads, 3 by default) under each subscription:

| run                | subscription   | matches |
|--------------------|----------------|---------|
| unfiltered         | TAG ``*``      | 100 %   |
| TAG 10 %           | TAG ``T3``     | 10 %    |
| SQL92 10 %         | ``a < 10``     | 10 %    |
| SQL92 100 %        | ``a >= 0``     | 100 %   |

For each it prints messages scanned per second (queue entries the broker walked: the whole
backlog / elapsed time), messages delivered per second, pulls, and both rates as ratios to
the unfiltered run. The broker compares TAG hashes in the consume queue without reading the
commitlog, but must read and evaluate every record's properties for SQL92 (SPEC §6.17), so
SQL92 : unfiltered is the figure the issue asks for. Numbers are printed, never asserted: on
a shared two-core machine they describe the machine as much as RocketQ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.errors import TopicNotFoundError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue
from services.cli.dev import dev_up
from tools.bench.messaging_bench import _stop_local

TOPIC = "FilterBench"
QUEUES = 4
BODY_BYTES = 128
SEND_BATCH_MAX = 64
"""Messages per preload send_batch call (about 12 KiB)."""
SENDS_IN_FLIGHT_MAX = 8
PULL_BATCH = 32
FLAG_SUBSCRIPTION = 0x4
_TOTAL_SIZE = struct.Struct(">i")


@dataclass(frozen=True)
class Case:
    name: str
    expression: str
    kind: common_pb2.ExpressionType.ValueType
    match_ratio: float


CASES = (
    Case("unfiltered", "*", common_pb2.TAG, 1.0),
    Case("TAG 10 %", "T3", common_pb2.TAG, 0.1),
    Case("SQL92 10 %", "a < 10", common_pb2.SQL92, 0.1),
    Case("SQL92 100 %", "a >= 0", common_pb2.SQL92, 1.0),
)


@dataclass
class Outcome:
    case: Case
    scanned: int
    delivered: int
    pulls: int
    elapsed_s: float

    @property
    def scanned_per_s(self) -> float:
        return self.scanned / self.elapsed_s

    @property
    def delivered_per_s(self) -> float:
        return self.delivered / self.elapsed_s


# ---- preload --------------------------------------------------------------------------------


async def create_topic(namesrv: tuple[str, ...]) -> None:
    async with Admin(list(namesrv)) as admin:
        for r in await admin.create_topic(TopicConfig(TOPIC, QUEUES, QUEUES)):
            if not r.ok and r.code != "ALREADY_EXISTS":
                raise SystemExit(f"creating {TOPIC} on {r.broker_name}: {r.error_message}")
        deadline = time.monotonic() + 15
        while True:
            try:
                route = await admin.route(TOPIC)
                if route.queues:
                    return
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)


async def preload(namesrv: tuple[str, ...], broker_name: str, total: int) -> float:
    """Send ``total`` messages spread evenly over the queues; returns messages per second."""
    body = b"x" * BODY_BYTES
    started = time.perf_counter()
    async with Producer(ProducerConfig("filter-bench-producer", list(namesrv))) as producer:
        slots = asyncio.Semaphore(SENDS_IN_FLIGHT_MAX)

        async def one(start: int, stop: int, queue_id: int) -> None:
            msgs = [
                Message(TOPIC, body, tags=f"T{i % 10}", properties={"a": str(i % 100)})
                for i in range(start, stop)
            ]
            async with slots:
                await producer.send_batch(msgs, queue=MessageQueue(TOPIC, broker_name, queue_id))

        per_queue = total // QUEUES
        tasks = [
            one(q * per_queue + s, q * per_queue + min(per_queue, s + SEND_BATCH_MAX), q)
            for q in range(QUEUES)
            for s in range(0, per_queue, SEND_BATCH_MAX)
        ]
        await asyncio.gather(*tasks)
    return (total // QUEUES * QUEUES) / (time.perf_counter() - started)


# ---- measurement ----------------------------------------------------------------------------


def count_records(buf: bytes) -> int:
    """Records in a Pull response (each starts with its big-endian TOTALSIZE)."""
    n = pos = 0
    while pos < len(buf):
        pos += _TOTAL_SIZE.unpack_from(buf, pos)[0]
        n += 1
    return n


async def read_queue(
    stub: messaging_pb2_grpc.MessagingStub, case: Case, group: str, queue_id: int
) -> tuple[int, int, int]:
    """Pull one queue from 0 to its end; returns (scanned, delivered, pulls)."""
    offset = delivered = pulls = 0
    while True:
        resp = await stub.Pull(
            messaging_pb2.PullRequest(
                consumer_group=group,
                topic=TOPIC,
                queue_id=queue_id,
                queue_offset=offset,
                max_msg_nums=PULL_BATCH,
                sys_flag=FLAG_SUBSCRIPTION,
                subscription=case.expression,
                expression_type=case.kind,
            ),
            timeout=30,
        )
        pulls += 1
        if resp.status == messaging_pb2.FOUND:
            delivered += count_records(resp.records)
        elif resp.status != messaging_pb2.NO_MATCHED_MSG:
            return offset, delivered, pulls  # NO_NEW_MSG: the end of the queue
        offset = resp.next_begin_offset


async def run_case(broker_addr: str, case: Case, index: int, rounds: int) -> Outcome:
    """Read the whole backlog ``rounds`` times under ``case``; the fastest round counts."""
    group = f"filter-bench-{index}"
    best: Outcome | None = None
    async with grpc.aio.insecure_channel(broker_addr) as channel:
        stub = messaging_pb2_grpc.MessagingStub(channel)
        for _ in range(rounds):
            started = time.perf_counter()
            parts = await asyncio.gather(*(read_queue(stub, case, group, q) for q in range(QUEUES)))
            elapsed_s = time.perf_counter() - started
            scanned, delivered, pulls = (sum(p[i] for p in parts) for i in range(3))
            o = Outcome(case, scanned, delivered, pulls, elapsed_s)
            if best is None or o.elapsed_s < best.elapsed_s:
                best = o
    assert best is not None
    return best


async def broker_of(namesrv: tuple[str, ...]) -> tuple[str, str]:
    """(broker name, address) of the master hosting the topic."""
    async with Admin(list(namesrv)) as admin:
        route = await admin.route(TOPIC)
        name = route.queues[0].broker_name
        for b in route.brokers:
            if b.broker_name == name and b.master_addr:
                return name, b.master_addr
    raise SystemExit(f"no address for the broker of {TOPIC}")


def table(outcomes: list[Outcome]) -> str:
    """One row per run; the ratios are to the first (unfiltered) run."""
    base = outcomes[0]
    rows = [
        f"{'run':<13} {'expression':<10} {'scanned/s':>11} {'delivered/s':>12} "
        f"{'delivered':>10} {'pulls':>7} {'seconds':>8} {'scan ratio':>10} {'dlv ratio':>9}"
    ]
    for o in outcomes:
        rows.append(
            f"{o.case.name:<13} {o.case.expression:<10} {o.scanned_per_s:>11,.0f} "
            f"{o.delivered_per_s:>12,.0f} {o.delivered:>10,} {o.pulls:>7,} "
            f"{o.elapsed_s:>8.2f} {o.scanned_per_s / base.scanned_per_s:>10.2f} "
            f"{o.delivered_per_s / base.delivered_per_s:>9.2f}"
        )
    return "\n".join(rows)


async def suite(namesrv: tuple[str, ...], total: int, rounds: int) -> list[Outcome]:
    await create_topic(namesrv)
    broker_name, _ = await broker_of(namesrv)
    print(f"preloading {total:,} messages into {TOPIC} ({QUEUES} queues) ...", flush=True)
    rate = await preload(namesrv, broker_name, total)
    print(f"  {rate:,.0f} msgs/s", flush=True)
    _, addr = await broker_of(namesrv)
    outcomes = []
    for i, case in enumerate(CASES):
        try:
            o = await run_case(addr, case, i, rounds)
        except grpc.aio.AioRpcError as err:
            print(f"  {case.name}: refused: {err.code().name} {err.details()}", flush=True)
            continue
        expected = round(o.scanned * case.match_ratio)
        check = "" if o.delivered == expected else f"  (expected {expected:,} delivered!)"
        print(f"  {case.name}: {o.scanned_per_s:,.0f} scanned/s{check}", flush=True)
        outcomes.append(o)
    print(table(outcomes), flush=True)
    by_name = {o.case.name: o for o in outcomes}
    if not {"unfiltered", "SQL92 10 %", "SQL92 100 %"} <= set(by_name):
        return outcomes
    base = by_name["unfiltered"]
    sql10, sql100 = by_name["SQL92 10 %"], by_name["SQL92 100 %"]
    print(
        f"SQL92 : unfiltered = {sql10.scanned_per_s / base.scanned_per_s:.2f} scanned "
        f"({sql10.delivered_per_s / base.delivered_per_s:.2f} delivered) at 10 % match, "
        f"{sql100.scanned_per_s / base.scanned_per_s:.2f} at 100 % match",
        flush=True,
    )
    return outcomes


def _start_local(base: Path) -> tuple[str, ...]:
    with contextlib.redirect_stdout(io.StringIO()):  # dev up's "next:" hints are noise here
        dev_up.main(
            [
                *(
                    "--dir",
                    str(base),
                    "--namesrv-port",
                    "0",
                    "--broker-port",
                    "0",
                    "--gateway-port",
                    "0",
                ),
                *("--detach", "--no-demo", "--set", "enablePropertyFilter=true"),
            ],
            standalone_mode=False,
        )
    data = json.loads((base / "pids.json").read_text())
    return (str(data["namesrv"]),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namesrv", help="bench this cluster (needs enablePropertyFilter=true)")
    parser.add_argument("--messages", type=int, help="backlog size (default 200 000)")
    parser.add_argument("--rounds", type=int, default=3, help="reads per run; the best counts")
    parser.add_argument("--quick", action="store_true", help="20 000 messages")
    args = parser.parse_args()
    total = args.messages or (20_000 if args.quick else 200_000)
    if args.namesrv:
        asyncio.run(suite((args.namesrv,), total, args.rounds))
        return
    base = Path(tempfile.mkdtemp(prefix="rocketq-filter-bench-"))
    try:
        namesrv = _start_local(base)
        print(f"local RocketQ at {namesrv[0]}, data in {base}", flush=True)
        asyncio.run(suite(namesrv, total, args.rounds))
    finally:
        if (base / "pids.json").exists():
            _stop_local(base)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
