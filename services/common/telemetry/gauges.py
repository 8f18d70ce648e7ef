"""Scrape-time metrics: values a service already keeps (its runtime stats), read when Prometheus
scrapes instead of counted on the hot path.

A service lists its readings once (:class:`Reading`: a name, a unit, a kind and a function that
returns ``(value, labels)`` pairs) and :func:`register` turns each into an OpenTelemetry
observable instrument. The functions run on the event loop (services.common.telemetry.http
serves /metrics there), so they read the service's state without locks. Many readings share one
expensive snapshot (a broker's GetRuntimeStats answer): :class:`Snapshot` computes it at most once
per scrape.

A reading that raises is logged (once per reading) and reports nothing for that scrape: a bug
in one gauge must not blank the whole endpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

log = logging.getLogger(__name__)

T = TypeVar("T")
Labels = dict[str, str | int]
Values = Iterable[tuple[float, Labels]]
SERIES_PER_READING_MAX = 20_000
"""Most series one reading reports per scrape (consumer lag of every group × queue)."""
SNAPSHOT_MAX_AGE_S = 1.0
"""A snapshot younger than this is reused: one scrape calls many readings in a row."""


@dataclass(frozen=True)
class Reading:
    """One metric read at scrape time."""

    name: str
    unit: str
    description: str
    values: Callable[[], Values]
    kind: Literal["gauge", "counter"] = "gauge"
    """counter: a monotonic total the service keeps (reported as an observable counter)."""


class Snapshot(Generic[T]):
    """``make()`` at most once per :data:`SNAPSHOT_MAX_AGE_S` (one scrape)."""

    def __init__(self, make: Callable[[], T], clock: Callable[[], float] = time.monotonic) -> None:
        self._make = make
        self._clock = clock
        self._at = float("-inf")
        self._value: T | None = None

    def get(self) -> T:
        now = self._clock()
        if self._value is None or now - self._at > SNAPSHOT_MAX_AGE_S:
            self._value = self._make()
            self._at = now
        return self._value


def one(value: float, **labels: str | int) -> Values:
    """A reading's values when it has a single series."""
    return [(value, dict(labels))]


def register(readings: Sequence[Reading], meter: metrics.Meter | None = None) -> None:
    """Make an observable instrument for each reading (a no-op while metrics are off: the API's
    meter ignores them)."""
    meter = meter or metrics.get_meter("rocketq.runtime")
    for reading in readings:
        callback = _callback(reading)
        if reading.kind == "counter":
            meter.create_observable_counter(
                reading.name, [callback], reading.unit, reading.description
            )
        else:
            meter.create_observable_gauge(
                reading.name, [callback], reading.unit, reading.description
            )


def _callback(reading: Reading) -> Callable[[CallbackOptions], Iterable[Observation]]:
    failed = False

    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        nonlocal failed
        try:
            out = []
            for value, labels in reading.values():
                out.append(Observation(value, labels))
                if len(out) >= SERIES_PER_READING_MAX:
                    break
            return out
        except Exception:
            if not failed:
                failed = True
                log.exception("metric %s could not be read; it reports nothing", reading.name)
            return []

    return observe
