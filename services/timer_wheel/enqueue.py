"""Enqueue side of the timer wheel: timer records from the brokers into durable local storage.

:class:`TimerStore` owns the four storage parts (TimerLog, MessageLog, TimerWheel, Checkpoint)
and the wheel's hand; :class:`TimerConsumer` reads ``rmq_sys_wheel_timer`` of every broker group
as the consumer group ``TIMER_GROUP`` and hands each pulled batch to
:meth:`TimerStore.accept`.

Linking one timer record (all synchronous, on the event loop, so the dequeue side never sees a
half-linked slot):

1. ``out_ms`` = its TIMER_OUT_MS (missing or malformed: now, logged: deliver at once);
2. ``MessageLog.append(broker_name, record)`` — the record bytes exactly as stored (a compressed
   body stays compressed);
3. the target slot: ``out_ms`` floored to the precision; a slot the hand has passed (overdue on
   arrival) is replaced by the hand's slot; a slot a whole window or more past the hand is
   replaced by the farthest slot of the window, with ``MAGIC_ROLL`` (re-linked when it fires);
4. a TimerLog unit with ``prev_pos`` = the slot's ``last_pos``, ``curr_write_time_ms`` = the slot
   time and ``delayed_time_ms`` = ``out_ms`` − slot time (signed, clamped to int32), so the
   unit's ``deliver_ms`` is the timer's own millisecond and ``curr_write_time_ms`` names the
   slot it is linked into (recovery unlinks by it); a cancel marker (TIMER_DEL_UNIQKEY) gets
   ``MAGIC_DELETE``;
5. ``TimerWheel.link``; the dequeue side is woken when the slot is the hand's.

Durability (:meth:`TimerStore.checkpoint`, every ``timerFlushIntervalMs`` while something
changed): capture the log ends, hand and read offsets, flush both logs and the wheel, save the
checkpoint; only then does the consumer commit those offsets to the brokers. A crash re-reads
everything after the committed offsets; re-puts of timers delivered twice are dropped by the
broker (TIMER_SOURCE dedup).

Recovery (:meth:`TimerStore.open`): load the checkpoint, undo the wheel links of the TimerLog
units written after it (newest first), truncate both logs to it, resume the hand at its
``hand_ms``. Nothing else is rebuilt: the wheel file is mapped and flushed with the checkpoint.

Memory stays bounded whatever the backlog: pending timers live on disk; in memory are at most
one pull batch per owned queue and the due timers of the slot being delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.consumer.allocate import AllocateAveragely
from rocketq.client.consumer.config import MessageModel
from rocketq.client.errors import NotFoundError, RocketQError
from rocketq.client.internal import (
    BrokerApi,
    ClientConfig,
    ClientInstance,
    ProcessQueue,
    PullRequest,
    RebalanceImpl,
    RebalanceService,
    TopicRoute,
    local_ip,
    readable_queues,
)
from rocketq.codec import Prop
from rocketq.java_hash import java_string_hash
from rocketq.message import MessageQueue
from rocketq.validation import TIMER_TOPIC
from services.common.clock import Clock
from services.timer_wheel import TIMER_GROUP
from services.timer_wheel.checkpoint import Checkpoint
from services.timer_wheel.config import TimerConfig
from services.timer_wheel.message_log import MessageLog
from services.timer_wheel.timer_log import (
    MAGIC_DEFAULT,
    MAGIC_DELETE,
    MAGIC_ROLL,
    TimerLog,
    TimerStoreError,
)
from services.timer_wheel.wheel import TimerWheel

log = logging.getLogger("rocketq.timer_wheel.enqueue")

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
QueueKey = tuple[str, int]
DUE_WINDOW_S = 10
"""GetTimerStats.due_per_second averages over this many seconds."""
PULL_SYS_FLAGS = 0x2 | 0x4
"""FLAG_SUSPEND (long poll) | FLAG_SUBSCRIPTION (expression in the request)."""
PULL_RETRY_S = 1.0
COMMIT_RETRY_S = 1.0


@dataclass
class QueueProgress:
    """One owned queue of the timer topic (GetTimerStats.queues)."""

    read_offset: int
    committed_offset: int
    max_offset: int = -1
    oldest_unread_store_ms: int = 0
    """Store time of the last record read while the queue had a backlog; 0 when caught up."""


@dataclass
class Counters:
    """Since-start statistics shared by both sides."""

    scheduled_total: int = 0
    delivered_total: int = 0
    cancelled_total: int = 0
    overdue_on_arrival_total: int = 0
    dropped_total: int = 0
    """Records that can never be delivered (no REAL_TOPIC, refused forever); logged."""
    pending: int = 0
    lateness_ms: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    due_by_second: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=64))

    def count_due(self, now_ms: int, n: int) -> None:
        sec = now_ms // 1000
        if self.due_by_second and self.due_by_second[-1][0] == sec:
            self.due_by_second[-1] = (sec, self.due_by_second[-1][1] + n)
        else:
            self.due_by_second.append((sec, n))

    def due_per_second(self, now_ms: int) -> float:
        sec = now_ms // 1000
        total = sum(n for s, n in self.due_by_second if sec - DUE_WINDOW_S < s <= sec)
        return total / DUE_WINDOW_S


def clamp_int32(value: int) -> int:
    return max(INT32_MIN, min(INT32_MAX, value))


def parse_out_ms(props: dict[str, str], now_ms: int) -> int | None:
    """TIMER_OUT_MS as an int, or None when missing or malformed."""
    text = props.get(Prop.TIMER_OUT_MS, "")
    try:
        return int(text)
    except ValueError:
        return None


class TimerStore:
    """Storage, hand and counters of one timer-wheel instance (see the module docstring)."""

    def __init__(self, config: TimerConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.precision_ms = config.precision_ms
        self.window_ms = config.window_ms
        data = Path(config.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.timer_log = TimerLog(data / "timerlog", config.timer_log_file_bytes)
        self.message_log = MessageLog(data / "messagelog", config.message_log_file_bytes)
        self.wheel = TimerWheel(data / "timerwheel", config.wheel_slots, config.precision_ms)
        self.ckpt = Checkpoint(data / "checkpoint.json")
        self.counters = Counters()
        self.hand_ms = 0
        """Every slot starting before this time has been delivered."""
        self.read_offsets: dict[QueueKey, int] = {}
        """Next offset to read per owned queue: every record before it is appended here."""
        self.dirty = False
        self.on_hand_slot_linked: Callable[[], None] = lambda: None
        """Called when a unit is linked into the hand's slot (wakes the dequeue side)."""

    # ---- life cycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Recover to the checkpoint (module docstring) and set the hand."""
        had = self.ckpt.load()
        now_ms = self.clock.now_ms()
        if not had:
            self.hand_ms = self.wheel.slot_time_ms(now_ms)
            self.timer_log.truncate_to(self.timer_log.min_pos)
            self.message_log.truncate_to(self.message_log.min_pos)
            log.info("timer store fresh hand_ms=%d", self.hand_ms)
            return
        undone = self._undo_tail(self.ckpt.timer_log_pos)
        self.timer_log.truncate_to(self.ckpt.timer_log_pos)
        self.message_log.truncate_to(self.ckpt.message_log_pos)
        self.wheel.flush()
        self.hand_ms = self.ckpt.hand_ms or self.wheel.slot_time_ms(now_ms)
        self.counters.pending = self._count_pending()
        log.info(
            "timer store recovered hand_ms=%d timer_log_pos=%d message_log_pos=%d "
            "tail_units_undone=%d pending=%d",
            self.hand_ms,
            self.ckpt.timer_log_pos,
            self.ckpt.message_log_pos,
            undone,
            self.counters.pending,
        )

    def _undo_tail(self, from_pos: int) -> int:
        """Unlink the units written after the checkpoint, newest first (a crash left them)."""
        tail: list[tuple[int, int, int]] = []
        try:
            for pos, unit in self.timer_log.iter_units(from_pos):
                tail.append((pos, unit.curr_write_time_ms, unit.prev_pos))
        except TimerStoreError as exc:  # a torn unit ends the readable tail
            log.warning("timer log tail after %d ends early: %s", from_pos, exc)
        for pos, slot_ms, prev_pos in reversed(tail):
            self.wheel.unlink_last(slot_ms, pos, prev_pos)
        return len(tail)

    def _count_pending(self) -> int:
        """Units linked from the hand over twice the window (rolled ones included)."""
        slots = self.wheel.scan(self.hand_ms, self.hand_ms + 2 * self.window_ms)
        return sum(s.num for s in slots)

    def close(self) -> None:
        for part in (self.timer_log, self.message_log, self.wheel):
            with contextlib.suppress(Exception):
                part.close()

    # ---- linking ------------------------------------------------------------------------------

    def target_slot(self, out_ms: int) -> tuple[int, int]:
        """(slot time, extra magic) for a timer due at ``out_ms`` (steps 3 of the docstring)."""
        slot_ms = self.wheel.slot_time_ms(out_ms)
        if slot_ms < self.hand_ms:
            return self.hand_ms, 0
        if slot_ms - self.hand_ms >= self.window_ms:
            return self.hand_ms + self.window_ms - self.precision_ms, MAGIC_ROLL
        return slot_ms, 0

    def link_unit(
        self, out_ms: int, offset_py: int, size_py: int, magic: int, hash_topic: int
    ) -> int:
        """Append a unit for a message already in the MessageLog and link it; its position."""
        slot_ms, extra = self.target_slot(out_ms)
        magic = (magic & ~MAGIC_ROLL) | extra | MAGIC_DEFAULT
        slot = self.wheel.get_slot(slot_ms)
        pos = self.timer_log.append_fields(
            slot.last_pos if not slot.empty else -1,
            magic,
            slot_ms,
            clamp_int32(out_ms - slot_ms),
            offset_py,
            size_py,
            hash_topic,
        )
        self.wheel.link(slot_ms, pos)
        self.dirty = True
        if slot_ms == self.hand_ms:
            self.on_hand_slot_linked()
        return pos

    def accept(self, broker_name: str, records: list[tuple[bytes, codec.Record]]) -> int:
        """Append and link pulled timer records (raw bytes + decoded); returns how many."""
        now_ms = self.clock.now_ms()
        linked = 0
        for raw, rec in records:
            props = rec.properties
            real_topic = props.get(Prop.REAL_TOPIC, "")
            if not real_topic:
                self.counters.dropped_total += 1
                log.error(
                    "timer record without REAL_TOPIC dropped broker=%s queue=%d offset=%d",
                    broker_name,
                    rec.queue_id,
                    rec.queue_offset,
                )
                continue
            out_ms = parse_out_ms(props, now_ms)
            if out_ms is None:
                log.warning(
                    "timer record broker=%s queue=%d offset=%d has TIMER_OUT_MS=%r; delivered now",
                    broker_name,
                    rec.queue_id,
                    rec.queue_offset,
                    props.get(Prop.TIMER_OUT_MS),
                )
                out_ms = now_ms
            marker = Prop.TIMER_DEL_UNIQKEY in props
            offset_py, size_py = self.message_log.append(broker_name, raw)
            self.link_unit(
                out_ms,
                offset_py,
                size_py,
                MAGIC_DEFAULT | (MAGIC_DELETE if marker else 0),
                java_string_hash(real_topic),
            )
            linked += 1
            if not marker:
                self.counters.scheduled_total += 1
                self.counters.pending += 1
                if out_ms <= now_ms:
                    self.counters.overdue_on_arrival_total += 1
        return linked

    # ---- durability ---------------------------------------------------------------------------

    def checkpoint(self) -> dict[QueueKey, int]:
        """Make everything appended so far durable, then save the checkpoint; returns the
        read offsets it covers (safe to commit to the brokers now)."""
        snap = self.begin_checkpoint()
        self.finish_checkpoint(snap)
        return snap.offsets

    def begin_checkpoint(self) -> CheckpointSnapshot:
        """Capture what the next checkpoint covers (on the event loop, between appends)."""
        self.dirty = False
        return CheckpointSnapshot(
            dict(self.read_offsets),
            self.timer_log.max_pos,
            self.message_log.max_pos,
            self.hand_ms,
        )

    def finish_checkpoint(self, snap: CheckpointSnapshot) -> None:
        """Flush logs and wheel, then save the checkpoint: blocking, safe in a worker thread
        while the event loop keeps appending (only bytes before the snapshot must be durable;
        one finish at a time)."""
        self.message_log.flush()
        self.timer_log.flush()
        self.wheel.flush()
        self.ckpt.timer_log_pos = snap.timer_log_pos
        self.ckpt.message_log_pos = snap.message_log_pos
        self.ckpt.hand_ms = snap.hand_ms
        self.ckpt.queue_offsets.update(snap.offsets)
        self.ckpt.save()


@dataclass(frozen=True)
class CheckpointSnapshot:
    offsets: dict[QueueKey, int]
    timer_log_pos: int
    message_log_pos: int
    hand_ms: int


# ---- the consumer ------------------------------------------------------------------------------


class _Handle:
    """The ConsumerHandle the ClientInstance heartbeats and notifies."""

    def __init__(self, consumer: TimerConsumer) -> None:
        self._c = consumer

    def consumer_data(self) -> messaging_pb2.ConsumerData:
        return messaging_pb2.ConsumerData(
            consumer_group=TIMER_GROUP,
            consume_type=messaging_pb2.CONSUME_TYPE_PULL,
            message_model=messaging_pb2.CLUSTERING,
            consume_from_where=messaging_pb2.CONSUME_FROM_FIRST_OFFSET,
            subscriptions=[
                messaging_pb2.SubscriptionData(
                    topic=TIMER_TOPIC, expression="*", expression_type=common_pb2.TAG, sub_version=1
                )
            ],
        )

    def topics(self) -> list[str]:
        return [TIMER_TOPIC]

    def on_route_changed(self, topic: str, route: TopicRoute) -> None:
        self._c.wakeup_rebalance()

    def on_consumer_ids_changed(self) -> None:
        self._c.wakeup_rebalance()

    def on_reset_offset(self, topic: str, broker_name: str, offsets: dict[int, int]) -> None:
        log.warning("offset reset of the timer topic ignored broker=%s", broker_name)

    def on_subscription_conflict(self, conflict: common_pb2.SubscriptionConflict) -> None:
        log.warning("subscription conflict reported for the timer group: %s", conflict)


def split_records(buf: bytes) -> list[tuple[bytes, codec.Record]]:
    """A Pull response's concatenated records as (raw bytes, decoded) pairs."""
    out: list[tuple[bytes, codec.Record]] = []
    pos = 0
    view = memoryview(buf)
    while pos < len(buf):
        rec = codec.decode_record(view, pos)
        out.append((buf[pos : pos + rec.total_size], rec))
        pos += rec.total_size
    return out


class TimerConsumer:
    """Reads the timer topic of every broker group into a :class:`TimerStore`.

    The SDK's ClientInstance (routes, heartbeats, ClientStreams) and rebalance (allocation over
    the group's members) do the group membership; pulls are raw gRPC Pulls, so records arrive as
    stored bytes with their commitlog offsets, and offsets are committed only after the
    checkpoint (:meth:`flush_once`).
    """

    def __init__(self, store: TimerStore, config: TimerConfig, instance_name: str = "") -> None:
        self.store = store
        self.config = config
        self.instance_name = instance_name or f"timer-wheel-{random.getrandbits(48):x}"
        self.instance: ClientInstance | None = None
        self.api: BrokerApi | None = None
        self._rebalance: RebalanceImpl | None = None
        self._rebalance_service: RebalanceService | None = None
        self.progress: dict[QueueKey, QueueProgress] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._committed: dict[QueueKey, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._flush_lock = asyncio.Lock()
        self._closing = False

    # ---- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        instance = ClientInstance.get(
            ClientConfig(
                namesrv_addrs=tuple(cfg.namesrv_addrs),
                instance_name=self.instance_name,
                client_ip=local_ip(),
                request_timeout_ms=cfg.request_timeout_ms,
            )
        )
        self.instance = instance
        self.api = BrokerApi(instance, TIMER_GROUP, cfg.request_timeout_ms)
        self._rebalance = RebalanceImpl(
            group=TIMER_GROUP,
            client_id=instance.client_id,
            message_model=MessageModel.CLUSTERING,
            strategy=AllocateAveragely(),
            queues_of=lambda topic: readable_queues(instance, topic),
            consumer_ids=self.api.consumer_ids,
            compute_offset=self._compute_offset,
            remove_queue=self._remove_queue,
            dispatch=self._dispatch,
            check_pull_expired=False,
        )
        self._rebalance.topics = {TIMER_TOPIC}
        instance.register_consumer(TIMER_GROUP, _Handle(self))
        await instance.start()
        with contextlib.suppress(RocketQError):
            await readable_queues(instance, TIMER_TOPIC)
        with contextlib.suppress(Exception):
            await instance.heartbeat_now()
        self._rebalance_service = RebalanceService(
            self._rebalance.do_rebalance, cfg.rebalance_interval_ms, TIMER_GROUP
        )
        self._rebalance_service.start()
        self._spawn(self._flush_loop())

    def wakeup_rebalance(self) -> None:
        if self._rebalance_service is not None and not self._closing:
            self._rebalance_service.wakeup()

    async def close(self) -> None:
        """Stop pulling, checkpoint, commit, leave the group."""
        self._closing = True
        if self._rebalance_service is not None:
            await self._rebalance_service.close()
        for task in [*self._tasks, *self._pull_tasks.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._pull_tasks.values(), return_exceptions=True)
        self._pull_tasks.clear()
        with contextlib.suppress(Exception):
            await self.flush_once(force=True)
        if self.instance is not None:
            await self.instance.unregister_consumer(TIMER_GROUP)
            await self.instance.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- rebalance callbacks ------------------------------------------------------------------

    async def _compute_offset(self, mq: MessageQueue) -> int:
        """The broker's committed offset, or the checkpoint's when it is ahead (a crash between
        checkpoint and commit); the queue's min offset for a group with nothing stored."""
        assert self.api is not None
        try:
            stored = await self.api.query_offset(mq)
        except NotFoundError:
            stored = -1
        except RocketQError as exc:
            log.warning("cannot read the committed offset of %s: %s", mq, exc)
            return -1
        local = self.store.ckpt.queue_offsets.get((mq.broker_name, mq.queue_id), -1)
        if stored < 0 and local < 0:
            try:
                stored = await self.api.min_offset(mq)
            except RocketQError as exc:
                log.warning("cannot read the min offset of %s: %s", mq, exc)
                return -1
        start = max(stored, local)
        self._committed[(mq.broker_name, mq.queue_id)] = stored
        return start

    def _dispatch(self, requests: list[PullRequest]) -> None:
        for req in requests:
            mq = req.message_queue
            key = (mq.broker_name, mq.queue_id)
            self.progress[key] = QueueProgress(req.next_offset, self._committed.get(key, -1))
            self.store.read_offsets[key] = req.next_offset
            self._pull_tasks[mq] = asyncio.ensure_future(self._pull_loop(mq, req.process_queue))

    async def _remove_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Stop the queue's pulls, make what it read durable and commit it, then forget it."""
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.flush_once(force=True)
        key = (mq.broker_name, mq.queue_id)
        self.store.read_offsets.pop(key, None)
        self.progress.pop(key, None)
        return True

    # ---- pulling ------------------------------------------------------------------------------

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        key = (mq.broker_name, mq.queue_id)
        while not pq.dropped and not self._closing:
            try:
                await self._pull_once(mq, key)
            except asyncio.CancelledError:
                raise
            except RocketQError as exc:
                log.warning("pull of %s failed: %s", mq, exc)
                assert self.api is not None
                await self.api.refresh_route(mq.topic)
                await asyncio.sleep(PULL_RETRY_S)
            except Exception:  # a bug must not stop this queue for the life of the process
                log.exception("pull loop of %s failed", mq)
                await asyncio.sleep(PULL_RETRY_S)

    async def _pull_once(self, mq: MessageQueue, key: QueueKey) -> None:
        assert self.api is not None
        cfg = self.config
        prog = self.progress[key]
        addr = await self.api.master_addr(mq)
        req = messaging_pb2.PullRequest(
            consumer_group=TIMER_GROUP,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=prog.read_offset,
            max_msg_nums=cfg.pull_batch_max,
            sys_flag=PULL_SYS_FLAGS,
            suspend_timeout_ms=cfg.pull_suspend_ms,
            subscription="*",
            expression_type=common_pb2.TAG,
        )
        resp = await self.api.pull(addr, req, cfg.pull_suspend_ms + 5000)
        if self.progress.get(key) is not prog:
            return  # the queue was released while the pull was held
        prog.max_offset = resp.max_offset
        if resp.status == messaging_pb2.FOUND:
            records = split_records(resp.records)
            self.store.accept(mq.broker_name, records)
            if records and resp.next_begin_offset < resp.max_offset:
                prog.oldest_unread_store_ms = records[-1][1].store_timestamp_ms
            else:
                prog.oldest_unread_store_ms = 0
        elif resp.status == messaging_pb2.OFFSET_ILLEGAL:
            log.warning(
                "timer queue %s offset %d illegal; moving to %d",
                mq,
                prog.read_offset,
                resp.next_begin_offset,
            )
        else:
            prog.oldest_unread_store_ms = 0
        prog.read_offset = resp.next_begin_offset
        self.store.read_offsets[key] = resp.next_begin_offset

    # ---- durability and commits ---------------------------------------------------------------

    async def _flush_loop(self) -> None:
        interval_s = self.config.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush_once()
            except Exception:  # keep flushing; the next round retries
                log.exception("timer checkpoint failed")
                await asyncio.sleep(COMMIT_RETRY_S)

    async def flush_once(self, force: bool = False) -> None:
        """Checkpoint if anything changed, then commit the covered offsets that moved."""
        async with self._flush_lock:
            store = self.store
            moved = any(self._committed.get(k) != v for k, v in store.read_offsets.items())
            if not (store.dirty or moved or force or store.hand_ms != store.ckpt.hand_ms):
                return
            snap = store.begin_checkpoint()
            # fdatasyncs off the loop, so deliveries keep their millisecond meanwhile
            await asyncio.to_thread(store.finish_checkpoint, snap)
            await self._commit(snap.offsets)

    async def _commit(self, offsets: dict[QueueKey, int]) -> None:
        assert self.api is not None
        api = self.api
        todo = {k: v for k, v in offsets.items() if self._committed.get(k) != v}

        async def one(key: QueueKey, offset: int) -> None:
            mq = MessageQueue(TIMER_TOPIC, key[0], key[1])
            try:
                await api.update_offset(mq, offset)
            except RocketQError as exc:
                log.warning("commit of %s offset %d failed: %s", mq, offset, exc)
                return
            self._committed[key] = offset
            prog = self.progress.get(key)
            if prog is not None:
                prog.committed_offset = offset

        await asyncio.gather(*(one(k, v) for k, v in todo.items()))

    def queue_rows(self) -> list[tuple[QueueKey, QueueProgress]]:
        return sorted(self.progress.items())
