"""Helpers for the timer system tests: a cluster on a shared scaled clock and a recording consumer.

Delays of hours run in seconds because every process of a test cluster (nameserver, broker,
timer-wheel) gets the same ``ROCKETQ_CLOCK_SPEED`` / ``ROCKETQ_CLOCK_ORIGIN_MS`` pair, and the
test process builds the same :class:`ScaledClock` from it. All of them compute "now" from the
one host clock with the one formula, so a time stamped by the broker (TIMER_OUT_MS, a store
timestamp) and a receive time noted by the test compare exactly, in scaled milliseconds:
"never early" is checked with no tolerance at all.

Lateness is different: every real-time cost (an RPC, an fsync, a long-poll wake-up, a tick of
the wheel's loop) is multiplied by the speed when read on the scaled clock, so lateness bounds
are stated in *real* milliseconds and converted with :meth:`TimerCluster.scaled`.

    with timer_cluster(tmp_path, speed=720) as tc:
        rec = Recorder(tc.clock)
        async with recording_consumer(tc, "g", "T", rec):
            ...
        tc.check_logs()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from rocketq.client.admin import Admin
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    MessageModel,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.errors import RocketQError
from rocketq.codec import Prop
from rocketq.message import ReceivedMessage
from rocketq.validation import retry_topic
from services.common.clock import ScaledClock
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

BROKER = "broker-a"
#: RocketMQ's default delay levels (messageDelayLevel), in ms: level i + 1 is element i.
DELAY_LEVELS_MS = [
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
]


TimerCluster = Cluster
"""A nameserver, one broker (``tc.broker``) and one timer-wheel (``tc.timer``) on one scaled
clock (``tc.clock``): the :class:`tests.support.cluster.Cluster` that :func:`timer_cluster`
starts."""


@contextlib.contextmanager
def timer_cluster(
    root: Path,
    speed: float = 1.0,
    broker_keys: dict[str, object] | None = None,
    timer_keys: dict[str, object] | None = None,
) -> Iterator[TimerCluster]:
    """Start nameserver, broker and timer-wheel sharing a clock running ``speed`` times fast;
    all stopped (killed if stuck) after. A thin wrapper of :func:`tests.support.cluster.cluster`."""
    with cluster(
        root,
        timer_wheel=True,
        clock_speed=speed,
        broker_keys=broker_keys,
        timer_keys=timer_keys,
    ) as tc:
        yield tc


async def create_topic(tc: TimerCluster, topic: str, queues: int = 4) -> None:
    """Create ``topic`` on the broker and wait until the nameserver routes it."""
    async with RawClient(tc.broker.addr) as c:
        await c.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=BROKER),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
                ),
            ),
            timeout=10,
        )
    async with Admin(tc.namesrv_addrs) as admin:

        async def routed() -> bool:
            with contextlib.suppress(RocketQError):
                route = await admin.route(topic)
                return bool(route.queues) and route.queues[0].write_queue_nums == queues
            return False

        await until(routed, f"the nameserver to route {topic}", 15)


class TimerSender:
    """Sends ``count`` timers (one raw Send each, TIMER_DELIVER_MS) as fast as the broker takes
    them, ``concurrency`` at a time, rotating over ``queues`` queues.

    ``due_ms(i, now_ms)`` is timer i's wanted delivery time (scaled), given the scaled time just
    before its send; one that would be less than ``ahead_min_ms`` ahead is pushed to that floor
    (counted in ``bumped``), so every timer goes through the wheel rather than straight to its
    topic. Bodies are ``prefix + i``. ``sent`` counts acknowledged sends while :meth:`run` runs.
    """

    def __init__(
        self,
        tc: TimerCluster,
        topic: str,
        queues: int,
        count: int,
        due_ms: Callable[[int, int], int],
        *,
        prefix: str = "t",
        ahead_min_ms: int = 2_000,
        concurrency: int = 64,
    ) -> None:
        self.tc, self.topic, self.queues, self.count = tc, topic, queues, count
        self.due_ms, self.prefix = due_ms, prefix
        self.ahead_min_ms, self.concurrency = ahead_min_ms, concurrency
        self.wanted: dict[str, int] = {}
        """Body -> the TIMER_DELIVER_MS it was sent with."""
        self.bumped = 0
        self.sent = 0
        self.seconds = 0.0

    async def run(self) -> None:
        started = time.monotonic()
        sem = asyncio.Semaphore(self.concurrency)
        async with RawClient(self.tc.broker.addr) as c:
            stub = c.messaging

            async def one(i: int) -> None:
                async with sem:
                    now = self.tc.now_ms()
                    due = self.due_ms(i, now)
                    floor = now + self.ahead_min_ms
                    if due < floor:
                        due, self.bumped = floor, self.bumped + 1
                    key = f"{self.prefix}{i}"
                    self.wanted[key] = due
                    props = {Prop.TIMER_DELIVER_MS: str(due)}
                    request = messaging_pb2.SendRequest(
                        producer_group="pg-timers",
                        queue_id=i % self.queues,
                        messages=[
                            common_pb2.Message(
                                topic=self.topic, body=key.encode(), properties=props
                            )
                        ],
                    )
                    await stub.Send(request, timeout=30)
                    self.sent += 1

            await asyncio.gather(*(one(i) for i in range(self.count)))
        self.seconds = time.monotonic() - started


# ---- the recording consumer -----------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One listener call's view of one message, times in scaled ms."""

    key: str
    """The message body, which the tests make unique per sent message."""
    msg_id: str
    topic: str
    """As the listener saw it (a redelivery shows its original topic)."""
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    reconsume_times: int
    out_ms: int | None
    """TIMER_OUT_MS: the delivery time the broker stamped; None for a message never delayed."""
    retry_topic: str
    """RETRY_TOPIC: set on redeliveries through %RETRY%{group}."""
    recv_ms: int
    """Scaled time at which the listener got it."""
    done_ms: int
    """Scaled time at which the listener returned its result."""
    store_ms: int
    """The broker's store timestamp of the delivered copy (scaled)."""
    offset_msg_id: str
    timer_source: int | None
    """TIMER_SOURCE: commitlog offset of the timer record this copy was re-put from."""


def _int_property(msg: ReceivedMessage, name: str) -> int | None:
    text = msg.properties.get(name)
    return int(text) if text else None


class Recorder:
    """Listener that notes every delivery; ``fail(msg)`` True makes it answer RECONSUME_LATER."""

    def __init__(
        self, clock: ScaledClock, fail: Callable[[ReceivedMessage], bool] | None = None
    ) -> None:
        self.clock = clock
        self.fail = fail
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        self._keys: set[str] = set()

    async def listener(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        recv_ms = self.clock.now_ms()
        failed = self.fail is not None and any(self.fail(m) for m in msgs)
        done_ms = self.clock.now_ms()
        with self._lock:
            for m in msgs:
                key = m.body.decode()
                self._keys.add(key)
                self.deliveries.append(
                    Delivery(
                        key,
                        m.msg_id,
                        m.topic,
                        m.queue_id,
                        m.queue_offset,
                        m.commitlog_offset,
                        m.reconsume_times,
                        _int_property(m, Prop.TIMER_OUT_MS),
                        m.properties.get(Prop.RETRY_TOPIC, ""),
                        recv_ms,
                        done_ms,
                        m.store_timestamp_ms,
                        m.offset_msg_id,
                        _int_property(m, Prop.TIMER_SOURCE),
                    )
                )
        return ConsumeResult.RECONSUME_LATER if failed else ConsumeResult.CONSUME_SUCCESS

    def distinct(self) -> int:
        with self._lock:
            return len(self._keys)

    def snapshot(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def by_key(self) -> dict[str, list[Delivery]]:
        out: dict[str, list[Delivery]] = {}
        for d in self.snapshot():
            out.setdefault(d.key, []).append(d)
        return out

    async def wait_distinct(
        self, n: int, timeout_s: float, what: str = "", expected: Iterable[str] = ()
    ) -> None:
        """Wait until ``n`` distinct messages arrived; fail naming how many did and, given the
        ``expected`` keys, some that are missing."""
        try:
            await until(lambda: self.distinct() >= n, f"{n} distinct messages", timeout_s)
        except AssertionError:
            with self._lock:
                missing = sorted(set(expected) - self._keys)
            raise AssertionError(
                f"{what or 'deliveries'}: {self.distinct()} of {n} distinct messages "
                f"arrived within {timeout_s:.0f} s; missing e.g. {missing[:10]}"
            ) from None


@contextlib.asynccontextmanager
async def recording_consumer(
    tc: TimerCluster, group: str, topic: str, recorder: Recorder, **config: object
) -> AsyncIterator[PushConsumer]:
    """A started push consumer of ``topic`` feeding ``recorder``, owning ``topic``'s queues and
    (clustering) its retry topic's, so deliveries are timed from a ready consumer; closed on
    exit."""
    config.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    # %RETRY%{group} is created by the consumer's first heartbeat, after its first route
    # lookups. The SDK only notices a topic's first route at the next route poll (30 s) and
    # starts pulling it at the next periodic rebalance (20 s): a route seen for the first time
    # does not trigger one. Until then a retry would wait, so poll and rebalance often and
    # wait below until the retry queue is owned.
    config.setdefault("poll_name_server_interval_ms", 500)
    config.setdefault("rebalance_interval_ms", 500)
    cfg = PushConsumerConfig(group, tuple(tc.namesrv_addrs), **config)  # type: ignore[arg-type]
    consumer = PushConsumer(cfg, recorder.listener)
    consumer.subscribe(topic, "*")
    await consumer.start()
    try:
        await wait_assigned(consumer, topic, 1, timeout_s=15)
        if cfg.message_model is MessageModel.CLUSTERING:
            await wait_assigned(consumer, retry_topic(group), 1, timeout_s=15)
        yield consumer
    finally:
        await consumer.close()


async def wait_assigned(consumer: PushConsumer, topic: str, queues: int, timeout_s: float) -> None:
    """Wait until ``consumer`` owns ``queues`` queues of ``topic`` (its rebalance ran)."""
    try:
        await until(
            lambda: len([q for q in consumer.assigned_queues() if q.topic == topic]) >= queues,
            f"the consumer to get {queues} queues of {topic}",
            timeout_s,
            0.02,
        )
    except AssertionError as exc:
        owns = sorted(map(str, consumer.assigned_queues()))
        raise AssertionError(f"{exc}: it owns {owns}") from None


async def timer_record(tc: TimerCluster, d: Delivery) -> ReceivedMessage | None:
    """The timer record (in rmq_sys_wheel_timer) a delivered copy was re-put from, read back
    from the broker by its TIMER_SOURCE; None when the copy names none."""
    if d.timer_source is None:
        return None
    host, _ = codec.decode_offset_msg_id(d.offset_msg_id)
    async with Admin(tc.namesrv_addrs) as admin:
        return await admin.view_message(codec.encode_offset_msg_id(host, d.timer_source))


# ---- checks ---------------------------------------------------------------------------------


def early_deliveries(deliveries: list[Delivery]) -> list[str]:
    """Deliveries received or stored before their TIMER_OUT_MS, described for a failure."""
    bad = []
    for d in deliveries:
        if d.out_ms is None:
            continue
        if d.recv_ms < d.out_ms or d.store_ms < d.out_ms:
            bad.append(
                f"{d.key}: due {d.out_ms}, stored {d.store_ms} ({d.store_ms - d.out_ms:+d} ms), "
                f"received {d.recv_ms} ({d.recv_ms - d.out_ms:+d} ms)"
            )
    return bad


def check_against_asked(
    deliveries: list[Delivery], wanted: dict[str, int]
) -> tuple[list[str], int]:
    """Problems of timers sent with TIMER_DELIVER_MS = ``wanted[key]``: received or stored
    before that time (exact), or stamped with another TIMER_OUT_MS. Also returns how many were
    stored straight in their topic (no TIMER_OUT_MS) because they were due when the broker got
    them; those must not be early either."""
    problems = []
    direct = 0
    for d in deliveries:
        asked = wanted[d.key]
        if min(d.recv_ms, d.store_ms) < asked:
            problems.append(
                f"{d.key} EARLY: due {asked}, stored {d.store_ms - asked:+d} ms, "
                f"received {d.recv_ms - asked:+d} ms"
            )
        if d.out_ms is None:
            direct += 1
        elif d.out_ms != asked:
            problems.append(f"{d.key}: asked for {asked}, TIMER_OUT_MS is {d.out_ms}")
    return problems, direct


@dataclass
class DuplicateCount:
    """Extra deliveries beyond one per message: redeliveries of one stored copy (the consumer
    saw the same queue offset again) and extra stored copies (a re-put stored twice)."""

    redelivered: int = 0
    stored_twice: int = 0
    examples: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"{self.redelivered} redeliveries of the same stored copy, "
            f"{self.stored_twice} extra stored copies; e.g. {self.examples[:5]}"
        )


def count_duplicates(by_key: dict[str, list[Delivery]]) -> DuplicateCount:
    out = DuplicateCount()
    for key, ds in by_key.items():
        copies = {d.commitlog_offset for d in ds}  # one broker: the offset names the copy
        out.stored_twice += len(copies) - 1
        out.redelivered += len(ds) - len(copies)
        if len(ds) > 1 and len(out.examples) < 20:
            out.examples.append(f"{key} x{len(ds)} at {sorted(copies)}")
    return out
