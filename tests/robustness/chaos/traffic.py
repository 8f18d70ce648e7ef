"""The workload: producer and consumer processes that journal every request and its outcome.

    python -m tests.robustness.chaos.traffic producer --namesrv A[;B] --proc p1 \\
        --journal F --ready-file R [--rate 20] [--topic T] [--orderly-topic O] [--shards 4] \\
        [--orderly-share 0.3] [--delay-share 0.05] [--delay-ms 1500] [--concurrency 4]
    python -m tests.robustness.chaos.traffic consumer --namesrv A[;B] --proc c1 \\
        --journal F --ready-file R --group G --topic T [--mode orderly|concurrent]

**Producer**: sends about ``--rate`` messages per second through the SDK's
:class:`rocketq.Producer` (its retries and route refreshes are part of what is tested). Every
message has a unique id ``{proc}-{n}`` (user property ``chaos_id`` and its key). A share of
them go to the orderly topic with a sharding key ``{proc}-k0..`` (one sender per key across
the run, so each key's order is this process's) and a per-key number
``chaos_seq``; each key's sends are sequential (the next starts when the previous answered), so
the key's order is well defined. A share of the round-robin ones are delayed by ``--delay-ms``
(through the timer-wheel). Every send is journaled twice (see
:mod:`~tests.robustness.chaos.recorder`): ``invoke`` before the call, ``send`` when it answers or
fails. On stop, the sends in flight - round-robin and each key's current one - are awaited, not
cancelled.

**Consumer**: one :class:`rocketq.PushConsumer` (clustering, from the first offset; orderly
with ``--mode orderly``) journaling every message handed to its listener (``deliver``), and -
through a wrapper around :class:`~rocketq.client.consumer.offset_store.RemoteBrokerOffsetStore`'s
network calls - every offset push the broker acknowledged (``commit``) and every offset read
from a broker when a queue was assigned (``fetch``). Offsets are pushed every
:data:`PERSIST_INTERVAL_MS` and routes refreshed every :data:`ROUTE_POLL_MS`, so a new master is
found quickly and few messages are replayed.

SIGTERM or SIGINT stops either cleanly (a consumer persists its offsets) and exits 0; the ready
file gets ``{"addr": "", "pid"}`` once started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import signal
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
from rocketq.client.consumer import offset_store as offset_store_mod
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue, ReceivedMessage
from tests.robustness.chaos.recorder import Recorder, event_line

log = logging.getLogger("chaos.traffic")

ID_PROPERTY = "chaos_id"
SEQ_PROPERTY = "chaos_seq"
PERSIST_INTERVAL_MS = 1000
"""Consumer offset pushes (the replay window of a consumer restart, see model.duplicate_bound)."""
ROUTE_POLL_MS = 2000
REBALANCE_INTERVAL_MS = 2000
SEND_TIMEOUT_MS = 5000
IN_FLIGHT_MAX = 64
"""Round-robin sends awaiting an answer at once; the pacer waits beyond this."""
ERR_TEXT_MAX = 200


def now_ns() -> int:
    return time.monotonic_ns()


def write_ready(path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"addr": "", "pid": os.getpid()}))
    tmp.replace(path)


# ---- producer ---------------------------------------------------------------------------------


class ProducerTraffic:
    """Paced round-robin sends plus one sequential sender per sharding key."""

    def __init__(self, args: argparse.Namespace, producer: Producer, rec: Recorder) -> None:
        self.args = args
        self.producer = producer
        self.rec = rec
        self.rng = random.Random(f"{args.seed}-{args.proc}")
        self.counter = itertools.count()
        self.in_flight = asyncio.Semaphore(IN_FLIGHT_MAX)
        self.tasks: set[asyncio.Task[None]] = set()

    def next_id(self) -> str:
        return f"{self.args.proc}-{next(self.counter)}"

    async def send(self, msg: Message, *, shard: str = "", seq: int = -1) -> None:
        mid = msg.properties[ID_PROPERTY]
        fields: dict[str, Any] = dict(
            id=mid, topic=msg.topic, shard=shard, seq=seq, delay_ms=msg.delay_ms, t0=now_ns()
        )
        # The invocation goes into the journal before the call (Jepsen's invoke, then ok / fail /
        # info): a send that never answers - cancelled, or its process killed - is then known to
        # have been attempted, so the checker treats it as indeterminate, never as a phantom.
        self.rec.record("invoke", **fields)
        try:
            if shard:
                result = await self.producer.send(msg, sharding_key=shard)
            else:
                result = await self.producer.send(msg)
        except Exception as exc:  # every failure is an outcome to journal, not a crash
            fields.update(t1=now_ns(), outcome="ERROR", err=f"{type(exc).__name__}: {exc}")
            fields["err"] = fields["err"][:ERR_TEXT_MAX]
        else:
            mq = result.message_queue
            fields.update(
                t1=now_ns(), outcome=result.status.name, broker=mq.broker_name,
                queue=mq.queue_id, offset=result.queue_offset,
            )  # fmt: skip
        self.rec.record("send", **fields)

    def message(self, topic: str, mid: str, **extra: Any) -> Message:
        props = {ID_PROPERTY: mid, **{k: str(v) for k, v in extra.items()}}
        return Message(topic, f"{mid}:{'x' * 64}".encode(), keys=mid, properties=props)

    async def round_robin(self, rate: float) -> None:
        interval_s = 1 / rate
        next_at = time.monotonic()
        while True:
            next_at += interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await self.in_flight.acquire()
            mid = self.next_id()
            msg = self.message(self.args.topic, mid)
            if self.rng.random() < self.args.delay_share:
                msg = Message(
                    msg.topic, msg.body, keys=mid, properties=msg.properties,
                    delay_ms=self.args.delay_ms,
                )  # fmt: skip
            task = asyncio.create_task(self._send_released(msg))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send_released(self, msg: Message) -> None:
        try:
            await self.send(msg)
        finally:
            self.in_flight.release()

    async def ordered(self, shard: str, rate: float, stop: asyncio.Event) -> None:
        """One key's sequential sends until ``stop``; a send in flight when it is set finishes
        (it is never cancelled mid-call), the pause between sends ends at once."""
        interval_s = 1 / rate
        for seq in itertools.count():
            if stop.is_set():
                return
            started = time.monotonic()
            mid = self.next_id()
            msg = self.message(self.args.orderly_topic, mid, **{SEQ_PROPERTY: seq})
            await self.send(msg, shard=shard, seq=seq)
            pause_s = max(0.0, interval_s - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause_s)

    async def run(self, stop: asyncio.Event) -> None:
        a = self.args
        orderly_rate = a.rate * a.orderly_share if a.orderly_topic else 0.0
        pacer = asyncio.create_task(self.round_robin(max(0.1, a.rate - orderly_rate)))
        keys: list[asyncio.Task[None]] = []
        if orderly_rate > 0:
            per_shard = orderly_rate / a.shards
            keys = [
                asyncio.create_task(self.ordered(f"{a.proc}-k{i}", per_shard, stop))
                for i in range(a.shards)
            ]
        await stop.wait()
        # The pacer only sleeps or waits for a slot (its sends run as tasks): cancel it. Sends
        # still due - round-robin tasks and each key's current send - finish within their
        # timeout and are journaled before exiting.
        pacer.cancel()
        await asyncio.gather(pacer, return_exceptions=True)
        late: set[asyncio.Task[None]] = set()
        due = [*self.tasks, *keys]
        if due:
            _, late = await asyncio.wait(due, timeout=SEND_TIMEOUT_MS / 1000 + 2)
            for t in late:  # past every send's own timeout: left as invoked, unfinished
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self.rec.record("stopped", in_flight=len(due), unfinished=len(late), t=now_ns())


async def run_producer(args: argparse.Namespace) -> None:
    stop = _stop_event()
    rec = Recorder(Path(args.journal), args.proc)
    config = ProducerConfig(
        "chaos-producers", args.namesrv, instance_name=args.proc, client_ip="127.0.0.1",
        send_msg_timeout_ms=SEND_TIMEOUT_MS, poll_name_server_interval_ms=ROUTE_POLL_MS,
    )  # fmt: skip
    producer = Producer(config)
    await producer.start()
    write_ready(Path(args.ready_file))
    try:
        await ProducerTraffic(args, producer, rec).run(stop)
    finally:
        await producer.close()
        rec.close()


# ---- consumer ---------------------------------------------------------------------------------


def record_offset_calls(rec: Recorder, group: str) -> None:
    """Journal the acknowledged offset pushes and the offset reads of every clustering offset
    store of this process (wraps the callables the consumer hands to the store)."""
    cls = offset_store_mod.RemoteBrokerOffsetStore
    original_init = cls.__init__

    def init(self: Any, grp: str, fetch: Any, push: Any, *a: Any, **kw: Any) -> None:
        async def fetch_recorded(mq: MessageQueue) -> int:
            t0 = now_ns()
            offset = -1
            try:
                offset = int(await fetch(mq))
                return offset
            finally:
                rec.record("fetch", group=group, **_mq(mq), offset=offset, t0=t0, t1=now_ns())

        async def push_recorded(mq: MessageQueue, offset: int) -> None:
            t0 = now_ns()
            await push(mq, offset)  # raises when not acknowledged: nothing to journal
            rec.record("commit", group=group, **_mq(mq), offset=offset, t0=t0, t1=now_ns())

        original_init(self, grp, fetch_recorded, push_recorded, *a, **kw)

    cls.__init__ = init  # type: ignore[method-assign,assignment]


def _mq(mq: MessageQueue) -> dict[str, Any]:
    return {"topic": mq.topic, "broker": mq.broker_name, "queue": mq.queue_id}


def make_consumer(args: argparse.Namespace, rec: Recorder) -> PushConsumer:
    orderly = args.mode == "orderly"
    config = PushConsumerConfig(
        args.group,
        args.namesrv,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        client_ip="127.0.0.1",
        instance_name=args.proc,
        rebalance_interval_ms=REBALANCE_INTERVAL_MS,
        persist_consumer_offset_interval_ms=PERSIST_INTERVAL_MS,
        poll_name_server_interval_ms=ROUTE_POLL_MS,
        heartbeat_broker_interval_ms=ROUTE_POLL_MS,
        rebalance_lock_interval_ms=1000,
        rebalance_lock_max_live_ms=3000,
    )

    def journal(msgs: Sequence[ReceivedMessage]) -> None:
        t = now_ns()
        rec.write_raw(
            event_line(
                "deliver",
                args.proc,
                group=args.group,
                id=m.properties.get(ID_PROPERTY, "?"),
                topic=m.topic,
                broker=m.broker_name,
                queue=m.queue_id,
                offset=m.queue_offset,
                t=t,
                reconsume=m.reconsume_times,
            )
            for m in msgs
        )

    def listener(
        msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext | ConsumeContext
    ) -> ConsumeOrderlyStatus | ConsumeResult:
        journal(msgs)
        return ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeResult.CONSUME_SUCCESS

    consumer = PushConsumer(config, listener, orderly=orderly)  # type: ignore[arg-type]
    consumer.subscribe(args.topic)
    return consumer


async def run_consumer(args: argparse.Namespace) -> None:
    stop = _stop_event()
    rec = Recorder(Path(args.journal), args.proc)
    record_offset_calls(rec, args.group)
    consumer = make_consumer(args, rec)
    await consumer.start()
    write_ready(Path(args.ready_file))
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await consumer.close()
        rec.close()


# ---- entry ------------------------------------------------------------------------------------


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("role", choices=("producer", "consumer"))
    p.add_argument("--namesrv", required=True, help="nameserver host:port (';' separates more)")
    p.add_argument("--proc", required=True, help="this process's name in the journals")
    p.add_argument("--journal", required=True)
    p.add_argument("--ready-file", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--topic", default="ChaosTopic")
    p.add_argument("--rate", type=float, default=20.0, help="messages per second")
    p.add_argument("--orderly-topic", default="", help="topic of sharding-key sends")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--orderly-share", type=float, default=0.3)
    p.add_argument("--delay-share", type=float, default=0.0)
    p.add_argument("--delay-ms", type=int, default=1500)
    p.add_argument("--group", default="")
    p.add_argument("--mode", choices=("orderly", "concurrent"), default="concurrent")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )
    asyncio.run(run_producer(args) if args.role == "producer" else run_consumer(args))


if __name__ == "__main__":
    main()
