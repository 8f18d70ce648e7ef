"""Transactional send throughput against plain sync sends: measured and printed, never asserted.

    python -m tools.bench.transaction_bench [--namesrv HOST:PORT] [--duration S] [--quick]
                                            [--concurrency N ...] [--body-bytes N]

Without ``--namesrv`` it starts a local RocketQ as :mod:`tools.bench.messaging_bench` does
(``rocketq dev up``: nameserver + broker on free ports, data in a temporary directory) and stops
it afterwards. Then, on one 8-queue topic, for each concurrency (1 and 16 senders, each an
asyncio task looping until the run's time is up):

| run           | one operation                                                          |
|---------------|------------------------------------------------------------------------|
| plain         | ``Producer.send``: one sync send, stored and acknowledged              |
| transactional | ``TransactionProducer.send_message_in_transaction``: the half message  |
|               | (a sync send), a local transaction that commits at once, and the       |
|               | EndTransaction that stores the real message and its op record          |

Each line gives msgs/s and the round-trip percentiles of one operation; the table ends with
"tx/plain", the price of a transaction: two broker round trips and three stored records
(half, real, op) instead of one of each. After the transactional runs the bench reads back
what the broker holds: every committed message must be in the topic and no half message left
pending (a transaction whose EndTransaction failed would wait for a check-back); a mismatch is
printed, not raised.

Numbers are one Python client process against one broker on this machine; on a shared or small
machine they say more about the machine than about RocketQ. ``--quick`` (2 s runs, about 30 s
in all with the cluster start) is for checking that the bench works.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rocketq import LocalTransactionState, Message, ReceivedMessage, TransactionProducer
from rocketq.cli._bench import ensure_topic
from rocketq.cli._bench_stats import LatencyRecorder, Summary, format_summary
from rocketq.client.admin import Admin
from rocketq.client.producer import Producer, ProducerConfig
from tools.bench.messaging_bench import _start_local, _stop_local

QUEUES = 8
BODY_BYTES_DEFAULT = 1024
DURATION_DEFAULT_S = 10.0
DURATION_QUICK_S = 2.0
CONCURRENCY_DEFAULT = (1, 16)
WARMUP_SENDS = 50
SETTLE_TIMEOUT_S = 15.0
"""How long the read-back waits for the broker's counts to settle after the last send."""


class CommitAtOnce:
    """A local transaction that always commits; a check-back (none expected) commits too."""

    def __init__(self) -> None:
        self.checks = 0

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        self.checks += 1
        return LocalTransactionState.COMMIT_MESSAGE


@dataclass(frozen=True)
class RunResult:
    kind: str
    """``plain`` or ``transactional``."""
    concurrency: int
    summary: Summary


async def timed_loop(
    name: str, send: Callable[[], Awaitable[object]], concurrency: int, duration_s: float
) -> Summary:
    """``concurrency`` tasks calling ``send`` back to back for ``duration_s``; every call's
    round trip is one sample, a call that raises one failure."""
    rec = LatencyRecorder(name)
    deadline = time.monotonic() + duration_s

    async def worker() -> None:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                await send()
            except Exception:
                rec.fail()
                continue
            rec.record((time.perf_counter() - t0) * 1000)

    rec.start()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rec.stop()
    return rec.summary()


async def bench_plain(
    namesrv: tuple[str, ...], topic: str, body: bytes, concurrency: int, duration_s: float
) -> Summary:
    config = ProducerConfig(f"tx-bench-plain-{os.getpid()}", namesrv)
    async with Producer(config) as producer:
        for _ in range(WARMUP_SENDS):
            await producer.send(Message(topic, body))
        return await timed_loop(
            f"plain x{concurrency}",
            lambda: producer.send(Message(topic, body)),
            concurrency,
            duration_s,
        )


async def bench_transactional(
    namesrv: tuple[str, ...], topic: str, body: bytes, concurrency: int, duration_s: float
) -> tuple[Summary, int]:
    """The run's summary and how many sends ended other than committed."""
    listener = CommitAtOnce()
    config = ProducerConfig(f"tx-bench-tx-{os.getpid()}", namesrv)
    not_committed = 0
    async with TransactionProducer(config, listener) as producer:

        async def send() -> None:
            nonlocal not_committed
            result = await producer.send_message_in_transaction(Message(topic, body))
            if result.local_state is not LocalTransactionState.COMMIT_MESSAGE:
                not_committed += 1

        for _ in range(WARMUP_SENDS):
            await send()
        summary = await timed_loop(f"transactional x{concurrency}", send, concurrency, duration_s)
    return summary, not_committed


async def stored_and_pending(namesrv: tuple[str, ...], topic: str) -> tuple[int, int]:
    """Messages stored in ``topic`` (sum over queues of max - min offset) and half messages of
    it still pending."""
    async with Admin(namesrv) as admin:
        desc = await admin.describe_topic(topic)
        stored = sum(q.max_offset - q.min_offset for b in desc.brokers for q in b.queues)
        pending = (await admin.half_messages(topic, max_num=1)).total
    return stored, pending


async def read_back(namesrv: tuple[str, ...], topic: str, expected: int) -> str:
    """What the broker holds after the runs, compared with what the producers were told."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        stored, pending = await stored_and_pending(namesrv, topic)
        if (stored == expected and pending == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    verdict = "OK" if stored == expected and pending == 0 else "MISMATCH"
    return (
        f"read-back {verdict}: {stored} messages stored in {topic}, {expected} acknowledged "
        f"(plain + committed); {pending} half messages pending"
    )


async def suite(
    namesrv: tuple[str, ...], duration_s: float, concurrencies: list[int], body_bytes: int
) -> tuple[list[RunResult], str]:
    topic = f"TxBench{os.getpid()}"
    await ensure_topic(namesrv, topic, QUEUES)
    body = os.urandom(body_bytes)
    results: list[RunResult] = []
    expected = 0
    for concurrency in concurrencies:
        print(f"plain sync sends, {concurrency} sender(s), {duration_s:.0f} s", flush=True)
        plain = await bench_plain(namesrv, topic, body, concurrency, duration_s)
        print(f"  {format_summary(plain)}", flush=True)
        results.append(RunResult("plain", concurrency, plain))
        expected += plain.count + WARMUP_SENDS
        print(f"transactional sends, {concurrency} sender(s), {duration_s:.0f} s", flush=True)
        tx, not_committed = await bench_transactional(namesrv, topic, body, concurrency, duration_s)
        print(f"  {format_summary(tx)}", flush=True)
        if not_committed:
            print(f"  {not_committed} transactions did not end committed", flush=True)
        results.append(RunResult("transactional", concurrency, tx))
        expected += tx.count + WARMUP_SENDS - not_committed
    return results, await read_back(namesrv, topic, expected)


def print_table(results: list[RunResult], body_bytes: int, read_back_line: str) -> None:
    table = Table(
        title=f"Transactional (half + commit) vs plain sync sends, {body_bytes} B bodies, "
        f"{QUEUES}-queue topic"
    )
    for column in ("run", "senders", "msgs", "failed", "msgs/s", "p50 ms", "p99 ms", "tx/plain"):
        table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    plain_tps = {r.concurrency: r.summary.tps for r in results if r.kind == "plain"}
    for r in results:
        s = r.summary
        base = plain_tps.get(r.concurrency, 0.0)
        ratio = f"{s.tps / base:.2f}" if r.kind == "transactional" and base > 0 else ""
        table.add_row(
            r.kind,
            str(r.concurrency),
            str(s.count),
            str(s.failures),
            f"{s.tps:,.0f}",
            f"{s.p50_ms:.2f}",
            f"{s.p99_ms:.2f}",
            ratio,
        )
    console = Console(width=max(Console().width, 100))  # the table's width, even in a pipe
    console.print(table)
    console.print(read_back_line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namesrv", help="bench this cluster instead of starting one")
    parser.add_argument("--duration", type=float, default=DURATION_DEFAULT_S, help="s per run")
    parser.add_argument("--quick", action="store_true", help=f"{DURATION_QUICK_S:.0f}-second runs")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=list(CONCURRENCY_DEFAULT),
        help="concurrent senders per run (default 1 16)",
    )
    parser.add_argument("--body-bytes", type=int, default=BODY_BYTES_DEFAULT)
    args = parser.parse_args()
    duration_s = DURATION_QUICK_S if args.quick else args.duration
    base = Path(tempfile.mkdtemp(prefix="rocketq-tx-bench-"))
    try:
        namesrv: tuple[str, ...] = (args.namesrv,) if args.namesrv else ()
        if not namesrv:
            namesrv = _start_local(base / "cluster")
            print(f"local RocketQ at {namesrv[0]}, data in {base}", flush=True)
        results, read_back_line = asyncio.run(
            suite(namesrv, duration_s, args.concurrency, args.body_bytes)
        )
        print_table(results, args.body_bytes, read_back_line)
    finally:
        if (base / "cluster" / "pids.json").exists():
            _stop_local(base / "cluster")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
