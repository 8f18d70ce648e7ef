"""The lite pull consumer: the application polls (RocketMQ's ``DefaultLitePullConsumer``).

Two ways to get queues, never mixed in one consumer:

* ``subscribe(topic, expression)`` — the group shares the topic's queues by rebalance, as a
  push consumer does (clustering), or every member reads all of them (broadcasting);
* ``assign(queues)`` — exactly these queues, no rebalance.

For each owned queue a task long-polls the broker (20 s hold, SPEC §6.9) and buffers what it
gets; :meth:`LitePullConsumer.poll` returns one buffered batch. Buffering stops (50 ms retries)
while a queue holds more than ``pull_threshold_for_queue`` messages or
``pull_threshold_size_for_queue_mib``, or all queues together more than
``pull_threshold_for_all`` — the buffer's bound.

Offsets: each queue has a *pull offset* (next to fetch) and a *consume offset* (one past what
poll() has returned). :meth:`commit_sync` stores the consume offsets; with ``auto_commit``,
poll() does so itself at most every ``auto_commit_interval_ms``, before fetching more, so what
it commits is what earlier polls returned — at-least-once as long as the application finishes
a batch before polling again. :meth:`seek` moves both offsets and discards the buffered
messages of that queue (a seek bumps the queue's ProcessQueue; batches of the old one are
skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
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
    is_subscription_inconsistent,
    make_offset_store,
    readable_queues,
)
from rocketq.client.consumer._pull import (
    FOUND,
    NO_MATCHED_MSG,
    NO_NEW_MSG,
    OFFSET_ILLEGAL,
    Puller,
    flow_control_reason,
)
from rocketq.client.consumer._rebalance import (
    PullRequest,
    RebalanceImpl,
    RebalanceService,
    compute_pull_from_where,
)
from rocketq.client.consumer._subscription import SUB_ALL, Subscription, build_subscription
from rocketq.client.consumer.allocate import AllocateAveragely
from rocketq.client.consumer.config import (
    ExpressionType,
    LitePullConsumerConfig,
    MessageModel,
    SubscriptionConflict,
    parse_consume_timestamp,
)
from rocketq.client.consumer.offset_store import OffsetStore, ReadOffsetType
from rocketq.client.consumer.process_queue import ProcessQueue, wall_clock_ms
from rocketq.client.errors import ClientStateError, InvalidArgumentError, RocketQError
from rocketq.message import MessageQueue, ReceivedMessage

log = logging.getLogger(__name__)

PULL_DELAY_WHEN_EXCEPTION_S = 1.0
PULL_FAILURE_LOG_INTERVAL_S = 30.0
"""A pull failing the same way again is logged at most this often per topic, so a permanent
refusal (an SQL92 filter on a broker without enablePropertyFilter) does not flood the log."""
"""RocketMQ lite pull's pullTimeDelayMillsWhenException."""
PULL_DELAY_WHEN_PAUSED_S = 1.0
PULL_DELAY_WHEN_REFUSED_S = 3.0
"""A pull refused because the group's subscriptions disagree is retried this much later."""
PULL_DELAY_WHEN_FLOW_CONTROL_S = 0.05
FLOW_CONTROL_LOG_EVERY = 1000
BUFFERED_BATCHES_MAX = 1_000_000
"""The buffer is bounded by pull_threshold_for_all messages; this only guards a bug."""

_MODEL_PB = {
    MessageModel.CLUSTERING: messaging_pb2.CLUSTERING,
    MessageModel.BROADCASTING: messaging_pb2.BROADCASTING,
}


class _Mode(enum.Enum):
    NONE = "NONE"
    SUBSCRIBE = "SUBSCRIBE"
    ASSIGN = "ASSIGN"


@dataclass(eq=False)
class _QueueState:
    """One owned queue: its pull request (pull offset, ProcessQueue) and consume offset."""

    req: PullRequest
    consume_offset: int = -1
    """One past the last message poll() returned; -1 before the first poll of this queue."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class _Batch:
    mq: MessageQueue
    pq: ProcessQueue
    msgs: list[ReceivedMessage]


class _Handle:
    """The ConsumerHandle the ClientInstance calls."""

    def __init__(self, consumer: LitePullConsumer) -> None:
        self._c = consumer

    def consumer_data(self) -> messaging_pb2.ConsumerData:
        return self._c._consumer_data()

    def topics(self) -> list[str]:
        return self._c._topics()

    def on_route_changed(self, topic: str, route: TopicRoute) -> None:
        if self._c._rebalance_service is not None and topic in self._c._subscriptions:
            self._c._spawn(self._c._heartbeat_then_rebalance())

    def on_consumer_ids_changed(self) -> None:
        if self._c._rebalance_service is not None:
            self._c._rebalance_service.wakeup()

    def on_reset_offset(self, topic: str, broker_name: str, offsets: dict[int, int]) -> None:
        for queue_id, offset in offsets.items():
            mq = MessageQueue(topic, broker_name, queue_id)
            if mq in self._c._queues:
                self._c._seek_now(mq, offset)

    def on_subscription_conflict(self, conflict: common_pb2.SubscriptionConflict) -> None:
        self._c._conflicts.on_notice(conflict)


class LitePullConsumer:
    """Fetches messages for the application to :meth:`poll` (see the module docstring)."""

    def __init__(self, config: LitePullConsumerConfig) -> None:
        self.config = config
        self._conflicts = SubscriptionConflicts(config.consumer_group, log)
        self._failure_logged_s: dict[tuple[str, type[RocketQError]], float] = {}
        self._mode = _Mode.NONE
        self._subscriptions: dict[str, Subscription] = {}
        self._assigned: set[MessageQueue] = set()
        self._paused: set[MessageQueue] = set()
        self._queues: dict[MessageQueue, _QueueState] = {}
        self._buffer: asyncio.Queue[_Batch] = asyncio.Queue(BUFFERED_BATCHES_MAX)
        self._state = "CREATED"
        self._handle = _Handle(self)
        self._instance: ClientInstance | None = None
        self._api: BrokerApi | None = None
        self._puller: Puller | None = None
        self._offset_store: OffsetStore | None = None
        self._rebalance: RebalanceImpl | None = None
        self._rebalance_service: RebalanceService | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._next_auto_commit_ms = 0
        self.flow_control_times = 0
        self.client_id = ""
        """``ip@instance`` once started."""

    # ---- what to read -----------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        expression: str = SUB_ALL,
        expression_type: ExpressionType = ExpressionType.TAG,
    ) -> None:
        """Read ``topic`` (filtered by tags or SQL92), sharing its queues with the group."""
        if self._mode is _Mode.ASSIGN:
            raise ClientStateError("this consumer uses assign(); subscribe() cannot be mixed in")
        self._mode = _Mode.SUBSCRIBE
        self._subscriptions[topic] = build_subscription(topic, expression, expression_type)
        self._changed()

    def unsubscribe(self, topic: str) -> None:
        """Stop reading ``topic``; its queues are released at once."""
        if self._subscriptions.pop(topic, None) is not None:
            self._changed()

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Read exactly ``queues`` (replacing any earlier assignment), with no rebalance."""
        if self._mode is _Mode.SUBSCRIBE:
            raise ClientStateError("this consumer uses subscribe(); assign() cannot be mixed in")
        self._mode = _Mode.ASSIGN
        self._assigned = set(queues)
        for topic in {mq.topic for mq in self._assigned}:
            if topic not in self._subscriptions:
                self._subscriptions[topic] = build_subscription(topic, SUB_ALL)
        for topic in [t for t in self._subscriptions if t not in self._topics()]:
            del self._subscriptions[topic]
        if self._state == "RUNNING":
            self._apply_assignment()

    def _changed(self) -> None:
        if self._state != "RUNNING" or self._rebalance is None:
            return
        self._rebalance.topics = set(self._subscriptions)
        assert self._instance is not None
        self._spawn(self._instance.heartbeat_now())
        if self._rebalance_service is not None:
            self._rebalance_service.wakeup()

    def _topics(self) -> list[str]:
        if self._mode is _Mode.ASSIGN:
            return sorted({mq.topic for mq in self._assigned})
        return sorted(self._subscriptions)

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer reads now."""
        return sorted(self._queues)

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` (from the nameserver), e.g. to pass to assign()."""
        if self._instance is None:
            raise ClientStateError("start the consumer first")
        queues = await readable_queues(self._instance, topic, refresh=True)
        if not queues:
            raise RocketQError(f"topic {topic!r} has no readable queue")
        return queues

    def subscription_conflicts(self) -> list[SubscriptionConflict]:
        """Topics whose group members subscribe differently, as the brokers last reported
        (SPEC §6.17); see :meth:`PushConsumer.subscription_conflicts`."""
        return self._conflicts.current()

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop fetching these queues (already buffered messages are still returned)."""
        self._paused.update(queues)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """Fetch these queues again after :meth:`pause`."""
        self._paused.difference_update(queues)

    # ---- life cycle -------------------------------------------------------------------------

    async def __aenter__(self) -> LitePullConsumer:
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
        """Connect, register the group and begin fetching."""
        if self._state != "CREATED":
            raise ClientStateError(f"this consumer is {self._state.lower()}; create a new one")
        cfg = self.config
        instance = self._instance = self._client_instance()
        self.client_id = instance.client_id
        streams = open_streams(
            instance.messaging, PULL, enabled=cfg.pull_stream, security=cfg.security
        )
        api = self._api = BrokerApi(instance, cfg.consumer_group, cfg.request_timeout_ms, streams)
        self._puller = Puller(api, cfg.consumer_group, cfg.pull_inflight_max)
        store = make_offset_store(
            api,
            client_id=self.client_id,
            group=cfg.consumer_group,
            message_model=cfg.message_model,
            offset_store_dir=cfg.offset_store_dir,
        )
        await store.load()
        self._offset_store = store
        self._rebalance = self._new_rebalance(instance, api)
        self._rebalance.topics = set(self._subscriptions)
        try:
            instance.register_consumer(cfg.consumer_group, self._handle)
        except ValueError as exc:
            raise ClientStateError(str(exc)) from None
        self._state = "RUNNING"
        try:
            await instance.start()
            for topic in self._topics():
                await readable_queues(instance, topic)
            await instance.heartbeat_now()
        except BaseException:
            self._state = "CLOSED"
            await instance.unregister_consumer(cfg.consumer_group)
            await instance.close()
            raise
        self._next_auto_commit_ms = wall_clock_ms() + cfg.auto_commit_interval_ms
        if self._mode is _Mode.ASSIGN:
            self._apply_assignment()
        else:
            self._rebalance_service = RebalanceService(
                self._rebalance.do_rebalance, cfg.rebalance_interval_ms, cfg.consumer_group
            )
            self._rebalance_service.start()
        self._spawn(self._persist_loop())

    def _client_instance(self) -> ClientInstance:
        """The process's client instance for this consumer's settings (shared when equal)."""
        cfg = self.config
        return ClientInstance.get(
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

    def _new_rebalance(self, instance: ClientInstance, api: BrokerApi) -> RebalanceImpl:
        """Queue allocation for subscribe mode (assign mode keeps it only for its topics)."""
        cfg = self.config
        return RebalanceImpl(
            group=cfg.consumer_group,
            client_id=self.client_id,
            message_model=cfg.message_model,
            strategy=cfg.allocate_strategy or AllocateAveragely(),
            queues_of=lambda topic: readable_queues(instance, topic),
            consumer_ids=api.consumer_ids,
            compute_offset=self._compute_offset,
            remove_queue=self._remove_queue,
            dispatch=self._start_queues,
            check_pull_expired=False,
        )

    async def close(self) -> None:
        """Commit (with auto_commit), persist offsets, leave the group and stop fetching."""
        if self._state != "RUNNING":
            self._state = "CLOSED"
            return
        self._state = "CLOSING"
        if self._rebalance_service is not None:
            await self._rebalance_service.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        states = list(self._queues.values())
        for st in states:
            st.req.process_queue.dropped = True
            if st.task is not None:
                st.task.cancel()
        await asyncio.gather(*(st.task for st in states if st.task), return_exceptions=True)
        assert self._api is not None
        await self._api.close()
        if self.config.auto_commit:
            self._commit_in_memory()
        assert self._offset_store is not None and self._instance is not None
        await self._offset_store.persist_all(list(self._queues))
        self._queues.clear()
        await self._instance.unregister_consumer(self.config.consumer_group)
        await self._instance.close()
        self._state = "CLOSED"

    # ---- reading ----------------------------------------------------------------------------

    async def poll(self, timeout_ms: int | None = None) -> list[ReceivedMessage]:
        """The next batch of fetched messages, waiting up to ``timeout_ms`` (default
        ``poll_timeout_ms``); an empty list when nothing arrived in time."""
        if self._state != "RUNNING":
            raise ClientStateError(f"poll() on a consumer that is {self._state.lower()}")
        await self._maybe_auto_commit()
        wait_ms = self.config.poll_timeout_ms if timeout_ms is None else timeout_ms
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, wait_ms) / 1000
        while True:
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    batch = self._buffer.get_nowait()
                else:
                    # not wait_for: on 3.11 it can swallow a cancellation (rocketq.aio)
                    async with asyncio.timeout(remaining):
                        batch = await self._buffer.get()
            except (TimeoutError, asyncio.QueueEmpty):
                return []
            st = self._queues.get(batch.mq)
            if st is None or st.req.process_queue is not batch.pq or batch.pq.dropped:
                continue  # fetched before a seek or a rebalance took the queue away
            offset = batch.pq.remove_messages(batch.msgs)
            if offset >= 0:
                st.consume_offset = offset
            return batch.msgs

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue ``mq`` at ``offset``, which must be within the queue's [min, max] offsets."""
        if mq not in self._queues:
            raise ClientStateError(f"{mq} is not assigned to this consumer; seek needs it to be")
        assert self._api is not None
        low, high = await self._api.min_offset(mq), await self._api.max_offset(mq)
        if not low <= offset <= high:
            raise ValueError(f"seek offset {offset} of {mq} is outside [{low}, {high}]")
        self._seek_now(mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        """Continue ``mq`` at its oldest stored message."""
        assert self._api is not None
        await self.seek(mq, await self._api.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        """Continue ``mq`` after its newest message (only new messages)."""
        assert self._api is not None
        await self.seek(mq, await self._api.max_offset(mq))

    def _seek_now(self, mq: MessageQueue, offset: int) -> None:
        st = self._queues.get(mq)
        if st is None:
            return
        st.req.process_queue.dropped = True
        if st.task is not None:
            st.task.cancel()
        fresh = _QueueState(PullRequest(mq, ProcessQueue(), offset), consume_offset=offset)
        self._queues[mq] = fresh
        if self._rebalance is not None and mq in self._rebalance.process_queue_table:
            self._rebalance.process_queue_table[mq] = fresh.req.process_queue
        fresh.task = self._spawn_queue(fresh)

    # ---- offsets ----------------------------------------------------------------------------

    def _commit_in_memory(self) -> list[MessageQueue]:
        assert self._offset_store is not None
        committed = []
        for mq, st in self._queues.items():
            if st.consume_offset >= 0:
                self._offset_store.update_offset(mq, st.consume_offset, increase_only=False)
                committed.append(mq)
        return committed

    async def commit_sync(self) -> None:
        """Store the consume offsets of every owned queue (what poll() has returned)."""
        self._commit_in_memory()
        assert self._offset_store is not None
        await self._offset_store.persist_all(list(self._queues))

    async def commit(self, offsets: Mapping[MessageQueue, int], persist: bool = True) -> None:
        """Store the given offsets (next message to read per queue); with ``persist`` False
        they are written at the next periodic persist."""
        assert self._offset_store is not None
        for mq, offset in offsets.items():
            if offset < 0:
                raise ValueError(f"offset of {mq} must be ≥ 0, got {offset}")
            self._offset_store.update_offset(mq, offset, increase_only=False)
        if persist:
            await asyncio.gather(*(self._offset_store.persist(mq) for mq in offsets))

    async def committed(self, mq: MessageQueue) -> int:
        """The stored offset of ``mq`` (from the broker or the local file); -1 if none."""
        assert self._offset_store is not None
        return await self._offset_store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)

    async def _maybe_auto_commit(self) -> None:
        if not self.config.auto_commit:
            return
        now_ms = wall_clock_ms()
        if now_ms >= self._next_auto_commit_ms:
            self._next_auto_commit_ms = now_ms + self.config.auto_commit_interval_ms
            await self.commit_sync()

    # ---- queues -----------------------------------------------------------------------------

    def _apply_assignment(self) -> None:
        for mq in [mq for mq in self._queues if mq not in self._assigned]:
            st = self._queues.pop(mq)
            st.req.process_queue.dropped = True
            if st.task is not None:
                st.task.cancel()
        fresh = [PullRequest(mq, ProcessQueue(), -1) for mq in sorted(self._assigned)]
        self._start_queues([r for r in fresh if r.message_queue not in self._queues])

    def _start_queues(self, requests: list[PullRequest]) -> None:
        if self._state != "RUNNING":
            return
        for req in requests:
            st = _QueueState(req, consume_offset=req.next_offset)
            self._queues[req.message_queue] = st
            st.task = self._spawn_queue(st)

    async def _remove_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        st = self._queues.pop(mq, None)
        if st is not None and st.task is not None:
            st.task.cancel()
        assert self._offset_store is not None
        await self._offset_store.persist(mq)
        self._offset_store.remove_offset(mq)
        return True

    async def _compute_offset(self, mq: MessageQueue) -> int:
        assert self._offset_store is not None and self._api is not None
        return await compute_pull_from_where(
            mq,
            self.config.consume_from_where,
            parse_consume_timestamp(self.config.consume_timestamp),
            OffsetSourceImpl(self._offset_store, self._api),
        )

    def _spawn_queue(self, st: _QueueState) -> asyncio.Task[None]:
        return asyncio.create_task(self._pull_loop(st), name=f"lite-pull-{st.req.message_queue}")

    def _current(self, st: _QueueState) -> bool:
        return (
            self._state == "RUNNING"
            and self._queues.get(st.req.message_queue) is st
            and not st.req.process_queue.dropped
        )

    async def _pull_loop(self, st: _QueueState) -> None:
        req = st.req
        while self._current(st):
            if req.next_offset < 0:
                offset = await self._compute_offset(req.message_queue)
                if offset < 0:
                    await asyncio.sleep(PULL_DELAY_WHEN_EXCEPTION_S)
                    continue
                req.next_offset = offset
                if st.consume_offset < 0:
                    st.consume_offset = offset
            try:
                delay_s = await self._pull_once(st)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not end fetching of the queue for good
                log.exception("group %s: pull of %s failed", self.config.consumer_group, req)
                delay_s = PULL_DELAY_WHEN_EXCEPTION_S
            if delay_s > 0:
                await asyncio.sleep(delay_s)

    def _flow_control(self, pq: ProcessQueue) -> str | None:
        cfg = self.config
        total = sum(s.req.process_queue.msg_count for s in self._queues.values())
        if total > cfg.pull_threshold_for_all:
            return (
                f"buffered messages {total} > pull_threshold_for_all {cfg.pull_threshold_for_all}"
            )
        return flow_control_reason(
            msg_count=pq.msg_count,
            size_bytes=pq.msg_size_bytes,
            span=0,
            threshold_count=cfg.pull_threshold_for_queue,
            threshold_size_mib=cfg.pull_threshold_size_for_queue_mib,
            max_span=None,
        )

    async def _pull_once(self, st: _QueueState) -> float:
        req = st.req
        mq, pq = req.message_queue, req.process_queue
        if mq in self._paused:
            return PULL_DELAY_WHEN_PAUSED_S
        reason = self._flow_control(pq)
        if reason is not None:
            if self.flow_control_times % FLOW_CONTROL_LOG_EVERY == 0:
                log.warning(
                    "group %s: flow control on %s: %s", self.config.consumer_group, mq, reason
                )
            self.flow_control_times += 1
            return PULL_DELAY_WHEN_FLOW_CONTROL_S
        sub = self._subscriptions.get(mq.topic) or build_subscription(mq.topic, SUB_ALL)
        assert self._puller is not None
        try:
            result = await self._puller.pull(
                req,
                sub,
                max_nums=self.config.pull_batch_size,
                commit_offset=0,
                suspend_ms=self.config.broker_suspend_max_time_ms,
                timeout_ms=self.config.consumer_timeout_when_suspend_ms,
            )
        except RocketQError as exc:
            if is_subscription_inconsistent(exc):
                self._conflicts.log_refused_pull(mq.topic, exc)
                return PULL_DELAY_WHEN_REFUSED_S
            self._log_pull_failure(mq, exc)
            return PULL_DELAY_WHEN_EXCEPTION_S
        if not self._current(st):
            return 0.0
        if result.status == FOUND:
            req.next_offset = result.next_begin_offset
            if result.messages:
                pq.put_messages(result.messages)
                self._buffer.put_nowait(_Batch(mq, pq, result.messages))
            return 0.0
        if result.status in (NO_NEW_MSG, NO_MATCHED_MSG):
            req.next_offset = result.next_begin_offset
            return 0.0
        if result.status == OFFSET_ILLEGAL:
            log.warning(
                "group %s: offset %d of %s is illegal; moving to %d",
                self.config.consumer_group,
                req.next_offset,
                mq,
                result.next_begin_offset,
            )
            req.next_offset = result.next_begin_offset
            if pq.msg_count == 0:
                st.consume_offset = result.next_begin_offset
            return 0.0
        return PULL_DELAY_WHEN_EXCEPTION_S

    # ---- misc -------------------------------------------------------------------------------

    def _log_pull_failure(self, mq: MessageQueue, exc: RocketQError) -> None:
        """WARNING (ERROR for a refused request, which retrying will not fix), rate-limited."""
        key = (mq.topic, type(exc))
        now_s = asyncio.get_running_loop().time()
        if now_s - self._failure_logged_s.get(key, -PULL_FAILURE_LOG_INTERVAL_S) < (
            PULL_FAILURE_LOG_INTERVAL_S
        ):
            return
        self._failure_logged_s[key] = now_s
        level = logging.ERROR if isinstance(exc, InvalidArgumentError) else logging.WARNING
        log.log(
            level,
            "group %s: pull of %s failed: %s (same failures on %s silenced for %.0f s)",
            self.config.consumer_group,
            mq,
            exc,
            mq.topic,
            PULL_FAILURE_LOG_INTERVAL_S,
        )

    def _consumer_data(self) -> messaging_pb2.ConsumerData:
        cfg = self.config
        return messaging_pb2.ConsumerData(
            consumer_group=cfg.consumer_group,
            consume_type=messaging_pb2.CONSUME_TYPE_PULL,
            message_model=_MODEL_PB[cfg.message_model],
            consume_timestamp_ms=parse_consume_timestamp(cfg.consume_timestamp),
            subscriptions=[s.to_pb() for _t, s in sorted(self._subscriptions.items())],
        )

    async def _heartbeat_then_rebalance(self) -> None:
        if self._instance is not None:
            with contextlib.suppress(Exception):
                await self._instance.heartbeat_now()
        if self._rebalance_service is not None:
            self._rebalance_service.wakeup()

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        if self._state != "RUNNING":  # a late notice while closing: nothing to do any more
            coro.close()
            return
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _persist_loop(self) -> None:
        interval_s = self.config.persist_consumer_offset_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            if self._offset_store is not None:
                with contextlib.suppress(Exception):
                    await self._offset_store.persist_all(list(self._queues))
