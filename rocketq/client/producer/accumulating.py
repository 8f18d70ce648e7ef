"""A producer that batches for throughput (the accumulator / sender / facade split of aiokafka).

``send(msg)`` appends the message to an open batch and waits for that batch's result. A batch
leaves when it holds ``batch_max_bytes`` or ``batch_max_messages``, or ``linger_ms`` after its
first message, as one SendRequest (SPEC §5.5), so thousands of concurrent sends cost tens of
requests. Batches of normal sends go to a round-robin queue with the usual retries; a send with
``queue``/``selector``/``sharding_key`` joins the batch of that queue and is not retried
(order). Delayed messages travel alone. At most ``buffer_max_bytes`` wait or fly at once;
``send`` (and ``enqueue``) wait for room beyond that.

    async with AccumulatingProducer(AccumulatingProducerConfig("g", ["127.0.0.1:9876"])) as p:
        futures = [await p.enqueue(Message("t", b"x")) for _ in range(10_000)]
        results = await asyncio.gather(*futures)
"""

from __future__ import annotations

import asyncio
import contextlib

from rocketq.client._instance import ClientInstance
from rocketq.client.errors import ClientStateError
from rocketq.client.producer._accumulator import ProducerBatch, RecordAccumulator, monotonic_ms
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer._sender import BatchSender, PreparedMessage
from rocketq.client.producer.config import AccumulatingProducerConfig
from rocketq.client.producer.selectors import MessageQueueSelector
from rocketq.message import Message, MessageQueue, SendResult


class AccumulatingProducer:
    """Sends messages in batches built from concurrent ``send`` calls."""

    def __init__(self, config: AccumulatingProducerConfig) -> None:
        self.config = config
        self._core = ProducerCore(config)
        self._acc: RecordAccumulator[PreparedMessage] | None = None
        self._sender: BatchSender | None = None
        self._sender_task: asyncio.Task[None] | None = None

    @property
    def instance(self) -> ClientInstance:
        return self._core.instance

    async def start(self) -> None:
        cfg = self.config
        await self._core.start()
        acc: RecordAccumulator[PreparedMessage] = RecordAccumulator(
            linger_ms=cfg.linger_ms,
            batch_max_bytes=cfg.batch_max_bytes,
            batch_max_messages=cfg.batch_max_messages,
            buffer_max_bytes=cfg.buffer_max_bytes,
        )
        self._acc = acc
        self._sender = BatchSender(
            acc, self._send_batch, in_flight_max=cfg.in_flight_batches_max, now_ms=monotonic_ms
        )
        self._sender_task = asyncio.create_task(self._sender.run(), name="rocketq-batch-sender")

    async def _send_batch(self, batch: ProducerBatch[PreparedMessage]) -> list[SendResult]:
        core, cfg = self._core, self.config
        if batch.queue is not None:
            return await core.send_to_queue(batch.queue, batch.items, cfg.send_msg_timeout_ms)
        return await core.send_with_retries(
            batch.topic,
            batch.items,
            timeout_ms=cfg.send_msg_timeout_ms,
            retries=cfg.retry_times_when_send_failed,
        )

    async def enqueue(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        sharding_key: object = None,
    ) -> asyncio.Future[SendResult]:
        """Add ``msg`` to a batch (waiting for buffer room) and return its result's future."""
        acc = self._acc
        if acc is None or not self._core.running:
            raise ClientStateError("the producer is not running; call start() first")
        item = self._core.prepare(msg)
        mq = await self._core.resolve_queue(msg, queue, selector, arg, sharding_key)
        return await acc.append((msg.topic, mq), item, item.size_bytes, solo=item.delayed)

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        sharding_key: object = None,
    ) -> SendResult:
        """Send ``msg`` in the next batch and wait for its result."""
        fut = await self.enqueue(
            msg, queue=queue, selector=selector, arg=arg, sharding_key=sharding_key
        )
        return await fut

    async def flush(self) -> None:
        """Send every waiting batch now and wait until all sends so far are finished."""
        if self._acc is None:
            return
        done = self._acc.close_all()
        if done:
            await asyncio.wait(done)

    async def close(self) -> None:
        """Flush, stop the sender and leave the client instance."""
        if self._acc is not None and self._core.running:
            await self.flush()
        if self._sender_task is not None:
            self._sender_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender_task
            self._sender_task = None
        if self._acc is not None:
            self._acc.fail_all(ClientStateError("the producer closed before this was sent"))
        await self._core.close()

    async def __aenter__(self) -> AccumulatingProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
