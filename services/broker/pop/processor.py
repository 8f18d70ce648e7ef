"""Pop, Ack and ChangeInvisibleTime on one broker (messaging.proto documents the statuses).

A Pop reads every queue it covers (the asked queue, or all read queues of the topic, plus the
queues of the group's pop retry topic ``%RETRY%{group}_{topic}``, RocketMQ 5's name) from the
group's pop offset, appends one checkpoint per queue that gave messages to the revive log, and
moves the pop offset past what it read (messages a filter skipped included). FIFO groups (the
group's ``consumeMessageOrderly``) are ordered per message group (``pop/fifo.py``): a message
group's next message waits until the previous is acked, other message groups of the queue go
on, and a message not acked in time is handed out again from the queue, in order, with one
more delivery attempt (never through the retry topic).
The pop offset of a queue is the larger of the revive log's (``PopState.next_offsets``) and the
consumer offset table's; a group that has neither starts at offset 0 while the queue was never
trimmed (every message still there), else at the queue's end, and retry topics always at their
start.

One lock orders the changes (Pop's read-then-append, Ack's check-then-append, the revive loop),
so two consumers never get the same message: the second Pop reads after the first's checkpoint
moved the offset. An empty Pop with ``poll_time_ms`` waits on the pull hold service for an
arrival on any of its queues (the same wake-on-dispatch path as long-polling pulls), then
tries again until the time is up.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any, TypeAlias

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.aio import wait_event
from rocketq.validation import (
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TOPIC_NAME_MAX_CHARS,
    check_group,
    check_topic,
    is_readable,
    is_system_topic,
)
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.filter import parse_subscription, record_filter_of, tags_filter_of
from services.broker.ha_tracker import HaWaiter, leadership_lost_error, sync_master_wait
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.pop import fifo as fifo_scan
from services.broker.pop.dead_letter import copy_message, pop_retry_topic
from services.broker.pop.state import (
    REPLAY_GROUP,
    REVIVE_QUEUE_ID,
    Checkpoint,
    PopState,
    encode,
    handle_of,
    new_checkpoint_id,
    parse_handle,
    revive_topic,
)
from services.broker.pull_hold import PullHoldService
from services.broker.query_processor import record_to_pb
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, denied, exhausted, invalid, not_found, unavailable
from services.store.commitlog import MessageToStore
from services.store.consume_queue import CQ_UNIT, PRE_BLANK_SIZE
from services.store.message_store import (
    GetStatus,
    MessageStore,
    PutResult,
    StoreClosedError,
    StoreFullError,
)
from services.store.types import QueueOffset

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any] | None"

POP_BATCH_MAX = 32
INVISIBLE_MIN_MS = 1_000
INVISIBLE_MAX_MS = 12 * 3600 * 1000
POLL_MAX_MS = 60_000
CHECKPOINTS_MAX = 100_000
"""Checkpoints in flight on one broker (each ~300 bytes); beyond, Pop answers FLOW_CONTROL."""
HELD_QUEUES_MAX = 64
"""An empty long-polling Pop waits on at most this many of its queues."""
RETRY_FIRST_PERCENT = 20
"""How often a Pop reads the retry topic before the topic (else after), as RocketMQ does, so
neither starves the other."""
DEADLINE_MARGIN_MS = 50
CATCH_UP_BATCH = 256


class PopProcessor:
    """Pop / Ack / ChangeInvisibleTime and the state the revive loop works on."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        hold: PullHoldService,
        clock: Clock = SYSTEM_CLOCK,
        ha_waiter: Callable[[], HaWaiter | None] = lambda: None,
    ) -> None:
        self.config = config
        self.ha_waiter = ha_waiter
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.hold = hold
        self.clock = clock
        self.state = PopState()
        self.lock = asyncio.Lock()
        self.log_topic = revive_topic(config.cluster_name)
        self._fifo_released: dict[str, asyncio.Event] = {}
        """FIFO group → set when one of its messages is acked (a waiting Pop may go on);
        one per group with a Pop waiting at most."""

    # -- the revive log --------------------------------------------------------------------
    def catch_up(self) -> None:
        """Apply the revive log's records not applied yet (a replay on first use).

        Read straight from the consume queue and the commitlog, not through ``get_messages``:
        that stops at the replication confirm offset, and this broker's own decisions (a
        checkpoint just written, an ack) must count at once, replicated or not yet."""
        state, topic = self.state, self.log_topic
        if state.applied_upto < 0:
            start = self.offsets.query(REPLAY_GROUP, topic, REVIVE_QUEUE_ID)
            state.applied_upto = max(start, int(self.store.min_offset(topic, REVIVE_QUEUE_ID)))
        cq = self.store.queues.find(topic, REVIVE_QUEUE_ID)
        if cq is None:
            return
        state.applied_upto = max(state.applied_upto, int(cq.min_offset))
        end = int(cq.max_offset)
        while state.applied_upto < end:
            units = cq.units_from(QueueOffset(state.applied_upto), CATCH_UP_BATCH)
            if not units:
                return  # a unit file not readable yet; the next call goes on
            for phys, size, _tags in CQ_UNIT.iter_unpack(units):
                data = self.store.commitlog.read(phys, size) if size != PRE_BLANK_SIZE else None
                if data is not None:
                    body = codec.decode_record(data, check_crc=False).body
                    state.apply(body, state.applied_upto)
                state.applied_upto += 1

    async def append(self, records: list[dict[str, Any]]) -> None:
        """Store revive-log records (one atomic batch) and apply them."""
        if self.topics.get(self.log_topic) is None:
            self.topics.create_system_topic(self.log_topic, 1, PERM_READ | PERM_WRITE)
        now = self.clock.now_ms()
        await self.put(
            [
                MessageToStore(
                    topic=self.log_topic,
                    queue_id=REVIVE_QUEUE_ID,
                    body=encode(r),
                    properties=b"",
                    born_timestamp_ms=now,
                    born_host=self.store.config.store_host,
                )
                for r in records
            ]
        )
        self.catch_up()
        self.offsets.commit(
            REPLAY_GROUP, self.log_topic, REVIVE_QUEUE_ID, self.state.replay_start()
        )

    async def put(self, messages: list[MessageToStore]) -> PutResult:
        """Store refusals become the statuses messaging.proto names. On a SYNC_MASTER, waits
        for an in-sync slave to hold the records, as a Send does: an ack or checkpoint only the
        master held would be lost with it (a redelivery, or a message popped twice)."""
        try:
            result = await self.store.put(messages)
        except StoreFullError as exc:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL, str(exc)
            ) from None
        except StoreClosedError as exc:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, common_pb2.SERVICE_NOT_AVAILABLE, str(exc)
            ) from None
        last = result.results[-1]
        status = await sync_master_wait(
            self.ha_waiter(), self.config, last.physical_offset + last.size_bytes
        )
        if status is not None and not self.config.is_master:
            raise leadership_lost_error()
        return result

    def read(self, topic: str, queue_id: int, offset: int) -> codec.Record | None:
        """The message at a queue offset, or None once retention removed it."""
        got = self.store.get_messages(topic, queue_id, offset, 1)
        if got.status is not GetStatus.FOUND or got.queue_offsets[0] != offset:
            return None
        return codec.decode_record(got.records[0], check_crc=False)

    # -- Pop -------------------------------------------------------------------------------
    async def pop(
        self, req: messaging_pb2.PopRequest, context: Context
    ) -> messaging_pb2.PopResponse:
        self._check_master()
        max_nums = _check_pop(req)
        group_cfg = self._group(req.consumer_group)
        sources = self._sources(req, group_cfg)
        sub = parse_subscription(req.topic, req.expression or "*", req.expression_type)
        prop_on = self.config.enable_property_filter
        tags_filter = tags_filter_of(sub, enable_property_filter=prop_on)
        record_filter = record_filter_of(sub, enable_property_filter=prop_on)
        poll_ms = req.poll_time_ms
        remaining_s = context.time_remaining() if context is not None else None
        if remaining_s is not None:
            poll_ms = min(poll_ms, int(remaining_s * 1000) - DEADLINE_MARGIN_MS)
        deadline_s = self.clock.monotonic_s() + poll_ms / 1000
        fifo = self._fifo(req.consumer_group)
        while True:
            holds: dict[tuple[str, int], int] = {}
            async with self.lock:
                out = await self._pop_once(
                    req, max_nums, sources, tags_filter, record_filter, fifo, holds
                )
            left_ms = int((deadline_s - self.clock.monotonic_s()) * 1000)
            if out.messages or left_ms <= 0:
                return out
            waits = [
                self.hold.hold(
                    t,
                    q,
                    holds.get((t, q), -1) if fifo else self._offset(req.consumer_group, t, q),
                    tags_filter,
                    left_ms,
                    record_filter=record_filter,
                )
                for t, q in sources[:HELD_QUEUES_MAX]
            ]
            if fifo:  # an ack, or the end of an invisible time, may free a message group
                waits.append(self._fifo_released_wait(req.consumer_group, left_ms))
            await _first_of(waits)

    def _sources(
        self, req: messaging_pb2.PopRequest, group_cfg: SubscriptionGroupConfig
    ) -> list[tuple[str, int]]:
        """(topic, queue) pairs to read: the asked queues, and the pop retry topic's, in the
        order this Pop tries them."""
        topic_cfg = self._topic(req.topic)
        if req.HasField("queue_id"):
            if not 0 <= req.queue_id < topic_cfg.read_queue_nums:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"queue id {req.queue_id} is outside [0, {topic_cfg.read_queue_nums}) for "
                    f"topic {req.topic}",
                    topic=req.topic,
                )
            own = [(req.topic, req.queue_id)]
        else:
            own = [(req.topic, q) for q in range(topic_cfg.read_queue_nums)]
            random.shuffle(own)  # spreading, not security
        # Created with the first Pop, not the first redelivery, so an empty Pop's long poll
        # also waits on it and is woken by the first revived message.
        retry_name = pop_retry_topic(req.consumer_group, req.topic)
        retry_cfg = self.topics.get(retry_name) or self.topics.create_system_topic(
            retry_name, max(group_cfg.retry_queue_nums, 1), PERM_READ | PERM_WRITE
        )
        retry = [(retry_name, q) for q in range(retry_cfg.read_queue_nums)]
        if random.randrange(100) < RETRY_FIRST_PERCENT:
            return retry + own
        return own + retry

    async def _pop_once(
        self,
        req: messaging_pb2.PopRequest,
        max_nums: int,
        sources: list[tuple[str, int]],
        tags_filter: Any,
        record_filter: Any,
        fifo: bool,
        holds: dict[tuple[str, int], int],
    ) -> messaging_pb2.PopResponse:
        """One read of every source; ``holds`` gets where a long poll of each FIFO queue
        waits."""
        self.catch_up()
        if len(self.state.cks) >= CHECKPOINTS_MAX:
            exhausted(
                common_pb2.FLOW_CONTROL,
                f"{len(self.state.cks)} pops are in flight on broker {self.config.broker_name} "
                f"(limit {CHECKPOINTS_MAX}); ack messages or retry later",
            )
        group = req.consumer_group
        now_ms = self.clock.now_ms()
        until_ms = now_ms + req.invisible_time_ms
        records: list[dict[str, Any]] = []
        taken: list[tuple[str, codec.Record, int]] = []
        for topic, qid in sources:
            if len(taken) >= max_nums:
                break
            if fifo:
                holds[(topic, qid)] = await self._pop_fifo(
                    req, topic, qid, max_nums - len(taken), until_ms, (tags_filter, record_filter),
                    records, taken,
                )  # fmt: skip
                continue
            offset = self._offset(group, topic, qid)
            got = self.store.get_messages(
                topic, qid, offset, max_nums - len(taken),
                tags_filter=tags_filter, record_filter=record_filter,
            )  # fmt: skip
            if got.status is not GetStatus.FOUND:
                if got.next_begin_offset != offset and got.status in _MOVABLE:
                    self.offsets.commit(group, topic, qid, got.next_begin_offset)
                continue
            ck_id = new_checkpoint_id()
            record: dict[str, Any] = {
                "t": "ck", "id": ck_id, "g": group, "at": req.topic, "rt": topic, "q": qid,
                "o": got.queue_offsets, "n": got.next_begin_offset, "u": until_ms,
            }  # fmt: skip
            records.append(record)
            self.offsets.commit(group, topic, qid, got.next_begin_offset, increase_only=True)
            taken.extend((ck_id, codec.decode_record(r, check_crc=False), 0) for r in got.records)
        if not records:
            return messaging_pb2.PopResponse()
        await self.append(records)
        broker = self.config.broker_name
        response = messaging_pb2.PopResponse()
        for ck_id, rec, earlier in taken:
            stored = record_to_pb(rec)
            stored.message.topic = req.topic
            response.messages.append(
                messaging_pb2.PoppedMessage(
                    message=stored,
                    receipt_handle=handle_of(broker, ck_id, rec.queue_offset),
                    delivery_attempt=rec.reconsume_times + 1 + earlier,
                    invisible_until_ms=until_ms,
                )
            )
        return response

    def _fifo(self, group: str) -> bool:
        group_cfg = self.groups.get(group)
        return group_cfg is not None and group_cfg.consume_message_orderly

    async def _pop_fifo(
        self,
        req: messaging_pb2.PopRequest,
        topic: str,
        qid: int,
        want: int,
        until_ms: int,
        filters: tuple[Any, Any],
        records: list[dict[str, Any]],
        taken: list[tuple[str, codec.Record, int]],
    ) -> int:
        """One queue of a FIFO group (pop/fifo.py): a checkpoint for what it hands out, acks
        for what went to the DLQ; where a long poll of the queue waits."""
        group = req.consumer_group
        group_cfg = self.groups.get(group)
        start = self._offset(group, topic, qid)
        take = await fifo_scan.scan(
            self, group=group, asked_topic=req.topic, topic=topic, queue_id=qid, start=start,
            want=want, now_ms=self.clock.now_ms(),
            max_times=group_cfg.retry_max_times if group_cfg is not None else -1,
            tags_filter=filters[0], record_filter=filters[1],
        )  # fmt: skip
        records.extend({"t": "ack", "id": ck_id, "o": o} for ck_id, o in take.dead)
        if take.frontier > start:
            self.offsets.commit(group, topic, qid, take.frontier, increase_only=True)
        if not take.picked:
            return take.hold_offset
        ck_id = new_checkpoint_id()
        attempts = [a for _r, a in take.picked]
        records.append(
            {
                "t": "ck", "id": ck_id, "g": group, "at": req.topic, "rt": topic, "q": qid,
                "o": [r.queue_offset for r, _a in take.picked], "n": take.frontier,
                "u": until_ms,
                **self._fifo_fields(group, topic, qid, take.frontier, [o for _c, o in take.dead]),
                "a": attempts[0] if len(set(attempts)) == 1 else attempts,
            }
        )  # fmt: skip
        taken.extend((ck_id, rec, attempt - 1) for rec, attempt in take.picked)
        return take.hold_offset

    def _fifo_fields(
        self, group: str, topic: str, qid: int, frontier: int, also_done: list[int]
    ) -> dict[str, Any]:
        """What a FIFO checkpoint carries besides the common fields (state.py's table)."""
        done = set(self.state.fifo_queue(group, topic, qid).done_above(frontier))
        done.update(o - frontier for o in also_done if o >= frontier)
        return {"f": True, "d": sorted(done)}

    async def _fifo_released_wait(self, group: str, left_ms: int) -> bool:
        """Until a message of FIFO ``group`` is acked or one of its invisible times ends."""
        now_ms = self.clock.now_ms()
        expiry = self.state.fifo_next_expiry_ms(group, now_ms)
        wait_ms = left_ms if expiry is None else min(left_ms, expiry - now_ms + 1)
        event = self._fifo_released.setdefault(group, asyncio.Event())
        return await wait_event(event, max(wait_ms, 1) / 1000)

    def _fifo_wake(self, ck: Checkpoint) -> None:
        if ck.fifo and (event := self._fifo_released.pop(ck.group, None)) is not None:
            event.set()

    def _offset(self, group: str, topic: str, queue_id: int) -> int:
        """The queue offset this group pops next (see the module docstring)."""
        offset = max(
            self.state.pop_offset(group, topic, queue_id),
            self.offsets.query(group, topic, queue_id),
        )
        if offset >= 0:
            return offset
        low = int(self.store.min_offset(topic, queue_id))
        if low == 0 or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            offset = low
        else:
            offset = int(self.store.max_offset(topic, queue_id))
        self.offsets.commit(group, topic, queue_id, offset)
        return offset

    # -- Ack, ChangeInvisibleTime ----------------------------------------------------------
    async def ack(self, req: messaging_pb2.AckRequest) -> messaging_pb2.AckResponse:
        self._check_master()
        _names(req.consumer_group, req.topic)
        ck_id, offset = parse_handle(req.receipt_handle, self.config.broker_name)
        async with self.lock:
            ck = self._in_flight(req.consumer_group, req.topic, req.receipt_handle, ck_id, offset)
            await self.append([{"t": "ack", "id": ck_id, "o": offset}])
        self._fifo_wake(ck)
        return messaging_pb2.AckResponse()

    async def change_invisible_time(
        self, req: messaging_pb2.ChangeInvisibleTimeRequest
    ) -> messaging_pb2.ChangeInvisibleTimeResponse:
        self._check_master()
        _names(req.consumer_group, req.topic)
        _check_invisible(req.invisible_time_ms)
        ck_id, offset = parse_handle(req.receipt_handle, self.config.broker_name)
        async with self.lock:
            ck = self._in_flight(req.consumer_group, req.topic, req.receipt_handle, ck_id, offset)
            new_id = new_checkpoint_id()
            until_ms = self.clock.now_ms() + req.invisible_time_ms
            # The new checkpoint and the old offset's ack in one atomic batch: the message is
            # in flight under exactly one of them whatever happens.
            await self.append(
                [
                    {
                        "t": "ck", "id": new_id, "g": ck.group, "at": ck.asked_topic,
                        "rt": ck.read_topic, "q": ck.queue_id, "o": [offset], "n": offset + 1,
                        "u": until_ms, **(self._fifo_change(ck, offset) if ck.fifo else {}),
                    },
                    {"t": "ack", "id": ck_id, "o": offset},
                ]
            )  # fmt: skip
        return messaging_pb2.ChangeInvisibleTimeResponse(
            receipt_handle=handle_of(self.config.broker_name, new_id, offset),
            invisible_until_ms=until_ms,
        )

    async def dead_letter(self, group: str, topic: str, handle: str, delivery_attempt: int) -> None:
        """Move one popped message to %DLQ%{group} now and ack it (a FIFO push consumer whose
        local retries are used up forwards it so; the gateway's ForwardMessageToDeadLetterQueue).
        Errors as Ack."""
        self._check_master()
        _names(group, topic)
        ck_id, offset = parse_handle(handle, self.config.broker_name)
        async with self.lock:
            ck = self._in_flight(group, topic, handle, ck_id, offset)
            record = self.read(ck.read_topic, ck.queue_id, offset)
            if record is not None:
                await copy_message(
                    self, group, ck.asked_topic, record,
                    reconsume_times=max(delivery_attempt, record.reconsume_times + 1),
                    to_dlq=True,
                )  # fmt: skip
            await self.append([{"t": "ack", "id": ck_id, "o": offset}])
        self._fifo_wake(ck)

    def _fifo_change(self, ck: Checkpoint, offset: int) -> dict[str, Any]:
        """A FIFO message's new checkpoint keeps its attempt; ``n`` is the frontier."""
        frontier = self._offset(ck.group, ck.read_topic, ck.queue_id)
        fields = self._fifo_fields(ck.group, ck.read_topic, ck.queue_id, frontier, [])
        return {**fields, "n": frontier, "a": ck.attempt_of(offset)}

    def _in_flight(
        self, group: str, topic: str, handle: str, ck_id: str, offset: int
    ) -> Checkpoint:
        self.catch_up()
        ck = self.state.in_flight(ck_id, offset)
        shown = handle[:80]
        if ck is None:
            invalid(
                common_pb2.INVALID_RECEIPT_HANDLE,
                f"receipt handle {shown!r} is stale or unknown: the message was already acked, "
                "its invisible time was changed (use the newest handle), it was delivered again "
                "after its invisible time, or this broker never issued it",
                consumer_group=group,
            )
        if ck.group != group or ck.asked_topic != topic:
            invalid(
                common_pb2.INVALID_RECEIPT_HANDLE,
                f"receipt handle {shown!r} belongs to group {ck.group} on topic "
                f"{ck.asked_topic}, not group {group} on topic {topic}",
                consumer_group=group,
            )
        return ck

    # -- checks ----------------------------------------------------------------------------
    def _check_master(self) -> None:
        cfg = self.config
        if not cfg.is_master:
            unavailable(
                common_pb2.NOT_MASTER,
                f"broker {cfg.broker_name} id {cfg.broker_id} is a slave; pop and ack on its "
                "master",
                broker_name=cfg.broker_name,
            )

    def _group(self, group: str) -> SubscriptionGroupConfig:
        group_cfg = self.groups.find_or_create(group)
        if group_cfg is None:
            not_found(
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {group} does not exist and autoCreateSubscriptionGroup "
                "is false; create it with the admin tool",
                consumer_group=group,
            )
        if not group_cfg.consume_enable:
            denied(f"consumer group {group} may not consume (consume_enable false)")
        return group_cfg

    def _topic(self, topic: str) -> TopicConfig:
        topic_cfg = self.topics.get(topic)
        if topic_cfg is None:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"topic {topic} does not exist on broker {self.config.broker_name}",
                topic=topic,
            )
        if not is_readable(self.config.broker_permission) or not is_readable(topic_cfg.perm):
            denied(f"topic {topic} on broker {self.config.broker_name} is not readable")
        return topic_cfg


_MOVABLE = frozenset(
    {
        GetStatus.NO_MATCHED_MESSAGE,
        GetStatus.MESSAGE_WAS_REMOVING,
        GetStatus.OFFSET_FOUND_NULL,
        GetStatus.OFFSET_TOO_SMALL,
        GetStatus.OFFSET_OVERFLOW_BADLY,
    }
)
"""Statuses whose next_begin_offset corrects or advances the pop offset."""


async def _first_of(waits: list[Any]) -> None:
    """Wait for the first held queue to wake; cancel the rest (their errors are re-raised)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _names(group: str, topic: str) -> None:
    try:
        check_group(group)
        check_topic(topic)
    except ValueError as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
    if is_system_topic(topic):
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"topic {topic} is a system topic; pop a user topic")
    if len(pop_retry_topic(group, topic)) > TOPIC_NAME_MAX_CHARS:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"group {group} with topic {topic} is too long for the pop retry topic "
            f"{pop_retry_topic(group, topic)!r} (at most {TOPIC_NAME_MAX_CHARS} characters)",
        )


def _check_invisible(ms: int) -> None:
    if not INVISIBLE_MIN_MS <= ms <= INVISIBLE_MAX_MS:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"invisible_time_ms {ms} is outside {INVISIBLE_MIN_MS}..{INVISIBLE_MAX_MS} "
            "(1 s to 12 h)",
        )


def _check_pop(req: messaging_pb2.PopRequest) -> int:
    _names(req.consumer_group, req.topic)
    _check_invisible(req.invisible_time_ms)
    if not 0 <= req.poll_time_ms <= POLL_MAX_MS:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"poll_time_ms {req.poll_time_ms} is outside 0..{POLL_MAX_MS} (0 to 60 s)",
        )
    max_nums = req.max_msg_nums if req.HasField("max_msg_nums") else POP_BATCH_MAX
    if not 1 <= max_nums <= POP_BATCH_MAX:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT, f"max_msg_nums {max_nums} is outside 1..{POP_BATCH_MAX}"
        )
    return max_nums
