"""Copies of popped messages for redelivery: to ``%RETRY%{group}_{topic}`` or ``%DLQ%{group}``.

Shared by the revive loop (a normal group's message not acked in time) and Pop (a FIFO group's
batch that used up its attempts). The copy keeps the message as send-back's copies do
(``send_back.resend_message``); the DLQ is created on first use, write-only, like send-back's.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from rocketq import codec
from rocketq.codec import Prop
from rocketq.validation import dlq_topic
from services.broker.model import TopicConfig
from services.broker.send_back import (
    DLQ_PERM,
    DLQ_QUEUE_NUMS,
    RETRY_PERM,
    resend_message,
    resend_properties,
)
from services.common.errors import ServiceError

if TYPE_CHECKING:
    from services.broker.pop.processor import PopProcessor

log = logging.getLogger(__name__)


def pop_retry_topic(group: str, topic: str) -> str:
    """RocketMQ 5's per-(group, topic) retry topic for pop consumers."""
    return f"%RETRY%{group}_{topic}"


async def copy_message(
    pops: PopProcessor,
    group: str,
    asked_topic: str,
    record: codec.Record,
    *,
    reconsume_times: int,
    to_dlq: bool,
    retry_queue_nums: int = 1,
) -> bool:
    """Store the copy; False when it cannot be copied (logged: properties past the limit)."""
    topics = pops.topics
    if to_dlq:
        name = dlq_topic(group)
        target = topics.get(name) or topics.create_system_topic(name, DLQ_QUEUE_NUMS, DLQ_PERM)
    else:
        name = pop_retry_topic(group, asked_topic)
        target = topics.get(name) or topics.create_system_topic(
            name, max(retry_queue_nums, 1), RETRY_PERM
        )
    props = resend_properties(record, origin_msg_id_hint="", origin_topic_hint=asked_topic)
    try:
        message = resend_message(
            record,
            topic=target.topic_name,
            queue_id=_queue(target),
            properties=props,
            reconsume_times=reconsume_times,
        )
    except ServiceError as exc:
        log.error("pop: message %s cannot be copied: %s", record.uniq_key, exc.message)
        return False
    await pops.put([message])
    if to_dlq:
        log.info(
            "group %s: message %s delivered %d times, moved to %s",
            group, props.get(Prop.ORIGIN_MESSAGE_ID, ""), reconsume_times, target.topic_name,
        )  # fmt: skip
    return True


def _queue(target: TopicConfig) -> int:
    return random.randrange(max(target.write_queue_nums, 1))  # spreading, not security
