"""The broker's timer pieces alone: delivery times, the timer-topic transform, the retry level
and the re-put dedup table (services.broker.timer_put)."""

from __future__ import annotations

import pytest

from rocketq.codec import Prop
from services.broker.config import BrokerConfig
from services.broker.timer_put import (
    DelayError,
    RePutDedup,
    StoredRePut,
    delivery_ms,
    mono_ms,
    retry_level,
    timer_properties,
    timer_queue_id,
)
from services.common.clock import ManualClock

pytestmark = pytest.mark.unit

LEVELS_MS = BrokerConfig().delay_levels_ms()
MAX_MS = 3 * 86_400_000
NOW = 1_700_000_000_000


def out(props: dict[str, str], now: int = NOW) -> int | None:
    return delivery_ms(props, now_ms=now, levels_ms=LEVELS_MS, max_delay_ms=MAX_MS)


def test_default_levels_are_specs_table() -> None:
    assert len(LEVELS_MS) == 18
    assert LEVELS_MS[0] == 1000 and LEVELS_MS[2] == 10_000 and LEVELS_MS[17] == 7_200_000


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, None),
        ({"TAGS": "a"}, None),
        ({Prop.DELAY_LEVEL: "0"}, None),
        ({Prop.DELAY_LEVEL: ""}, None),
        ({Prop.DELAY_LEVEL: "1"}, NOW + 1000),
        ({Prop.DELAY_LEVEL: "18"}, NOW + 7_200_000),
        ({Prop.TIMER_DELIVER_MS: str(NOW + 5)}, NOW + 5),
        ({Prop.TIMER_DELIVER_MS: "0"}, 0),
        ({Prop.TIMER_DELAY_MS: "0"}, NOW),
        ({Prop.TIMER_DELAY_MS: "2500"}, NOW + 2500),
        ({Prop.TIMER_DELAY_SEC: "3"}, NOW + 3000),
        ({Prop.TIMER_DELAY_MS: str(MAX_MS)}, NOW + MAX_MS),
        ({Prop.DELAY_LEVEL: "0", Prop.TIMER_DELAY_MS: "7"}, NOW + 7),
    ],
)
def test_delivery_time(props: dict[str, str], expected: int | None) -> None:
    assert out(props) == expected


def test_delivery_time_follows_the_clock() -> None:
    clock = ManualClock(NOW)
    first = out({Prop.DELAY_LEVEL: "3"}, clock.now_ms())
    clock.advance_ms(60_000)
    assert first is not None
    assert out({Prop.DELAY_LEVEL: "3"}, clock.now_ms()) == first + 60_000


@pytest.mark.parametrize(
    ("props", "words"),
    [
        ({Prop.DELAY_LEVEL: "19"}, "outside 1..18"),
        ({Prop.DELAY_LEVEL: "-1"}, "outside 1..18"),
        ({Prop.DELAY_LEVEL: "x"}, "outside 1..18"),
        ({Prop.TIMER_DELAY_MS: "-1"}, ">= 0"),
        ({Prop.TIMER_DELIVER_MS: "1.5"}, "integer"),
        ({Prop.TIMER_DELAY_SEC: "abc"}, "integer"),
        ({Prop.TIMER_DELAY_MS: str(MAX_MS + 1)}, "timerMaxDelaySec=259200"),
        ({Prop.TIMER_DELIVER_MS: str(NOW + MAX_MS + 1)}, "timerMaxDelaySec"),
        ({Prop.DELAY_LEVEL: "2", Prop.TIMER_DELIVER_MS: "5"}, "one delay property"),
    ],
)
def test_refused_delays_say_why(props: dict[str, str], words: str) -> None:
    with pytest.raises(DelayError, match=words.replace(".", r"\.")):
        out(props)


def test_broker_levels_decide() -> None:
    levels = [1000, 86_400_000]
    assert delivery_ms({"DELAY": "2"}, now_ms=0, levels_ms=levels, max_delay_ms=MAX_MS) == (
        86_400_000
    )
    with pytest.raises(DelayError, match=r"outside 1\.\.2"):
        delivery_ms({"DELAY": "3"}, now_ms=0, levels_ms=levels, max_delay_ms=MAX_MS)


def test_timer_properties_keep_the_message_and_name_its_destination() -> None:
    props = {
        Prop.UNIQ_KEY: "U1",
        Prop.TAGS: "A",
        Prop.KEYS: "k1 k2",
        "user": "v",
        Prop.DELAY_LEVEL: "3",
        Prop.TIMER_SOURCE: "77",  # from an earlier hop: never carried into the timer topic
    }
    got = timer_properties(props, real_topic="T", real_qid=3, out_ms=NOW + 10)
    assert got == {
        Prop.UNIQ_KEY: "U1",
        Prop.TAGS: "A",
        Prop.KEYS: "k1 k2",
        "user": "v",
        Prop.REAL_TOPIC: "T",
        Prop.REAL_QUEUE_ID: "3",
        Prop.TIMER_OUT_MS: str(NOW + 10),
    }
    assert props[Prop.DELAY_LEVEL] == "3", "the input is not changed"


def test_timer_queue_is_stable_and_spread() -> None:
    ids = [f"{i:032X}" for i in range(800)]
    queues = [timer_queue_id(u, 8) for u in ids]
    assert queues == [timer_queue_id(u, 8) for u in ids]
    counts = [queues.count(q) for q in range(8)]
    assert min(counts) > 50, counts


@pytest.mark.parametrize(
    ("requested", "stored", "level"),
    [(0, 0, 3), (0, 1, 4), (0, 15, 18), (0, 16, 18), (0, 1000, 18), (1, 9, 1), (30, 0, 18)],
)
def test_retry_level(requested: int, stored: int, level: int) -> None:
    assert retry_level(requested, stored, 18) == level


def _entry(clock: ManualClock, offset: int) -> StoredRePut:
    return StoredRePut(mono_ms(clock), f"id{offset}", f"off{offset}", 0, offset, offset + 100)


def test_dedup_remembers_within_the_window() -> None:
    clock = ManualClock(NOW)
    table = RePutDedup(clock, entries_max=10, window_ms=1000)
    table.add("1", _entry(clock, 1))
    assert table.get("1") == _entry(clock, 1)
    assert table.get("2") is None
    clock.advance_ms(999)
    assert table.get("1") is not None
    clock.advance_ms(1)
    assert table.get("1") is None
    table.add("2", _entry(clock, 2))
    assert len(table) == 1, "the expired entry was dropped"


def test_dedup_is_bounded_by_entries_oldest_first() -> None:
    clock = ManualClock(NOW)
    table = RePutDedup(clock, entries_max=3, window_ms=60_000)
    for i in range(5):
        table.add(str(i), _entry(clock, i))
        clock.advance_ms(1)
    assert len(table) == 3
    assert [table.get(str(i)) is not None for i in range(5)] == [False, False, True, True, True]


def test_dedup_readding_moves_to_the_back() -> None:
    clock = ManualClock(NOW)
    table = RePutDedup(clock, entries_max=2, window_ms=60_000)
    table.add("a", _entry(clock, 1))
    table.add("b", _entry(clock, 2))
    table.add("a", _entry(clock, 3))
    table.add("c", _entry(clock, 4))
    assert table.get("b") is None and table.get("a") is not None and table.get("c") is not None
