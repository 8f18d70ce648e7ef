"""The broker's ``rocketq.v1.Messaging`` gRPC service: wiring, offsets and the client stream.

Send, Pull and the queries live in their processors (``send_processor``, ``pull_processor``,
``query_processor``); this module turns RPCs into calls on them, answers the small offset RPCs
itself, and runs ``ClientStream``:

    client                                   broker
      │ Heartbeat (first, then every 30 s) ──▶ ClientManager.heartbeat → HeartbeatAck pushed
      │ UnregisterClient ────────────────────▶ leave groups (ConsumerIdsChanged to the rest)
      │ ◀── HeartbeatAck / ConsumerIdsChanged / ResetOffsetNotice / CheckTransactionState
      ╵ stream ends (client closes, or the broker expires it after 120 s of silence)
                                               → client forgotten, groups notified

A reader task consumes the client's messages while the handler writes whatever the client's
queue holds, so pushes never wait for the next heartbeat. A heartbeat also does what RocketMQ's
heartbeat does for a consumer group: the subscription group is found or auto-created and, for
clustering consumers, its ``%RETRY%{group}`` topic is created so the group's automatic retry
subscription can be pulled.

LockBatch and UnlockBatch check their queues (this broker's name, a topic it holds, a read
queue) and hand them to the :class:`RebalanceLockManager` (orderly consumption, SPEC §6.15).
ConsumerSendBack lives in ``send_back``: a failed message goes to %DLQ%{group} once its retries
are used up, else to %RETRY%{group} through the timer topic (the timer-wheel service re-puts it
after the level's delay); a push consumer whose send-back fails consumes the message again
itself after 5 s. EndTransaction lives in ``transaction_end`` (commit or roll back a half
message once; the index of resolved transactions is shared with Send and the check service).
"""

# ruff: noqa: N802  (servicer methods carry the proto's RPC names)
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeAlias

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc
from rocketq.validation import (
    PERM_READ,
    PERM_WRITE,
    TOPIC_NAME_MAX_CHARS,
    check_group,
    check_topic,
    retry_topic,
)
from services.broker import request_stream as streams
from services.broker.client_manager import (
    GROUPS_PER_HEARTBEAT_MAX,
    SUBSCRIPTIONS_PER_GROUP_MAX,
    ClientChannel,
    ClientLimitError,
    ClientManager,
)
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.ha_config_sync import SlaveOffsetCommits
from services.broker.model import TopicConfig
from services.broker.pop.processor import PopProcessor
from services.broker.pull_hold import PullHoldService
from services.broker.pull_processor import PullProcessor
from services.broker.query_processor import QueryProcessor
from services.broker.rebalance_lock import QUEUES_PER_REQUEST_MAX, QueueKey, RebalanceLockManager
from services.broker.request_stream import serve_request_stream
from services.broker.send_back import SendBackProcessor
from services.broker.send_processor import SendProcessor
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_end import EndTransactionProcessor
from services.broker.transaction_half import TransactionIndex
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import (
    ServiceError,
    exhausted,
    invalid,
    not_found,
    rpc,
    rpc_stream,
    unavailable,
)
from services.common.telemetry import messaging as telemetry
from services.store.message_store import MessageStore

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
CLIENT_ID_MAX_CHARS = 255


def _group(name: str, what: str = "consumer group") -> None:
    try:
        check_group(name, what)
    except ValueError as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))


def _topic(name: str) -> None:
    try:
        check_topic(name)
    except ValueError as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))


class MessagingService(messaging_pb2_grpc.MessagingServicer):
    """``rocketq.v1.Messaging`` on one broker."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        clients: ClientManager,
        hold: PullHoldService,
        locks: RebalanceLockManager | None = None,
        clock: Clock = SYSTEM_CLOCK,
        transactions: TransactionIndex | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clients = clients
        self.hold = hold
        self.clock = clock
        if clients.group_config is None:
            clients.group_config = groups.get
        self.transactions = transactions if transactions is not None else TransactionIndex()
        self.sender = SendProcessor(
            config=config, store=store, topics=topics, clock=clock, transactions=self.transactions
        )
        self.transaction_ends = EndTransactionProcessor(
            config=config,
            store=store,
            topics=topics,
            offsets=offsets,
            index=self.transactions,
            clock=clock,
            ha_waiter=lambda: self.sender.ha_waiter,
        )
        self.puller = PullProcessor(
            config=config,
            store=store,
            topics=topics,
            groups=groups,
            offsets=offsets,
            clients=clients,
            hold=hold,
            clock=clock,
        )
        self.queries = QueryProcessor(store=store, topics=topics, clock=clock)
        self.locks = locks if locks is not None else RebalanceLockManager(config, clock)
        self.slave_commits: SlaveOffsetCommits | None = None
        """On a slave: takes offset commits while its master is unreachable (server.py sets
        it, and the pull processor's, on slaves)."""
        self.pops = PopProcessor(
            config=config,
            store=store,
            topics=topics,
            groups=groups,
            offsets=offsets,
            hold=hold,
            clock=clock,
            ha_waiter=lambda: self.sender.ha_waiter,
        )
        self.send_backs = SendBackProcessor(
            config=config,
            store=store,
            topics=topics,
            groups=groups,
            clock=clock,
            ha_waiter=lambda: self.sender.ha_waiter,
        )

    # -- produce / consume -----------------------------------------------------------------
    @rpc
    async def Send(
        self, request: messaging_pb2.SendRequest, context: Context
    ) -> messaging_pb2.SendResponse:
        return await telemetry.send(self.sender.send, request, context.peer())

    @rpc  # a coroutine writing through the context (grpc.aio's reader/writer streaming API)
    async def SendStream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[messaging_pb2.SendStreamRequest], context: Context
    ) -> None:
        """Send over one stream (services.broker.request_stream): each request as Send above."""
        sender, peer = self.sender, context.peer()

        def send(request: messaging_pb2.SendRequest) -> Any:
            return telemetry.send(sender.send, request, peer)

        await serve_request_stream(streams.SEND, send, request_iterator, context)

    @rpc
    async def Pull(
        self, request: messaging_pb2.PullRequest, context: Context
    ) -> messaging_pb2.PullResponse:
        return await telemetry.pull(self.puller.pull, request, context)

    @rpc  # a coroutine writing through the context, as SendStream
    async def PullStream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[messaging_pb2.PullStreamRequest], context: Context
    ) -> None:
        """Pull over one stream (services.broker.request_stream): each request as Pull above."""
        puller, request_context = self.puller, streams.RequestContext(context.peer())

        def pull(request: messaging_pb2.PullRequest) -> Any:
            return telemetry.pull(puller.pull, request, request_context)

        await serve_request_stream(streams.PULL, pull, request_iterator, context)

    # -- offsets ---------------------------------------------------------------------------
    def _topic_queue(self, topic: str, queue_id: int) -> TopicConfig:
        """A known topic and one of its queues, or INVALID_ARGUMENT / NOT_FOUND."""
        _topic(topic)
        cfg = self.topics.get(topic)
        if cfg is None:
            not_found(common_pb2.TOPIC_NOT_EXIST, f"topic {topic} does not exist", topic=topic)
        if not 0 <= queue_id < cfg.queue_nums:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"queue id {queue_id} is outside [0, {cfg.queue_nums}) for topic {topic}",
                topic=topic,
            )
        return cfg

    @rpc
    async def UpdateConsumerOffset(
        self, request: messaging_pb2.UpdateConsumerOffsetRequest, context: Context
    ) -> messaging_pb2.UpdateConsumerOffsetResponse:
        # A slave takes commits only while its master is unreachable (consumers reading from
        # it then have nowhere else to commit); ha_config_sync hands them to the master later.
        slave_commits = None if self.config.is_master else self.slave_commits
        if not self.config.is_master and (slave_commits is None or not slave_commits.accepting()):
            unavailable(
                common_pb2.NOT_MASTER, "this broker is a slave; commit offsets to its master"
            )
        _group(request.consumer_group)
        _topic(request.topic)
        if request.queue_id < 0 or request.commit_offset < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "queue id and commit offset must not be negative")
        self._topic_queue(request.topic, request.queue_id)
        # A consumer's position never passes the queue's end: an offset beyond it (a stale or
        # foreign value, 2^62 from a fuzzer) is stored as the end, as a consumer that read
        # everything would commit, instead of making the group skip every future message.
        end = self.store.max_offset(request.topic, request.queue_id)
        offset = min(request.commit_offset, end)
        if offset != request.commit_offset:
            log.warning(
                "group %s committed offset %d beyond the end %d of %s#%d; stored the end",
                request.consumer_group, request.commit_offset, end,
                request.topic, request.queue_id,
            )  # fmt: skip
        (self.offsets if slave_commits is None else slave_commits).commit(
            request.consumer_group,
            request.topic,
            request.queue_id,
            offset,
            client=context.peer(),
        )
        return messaging_pb2.UpdateConsumerOffsetResponse()

    @rpc
    async def QueryConsumerOffset(
        self, request: messaging_pb2.QueryConsumerOffsetRequest, context: Context
    ) -> messaging_pb2.QueryConsumerOffsetResponse:
        _group(request.consumer_group)
        _topic(request.topic)
        if request.queue_id < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"queue id {request.queue_id} is negative")
        offset = self.offsets.query(request.consumer_group, request.topic, request.queue_id)
        if offset < 0:
            not_found(
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"group {request.consumer_group} has no offset for {request.topic} queue "
                f"{request.queue_id}",
                consumer_group=request.consumer_group,
                topic=request.topic,
            )
        return messaging_pb2.QueryConsumerOffsetResponse(offset=offset)

    @rpc
    async def GetMaxOffset(
        self, request: messaging_pb2.GetMaxOffsetRequest, context: Context
    ) -> messaging_pb2.GetMaxOffsetResponse:
        self._topic_queue(request.topic, request.queue_id)
        return messaging_pb2.GetMaxOffsetResponse(
            offset=self.store.max_offset(request.topic, request.queue_id)
        )

    @rpc
    async def GetMinOffset(
        self, request: messaging_pb2.GetMinOffsetRequest, context: Context
    ) -> messaging_pb2.GetMinOffsetResponse:
        self._topic_queue(request.topic, request.queue_id)
        return messaging_pb2.GetMinOffsetResponse(
            offset=self.store.min_offset(request.topic, request.queue_id)
        )

    @rpc
    async def SearchOffsetByTimestamp(
        self, request: messaging_pb2.SearchOffsetByTimestampRequest, context: Context
    ) -> messaging_pb2.SearchOffsetByTimestampResponse:
        self._topic_queue(request.topic, request.queue_id)
        if request.timestamp_ms < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "timestamp_ms must not be negative")
        return messaging_pb2.SearchOffsetByTimestampResponse(
            offset=self.store.offset_by_time(request.topic, request.queue_id, request.timestamp_ms)
        )

    # -- queue locks (orderly consumption) -------------------------------------------------
    def _lock_request(self, group: str, client_id: str) -> None:
        _group(group)
        if not client_id:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "client id is empty")
        if len(client_id) > CLIENT_ID_MAX_CHARS or not client_id.isprintable():
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"client id must be at most {CLIENT_ID_MAX_CHARS} printable characters",
            )

    def _lock_queues(self, queues: Sequence[common_pb2.MessageQueue]) -> list[QueueKey]:
        """The requested queues as (topic, queue_id); INVALID_ARGUMENT for any queue this
        broker cannot lock (another broker name, an unknown topic, not a read queue)."""
        if not queues:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "the request names no queue")
        if len(queues) > QUEUES_PER_REQUEST_MAX:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"the request names {len(queues)} queues; the limit is {QUEUES_PER_REQUEST_MAX}",
            )
        name = self.config.broker_name
        out: list[QueueKey] = []
        for mq in queues:
            if mq.broker_name != name:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"queue {mq.topic}:{mq.queue_id} belongs to broker {mq.broker_name!r}; "
                    f"this is {name!r}",
                    broker_name=name,
                )
            _topic(mq.topic)
            cfg = self.topics.get(mq.topic)
            if cfg is None:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"topic {mq.topic} is not held by broker {name}",
                    topic=mq.topic,
                )
            if not 0 <= mq.queue_id < cfg.read_queue_nums:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"queue id {mq.queue_id} is outside [0, {cfg.read_queue_nums}) for topic "
                    f"{mq.topic}",
                    topic=mq.topic,
                )
            out.append((mq.topic, mq.queue_id))
        return out

    @rpc
    async def LockBatch(
        self, request: messaging_pb2.LockBatchRequest, context: Context
    ) -> messaging_pb2.LockBatchResponse:
        if not self.config.is_master:
            unavailable(common_pb2.NOT_MASTER, "this broker is a slave; lock queues on its master")
        self._lock_request(request.consumer_group, request.client_id)
        queues = self._lock_queues(request.queues)
        held = self.locks.try_lock_batch(request.consumer_group, request.client_id, queues)
        name = self.config.broker_name
        return messaging_pb2.LockBatchResponse(
            locked_queues=[
                common_pb2.MessageQueue(topic=topic, broker_name=name, queue_id=qid)
                for topic, qid in held
            ]
        )

    @rpc
    async def UnlockBatch(
        self, request: messaging_pb2.UnlockBatchRequest, context: Context
    ) -> messaging_pb2.UnlockBatchResponse:
        self._lock_request(request.consumer_group, request.client_id)
        if len(request.queues) > QUEUES_PER_REQUEST_MAX:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"the request names {len(request.queues)} queues; the limit is "
                f"{QUEUES_PER_REQUEST_MAX}",
            )
        # Locks are released, never checked: a queue this broker cannot hold is simply not
        # locked, and a slave holds no locks at all.
        name = self.config.broker_name
        self.locks.unlock_batch(
            request.consumer_group,
            request.client_id,
            [(mq.topic, mq.queue_id) for mq in request.queues if mq.broker_name == name],
        )
        return messaging_pb2.UnlockBatchResponse()

    # -- consume retry ---------------------------------------------------------------------
    @rpc
    async def ConsumerSendBack(
        self, request: messaging_pb2.ConsumerSendBackRequest, context: Context
    ) -> messaging_pb2.ConsumerSendBackResponse:
        return await self.send_backs.send_back(request)

    # -- transactions ----------------------------------------------------------------------
    @rpc
    async def EndTransaction(
        self, request: messaging_pb2.EndTransactionRequest, context: Context
    ) -> messaging_pb2.EndTransactionResponse:
        return await self.transaction_ends.end(request)

    # -- queries ---------------------------------------------------------------------------
    @rpc
    async def QueryMessageByKey(
        self, request: messaging_pb2.QueryMessageByKeyRequest, context: Context
    ) -> messaging_pb2.QueryMessageByKeyResponse:
        return self.queries.by_key(request)

    @rpc
    async def QueryMessageById(
        self, request: messaging_pb2.QueryMessageByIdRequest, context: Context
    ) -> messaging_pb2.QueryMessageByIdResponse:
        return self.queries.by_id(request)

    @rpc
    async def ViewMessage(
        self, request: messaging_pb2.ViewMessageRequest, context: Context
    ) -> messaging_pb2.ViewMessageResponse:
        return self.queries.view(request)

    @rpc
    async def GetConsumerIdList(
        self, request: messaging_pb2.GetConsumerIdListRequest, context: Context
    ) -> messaging_pb2.GetConsumerIdListResponse:
        _group(request.consumer_group)
        return messaging_pb2.GetConsumerIdListResponse(
            consumer_ids=self.clients.consumer_ids(request.consumer_group)
        )

    # -- pop consumption (services/broker/pop) ---------------------------------------------
    @rpc
    async def Pop(
        self, request: messaging_pb2.PopRequest, context: Context
    ) -> messaging_pb2.PopResponse:
        return await self.pops.pop(request, context)

    @rpc
    async def Ack(
        self, request: messaging_pb2.AckRequest, context: Context
    ) -> messaging_pb2.AckResponse:
        return await self.pops.ack(request)

    @rpc
    async def ChangeInvisibleTime(
        self, request: messaging_pb2.ChangeInvisibleTimeRequest, context: Context
    ) -> messaging_pb2.ChangeInvisibleTimeResponse:
        return await self.pops.change_invisible_time(request)

    # -- client stream ---------------------------------------------------------------------
    @rpc_stream
    async def ClientStream(
        self, request_iterator: AsyncIterator[messaging_pb2.ClientStreamRequest], context: Context
    ) -> AsyncIterator[messaging_pb2.ClientStreamResponse]:
        requests = request_iterator.__aiter__()
        try:
            first = await requests.__anext__()
        except StopAsyncIteration:
            return
        if first.WhichOneof("command") != "heartbeat":
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                "the first message on ClientStream must be a Heartbeat",
            )
        self._check_heartbeat(first.heartbeat)
        try:
            channel = self.clients.open_channel(first.heartbeat.client_id, context.peer())
        except ClientLimitError as exc:
            exhausted(common_pb2.FLOW_CONTROL, str(exc))
        failure: list[ServiceError] = []
        reader: asyncio.Task[None] | None = None
        reason = "stream ended"
        try:
            self._on_heartbeat(channel, first.heartbeat)
            reader = asyncio.create_task(self._read_stream(requests, channel, failure))
            queue = channel.queue
            while True:
                item = await queue.get()
                if item is None or channel.closed:
                    break
                yield item
            if failure:
                reason = failure[0].message
                raise failure[0]
        finally:
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            self.clients.close_channel(channel, reason)

    async def _read_stream(
        self,
        requests: AsyncIterator[messaging_pb2.ClientStreamRequest],
        channel: ClientChannel,
        failure: list[ServiceError],
    ) -> None:
        """Handle the client's messages after the first; close the channel when they end."""
        try:
            async for req in requests:
                kind = req.WhichOneof("command")
                if kind == "heartbeat":
                    if req.heartbeat.client_id != channel.client_id:
                        invalid(
                            common_pb2.ILLEGAL_ARGUMENT,
                            f"heartbeat for client {req.heartbeat.client_id!r} on the stream of "
                            f"{channel.client_id!r}; one stream serves one client id",
                        )
                    self._check_heartbeat(req.heartbeat)
                    self._on_heartbeat(channel, req.heartbeat)
                elif kind == "unregister":
                    self.clients.unregister(channel, req.unregister)
                else:
                    invalid(common_pb2.ILLEGAL_ARGUMENT, "empty ClientStreamRequest")
        except ServiceError as exc:
            failure.append(exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken stream must end the stream, never the broker
            log.exception("client %s: stream read failed", channel.client_id)
        finally:
            channel.close()

    def _check_heartbeat(self, hb: messaging_pb2.Heartbeat) -> None:
        if not hb.client_id:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "heartbeat has an empty client id")
        if len(hb.client_id) > CLIENT_ID_MAX_CHARS:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"client id is {len(hb.client_id)} characters; the limit is {CLIENT_ID_MAX_CHARS}",
            )
        if len(hb.producers) + len(hb.consumers) > GROUPS_PER_HEARTBEAT_MAX:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"heartbeat names more than {GROUPS_PER_HEARTBEAT_MAX} groups",
            )
        for p in hb.producers:
            _group(p.producer_group, "producer group")
        for c in hb.consumers:
            _group(c.consumer_group)
            if len(c.subscriptions) > SUBSCRIPTIONS_PER_GROUP_MAX:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"group {c.consumer_group} subscribes to more than "
                    f"{SUBSCRIPTIONS_PER_GROUP_MAX} topics",
                )
            for s in c.subscriptions:
                _topic(s.topic)

    def _on_heartbeat(self, channel: ClientChannel, hb: messaging_pb2.Heartbeat) -> None:
        """Register the heartbeat; make sure each consumer group and its retry topic exist."""
        for c in hb.consumers:
            group_cfg = self.groups.find_or_create(c.consumer_group)
            if group_cfg is None or c.message_model == messaging_pb2.BROADCASTING:
                continue
            topic = retry_topic(c.consumer_group)
            if (
                group_cfg.retry_queue_nums > 0
                and len(topic) <= TOPIC_NAME_MAX_CHARS
                and self.topics.get(topic) is None
            ):
                self.topics.create_system_topic(
                    topic, group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE
                )
        self.clients.heartbeat(channel, hb)
