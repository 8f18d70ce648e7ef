"""Admin access to a group's dead letters (SPEC §6.16): list them, resend one.

``%DLQ%{group}`` is write-only for consumers (perm 2), so people read it here, straight from
the store: queue 0 (the only one, ``DLQ_QUEUE_NUMS``), oldest first, each record as a
``StoredMessage`` with its queue offset and offset message id.

Resending re-puts one dead letter to the topic it was first sent to (its ``RETRY_TOPIC``) as a
new message on this broker: a new unique id, reconsume times 0, born now at this broker, the
same body, flag, tags, keys and user properties, ``ORIGIN_MESSAGE_ID`` kept (so every hop of
the message still shares it). Dropped: the delay properties and what belonged to its retry
history (``REAL_TOPIC`` / ``REAL_QID``, ``RETRY_TOPIC``, ``RECONSUME_TIME``,
``MAX_RECONSUME_TIMES``, ``TIMER_*``), so consumers of the topic see a fresh message. The dead
letter stays in the DLQ: resending twice sends twice.

A dead letter is found by its offset message id's commitlog offset; the host part is not
compared (a broker restarted on another port still finds its own records), but the record
there must belong to the group's DLQ.
"""

from __future__ import annotations

import logging
import random

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.message import new_unique_id
from rocketq.validation import check_group, dlq_topic, is_writeable
from services.broker.config import BrokerConfig
from services.broker.query_processor import record_to_pb
from services.broker.timer_put import DELAY_PROPERTIES
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, denied, invalid, not_found, unavailable
from services.store.commitlog import AppendResult, MessageToStore
from services.store.message_store import MessageStore, PutStatus, StoreClosedError, StoreFullError

log = logging.getLogger(__name__)

LIST_DEFAULT = 32
LIST_MAX = 256
"""Dead letters per ListDeadLetters answer (admin.proto: 1..256, default 32)."""
DLQ_QUEUE_ID = 0

_DROPPED_ON_RESEND = frozenset(
    {
        *DELAY_PROPERTIES,
        Prop.UNIQ_KEY,
        Prop.REAL_TOPIC,
        Prop.REAL_QUEUE_ID,
        Prop.RETRY_TOPIC,
        Prop.RECONSUME_TIME,
        Prop.MAX_RECONSUME_TIMES,
        Prop.MIN_OFFSET,
        Prop.MAX_OFFSET,
        Prop.TIMER_OUT_MS,
        Prop.TIMER_SOURCE,
        Prop.TIMER_DEL_UNIQKEY,
        Prop.TIMER_ENQUEUE_MS,
        Prop.TIMER_DEQUEUE_MS,
        Prop.TIMER_ROLL_TIMES,
    }
)
_KEPT_SYS_FLAGS = SysFlag.COMPRESSED | SysFlag.MULTI_TAGS


def resend_properties(record: codec.Record, uniq_key: str) -> dict[str, str]:
    """A resent dead letter's properties (see the module docstring)."""
    props = {k: v for k, v in record.properties.items() if k not in _DROPPED_ON_RESEND}
    props[Prop.UNIQ_KEY] = uniq_key
    if not props.get(Prop.ORIGIN_MESSAGE_ID):
        props[Prop.ORIGIN_MESSAGE_ID] = record.uniq_key or record.offset_msg_id
    return props


class DeadLetters:
    """ListDeadLetters / ResendDeadLetter of one broker (called by the Admin service)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.clock = clock

    def list(self, request: admin_pb2.ListDeadLettersRequest) -> admin_pb2.ListDeadLettersResponse:
        """One page of the group's dead letters; an unknown group or empty DLQ is empty."""
        _check_group(request.consumer_group)
        max_num = request.max_num if request.HasField("max_num") else LIST_DEFAULT
        if not 1 <= max_num <= LIST_MAX:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"max_num {max_num} is outside 1..{LIST_MAX}")
        if request.HasField("offset") and request.offset < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"offset {request.offset} is negative")
        topic = dlq_topic(request.consumer_group)
        if self.topics.get(topic) is None:
            return admin_pb2.ListDeadLettersResponse(next_offset=max(request.offset, 0))
        min_off = int(self.store.min_offset(topic, DLQ_QUEUE_ID))
        max_off = int(self.store.max_offset(topic, DLQ_QUEUE_ID))
        start = max(request.offset, min_off) if request.HasField("offset") else min_off
        response = admin_pb2.ListDeadLettersResponse(
            next_offset=min(start, max_off), total=max_off - min_off
        )
        if start >= max_off:
            return response
        got = self.store.get_messages(topic, DLQ_QUEUE_ID, start, max_num)
        for raw in got.records:
            response.messages.append(record_to_pb(codec.decode_record(raw)))
        response.next_offset = max(got.next_begin_offset, start)
        return response

    async def resend(
        self, request: admin_pb2.ResendDeadLetterRequest
    ) -> admin_pb2.ResendDeadLetterResponse:
        """Re-put one dead letter to its original topic as a new message."""
        cfg = self.config
        if not cfg.is_master:
            unavailable(
                common_pb2.NOT_MASTER,
                f"broker {cfg.broker_name} id {cfg.broker_id} is a slave; resend on its master",
                broker_name=cfg.broker_name,
            )
        group = request.consumer_group
        _check_group(group)
        record = self._dead_letter(group, request.offset_msg_id)
        target = record.properties.get(Prop.RETRY_TOPIC) or ""
        topic_cfg = self.topics.get(target) if target else None
        if topic_cfg is None:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"dead letter {request.offset_msg_id} came from topic {target or '(unknown)'}, "
                f"which does not exist on broker {cfg.broker_name}; create it first",
                topic=target,
            )
        if not is_writeable(cfg.broker_permission) or not is_writeable(topic_cfg.perm):
            denied(
                f"topic {target} on broker {cfg.broker_name} is not writable (topic perm "
                f"{topic_cfg.perm}, brokerPermission {cfg.broker_permission})",
                topic=target,
            )
        uniq = new_unique_id()
        props = resend_properties(record, uniq)
        queue_id = random.randrange(topic_cfg.write_queue_nums)  # spreading, not security
        message = MessageToStore(
            topic=target,
            queue_id=queue_id,
            body=record.body,
            properties=codec.encode_properties(props),
            tags_code=codec.tags_hash(props.get(Prop.TAGS, "")),
            keys=props.get(Prop.KEYS, ""),
            uniq_key=uniq,
            flag=record.flag,
            sys_flag=record.sys_flag & _KEPT_SYS_FLAGS,
            born_timestamp_ms=self.clock.now_ms(),
            born_host=self.store.config.store_host,
            reconsume_times=0,
        )
        result = await self._put(message)
        log.info(
            "group %s: dead letter %s (origin %s) resent to %s as %s",
            group,
            request.offset_msg_id,
            props[Prop.ORIGIN_MESSAGE_ID],
            target,
            uniq,
        )
        return admin_pb2.ResendDeadLetterResponse(
            topic=target, msg_id=uniq, queue_id=queue_id, queue_offset=result.queue_offset
        )

    def _dead_letter(self, group: str, offset_msg_id: str) -> codec.Record:
        try:
            _host, offset = codec.decode_offset_msg_id(offset_msg_id)
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
        topic = dlq_topic(group)
        try:
            record = self.store.read_record(offset) if offset >= 0 else None
        except codec.CorruptRecord:
            record = None  # an offset inside a record, not at its start
        if record is None or record.topic != topic:
            not_found(
                common_pb2.MESSAGE_NOT_FOUND,
                f"no dead letter {offset_msg_id} of group {group} on broker "
                f"{self.config.broker_name} (list them with ListDeadLetters)",
                consumer_group=group,
            )
        return record

    async def _put(self, message: MessageToStore) -> AppendResult:
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
        if result.status is not PutStatus.PUT_OK:
            log.warning("resent dead letter stored but the flush timed out")
        return result.results[0]


def _check_group(group: str) -> None:
    try:
        check_group(group)
    except ValueError as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc), consumer_group=group)
