"""Wait on observable state, never on a sleep (STYLE.md habit 14).

``until`` polls a predicate — plain or async — until it is truthy and returns that value, or
fails the test naming what it waited for. Use it from async tests (``await until(...)``);
``until_sync`` is the same loop for synchronous tests and process helpers.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.05


@overload
async def until(
    pred: Callable[[], Awaitable[T]],
    what: str = ...,
    timeout_s: float = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def until(
    pred: Callable[[], T],
    what: str = ...,
    timeout_s: float = ...,
    interval_s: float = ...,
) -> T: ...


async def until(
    pred: Callable[[], object],
    what: str = "condition",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> object:
    """Poll ``pred()`` (awaited when it returns an awaitable) until it is truthy; return it.

    The predicate is evaluated once more at the deadline, so a condition that becomes true just
    as time runs out still counts.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def at_least(value: Awaitable[int], n: int) -> bool:
    """``await value >= n``: a predicate over a count read remotely, for ``until``::

    await until(lambda: at_least(client.held_pulls(), 1), "the pull held")
    """
    return await value >= n


def until_sync(
    pred: Callable[[], T],
    what: str = "condition",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> T:
    """``until`` for synchronous code: poll ``pred()`` until truthy and return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
