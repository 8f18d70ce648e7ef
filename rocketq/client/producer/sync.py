"""Blocking producers for code without asyncio: thin wrappers that run the async producer on a
private event-loop thread (rocketq.client._sync.LoopThread).

    with SyncProducer(ProducerConfig("g", ["127.0.0.1:9876"])) as p:
        p.send(Message("orders", b"..."))
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence

from rocketq.client._sync import BlockingLifecycle, LoopThread
from rocketq.client.producer.accumulating import AccumulatingProducer
from rocketq.client.producer.config import AccumulatingProducerConfig, ProducerConfig
from rocketq.client.producer.producer import Producer, SendCallback
from rocketq.client.producer.selectors import MessageQueueSelector
from rocketq.message import Message, MessageQueue, SendResult


class SyncProducer(BlockingLifecycle):
    """:class:`Producer` with blocking methods; callbacks run on the producer's loop thread."""

    _producer: Producer

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self._loop = LoopThread("rocketq-producer")
        self._producer = Producer(config)

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        sharding_key: object = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """:meth:`Producer.send`, blocking."""
        return self._loop.run(
            self._producer.send(
                msg,
                queue=queue,
                selector=selector,
                arg=arg,
                sharding_key=sharding_key,
                timeout_ms=timeout_ms,
            )
        )

    def send_async(
        self, msg: Message, callback: SendCallback | None = None
    ) -> concurrent.futures.Future[SendResult]:
        """:meth:`Producer.send_async`; bad input raises here, the rest goes to the future."""
        fut = self._loop.run(_start_async(self._producer, msg, callback))
        return self._loop.submit(_await(fut))

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        """:meth:`Producer.send_oneway`, blocking until gRPC has the message."""
        self._loop.run(self._producer.send_oneway(msg, queue=queue))

    def send_batch(
        self, msgs: Sequence[Message], *, queue: MessageQueue | None = None
    ) -> list[SendResult]:
        """:meth:`Producer.send_batch`, blocking."""
        return self._loop.run(self._producer.send_batch(msgs, queue=queue))


async def _start_async(
    producer: Producer, msg: Message, callback: SendCallback | None
) -> asyncio.Future[SendResult]:
    # Started on the loop, so input errors raise in the caller's thread via run().
    return producer.send_async(msg, callback)


async def _await(fut: asyncio.Future[SendResult]) -> SendResult:
    return await fut


class SyncAccumulatingProducer(BlockingLifecycle):
    """:class:`AccumulatingProducer` with blocking methods."""

    _producer: AccumulatingProducer

    def __init__(self, config: AccumulatingProducerConfig) -> None:
        self.config = config
        self._loop = LoopThread("rocketq-accumulating-producer")
        self._producer = AccumulatingProducer(config)

    def send(self, msg: Message, *, sharding_key: object = None) -> SendResult:
        """Send in the next batch and block until its result (one thread sends one at a time;
        use :meth:`send_async` or several threads for throughput)."""
        return self._loop.run(self._producer.send(msg, sharding_key=sharding_key))

    def send_async(
        self, msg: Message, *, sharding_key: object = None
    ) -> concurrent.futures.Future[SendResult]:
        """Enqueue (blocking while the buffer is full) and return the result's future."""
        fut = self._loop.run(self._producer.enqueue(msg, sharding_key=sharding_key))
        return self._loop.submit(_await(fut))

    def flush(self) -> None:
        self._loop.run(self._producer.flush())
