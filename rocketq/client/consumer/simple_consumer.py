"""SimpleConsumer: the application receives, acks and re-hides messages itself (pop consumption).

RocketMQ 5's SimpleConsumer over the broker's Pop / Ack / ChangeInvisibleTime (DESIGN.md §7).
No queue belongs to any consumer: any number of consumers of one group share every queue, and
the broker hands each message to one of them at a time::

    async with SimpleConsumer(SimpleConsumerConfig("orders-workers", ["127.0.0.1:9876"])) as c:
        c.subscribe("Orders", "paid || shipped")
        for msg in await c.receive(16, invisible_duration_ms=30_000):
            handle(msg.message.body)
            await c.ack(msg)

A message not acked within its invisible duration comes back (to this consumer or another) with
``delivery_attempt`` one higher; after the group's retry limit it goes to ``%DLQ%{group}``.
``change_invisible_duration`` hides it for a new duration from now and returns the message with
a new receipt handle; the old one is refused from then on, as is the handle of a message that was
acked or delivered again (:class:`InvalidReceiptHandleError`).

Each ``receive`` asks one broker (the masters of the subscribed topics' routes in turn) and
waits up to ``await_duration_ms`` there for a message (long polling). Acks go to the broker that
delivered the message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client._admin_types import received_message
from rocketq.client._instance import ClientConfig, ClientInstance, local_ip
from rocketq.client._sync import BlockingLifecycle, LoopThread
from rocketq.client.errors import (
    BrokerUnavailableError,
    ClientStateError,
    InvalidArgumentError,
    RocketQError,
    from_rpc_error,
)
from rocketq.client.security import ClientSecurity
from rocketq.message import ReceivedMessage
from rocketq.validation import check_group, check_topic

T = TypeVar("T")

RECEIVE_BATCH_MAX = 32
INVISIBLE_MIN_MS = 1_000
INVISIBLE_MAX_MS = 12 * 3600 * 1000
AWAIT_MAX_MS = 60_000


class InvalidReceiptHandleError(InvalidArgumentError):
    """The broker refused a receipt handle: the message was acked, its invisible duration was
    changed (use the newest handle), or it was delivered again after its invisible duration."""


@dataclass(frozen=True)
class SimpleConsumerConfig:
    """Settings of a :class:`SimpleConsumer`."""

    consumer_group: str
    namesrv_addrs: tuple[str, ...]
    """Nameserver addresses, ``("host:port", ...)``."""
    await_duration_ms: int = 20_000
    """How long one receive waits at a broker for a message (long polling), 0..60 s."""
    request_timeout_ms: int = 3_000
    """Deadline of each call, on top of the await duration for receive."""
    instance_name: str = "DEFAULT"
    client_ip: str = field(default_factory=local_ip)
    security: ClientSecurity | None = None
    """TLS files and access key (rocketq.client.security); None = the process default, which
    the ROCKETQ_TLS_* / ROCKETQ_ACCESS_KEY environment sets."""

    def __post_init__(self) -> None:
        check_group(self.consumer_group)
        if not 0 <= self.await_duration_ms <= AWAIT_MAX_MS:
            raise ValueError(f"await_duration_ms must be within 0..{AWAIT_MAX_MS}")
        if self.request_timeout_ms <= 0:
            raise ValueError("request_timeout_ms must be positive")


@dataclass(frozen=True)
class PoppedMessage:
    """One received message and what the consumer needs to ack it."""

    message: ReceivedMessage
    receipt_handle: str
    """Opaque; valid until the message is acked, changed or delivered again."""
    delivery_attempt: int
    """1 on the first delivery, 2 on the first redelivery, ..."""
    invisible_until_ms: int
    """Epoch ms when the message becomes visible again unless acked."""
    broker_addr: str
    """The broker that delivered it (acks go there)."""
    topic: str
    """The subscribed topic it was received from."""


class SimpleConsumer:
    """Receives with ``receive``; acks with ``ack`` (see the module docstring)."""

    def __init__(self, config: SimpleConsumerConfig) -> None:
        self.config = config
        self._expressions: dict[str, str] = {}
        self._instance: ClientInstance | None = None
        self._turn = itertools.count()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive ``topic``'s messages matching a tag expression ("*", "A || B")."""
        check_topic(topic)
        self._expressions[topic] = expression or "*"

    def unsubscribe(self, topic: str) -> None:
        self._expressions.pop(topic, None)

    async def start(self) -> None:
        if self._instance is not None:
            raise ClientStateError("this SimpleConsumer is already started")
        cfg = self.config
        instance = ClientInstance.get(
            ClientConfig(
                namesrv_addrs=cfg.namesrv_addrs,
                instance_name=cfg.instance_name,
                client_ip=cfg.client_ip,
                request_timeout_ms=cfg.request_timeout_ms,
                security=cfg.security,
            )
        )
        await instance.start()
        self._instance = instance

    async def close(self) -> None:
        instance, self._instance = self._instance, None
        if instance is not None:
            await instance.close()

    def _running(self) -> ClientInstance:
        if self._instance is None:
            raise ClientStateError("start the SimpleConsumer first")
        return self._instance

    # -- receive ---------------------------------------------------------------------------
    async def receive(
        self, max_messages: int = 16, invisible_duration_ms: int = 30_000
    ) -> list[PoppedMessage]:
        """Up to ``max_messages`` (1..32) messages, hidden from the group's other consumers for
        ``invisible_duration_ms`` (1 s..12 h); empty when none arrived within the await
        duration."""
        instance = self._running()
        if not 1 <= max_messages <= RECEIVE_BATCH_MAX:
            raise ValueError(f"max_messages must be within 1..{RECEIVE_BATCH_MAX}")
        _check_invisible(invisible_duration_ms)
        if not self._expressions:
            raise ClientStateError("subscribe to a topic before receiving")
        topic, addr = await self._next_target(instance)
        cfg = self.config
        request = messaging_pb2.PopRequest(
            consumer_group=cfg.consumer_group,
            topic=topic,
            max_msg_nums=max_messages,
            invisible_time_ms=invisible_duration_ms,
            poll_time_ms=cfg.await_duration_ms,
            expression=self._expressions[topic],
            expression_type=common_pb2.TAG,
        )
        timeout_s = (cfg.await_duration_ms + cfg.request_timeout_ms) / 1000
        try:
            response = await self._call(
                addr, lambda: instance.messaging(addr).Pop(request, timeout=timeout_s)
            )
        except BrokerUnavailableError:
            # A restarted broker may listen elsewhere, a failed-over group has a new master:
            # the next receive reads a fresh route.
            with contextlib.suppress(RocketQError):
                await instance.get_route(topic, refresh=True)
            raise
        return [
            PoppedMessage(
                message=received_message(m.message, _broker_of(m.receipt_handle)),
                receipt_handle=m.receipt_handle,
                delivery_attempt=m.delivery_attempt,
                invisible_until_ms=m.invisible_until_ms,
                broker_addr=addr,
                topic=topic,
            )
            for m in response.messages
        ]

    async def _next_target(self, instance: ClientInstance) -> tuple[str, str]:
        """The next (topic, master address) in turn over every subscribed topic's brokers."""
        targets: list[tuple[str, str]] = []
        for topic in sorted(self._expressions):
            route = await instance.get_route(topic)
            names = sorted({mq.broker_name for mq in route.read_queues()})
            targets.extend((topic, addr) for n in names if (addr := route.master_addr(n)))
        if not targets:
            raise BrokerUnavailableError(
                f"no master broker serves the topics {sorted(self._expressions)} now"
            )
        return targets[next(self._turn) % len(targets)]

    # -- ack, change -----------------------------------------------------------------------
    async def ack(self, message: PoppedMessage) -> None:
        """The message is done: it is not delivered to the group again."""
        instance = self._running()
        request = messaging_pb2.AckRequest(
            consumer_group=self.config.consumer_group,
            topic=message.topic,
            receipt_handle=message.receipt_handle,
        )
        addr = message.broker_addr
        timeout_s = self.config.request_timeout_ms / 1000
        await self._call(addr, lambda: instance.messaging(addr).Ack(request, timeout=timeout_s))

    async def change_invisible_duration(
        self, message: PoppedMessage, invisible_duration_ms: int
    ) -> PoppedMessage:
        """Hide the message for ``invisible_duration_ms`` from now; the returned message carries
        the new receipt handle (the old one is refused from now on)."""
        instance = self._running()
        _check_invisible(invisible_duration_ms)
        request = messaging_pb2.ChangeInvisibleTimeRequest(
            consumer_group=self.config.consumer_group,
            topic=message.topic,
            receipt_handle=message.receipt_handle,
            invisible_time_ms=invisible_duration_ms,
        )
        addr = message.broker_addr
        timeout_s = self.config.request_timeout_ms / 1000
        response = await self._call(
            addr, lambda: instance.messaging(addr).ChangeInvisibleTime(request, timeout=timeout_s)
        )
        return dataclasses.replace(
            message,
            receipt_handle=response.receipt_handle,
            invisible_until_ms=response.invisible_until_ms,
        )

    async def _call(self, addr: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except grpc.RpcError as err:
            error = from_rpc_error(err, addr)
            if error.reason == "INVALID_RECEIPT_HANDLE":
                raise InvalidReceiptHandleError(
                    str(error), code=error.code, reason=error.reason, target=addr
                ) from None
            raise error from None


def _check_invisible(ms: int) -> None:
    if not INVISIBLE_MIN_MS <= ms <= INVISIBLE_MAX_MS:
        raise ValueError(
            f"invisible_duration_ms must be within {INVISIBLE_MIN_MS}..{INVISIBLE_MAX_MS}"
        )


def _broker_of(handle: str) -> str:
    """The broker name inside a receipt handle ("rq1|{broker}|...")."""
    parts = handle.split("|")
    return "|".join(parts[1:-2]) if len(parts) >= 4 else ""


class SyncSimpleConsumer(BlockingLifecycle):
    """A blocking :class:`SimpleConsumer` for code without asyncio: the async one runs on a
    private loop thread, and every method blocks until its call is done::

        with SyncSimpleConsumer(SimpleConsumerConfig("workers", ("127.0.0.1:9876",))) as c:
            c.subscribe("Orders")
            for m in c.receive(16, invisible_duration_ms=30_000):
                c.ack(m)
    """

    def __init__(self, config: SimpleConsumerConfig) -> None:
        self._loop = LoopThread("rocketq-simple-consumer")
        self._consumer = SimpleConsumer(config)
        self._producer = self._consumer  # what BlockingLifecycle starts and closes

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._loop.run(_call(self._consumer.subscribe, topic, expression))

    def unsubscribe(self, topic: str) -> None:
        self._loop.run(_call(self._consumer.unsubscribe, topic))

    def receive(
        self, max_messages: int = 16, invisible_duration_ms: int = 30_000
    ) -> list[PoppedMessage]:
        """See :meth:`SimpleConsumer.receive`."""
        return self._loop.run(self._consumer.receive(max_messages, invisible_duration_ms))

    def ack(self, message: PoppedMessage) -> None:
        self._loop.run(self._consumer.ack(message))

    def change_invisible_duration(
        self, message: PoppedMessage, invisible_duration_ms: int
    ) -> PoppedMessage:
        """See :meth:`SimpleConsumer.change_invisible_duration`."""
        return self._loop.run(
            self._consumer.change_invisible_duration(message, invisible_duration_ms)
        )


async def _call(fn: Callable[..., None], *args: Any) -> None:
    fn(*args)
