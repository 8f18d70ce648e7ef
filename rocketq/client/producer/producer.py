"""The producer facade: send modes over the shared core (SPEC §5.2).

| method      | waits for          | retries                                  | queue           |
|-------------|--------------------|------------------------------------------|-----------------|
| send        | the broker's reply | retry_times_when_send_failed, each on    | round-robin, or |
|             |                    | another broker; none when ordered        | queue/selector  |
| send_async  | nothing (a Future) | retry_times_when_send_async_failed,      | round-robin     |
|             |                    | on the same broker                       |                 |
| send_oneway | gRPC taking it     | none                                     | round-robin, or |
|             |                    |                                          | queue/selector  |
| send_batch  | the broker's reply | as send                                  | round-robin, or |
|             |                    |                                          | queue           |

Everything a producer can check itself (topic name, empty body, size, reserved properties) is
checked before any network call and raised as InvalidArgumentError / MessageTooLargeError.

    async with Producer(ProducerConfig("my-group", ["127.0.0.1:9876"])) as p:
        result = await p.send(Message("orders", b"..."), sharding_key="order-42")
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from rocketq.client._instance import ClientInstance
from rocketq.client.errors import ResourceExhaustedError
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer.config import ProducerConfig
from rocketq.client.producer.selectors import MessageQueueSelector
from rocketq.message import Message, MessageQueue, SendResult

log = logging.getLogger(__name__)

SendCallback = Callable[[SendResult | None, BaseException | None], None]
"""``callback(result, None)`` on success, ``callback(None, error)`` on failure."""


class Producer:
    """Sends messages to RocketQ brokers (RocketMQ's ``DefaultMQProducer``), asyncio first."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self._core = ProducerCore(config)
        self._pending: set[asyncio.Future[object]] = set()

    @property
    def client_id(self) -> str:
        return self._core.instance.client_id

    @property
    def instance(self) -> ClientInstance:
        """The shared client instance (routes, channels); available once started."""
        return self._core.instance

    async def start(self) -> None:
        """Register the group with the client instance; call once before sending."""
        await self._core.start()

    async def close(self) -> None:
        """Wait (bounded) for async and oneway sends in flight, then leave the instance."""
        if self._pending:
            await asyncio.wait(
                list(self._pending), timeout=self.config.send_msg_timeout_ms / 1000 + 1
            )
        await self._core.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- send modes ----------------------------------------------------------------------

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        sharding_key: object = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Send and wait for the broker (sync mode).

        Without ``queue``/``selector``/``sharding_key`` the queue is chosen round-robin and a
        retriable failure is retried on another broker. With one of them the send is *ordered*:
        ``queue`` is used as given, ``selector.select(queues, msg, arg)`` picks one, or
        ``sharding_key`` picks ``abs(hashCode(key) % n)`` like RocketMQ's SelectMessageQueueByHash;
        ordered sends are never retried (a retry elsewhere would break the order).
        """
        core = self._core
        item = core.prepare(msg)
        timeout = timeout_ms or self.config.send_msg_timeout_ms
        mq = await core.resolve_queue(msg, queue, selector, arg, sharding_key)
        if mq is not None:
            return (await core.send_to_queue(mq, [item], timeout))[0]
        results = await core.send_with_retries(
            msg.topic, [item], timeout_ms=timeout, retries=self.config.retry_times_when_send_failed
        )
        return results[0]

    def send_async(
        self, msg: Message, callback: SendCallback | None = None, *, timeout_ms: int | None = None
    ) -> asyncio.Future[SendResult]:
        """Start a send and return its future at once; ``callback`` also gets the outcome.

        Bad input raises here, before anything is sent. Retries stay on the first broker.
        """
        core = self._core
        core.instance  # noqa: B018 - raises ClientStateError unless started
        if len(self._pending) >= self.config.async_in_flight_max:
            raise ResourceExhaustedError(
                f"{len(self._pending)} async sends are in flight (async_in_flight_max); "
                "await some of them first"
            )
        item = core.prepare(msg)
        timeout = timeout_ms or self.config.send_msg_timeout_ms

        async def one() -> SendResult:
            results = await core.send_with_retries(
                msg.topic,
                [item],
                timeout_ms=timeout,
                retries=self.config.retry_times_when_send_async_failed,
                same_queue=True,
            )
            return results[0]

        fut = asyncio.ensure_future(one())
        self._track(fut)
        if callback is not None:
            fut.add_done_callback(lambda f: _run_callback(callback, f))
        return fut

    async def send_oneway(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        sharding_key: object = None,
    ) -> None:
        """Hand the message to gRPC and return without waiting for the broker; no retry."""
        core = self._core
        item = core.prepare(msg)
        mq = await core.resolve_queue(msg, queue, selector, arg, sharding_key)
        self._track(await core.send_oneway(mq, item, self.config.send_msg_timeout_ms))

    async def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout_ms: int | None = None,
    ) -> list[SendResult]:
        """Send several messages of one topic in one request, stored together (SPEC §5.5).

        No delayed messages; at most ``max_message_size_bytes`` in total. Retried like
        :meth:`send` unless ``queue`` is given. Results are in message order.
        """
        core = self._core
        items = core.prepare_batch(msgs)
        timeout = timeout_ms or self.config.send_msg_timeout_ms
        if queue is not None:
            mq = await core.resolve_queue(msgs[0], queue, None, None, None)
            assert mq is not None
            return await core.send_to_queue(mq, items, timeout)
        return await core.send_with_retries(
            items[0].topic,
            items,
            timeout_ms=timeout,
            retries=self.config.retry_times_when_send_failed,
        )

    def _track(self, fut: asyncio.Future[object] | asyncio.Future[SendResult]) -> None:
        f: asyncio.Future[object] = fut  # type: ignore[assignment]
        self._pending.add(f)
        f.add_done_callback(self._untrack)

    def _untrack(self, fut: asyncio.Future[object]) -> None:
        self._pending.discard(fut)
        if not fut.cancelled():
            fut.exception()  # the caller may only use the callback; never "exception not retrieved"


def _run_callback(callback: SendCallback, fut: asyncio.Future[SendResult]) -> None:
    try:
        if fut.cancelled():
            callback(None, asyncio.CancelledError())
        elif fut.exception() is not None:
            callback(None, fut.exception())
        else:
            callback(fut.result(), None)
    except Exception:
        log.exception("send callback raised")
