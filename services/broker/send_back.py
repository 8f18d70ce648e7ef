"""ConsumerSendBack: a consumer returns a message it failed to process (SPEC §6.14, §6.16).

The consumer sends only the message's commitlog offset; the broker already holds the record.
The broker reads it and re-puts a copy, with one more reconsume time, to one of two places:

| condition                                                  | goes to                           |
|------------------------------------------------------------|-----------------------------------|
| ``delay_level < 0``, or the record's reconsume times + 1   | ``%DLQ%{group}`` (dead letters),  |
| exceed the max (the request's ``max_reconsume_times``,     | created on first use with 1 queue |
| else the group's ``retryMaxTimes``, 16; -1 = unlimited)    | and perm 2 (write only: no        |
|                                                            | consumer ever reads it)           |
| otherwise                                                  | ``%RETRY%{group}`` after a delay  |
|                                                            | (level 0 = 3 + reconsume times)   |

The retry path goes through the timer topic exactly like a delayed send
(services.broker.timer_put): the delay level is the request's, else 3 + the times the message
was already reconsumed, capped at the last of ``messageDelayLevel`` (so beyond 16 retries every
retry waits 2 h); the copy is stored in ``rmq_sys_wheel_timer`` with ``REAL_TOPIC`` =
``%RETRY%{group}`` (created on first use with the group's ``retryQueueNums`` queues, perm 6),
``REAL_QID`` = a random queue of it and ``TIMER_OUT_MS`` = now + the level's delay; the
timer-wheel re-puts it there when due. The checks, the record lookup and the copy's properties
are shared by both paths.

The copy keeps body (still compressed if it was), flag, tags, keys, born time and host, and
every property — user properties and whatever RocketMQ's properties the record carried, such
as REAL_TOPIC / REAL_QID from an earlier delayed hop — except the delay properties and
TIMER_SOURCE (the copy is not delayed, or taken for a re-put, by accident), and adds, when
absent:

* ``RETRY_TOPIC``: the topic the message was first sent to (a record read from
  ``%RETRY%{group}`` already carries it; else the record's topic, or the request's
  ``origin_topic`` for a retry record without it);
* ``ORIGIN_MESSAGE_ID``: the first delivery's unique id (its UNIQ_KEY), so every hop of one
  message shares it.

The copy keeps the original UNIQ_KEY too, so ``QueryMessageById`` / ``QueryMessageByKey`` on
the DLQ topic find the dead letter by the id and keys the producer saw.

Checks, in RocketMQ's order: this broker is a master (UNAVAILABLE NOT_MASTER); group name and
offset (INVALID_ARGUMENT); broker writable (PERMISSION_DENIED); the group exists or is
auto-created (NOT_FOUND SUBSCRIPTION_GROUP_NOT_EXIST); a group with ``retryQueueNums`` <= 0
gets no retry at all, as in RocketMQ (acknowledged, nothing stored); a consumable record at the
offset (NOT_FOUND MESSAGE_NOT_FOUND). Unlike RocketMQ, which answers before the flush
(``waitStoreMsgOK=false``), a SYNC_FLUSH broker waits for the fsync before acknowledging: the
consumer moves its offset past the message once this call succeeds; for the same reason a
SYNC_MASTER waits for an in-sync slave to hold the copy, as for a Send (DESIGN.md §6).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.validation import (
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TIMER_TOPIC,
    TOPIC_NAME_MAX_CHARS,
    check_group,
    dlq_topic,
    is_system_topic,
    is_writeable,
    retry_topic,
)
from services.broker.config import BrokerConfig
from services.broker.ha_tracker import HaWaiter, leadership_lost_error, sync_master_wait
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.timer_put import (
    DELAY_PROPERTIES,
    ensure_timer_topic,
    retry_level,
    timer_properties,
    timer_queue_id,
)
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, denied, invalid, not_found
from services.common.telemetry import messaging as telemetry
from services.store.commitlog import MessageToStore
from services.store.message_store import MessageStore, PutStatus, StoreClosedError, StoreFullError

log = logging.getLogger(__name__)

DLQ_QUEUE_NUMS = 1
"""Queues of a new ``%DLQ%{group}`` topic (RocketMQ's DLQ_NUMS_PER_GROUP)."""
DLQ_PERM = PERM_WRITE
"""Write only: dead letters are for people to inspect (by key or id), not for consumers."""

RETRY_PERM = PERM_READ | PERM_WRITE
"""A ``%RETRY%{group}`` topic: written by the timer-wheel's re-puts, read by the group."""

_DROPPED_PROPERTIES = (*DELAY_PROPERTIES, Prop.TIMER_SOURCE)
_KEPT_SYS_FLAGS = SysFlag.COMPRESSED | SysFlag.MULTI_TAGS
_NOT_CONSUMABLE = (SysFlag.TRANSACTION_PREPARED, SysFlag.TRANSACTION_ROLLBACK)


def max_reconsume_times(
    request: messaging_pb2.ConsumerSendBackRequest, group: SubscriptionGroupConfig
) -> int:
    """Redeliveries allowed before the DLQ: the request's, else the group's; < 0 = unlimited."""
    if request.HasField("max_reconsume_times"):
        return request.max_reconsume_times
    return group.retry_max_times


def goes_to_dlq(delay_level: int, reconsume_times: int, max_times: int) -> bool:
    """Whether a copy with ``reconsume_times`` (the record's + 1) is a dead letter."""
    return delay_level < 0 or 0 <= max_times < reconsume_times


def original_topic(record: codec.Record, origin_topic_hint: str) -> str:
    """The topic a message was first sent to (RETRY_TOPIC's value on the copy)."""
    kept = record.properties.get(Prop.RETRY_TOPIC)
    if kept:
        return kept
    if (
        record.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        and origin_topic_hint
        and not is_system_topic(origin_topic_hint)
    ):
        return origin_topic_hint
    return record.topic


def resend_properties(
    record: codec.Record, *, origin_msg_id_hint: str, origin_topic_hint: str
) -> dict[str, str]:
    """The copy's properties: the record's, minus delays, plus RETRY_TOPIC and
    ORIGIN_MESSAGE_ID when absent (see the module docstring)."""
    props = dict(record.properties)
    for name in _DROPPED_PROPERTIES:
        props.pop(name, None)
    if not props.get(Prop.RETRY_TOPIC):
        props[Prop.RETRY_TOPIC] = original_topic(record, origin_topic_hint)
    if not props.get(Prop.ORIGIN_MESSAGE_ID):
        props[Prop.ORIGIN_MESSAGE_ID] = (
            record.uniq_key or origin_msg_id_hint or record.offset_msg_id
        )
    return props


def resend_message(
    record: codec.Record,
    *,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    reconsume_times: int,
) -> MessageToStore:
    """A copy of ``record`` for ``topic``/``queue_id``; raises ServiceError if the grown
    properties no longer fit a record."""
    try:
        encoded = codec.encode_properties(properties)
    except ValueError as exc:  # stored properties never hold separators; defensive
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"cannot copy the message: {exc}")
    if len(encoded) > codec.PROPERTIES_MAX_BYTES:
        invalid(
            common_pb2.MESSAGE_TOO_LARGE,
            f"the message's properties would take {len(encoded)} bytes with the retry "
            f"properties added; the limit is {codec.PROPERTIES_MAX_BYTES}",
            topic=record.topic,
        )
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=record.body,
        properties=encoded,
        tags_code=codec.tags_hash(properties.get(Prop.TAGS, "")),
        keys=properties.get(Prop.KEYS, ""),
        uniq_key=properties.get(Prop.UNIQ_KEY, ""),
        flag=record.flag,
        sys_flag=record.sys_flag & _KEPT_SYS_FLAGS,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
        reconsume_times=reconsume_times,
    )


class SendBackProcessor:
    """Answers ConsumerSendBack (one per broker)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        clock: Clock = SYSTEM_CLOCK,
        ha_waiter: Callable[[], HaWaiter | None] = lambda: None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.clock = clock
        self.ha_waiter = ha_waiter
        """The master's replication waiter (None on a slave or without replication)."""
        self._levels_ms = config.delay_levels_ms()

    async def send_back(
        self, request: messaging_pb2.ConsumerSendBackRequest
    ) -> messaging_pb2.ConsumerSendBackResponse:
        """Check, look up and re-put one failed message; raises ServiceError when refused."""
        group_cfg = self._check(request)
        group = request.consumer_group
        if group_cfg.retry_queue_nums <= 0:
            log.info(
                "group %s has retryQueueNums %d: message at commitlog offset %d is not "
                "retried (acknowledged, nothing stored)",
                group,
                group_cfg.retry_queue_nums,
                request.commitlog_offset,
            )
            return messaging_pb2.ConsumerSendBackResponse()
        record = self._record(request.commitlog_offset)
        reconsume_times = record.reconsume_times + 1
        props = resend_properties(
            record,
            origin_msg_id_hint=request.origin_msg_id,
            origin_topic_hint=request.origin_topic,
        )
        dlq = goes_to_dlq(
            request.delay_level, reconsume_times, max_reconsume_times(request, group_cfg)
        )
        with telemetry.send_back(dlq, group, props):  # a span in the message's trace
            if dlq:
                await self._dead_letter(group, record, props, reconsume_times)
            else:
                await self._redeliver(
                    group_cfg, request.delay_level, record, props, reconsume_times
                )
        return messaging_pb2.ConsumerSendBackResponse()

    # -- checks ----------------------------------------------------------------------------
    def _check(self, request: messaging_pb2.ConsumerSendBackRequest) -> SubscriptionGroupConfig:
        cfg = self.config
        if not cfg.is_master:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.NOT_MASTER,
                f"broker {cfg.broker_name} id {cfg.broker_id} is a slave; send back to its master",
            )
        try:
            check_group(request.consumer_group)
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
        if request.commitlog_offset < 0:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"commitlog offset {request.commitlog_offset} is negative",
            )
        if not is_writeable(cfg.broker_permission):
            denied(
                f"broker {cfg.broker_name} is not writable (brokerPermission "
                f"{cfg.broker_permission})"
            )
        group_cfg = self.groups.find_or_create(request.consumer_group)
        if group_cfg is None:
            not_found(
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {request.consumer_group} does not exist on broker "
                f"{cfg.broker_name} and autoCreateSubscriptionGroup is false; create it with "
                "the admin tool",
                consumer_group=request.consumer_group,
            )
        return group_cfg

    def _record(self, offset: int) -> codec.Record:
        """The consumable record starting at ``offset``, or NOT_FOUND MESSAGE_NOT_FOUND."""
        try:
            record = self.store.read_record(offset)
        except codec.CorruptRecord:
            record = None  # an offset inside a record, not at its start
        if record is None or record.sys_flag & SysFlag.TRANSACTION_MASK in _NOT_CONSUMABLE:
            not_found(
                common_pb2.MESSAGE_NOT_FOUND,
                f"no message at commitlog offset {offset} on broker {self.config.broker_name} "
                "(never stored here, or removed by retention)",
            )
        return record

    # -- the two destinations --------------------------------------------------------------
    async def _dead_letter(
        self, group: str, record: codec.Record, props: dict[str, str], reconsume_times: int
    ) -> None:
        topic_cfg = self._dlq_topic(group)
        queue_id = random.randrange(topic_cfg.write_queue_nums)  # spreading, not security
        message = resend_message(
            record,
            topic=topic_cfg.topic_name,
            queue_id=queue_id,
            properties=props,
            reconsume_times=reconsume_times,
        )
        await self._put(message)
        log.info(
            "group %s: message %s (from %s, reconsumed %d times) moved to %s",
            group,
            props[Prop.ORIGIN_MESSAGE_ID],
            props[Prop.RETRY_TOPIC],
            record.reconsume_times,
            topic_cfg.topic_name,
        )

    async def _redeliver(
        self,
        group_cfg: SubscriptionGroupConfig,
        delay_level: int,
        record: codec.Record,
        props: dict[str, str],
        reconsume_times: int,
    ) -> None:
        """Put the copy into the timer topic, due to go to %RETRY%{group} after the delay of
        ``delay_level`` (0 = 3 + the record's reconsume times, capped at the last level)."""
        group = group_cfg.group_name
        retry_cfg = self._retry_topic(group, group_cfg.retry_queue_nums)
        real_qid = random.randrange(retry_cfg.write_queue_nums)  # spreading, not security
        levels_ms = self._levels_ms
        level = retry_level(delay_level, record.reconsume_times, len(levels_ms))
        out_ms = self.clock.now_ms() + levels_ms[level - 1]
        timer_cfg = ensure_timer_topic(self.topics, self.config)
        if not is_writeable(timer_cfg.perm) or timer_cfg.write_queue_nums < 1:
            denied(
                f"timer topic {TIMER_TOPIC} is not writable (perm {timer_cfg.perm}); retries "
                "cannot be scheduled",
                topic=TIMER_TOPIC,
            )
        timer_props = timer_properties(
            props, real_topic=retry_cfg.topic_name, real_qid=real_qid, out_ms=out_ms
        )
        handle = timer_props.get(Prop.UNIQ_KEY) or props[Prop.ORIGIN_MESSAGE_ID]
        message = resend_message(
            record,
            topic=TIMER_TOPIC,
            queue_id=timer_queue_id(handle, timer_cfg.write_queue_nums),
            properties=timer_props,
            reconsume_times=reconsume_times,
        )
        await self._put(message)
        log.debug(
            "group %s: message %s retry %d at level %d, due at %d in %s",
            group,
            props[Prop.ORIGIN_MESSAGE_ID],
            reconsume_times,
            level,
            out_ms,
            retry_cfg.topic_name,
        )

    def _retry_topic(self, group: str, queue_nums: int) -> TopicConfig:
        """``%RETRY%{group}``, created on first use; PERMISSION_DENIED if made unwritable."""
        name = retry_topic(group)
        if len(name) > TOPIC_NAME_MAX_CHARS:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"group {group} is too long for a retry topic ({name!r} would exceed "
                f"{TOPIC_NAME_MAX_CHARS} characters)",
                consumer_group=group,
            )
        topic_cfg = self.topics.get(name)
        if topic_cfg is None:
            topic_cfg = self.topics.create_system_topic(name, queue_nums, RETRY_PERM)
            log.info("created retry topic %s with %d queues", name, queue_nums)
        if not is_writeable(topic_cfg.perm) or topic_cfg.write_queue_nums < 1:
            denied(
                f"retry topic {name} is not writable (perm {topic_cfg.perm}, "
                f"{topic_cfg.write_queue_nums} write queues)",
                topic=name,
            )
        return topic_cfg

    def _dlq_topic(self, group: str) -> TopicConfig:
        """``%DLQ%{group}``, created on first use; PERMISSION_DENIED if made unwritable."""
        name = dlq_topic(group)
        if len(name) > TOPIC_NAME_MAX_CHARS:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"group {group} is too long for a dead-letter topic ({name!r} would exceed "
                f"{TOPIC_NAME_MAX_CHARS} characters)",
                consumer_group=group,
            )
        topic_cfg = self.topics.get(name)
        if topic_cfg is None:
            topic_cfg = self.topics.create_system_topic(name, DLQ_QUEUE_NUMS, DLQ_PERM)
            log.info("created dead-letter topic %s (write only)", name)
        if not is_writeable(topic_cfg.perm) or topic_cfg.write_queue_nums < 1:
            denied(
                f"dead-letter topic {name} is not writable (perm {topic_cfg.perm}, "
                f"{topic_cfg.write_queue_nums} write queues)",
                topic=name,
            )
        return topic_cfg

    async def _put(self, message: MessageToStore) -> None:
        """Store ``message``; store refusals become the statuses messaging.proto names."""
        try:
            result = await self.store.put([message])
        except StoreFullError as exc:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL, str(exc)
            ) from None
        except StoreClosedError as exc:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, common_pb2.SERVICE_NOT_AVAILABLE, str(exc)
            ) from None
        stored = result.results[0]
        if result.status is not PutStatus.PUT_OK:
            # Stored, but the fsync was late: the copy survives anything but a power loss.
            log.warning(
                "send-back to %s stored at %d but the flush timed out",
                message.topic,
                stored.physical_offset,
            )
        await self._replicated(message.topic, stored.physical_offset + stored.size_bytes)

    async def _replicated(self, topic: str, end_offset: int) -> None:
        """On a SYNC_MASTER, wait for an in-sync slave to hold the copy, as a Send does: the
        consumer moves its offset past the original once this call succeeds, so a copy only
        the master held would be lost with it. A replication timeout is logged (the copy is
        stored); leadership lost during the wait is NOT_MASTER, so the consumer sends it back
        again to the new master (a duplicate retry rather than a lost one)."""
        status = await sync_master_wait(self.ha_waiter(), self.config, end_offset)
        if status is None:
            return
        if not self.config.is_master:
            raise leadership_lost_error()
        if status != messaging_pb2.SEND_OK:
            log.warning(
                "send-back to %s stored, but not replicated (%s)",
                topic,
                messaging_pb2.SendStatus.Name(status),
            )
