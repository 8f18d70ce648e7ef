"""A private event-loop thread, so blocking wrappers can drive the asyncio SDK.

The SDK is asyncio first (STYLE.md habit 4): every network method is a coroutine. The blocking
classes (SyncProducer, SyncPushConsumer, ...) own one :class:`LoopThread` each and run their
async twin on it, so a plain script, a thread pool or a web framework without asyncio can use
RocketQ without ever seeing a loop.

Why a thread per wrapper rather than one process-wide loop: a wrapper's close() then stops
exactly what it started, and a slow listener in one consumer cannot stall another's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Protocol, Self, TypeVar

T = TypeVar("T")

#: How long close() waits for the loop's leftover tasks to finish after cancelling them.
_CLOSE_GRACE_S = 5.0


class LoopThread:
    """An asyncio event loop running forever on a daemon thread.

    ``submit`` hands it a coroutine from any other thread and returns a
    :class:`concurrent.futures.Future`; ``run`` does the same and waits for the result.
    """

    def __init__(self, name: str = "rocketq-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; thread-safe, returns at once."""
        if self._closed:
            coro.close()
            raise RuntimeError("this LoopThread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it returns (or raises) its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop; await the coroutine")
        return self.submit(coro).result(timeout_s)

    def close(self) -> None:
        """Cancel what is still running on the loop, stop it and join the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop)
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                fut.result(_CLOSE_GRACE_S + 1.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CLOSE_GRACE_S)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLifecycle(Protocol):
    """What a blocking wrapper drives: an async client with ``start`` and ``close``."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class BlockingLifecycle:
    """``start`` / ``close`` / ``with`` of a blocking producer wrapper: its async twin
    ``_producer`` runs on its own ``_loop``, and closing stops that loop even if the twin's
    close fails. Subclasses set both attributes in ``__init__``."""

    _loop: LoopThread
    _producer: AsyncLifecycle

    def start(self) -> None:
        self._loop.run(self._producer.start())

    def close(self) -> None:
        try:
            self._loop.run(self._producer.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_CLOSE_GRACE_S)
