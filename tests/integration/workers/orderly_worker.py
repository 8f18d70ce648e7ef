"""An orderly consumer process that records every listener call, for fault tests and benches.

    python -m tests.integration.workers.orderly_worker --namesrv HOST:PORT --group G --topic T \\
        [--history FILE] [--stats-file FILE] --ready-file F [--consume-ms N] \\
        [--mode orderly|concurrent] [--async-listener] [--batch N] [--pull-batch N] \\
        [--pull-delay-ms N]

Runs one :class:`rocketq.PushConsumer` (``orderly=True`` unless ``--mode concurrent``) of group
G on topic T, from the first offset, with short lock timings so a test sees take-overs within
seconds: lock renewal every 1 s (``--lock-interval-ms``), a lock treated as lost 3 s after its
last renewal (``--lock-max-live-ms``; the broker under test should expire locks later, e.g.
``rebalanceLockMaxLiveTime=5000``), rebalance every 2 s (``--rebalance-interval-ms``).

The listener — a plain function on the consumer's thread pool, or with ``--async-listener`` a
coroutine — appends the call's start lines to ``--history`` (format:
:mod:`tests.integration.history`), sleeps ``--consume-ms`` so overlapping calls would be
visible, appends the end lines, and returns success. Each group of lines is one ``os.write``
on an ``O_APPEND`` descriptor, so a SIGKILL loses at most the end lines of the call in
progress.

``--pull-delay-ms`` injects latency into every pull (after its commit offset was read), the
fault under which a late pull could carry a stale commit offset to the broker.

``--stats-file`` gets ``{"messages", "calls", "first_ns", "last_ns"}`` (monotonic ns of the
first call start and the last call end) rewritten atomically every 100 ms and at exit, for
benchmarks that would rather not parse a history.

Once the consumer has started, the ready file gets ``{"addr": "", "pid", "client_id"}``
(written to a temporary name, then renamed). SIGTERM or SIGINT closes the consumer cleanly
(running calls finish, offsets are persisted, the broker locks released) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.message import ReceivedMessage
from tests.integration.history import (
    END,
    KEY_PROPERTY,
    SEQ_PROPERTY,
    START,
    Delivery,
    append_fd,
    encode_lines,
)

log = logging.getLogger("orderly_worker")

STATS_INTERVAL_S = 0.1
CLIENT_IP = "127.0.0.1"


def write_json_atomically(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class Recorder:
    """History lines and counters of this process's listener calls (thread-safe)."""

    def __init__(self, history: Path | None, client_id: str) -> None:
        self._fd = append_fd(history) if history is not None else -1
        self.client_id = client_id
        self.pid = os.getpid()
        self._calls = itertools.count(1)
        self._lock = threading.Lock()
        self.messages = 0
        self.calls = 0
        self.first_ns = 0
        self.last_ns = 0

    def start(self, msgs: Sequence[ReceivedMessage]) -> tuple[int, list[Delivery], int]:
        call = next(self._calls)
        deliveries = [_delivery(m) for m in msgs]
        now = time.monotonic_ns()
        self._write(encode_lines(START, self.client_id, self.pid, call, deliveries, now))
        return call, deliveries, now

    def end(self, call: int, deliveries: list[Delivery], start_ns: int) -> None:
        now = time.monotonic_ns()
        self._write(encode_lines(END, self.client_id, self.pid, call, deliveries, now))
        with self._lock:
            self.messages += len(deliveries)
            self.calls += 1
            if not self.first_ns or start_ns < self.first_ns:
                self.first_ns = start_ns
            self.last_ns = max(self.last_ns, now)

    def _write(self, data: bytes) -> None:
        if self._fd < 0:
            return
        view = memoryview(data)
        while view:  # a regular file takes it whole; the loop is for form's sake
            view = view[os.write(self._fd, view) :]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "messages": self.messages,
                "calls": self.calls,
                "first_ns": self.first_ns,
                "last_ns": self.last_ns,
            }

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _delivery(m: ReceivedMessage) -> Delivery:
    seq = m.properties.get(SEQ_PROPERTY, "-1")
    return Delivery(
        m.topic,
        m.broker_name,
        m.queue_id,
        m.queue_offset,
        m.properties.get(KEY_PROPERTY, ""),
        int(seq) if seq.lstrip("-").isdigit() else -1,
    )


def client_id_of_this_process() -> str:
    """Fixed before start (instance name from the pid), so the first call already has it."""
    return f"{CLIENT_IP}@worker{os.getpid()}"


def make_consumer(args: argparse.Namespace, rec: Recorder) -> PushConsumer:
    """The consumer, its listener recording every call into ``rec``."""
    orderly = args.mode == "orderly"
    config = PushConsumerConfig(
        args.group,
        args.namesrv,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        client_ip=CLIENT_IP,
        instance_name=f"worker{os.getpid()}",
        consume_message_batch_max_size=args.batch,
        pull_batch_size=args.pull_batch,
        rebalance_interval_ms=args.rebalance_interval_ms,
        rebalance_lock_interval_ms=args.lock_interval_ms,
        rebalance_lock_max_live_ms=args.lock_max_live_ms,
    )
    delay_s = args.consume_ms / 1000
    ok: ConsumeOrderlyStatus | ConsumeResult = (
        ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeResult.CONSUME_SUCCESS
    )

    def listener(
        msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext | ConsumeContext
    ) -> ConsumeOrderlyStatus | ConsumeResult:
        call, ds, t0 = rec.start(msgs)
        if delay_s:
            time.sleep(delay_s)
        rec.end(call, ds, t0)
        return ok

    async def async_listener(
        msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext | ConsumeContext
    ) -> ConsumeOrderlyStatus | ConsumeResult:
        call, ds, t0 = rec.start(msgs)
        if delay_s:
            await asyncio.sleep(delay_s)
        rec.end(call, ds, t0)
        return ok

    chosen = async_listener if args.async_listener else listener
    consumer = PushConsumer(config, chosen, orderly=orderly)  # type: ignore[arg-type]
    consumer.subscribe(args.topic)
    return consumer


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    history = Path(args.history) if args.history else None
    stats_file = Path(args.stats_file) if args.stats_file else None
    rec = Recorder(history, client_id_of_this_process())
    consumer = make_consumer(args, rec)
    await consumer.start()
    if consumer.client_id != rec.client_id:
        log.warning("client id %s, recording as %s", consumer.client_id, rec.client_id)

    async def publish_stats() -> None:
        assert stats_file is not None
        while True:
            write_json_atomically(stats_file, rec.stats())
            await asyncio.sleep(STATS_INTERVAL_S)

    stats_task = asyncio.create_task(publish_stats()) if stats_file else None
    write_json_atomically(
        Path(args.ready_file), {"addr": "", "pid": os.getpid(), "client_id": consumer.client_id}
    )
    log.info("worker %s (pid %d) consuming %s", consumer.client_id, os.getpid(), args.topic)
    try:
        await stop.wait()
    finally:
        log.info("worker %s closing", consumer.client_id)
        await consumer.close()
        if stats_task is not None:
            stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stats_task
        if stats_file is not None:
            write_json_atomically(stats_file, rec.stats())
        rec.close()


def delay_pulls(delay_ms: float) -> None:
    """Fault injection: every pull reaches the broker ``delay_ms`` late, as over a slow link.

    The commit offset a pull carries is read before the delay (the SDK reads it, then calls
    ``Puller.pull``), so a pull in flight can carry an offset older than what was consumed and
    persisted meanwhile — the window in which a late pull could move the group's offset back.
    """
    from rocketq.client.consumer import _pull

    original = _pull.Puller.pull

    async def delayed(self: _pull.Puller, *args: Any, **kwargs: Any) -> _pull.PullResult:
        await asyncio.sleep(delay_ms / 1000)
        return await original(self, *args, **kwargs)

    _pull.Puller.pull = delayed  # type: ignore[method-assign]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--namesrv", required=True, help="nameserver host:port (';' separates more)")
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--history", help="append the call history here (JSON lines)")
    p.add_argument("--stats-file", help="counters, rewritten every 100 ms")
    p.add_argument("--ready-file", required=True)
    p.add_argument("--consume-ms", type=float, default=0.0, help="time spent per listener call")
    p.add_argument("--mode", choices=("orderly", "concurrent"), default="orderly")
    p.add_argument("--async-listener", action="store_true", help="a coroutine listener")
    p.add_argument("--batch", type=int, default=1, help="consume_message_batch_max_size")
    p.add_argument("--pull-batch", type=int, default=32, help="pull_batch_size")
    p.add_argument("--rebalance-interval-ms", type=int, default=2000)
    p.add_argument("--lock-interval-ms", type=int, default=1000)
    p.add_argument("--lock-max-live-ms", type=int, default=3000)
    p.add_argument(
        "--pull-delay-ms", type=float, default=0.0, help="fault: pulls reach the broker late"
    )
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )
    if args.pull_delay_ms:
        delay_pulls(args.pull_delay_ms)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
