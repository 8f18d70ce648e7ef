"""Waiting with a time limit keeps a cancellation (rocketq.aio): the loops that wait on an event
between rounds — the consumer's rebalance, the producer's sender, the broker's heartbeat — end
when they are cancelled, even if the event was set in the same instant."""

from __future__ import annotations

import asyncio

import pytest

from rocketq.aio import wait_event
from rocketq.client.consumer._rebalance import RebalanceService

pytestmark = pytest.mark.unit

HANG_GUARD_S = 5.0
"""Only against a hang: a task that kept running after its cancel would be awaited forever."""


async def test_wait_event_answers_set_or_timed_out() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, None) is True
    assert await wait_event(event, 0) is True  # already set: no wait at all


@pytest.mark.parametrize("turns", range(5))
async def test_a_rebalance_loop_woken_just_before_its_cancel_ends(turns: int) -> None:
    """``asyncio.wait_for`` on 3.11 turned this cancel into a normal return (the event had just
    fired), the loop went on, and PushConsumer.close() waited for it forever. The cancel is
    issued ``turns`` loop turns after the wake-up, to cover every step of the event's firing."""
    loop = asyncio.get_running_loop()
    rounds = 0

    async def rebalance() -> bool:
        nonlocal rounds
        rounds += 1
        return True

    service = RebalanceService(rebalance, 60_000, "woken-then-closed")
    service.start()
    while rounds < 1:
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # the loop is waiting on its event now
    task = service._task
    assert task is not None
    cancelled = asyncio.Event()

    def cancel_after(left: int) -> None:
        if left:
            loop.call_soon(cancel_after, left - 1)
        else:
            task.cancel()
            cancelled.set()

    service.wakeup()
    cancel_after(turns)
    await cancelled.wait()
    async with asyncio.timeout(HANG_GUARD_S):
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
