"""What every module of the v2 gateway shares: resource names, statuses, time conversions and the
v2 form of a stored message (service.py, pull.py, auth.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.codec import Prop
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway.sdk_compat import delivered_fields
from services.common.errors import ServiceError

_BY_REASON = {
    common_pb2.TOPIC_NOT_EXIST: v2.TOPIC_NOT_FOUND,
    common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST: v2.CONSUMER_GROUP_NOT_FOUND,
    common_pb2.INVALID_RECEIPT_HANDLE: v2.INVALID_RECEIPT_HANDLE,
    common_pb2.MESSAGE_TOO_LARGE: v2.MESSAGE_BODY_TOO_LARGE,
    common_pb2.MESSAGE_NOT_FOUND: v2.MESSAGE_NOT_FOUND,
    common_pb2.ILLEGAL_EXPRESSION: v2.ILLEGAL_FILTER_EXPRESSION,
    common_pb2.FLOW_CONTROL: v2.TOO_MANY_REQUESTS,
}
_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: v2.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED: v2.FORBIDDEN,
    grpc.StatusCode.RESOURCE_EXHAUSTED: v2.TOO_MANY_REQUESTS,
    grpc.StatusCode.FAILED_PRECONDITION: v2.PRECONDITION_FAILED,
}

SYSTEM_PROPERTIES = frozenset(
    {Prop.UNIQ_KEY, Prop.RETRY_TOPIC, Prop.ORIGIN_MESSAGE_ID, Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID}
)
"""Properties RocketQ keeps for itself: never handed to an SDK as user properties."""


def named(resource: Any) -> str:
    """A v2 resource's name on RocketQ: namespaces isolate by prefix, ``{namespace}%{name}``, as
    Apache RocketMQ's proxy names them (create ``tenant%Orders`` for namespace ``tenant``)."""
    ns = resource.resource_namespace
    return f"{ns}%{resource.name}" if ns else str(resource.name)


def status(code: int = v2.OK, message: str = "OK") -> Any:
    return v2.Status(code=code, message=message)


def status_of(exc: ServiceError) -> Any:
    """The protocol's Code for a refusal of the broker (Code table in the shared brief)."""
    code = _BY_REASON.get(exc.reason) or _BY_CODE.get(exc.code, v2.INTERNAL_ERROR)
    return status(code, exc.message)


DURATION_MS_CAP = 2**53
"""A client's Duration is clamped to this many ms before it goes into an int64 field (seconds
near 2**63 overflowed it: an INTERNAL error, found by the RPC fuzzer); the range checks of the
broker then refuse it with a message."""


def ms_of(d: duration_pb2.Duration) -> int:
    ms = d.seconds * 1000 + d.nanos // 1_000_000
    return max(-DURATION_MS_CAP, min(DURATION_MS_CAP, ms))


def timestamp_ms(t: timestamp_pb2.Timestamp) -> int:
    ms = t.seconds * 1000 + t.nanos // 1_000_000
    return max(-DURATION_MS_CAP, min(DURATION_MS_CAP, ms))


def duration(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def digest(body: bytes) -> Any:
    """MD5 as uppercase hex: the only form both official SDKs accept."""
    return v2.Digest(type=v2.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def message_of(stored: common_pb2.StoredMessage, topic: Any, **system: Any) -> Any:
    """A stored message as the SDKs read it; ``system``: more SystemProperties fields (a
    popped message's receipt handle, invisible time and delivery attempt)."""
    props = dict(stored.message.properties)
    body = stored.message.body
    sp = v2.SystemProperties(
        tag=props.pop(Prop.TAGS, ""),
        keys=[k for k in props.pop(Prop.KEYS, "").split(" ") if k],
        message_id=stored.msg_id,
        body_digest=digest(body),
        body_encoding=v2.IDENTITY,
        born_timestamp=timestamp(stored.born_timestamp_ms),
        born_host=stored.born_host,
        store_timestamp=timestamp(stored.store_timestamp_ms),
        store_host=stored.store_host,
        queue_id=stored.queue_id,
        queue_offset=stored.queue_offset,
        **delivered_fields(props),  # group / delivery time / type (sdk_compat)
        **system,
    )
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    return v2.Message(topic=topic, user_properties=user, system_properties=sp, body=body)
