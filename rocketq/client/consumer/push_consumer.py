"""The push consumer: RocketMQ's ``DefaultMQPushConsumer`` on asyncio (SPEC §6.1–§6.13).

"Push" is pulling with long polling (SPEC §6.1): for every queue this consumer owns, a task
pulls with a 15 s broker hold and hands what arrives to the listener. The pieces:

    PushConsumer ── subscribe/start/close, the ConsumerHandle the ClientInstance calls
      ├── RebalanceImpl + RebalanceService   which queues are ours (every 20 s, and at once
      │                                       when a broker says the group's members changed)
      ├── PullService (Puller)               one long-polling loop per owned queue
      ├── ConsumeService                     listener calls, results, offsets, local retries
      │   or ConsumeOrderlyService           (orderly=True: one call per queue at a time)
      └── OffsetStore                        broker (clustering) or offsets.json (broadcasting),
                                             persisted every 5 s and on close

Orderly consumption (``orderly=True``, SPEC §6.15) in clustering mode also locks every owned
queue on its broker (at allocation, renewed every ``rebalance_lock_interval_ms``) and pulls and
consumes a queue only while the lock is held; see ``_rebalance`` and ``_consume_orderly``.

Start (SPEC §6.3): copy the subscriptions (plus ``%RETRY%{group}`` with "*" in clustering
mode), pick the client id (instance "DEFAULT" becomes "{pid}#{ns}" in clustering mode, so every
consumer object is its own group member), load the offset store, register with the shared
ClientInstance, heartbeat every broker, rebalance.

Clean close: stop rebalancing and pulling, let running listener calls finish (up to
``await_termination_ms``), persist offsets, release the queue locks (orderly), then unregister
from the brokers — in that order, so the members that take over this consumer's queues (the
brokers tell them at once) read offsets that include everything it consumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client._instance import ClientInstance
from rocketq.client._request_stream import PULL, open_streams
from rocketq.client._route import TopicRoute
from rocketq.client.consumer._api import BrokerApi
from rocketq.client.consumer._common import (
    OffsetSourceImpl,
    SubscriptionConflicts,
    client_config,
    make_offset_store,
    readable_queues,
)
from rocketq.client.consumer._consume import ConsumeService
from rocketq.client.consumer._consume_orderly import ConsumeOrderlyService
from rocketq.client.consumer._pull import Puller, PullService, PullSettings
from rocketq.client.consumer._rebalance import (
    PullRequest,
    RebalanceImpl,
    RebalanceService,
    compute_pull_from_where,
)
from rocketq.client.consumer._subscription import SUB_ALL, Subscription, build_subscription
from rocketq.client.consumer.allocate import AllocateAveragely
from rocketq.client.consumer.config import (
    ConsumeFromWhere,
    ExpressionType,
    MessageListener,
    MessageModel,
    OrderlyMessageListener,
    PushConsumerConfig,
    SubscriptionConflict,
    parse_consume_timestamp,
)
from rocketq.client.consumer.offset_store import OffsetStore
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.errors import ClientStateError, RocketQError, TopicNotFoundError
from rocketq.message import MessageQueue, ReceivedMessage
from rocketq.validation import RETRY_GROUP_TOPIC_PREFIX, retry_topic

log = logging.getLogger(__name__)

PERSIST_INITIAL_DELAY_S = 10.0
"""RocketMQ's first offset persist comes 10 s after start, then every interval (SPEC §6.12)."""

OFFSET_ILLEGAL_RESTART_DELAY_S = 1.0
"""A queue dropped for an illegal offset restarts this much later from the corrected offset
(RocketMQ waits for the next rebalance; a pause keeps a misbehaving broker from a tight loop)."""

_CONSUME_FROM_PB = {
    ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET: messaging_pb2.CONSUME_FROM_LAST_OFFSET,
    ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET: messaging_pb2.CONSUME_FROM_FIRST_OFFSET,
    ConsumeFromWhere.CONSUME_FROM_TIMESTAMP: messaging_pb2.CONSUME_FROM_TIMESTAMP,
}
_MODEL_PB = {
    MessageModel.CLUSTERING: messaging_pb2.CLUSTERING,
    MessageModel.BROADCASTING: messaging_pb2.BROADCASTING,
}


class _Handle:
    """The ConsumerHandle the ClientInstance calls; kept apart from the public class."""

    def __init__(self, consumer: PushConsumer) -> None:
        self._c = consumer

    def consumer_data(self) -> messaging_pb2.ConsumerData:
        return self._c._consumer_data()

    def topics(self) -> list[str]:
        return sorted(self._c._subscriptions)

    def on_route_changed(self, topic: str, route: TopicRoute) -> None:
        if topic in self._c._subscriptions:
            self._c._spawn(self._c._heartbeat_then_rebalance())

    def on_consumer_ids_changed(self) -> None:
        if self._c._rebalance_service is not None:
            log.info("group %s: members changed; rebalancing now", self._c.config.consumer_group)
            self._c._rebalance_service.wakeup()

    def on_reset_offset(self, topic: str, broker_name: str, offsets: dict[int, int]) -> None:
        self._c._spawn(self._c._reset_offset(topic, broker_name, offsets))

    def on_subscription_conflict(self, conflict: common_pb2.SubscriptionConflict) -> None:
        self._c._conflicts.on_notice(conflict)


class PushConsumer:
    """Consumes subscribed topics by calling ``listener`` with batches of messages.

    ``listener(messages, context)`` returns :attr:`ConsumeResult.CONSUME_SUCCESS` or
    :attr:`ConsumeResult.RECONSUME_LATER` (None or an exception count as the latter). A plain
    function runs on a pool of ``consume_thread_max`` threads, a coroutine function on the
    event loop; either may be called concurrently. Use as ``async with PushConsumer(...)`` or
    call :meth:`start` and :meth:`close`.

    With ``orderly=True`` (SPEC §6.15) each queue's messages reach ``listener(messages,
    ConsumeOrderlyContext)`` in offset order, one call per queue at a time, and it returns
    ``ConsumeOrderlyStatus.SUCCESS`` or ``SUSPEND_CURRENT_QUEUE_A_MOMENT`` (None or an
    exception count as the latter: the batch is redelivered locally after
    ``suspend_current_queue_time_ms``). In clustering mode every owned queue is locked on its
    broker, so no two members consume one queue at once, even during a rebalance.
    """

    def __init__(
        self,
        config: PushConsumerConfig,
        listener: MessageListener | OrderlyMessageListener,
        *,
        orderly: bool = False,
    ) -> None:
        if not callable(listener):
            raise TypeError("listener must be callable: listener(messages, context) -> result")
        self.config = config
        self.orderly = orderly
        """True for orderly consumption (queue locks, one call per queue at a time)."""
        self._listener = listener
        self._conflicts = SubscriptionConflicts(config.consumer_group, log)
        self._subscriptions: dict[str, Subscription] = {}
        self._state = "CREATED"
        self._paused = False
        self._handle = _Handle(self)
        self._instance: ClientInstance | None = None
        self._offset_store: OffsetStore | None = None
        self._rebalance: RebalanceImpl | None = None
        self._rebalance_service: RebalanceService | None = None
        self._pull_service: PullService | None = None
        self._consume: ConsumeService | ConsumeOrderlyService | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self.client_id = ""
        """``ip@instance`` once started."""

    # ---- subscriptions ----------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        expression: str = SUB_ALL,
        expression_type: ExpressionType = ExpressionType.TAG,
    ) -> None:
        """Consume ``topic``: all of it ("*"), some tags ("TagA || TagB"), or a SQL92 filter.

        Allowed before and after start; a later call for the same topic replaces the
        expression. Every member of the group must subscribe alike (SPEC §6.17).
        """
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise ValueError(f"{topic!r} is a retry topic; the consumer subscribes to it itself")
        self._subscriptions[topic] = build_subscription(topic, expression, expression_type)
        self._subscriptions_changed()

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``; its queues are released at the next rebalance (now)."""
        if self._subscriptions.pop(topic, None) is not None:
            self._subscriptions_changed()

    def subscriptions(self) -> dict[str, str]:
        """Topic -> expression, including the automatic retry subscription once started."""
        return {t: s.expression for t, s in self._subscriptions.items()}

    def _subscriptions_changed(self) -> None:
        if self._state != "RUNNING" or self._rebalance is None:
            return
        self._rebalance.topics = set(self._subscriptions)
        assert self._instance is not None
        self._spawn(self._instance.heartbeat_now())
        if self._rebalance_service is not None:
            self._rebalance_service.wakeup()

    def _subscription_of(self, topic: str) -> Subscription | None:
        return self._subscriptions.get(topic)

    # ---- life cycle -------------------------------------------------------------------------

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Join the group and start consuming (SPEC §6.3)."""
        if self._state != "CREATED":
            raise ClientStateError(f"this consumer is {self._state.lower()}; create a new one")
        cfg = self.config
        clustering = cfg.message_model is MessageModel.CLUSTERING
        if clustering:
            group_retry = retry_topic(cfg.consumer_group)
            self._subscriptions[group_retry] = build_subscription(group_retry, SUB_ALL)
        instance = ClientInstance.get(
            client_config(
                namesrv_addrs=cfg.namesrv_addrs,
                instance_name=cfg.instance_name,
                client_ip=cfg.client_ip,
                message_model=cfg.message_model,
                poll_name_server_interval_ms=cfg.poll_name_server_interval_ms,
                heartbeat_broker_interval_ms=cfg.heartbeat_broker_interval_ms,
                request_timeout_ms=cfg.request_timeout_ms,
                security=cfg.security,
            )
        )
        self._instance = instance
        self.client_id = instance.client_id
        streams = open_streams(
            instance.messaging, PULL, enabled=cfg.pull_stream, security=cfg.security
        )
        api = BrokerApi(instance, cfg.consumer_group, cfg.request_timeout_ms, streams)
        self._api = api
        store = make_offset_store(
            api,
            client_id=self.client_id,
            group=cfg.consumer_group,
            message_model=cfg.message_model,
            offset_store_dir=cfg.offset_store_dir,
        )
        await store.load()
        self._offset_store = store
        self._wire(api, store, clustering)
        try:
            instance.register_consumer(cfg.consumer_group, self._handle)
        except ValueError as exc:
            raise ClientStateError(str(exc)) from None
        self._state = "RUNNING"
        try:
            await instance.start()
            await self._prefetch_routes()
            await instance.heartbeat_now()
        except BaseException:
            self._state = "CLOSED"
            await instance.unregister_consumer(cfg.consumer_group)
            await instance.close()
            raise
        assert self._rebalance_service is not None
        self._rebalance_service.start()
        self._spawn(self._persist_loop())
        if self.orderly:
            if clustering:
                self._spawn(self._lock_loop())
        else:  # an orderly call holds its queue by design: no consume timeout (SPEC §6.13)
            self._spawn(self._expiry_loop())
        log.info("group %s: push consumer %s started", cfg.consumer_group, self.client_id)

    def _wire(self, api: BrokerApi, store: OffsetStore, clustering: bool) -> None:
        cfg = self.config
        locker = api if self.orderly and clustering else None
        consume = self._consume = self._make_consume_service(store)
        settings = PullSettings(
            clustering=clustering,
            pull_batch_size=cfg.pull_batch_size,
            pull_interval_ms=cfg.pull_interval_ms,
            pull_threshold_for_queue=cfg.pull_threshold_for_queue,
            pull_threshold_size_for_queue_mib=cfg.pull_threshold_size_for_queue_mib,
            consume_concurrently_max_span=(
                None if self.orderly else cfg.consume_concurrently_max_span
            ),
            broker_suspend_max_time_ms=cfg.broker_suspend_max_time_ms,
            consumer_timeout_when_suspend_ms=cfg.consumer_timeout_when_suspend_ms,
            orderly=self.orderly,
            rebalance_lock_max_live_ms=cfg.rebalance_lock_max_live_ms,
        )
        assert self._instance is not None
        self._rebalance = RebalanceImpl(
            group=cfg.consumer_group,
            client_id=self.client_id,
            message_model=cfg.message_model,
            strategy=cfg.allocate_strategy or AllocateAveragely(),
            queues_of=self._queues_of,
            consumer_ids=api.consumer_ids,
            compute_offset=self._compute_offset,
            remove_queue=self._remove_queue,
            dispatch=self._dispatch,
            locker=locker,
            forget_offset=store.remove_offset,
        )
        self._rebalance.topics = set(self._subscriptions)
        self._pull_service = PullService(
            group=cfg.consumer_group,
            puller=Puller(api, cfg.consumer_group, cfg.pull_inflight_max),
            settings=settings,
            offset_store=store,
            subscription_of=self._subscription_of,
            submit=consume.submit,
            remove_queue=self._rebalance.remove_process_queue,
            on_offset_illegal=self._restart_queues_soon,
            heartbeat=self._instance.heartbeat_now,
            is_paused=lambda: self._paused,
            compute_offset=self._compute_offset,
            on_refused=self._conflicts.log_refused_pull,
        )
        self._rebalance_service = RebalanceService(
            self._rebalance.do_rebalance, cfg.rebalance_interval_ms, cfg.consumer_group
        )

    def _make_consume_service(self, store: OffsetStore) -> ConsumeService | ConsumeOrderlyService:
        cfg = self.config
        if self.orderly:
            return ConsumeOrderlyService(
                group=cfg.consumer_group,
                listener=self._listener,  # type: ignore[arg-type]  # orderly=True promised it
                message_model=cfg.message_model,
                batch_max_size=cfg.consume_message_batch_max_size,
                thread_max=cfg.consume_thread_max,
                offset_store=store,
                send_back=self._send_back,
                max_reconsume_times=cfg.max_reconsume_times,
                suspend_time_ms=cfg.suspend_current_queue_time_ms,
                lock_max_live_ms=cfg.rebalance_lock_max_live_ms,
                lock_one=self._lock_one,
            )
        return ConsumeService(
            group=cfg.consumer_group,
            listener=self._listener,  # type: ignore[arg-type]  # orderly=False promised it
            message_model=cfg.message_model,
            batch_max_size=cfg.consume_message_batch_max_size,
            thread_max=cfg.consume_thread_max,
            offset_store=store,
            send_back=self._send_back,
            consume_timeout_ms=cfg.consume_timeout_minutes * 60_000,
        )

    async def _lock_one(self, mq: MessageQueue) -> bool:
        return self._rebalance is not None and await self._rebalance.lock_one(mq)

    async def _prefetch_routes(self) -> None:
        """Fetch routes of subscribed topics now (RocketMQ's updateTopicSubscribeInfo...)."""
        assert self._instance is not None
        for topic in sorted(self._subscriptions):
            try:
                await self._instance.get_route(topic)
            except TopicNotFoundError:
                if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    log.warning(
                        "group %s: topic %s has no route yet; consuming it once it has",
                        self.config.consumer_group,
                        topic,
                    )
            except RocketQError as exc:
                log.warning("group %s: route of %s: %s", self.config.consumer_group, topic, exc)

    async def close(self) -> None:
        """Leave the group cleanly: finish running calls, persist offsets, unregister."""
        if self._state != "RUNNING":
            self._state = "CLOSED"
            return
        self._state = "CLOSING"
        cfg = self.config
        if self._rebalance_service is not None:
            await self._rebalance_service.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        assert self._pull_service and self._consume and self._rebalance and self._offset_store
        await self._pull_service.close()
        assert self._api is not None
        await self._api.close()
        await self._consume.shutdown(cfg.await_termination_ms)
        owned = self._rebalance.owned()
        await self._offset_store.persist_all(owned)
        await self._rebalance.unlock_all()  # orderly: the next owners may start now
        await self._rebalance.drop_all()
        assert self._instance is not None
        await self._instance.unregister_consumer(cfg.consumer_group)
        await self._instance.close()
        self._state = "CLOSED"
        log.info("group %s: push consumer %s closed", cfg.consumer_group, self.client_id)

    def suspend(self) -> None:
        """Pause pulling (messages already pulled are still consumed)."""
        self._paused = True

    def resume(self) -> None:
        """Resume pulling after :meth:`suspend`."""
        self._paused = False

    # ---- introspection ----------------------------------------------------------------------

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this consumer owns now (all subscribed topics, retry topic included)."""
        return self._rebalance.owned() if self._rebalance is not None else []

    def consume_offsets(self, topic: str = "") -> dict[MessageQueue, int]:
        """This consumer's in-memory offsets (next message to consume), by queue."""
        if self._offset_store is None:
            return {}
        return self._offset_store.clone_offset_table(topic)

    def subscription_conflicts(self) -> list[SubscriptionConflict]:
        """Topics whose group members subscribe differently, as the brokers last reported
        (SPEC §6.17); empty when the group agrees. While ``pulls_refused``, nothing of that
        topic is consumed (and nothing is skipped) until the members agree."""
        return self._conflicts.current()

    async def persist_offsets(self) -> None:
        """Write the in-memory offsets now instead of at the next 5 s tick."""
        if self._offset_store is not None and self._rebalance is not None:
            await self._rebalance.persist_owned(self._offset_store.persist_all)

    # ---- collaborators' callbacks -----------------------------------------------------------

    def _consumer_data(self) -> messaging_pb2.ConsumerData:
        cfg = self.config
        return messaging_pb2.ConsumerData(
            consumer_group=cfg.consumer_group,
            consume_type=messaging_pb2.CONSUME_TYPE_PUSH,
            message_model=_MODEL_PB[cfg.message_model],
            consume_from_where=_CONSUME_FROM_PB[cfg.consume_from_where],
            consume_timestamp_ms=parse_consume_timestamp(cfg.consume_timestamp),
            subscriptions=[s.to_pb() for _t, s in sorted(self._subscriptions.items())],
            consume_orderly=self.orderly,
        )

    async def _queues_of(self, topic: str) -> list[MessageQueue]:
        assert self._instance is not None
        return await readable_queues(self._instance, topic)

    async def _compute_offset(self, mq: MessageQueue) -> int:
        assert self._offset_store is not None
        return await compute_pull_from_where(
            mq,
            self.config.consume_from_where,
            parse_consume_timestamp(self.config.consume_timestamp),
            OffsetSourceImpl(self._offset_store, self._api),
        )

    async def _remove_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """A queue leaves this consumer: persist its offset for the next owner, forget it."""
        assert self._offset_store is not None
        await self._offset_store.persist(mq)
        self._offset_store.remove_offset(mq)
        return True

    def _dispatch(self, requests: list[PullRequest]) -> None:
        if self._pull_service is not None and self._state == "RUNNING":
            self._pull_service.execute(requests)

    async def _send_back(self, mq: MessageQueue, msg: ReceivedMessage, delay_level: int) -> bool:
        try:
            await self._api.send_back(mq, msg, delay_level, self.config.max_reconsume_times)
        except RocketQError as exc:
            log.info(
                "group %s: send-back of %s failed (%s); consuming it again locally",
                self.config.consumer_group,
                msg.msg_id,
                exc,
            )
            return False
        return True

    async def _reset_offset(self, topic: str, broker_name: str, offsets: dict[int, int]) -> None:
        """An admin reset the group's offsets: drop cached messages, restart from the reset."""
        if self._rebalance is None or self._offset_store is None:
            return
        for queue_id, offset in sorted(offsets.items()):
            mq = MessageQueue(topic, broker_name, queue_id)
            pq = self._rebalance.process_queue_table.get(mq)
            if pq is not None:
                pq.dropped = True
                pq.clear()
            self._offset_store.update_offset(mq, offset, increase_only=False)
            await self._rebalance.remove_process_queue(mq)
        log.info(
            "group %s: offsets of %s on %s reset", self.config.consumer_group, topic, broker_name
        )
        if self._rebalance_service is not None:
            self._rebalance_service.wakeup()

    async def _heartbeat_then_rebalance(self) -> None:
        """A route changed: let its (maybe new) brokers know us first, or they would answer
        the rebalance with a member list without us."""
        if self._instance is not None:
            with contextlib.suppress(Exception):
                await self._instance.heartbeat_now()
        if self._rebalance_service is not None:
            self._rebalance_service.wakeup()

    def _restart_queues_soon(self) -> None:
        """After an illegal offset dropped a queue: rebalance (restarting it) in a moment."""

        async def later() -> None:
            await asyncio.sleep(OFFSET_ILLEGAL_RESTART_DELAY_S)
            if self._rebalance_service is not None:
                self._rebalance_service.wakeup()

        self._spawn(later())

    # ---- background loops -------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        if self._state != "RUNNING":  # a late notice while closing: nothing to do any more
            coro.close()
            return
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _persist_loop(self) -> None:
        interval_s = self.config.persist_consumer_offset_interval_ms / 1000
        # RocketMQ: first after 10 s, then every 5 s; shorter intervals shorten the first wait.
        await asyncio.sleep(max(interval_s, min(PERSIST_INITIAL_DELAY_S, 2 * interval_s)))
        while True:
            with contextlib.suppress(Exception):
                await self.persist_offsets()
            await asyncio.sleep(self.config.persist_consumer_offset_interval_ms / 1000)

    async def _lock_loop(self) -> None:
        """Orderly, clustering: renew the broker locks of every owned queue (RocketMQ's
        lockMQPeriodically, every rebalance_lock_interval_ms)."""
        while True:
            await asyncio.sleep(self.config.rebalance_lock_interval_ms / 1000)
            if self._rebalance is not None:
                try:
                    await self._rebalance.lock_all()
                except Exception:
                    log.exception("renewing queue locks failed")

    async def _expiry_loop(self) -> None:
        interval_s = self.config.consume_timeout_minutes * 60
        while True:
            await asyncio.sleep(interval_s)
            if isinstance(self._consume, ConsumeService) and self._rebalance is not None:
                try:
                    await self._consume.clean_expired(self._rebalance.process_queue_table)
                except Exception:
                    log.exception("expired-message cleanup failed")
