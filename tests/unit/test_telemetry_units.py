"""The parts of telemetry that need no process: trace ids on log lines, the telemetry keys,
reading a message's trace context, the hot-path aggregates, scrape-time readings, and the
dashboard's PromQL and quantile arithmetic."""

from __future__ import annotations

import io
import json
import logging
import math

import pytest
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, generate_latest

from rocketq.client import _tracing
from rocketq.message import ReceivedMessage
from services.broker import config as broker_config
from services.common import logs
from services.common.telemetry import fast, gauges, state
from services.common.telemetry import messaging as server_hooks
from services.common.telemetry.config import TelemetryConfig
from tools.dashboard import Query
from tools.dashboard_data import histogram_quantile

pytestmark = pytest.mark.unit

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _log_lines(emit: object) -> list[dict[str, object]]:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("broker", "INFO", stream=out, json_lines=True, broker="broker-a")
        emit()  # type: ignore[operator]
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_log_line_inside_a_span_carries_its_trace_and_span_ids() -> None:
    tracer = TracerProvider().get_tracer("test")
    log = logging.getLogger("services.broker.x")

    def emit() -> None:
        log.info("outside")
        with tracer.start_as_current_span("store T") as span:
            log.info("inside")
            ids.append(span.get_span_context())

    ids: list[trace.SpanContext] = []
    outside, inside = _log_lines(emit)
    assert "trace_id" not in outside and "span_id" not in outside
    assert inside["trace_id"] == format(ids[0].trace_id, "032x")
    assert inside["span_id"] == format(ids[0].span_id, "016x")
    assert list(inside)[:9] == [
        "ts", "level", "service", "broker", "pid", "logger", "event", "trace_id", "span_id"
    ]  # fmt: skip


def test_telemetry_keys_default_off_and_fall_back_to_the_otel_environment() -> None:
    cfg = broker_config.load(None, {}, {})
    plain = TelemetryConfig.of("broker", cfg, environ={})
    assert (plain.metrics_port, plain.trace_exporter, plain.tracing) == (0, "none", False)
    assert TelemetryConfig.of("broker", cfg, {"OTEL_TRACES_EXPORTER": "console"}).tracing
    keyed = broker_config.load(None, {"traceExporter": "NONE", "traceSampleRatio": "0.01"}, {})
    from_key = TelemetryConfig.of("broker", keyed, {"OTEL_TRACES_EXPORTER": "console"})
    assert (from_key.trace_exporter, from_key.trace_sample_ratio) == ("none", 0.01)


def test_unusable_trace_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="traceExporter=file needs traceFile"):
        TelemetryConfig.of("broker", broker_config.load(None, {"traceExporter": "file"}, {}), {})
    with pytest.raises(ValueError, match=r"'zipkin' .*OTEL_TRACES_EXPORTER.*none, console, otlp"):
        TelemetryConfig.of(
            "broker", broker_config.load(None, {}, {}), {"OTEL_TRACES_EXPORTER": "zipkin"}
        )
    with pytest.raises(ValueError, match=r"traceSampleRatio='2'.*out of range"):
        broker_config.load(None, {"traceSampleRatio": "2"}, {})
    assert "metricsPort" in broker_config.STARTUP_ONLY_KEYS


def test_a_message_trace_context_is_read_from_its_properties() -> None:
    ctx = _tracing.context_of({"TRACE_CONTEXT": TRACEPARENT})
    assert ctx is not None
    span_ctx = trace.get_current_span(ctx).get_span_context()
    assert (span_ctx.trace_id, span_ctx.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    assert span_ctx.is_remote and span_ctx.trace_flags.sampled
    assert _tracing.context_of({}) is None
    assert _tracing.context_of({"TRACE_CONTEXT": "00-not-a-context"}) is None


def test_the_broker_skips_spans_the_message_says_are_not_sampled() -> None:
    unsampled = TRACEPARENT[:-2] + "00"
    assert server_hooks._worth_a_span({"TRACE_CONTEXT": TRACEPARENT})
    assert not server_hooks._worth_a_span({"TRACE_CONTEXT": unsampled})
    assert server_hooks._worth_a_span({})  # no context: a new trace, sampled by the broker
    assert server_hooks._worth_a_span({"TRACE_CONTEXT": "garbage"})


def test_a_batch_span_links_the_other_contexts_of_its_messages() -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    props = [{"TRACE_CONTEXT": TRACEPARENT}, {"TRACE_CONTEXT": other}, {"TRACE_CONTEXT": other}, {}]
    parent, links = _tracing._parent_and_links(props)
    assert parent is not None
    assert trace.get_current_span(parent).get_span_context().span_id == 0xB7AD6B7169203331
    assert [link.context.trace_id for link in links] == [0x11111111111111111111111111111111]


def test_fast_histogram_renders_cumulative_prometheus_buckets() -> None:
    registry = CollectorRegistry()
    saved = state.REGISTRY
    state.REGISTRY = registry
    try:
        h = fast.FastHistogram(
            "rpc_server_duration_milliseconds", "calls", ("rpc_method",), (1, 10)
        )
    finally:
        state.REGISTRY = saved
    for value in (0.5, 0.7, 5, 50):
        h.record(value, ("Send",))
    text = generate_latest(registry).decode()
    assert 'rpc_server_duration_milliseconds_bucket{le="1.0",rpc_method="Send"} 2.0' in text
    assert 'rpc_server_duration_milliseconds_bucket{le="10.0",rpc_method="Send"} 3.0' in text
    assert 'rpc_server_duration_milliseconds_bucket{le="+Inf",rpc_method="Send"} 4.0' in text
    assert 'rpc_server_duration_milliseconds_count{rpc_method="Send"} 4.0' in text
    assert 'rpc_server_duration_milliseconds_sum{rpc_method="Send"} 56.2' in text


def test_hot_path_aggregates_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "SERIES_MAX", 2)
    table = fast.CounterTable(("topic",), [("t.messages", "{message}", "d")])
    for topic in ("a", "b", "c", "a"):
        table.add((topic,), 1)
    assert table.series == {("a",): [2.0], ("b",): [1.0]}
    assert table.dropped == 1


def test_a_failing_reading_reports_nothing_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def broken() -> gauges.Values:
        calls.append(1)
        raise KeyError("gone")

    observe = gauges._callback(gauges.Reading("x.y", "1", "d", broken))
    assert list(observe(CallbackOptions())) == []
    assert list(observe(CallbackOptions())) == []
    assert len(calls) == 2
    assert [r.message for r in caplog.records] == [
        "metric x.y could not be read; it reports nothing"
    ]


def test_one_snapshot_serves_one_scrape() -> None:
    made = []
    now = [100.0]
    snap = gauges.Snapshot(lambda: made.append(1) or len(made), clock=lambda: now[0])
    assert (snap.get(), snap.get()) == (1, 1)
    now[0] += gauges.SNAPSHOT_MAX_AGE_S + 0.1
    assert snap.get() == 2


def test_dashboard_queries_are_promql() -> None:
    q = Query("quantile", "rpc_server_duration_milliseconds", where=(("rpc_method", "Send"),))
    assert q.promql() == (
        "histogram_quantile(0.99, sum by (le) (rate(rpc_server_duration_milliseconds_bucket"
        '{rpc_method="Send"}[$__rate_interval])))'
    )
    r = Query("rate", "rocketmq_messages_in_total", ("t",), where=(("s", "!0"),))
    assert r.promql() == 'sum by (t) (rate(rocketmq_messages_in_total{s!="0"}[$__rate_interval]))'


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    # 10 calls: 4 under 1 ms, 6 between 1 and 10 ms -> p50 is 1/6 of the way into (1, 10]
    assert histogram_quantile(0.5, {1.0: 4, 10.0: 10, math.inf: 10}) == pytest.approx(2.5)
    assert histogram_quantile(0.99, {1.0: 0, 10.0: 0, math.inf: 3}) == 10.0
    assert math.isnan(histogram_quantile(0.5, {1.0: 0, math.inf: 0}))


def test_the_committed_dashboard_is_the_generated_one() -> None:
    from pathlib import Path

    from tools.dashboard import DASHBOARD_FILE, dashboard_json

    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / DASHBOARD_FILE).read_text())
    assert committed == dashboard_json(), "run: python -m tools.dashboard json"


def received(properties: dict[str, str]) -> ReceivedMessage:
    return ReceivedMessage("T", b"", properties, 0, 0, 0, "", "", 0, 0, "", "")


def test_an_unsampled_message_gives_the_listener_its_context_without_a_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tracing, "_follows_parents", lambda: True)
    unsampled = TRACEPARENT[:-2] + "00"
    msgs = [received({"TRACE_CONTEXT": unsampled}) for _ in range(3)]
    ctx = _tracing._unsampled_parent(msgs)
    assert ctx is not None
    fast_read = trace.get_current_span(ctx).get_span_context()
    full_read = _tracing.context_of({"TRACE_CONTEXT": unsampled})
    assert full_read is not None
    assert fast_read == trace.get_current_span(full_read).get_span_context()
    assert not fast_read.trace_flags.sampled
    # sampled, mixed or missing contexts take the span path
    assert _tracing._unsampled_parent([received({"TRACE_CONTEXT": TRACEPARENT})]) is None
    assert _tracing._unsampled_parent([*msgs, received({})]) is None
    monkeypatch.setattr(_tracing, "_follows_parents", lambda: False)
    assert _tracing._unsampled_parent(msgs) is None
