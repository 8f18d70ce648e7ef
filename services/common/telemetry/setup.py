"""One process's telemetry: its tracer provider, its meter provider and the /metrics endpoint.

:func:`setup` runs once per service process, before the service is built (bootstrap), and
installs the OpenTelemetry globals, so every module reaches its tracer and meter through
``opentelemetry.trace`` / ``opentelemetry.metrics`` without being handed them. With the
defaults (``traceExporter`` none, ``metricsPort`` 0) it installs nothing: the API's no-op
providers stay, and the hooks in the hot paths test :data:`TRACING` / :data:`METRICS` first,
so telemetry that is off costs one attribute read per request.

Sampling (``traceSampleRatio``): ``ParentBased(TraceIdRatioBased(r))`` — a span with a remote
parent (a message's trace context) follows the parent's decision, so a trace sampled by the
producer is recorded by the broker and the consumer too, and an unsampled one by neither.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from services.common.telemetry import state
from services.common.telemetry.config import TelemetryConfig
from services.common.telemetry.http import MetricsHttpServer

log = logging.getLogger(__name__)

#: Bucket bounds of every latency histogram (services.common.telemetry.fast), in ms: 0.25 ms (an
#: in-memory send) to 30 s (a long-polled pull that waited its full hold).
LATENCY_BUCKETS_MS = (
    0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000,
)  # fmt: skip


FILE_EXPORT_DELAY_MS = 200
"""Batch delay of the file exporter (the SDK's default, 5 s, is for network exporters)."""


@dataclass
class Telemetry:
    """What :func:`setup` installed; :meth:`start_http` / :meth:`stop` bracket serving."""

    config: TelemetryConfig
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    registry: Any = None
    """The prometheus_client CollectorRegistry the /metrics endpoint renders."""
    http: MetricsHttpServer | None = field(default=None, repr=False)

    async def start_http(self) -> int:
        """Serve /metrics (when ``metricsPort`` > 0); the bound port, or 0."""
        if self.registry is None:
            return 0
        from prometheus_client import generate_latest  # noqa: PLC0415 - only when enabled

        registry = self.registry
        self.http = MetricsHttpServer(
            lambda: generate_latest(registry), self.config.listen_host, self.config.metrics_port
        )
        port = await self.http.start()
        log.info("metrics at http://%s:%d/metrics", self.config.listen_host, port)
        return port

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()
        self.shutdown()

    def shutdown(self) -> None:
        """Flush and stop the providers (spans still queued are exported now)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        state.TRACING = state.METRICS = False
        state.REGISTRY = None


def setup(service: str, cfg: Any, **resource_attrs: str) -> Telemetry:
    """Install tracing and metrics for this process from ``cfg``'s telemetry keys.

    ``resource_attrs`` describe the process (a broker: its name and cluster). Raises ValueError
    for an unusable setting (an exporter without its file, say).
    """
    tcfg = TelemetryConfig.of(service, cfg)
    resource = Resource.create(
        {
            "service.name": f"rocketq-{service}",
            "service.namespace": "rocketq",
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
            **resource_attrs,
        }
    )
    out = Telemetry(tcfg)
    if tcfg.tracing:
        out.tracer_provider = _tracer_provider(tcfg, resource)
        trace.set_tracer_provider(out.tracer_provider)
        state.TRACING = True
    if tcfg.metrics_port > 0:
        out.meter_provider, out.registry = _meter_provider(resource)
        metrics.set_meter_provider(out.meter_provider)
        state.REGISTRY = out.registry
        state.METRICS = True
    return out


def _tracer_provider(tcfg: TelemetryConfig, resource: Resource) -> TracerProvider:
    sampler: Sampler | None = None
    if tcfg.trace_sample_ratio is not None:
        sampler = ParentBased(TraceIdRatioBased(tcfg.trace_sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    # Batching keeps the export (file writes, network) off the event loop; its queue is
    # bounded (OTEL_BSP_MAX_QUEUE_SIZE, 2048): past it spans are dropped, never waited for.
    # A file is local and cheap to write: spans reach it within FILE_EXPORT_DELAY_MS (a reader
    # in another process, a test, sees them soon) unless OTEL_BSP_SCHEDULE_DELAY says otherwise.
    delay_ms = None
    if tcfg.trace_exporter == "file" and "OTEL_BSP_SCHEDULE_DELAY" not in os.environ:
        delay_ms = FILE_EXPORT_DELAY_MS
    provider.add_span_processor(
        BatchSpanProcessor(_span_exporter(tcfg), schedule_delay_millis=delay_ms)
    )
    return provider


def _span_exporter(tcfg: TelemetryConfig) -> SpanExporter:
    if tcfg.trace_exporter == "console":
        return ConsoleSpanExporter(service_name=f"rocketq-{tcfg.service}")
    if tcfg.trace_exporter == "file":
        from services.common.telemetry.exporters import JsonLinesSpanExporter  # noqa: PLC0415

        assert tcfg.trace_file is not None  # validate() refused file without a path
        return JsonLinesSpanExporter(tcfg.trace_file)
    # otlp: endpoint, headers and TLS from the standard OTEL_EXPORTER_OTLP_* variables.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )

    return OTLPSpanExporter()


def _meter_provider(resource: Resource) -> tuple[MeterProvider, Any]:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    # A registry of our own, not prometheus_client's global one: only what RocketQ records is
    # on the endpoint, and two setups in one process (tests) never collide.
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    return MeterProvider(resource=resource, metric_readers=[reader]), registry
