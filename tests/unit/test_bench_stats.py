"""The benchmark recorder's arithmetic: interval lines, percentiles, overflow above 1 s."""

from __future__ import annotations

import pytest

from rocketq.cli._bench_stats import LatencyRecorder, format_summary

pytestmark = pytest.mark.unit


def test_percentiles_within_one_bucket() -> None:
    rec = LatencyRecorder("t", now_s=0.0)
    for i in range(1, 1001):  # 0.01 .. 10.00 ms
        rec.record(i / 100)
    assert rec.percentile_ms(0.5) == pytest.approx(5.0, abs=0.011)
    assert rec.percentile_ms(0.99) == pytest.approx(9.9, abs=0.011)
    s = rec.summary(now_s=2.0)
    assert s.count == 1000
    assert s.tps == pytest.approx(500.0)
    assert s.max_ms == pytest.approx(10.0)
    assert s.avg_ms == pytest.approx(5.005)


def test_interval_resets_but_totals_stay() -> None:
    rec = LatencyRecorder("t", now_s=0.0)
    rec.record(2.0, n=10)
    rec.fail(3)
    first = rec.take_interval(now_s=1.0)
    assert (first.count, first.failures, first.avg_ms, first.max_ms) == (10, 3, 2.0, 2.0)
    assert first.tps == pytest.approx(10.0)
    rec.record(4.0)
    second = rec.take_interval(now_s=3.0)
    assert (second.count, second.failures, second.max_ms) == (1, 0, 4.0)
    assert second.seconds == pytest.approx(2.0)
    assert rec.count == 11 and rec.failures == 3


def test_samples_above_one_second_keep_their_value() -> None:
    rec = LatencyRecorder("t", now_s=0.0)
    for _ in range(98):
        rec.record(1.0)
    rec.record(1500.0)
    rec.record(2500.0)
    assert rec.percentile_ms(0.5) == pytest.approx(1.0, abs=0.011)
    assert rec.percentile_ms(1.0) == 2500.0
    assert rec.percentile_ms(0.99) == 1500.0


def test_summary_line_names_every_figure() -> None:
    rec = LatencyRecorder("produce", now_s=0.0)
    rec.record(1.0)
    line = format_summary(rec.summary(now_s=1.0))
    assert line.startswith("SUMMARY produce: 1 msgs in 1.00 s | TPS 1 |")
    for word in ("avg", "max", "p50", "p99", "failures 0"):
        assert word in line
