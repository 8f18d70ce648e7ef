"""Checks and small readers the Admin handler groups share (services.broker.admin_service).

Each check raises ServiceError with the reason the proto ``Admin`` service documents; the
handlers call them before they touch a manager, so a refused request changes nothing.
"""

from __future__ import annotations

from typing import Any

import grpc

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.validation import (
    check_group,
    check_perm,
    check_queue_nums,
    check_topic,
    is_system_topic,
)
from services.broker.config import BrokerConfig
from services.broker.model import SubscriptionGroupConfig, TopicConfig, check_message_type
from services.broker.subscription_group_manager import check_group_config
from services.common.errors import ServiceError, denied, unavailable
from services.store.consume_queue import PRE_BLANK_SIZE
from services.store.message_store import MessageStore


def invalid_arg(exc: ValueError, **meta: object) -> ServiceError:
    """INVALID_ARGUMENT carrying a validator's message."""
    return ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT, common_pb2.ILLEGAL_ARGUMENT, str(exc), **meta
    )


def enum_name(enum: Any, number: int) -> str:
    """The proto enum value's name; the number as text for one this build does not know."""
    try:
        return str(enum.Name(number))
    except ValueError:
        return str(number)


def require_master(config: BrokerConfig) -> None:
    """Changes are for masters only: a slave gets them through replication."""
    if not config.is_master:
        unavailable(
            common_pb2.NOT_MASTER,
            f"broker {config.broker_name} id {config.broker_id} is a slave; "
            "send changes to its master (broker id 0)",
            broker_name=config.broker_name,
        )


def check_topic_name(topic: str, *, change: bool) -> None:
    """A valid topic name; for a change, not one of the system topics the broker manages."""
    try:
        check_topic(topic)
    except ValueError as exc:
        raise invalid_arg(exc, topic=topic) from None
    if change and is_system_topic(topic):
        denied(
            f"{topic} is a reserved system topic; the broker manages it itself",
            topic=topic,
        )


def check_group_name(group: str) -> None:
    try:
        check_group(group)
    except ValueError as exc:
        raise invalid_arg(exc, group=group) from None


def topic_from_request(pb: common_pb2.TopicConfig) -> TopicConfig:
    """A topic config to create or update, checked."""
    check_topic_name(pb.topic_name, change=True)
    try:
        check_queue_nums(pb.read_queue_nums, pb.write_queue_nums)
        check_perm(pb.perm)
        if pb.topic_sys_flag < 0:
            raise ValueError(f"topic_sys_flag is {pb.topic_sys_flag}; it must be >= 0")
        check_message_type(pb.message_type)
    except ValueError as exc:
        raise invalid_arg(exc, topic=pb.topic_name) from None
    return TopicConfig.from_pb(pb)


def group_from_request(pb: common_pb2.SubscriptionGroupConfig) -> SubscriptionGroupConfig:
    """A subscription group config to create or update, checked."""
    cfg = SubscriptionGroupConfig.from_pb(pb)
    try:
        check_group_config(cfg)
    except ValueError as exc:
        raise invalid_arg(exc, group=pb.group_name) from None
    return cfg


def store_time(store: MessageStore, topic: str, queue_id: int, queue_offset: int) -> int:
    """Store timestamp of the message at ``queue_offset``; 0 if it is not stored."""
    cq = store.queues.find(topic, queue_id)
    if cq is None or queue_offset < 0:
        return 0
    unit = cq.unit(queue_offset)
    if unit is None or unit[1] == PRE_BLANK_SIZE:
        return 0
    return store.commitlog.read_store_timestamp(unit[0], unit[1]) or 0
