"""``apache.rocketmq.v2.MessagingService`` on a broker: the official RocketMQ 5 SDKs' protocol.

Served on ``gatewayPort`` (0 = off, the default for now) by its own grpc.aio server, beside the
native ``rocketq.v1`` services. It translates; the work is the broker's own:

| v2 RPC                     | here                                                          |
|----------------------------|---------------------------------------------------------------|
| QueryRoute                 | every broker group's queues, at the gateway address each      |
|                            | master registered with the nameservers (gateway_addr)         |
| (every RPC)                | a namespace ``ns`` names resources ``ns%{name}`` (isolated)   |
| QueryAssignment            | one assignment per broker (queue -1: pop balances messages)   |
| Heartbeat, NotifyClient... | OK (pop needs no client registry)                             |
| Telemetry                  | the settings handshake: echo plus server settings, status OK; |
|                            | transaction check-backs to producers (gateway/telemetry.py)   |
| SendMessage                | the broker's SendProcessor, one entry per message (a delivery |
|                            | timestamp becomes TIMER_DELIVER_MS: the timer wheel re-puts)  |
| ReceiveMessage             | Pop (services/broker/pop): status, messages, delivery time;   |
|                            | with auto_renew the gateway renews the invisible time until   |
|                            | the ack (gateway/renew.py)                                    |
| AckMessage                 | Ack, one result entry per entry                               |
| ChangeInvisibleDuration    | ChangeInvisibleTime (a new receipt handle)                    |
| ForwardMessageToDeadLetter | the message to %DLQ%{group} now, acked (FIFO push consumers)  |
| EndTransaction             | the broker's EndTransaction (a TRANSACTION message is stored  |
|                            | as a half message; its transaction id locates it)             |

Not yet: FIFO per message group (a group is hashed to a queue and the whole queue is held),
transaction check-backs (RecoverOrphanedTransactionCommand on Telemetry: an unresolved half
message is checked with no producer to ask, then discarded), the server-side auto-renew of push
consumers' invisible time, the SDKs' authorization, the other RPCs (grpc answers UNIMPLEMENTED).
The facts behind the choices are in the shared brief v2-protocol.md.
"""

# ruff: noqa: N802  (servicer methods carry the proto's RPC names)
from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeAlias

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
    nameserver_pb2_grpc,
)
from rocketq.codec import Prop
from rocketq.java_hash import java_string_hash
from services.broker.config import BrokerConfig
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from services.broker.gateway.renew import RenewTable
from services.broker.gateway.sdk_compat import (
    change_invisible_ms,
    delivered_fields,
    store_message_group,
)
from services.broker.gateway.telemetry import TelemetrySession, client_id_of, heartbeat
from services.broker.messaging_service import MessagingService
from services.common.errors import ServiceError, rpc, rpc_stream

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
LONG_POLLING_MIN_MS = 5_000
LONG_POLLING_MAX_MS = 20_000
RECEIVE_BATCH_SIZE = 32
ROUTE_TIMEOUT_S = 3.0
ACCEPTED_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)
GATEWAY_PRODUCER_GROUP = "rmq_v2_gateway"
"""The producer group of every message sent through the gateway (v2 messages name none)."""
TX_PREFIX = "rq1tx|"
_RESOLUTIONS = {
    v2.COMMIT: messaging_pb2.TRANSACTION_COMMIT,
    v2.ROLLBACK: messaging_pb2.TRANSACTION_ROLLBACK,
}

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
pop service then refuse it with a message."""


def _ms(d: duration_pb2.Duration) -> int:
    ms = d.seconds * 1000 + d.nanos // 1_000_000
    return max(-DURATION_MS_CAP, min(DURATION_MS_CAP, ms))


def _duration(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


class GatewayService(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    """The v2 protocol over one broker's processors (see the module docstring)."""

    def __init__(
        self, *, config: BrokerConfig, messaging: MessagingService, host: str, port: int
    ) -> None:
        self.config = config
        self.messaging = messaging
        self.host = host
        self.port = port
        self.renew = RenewTable(
            messaging.pops, config.gateway_auto_renew_invisible_ms, messaging.clock
        )

    def _endpoints(self) -> Any:
        return _endpoints(self.host, self.port)

    # -- routes, liveness ------------------------------------------------------------------
    @rpc
    async def QueryRoute(self, request: Any, context: Context) -> Any:
        """Every broker group's queues of the topic, each at its master's gateway (from the
        nameservers' route, where brokers register their gateway address); this broker's own
        queues when no nameserver answers."""
        topic = named(request.topic)
        queues = await self._routed_queues(request.topic, topic)
        if queues is None:
            queues = self._own_queues(request.topic, topic)
        if not queues:
            return svc.QueryRouteResponse(
                status=status(v2.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            )
        return svc.QueryRouteResponse(status=status(), message_queues=queues)

    def _own_queues(self, resource: Any, topic: str) -> list[Any]:
        cfg = self.messaging.topics.get(topic)
        if cfg is None:
            return []
        broker = v2.Broker(name=self.config.broker_name, id=0, endpoints=self._endpoints())
        return [_queue(resource, qid, broker) for qid in range(cfg.queue_nums)]

    async def _routed_queues(self, resource: Any, topic: str) -> list[Any] | None:
        """None when no nameserver could be asked (not configured, or none answered)."""
        for addr in self.config.namesrv_addrs:
            try:
                async with grpc.aio.insecure_channel(addr) as channel:
                    response = await nameserver_pb2_grpc.NameServerStub(
                        channel
                    ).GetRouteInfoByTopic(
                        nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic),
                        timeout=ROUTE_TIMEOUT_S,
                    )
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return []
                continue
            gateways = {b.broker_name: b.gateway_addrs.get(0, "") for b in response.route.brokers}
            out = []
            for qd in sorted(response.route.queues, key=lambda q: q.broker_name):
                host, _, port = gateways.get(qd.broker_name, "").rpartition(":")
                if not host or not port.isdigit():
                    continue  # a group whose master serves no gateway
                broker = v2.Broker(name=qd.broker_name, id=0, endpoints=_endpoints(host, int(port)))
                out += [
                    _queue(resource, qid, broker)
                    for qid in range(max(qd.read_queue_nums, qd.write_queue_nums))
                ]
            return out
        return None

    @rpc
    async def QueryAssignment(self, request: Any, context: Context) -> Any:
        """Push consumers: one assignment per broker group (queue -1, every queue: pop balances
        the messages, not the queues), as Apache's proxy answers normal groups."""
        topic = named(request.topic)
        queues = await self._routed_queues(request.topic, topic)
        if queues is None:
            queues = self._own_queues(request.topic, topic)
        if not queues:
            return svc.QueryAssignmentResponse(
                status=status(v2.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            )
        brokers = {q.broker.name: q.broker for q in queues}
        return svc.QueryAssignmentResponse(
            status=status(),
            assignments=[
                v2.Assignment(message_queue=_queue(request.topic, -1, broker))
                for broker in brokers.values()
            ],
        )

    @rpc
    async def Heartbeat(self, request: Any, context: Context) -> Any:
        """Keeps a producer's check-back registration alive (gateway/telemetry.py)."""
        client_id = client_id_of(context)
        self.renew.seen(client_id)
        channel = self.messaging.clients.channel(client_id) if client_id else None
        if channel is not None and not channel.closed:
            heartbeat(self.messaging.clients, channel, GATEWAY_PRODUCER_GROUP)
        return svc.HeartbeatResponse(status=status())

    @rpc
    async def NotifyClientTermination(self, request: Any, context: Context) -> Any:
        self.renew.gone(client_id_of(context))
        return svc.NotifyClientTerminationResponse(status=status())

    @rpc_stream
    async def Telemetry(
        self, request_iterator: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[Any]:
        """The settings handshake; check-backs for producers (gateway/telemetry.py)."""
        session = TelemetrySession(
            clients=self.messaging.clients,
            producer_group=GATEWAY_PRODUCER_GROUP,
            settings=self._settings,
            check_command=self._check_command,
            client_id=client_id_of(context),
            peer=context.peer(),
        )
        async for item in session.run(request_iterator):
            yield item

    def _check_command(self, check: messaging_pb2.CheckTransactionState) -> Any:
        stored = check.message
        props = dict(stored.message.properties)
        message = v2.Message(
            topic=v2.Resource(name=stored.message.topic),
            user_properties={k: v for k, v in props.items() if k not in _SYSTEM_PROPERTIES},
            system_properties=v2.SystemProperties(
                tag=props.get(Prop.TAGS, ""),
                keys=[k for k in props.get(Prop.KEYS, "").split(" ") if k],
                message_id=stored.msg_id,
                body_digest=_digest(stored.message.body),
                body_encoding=v2.IDENTITY,
                message_type=v2.TRANSACTION,
                born_timestamp=_timestamp(stored.born_timestamp_ms),
                born_host=stored.born_host,
            ),
            body=stored.message.body,
        )
        return svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=message,
                transaction_id=_tx_id(check.commitlog_offset, check.queue_offset),
            )
        )

    def _settings(self, client: Any) -> Any:
        out = v2.Settings()
        out.CopyFrom(client)
        out.metric.CopyFrom(v2.Metric(on=False))
        backoff = out.backoff_policy
        if client.HasField("publishing"):
            backoff.max_attempts = 3
            backoff.exponential_backoff.CopyFrom(
                v2.ExponentialBackoff(initial=_duration(10), max=_duration(1_000), multiplier=2.0)
            )
            out.publishing.max_body_size = self.config.max_message_size_bytes
            out.publishing.validate_message_type = False
        if client.HasField("subscription"):
            group_cfg = self.messaging.groups.get(named(client.subscription.group))
            retries = group_cfg.retry_max_times if group_cfg is not None else 16
            backoff.max_attempts = retries + 1
            backoff.exponential_backoff.CopyFrom(
                v2.ExponentialBackoff(
                    initial=_duration(1_000), max=_duration(60_000), multiplier=2.0
                )
            )
            sub = out.subscription
            sub.fifo = group_cfg is not None and group_cfg.consume_message_orderly
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.CopyFrom(_duration(LONG_POLLING_MAX_MS))
        return out

    # -- send ------------------------------------------------------------------------------
    @rpc
    async def SendMessage(self, request: Any, context: Context) -> Any:
        entries = []
        for message in request.messages:
            entries.append(await self._send_one(message, context.peer()))
        failed = [e for e in entries if e.status.code != v2.OK]
        top = failed[0].status if len(failed) == len(entries) and failed else status()
        if failed and len(failed) < len(entries):
            top = status(v2.MULTIPLE_RESULTS, "some messages failed; see the entries")
        return svc.SendMessageResponse(status=top, entries=entries)

    async def _send_one(self, message: Any, peer: str) -> Any:
        topic = named(message.topic)
        props = dict(message.user_properties)
        sp = message.system_properties
        msg_id = sp.message_id
        if sp.tag:
            props[Prop.TAGS] = sp.tag
        if sp.keys:
            props[Prop.KEYS] = " ".join(sp.keys)
        if msg_id:
            props[Prop.UNIQ_KEY] = msg_id
        if sp.message_type == v2.TRANSACTION:  # a half message until EndTransaction
            props[Prop.TRANSACTION_PREPARED] = "true"
            props[Prop.PRODUCER_GROUP] = GATEWAY_PRODUCER_GROUP
        store_message_group(sp, props)  # given back on delivery (sdk_compat)
        if sp.HasField("delivery_timestamp"):  # a delayed message: through the timer wheel
            props[Prop.TIMER_DELIVER_MS] = str(
                sp.delivery_timestamp.seconds * 1000 + sp.delivery_timestamp.nanos // 1_000_000
            )
        cfg = self.messaging.topics.get(topic)
        if cfg is None:
            return svc.SendResultEntry(
                status=status(v2.TOPIC_NOT_FOUND, f"topic {topic} does not exist"),
                message_id=msg_id,
            )
        queues = max(cfg.write_queue_nums, 1)
        if sp.message_group:
            qid = abs(java_string_hash(sp.message_group)) % queues
        else:
            qid = random.randrange(queues)  # spreading, not security
        request = messaging_pb2.SendRequest(
            producer_group=GATEWAY_PRODUCER_GROUP,
            queue_id=qid,
            messages=[common_pb2.Message(topic=topic, body=message.body, properties=props)],
        )
        try:
            response = await self.messaging.sender.send(request, peer)
        except ServiceError as exc:
            return svc.SendResultEntry(status=status_of(exc), message_id=msg_id)
        result = response.results[0]
        # The transaction id says where the half message is, for EndTransaction (opaque to SDKs).
        tx_id = _tx_id(codec.decode_offset_msg_id(result.offset_msg_id)[1], result.queue_offset)
        return svc.SendResultEntry(
            status=status(),
            message_id=msg_id or result.msg_id,  # a delayed send's result names the timer
            transaction_id=tx_id,
            offset=result.queue_offset,
        )

    @rpc
    async def EndTransaction(self, request: Any, context: Context) -> Any:
        """Commit or roll back a half message through the broker's EndTransaction."""
        where = request.transaction_id.removeprefix(TX_PREFIX).split("|")
        try:
            commitlog_offset, queue_offset = int(where[0]), int(where[1])
        except (ValueError, IndexError):
            return svc.EndTransactionResponse(
                status=status(
                    v2.INVALID_TRANSACTION_ID,
                    f"transaction id {request.transaction_id[:80]!r} is not one this gateway "
                    "issued (SendResultEntry.transaction_id)",
                )
            )
        resolution = _RESOLUTIONS.get(request.resolution)
        if resolution is None:
            return svc.EndTransactionResponse(
                status=status(v2.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
            )
        end = messaging_pb2.EndTransactionRequest(
            producer_group=GATEWAY_PRODUCER_GROUP,
            commitlog_offset=commitlog_offset,
            queue_offset=queue_offset,
            msg_id=request.message_id,
            transaction_id=request.message_id,
            resolution=resolution,
            from_transaction_check=request.source == v2.SOURCE_SERVER_CHECK,
        )
        try:
            await self.messaging.transaction_ends.end(end)
        except ServiceError as exc:
            return svc.EndTransactionResponse(status=status_of(exc))
        return svc.EndTransactionResponse(status=status())

    # -- receive, ack, change --------------------------------------------------------------
    @rpc_stream
    async def ReceiveMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        poll_ms = (
            _ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else LONG_POLLING_MAX_MS
        )
        if not LONG_POLLING_MIN_MS <= poll_ms <= LONG_POLLING_MAX_MS:
            yield svc.ReceiveMessageResponse(
                status=status(
                    v2.ILLEGAL_POLLING_TIME,
                    f"long_polling_timeout {poll_ms} ms is outside {LONG_POLLING_MIN_MS}.."
                    f"{LONG_POLLING_MAX_MS} ms",
                )
            )
            return
        invisible_ms = (
            _ms(request.invisible_duration)
            if request.HasField("invisible_duration") and not request.auto_renew
            else self.renew.invisible_ms
        )
        pop = messaging_pb2.PopRequest(
            consumer_group=named(request.group),
            topic=named(request.message_queue.topic),
            max_msg_nums=max(1, min(request.batch_size or RECEIVE_BATCH_SIZE, RECEIVE_BATCH_SIZE)),
            invisible_time_ms=invisible_ms,
            poll_time_ms=poll_ms,
            expression=request.filter_expression.expression or "*",
            expression_type=common_pb2.SQL92
            if request.filter_expression.type == v2.SQL
            else common_pb2.TAG,
        )
        try:
            popped = await self.messaging.pops.pop(pop, context)
        except ServiceError as exc:
            code = v2.ILLEGAL_INVISIBLE_TIME if "invisible_time_ms" in exc.message else None
            yield svc.ReceiveMessageResponse(
                status=status(code, exc.message) if code else status_of(exc)
            )
            return
        if not popped.messages:
            yield svc.ReceiveMessageResponse(status=status(v2.MESSAGE_NOT_FOUND, "no new message"))
            return
        if request.auto_renew:
            client_id = client_id_of(context)
            for m in popped.messages:
                self.renew.add(client_id, pop.consumer_group, pop.topic, m.receipt_handle)
        yield svc.ReceiveMessageResponse(status=status())
        for m in popped.messages:
            yield svc.ReceiveMessageResponse(
                message=self._message(m, invisible_ms, request.message_queue.topic)
            )
        now = self.messaging.clock.now_ms()
        yield svc.ReceiveMessageResponse(delivery_timestamp=_timestamp(now))

    def _message(self, popped: messaging_pb2.PoppedMessage, invisible_ms: int, topic: Any) -> Any:
        stored = popped.message
        props = dict(stored.message.properties)
        body = stored.message.body
        sp = v2.SystemProperties(
            tag=props.pop(Prop.TAGS, ""),
            keys=[k for k in props.pop(Prop.KEYS, "").split(" ") if k],
            message_id=stored.msg_id,
            body_digest=_digest(body),
            body_encoding=v2.IDENTITY,
            born_timestamp=_timestamp(stored.born_timestamp_ms),
            born_host=stored.born_host,
            store_timestamp=_timestamp(stored.store_timestamp_ms),
            store_host=stored.store_host,
            receipt_handle=popped.receipt_handle,
            queue_id=stored.queue_id,
            queue_offset=stored.queue_offset,
            invisible_duration=_duration(invisible_ms),
            delivery_attempt=popped.delivery_attempt,
            **delivered_fields(props),  # group / delivery time / type (sdk_compat)
        )
        user = {k: v for k, v in props.items() if k not in _SYSTEM_PROPERTIES}
        return v2.Message(
            topic=topic,
            user_properties=user,
            system_properties=sp,
            body=body,
        )

    @rpc
    async def AckMessage(self, request: Any, context: Context) -> Any:
        results = []
        for entry in request.entries:
            ack = messaging_pb2.AckRequest(
                consumer_group=named(request.group),
                topic=named(request.topic),
                receipt_handle=await self.renew.take(entry.receipt_handle),
            )
            try:
                await self.messaging.pops.ack(ack)
                st = status()
            except ServiceError as exc:
                st = status_of(exc)
            results.append(
                svc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
                )
            )
        failed = [r for r in results if r.status.code != v2.OK]
        top = status()
        if failed:
            top = failed[0].status if len(failed) == len(results) else status(v2.MULTIPLE_RESULTS)
        return svc.AckMessageResponse(status=top, entries=results)

    @rpc
    async def ChangeInvisibleDuration(self, request: Any, context: Context) -> Any:
        change = messaging_pb2.ChangeInvisibleTimeRequest(
            consumer_group=named(request.group),
            topic=named(request.topic),
            receipt_handle=await self.renew.take(request.receipt_handle),
            invisible_time_ms=change_invisible_ms(_ms(request.invisible_duration)),  # sdk_compat
        )
        try:
            out = await self.messaging.pops.change_invisible_time(change)
        except ServiceError as exc:
            code = v2.ILLEGAL_INVISIBLE_TIME if "invisible_time_ms" in exc.message else None
            return svc.ChangeInvisibleDurationResponse(
                status=status(code, exc.message) if code else status_of(exc)
            )
        return svc.ChangeInvisibleDurationResponse(
            status=status(), receipt_handle=out.receipt_handle
        )

    # -- not yet (module docstring): a clear UNIMPLEMENTED, never grpc's default traceback --
    @rpc
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Context) -> Any:
        """A FIFO push consumer gave up on a message: to %DLQ%{group} now, and acked."""
        try:
            await self.messaging.pops.dead_letter(
                named(request.group),
                named(request.topic),
                await self.renew.take(request.receipt_handle),
                request.delivery_attempt,
            )
        except ServiceError as exc:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status_of(exc))
        return svc.ForwardMessageToDeadLetterQueueResponse(status=status())

    @rpc
    async def UpdateOffset(self, request: Any, context: Context) -> Any:
        _not_yet("UpdateOffset")

    @rpc
    async def GetOffset(self, request: Any, context: Context) -> Any:
        _not_yet("GetOffset")

    @rpc
    async def QueryOffset(self, request: Any, context: Context) -> Any:
        _not_yet("QueryOffset")

    @rpc
    async def RecallMessage(self, request: Any, context: Context) -> Any:
        _not_yet("RecallMessage")

    @rpc
    async def SyncLiteSubscription(self, request: Any, context: Context) -> Any:
        _not_yet("SyncLiteSubscription (lite topics)")

    @rpc_stream
    async def PullMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        _not_yet("PullMessage")
        yield  # an async generator, like the streaming RPC it answers


def _endpoints(host: str, port: int) -> Any:
    """One address: IPv4 scheme for an IP, DOMAIN_NAME for a host name (as Apache's proxy)."""
    scheme = v2.IPv4 if host.replace(".", "").isdigit() else v2.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=port)])


def _queue(resource: Any, qid: int, broker: Any) -> Any:
    return v2.MessageQueue(
        topic=resource,
        id=qid,
        permission=v2.READ_WRITE,
        broker=broker,
        accept_message_types=ACCEPTED_TYPES,
    )


def _tx_id(commitlog_offset: int, queue_offset: int) -> str:
    return f"{TX_PREFIX}{commitlog_offset}|{queue_offset}"


def _digest(body: bytes) -> Any:
    """MD5 as uppercase hex: the only form both official SDKs accept."""
    return v2.Digest(type=v2.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def _not_yet(what: str) -> NoReturn:
    raise ServiceError(
        grpc.StatusCode.UNIMPLEMENTED,
        common_pb2.ERROR_REASON_UNSPECIFIED,
        f"{what} is not served by RocketQ's gateway yet; use RocketQ's own API (rocketq.v1) for it",
    )


_SYSTEM_PROPERTIES = frozenset(
    {Prop.UNIQ_KEY, Prop.RETRY_TOPIC, Prop.ORIGIN_MESSAGE_ID, Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID}
)


def add_to_server(gateway: GatewayService, server: grpc.aio.Server) -> None:
    svc_grpc.add_MessagingServiceServicer_to_server(gateway, server)
