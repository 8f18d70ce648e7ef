"""Injected time.

Store, flush, timer and HA code never call :func:`time.time` directly; they take a :class:`Clock`
so tests can run hours of expiry and delay logic in milliseconds (STYLE.md habit 5, after
``trio.testing.MockClock``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
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


class ScaledClock:
    """Wall-clock time that runs ``speed`` times faster than real time from ``origin_ms`` on.

    For tests of long delays with real processes: every process of a test cluster gets the
    same ``ROCKETQ_CLOCK_SPEED`` and ``ROCKETQ_CLOCK_ORIGIN_MS`` (see :func:`clock_from_env`), so
    a broker stamping a 2-hour delay and a timer-wheel service firing it agree on "now" while
    the 2 hours pass in 10 s at speed 720. The monotonic reading stays real: it times flush
    intervals, RPC deadlines and leases, which must not speed up.
    """

    def __init__(self, speed: float, origin_ms: int) -> None:
        if not 0 < speed <= 100_000:
            raise ValueError(f"clock speed {speed} must be in (0, 100000]")
        self.speed = speed
        self.origin_ms = origin_ms

    def now_ms(self) -> int:
        real_ms = time.time_ns() / 1_000_000
        return int(self.origin_ms + (real_ms - self.origin_ms) * self.speed)

    def monotonic_s(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()

CLOCK_SPEED_ENV = "ROCKETQ_CLOCK_SPEED"
CLOCK_ORIGIN_ENV = "ROCKETQ_CLOCK_ORIGIN_MS"


def clock_from_env(environ: Mapping[str, str] | None = None) -> Clock:
    """The clock a service process uses: the real one unless ``ROCKETQ_CLOCK_SPEED`` is set.

    ``ROCKETQ_CLOCK_ORIGIN_MS`` (default: now) is the real instant from which scaled time
    diverges; processes that must agree on the time need the same value. Raises ValueError on
    malformed values, so a typo cannot silently run a production service on a fast clock.
    """
    env = os.environ if environ is None else environ
    speed_text = env.get(CLOCK_SPEED_ENV, "").strip()
    if not speed_text or speed_text == "1":
        return SYSTEM_CLOCK
    try:
        speed = float(speed_text)
        origin_text = env.get(CLOCK_ORIGIN_ENV, "").strip()
        origin_ms = int(origin_text) if origin_text else time.time_ns() // 1_000_000
    except ValueError:
        raise ValueError(
            f"{CLOCK_SPEED_ENV}={speed_text!r} / {CLOCK_ORIGIN_ENV}: expected a number and "
            "an integer of milliseconds"
        ) from None
    return ScaledClock(speed, origin_ms)
