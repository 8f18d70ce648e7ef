"""Retry delays: exponential growth between a floor and a cap, with jitter, reset on success.

Why jitter: when one broker or one etcd comes back, every client, replica and loop that lost it
retries; without jitter they all retry at the same instants (100 ms, 200 ms, 400 ms after the
outage) and hit the recovering server together. Spreading each delay over a range breaks those
waves up while keeping the growth, so a long outage still costs little.

Without jitter the delays are ``min_s``, ``min_s × multiplier``, ``min_s × multiplier²``, ...
up to ``max_s`` (the base). With jitter each delay is drawn below the next step, ``h =
min(base × multiplier, max_s)``, so that the very first retries are spread too (a range that
starts at exactly ``min_s`` would put every peer's first retry at the same instant):

- ``Jitter.EQUAL`` (the default): uniform in [max(min_s, h/2), h]: a retry never comes much
  sooner than the one before, yet peers spread over half the range;
- ``Jitter.FULL``: uniform in [min_s, h]: the widest spread, for many peers at once;
- ``Jitter.NONE``: exactly the base (a single peer has no crowd to spread out).

Every delay lies within [``min_s``, ``max_s``].

Pure Python and no I/O: it computes delays, the caller sleeps (so a test steps it with a seeded
``random.Random`` and never sleeps). One helper for the SDK and the services alike: like
:mod:`rocketq.validation` it loads no grpc and is shared with the server side, which may import
the library (never the reverse).
"""

from __future__ import annotations

import enum
import random


class Jitter(enum.Enum):
    NONE = "none"
    EQUAL = "equal"
    FULL = "full"


class Backoff:
    """The delays of one retry loop: :meth:`next_delay_s` after a failure, :meth:`reset` after
    a success."""

    def __init__(
        self,
        min_s: float,
        max_s: float,
        *,
        multiplier: float = 2.0,
        jitter: Jitter = Jitter.EQUAL,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"backoff needs 0 < min_s <= max_s, got {min_s} and {max_s}")
        if multiplier < 1:
            raise ValueError(f"backoff multiplier {multiplier} must be >= 1")
        self.min_s = min_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng or random.Random()  # spreading retries, not security
        self._base_s = min_s
        self.failures = 0
        """Delays handed out since the last reset."""

    def next_delay_s(self) -> float:
        """The wait before the next attempt (a failure just happened); grows the next one."""
        base_s = self._base_s
        self._base_s = step_s = min(base_s * self.multiplier, self.max_s)
        self.failures += 1
        if self.jitter is Jitter.FULL:
            return self._rng.uniform(self.min_s, step_s)
        if self.jitter is Jitter.EQUAL:
            return self._rng.uniform(max(self.min_s, step_s / 2), step_s)
        return base_s

    def next_delay_ms(self) -> int:
        """:meth:`next_delay_s` in whole milliseconds."""
        return round(self.next_delay_s() * 1000)

    def reset(self) -> None:
        """An attempt succeeded: the delays start from ``min_s`` again."""
        self._base_s = self.min_s
        self.failures = 0
