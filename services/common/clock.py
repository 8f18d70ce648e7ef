"""Injected time.

Store, flush, timer and HA code never call :func:`time.time` directly; they take a :class:`Clock`
so tests can run hours of expiry and delay logic in milliseconds (STYLE.md habit 5, after
``trio.testing.MockClock``).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the store needs of time: wall-clock milliseconds and a monotonic reading."""

    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch (store timestamps, file ages)."""
        ...

    def monotonic_s(self) -> float:
        """Monotonic seconds, for intervals and timeouts."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to; for deterministic tests of retention and timers."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._mono_s = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_s(self) -> float:
        return self._mono_s

    def advance_ms(self, delta_ms: int) -> None:
        """Move both readings forward by ``delta_ms``."""
        if delta_ms < 0:
            raise ValueError("a clock never goes backwards")
        self._now_ms += delta_ms
        self._mono_s += delta_ms / 1000.0


SYSTEM_CLOCK = SystemClock()
