"""The timer wheel's scrape-time metrics (services.common.telemetry.gauges), read off the same
GetTimerStats answer ``rocketq timer stats`` shows.

| metric (OpenTelemetry name)             | meaning                                           |
|-----------------------------------------|---------------------------------------------------|
| rocketq.timer.pending                   | the backlog: timers stored, not yet delivered     |
| rocketq.timer.dequeue.behind            | how far the wheel's hand trails the clock (ms)    |
| rocketq.timer.enqueue.behind            | age of the oldest timer record not yet read (ms)  |
| rocketq.timer.lateness                  | lateness p50/p99/max, last 10 000 deliveries (ms) |
| rocketq.timer.scheduled / delivered / cancelled | totals since start (counters)             |
"""

from __future__ import annotations

from collections.abc import Callable

from rocketq._api.rocketq.v1 import timer_pb2
from services.common.telemetry import state
from services.common.telemetry.gauges import Reading, Snapshot, one, register

Stats = timer_pb2.GetTimerStatsResponse


def install(stats: Callable[[], Stats]) -> None:
    """Register the timer wheel's readings (no-op with metrics off)."""
    if not state.METRICS:
        return
    snap = Snapshot(stats)

    def s() -> Stats:
        return snap.get()

    register([
        Reading("rocketq.timer.pending", "{timer}", "Timers stored and not yet delivered",
                lambda: one(s().pending_timers)),
        Reading("rocketq.timer.dequeue.behind", "ms", "How far the wheel's hand trails the clock",
                lambda: one(s().dequeue_behind_ms)),
        Reading("rocketq.timer.enqueue.behind", "ms", "Age of the oldest unread timer record",
                lambda: one(s().enqueue_behind_ms)),
        Reading("rocketq.timer.lateness", "ms", "Delivery lateness over recent deliveries",
                lambda: [(s().lateness_p50_ms, {"quantile": "0.5"}),
                         (s().lateness_p99_ms, {"quantile": "0.99"}),
                         (s().lateness_max_ms, {"quantile": "1"})]),
        Reading("rocketq.timer.scheduled", "{timer}", "Timers scheduled since start",
                lambda: one(s().scheduled_total), kind="counter"),
        Reading("rocketq.timer.delivered", "{timer}", "Timers delivered since start",
                lambda: one(s().delivered_total), kind="counter"),
        Reading("rocketq.timer.cancelled", "{timer}", "Timers cancelled since start",
                lambda: one(s().cancelled_total), kind="counter"),
    ])  # fmt: skip
