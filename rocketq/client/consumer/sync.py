"""Blocking consumers for code without asyncio: thin wrappers over the async ones.

Each wrapper owns a private event-loop thread (:class:`rocketq.client._sync.LoopThread`) and
runs its async twin there; every method blocks until the twin's coroutine is done. A plain
listener of :class:`SyncPushConsumer` runs on the consume thread pool as usual, so it may block.
Methods that touch a running consumer's state are run on the loop thread, never from the
caller's thread, because the async consumer is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from rocketq.client._sync import LoopThread
from rocketq.client.consumer._subscription import SUB_ALL
from rocketq.client.consumer.config import (
    ExpressionType,
    LitePullConsumerConfig,
    MessageListener,
    OrderlyMessageListener,
    PushConsumerConfig,
    SubscriptionConflict,
)
from rocketq.client.consumer.lite_pull import LitePullConsumer
from rocketq.client.consumer.push_consumer import PushConsumer
from rocketq.client.errors import ClientStateError
from rocketq.message import MessageQueue, ReceivedMessage

T = TypeVar("T")
C = TypeVar("C", PushConsumer, LitePullConsumer)


async def _call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class _Wrapper(Generic[C]):
    """Runs calls on a private loop thread once started; directly before that. Holds what both
    blocking consumers share: life cycle, context manager, client id and subscriptions."""

    def __init__(self, name: str, consumer: C) -> None:
        self._name = name
        self._loop: LoopThread | None = None
        self._consumer: C = consumer

    @property
    def client_id(self) -> str:
        return self._consumer.client_id

    def subscribe(
        self,
        topic: str,
        expression: str = SUB_ALL,
        expression_type: ExpressionType = ExpressionType.TAG,
    ) -> None:
        """See :meth:`PushConsumer.subscribe`."""
        self._on_loop(self._consumer.subscribe, topic, expression, expression_type)

    def unsubscribe(self, topic: str) -> None:
        """See :meth:`PushConsumer.unsubscribe`."""
        self._on_loop(self._consumer.unsubscribe, topic)

    def subscription_conflicts(self) -> list[SubscriptionConflict]:
        """See :meth:`PushConsumer.subscription_conflicts`."""
        return self._on_loop(self._consumer.subscription_conflicts)

    def start(self) -> None:
        """Start the consumer on its own loop thread."""
        loop = self._start_loop()
        try:
            loop.run(self._consumer.start())
        except BaseException:
            self._stop_loop()
            raise

    def close(self) -> None:
        """Close the consumer cleanly (offsets persisted), then stop the loop thread."""
        if self._loop is None:
            return
        try:
            self._loop.run(self._consumer.close())
        finally:
            self._stop_loop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        if self._loop is None:
            return fn(*args)
        return self._loop.run(_call(fn, *args))

    def _start_loop(self) -> LoopThread:
        if self._loop is not None:
            raise ClientStateError("this consumer is already started")
        self._loop = LoopThread(name=self._name)
        return self._loop

    def _stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.close()

    def _running(self) -> LoopThread:
        if self._loop is None:
            raise ClientStateError("start the consumer first")
        return self._loop


class SyncPushConsumer(_Wrapper[PushConsumer]):
    """The blocking :class:`PushConsumer`: ``with SyncPushConsumer(cfg, listener) as c: ...``
    (``orderly=True`` for an orderly listener, as for PushConsumer)."""

    def __init__(
        self,
        config: PushConsumerConfig,
        listener: MessageListener | OrderlyMessageListener,
        *,
        orderly: bool = False,
    ) -> None:
        super().__init__(
            f"rocketq-push-{config.consumer_group}",
            PushConsumer(config, listener, orderly=orderly),
        )

    def suspend(self) -> None:
        self._on_loop(self._consumer.suspend)

    def resume(self) -> None:
        self._on_loop(self._consumer.resume)

    def assigned_queues(self) -> list[MessageQueue]:
        return self._on_loop(self._consumer.assigned_queues)

    def consume_offsets(self, topic: str = "") -> dict[MessageQueue, int]:
        return self._on_loop(self._consumer.consume_offsets, topic)

    def persist_offsets(self) -> None:
        self._running().run(self._consumer.persist_offsets())


class SyncLitePullConsumer(_Wrapper[LitePullConsumer]):
    """The blocking :class:`LitePullConsumer`."""

    def __init__(self, config: LitePullConsumerConfig) -> None:
        super().__init__(f"rocketq-lite-pull-{config.consumer_group}", LitePullConsumer(config))

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        self._on_loop(self._consumer.assign, list(queues))

    def assignment(self) -> list[MessageQueue]:
        return self._on_loop(self._consumer.assignment)

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        self._on_loop(self._consumer.pause, list(queues))

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        self._on_loop(self._consumer.resume, list(queues))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._running().run(self._consumer.fetch_message_queues(topic))

    def poll(self, timeout_ms: int | None = None) -> list[ReceivedMessage]:
        """Block up to ``timeout_ms`` for the next batch; [] when nothing arrived."""
        return self._running().run(self._consumer.poll(timeout_ms))

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._running().run(self._consumer.seek(mq, offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._running().run(self._consumer.seek_to_begin(mq))

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._running().run(self._consumer.seek_to_end(mq))

    def commit_sync(self) -> None:
        self._running().run(self._consumer.commit_sync())

    def commit(self, offsets: Mapping[MessageQueue, int], persist: bool = True) -> None:
        self._running().run(self._consumer.commit(dict(offsets), persist))

    def committed(self, mq: MessageQueue) -> int:
        return self._running().run(self._consumer.committed(mq))
