"""Batches of messages waiting to be sent, and their futures (no sockets; after aiokafka's
``message_accumulator.py``).

An :class:`AccumulatingProducer` does not send each message on its own: it appends it here,
to the open batch of its key (a topic with "any queue", or one fixed queue), and gets a future.
The sender (``_sender.BatchSender``) drains batches that are *ready*:

- full: one more message would pass ``batch_max_bytes`` or ``batch_max_messages``
  (a message bigger than ``batch_max_bytes`` travels alone);
- old: the batch has waited ``linger_ms`` since its first message;
- solo: a delayed message, which a batch may not hold (SPEC §5.5), is a batch of one;
- flushed: :meth:`RecordAccumulator.close_all` was called.

Backpressure: at most ``buffer_max_bytes`` of messages sit in batches or in flight. ``append``
waits for room; a batch's bytes are released when its send is over (acknowledged or failed).
A message larger than the whole buffer still goes when the buffer is empty, so nothing waits
forever.

Time comes from an injected ``now_ms`` so linger is tested with a manual clock.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rocketq.message import MessageQueue, SendResult

T = TypeVar("T")

#: Key of a batch: the topic, and a fixed queue or None for "any writable queue".
BatchKey = tuple[str, MessageQueue | None]


def monotonic_ms() -> int:
    """The default clock: monotonic milliseconds."""
    return time.monotonic_ns() // 1_000_000


@dataclass(eq=False)
class ProducerBatch(Generic[T]):
    """Messages that will travel in one SendRequest, each with its result future."""

    key: BatchKey
    created_ms: int
    items: list[T] = field(default_factory=list)
    futures: list[asyncio.Future[SendResult]] = field(default_factory=list)
    size_bytes: int = 0
    closed: bool = False
    """No more appends: full, solo or flushed. Ready to send regardless of linger."""

    @property
    def topic(self) -> str:
        return self.key[0]

    @property
    def queue(self) -> MessageQueue | None:
        return self.key[1]

    def complete(self, results: list[SendResult]) -> None:
        for fut, result in zip(self.futures, results, strict=True):
            if not fut.done():
                fut.set_result(result)

    def fail(self, exc: BaseException) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_exception(exc)


class RecordAccumulator(Generic[T]):
    """Open batches per key, bounded by size, count, linger and a total buffer."""

    def __init__(
        self,
        *,
        linger_ms: int,
        batch_max_bytes: int,
        batch_max_messages: int,
        buffer_max_bytes: int,
        now_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        if linger_ms < 0 or batch_max_bytes <= 0 or batch_max_messages <= 0:
            raise ValueError("linger_ms >= 0, batch_max_bytes > 0 and batch_max_messages > 0")
        if buffer_max_bytes < batch_max_bytes:
            raise ValueError("buffer_max_bytes must be at least batch_max_bytes")
        self.linger_ms = linger_ms
        self.batch_max_bytes = batch_max_bytes
        self.batch_max_messages = batch_max_messages
        self.buffer_max_bytes = buffer_max_bytes
        self._now_ms = now_ms
        self._open: dict[BatchKey, ProducerBatch[T]] = {}
        # Batches closed but not yet drained, in the order they closed.
        self._closed: deque[ProducerBatch[T]] = deque()
        # Every batch not yet released: waiting, or handed to the sender and in flight.
        self._unreleased: dict[int, tuple[ProducerBatch[T], asyncio.Future[None]]] = {}
        self._buffered_bytes = 0
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self.wakeup = asyncio.Event()
        """Set when a batch is created or closed: the sender should look again."""

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    def _track(self, batch: ProducerBatch[T]) -> None:
        self._unreleased[id(batch)] = (batch, asyncio.get_running_loop().create_future())

    async def append(
        self, key: BatchKey, item: T, size_bytes: int, *, solo: bool = False
    ) -> asyncio.Future[SendResult]:
        """Add ``item`` to its key's batch, waiting while the buffer is full; returns its future."""
        while self._buffered_bytes and self._buffered_bytes + size_bytes > self.buffer_max_bytes:
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiters.append(waiter)
            await waiter
        self._buffered_bytes += size_bytes
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        batch = None if solo else self._open.get(key)
        if batch is not None and not self._fits(batch, size_bytes):
            self._close(batch)
            batch = None
        if batch is None:
            batch = ProducerBatch(key, self._now_ms())
            self._track(batch)
            if not solo:
                self._open[key] = batch
            self.wakeup.set()
        batch.items.append(item)
        batch.futures.append(fut)
        batch.size_bytes += size_bytes
        if solo or self._is_full(batch):
            self._close(batch)
        return fut

    def _fits(self, batch: ProducerBatch[T], size_bytes: int) -> bool:
        return (
            len(batch.items) < self.batch_max_messages
            and batch.size_bytes + size_bytes <= self.batch_max_bytes
        )

    def _is_full(self, batch: ProducerBatch[T]) -> bool:
        return (
            len(batch.items) >= self.batch_max_messages or batch.size_bytes >= self.batch_max_bytes
        )

    def _close(self, batch: ProducerBatch[T]) -> None:
        if batch.closed:
            return
        batch.closed = True
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        self._closed.append(batch)
        self.wakeup.set()

    def drain_ready(self) -> list[ProducerBatch[T]]:
        """Remove and return every ready batch: closed ones, then open ones past their linger."""
        now = self._now_ms()
        for batch in list(self._open.values()):
            if now - batch.created_ms >= self.linger_ms:
                self._close(batch)
        ready = list(self._closed)
        self._closed.clear()
        return ready

    def next_deadline_ms(self) -> int | None:
        """When the oldest open batch's linger ends (None when no batch is open)."""
        if not self._open:
            return None
        return min(b.created_ms for b in self._open.values()) + self.linger_ms

    def close_all(self) -> list[asyncio.Future[None]]:
        """Make every open batch ready now; returns futures done when all current batches are
        released (flush waits on them)."""
        for batch in list(self._open.values()):
            self._close(batch)
        return [done for _batch, done in self._unreleased.values()]

    def release(self, batch: ProducerBatch[T]) -> None:
        """The batch's send is over: free its bytes and wake appenders waiting for room."""
        entry = self._unreleased.pop(id(batch), None)
        if entry is None:
            return
        self._buffered_bytes -= batch.size_bytes
        if not entry[1].done():
            entry[1].set_result(None)
        while self._space_waiters:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def fail_all(self, exc: BaseException) -> None:
        """Fail and release every batch not yet drained (used when the producer closes hard)."""
        for batch in [*self._open.values(), *self._closed]:
            batch.fail(exc)
            self.release(batch)
        self._open.clear()
        self._closed.clear()

    @property
    def unreleased_count(self) -> int:
        return len(self._unreleased)
