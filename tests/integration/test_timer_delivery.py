"""Delayed messages end to end: a real broker and timer-wheel, delay levels and delivery times.

What must hold (issue 5, SPEC §8): a delayed message is never delivered before its time, and
under light load it arrives within one second after it.

- "Never early" is exact. The broker stamps each delayed message's delivery time
  (TIMER_OUT_MS, scaled ms) and the consumer notes its receive time on the same scaled clock
  (tests/integration/timer_support.py), so ``received >= TIMER_OUT_MS`` and
  ``stored >= TIMER_OUT_MS`` are compared with no tolerance, as is ``TIMER_OUT_MS >= send
  start + delay``.
- "Late" is bounded in real time: LATE_REAL_MS (1 s, the issue's bound) of real time, which is
  ``1 s × speed`` on a sped-up clock. At speed 720 every real millisecond of RPC, fsync,
  long-poll wake-up or wheel tick shows up as 0.72 s of scaled lateness, so a bound of 1 s
  scaled would measure the machine, not the wheel; 1 s real is what the issue asks for.

Levels 1-3 (1 s, 5 s, 10 s) run in real time; all 18 levels run at speed 720 (2 h in 10 s).
100 000 timers, each due at a random moment of the (scaled) minute after it is sent, must each
arrive, none early; duplicates are counted (the broker drops a re-put it already stored, so a
stored duplicate is a bug).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rocketq.client.producer import Producer, ProducerConfig
from rocketq.client.timer import TimerClient
from rocketq.message import Message
from tests.integration.timer_support import (
    DELAY_LEVELS_MS,
    Delivery,
    Recorder,
    TimerCluster,
    TimerSender,
    check_against_asked,
    count_duplicates,
    create_topic,
    early_deliveries,
    recording_consumer,
    wait_assigned,
)
from tests.support.cluster import cluster

pytestmark = pytest.mark.integration

LATE_REAL_MS = 1_000
"""Largest lateness allowed under light load, in real ms (issue 5)."""
FAST_SPEED = 720
"""Clock speed of the all-levels test: level 18 (2 h) passes in 10 s."""
MANY_TIMERS = 100_000
MANY_SPEED = 4
"""Clock speed of the 100 000-timer test: a minute of delivery times passes in 15 s."""
MANY_SPAN_MS = 60_000
MANY_LEAD_MS = 4_000
"""Each timer is due MANY_LEAD_MS + a random part of MANY_SPAN_MS (scaled) after its own send:
sending 100 000 single messages takes the broker 40-120 s of real time (about 2 500/s idle,
800/s on a loaded 2-core machine), longer than the minute, so delivery times are drawn from
the minute after each send rather than after the first one."""
SEND_CONCURRENCY = 64


@pytest.fixture(scope="module")
def realtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TimerCluster]:
    with cluster(tmp_path_factory.mktemp("timer_rt"), timer_wheel=True, clock_speed=1) as tc:
        yield tc
        tc.check_logs()


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TimerCluster]:
    with cluster(
        tmp_path_factory.mktemp("timer_fast"), timer_wheel=True, clock_speed=FAST_SPEED
    ) as tc:
        yield tc
        tc.check_logs()


@dataclass
class Sent:
    key: str
    delay_ms: int
    start_ms: int
    end_ms: int
    msg_id: str


async def send_levels(tc: TimerCluster, topic: str, levels: list[int], copies: int) -> list[Sent]:
    """Send ``copies`` messages per delay level with the SDK producer, concurrently."""
    producer = Producer(ProducerConfig(group=f"pg-{topic}", namesrv_addrs=tc.namesrv_addrs))
    await producer.start()
    try:

        async def one(level: int, copy: int) -> Sent:
            key = f"{topic}-L{level}-{copy}"
            start = tc.now_ms()
            result = await producer.send(Message(topic, key.encode(), delay_level=level))
            return Sent(key, DELAY_LEVELS_MS[level - 1], start, tc.now_ms(), result.msg_id)

        return list(await asyncio.gather(*(one(lv, c) for lv in levels for c in range(copies))))
    finally:
        await producer.close()


def check_on_time(tc: TimerCluster, sent: list[Sent], rec: Recorder) -> None:
    """Each message exactly once, stamped and delivered no earlier than its delay, and at most
    LATE_REAL_MS (real) late."""
    by_key = rec.by_key()
    late_bound_ms = tc.scaled(LATE_REAL_MS)
    problems: list[str] = []
    for s in sent:
        ds = by_key.get(s.key, [])
        if len(ds) != 1:
            problems.append(f"{s.key}: delivered {len(ds)} times")
            continue
        d = ds[0]
        if d.out_ms is None:
            problems.append(f"{s.key}: delivered without TIMER_OUT_MS (never delayed?)")
            continue
        if not s.start_ms + s.delay_ms <= d.out_ms <= s.end_ms + s.delay_ms:
            problems.append(
                f"{s.key}: TIMER_OUT_MS {d.out_ms} outside send time + {s.delay_ms} ms = "
                f"[{s.start_ms + s.delay_ms}, {s.end_ms + s.delay_ms}]"
            )
        if d.recv_ms < s.start_ms + s.delay_ms:
            problems.append(
                f"{s.key}: EARLY, received {s.start_ms + s.delay_ms - d.recv_ms} ms before "
                f"its {s.delay_ms} ms delay ended"
            )
        if d.recv_ms - d.out_ms > late_bound_ms:
            problems.append(
                f"{s.key} (delay {s.delay_ms} ms): {d.recv_ms - d.out_ms} ms late (scaled), "
                f"bound {late_bound_ms} = {LATE_REAL_MS} ms real x speed {tc.speed:g}"
            )
        if d.msg_id != s.msg_id:
            problems.append(f"{s.key}: delivered with id {d.msg_id}, sent as {s.msg_id}")
    problems += early_deliveries(rec.snapshot())
    late = sorted((d.recv_ms - d.out_ms) / tc.speed for d in rec.snapshot() if d.out_ms)
    if late:
        print(f"\nlateness in real ms at speed {tc.speed:g}: min {late[0]:.0f}, max {late[-1]:.0f}")
    assert not problems, "\n".join(problems)


async def test_levels_1_to_3_in_real_time(realtime: TimerCluster) -> None:
    topic = "TimerLevelsRt"
    await create_topic(realtime, topic)
    rec = Recorder(realtime.clock)
    async with recording_consumer(realtime, "g-levels-rt", topic, rec) as consumer:
        await wait_assigned(consumer, topic, 4, timeout_s=15)
        sent = await send_levels(realtime, topic, [1, 2, 3], copies=2)
        await rec.wait_distinct(len(sent), 25, "levels 1-3", [s.key for s in sent])
        await asyncio.sleep(0.3)  # a duplicate would show up now
    check_on_time(realtime, sent, rec)


async def test_all_18_levels_on_a_fast_clock(fast: TimerCluster) -> None:
    topic = "TimerLevelsFast"
    await create_topic(fast, topic)
    rec = Recorder(fast.clock)
    async with recording_consumer(fast, "g-levels-fast", topic, rec) as consumer:
        await wait_assigned(consumer, topic, 4, timeout_s=15)
        sent = await send_levels(fast, topic, list(range(1, 19)), copies=2)
        two_hours_real_s = DELAY_LEVELS_MS[-1] / FAST_SPEED / 1000
        await rec.wait_distinct(
            len(sent), two_hours_real_s + 20, "18 levels", [s.key for s in sent]
        )
        await asyncio.sleep(0.3)  # a duplicate would show up now
    check_on_time(fast, sent, rec)


# ---- 100 000 timers ---------------------------------------------------------------------------


# Sending 100 000 single messages takes 40-120 s of real time and depends on the machine's load
# (CI runs two test workers on 2 cores); the time is what the test spends, not what it checks.
@pytest.mark.timeout(600)
async def test_100k_timers_over_the_next_minute(tmp_path: Path) -> None:
    with cluster(tmp_path, timer_wheel=True, clock_speed=MANY_SPEED) as tc:
        topic, queues = "TimerMany", 8
        await create_topic(tc, topic, queues)
        rec = Recorder(tc.clock)
        async with recording_consumer(
            tc, "g-many", topic, rec, consume_message_batch_max_size=32
        ) as consumer:
            await wait_assigned(consumer, topic, queues, timeout_s=15)
            started = time.monotonic()
            rng = random.Random(5)
            sender = TimerSender(
                tc,
                topic,
                queues,
                MANY_TIMERS,
                lambda i, now: now + MANY_LEAD_MS + rng.randrange(MANY_SPAN_MS),
                prefix="m",
                ahead_min_ms=MANY_LEAD_MS,
                concurrency=SEND_CONCURRENCY,
            )
            await sender.run()
            wanted, bumped, sent_s = sender.wanted, sender.bumped, sender.seconds
            last_due_real_s = (max(wanted.values()) - tc.now_ms()) / tc.speed / 1000
            await rec.wait_distinct(
                MANY_TIMERS, max(last_due_real_s, 0) + 60, "100 000 timers", wanted
            )
            await asyncio.sleep(0.5)  # a quiet window: a duplicate shows up in it
            drained_s = time.monotonic() - started
            async with TimerClient(tc.timer.addr) as timers:
                stats = await timers.stats()
        deliveries = rec.snapshot()
        report_many(deliveries, wanted, bumped, sent_s, drained_s, stats.lateness_p99_ms)
        problems, direct = check_against_asked(deliveries, wanted)
        assert not problems, f"{len(problems)} problems, e.g.:\n" + "\n".join(problems[:20])
        # A timer already due when the broker got it is stored straight in its topic (no
        # TIMER_OUT_MS); the lead makes that rare, and such a message must still not be early.
        print(f"stored directly (due on arrival at the broker): {direct}")
        assert direct < MANY_TIMERS // 100, f"{direct} timers were due before the broker got them"
        dups = count_duplicates(rec.by_key())
        print(f"duplicates: {dups}")
        assert dups.stored_twice == 0, f"re-puts stored twice (the broker must drop them): {dups}"
        tc.check_logs()


def report_many(
    deliveries: list[Delivery],
    wanted: dict[str, int],
    bumped: int,
    sent_s: float,
    drained_s: float,
    wheel_p99_ms: int,
) -> None:
    late = sorted(d.recv_ms - wanted[d.key] for d in deliveries)
    print(
        f"\n{MANY_TIMERS} timers: sent in {sent_s:.1f} s real ({MANY_TIMERS / sent_s:.0f}/s, "
        f"{bumped} pushed later), all delivered after {drained_s:.1f} s real; "
        f"lateness at the consumer (scaled ms at speed {MANY_SPEED:g}): "
        f"p50 {statistics.median(late):.0f}, p99 {late[len(late) * 99 // 100]}, max {late[-1]}; "
        f"the wheel's own p99 {wheel_p99_ms} ms"
    )
