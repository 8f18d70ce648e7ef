"""Counting for the messaging benchmarks: throughput, failures and latency percentiles.

A :class:`LatencyRecorder` takes one sample per operation (a send's round trip, a message's
produce-to-consume delay). It keeps two views:

- the current report interval: count, failures, sum and max, reset each time
  :meth:`LatencyRecorder.take_interval` prints a line (RocketMQ's benchmark/producer.sh prints
  "Send TPS / Max RT / Average RT / Send Failed" the same way);
- the whole run: a fixed histogram of 10 µs buckets up to 1 s, so p50/p99/p99.9 cost one
  list increment per sample and bounded memory however long the run; samples above 1 s go to a
  side list (capped at ``OVERFLOW_SAMPLES_MAX``; beyond it they still count, at 1 s).

Percentiles are accurate to the bucket width (10 µs), far below what a Python client resolves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

BUCKET_US = 10
BUCKETS = 100_000
"""10 µs x 100 000 = 1 s of histogram."""
OVERFLOW_SAMPLES_MAX = 100_000


@dataclass(frozen=True)
class IntervalStats:
    """One report line's worth."""

    elapsed_s: float
    """Seconds since the run started."""
    seconds: float
    """Length of this interval."""
    count: int
    failures: int
    avg_ms: float
    max_ms: float

    @property
    def tps(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Summary:
    """The whole run."""

    name: str
    count: int
    failures: int
    seconds: float
    avg_ms: float
    max_ms: float
    p50_ms: float
    p99_ms: float
    p999_ms: float

    @property
    def tps(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


class LatencyRecorder:
    """Samples of one benchmark run (single-threaded: call from one event loop)."""

    def __init__(self, name: str, now_s: float | None = None) -> None:
        self.name = name
        self._start_s = time.monotonic() if now_s is None else now_s
        self._end_s: float | None = None
        self._interval_start_s = self._start_s
        self._hist = [0] * (BUCKETS + 1)  # last bucket: at or above 1 s
        self._overflow_ms: list[float] = []
        self.count = 0
        self.failures = 0
        self._sum_ms = 0.0
        self._max_ms = 0.0
        self._i_count = 0
        self._i_failures = 0
        self._i_sum_ms = 0.0
        self._i_max_ms = 0.0

    def start(self, now_s: float | None = None) -> None:
        """(Re)start the run's clock, e.g. once connected; samples so far are kept."""
        self._start_s = time.monotonic() if now_s is None else now_s
        self._interval_start_s = self._start_s

    def record(self, latency_ms: float, n: int = 1) -> None:
        """``n`` operations done, each taking ``latency_ms`` (a batch counts its messages)."""
        latency_ms = max(latency_ms, 0.0)
        bucket = int(latency_ms * (1000 / BUCKET_US))
        if bucket >= BUCKETS:
            bucket = BUCKETS
            if len(self._overflow_ms) < OVERFLOW_SAMPLES_MAX:
                self._overflow_ms.extend([latency_ms] * min(n, 1000))
        self._hist[bucket] += n
        self.count += n
        self._i_count += n
        self._sum_ms += latency_ms * n
        self._i_sum_ms += latency_ms * n
        self._max_ms = max(self._max_ms, latency_ms)
        self._i_max_ms = max(self._i_max_ms, latency_ms)

    def fail(self, n: int = 1) -> None:
        self.failures += n
        self._i_failures += n

    def take_interval(self, now_s: float | None = None) -> IntervalStats:
        """Stats since the previous call, then start a new interval."""
        now_s = time.monotonic() if now_s is None else now_s
        stats = IntervalStats(
            elapsed_s=now_s - self._start_s,
            seconds=now_s - self._interval_start_s,
            count=self._i_count,
            failures=self._i_failures,
            avg_ms=self._i_sum_ms / self._i_count if self._i_count else 0.0,
            max_ms=self._i_max_ms,
        )
        self._interval_start_s = now_s
        self._i_count = self._i_failures = 0
        self._i_sum_ms = self._i_max_ms = 0.0
        return stats

    def stop(self, now_s: float | None = None) -> None:
        """Fix the run's end time (TPS is counted up to here)."""
        self._end_s = time.monotonic() if now_s is None else now_s

    def percentile_ms(self, fraction: float) -> float:
        """Latency at or below which ``fraction`` of samples fall (0 with no samples)."""
        if self.count == 0:
            return 0.0
        rank = max(1, round(fraction * self.count))
        seen = 0
        for bucket, n in enumerate(self._hist[:BUCKETS]):
            seen += n
            if seen >= rank:
                return (bucket + 1) * BUCKET_US / 1000  # upper edge: never under-report
        over = sorted(self._overflow_ms)
        if not over:
            return self._max_ms
        index = min(len(over) - 1, int((rank - seen - 1) * len(over) / max(1, self._hist[-1])))
        return over[index]

    def summary(self, now_s: float | None = None) -> Summary:
        end = self._end_s if self._end_s is not None else now_s
        end = time.monotonic() if end is None else end
        return Summary(
            name=self.name,
            count=self.count,
            failures=self.failures,
            seconds=end - self._start_s,
            avg_ms=self._sum_ms / self.count if self.count else 0.0,
            max_ms=self._max_ms,
            p50_ms=self.percentile_ms(0.50),
            p99_ms=self.percentile_ms(0.99),
            p999_ms=self.percentile_ms(0.999),
        )


def format_interval(label: str, s: IntervalStats) -> str:
    """A producer.sh-style progress line."""
    return (
        f"[{s.elapsed_s:7.1f}s] {label} TPS {s.tps:10.0f} | RT avg {s.avg_ms:7.3f} ms "
        f"max {s.max_ms:8.3f} ms | failed {s.failures}"
    )


def format_summary(s: Summary, rt_label: str = "RT") -> str:
    """The final line: the figures a benchmark run is quoted by."""
    return (
        f"SUMMARY {s.name}: {s.count} msgs in {s.seconds:.2f} s | TPS {s.tps:.0f} | "
        f"{rt_label} avg {s.avg_ms:.3f} ms max {s.max_ms:.3f} ms p50 {s.p50_ms:.3f} ms "
        f"p99 {s.p99_ms:.3f} ms p99.9 {s.p999_ms:.3f} ms | failures {s.failures}"
    )
