"""The load of the timer-wheel benchmark (:mod:`tools.bench.timer_bench`): the sender and
consumer processes, and the orchestrator's handle on them.

The orchestrating process only polls statistics, so the load runs in worker processes of
``timer_bench`` itself (``--worker send|consume --spec JSON``):

- a sender sends its share of the timers, one ``send_async`` each (a delayed message cannot be
  batched), due at random times in the window, in random order, with a bounded number in
  flight; a failed send is sent again as a new message up to SEND_ATTEMPTS_MAX times;
- the consumer receives every re-put message and measures it against the due time the sender
  put on it (:class:`_Receipts`): store time - due (the timer-wheel's part) and receive
  time - due, early deliveries, redeliveries and producer resends.

Workers report through small JSON files written atomically (tmp, rename): ``progress`` while
running, ``ready`` and ``result`` for the consumer. :class:`Worker` and :func:`spawn_worker`
are the orchestrator's side, :func:`send_totals` sums the senders' progress.

Kept apart from ``timer_bench.py`` (plan and phases) and ``_timer_bench_report.py``
(measurement and the table) because this is the code that runs in the other processes: what
makes the load, as opposed to what watches the timer-wheel under it.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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
from services.common.supervisor import child_env

ON_TIME_MS = 1000
"""A timer stored by its re-put at most this late counts as fired on time."""
SEND_TIMEOUT_MS = 10_000
SEND_ATTEMPTS_MAX = 3
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
def stop_process(proc: subprocess.Popen[bytes], sig: int, timeout_s: float = 30.0) -> None:
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
    """A sender or consumer process (``timer_bench --worker``); it reports through JSON files."""

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
    env = child_env()
    argv = [sys.executable, "-m", "tools.bench.timer_bench", "--worker", kind]
    with open(d / "worker.log", "ab") as log:
        proc = subprocess.Popen(
            [*argv, "--spec", json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    workers.append(Worker(name, proc, files, d / "worker.log"))
    return workers[-1]


def send_totals(workers: list[Worker]) -> dict[str, Any]:
    """The senders' progress files summed: counts, all done, first and last acknowledgement,
    failed attempts by error kind."""
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


def senders_done(workers: list[Worker]) -> bool:
    """Whether every sender finished (raises if one died)."""
    for w in workers:
        w.check_alive()
    return bool(send_totals(workers)["done"])
