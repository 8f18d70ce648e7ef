"""Waiting with a time limit keeps a cancellation (rocketq.aio): the loops that wait on an event
between rounds — the consumer's rebalance, the producer's sender, the broker's heartbeat — end
when they are cancelled, even if the event was set in the same instant."""

from __future__ import annotations

import asyncio

import pytest

from rocketq.aio import wait_event
from rocketq.client.consumer._rebalance import RebalanceService
from services.broker.controller.session import EtcdSession

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


@pytest.mark.parametrize("turns", range(4))
async def test_an_etcd_call_completing_as_its_caller_is_cancelled_raises_the_cancel(
    turns: int,
) -> None:
    """The broker's etcd session: a loop calling etcd (the ISR publisher) cancelled as its call
    completed kept running under ``wait_for``, and the demotion awaiting it hung holding the
    role lock. The call here is a future answered ``turns`` loop turns before the cancel."""
    loop = asyncio.get_running_loop()
    session = EtcdSession(["127.0.0.1:1"], call_timeout_s=5)  # fn never touches the client
    answer: asyncio.Future[str] = loop.create_future()

    async def fn(_client: object) -> str:
        return await answer

    async def caller() -> str:
        return await session.call(fn, "publish")

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # the call is waiting on its answer
    answer.set_result("ok")
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            result = await task
    except asyncio.CancelledError:
        result = "cancelled"
    await session.close()
    # Cancelled, or (the cancel came after the call returned) a normal result: never a
    # cancel turned into a result while the caller was still inside the call.
    assert result == "cancelled" or (turns > 0 and task.cancelling() == 0)
