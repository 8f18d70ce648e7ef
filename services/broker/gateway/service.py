"""``apache.rocketmq.v2.MessagingService`` on a broker: the official RocketMQ 5 SDKs' protocol.

Served on ``gatewayPort`` (8081 by default, 0 = off) by its own grpc.aio server, beside the
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
| PullMessage, UpdateOffset, | the broker's pull and consumer offsets (gateway/pull.py)      |
| GetOffset, QueryOffset     |                                                               |
| (access control)           | with aclEnable, the SDKs' signatures against the ACL file and |
|                            | the broker port's rules; refusals as UNAUTHORIZED / FORBIDDEN |
|                            | statuses (gateway/auth.py)                                    |
| Telemetry server commands  | thread stack / verify message asked by an admin (Admin        |
|                            | AskGatewayClient, ``rocketq gateway ask``: gateway/commands.py) |
| RecallMessage              | a cancel marker for the delayed message's timer, through the  |
|                            | broker's Send like TimerClient.cancel (gateway/recall.py)     |
| (FIFO groups)              | message_group is stored as __SHARDINGKEY; pop holds each      |
|                            | group, not the queue (services/broker/pop/fifo.py)            |
| (message types)            | a topic's TopicConfig.message_type in QueryRoute; a send of   |
|                            | another type refused (gateway/message_types.py)               |
| (settings)                 | from the broker's gateway keys and the group's retry policy   |
|                            | (gateway/settings.py)                                         |

Not yet: lite topics (SyncLiteSubscription answers UNIMPLEMENTED with a message).
The facts behind the choices are in the shared brief v2-protocol.md.
"""

# ruff: noqa: N802  (servicer methods carry the proto's RPC names)
from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeAlias

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
    nameserver_pb2_grpc,
)
from rocketq.client.security import security_channel
from rocketq.codec import Prop
from rocketq.java_hash import java_string_hash
from services.broker.config import GATEWAY_LONG_POLLING_MIN_MS, BrokerConfig
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from services.broker.gateway.commands import ClientCommands
from services.broker.gateway.message_types import accepted_types, conflict
from services.broker.gateway.pull import PullOffsets
from services.broker.gateway.recall import Recaller, recall_handle_of
from services.broker.gateway.renew import RenewTable
from services.broker.gateway.sdk_compat import (
    change_invisible_ms,
    store_message_group,
)
from services.broker.gateway.settings import group_of, settings_for
from services.broker.gateway.telemetry import TelemetrySession, client_id_of, heartbeat
from services.broker.gateway.v2common import (
    SYSTEM_PROPERTIES,
    digest,
    message_of,
    named,
    status,
    status_of,
)
from services.broker.gateway.v2common import duration as _duration
from services.broker.gateway.v2common import ms_of as _ms
from services.broker.gateway.v2common import timestamp as _timestamp
from services.broker.messaging_service import MessagingService
from services.common.errors import ServiceError, rpc, rpc_stream

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
ROUTE_TIMEOUT_S = 3.0
ROUTE_CHANNEL_OPTIONS: list[tuple[str, Any]] = []
GATEWAY_PRODUCER_GROUP = "rmq_v2_gateway"
"""The producer group of every message sent through the gateway (v2 messages name none)."""
TX_PREFIX = "rq1tx|"
_RESOLUTIONS = {
    v2.COMMIT: messaging_pb2.TRANSACTION_COMMIT,
    v2.ROLLBACK: messaging_pb2.TRANSACTION_ROLLBACK,
}


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
        self.pulls = PullOffsets(messaging)
        self.commands = ClientCommands(messaging.queries)
        """Connected clients, for the Admin RPC AskGatewayClient (gateway/commands.py)."""

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
        accept = accepted_types(cfg.message_type)
        return [_queue(resource, qid, broker, accept) for qid in range(cfg.queue_nums)]

    async def _routed_queues(self, resource: Any, topic: str) -> list[Any] | None:
        """None when no nameserver could be asked (not configured, or none answered)."""
        for addr in self.config.namesrv_addrs:
            try:
                # TLS and the internal user's signature when the nameservers require them
                async with security_channel(addr, ROUTE_CHANNEL_OPTIONS) as channel:
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
                    _queue(resource, qid, broker, accepted_types(qd.message_type))
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
                v2.Assignment(
                    message_queue=_queue(request.topic, -1, broker, queues[0].accept_message_types)
                )
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
            commands=self.commands,
        )
        async for item in session.run(request_iterator):
            yield item

    def _check_command(self, check: messaging_pb2.CheckTransactionState) -> Any:
        stored = check.message
        props = dict(stored.message.properties)
        message = v2.Message(
            topic=v2.Resource(name=stored.message.topic),
            user_properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES},
            system_properties=v2.SystemProperties(
                tag=props.get(Prop.TAGS, ""),
                keys=[k for k in props.get(Prop.KEYS, "").split(" ") if k],
                message_id=stored.msg_id,
                body_digest=digest(stored.message.body),
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
        """From the broker's config and the consumer group's (gateway/settings.py)."""
        return settings_for(client, self.config, group_of(client, self.messaging.groups))

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
        # FIFO pop orders per message group (pop/fifo.py); given back on delivery (sdk_compat)
        store_message_group(sp, props)
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
        refused = conflict(cfg, message) if self.config.gateway_validate_message_type else None
        if refused is not None:  # the topic's message type (gateway/message_types.py)
            return svc.SendResultEntry(status=refused, message_id=msg_id)
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
            recall_handle=recall_handle_of(  # a delayed message's (gateway/recall.py)
                self.config.broker_name,
                topic,
                props,
                msg_id or result.msg_id,
                self.messaging.clock.now_ms(),
            ),
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
        poll_max_ms = self.config.gateway_long_polling_timeout_ms
        batch_max = self.config.gateway_receive_batch_size
        poll_ms = (
            _ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else poll_max_ms
        )
        if not GATEWAY_LONG_POLLING_MIN_MS <= poll_ms <= poll_max_ms:
            yield svc.ReceiveMessageResponse(
                status=status(
                    v2.ILLEGAL_POLLING_TIME,
                    f"long_polling_timeout {poll_ms} ms is outside {GATEWAY_LONG_POLLING_MIN_MS}"
                    f"..{poll_max_ms} ms (gatewayLongPollingTimeoutMs)",
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
            max_msg_nums=max(1, min(request.batch_size or batch_max, batch_max)),
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
            resp = svc.ReceiveMessageResponse()  # CopyFrom: see pull.py
            resp.message.CopyFrom(self._message(m, invisible_ms, request.message_queue.topic))
            yield resp
        now = self.messaging.clock.now_ms()
        yield svc.ReceiveMessageResponse(delivery_timestamp=_timestamp(now))

    def _message(self, popped: messaging_pb2.PoppedMessage, invisible_ms: int, topic: Any) -> Any:
        return message_of(
            popped.message,
            topic,
            receipt_handle=popped.receipt_handle,
            invisible_duration=_duration(invisible_ms),
            delivery_attempt=popped.delivery_attempt,
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

    # -- pull consumers: gateway/pull.py ----------------------------------------------------
    @rpc
    async def UpdateOffset(self, request: Any, context: Context) -> Any:
        return self.pulls.update_offset(request, context.peer())

    @rpc
    async def GetOffset(self, request: Any, context: Context) -> Any:
        return self.pulls.get_offset(request)

    @rpc
    async def QueryOffset(self, request: Any, context: Context) -> Any:
        return self.pulls.query_offset(request)

    @rpc_stream
    async def PullMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        async for response in self.pulls.pull(request, context):
            yield response

    @rpc
    async def RecallMessage(self, request: Any, context: Context) -> Any:
        """Cancel a delayed message by its recall handle (gateway/recall.py)."""

        async def gateways() -> dict[str, str]:
            queues = await self._routed_queues(request.topic, named(request.topic)) or []
            return {
                q.broker.name: f"{a.host}:{a.port}"
                for q in queues
                for a in q.broker.endpoints.addresses[:1]
            }

        return await Recaller(self.config, self.messaging).recall(
            named(request.topic), request.recall_handle, context.peer(), gateways
        )

    @rpc
    async def SyncLiteSubscription(self, request: Any, context: Context) -> Any:
        _not_yet("SyncLiteSubscription (lite topics)")


def _endpoints(host: str, port: int) -> Any:
    """One address: IPv4 scheme for an IP, DOMAIN_NAME for a host name (as Apache's proxy)."""
    scheme = v2.IPv4 if host.replace(".", "").isdigit() else v2.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=port)])


def _queue(resource: Any, qid: int, broker: Any, accept: Any) -> Any:
    return v2.MessageQueue(
        topic=resource,
        id=qid,
        permission=v2.READ_WRITE,
        broker=broker,
        accept_message_types=accept,  # the topic's message type (gateway/message_types.py)
    )


def _tx_id(commitlog_offset: int, queue_offset: int) -> str:
    return f"{TX_PREFIX}{commitlog_offset}|{queue_offset}"


def _not_yet(what: str) -> NoReturn:
    raise ServiceError(
        grpc.StatusCode.UNIMPLEMENTED,
        common_pb2.ERROR_REASON_UNSPECIFIED,
        f"{what} is not served by RocketQ's gateway yet; use RocketQ's own API (rocketq.v1) for it",
    )


def add_to_server(gateway: GatewayService, server: grpc.aio.Server) -> None:
    svc_grpc.add_MessagingServiceServicer_to_server(gateway, server)
