"""Messaging benchmarks against a running RocketQ, in the manner of RocketMQ's
benchmark/producer.sh and consumer.sh: a progress line every few seconds (TPS, average and max
RT, failures) and one final SUMMARY line (TPS, avg/max/p50/p99/p99.9, failures).

| bench              | what runs                                   | per-sample latency        |
|--------------------|---------------------------------------------|---------------------------|
| produce            | ``concurrency`` workers awaiting ``send``   | send round trip           |
|                    | (``batch`` > 1: ``send_batch``)             | (a batch counts n msgs)   |
| produce --async    | ``send_async`` with ``concurrency`` in      | send round trip           |
|                    | flight                                      |                           |
| produce            | AccumulatingProducer: ``enqueue`` as fast   | enqueue to acknowledgement|
|   --accumulate     | as the buffer allows                        |                           |
| consume            | a PushConsumer with a coroutine listener    | born time to consume      |
| latency            | ``rate`` msgs/s stamped with the send time, | send to consume           |
|                    | consumed by an in-process PushConsumer      |                           |

Everything runs on one event loop in this process; numbers are those of a single Python
client. Nothing here asserts a figure: the caller prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from rocketq.cli._bench_stats import LatencyRecorder, Summary, format_interval
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.errors import RocketQError, TopicNotFoundError
from rocketq.client.producer import (
    AccumulatingProducer,
    AccumulatingProducerConfig,
    Producer,
    ProducerConfig,
)
from rocketq.message import Message, ReceivedMessage, SendResult

Emit = Callable[[str], None]

STAMP_PROPERTY = "bench_send_ns"
"""Wall-clock send time (ns) the latency bench puts on each message."""
RUN_PROPERTY = "bench_run"
"""Id of the latency run, so messages of an earlier run are not counted."""
YIELD_EVERY = 64
"""The accumulate loop gives the event loop a turn after this many enqueues."""
ASSIGN_WAIT_S = 30.0
"""How long the latency bench waits for its consumer to own queues before producing."""
DRAIN_WAIT_S = 5.0
"""After the latency producer stops, how long to wait for the last messages."""
TICK_S = 0.001


@dataclass(frozen=True)
class ProduceOptions:
    """One produce run."""

    namesrv_addrs: tuple[str, ...]
    topic: str = "BenchmarkTest"
    size_bytes: int = 1024
    """Body size of every message."""
    concurrency: int = 16
    """Sync workers, or async sends in flight."""
    batch: int = 1
    """Messages per send_batch call (sync mode); 1 = send."""
    async_send: bool = False
    accumulate: bool = False
    linger_ms: int = 5
    """AccumulatingProducer linger."""
    duration_s: float = 10.0
    interval_s: float = 2.0
    tag: str = "bench"
    group: str = "rocketq-bench-producer"
    queues: int = 8
    """Queues per broker if the topic has to be created."""


@dataclass(frozen=True)
class ConsumeOptions:
    """One consume run."""

    namesrv_addrs: tuple[str, ...]
    topic: str = "BenchmarkTest"
    group: str = "rocketq-bench-consumer"
    duration_s: float = 10.0
    interval_s: float = 2.0
    from_first: bool = True
    """A fresh group starts at the oldest message (drains a backlog)."""
    batch: int = 32
    """Messages per listener call."""
    pull_batch: int = 64
    """Messages per pull."""


@dataclass(frozen=True)
class LatencyOptions:
    """One produce-to-consume latency run."""

    namesrv_addrs: tuple[str, ...]
    topic: str = "BenchmarkLatency"
    rate: int = 10_000
    """Messages per second the producer aims at."""
    size_bytes: int = 256
    duration_s: float = 10.0
    interval_s: float = 2.0
    accumulate: bool = True
    """Batch sends (1 ms linger) so the rate is reachable; off = one async send each."""
    queues: int = 8


async def ensure_topic(namesrv_addrs: tuple[str, ...], topic: str, queues: int) -> None:
    """Create ``topic`` in the (only) cluster unless a route exists already."""
    async with Admin(namesrv_addrs) as admin:
        try:
            await admin.route(topic)
            return
        except TopicNotFoundError:
            pass
        results = await admin.create_topic(TopicConfig(topic, queues, queues))
        for r in results:
            if not r.ok and r.code != "ALREADY_EXISTS":
                raise RocketQError(f"cannot create {topic} on {r.broker_name}: {r.error_message}")
        deadline = time.monotonic() + 10
        while True:
            try:
                await admin.route(topic)
                return
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _reporting(
    rec: LatencyRecorder, label: str, interval_s: float, emit: Emit
) -> AsyncIterator[None]:
    """Print a progress line every ``interval_s`` while the body runs."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval_s)
            emit(format_interval(label, rec.take_interval()))

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _body(size_bytes: int) -> bytes:
    # Random bytes do not compress, so a size above the compression threshold stays that size.
    return os.urandom(size_bytes)


# ---- produce ----------------------------------------------------------------------------------
async def run_produce(opts: ProduceOptions, emit: Emit) -> Summary:
    """Send for ``duration_s`` and return the run's summary."""
    await ensure_topic(opts.namesrv_addrs, opts.topic, opts.queues)
    body = _body(opts.size_bytes)
    rec = LatencyRecorder("produce")
    mode = "accumulate" if opts.accumulate else "async" if opts.async_send else "sync"
    emit(
        f"produce: topic {opts.topic}, {opts.size_bytes} B bodies, mode {mode}, concurrency "
        f"{opts.concurrency}, batch {opts.batch}, {opts.duration_s:g} s"
    )
    if opts.accumulate:
        await _produce_accumulating(opts, body, rec, emit)
    else:
        await _produce_plain(opts, body, rec, emit)
    return rec.summary()


async def _produce_plain(
    opts: ProduceOptions, body: bytes, rec: LatencyRecorder, emit: Emit
) -> None:
    config = ProducerConfig(
        opts.group, opts.namesrv_addrs, async_in_flight_max=max(opts.concurrency, 1)
    )
    async with Producer(config) as producer:
        rec.start()  # count from the moment we are connected
        deadline = time.monotonic() + opts.duration_s

        def message() -> Message:
            return Message(opts.topic, body, tags=opts.tag)

        async def sync_worker() -> None:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    if opts.batch > 1:
                        await producer.send_batch([message() for _ in range(opts.batch)])
                    else:
                        await producer.send(message())
                except RocketQError:
                    rec.fail(opts.batch)
                    continue
                rec.record((time.perf_counter() - t0) * 1000, opts.batch)

        async def async_loop() -> None:
            window = asyncio.Semaphore(opts.concurrency)

            def done(fut: asyncio.Future[Any], t0: float) -> None:
                window.release()
                if fut.cancelled() or fut.exception() is not None:
                    rec.fail()
                else:
                    rec.record((time.perf_counter() - t0) * 1000)

            while time.monotonic() < deadline:
                await window.acquire()
                t0 = time.perf_counter()
                fut = producer.send_async(message())
                fut.add_done_callback(functools.partial(done, t0=t0))
            for _ in range(opts.concurrency):  # wait for the last ones
                await window.acquire()

        async with _reporting(rec, "send", opts.interval_s, emit):
            if opts.async_send:
                await async_loop()
            else:
                await asyncio.gather(*(sync_worker() for _ in range(opts.concurrency)))
        rec.stop()


async def _produce_accumulating(
    opts: ProduceOptions, body: bytes, rec: LatencyRecorder, emit: Emit
) -> None:
    config = AccumulatingProducerConfig(opts.group, opts.namesrv_addrs, linger_ms=opts.linger_ms)
    async with AccumulatingProducer(config) as producer:
        rec.start()
        deadline = time.monotonic() + opts.duration_s

        def done(fut: asyncio.Future[Any], t0: float) -> None:
            if fut.cancelled() or fut.exception() is not None:
                rec.fail()
            else:
                rec.record((time.perf_counter() - t0) * 1000)

        async def loop() -> None:
            n = 0
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    fut = await producer.enqueue(Message(opts.topic, body, tags=opts.tag))
                except RocketQError:
                    rec.fail()
                    await asyncio.sleep(0.01)
                    continue
                fut.add_done_callback(functools.partial(done, t0=t0))
                n += 1
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let the sender and the callbacks run

        async with _reporting(rec, "send", opts.interval_s, emit):
            await asyncio.gather(*(loop() for _ in range(max(1, opts.concurrency // 16))))
            await producer.flush()
        rec.stop()


# ---- consume ----------------------------------------------------------------------------------
async def run_consume(opts: ConsumeOptions, emit: Emit) -> Summary:
    """Consume for ``duration_s`` with a push consumer; latency is born-to-consume time."""
    rec = LatencyRecorder("consume")

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        now_ms = time.time() * 1000
        for m in msgs:
            rec.record(now_ms - m.born_timestamp_ms)
        return ConsumeResult.CONSUME_SUCCESS

    where = (
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        if opts.from_first
        else ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    )
    config = PushConsumerConfig(
        opts.group,
        opts.namesrv_addrs,
        consume_from_where=where,
        consume_message_batch_max_size=opts.batch,
        pull_batch_size=opts.pull_batch,
        pull_threshold_for_queue=max(1000, opts.pull_batch * 4),
    )
    emit(f"consume: topic {opts.topic}, group {opts.group}, {opts.duration_s:g} s")
    consumer = PushConsumer(config, listener)
    consumer.subscribe(opts.topic)
    async with consumer:
        rec.start()
        async with _reporting(rec, "consume", opts.interval_s, emit):
            await asyncio.sleep(opts.duration_s)
        rec.stop()
    return rec.summary()


# ---- latency ----------------------------------------------------------------------------------
async def run_latency(opts: LatencyOptions, emit: Emit) -> tuple[Summary, Summary]:
    """Produce at ``rate`` msgs/s and consume in-process; returns (send, end-to-end) summaries."""
    await ensure_topic(opts.namesrv_addrs, opts.topic, opts.queues)
    run_id = f"{os.getpid()}-{time.time_ns()}"
    e2e = LatencyRecorder("latency")
    sent = LatencyRecorder("latency-send")

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        now_ns = time.time_ns()
        for m in msgs:
            stamp = m.properties.get(STAMP_PROPERTY)
            if stamp is not None and m.properties.get(RUN_PROPERTY) == run_id:
                e2e.record((now_ns - int(stamp)) / 1e6)
        return ConsumeResult.CONSUME_SUCCESS

    config = PushConsumerConfig(
        f"rocketq-bench-latency-{os.getpid()}",
        opts.namesrv_addrs,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_message_batch_max_size=32,
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe(opts.topic)
    emit(
        f"latency: topic {opts.topic}, {opts.rate} msgs/s, {opts.size_bytes} B bodies, "
        f"{opts.duration_s:g} s, producer {'accumulating' if opts.accumulate else 'async'}"
    )
    async with consumer:
        await _wait_assigned(consumer)
        await asyncio.sleep(0.5)  # let the first long-polling pulls reach the broker
        e2e.start()
        async with _reporting(e2e, "e2e", opts.interval_s, emit):
            await _paced_produce(opts, run_id, sent)
            deadline = time.monotonic() + DRAIN_WAIT_S
            while e2e.count < sent.count and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        e2e.stop()
    lost = sent.count - e2e.count
    if lost > 0:
        e2e.fail(lost)  # acknowledged but not seen within the drain wait
    return sent.summary(), e2e.summary()


async def _wait_assigned(consumer: PushConsumer) -> None:
    deadline = time.monotonic() + ASSIGN_WAIT_S
    while not consumer.assigned_queues():
        if time.monotonic() > deadline:
            raise RocketQError("the latency consumer was given no queue; is the topic readable?")
        await asyncio.sleep(0.05)


async def _paced_produce(opts: LatencyOptions, run_id: str, rec: LatencyRecorder) -> None:
    """Send ``rate`` messages per second for ``duration_s``, on a 1 ms schedule."""
    body = _body(opts.size_bytes)
    group = "rocketq-bench-latency-producer"
    producer: Producer | AccumulatingProducer
    if opts.accumulate:
        producer = AccumulatingProducer(
            AccumulatingProducerConfig(group, opts.namesrv_addrs, linger_ms=1)
        )
    else:
        producer = Producer(ProducerConfig(group, opts.namesrv_addrs, async_in_flight_max=100_000))

    def done(fut: asyncio.Future[Any], t0: float) -> None:
        if fut.cancelled() or fut.exception() is not None:
            rec.fail()
        else:
            rec.record((time.perf_counter() - t0) * 1000)

    async def send_one() -> asyncio.Future[SendResult]:
        props = {STAMP_PROPERTY: str(time.time_ns()), RUN_PROPERTY: run_id}
        msg = Message(opts.topic, body, properties=props)
        if isinstance(producer, AccumulatingProducer):
            return await producer.enqueue(msg)
        return producer.send_async(msg)

    async with producer:
        rec.start()
        start = time.monotonic()
        issued = 0
        while (elapsed := time.monotonic() - start) < opts.duration_s:
            due = int(elapsed * opts.rate) - issued
            for _ in range(due):
                t0 = time.perf_counter()
                try:
                    fut = await send_one()
                except RocketQError:
                    rec.fail()
                    continue
                fut.add_done_callback(functools.partial(done, t0=t0))
            issued += max(due, 0)
            await asyncio.sleep(TICK_S)
        rec.stop()
