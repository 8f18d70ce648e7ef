"""The master's ack pace follows the CPU share of its event-loop thread (ha_pacing)."""

from __future__ import annotations

import pytest

from services.broker.ha_pacing import ACK_PACE_BUSY_MS, WINDOW_S, LoopLoad
from services.common.clock import ManualClock


class ThreadCpu:
    """A thread CPU clock the test moves."""

    def __init__(self) -> None:
        self.s = 100.0

    def __call__(self) -> float:
        return self.s


def run_window(clock: ManualClock, cpu: ThreadCpu, share: float) -> None:
    clock.advance_ms(int(WINDOW_S * 1000))
    cpu.s += WINDOW_S * share


def test_an_idle_loop_asks_for_acks_at_once_a_busy_one_for_a_pace_and_back() -> None:
    clock, cpu = ManualClock(), ThreadCpu()
    load = LoopLoad(clock, cpu)
    assert load.ack_pace_ms() == 0  # nothing measured yet
    run_window(clock, cpu, 0.5)
    assert load.ack_pace_ms() == 0  # half busy: acks cost idle time only
    run_window(clock, cpu, 0.9)
    assert load.ack_pace_ms() == ACK_PACE_BUSY_MS
    assert load.share == pytest.approx(0.9)
    run_window(clock, cpu, 0.2)
    assert load.ack_pace_ms() == 0  # the load went away


def test_the_share_is_taken_over_whole_windows_only() -> None:
    clock, cpu = ManualClock(), ThreadCpu()
    load = LoopLoad(clock, cpu)
    load.ack_pace_ms()
    clock.advance_ms(int(WINDOW_S * 1000) // 2)
    cpu.s += WINDOW_S / 2  # fully busy for half a window ...
    assert load.ack_pace_ms() == 0  # ... is not measured yet
    clock.advance_ms(int(WINDOW_S * 1000) // 2)
    cpu.s += WINDOW_S / 2
    assert load.ack_pace_ms() == ACK_PACE_BUSY_MS


def test_a_long_quiet_spell_counts_as_idle() -> None:
    clock, cpu = ManualClock(), ThreadCpu()
    load = LoopLoad(clock, cpu)
    load.ack_pace_ms()
    run_window(clock, cpu, 1.0)
    assert load.ack_pace_ms() == ACK_PACE_BUSY_MS
    clock.advance_ms(60_000)  # no chunk for a minute, then one
    cpu.s += 0.5
    assert load.ack_pace_ms() == 0
