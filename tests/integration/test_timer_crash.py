"""The timer-wheel killed with SIGKILL mid-run and restarted on the same data dir (issue 5).

20 000 timers, each due 2-17 s after its send, fall due while they are still being sent. The
timer-wheel is killed twice with no warning: first while it is still reading new timers from
the broker (so some were read but not yet durable, and their consume offsets not committed),
then while it is busy delivering (so some re-puts were acknowledged but not yet checkpointed).
Each time it is restarted 1.5 s later; timers that fell due while it was down are delivered at
once.

Must hold: no timer lost, none delivered before its TIMER_OUT_MS (exact, same clock). Replays
after a crash are allowed at the wheel but the broker drops a re-put whose TIMER_SOURCE it
already stored, so with the broker alive no message may be *stored* twice; redeliveries of one
stored copy to the consumer are counted and printed. At the end nothing is pending.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from rocketq.client.errors import RocketQError
from rocketq.client.timer import TimerClient
from tests.integration.timer_support import (
    Recorder,
    TimerCluster,
    TimerSender,
    check_against_asked,
    count_duplicates,
    create_topic,
    recording_consumer,
    wait_assigned,
)
from tests.support.cluster import cluster
from tests.support.until import until

pytestmark = pytest.mark.integration

TIMERS = 20_000
LEAD_MS = 2_000
SPAN_MS = 15_000
"""Each timer is due LEAD_MS + a random part of SPAN_MS after its own send (speed 1)."""
DOWN_S = 1.5
"""How long the timer-wheel stays dead before its restart."""
QUEUES = 8


async def crash_and_restart(tc: TimerCluster, when: str) -> None:
    tc.timer.kill()
    print(f"SIGKILLed the timer-wheel {when}")
    await asyncio.sleep(DOWN_S)
    await asyncio.to_thread(tc.restart_timer)


async def pending_timers(tc: TimerCluster) -> int:
    async with TimerClient(tc.timer.addr) as timers:
        try:
            return (await timers.stats()).pending_timers
        except RocketQError:  # still recovering
            return -1


async def test_sigkill_mid_run_loses_no_timer(tmp_path: Path) -> None:
    with cluster(tmp_path, timer_wheel=True, clock_speed=1) as tc:
        topic = "TimerCrash"
        await create_topic(tc, topic, QUEUES)
        rec = Recorder(tc.clock)
        async with recording_consumer(
            tc, "g-crash", topic, rec, consume_message_batch_max_size=32
        ) as consumer:
            await wait_assigned(consumer, topic, QUEUES, timeout_s=15)
            rng = random.Random(7)
            sender = TimerSender(
                tc,
                topic,
                QUEUES,
                TIMERS,
                lambda i, now: now + LEAD_MS + rng.randrange(SPAN_MS),
                prefix="c",
                ahead_min_ms=LEAD_MS,
            )
            sending = asyncio.create_task(sender.run())
            # Crash 1: sends (and so the wheel's enqueue) in full swing, first timers due.
            await until(lambda: sender.sent >= TIMERS * 2 // 5, "40% of the sends", timeout_s=60)
            await until(lambda: rec.distinct() > 0, "the first delivery", timeout_s=30)
            await crash_and_restart(tc, f"after {sender.sent} sends, {rec.distinct()} delivered")
            await sending
            # Crash 2: everything sent, deliveries in full swing.
            await until(lambda: rec.distinct() >= TIMERS * 3 // 5, "60% delivered", timeout_s=60)
            await crash_and_restart(tc, f"with {rec.distinct()} of {TIMERS} delivered")
            last_due_s = (max(sender.wanted.values()) - tc.now_ms()) / 1000
            await rec.wait_distinct(
                TIMERS, max(last_due_s, 0) + 60, "timers after 2 crashes", sender.wanted
            )
            await asyncio.sleep(0.5)  # a quiet window: a duplicate re-put shows up in it

            async def drained() -> bool:
                return await pending_timers(tc) == 0

            await until(drained, "the timer-wheel to report no pending timers", 10, 0.1)
            pending = await pending_timers(tc)
        deliveries = rec.snapshot()
        dups = count_duplicates(rec.by_key())
        problems, direct = check_against_asked(deliveries, sender.wanted)
        print(
            f"{TIMERS} timers, {len(deliveries)} deliveries after 2 SIGKILLs; "
            f"sends took {sender.seconds:.1f} s, {direct} due on arrival; duplicates: {dups}"
        )
        assert not problems, f"{len(problems)} problems, e.g.:\n" + "\n".join(problems[:20])
        assert direct < TIMERS // 100, f"{direct} timers were due before the broker got them"
        assert dups.stored_twice == 0, (
            f"a re-put was stored twice (the broker must drop it): {dups}"
        )
        assert pending == 0, f"the restarted timer-wheel still reports {pending} pending timers"
        tc.check_logs()
