"""The v2 pull consumer's RPCs: PullMessage, UpdateOffset, GetOffset, QueryOffset.

A v2 pull consumer (Apache's ``LitePullConsumer`` over the gRPC protocol) reads one queue by
offset and keeps its own position; these translate to the broker's pull (with the request's own
filter, FLAG_SUBSCRIPTION, so no v1 heartbeat is needed) and its consumer-offset table:

| v2 RPC        | broker                                                                  |
|---------------|-------------------------------------------------------------------------|
| PullMessage   | PullProcessor.pull, long-polled up to ``long_polling_timeout``; the     |
|               | stream is a status, the messages, then ``next_offset``                  |
| UpdateOffset  | the group's committed offset on the queue (clamped to the queue's end)  |
| GetOffset     | that offset, OFFSET_NOT_FOUND when the group never committed one        |
| QueryOffset   | the queue's min (BEGINNING), max (END) or first offset at a time        |

A queue is a topic and queue id on this broker: a message queue naming another broker is
refused (BAD_REQUEST), as each broker's gateway serves its own queues (QueryRoute says where).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.validation import PULL_BATCH_MAX, check_group, check_topic
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway.v2common import (
    message_of,
    ms_of,
    named,
    status,
    status_of,
    timestamp_ms,
)
from services.broker.messaging_service import MessagingService
from services.broker.pull_processor import FLAG_SUBSCRIPTION, FLAG_SUSPEND
from services.common.errors import ServiceError

PULL_BATCH_DEFAULT = 32


class BadRequest(Exception):
    """A request the gateway refuses before the broker sees it: a v2 status code and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PullOffsets:
    """The four RPCs over one broker's processors (see the module docstring)."""

    def __init__(self, messaging: MessagingService) -> None:
        self.messaging = messaging

    # -- PullMessage -----------------------------------------------------------------------
    async def pull(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            group, topic, qid = self._where(request.group, request.message_queue)
            pull = self._pull_request(request, group, topic, qid)
        except BadRequest as exc:
            yield svc.PullMessageResponse(status=status(exc.code, exc.message))
            return
        try:
            out = await self.messaging.puller.pull(pull, context)
        except ServiceError as exc:
            yield svc.PullMessageResponse(status=status_of(exc))
            return
        if out.status == messaging_pb2.FOUND:
            yield svc.PullMessageResponse(status=status())
            for stored in out.messages:
                resp = svc.PullMessageResponse()
                # CopyFrom, not message= in the constructor: upb merges a message given there
                # by serializing and re-parsing it.
                resp.message.CopyFrom(message_of(stored, request.message_queue.topic))
                yield resp
        elif out.status == messaging_pb2.OFFSET_ILLEGAL:
            yield svc.PullMessageResponse(
                status=status(
                    v2.ILLEGAL_OFFSET,
                    f"offset {request.offset} is outside [{out.min_offset}, {out.max_offset}] of "
                    f"{topic} queue {qid}; pull from next_offset",
                )
            )
        else:
            yield svc.PullMessageResponse(status=status(v2.MESSAGE_NOT_FOUND, "no new message"))
        yield svc.PullMessageResponse(next_offset=out.next_begin_offset)

    def _pull_request(
        self, request: Any, group: str, topic: str, qid: int
    ) -> messaging_pb2.PullRequest:
        if request.offset < 0:
            raise BadRequest(v2.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        batch = request.batch_size or PULL_BATCH_DEFAULT
        if not 1 <= batch <= PULL_BATCH_MAX:
            raise BadRequest(v2.BAD_REQUEST, f"batch_size {batch} is outside 1..{PULL_BATCH_MAX}")
        poll_ms = ms_of(request.long_polling_timeout)
        # a pull may wait (0 = answer at once) as long as a receive: gatewayLongPollingTimeoutMs
        poll_max_ms = self.messaging.config.gateway_long_polling_timeout_ms
        if not 0 <= poll_ms <= poll_max_ms:
            raise BadRequest(
                v2.ILLEGAL_POLLING_TIME,
                f"long_polling_timeout {poll_ms} ms is outside 0..{poll_max_ms} ms "
                "(gatewayLongPollingTimeoutMs)",
            )
        expression = request.filter_expression
        return messaging_pb2.PullRequest(
            consumer_group=group,
            topic=topic,
            queue_id=qid,
            queue_offset=request.offset,
            max_msg_nums=batch,
            sys_flag=FLAG_SUBSCRIPTION | (FLAG_SUSPEND if poll_ms else 0),
            suspend_timeout_ms=poll_ms,
            subscription=expression.expression or "*",
            expression_type=common_pb2.SQL92 if expression.type == v2.SQL else common_pb2.TAG,
            decoded=True,
        )

    # -- offsets ---------------------------------------------------------------------------
    def update_offset(self, request: Any, peer: str) -> Any:
        try:
            group, topic, qid = self._where(request.group, request.message_queue)
            self._known_group(group)
            if request.offset < 0:
                raise BadRequest(v2.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
            if not self.messaging.config.is_master:
                raise BadRequest(
                    v2.PRECONDITION_FAILED,
                    f"broker {self.messaging.config.broker_name} is a slave now; update offsets "
                    "at its master's gateway",
                )
        except BadRequest as exc:
            return svc.UpdateOffsetResponse(status=status(exc.code, exc.message))
        # Never past the queue's end (as the v1 UpdateConsumerOffset): a stale or foreign value
        # would make the group skip every future message.
        offset = min(request.offset, self.messaging.store.max_offset(topic, qid))
        self.messaging.offsets.commit(group, topic, qid, offset, client=peer)
        return svc.UpdateOffsetResponse(status=status())

    def get_offset(self, request: Any) -> Any:
        try:
            group, topic, qid = self._where(request.group, request.message_queue)
            self._known_group(group)
        except BadRequest as exc:
            return svc.GetOffsetResponse(status=status(exc.code, exc.message))
        offset = self.messaging.offsets.query(group, topic, qid)
        if offset < 0:
            return svc.GetOffsetResponse(
                status=status(
                    v2.OFFSET_NOT_FOUND,
                    f"group {group} has no offset on {topic} queue {qid}; UpdateOffset sets one",
                )
            )
        return svc.GetOffsetResponse(status=status(), offset=offset)

    def query_offset(self, request: Any) -> Any:
        store = self.messaging.store
        try:
            topic, qid = self._queue(request.message_queue)
            policy = request.query_offset_policy
            if policy == v2.BEGINNING:
                offset = store.min_offset(topic, qid)
            elif policy == v2.END:
                offset = store.max_offset(topic, qid)
            elif policy == v2.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise BadRequest(v2.BAD_REQUEST, "policy TIMESTAMP needs a timestamp")
                at_ms = timestamp_ms(request.timestamp)
                if at_ms < 0:
                    raise BadRequest(v2.BAD_REQUEST, f"timestamp {at_ms} ms is before 1970")
                offset = store.offset_by_time(topic, qid, at_ms)
            else:
                raise BadRequest(v2.BAD_REQUEST, f"query_offset_policy {policy} is unknown")
        except BadRequest as exc:
            return svc.QueryOffsetResponse(status=status(exc.code, exc.message))
        return svc.QueryOffsetResponse(status=status(), offset=offset)

    # -- checks ----------------------------------------------------------------------------
    def _where(self, group_resource: Any, queue: Any) -> tuple[str, str, int]:
        group = named(group_resource)
        try:
            check_group(group)
        except ValueError as exc:
            raise BadRequest(v2.ILLEGAL_CONSUMER_GROUP, str(exc)) from None
        return (group, *self._queue(queue))

    def _queue(self, queue: Any) -> tuple[str, int]:
        """The queue's topic on RocketQ and its id, when this broker holds that queue."""
        topic = named(queue.topic)
        try:
            check_topic(topic)
        except ValueError as exc:
            raise BadRequest(v2.ILLEGAL_TOPIC, str(exc)) from None
        here = self.messaging.config.broker_name
        if queue.HasField("broker") and queue.broker.name and queue.broker.name != here:
            raise BadRequest(
                v2.BAD_REQUEST,
                f"queue {topic}#{queue.id} is on broker {queue.broker.name}; this gateway serves "
                f"broker {here} (QueryRoute gives each queue's endpoints)",
            )
        cfg = self.messaging.topics.get(topic)
        if cfg is None:
            raise BadRequest(v2.TOPIC_NOT_FOUND, f"topic {topic} does not exist on {here}")
        if not 0 <= queue.id < cfg.read_queue_nums:
            raise BadRequest(
                v2.BAD_REQUEST,
                f"queue id {queue.id} is outside [0, {cfg.read_queue_nums}) for topic {topic}",
            )
        return topic, queue.id

    def _known_group(self, group: str) -> None:
        if self.messaging.groups.find_or_create(group) is None:
            raise BadRequest(
                v2.CONSUMER_GROUP_NOT_FOUND,
                f"consumer group {group} does not exist and autoCreateSubscriptionGroup is "
                "false; create it with the admin tool",
            )
