"""A topic's message type on the v2 gateway: what QueryRoute announces and SendMessage accepts.

Apache RocketMQ 5 gives each topic one message type (topic attribute ``message.type``) and its
proxy refuses a message of another type with MESSAGE_PROPERTY_CONFLICT_WITH_TYPE; the SDKs read
the type from the route (``accept_message_types``) and check before sending when the settings
say ``validate_message_type``. RocketQ keeps it in TopicConfig.message_type. Unset counts as
MIXED, which accepts all four: RocketQ's v1 topics were type-agnostic, so every existing topic
(and every auto-created one) keeps accepting everything.

Only the gateway checks, as only Apache's proxy does (its broker stores what it is given):
RocketQ's own protocol (``rocketq.v1`` Send, RocketQ's SDK, the timer wheel's re-puts and the
retry and dead-letter topics) stays type-agnostic.

A message's type follows from what it carries, first match wins, as Apache's
TopicMessageType.parseFromMessageProperty: a transaction half message is TRANSACTION, one with
a delivery time DELAY, one with a message group FIFO, anything else NORMAL.
"""

from __future__ import annotations

from typing import Any

from rocketq._api.rocketq.v1 import common_pb2
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway.v2common import status
from services.broker.model import TopicConfig, topic_message_type_name

ALL_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)
"""What a MIXED (or untyped) topic accepts."""
_V2_OF_TOPIC: dict[int, Any] = {
    common_pb2.NORMAL: v2.NORMAL,
    common_pb2.FIFO: v2.FIFO,
    common_pb2.DELAY: v2.DELAY,
    common_pb2.TRANSACTION: v2.TRANSACTION,
}


def accepted_types(message_type: int) -> tuple[int, ...]:
    """The v2 MessageTypes a topic of ``message_type`` (a TopicMessageType) accepts: all four
    when it has no single type."""
    one = _V2_OF_TOPIC.get(message_type)
    return (one,) if one is not None else ALL_TYPES


def type_of(message: Any) -> int:
    """A v2 message's type by what it carries (module docstring), not the type it declares."""
    sp = message.system_properties
    if sp.message_type == v2.TRANSACTION:
        return int(v2.TRANSACTION)
    if sp.HasField("delivery_timestamp"):
        return int(v2.DELAY)
    if sp.message_group:
        return int(v2.FIFO)
    return int(v2.NORMAL)


def conflict(cfg: TopicConfig, message: Any) -> Any | None:
    """The refusal of ``message`` on topic ``cfg`` (a v2 Status), or None when it fits."""
    accepted = accepted_types(cfg.message_type)
    kind = type_of(message)
    if kind in accepted:
        return None
    return status(
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        f"topic {cfg.topic_name} accepts {topic_message_type_name(cfg.message_type)} messages "
        f"only; this message is {v2.MessageType.Name(kind)}"
        f"{_WHY.get(kind, '')}. Send it to a topic of that type or MIXED "
        "(rocketq topic update --message-type)",
    )


_WHY = {
    v2.TRANSACTION: " (a transactional send)",
    v2.DELAY: " (it has a delivery timestamp)",
    v2.FIFO: " (it has a message group)",
    v2.NORMAL: " (no message group, delivery timestamp or transaction)",
}
