"""Counters and histograms for the hot paths, aggregated in plain Python and read at scrape time.

Why not the OpenTelemetry SDK's synchronous instruments there: one ``Counter.add`` or
``Histogram.record`` walks ~100 Python calls (attribute cleaning and hashing, view matching,
aggregation lookup) — about 6 µs, measured — and the broker's Send and every gRPC call would
pay it two or three times per request. Here an update is a dict lookup and a few additions
(~0.3 µs): the per-request cost the hot paths can afford.

- :class:`CounterTable`: totals per label tuple (e.g. messages and bytes per topic), reported
  through OpenTelemetry *observable* counters, so names, units and the Prometheus exporter's
  naming stay the SDK's (``rocketmq.messages.in`` → ``rocketmq_messages_in_total``).
- :class:`FastHistogram`: bucket counts per label tuple, reported to the Prometheus registry as a
  collector (OpenTelemetry has no observable histogram); its name is given in Prometheus form,
  the one the OpenTelemetry exporter would have produced (``rpc_server_duration_milliseconds``).

Both are bounded: past :data:`SERIES_MAX` label tuples a new tuple is not recorded (counted in
``dropped``), so a flood of topic names cannot grow memory without limit.

Thread safety: updates come from the event loop, except the flush histogram (the flush
thread, one series); a scrape that reads a bucket list while it is updated sees a count off by
one at worst, never a torn structure.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from services.common.telemetry import state

SERIES_MAX = 10_000
"""Most label tuples one table or histogram keeps."""


class CounterTable:
    """Monotonic totals, ``columns`` of them per label tuple; one observable counter each."""

    def __init__(
        self,
        labels: Sequence[str],
        columns: Sequence[tuple[str, str, str]],
        meter: metrics.Meter | None = None,
        constant: dict[str, str] | None = None,
    ) -> None:
        """``labels``: attribute names of the key; ``columns``: (name, unit, description)."""
        self.labels = tuple(labels)
        self.width = len(columns)
        self.series: dict[tuple[str, ...], list[float]] = {}
        self.dropped = 0
        self._attrs: dict[tuple[str, ...], dict[str, str]] = {}
        self._constant = dict(constant or {})
        meter = meter or metrics.get_meter("rocketq.fast")
        for i, (name, unit, description) in enumerate(columns):
            meter.create_observable_counter(name, [self._observer(i)], unit, description)

    def add(self, key: tuple[str, ...], *values: float) -> None:
        row = self.series.get(key)
        if row is None:
            if len(self.series) >= SERIES_MAX:
                self.dropped += 1
                return
            row = self.series[key] = [0.0] * self.width
        for i, v in enumerate(values):
            row[i] += v

    def _observer(self, column: int) -> Any:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(row[column], self._labels(key))
                for key, row in list(self.series.items())
            ]

        return observe

    def _labels(self, key: tuple[str, ...]) -> dict[str, str]:
        found = self._attrs.get(key)
        if found is None:
            found = self._attrs[key] = {
                **self._constant,
                **dict(zip(self.labels, key, strict=True)),
            }
        return found


class FastHistogram:
    """A Prometheus histogram per label tuple; :meth:`record` is a bisect and three additions."""

    def __init__(
        self, name: str, description: str, labels: Sequence[str], bounds: Sequence[float]
    ) -> None:
        self.name = name
        self.description = description
        self.labels = tuple(labels)
        self.bounds = tuple(bounds)
        self.series: dict[tuple[str, ...], list[float]] = {}
        """key -> [count per bucket ..., count of +Inf bucket, sum]."""
        self.dropped = 0
        if state.REGISTRY is not None:
            state.REGISTRY.register(self)

    def record(self, value: float, key: tuple[str, ...]) -> None:
        row = self.series.get(key)
        if row is None:
            if len(self.series) >= SERIES_MAX:
                self.dropped += 1
                return
            row = self.series[key] = [0.0] * (len(self.bounds) + 2)
        row[bisect.bisect_left(self.bounds, value)] += 1
        row[-1] += value

    def collect(self) -> Iterator[Any]:
        """prometheus_client's collector protocol: one HistogramMetricFamily."""
        from prometheus_client.core import HistogramMetricFamily  # noqa: PLC0415 - when enabled

        family = HistogramMetricFamily(self.name, self.description, labels=self.labels)
        for key, row in list(self.series.items()):
            cumulative, buckets = 0.0, []
            for bound, count in zip((*self.bounds, float("inf")), row[:-1], strict=True):
                cumulative += count
                buckets.append((_bound_text(bound), cumulative))
            family.add_metric(list(key), buckets, row[-1])
        yield family

    def describe(self) -> list[Any]:
        return []  # no up-front description: collect() is cheap and always current


def _bound_text(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))
