"""Dequeue side of the timer wheel: the hand walks the slots and re-puts due messages.

The hand (``TimerStore.hand_ms``) is the start of the first slot not yet fully delivered. The
slot under the hand is *opened* when the clock reaches it, or earlier when a unit is linked into
it (an overdue arrival); opening and every later wake-up *collect* the slot: walk its chain from
``last_pos`` back to the newest unit already collected, oldest first:

| unit magic     | action                                                                  |
|----------------|-------------------------------------------------------------------------|
| MAGIC_DELETE   | a cancel marker: its TIMER_DEL_UNIQKEY is remembered for this slot      |
| MAGIC_ROLL     | a timer beyond the window: linked again, further on (or into its slot) |
| otherwise      | into a min-heap by ``deliver_ms`` (the timer's own millisecond)         |

Every heap entry whose ``deliver_ms`` has come is re-put — never earlier — unless its UNIQ_KEY
was cancelled: ``Messaging.Send`` to the master of the broker group the timer came from, topic
REAL_TOPIC, queue REAL_QID, the record's body (compressed bodies stay compressed), flag,
reconsume times and properties minus REAL_TOPIC / REAL_QID plus TIMER_SOURCE (the timer
record's commitlog offset: the broker drops a second re-put of it) and TIMER_DEQUEUE_MS. Due
messages are grouped per (broker, topic, queue, sys flag, reconsume times) and sent in batches of
``timerSendBatchSize``, the groups concurrently. A failed send is retried with backoff for as
long as it takes (a broker down holds the hand); only refusals that can never succeed (topic
gone, invalid queue, no permission) give up after a few attempts, logged and counted.

A slot is complete when its heap is empty and the clock has passed its end; only then does the
hand move on (without an await in between, so no unit can be linked into a slot the hand has
already left). The hand is saved with the next checkpoint.

Waiting: :meth:`Dequeuer.tick` does everything due now and returns how many clock ms until
something is due; :meth:`Dequeuer.run` sleeps that long, divided by the clock's ``speed`` on a
scaled clock, or until woken. Unit tests drive ``tick`` with a ManualClock and no sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
from opentelemetry.trace import SpanKind

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.aio import wait_event
from rocketq.backoff import Backoff
from rocketq.client.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RocketQError,
    from_rpc_error,
)
from rocketq.client.internal import ClientInstance
from rocketq.codec import Prop
from rocketq.validation import TIMER_TOPIC
from services.common.clock import Clock
from services.common.telemetry import messaging as telemetry
from services.common.telemetry import state as telemetry_state
from services.timer_wheel import TIMER_GROUP
from services.timer_wheel.config import TimerConfig
from services.timer_wheel.enqueue import TimerStore, parse_out_ms
from services.timer_wheel.timer_log import MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL, TimerStoreError

log = logging.getLogger("rocketq.timer_wheel.dequeue")

SEND_BATCH_BYTES_MAX = 3 * 1024 * 1024
"""A re-put batch stays under the broker's 4 MiB request limit."""
RETRY_BACKOFF_MIN_S = 0.1
RETRY_BACKOFF_MAX_S = 5.0
REFUSED_ATTEMPTS_MAX = 5
"""A send refused as invalid / not found / denied is given up after this many attempts."""
IDLE_WAIT_MS = 60_000
_REFUSALS = (InvalidArgumentError, NotFoundError, PermissionDeniedError)

HeapEntry = tuple[int, int, int, int]
"""(deliver_ms, timer log position, message log position, message log size)."""


class Sender(Protocol):
    """Sends one re-put batch to the master of a broker group."""

    async def send(
        self, broker_name: str, request: messaging_pb2.SendRequest
    ) -> messaging_pb2.SendResponse: ...


class BrokerSender:
    """:class:`Sender` over the client instance: masters from the timer topic's route."""

    def __init__(self, instance: ClientInstance, timeout_ms: int) -> None:
        self._instance = instance
        self._timeout_s = timeout_ms / 1000

    async def master_addr(self, broker_name: str) -> str:
        for refresh in (False, True):
            route = None if refresh else self._instance.cached_route(TIMER_TOPIC)
            if route is None:
                route = await self._instance.get_route(TIMER_TOPIC, refresh=refresh)
            addr = route.master_addr(broker_name)
            if addr:
                return addr
        raise BrokerUnavailableError(f"no master of broker group {broker_name} in the route")

    async def send(
        self, broker_name: str, request: messaging_pb2.SendRequest
    ) -> messaging_pb2.SendResponse:
        addr = await self.master_addr(broker_name)
        try:
            resp: messaging_pb2.SendResponse = await self._instance.messaging(addr).Send(
                request, timeout=self._timeout_s
            )
            return resp
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                with contextlib.suppress(RocketQError):
                    await self._instance.get_route(TIMER_TOPIC, refresh=True)
            raise from_rpc_error(err, addr) from None


@dataclass(slots=True)
class Reput:
    """What a re-put needs of a stored timer record (the hot path skips a full decode)."""

    flag: int
    sys_flag: int
    physical_offset: int
    reconsume_times: int
    body: bytes
    properties: dict[str, str]


def read_reput(raw: bytes) -> Reput:
    """The fields of the record ``raw`` a re-put copies; CorruptRecord if they do not fit."""
    if len(raw) < codec.RECORD_MIN_BYTES:
        raise codec.CorruptRecord(f"record of {len(raw)} bytes is too short")
    sys_flag = codec.peek_sys_flag(raw)
    body_at, body_end, _topic_at, _topic_end, props_at = codec.record_spans(
        raw, 0, len(raw), sys_flag
    )
    return Reput(
        flag=codec.peek_flag(raw),
        sys_flag=sys_flag,
        physical_offset=codec.peek_physical_offset(raw),
        reconsume_times=codec.peek_reconsume_times(raw),
        body=raw[body_at:body_end],
        properties=codec.decode_properties(raw[props_at:]),
    )


GroupKey = tuple[str, str, int, int, int]
"""(broker name, real topic, queue id, sys flag, reconsume times): one Send request shape."""


class Dequeuer:
    """The hand of one timer-wheel instance (see the module docstring)."""

    def __init__(
        self,
        store: TimerStore,
        sender: Sender,
        clock: Clock,
        config: TimerConfig,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.sender = sender
        self.clock = clock
        self.config = config
        self._sleep = sleep
        self._open: int | None = None
        """Start of the opened slot (always the hand's), or None."""
        self._top = -1
        """Newest TimerLog position of the opened slot already collected."""
        self._heap: list[HeapEntry] = []
        self._cancelled: set[str] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        store.on_hand_slot_linked = self._wake.set

    # ---- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver until :meth:`stop`."""
        speed = float(getattr(self.clock, "speed", 1.0))
        while not self._stopping:
            try:
                wait_ms = await self.tick()
            except Exception:  # a bug must not stop deliveries for the life of the process
                log.exception("dequeue tick failed")
                wait_ms = 1000
            if self._stopping:
                break
            wait_s = max(0.0, wait_ms) / 1000 / speed
            if wait_s > 0:
                await wait_event(self._wake, wait_s)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def pending_in_slot(self) -> int:
        return len(self._heap)

    def next_due_ms(self) -> int:
        """Earliest deliver_ms collected and not yet delivered; 0 if none."""
        return self._heap[0][0] if self._heap else 0

    async def tick(self) -> int:
        """Deliver everything due now; return clock ms until something may be due."""
        store = self.store
        precision = store.precision_ms
        while not self._stopping:
            woken = self._wake.is_set()
            self._wake.clear()
            now = self.clock.now_ms()
            hand = store.hand_ms
            if self._open != hand:
                if now < hand and not woken:
                    return hand - now
                self._open_slot(hand)
            self._collect(hand, now)
            due = self._pop_due(now)
            if due:
                if not await self._deliver(due):
                    return 0  # stopping
                continue
            if self._heap:
                return self._heap[0][0] - now
            if now < hand + precision:
                return hand + precision - now
            self._complete(hand)
        return IDLE_WAIT_MS

    # ---- slots --------------------------------------------------------------------------------

    def _open_slot(self, slot_ms: int) -> None:
        self._open = slot_ms
        self._top = -1
        self._heap = []
        self._cancelled = set()

    def _complete(self, slot_ms: int) -> None:
        self.store.hand_ms = slot_ms + self.store.precision_ms
        self.store.dirty = True
        self._open = None
        self._heap = []
        self._cancelled = set()

    def _collect(self, slot_ms: int, now_ms: int) -> None:
        """Take the units linked into the open slot since the last collect (oldest first)."""
        store = self.store
        slot = store.wheel.get_slot(slot_ms)
        if slot.empty or slot.last_pos <= self._top:
            return
        fresh = []
        pos = slot.last_pos
        while pos > self._top:
            try:
                unit = store.timer_log.read(pos)
            except TimerStoreError as exc:
                log.error("slot %d: chain broken at %d: %s", slot_ms, pos, exc)
                break
            if unit.curr_write_time_ms != slot_ms:
                log.error("slot %d: unit at %d belongs to slot %d; chain cut", slot_ms, pos,
                          unit.curr_write_time_ms)  # fmt: skip
                break
            fresh.append((pos, unit))
            pos = unit.prev_pos
        self._top = slot.last_pos
        timers = 0
        for pos, unit in reversed(fresh):
            if unit.magic & MAGIC_DELETE:
                key = self._marker_key(unit.offset_py, unit.size_py)
                if key:
                    self._cancelled.add(key)
            elif unit.magic & MAGIC_ROLL:
                self._relink(unit.offset_py, unit.size_py, unit.deliver_ms, unit.hash_topic)
            else:
                heapq.heappush(self._heap, (unit.deliver_ms, pos, unit.offset_py, unit.size_py))
                timers += 1
        if timers:
            store.counters.count_due(now_ms, timers)

    def _read_props(self, offset_py: int, size_py: int) -> dict[str, str] | None:
        try:
            _broker, raw = self.store.message_log.read(offset_py, size_py)
            return codec.decode_record(raw, check_crc=False).properties
        except (TimerStoreError, codec.CorruptRecord) as exc:
            log.error("message log entry %d unreadable: %s", offset_py, exc)
            return None

    def _marker_key(self, offset_py: int, size_py: int) -> str:
        props = self._read_props(offset_py, size_py)
        return props.get(Prop.TIMER_DEL_UNIQKEY, "") if props else ""

    def _relink(self, offset_py: int, size_py: int, unit_ms: int, hash_topic: int) -> None:
        """A rolled timer's slot fired: link it again, into its own slot if now in reach."""
        props = self._read_props(offset_py, size_py)
        out_ms = parse_out_ms(props, unit_ms) if props else None
        magic = MAGIC_DEFAULT | (MAGIC_DELETE if props and Prop.TIMER_DEL_UNIQKEY in props else 0)
        self.store.link_unit(out_ms if out_ms is not None else unit_ms, offset_py, size_py, magic,
                             hash_topic)  # fmt: skip

    def _pop_due(self, now_ms: int) -> list[HeapEntry]:
        due: list[HeapEntry] = []
        cap = self.config.deliver_batch_max
        while self._heap and self._heap[0][0] <= now_ms and len(due) < cap:
            due.append(heapq.heappop(self._heap))
        return due

    # ---- delivery -----------------------------------------------------------------------------

    async def _deliver(self, due: list[HeapEntry]) -> bool:
        """Re-put ``due``; False if stopped before all were sent (they are re-read later)."""
        counters = self.store.counters
        now = self.clock.now_ms()
        groups: dict[GroupKey, list[tuple[int, common_pb2.Message]]] = {}
        for deliver_ms, _pos, offset_py, size_py in due:
            try:
                broker, raw = self.store.message_log.read(offset_py, size_py)
                rec = read_reput(raw)
            except (TimerStoreError, codec.CorruptRecord, struct.error) as exc:
                log.error("timer message at %d unreadable, dropped: %s", offset_py, exc)
                counters.dropped_total += 1
                counters.pending -= 1
                continue
            props = rec.properties
            if props.get(Prop.UNIQ_KEY, "") in self._cancelled:
                counters.cancelled_total += 1
                counters.pending -= 1
                continue
            topic = props.pop(Prop.REAL_TOPIC, "")
            try:
                queue_id = int(props.pop(Prop.REAL_QUEUE_ID, "0") or 0)
            except ValueError:
                queue_id = 0
            props[Prop.TIMER_SOURCE] = str(rec.physical_offset)
            if telemetry_state.TRACING:  # a span in the delayed message's trace
                telemetry.mark(
                    f"deliver {topic}",
                    props,
                    SpanKind.PRODUCER,
                    {"rocketq.deliver_ms": deliver_ms},
                )
            props[Prop.TIMER_DEQUEUE_MS] = str(now)
            msg = common_pb2.Message(topic=topic, flag=rec.flag, body=rec.body, properties=props)
            key = (broker, topic, queue_id, rec.sys_flag & codec.SysFlag.COMPRESSED,
                   rec.reconsume_times)  # fmt: skip
            groups.setdefault(key, []).append((deliver_ms, msg))
        results = await asyncio.gather(*(self._send_group(k, v) for k, v in groups.items()))
        return all(results)

    async def _send_group(self, key: GroupKey, items: list[tuple[int, common_pb2.Message]]) -> bool:
        batch: list[tuple[int, common_pb2.Message]] = []
        size = 0
        for item in items:
            item_bytes = item[1].ByteSize()
            if batch and (
                len(batch) >= self.config.send_batch_max or size + item_bytes > SEND_BATCH_BYTES_MAX
            ):
                if not await self._send_batch(key, batch):
                    return False
                batch, size = [], 0
            batch.append(item)
            size += item_bytes
        return await self._send_batch(key, batch) if batch else True

    async def _send_batch(self, key: GroupKey, batch: list[tuple[int, common_pb2.Message]]) -> bool:
        broker, topic, queue_id, sys_flag, reconsume = key
        counters = self.store.counters
        req = messaging_pb2.SendRequest(
            producer_group=TIMER_GROUP,
            queue_id=queue_id,
            messages=[m for _ms, m in batch],
            born_timestamp_ms=self.clock.now_ms(),
            sys_flag=sys_flag,
            reconsume_times=reconsume,
        )
        refused = 0
        backoff = Backoff(RETRY_BACKOFF_MIN_S, RETRY_BACKOFF_MAX_S)
        while not self._stopping:
            try:
                await self.sender.send(broker, req)
            except RocketQError as exc:
                if isinstance(exc, _REFUSALS):
                    refused += 1
                    if refused >= REFUSED_ATTEMPTS_MAX:
                        log.error("re-put of %d messages to %s queue %d on %s refused %d times, "
                                  "dropped: %s", len(batch), topic, queue_id, broker, refused,
                                  exc)  # fmt: skip
                        counters.dropped_total += len(batch)
                        counters.pending -= len(batch)
                        return True
                delay_s = backoff.next_delay_s()
                log.warning("re-put to %s queue %d on %s failed (retry in %.1f s): %s",
                            topic, queue_id, broker, delay_s, exc)  # fmt: skip
                await self._sleep(delay_s)
                continue
            ack_ms = self.clock.now_ms()
            for deliver_ms, _msg in batch:
                counters.lateness_ms.append(ack_ms - deliver_ms)
            counters.delivered_total += len(batch)
            counters.pending -= len(batch)
            return True
        return False
