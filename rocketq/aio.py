"""Waiting with a time limit without losing a cancellation.

On Python 3.11, ``asyncio.wait_for(aw, t)`` swallows a cancellation that arrives while what it
waits for is completing: it returns that result instead of raising ``CancelledError`` (3.12
rebuilt ``wait_for`` on ``asyncio.timeout`` and fixed it). A loop of the form
``while True: await wait_for(event.wait(), t)`` then keeps running after ``task.cancel()``, and
whoever awaits the cancelled task waits forever: a PushConsumer whose rebalance was woken just
before ``close()`` never closed. ``asyncio.timeout`` has no such window (it counts the
cancellations it caused), and it awaits ``event.wait()`` directly, without a task per wait.

Like :mod:`rocketq.backoff` this loads no grpc and is shared with the server side.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set (True) or ``timeout_s`` has passed (False; None waits without
    limit). A cancellation of the caller always propagates."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            return await event.wait()
    except TimeoutError:
        return False
