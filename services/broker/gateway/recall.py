"""RecallMessage: cancel a delayed message before it is delivered (RocketMQ 5.3's recall).

SendMessage answers a delayed message with a *recall handle* in its SendResultEntry; the
producer gives it back in ``RecallMessage(topic, recall_handle)``. The handle is Apache
RocketMQ's v1 form, URL-safe base64 of ``"v1 {topic} {broker} {delivery ms} {message id}"``:
it names the broker group that stored the timer, so any gateway can take the call and pass it
to that broker's gateway (the SDKs send it to whichever endpoint they were given).

On the owning broker the recall is the timer-wheel's cancel (timer.proto CancelTimer): the timer
is looked up in ``rmq_sys_wheel_timer`` by its message id, and a cancel marker
(``TIMER_DEL_UNIQKEY`` = the id, due at the timer's own delivery time) is stored through the
broker's Send. The marker lands in the timer's queue and slot, so whichever timer-wheel owns
that queue skips the timer when the slot comes due; the marker is an ordinary stored (and
replicated) record, read into the timer-wheel's TimerLog like a timer, which is why a recall
survives a broker or timer-wheel restart.

| answer                     | when                                                           |
|----------------------------|----------------------------------------------------------------|
| OK (message_id)            | the marker is stored                                           |
| BAD_REQUEST                | the handle is empty, not base64, not v1, or names another topic |
| TOPIC_NOT_FOUND            | the topic does not exist                                       |
| NOT_FOUND                  | the handle's broker group serves no gateway in the topic route |
| MESSAGE_NOT_FOUND          | no such timer (a forged id), already recalled, or its delivery |
|                            | time has come (delivered, or about to be)                      |
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.codec import Prop
from rocketq.validation import TIMER_TOPIC
from services.broker.config import BrokerConfig
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from services.broker.messaging_service import MessagingService
from services.common.errors import ServiceError

log = logging.getLogger(__name__)

VERSION = "v1"
HANDLE_MAX_CHARS = 1024
MESSAGE_ID_MAX_CHARS = 128
RECALL_MARGIN_MS = 200
"""A timer due sooner than this counts as delivered: the marker could come too late."""
FORWARD_TIMEOUT_S = 5.0
TIMER_LOOKUP_MAX = 64
"""Records of one message id read from the timer topic's index, at most (a timer, its cancel
markers, and hash neighbours)."""
_CODES = {
    grpc.StatusCode.NOT_FOUND: v2.MESSAGE_NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
    grpc.StatusCode.PERMISSION_DENIED: v2.FORBIDDEN,
    grpc.StatusCode.RESOURCE_EXHAUSTED: v2.TOO_MANY_REQUESTS,
}
Gateways = Mapping[str, str]
"""Broker group name → its gateway's ``host:port``."""
RECALL_PRODUCER_GROUP = "rmq_v2_recall"
"""The producer group of cancel markers stored for recalls."""


@dataclass(frozen=True, slots=True)
class RecallHandle:
    topic: str
    broker: str
    deliver_ms: int
    message_id: str

    def encode(self) -> str:
        raw = " ".join((VERSION, self.topic, self.broker, str(self.deliver_ms), self.message_id))
        return base64.urlsafe_b64encode(raw.encode()).decode()


def recall_handle_of(
    broker: str, topic: str, props: Mapping[str, str], message_id: str, now_ms: int
) -> str:
    """The recall handle of a message the gateway stored (``props`` as sent), or "" if it is
    not delayed into the future (then there is nothing to recall)."""
    deliver = props.get(Prop.TIMER_DELIVER_MS, "")
    if not deliver.isdigit() or int(deliver) <= now_ms or not message_id:
        return ""
    return RecallHandle(topic, broker, int(deliver), message_id).encode()


def parse(handle: str) -> RecallHandle | None:
    """The handle's fields, or None if it is not a v1 recall handle."""
    if not handle or len(handle) > HANDLE_MAX_CHARS:
        return None
    try:
        raw = base64.urlsafe_b64decode(handle.encode()).decode()
    except (binascii.Error, UnicodeError, ValueError):
        return None
    items = raw.split(" ")
    if len(items) != 5 or items[0] != VERSION or not items[3].isdigit() or not all(items):
        return None
    return RecallHandle(items[1], items[2], int(items[3]), items[4])


def _response(code: int, message: str, message_id: str = "") -> Any:
    return svc.RecallMessageResponse(
        status=v2.Status(code=code, message=message), message_id=message_id
    )


class Recaller:
    """RecallMessage for one broker's gateway (see the module docstring)."""

    def __init__(self, config: BrokerConfig, messaging: MessagingService) -> None:
        self.config = config
        self.messaging = messaging

    async def recall(
        self, topic: str, handle: str, peer: str, gateways: Callable[[], Awaitable[Gateways]]
    ) -> Any:
        """``topic`` as stored (namespace applied); ``gateways`` gives broker group → gateway
        address, asked only for a handle of another group."""
        parsed = parse(handle)
        if parsed is None:
            return _response(
                v2.BAD_REQUEST,
                f"recall handle {handle[:80]!r} is not one a RocketQ or RocketMQ gateway issued "
                "(SendResultEntry.recall_handle of a delayed message)",
            )
        if parsed.topic != topic:
            return _response(
                v2.BAD_REQUEST,
                f"the recall handle is for topic {parsed.topic}, not {topic}",
            )
        if parsed.broker != self.config.broker_name:
            return await self._forward(parsed, handle, gateways)
        if self.messaging.topics.get(topic) is None:
            return _response(v2.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if len(parsed.message_id) > MESSAGE_ID_MAX_CHARS:
            return _response(v2.BAD_REQUEST, "the recall handle's message id is too long")
        try:
            deliver_ms = self._pending_timer(parsed)
            await self._store_marker(parsed, deliver_ms, peer)
        except ServiceError as exc:  # not found, or the marker's Send refused
            return _response(_CODES.get(exc.code, v2.INTERNAL_ERROR), exc.message)
        log.info("recalled delayed message %s of %s due at %d", parsed.message_id, topic,
                 deliver_ms)  # fmt: skip
        return _response(v2.OK, "OK", parsed.message_id)

    def _pending_timer(self, h: RecallHandle) -> int:
        """The delivery time of the timer ``h`` names; ServiceError NOT_FOUND if none is
        pending."""
        now_ms = self.messaging.clock.now_ms()
        if h.deliver_ms <= now_ms + RECALL_MARGIN_MS:
            _gone(f"delayed message {h.message_id} was due at {h.deliver_ms}: delivered already")
        # By the store's index, not QueryMessageById: the SDKs' ids are not always RocketQ's
        # 32 hex characters (the Python SDK's have 34).
        wanted = h.message_id.upper()
        found = self.messaging.store.query_by_key(
            TIMER_TOPIC, h.message_id, TIMER_LOOKUP_MAX, 0, now_ms
        )
        props = [r.properties for r in found if r.uniq_key.upper() == wanted]
        if any(p.get(Prop.TIMER_DEL_UNIQKEY) == h.message_id for p in props):
            _gone(f"delayed message {h.message_id} was already recalled")
        timers = [p for p in props if p.get(Prop.REAL_TOPIC) == h.topic]
        if not timers:
            _gone(f"no delayed message {h.message_id} of topic {h.topic} on this broker")
        try:
            deliver_ms = int(timers[0].get(Prop.TIMER_OUT_MS, ""))
        except ValueError:
            _gone(f"delayed message {h.message_id} has no delivery time")
        if deliver_ms <= now_ms + RECALL_MARGIN_MS:
            _gone(f"delayed message {h.message_id} was due at {deliver_ms}: delivered already")
        return deliver_ms

    async def _store_marker(self, h: RecallHandle, deliver_ms: int, peer: str) -> None:
        """The cancel marker, through Send (it goes to the timer's queue of the timer topic)."""
        marker = common_pb2.Message(
            topic=h.topic,
            body=b"recall",  # the broker refuses empty bodies
            properties={
                Prop.TIMER_DEL_UNIQKEY: h.message_id,
                Prop.TIMER_DELIVER_MS: str(deliver_ms),
                Prop.UNIQ_KEY: h.message_id,
            },
        )
        request = messaging_pb2.SendRequest(
            producer_group=RECALL_PRODUCER_GROUP, queue_id=0, messages=[marker]
        )
        await self.messaging.sender.send(request, peer)

    async def _forward(
        self, h: RecallHandle, handle: str, gateways: Callable[[], Awaitable[Gateways]]
    ) -> Any:
        """A handle of another broker group: its gateway answers."""
        addr = (await gateways()).get(h.broker, "")
        if not addr:
            return _response(
                v2.NOT_FOUND,
                f"broker group {h.broker} named by the recall handle serves no gateway in the "
                f"route of topic {h.topic}",
            )
        request = svc.RecallMessageRequest(
            topic=v2.Resource(name=h.topic), recall_handle=handle
        )  # the stored topic name: the namespace is already in it
        try:
            async with grpc.aio.insecure_channel(addr) as channel:
                stub = svc_grpc.MessagingServiceStub(channel)
                return await stub.RecallMessage(request, timeout=FORWARD_TIMEOUT_S)
        except grpc.RpcError as err:
            return _response(
                v2.PROXY_TIMEOUT
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                else v2.INTERNAL_ERROR,
                f"broker group {h.broker}'s gateway at {addr} did not answer the recall: "
                f"{err.code().name}",
            )


def _gone(message: str) -> NoReturn:
    raise ServiceError(grpc.StatusCode.NOT_FOUND, common_pb2.MESSAGE_NOT_FOUND, message)
