"""What every producer flavour shares: its client instance, routes with auto-create, queue
choice and the retry loop (SPEC §5.1-§5.3).

**Route for sending** (SPEC §5.1, §4.3): the cached route, else the nameserver's; when the
nameserver has none, the route of the template topic (``create_topic_key``, TBW102) is borrowed
with at most ``default_topic_queue_nums`` queues per broker, cached under the real topic, and
sends carry ``default_topic`` so the broker creates the topic. The borrowed route stays until
the nameserver knows the real one (the broker registers it at its next heartbeat).

**Retry loop** (SPEC §5.2): up to ``1 + retries`` attempts within one time budget
(``send_msg_timeout_ms``); each attempt gets what is left of it. Sync sends pick each retry's
queue avoiding the broker that failed last; async sends retry on the same queue. Only errors
marked ``retriable`` (broker down, timeout, flow control, no permission, topic not on that
broker) are retried; a bad message is not. A stored-but-not-OK status is returned as is unless
``retry_another_broker_when_not_store_ok``, in which case it counts as a failure for retrying
and the last such result is returned when attempts run out. Ordered sends (a fixed queue or a
selector) make one attempt.

**Failover** (DESIGN.md §6, :mod:`._failover`): a failure that says the master is not where the
route says (NOT_MASTER, unreachable, no master, timeout) refreshes the topic's route before the
retry - a borrowed auto-create route through its template topic - so the retry goes to a newly
elected master at once; a group whose master moved is cleared from the latency fault table (the
failure was the old master's). A send with no retry left (ordered, oneway, the last attempt)
marks the route stale instead, and the next send of the topic refreshes it first.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client._instance import ClientInstance
from rocketq.client._request_stream import SEND, open_streams
from rocketq.client._route import TopicRoute, moved_masters
from rocketq.client._tracing import traced_send
from rocketq.client.errors import (
    BrokerUnavailableError,
    ClientStateError,
    InvalidArgumentError,
    RequestTimeoutError,
    RocketQError,
    TopicNotFoundError,
)
from rocketq.client.producer._failover import (
    RETRY_POLL_MS,
    RefreshGate,
    refresh_cause,
    wait_before_retry_ms,
)
from rocketq.client.producer._fault import LatencyFaultTolerance, QueueChooser
from rocketq.client.producer._sender import (
    PreparedMessage,
    SendHandler,
    build_send_request,
    check_send_topic,
    prepare_batch,
    prepare_checked_topic,
)
from rocketq.client.producer.config import ProducerConfig
from rocketq.client.producer.selectors import MessageQueueSelector, SelectMessageQueueByHash
from rocketq.message import Message, MessageQueue, SendResult, SendStatus, new_unique_id

log = logging.getLogger(__name__)

_HASH_SELECTOR = SelectMessageQueueByHash()

CHECKED_TOPICS_MAX = 1024
"""Topics a producer remembers as checked; past this the memory is simply cleared."""


CheckHandler = Callable[[str, messaging_pb2.CheckTransactionState], object]
"""``handler(broker_addr, check)``: a transaction check-back pushed by a broker."""


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ProducerCore:
    """A producer group's state in its client instance (implements ``ProducerHandle``)."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self._instance: ClientInstance | None = None
        self._state = "created"
        self._topics: set[str] = set()
        self._choosers: dict[str, QueueChooser] = {}
        #: topic -> (route, its write_queues()): a route is frozen, so its queue list is made
        #: once rather than twice per send (a MessageQueue per queue, sorted).
        self._write_queues: dict[str, tuple[TopicRoute, list[MessageQueue]]] = {}
        #: topic -> its UTF-8 size, for topics that passed check_send_topic
        self._checked_topics: dict[str, int] = {}
        self.fault = LatencyFaultTolerance() if config.send_latency_fault_enable else None
        self._rng = random.Random()
        self._handler: SendHandler | None = None
        self._refresh_gate = RefreshGate()
        #: Set by a TransactionProducer: answers the broker's CheckTransactionState pushes.
        self.check_handler: CheckHandler | None = None

    # ---- ProducerHandle ------------------------------------------------------------------

    def producer_data(self) -> messaging_pb2.ProducerData:
        return messaging_pb2.ProducerData(producer_group=self.config.group)

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def on_check_transaction(
        self, broker_addr: str, msg: messaging_pb2.CheckTransactionState
    ) -> None:
        # Called on the client instance's loop by the broker stream; the handler (a
        # TransactionProducer's) must only schedule work, never block.
        if self.check_handler is not None:
            self.check_handler(broker_addr, msg)
            return
        log.warning(
            "broker %s asked producer group %s about transaction %s, but this producer has no "
            "transaction listener",
            broker_addr,
            self.config.group,
            msg.transaction_id,
        )

    # ---- life cycle ----------------------------------------------------------------------

    @property
    def instance(self) -> ClientInstance:
        if self._state != "running" or self._instance is None:
            what = "closed" if self._state == "closed" else "not started"
            raise ClientStateError(f"producer {self.config.group!r} is {what}; call start() first")
        return self._instance

    @property
    def running(self) -> bool:
        return self._state == "running"

    async def start(self) -> None:
        if self._state != "created":
            raise ClientStateError(f"producer {self.config.group!r} was already started")
        instance = ClientInstance.get(self.config.client_config())
        instance.register_producer(self.config.group, self)
        try:
            await instance.start()
        except BaseException:
            instance.unregister_producer(self.config.group)
            raise
        self._instance = instance
        self._state = "running"
        try:
            await instance.announce_producers()
        except Exception:  # the periodic heartbeat tries again; a send does not need this
            log.warning("could not announce producer group %s to the brokers", self.config.group,
                        exc_info=True)  # fmt: skip

    async def declare_topics(self, topics: Sequence[str]) -> None:
        """Topics this producer will send to, known before its first send: their routes are
        fetched now and their brokers heartbeated (RocketMQ 5 SDKs take them at start). A topic
        without a route yet is logged and picked up by the route poll once it exists."""
        instance = self.instance
        self._topics.update(topics)
        for topic in topics:
            try:
                await instance.get_route(topic)
            except RocketQError as err:
                log.warning("declared topic %s has no route yet: %s", topic, err)
        await instance.heartbeat_now()

    async def close(self) -> None:
        if self._state != "running" or self._instance is None:
            self._state = "closed"
            return
        self._state = "closed"
        if self._handler is not None:
            await self._handler.close()
        self._instance.unregister_producer(self.config.group)
        await self._instance.close()

    # ---- messages and routes -------------------------------------------------------------

    def prepare(self, msg: Message) -> PreparedMessage:
        topic = msg.topic
        topic_size = self._checked_topics.get(topic)
        if topic_size is None:  # the topic rules, once per topic (a regex among them)
            check_send_topic(topic, self.config.create_topic_key)
            topic_size = len(topic.encode())
            if len(self._checked_topics) >= CHECKED_TOPICS_MAX:
                self._checked_topics.clear()
            self._checked_topics[topic] = topic_size
        return prepare_checked_topic(
            msg, new_unique_id(), topic_size, self.config.max_message_size_bytes
        )

    def prepare_batch(self, msgs: Sequence[Message]) -> list[PreparedMessage]:
        if isinstance(msgs, Message):
            raise InvalidArgumentError("send_batch takes a list of messages; use send() for one")
        return prepare_batch(
            msgs,
            create_topic_key=self.config.create_topic_key,
            max_size_bytes=self.config.max_message_size_bytes,
        )

    def cached_route_for_send(self, topic: str) -> TopicRoute | None:
        """The cached route when :meth:`route_for_send` would return it without awaiting
        anything (cached and not marked stale); None otherwise. Lets a send skip the
        ``wait_for`` around the lookup: a task and a timer per send, a tenth of the client's
        CPU for a single sync send."""
        route = self.instance.cached_route(topic)
        if route is None or self._refresh_gate.is_stale(topic):
            return None
        self._topics.add(topic)
        return route

    async def route_for_send(self, topic: str) -> TopicRoute:
        """The route to send ``topic`` with, borrowing the template's when it has none."""
        instance = self.instance
        self._topics.add(topic)
        cached = instance.cached_route(topic)
        if (
            cached is not None
            and self._refresh_gate.is_stale(topic)
            and self._refresh_gate.try_acquire(topic)
        ):
            try:
                return await self._fresh_route(topic, cached)
            except RocketQError as exc:
                log.debug("route refresh of %s failed: %s", topic, exc)
        try:
            return await instance.get_route(topic)
        except TopicNotFoundError:
            pass
        key = self.config.create_topic_key
        try:
            template = await instance.get_route(key, refresh=True)
        except TopicNotFoundError:
            raise TopicNotFoundError(
                f"topic {topic!r} does not exist and cannot be auto-created (no broker offers the "
                f"template topic {key!r}; autoCreateTopicEnable is off); create it first"
            ) from None
        route = template.borrowed_for(topic, self.config.default_topic_queue_nums)
        instance.put_route(route)
        return route

    async def _fresh_route(self, topic: str, current: TopicRoute) -> TopicRoute:
        """``topic``'s route asked of the nameserver again (a borrowed route re-borrowed from
        its template's fresh route); ``current`` when the nameserver no longer has it. Logs
        and un-isolates every group whose master moved."""
        instance = self.instance
        try:
            fresh = await instance.get_route(topic, refresh=True)
        except TopicNotFoundError:
            fresh = current
        if fresh.default_topic:
            template = await instance.get_route(fresh.default_topic, refresh=True)
            fresh = template.borrowed_for(topic, self.config.default_topic_queue_nums)
            instance.put_route(fresh)
        for name, (old, new) in moved_masters(current, fresh).items():
            log.info(
                "broker group %s: master moved from %s to %s (route of %s)",
                name,
                old or "none",
                new or "none",
                topic,
            )
            if self.fault is not None and new is not None:
                self.fault.remove(name)  # the failures were the old master's
        return fresh

    async def _after_failure(
        self,
        topic: str,
        route: TopicRoute,
        queues: list[MessageQueue],
        failed: MessageQueue,
        deadline: float,
    ) -> tuple[TopicRoute, list[MessageQueue]]:
        """The route and queues for the retry after a send to ``failed`` failed in a way that
        suggests a moved master: refreshed at once, then - while it offers nothing new -
        refreshed every RETRY_POLL_MS for up to half the time left (an election under way)."""
        fresh = await self._refreshed(topic, route, deadline)
        waited_ms = 0
        while True:
            wait_ms = wait_before_retry_ms(
                route, fresh, failed.broker_name, waited_ms, _remaining_ms(deadline)
            )
            if wait_ms <= 0:
                break
            await asyncio.sleep(wait_ms / 1000)
            waited_ms += wait_ms
            fresh = await self._refreshed(topic, fresh, deadline)
        return fresh, fresh.write_queues() or queues

    async def _writable_route(
        self, topic: str, route: TopicRoute, deadline: float
    ) -> tuple[TopicRoute, list[MessageQueue]]:
        """``route`` and its writable queues. With none - a group electing its master, or a
        route cached while it had none - the nameserver is asked again at once and then every
        RETRY_POLL_MS, for up to half the time left; only then BrokerUnavailableError. (Raising
        at once left such a route in use until the 30 s poll: every send failed meanwhile.)"""
        queues = self.write_queues(route)
        waited_ms = 0
        while not queues:
            budget_ms = (waited_ms + _remaining_ms(deadline)) // 2
            if waited_ms >= budget_ms:
                self._refresh_gate.mark_stale(topic)
                break
            route = await self._refreshed(topic, route, deadline)
            queues = self.write_queues(route)
            if not queues:
                wait_ms = min(RETRY_POLL_MS, budget_ms - waited_ms)
                await asyncio.sleep(wait_ms / 1000)
                waited_ms += wait_ms
        return route, self.writable(route)

    async def _refreshed(self, topic: str, route: TopicRoute, deadline: float) -> TopicRoute:
        """``topic``'s route from the nameserver (at most every REFRESH_MIN_INTERVAL_MS per
        topic; else the instance's cached one); ``route`` if the nameserver cannot answer."""
        if not self._refresh_gate.try_acquire(topic):
            return self.instance.cached_route(topic) or route
        try:
            return await self._with_deadline(self._fresh_route(topic, route), deadline, topic)
        except RocketQError as exc:
            log.debug("route refresh of %s after a failed send failed: %s", topic, exc)
            return route

    def _chooser(self, topic: str) -> QueueChooser:
        chooser = self._choosers.get(topic)
        if chooser is None:
            # A random start spreads many short-lived producers over all queues.
            chooser = QueueChooser(self.fault, self._rng.randrange(1 << 16))
            self._choosers[topic] = chooser
        return chooser

    def write_queues(self, route: TopicRoute) -> list[MessageQueue]:
        """``route.write_queues()``, kept per route (callers must not change the list)."""
        cached = self._write_queues.get(route.topic)
        if cached is not None and cached[0] is route:
            return cached[1]
        queues = route.write_queues()
        self._write_queues[route.topic] = (route, queues)
        return queues

    def writable(self, route: TopicRoute) -> list[MessageQueue]:
        queues = self.write_queues(route)
        if not queues:
            raise BrokerUnavailableError(
                f"topic {route.topic!r} has no writable queue on a live master (brokers: "
                f"{sorted(route.brokers) or 'none'})"
            )
        return queues

    async def resolve_queue(
        self,
        msg: Message,
        queue: MessageQueue | None,
        selector: MessageQueueSelector | None,
        arg: object,
        sharding_key: object,
    ) -> MessageQueue | None:
        """The fixed queue of an ordered send, or None for a normal (round-robin) send."""
        if queue is None and selector is None and sharding_key is None:
            return None
        given = sum(x is not None for x in (queue, selector, sharding_key))
        if given > 1:
            raise InvalidArgumentError("give at most one of queue, selector and sharding_key")
        if queue is not None:
            if queue.topic != msg.topic:
                raise InvalidArgumentError(
                    f"queue {queue} belongs to topic {queue.topic!r}, not {msg.topic!r}"
                )
            return queue
        if selector is None and sharding_key is None:
            return None
        check_send_topic(msg.topic, self.config.create_topic_key)
        route = await self.route_for_send(msg.topic)
        if not self.write_queues(route):
            self._refresh_gate.mark_stale(msg.topic)  # the next send asks the nameserver
        queues = self.writable(route)
        if sharding_key is not None:
            return _HASH_SELECTOR.select(queues, msg, sharding_key)
        assert selector is not None
        mq = selector.select(queues, msg, arg)
        if not isinstance(mq, MessageQueue) or mq.topic != msg.topic:
            raise InvalidArgumentError(f"the selector returned {mq!r}, not a queue of the topic")
        return mq

    # ---- sending -------------------------------------------------------------------------

    async def send_once(
        self,
        route: TopicRoute,
        mq: MessageQueue,
        items: Sequence[PreparedMessage],
        timeout_ms: int,
        sys_flag: int = 0,
    ) -> list[SendResult]:
        """One attempt to one queue; feeds the latency fault table. ``sys_flag`` bits are
        added to the request's (a transactional half message's TRANSACTION_PREPARED)."""
        addr = route.master_addr(mq.broker_name)
        if addr is None:
            raise BrokerUnavailableError(f"broker {mq.broker_name!r} has no live master")
        cfg = self.config
        req = build_send_request(
            cfg.group,
            mq,
            items,
            default_topic=route.default_topic,
            default_topic_queue_nums=cfg.default_topic_queue_nums,
            compress_over_bytes=cfg.compress_msg_body_over_bytes,
            as_records=cfg.batch_as_records,
        )
        req.sys_flag |= sys_flag
        started_ms = _now_ms()
        try:
            results = await self._send_handler().send(
                addr, mq, req, timeout_ms, [item.msg_id for item in items]
            )
        except RocketQError as exc:
            if self.fault is not None and exc.retriable:
                self.fault.update(mq.broker_name, _now_ms() - started_ms, isolation=True)
            if refresh_cause(exc) is not None:
                self._refresh_gate.mark_stale(mq.topic)
            raise
        if self.fault is not None:
            self.fault.update(mq.broker_name, _now_ms() - started_ms, isolation=False)
        return results

    def _send_handler(self) -> SendHandler:
        if self._handler is None:
            cfg = self.config
            streams = open_streams(
                self.instance.messaging, SEND, enabled=cfg.send_stream, security=cfg.security
            )
            self._handler = SendHandler(self.instance.messaging, streams)
        return self._handler

    @traced_send  # a send span; the messages carry its trace context
    async def send_oneway(
        self, mq: MessageQueue | None, item: PreparedMessage, timeout_ms: int
    ) -> asyncio.Future[object]:
        """Hand one message to gRPC without waiting for the broker; no retry (SPEC §5.2)."""
        topic = item.topic
        route = await self.route_for_send(topic)
        if mq is None:
            mq = self._chooser(topic).choose(self.writable(route), None)
        addr = route.master_addr(mq.broker_name)
        if addr is None:
            raise BrokerUnavailableError(f"broker {mq.broker_name!r} has no live master")
        cfg = self.config
        req = build_send_request(
            cfg.group,
            mq,
            [item],
            default_topic=route.default_topic,
            default_topic_queue_nums=cfg.default_topic_queue_nums,
            compress_over_bytes=cfg.compress_msg_body_over_bytes,
        )
        fut = self._send_handler().send_oneway(addr, req, timeout_ms)
        fut.add_done_callback(lambda f: self._after_oneway(topic, f))
        return fut

    def _after_oneway(self, topic: str, fut: asyncio.Future[object]) -> None:
        # A oneway send has no retry: a failure only makes the next send refresh the route.
        if not fut.cancelled() and fut.exception() is not None:
            self._refresh_gate.mark_stale(topic)

    @traced_send  # a send span; the messages carry its trace context
    async def send_to_queue(
        self, mq: MessageQueue, items: Sequence[PreparedMessage], timeout_ms: int
    ) -> list[SendResult]:
        """An ordered send: one attempt, to ``mq``."""
        deadline = time.monotonic() + timeout_ms / 1000
        route = self.cached_route_for_send(mq.topic) or await self._with_deadline(
            self.route_for_send(mq.topic), deadline, mq.topic
        )
        return await self.send_once(route, mq, items, _remaining_ms(deadline))

    @traced_send  # a send span; the messages carry its trace context
    async def send_with_retries(
        self,
        topic: str,
        items: Sequence[PreparedMessage],
        *,
        timeout_ms: int,
        retries: int,
        same_queue: bool = False,
        sys_flag: int = 0,
    ) -> list[SendResult]:
        """A normal send: round-robin queue, up to ``1 + retries`` attempts in ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        route = self.cached_route_for_send(topic) or await self._with_deadline(
            self.route_for_send(topic), deadline, topic
        )
        queues = self.write_queues(route)
        if not queues:  # a coroutine only when there is something to wait for
            route, queues = await self._writable_route(topic, route, deadline)
        chooser = self._chooser(topic)
        attempts = 1 + retries
        last_broker: str | None = None
        last_exc: RocketQError | None = None
        not_ok: list[SendResult] | None = None
        mq: MessageQueue | None = None
        for attempt in range(attempts):
            remaining_ms = _remaining_ms(deadline)
            if remaining_ms <= 0:
                break
            if mq is None or not same_queue:
                mq = chooser.choose(queues, last_broker)
            try:
                results = await self.send_once(route, mq, items, remaining_ms, sys_flag)
            except RocketQError as exc:
                if not exc.retriable:
                    raise
                log.debug("send to %s failed (attempt %d): %s", mq, attempt + 1, exc)
                last_exc, last_broker = exc, mq.broker_name
                if refresh_cause(exc) is not None and attempt + 1 < attempts:
                    route, queues = await self._after_failure(topic, route, queues, mq, deadline)
                continue
            if (
                results[0].status is not SendStatus.SEND_OK
                and self.config.retry_another_broker_when_not_store_ok
                and attempt + 1 < attempts
            ):
                not_ok, last_broker = results, mq.broker_name
                continue
            return results
        if not_ok is not None:
            return not_ok
        if last_exc is not None and not isinstance(last_exc, RequestTimeoutError):
            last_exc.add_note(f"gave up sending to topic {topic!r} after {attempts} attempts")
            raise last_exc
        raise RequestTimeoutError(
            f"sending to topic {topic!r} took longer than {timeout_ms} ms"
            + (f" (last error: {last_exc.message})" if last_exc else "")
        )

    async def _with_deadline(
        self, coro: Coroutine[Any, Any, TopicRoute], deadline: float, topic: str
    ) -> TopicRoute:
        try:
            return await asyncio.wait_for(coro, max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise RequestTimeoutError(
                f"looking up the route of topic {topic!r} took longer than the send timeout"
            ) from None


def _remaining_ms(deadline: float) -> int:
    return int((deadline - time.monotonic()) * 1000)
