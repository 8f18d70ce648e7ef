"""Whether this process records spans and metrics: read by every hook before it does anything.

Plain module attributes, set once by :func:`services.common.telemetry.setup` (and cleared at
shutdown): a hook on a hot path pays one attribute read when telemetry is off.
"""

from __future__ import annotations

from typing import Any

TRACING = False
"""A tracer provider with an exporter is installed (``traceExporter`` is not none)."""
METRICS = False
"""A meter provider with the Prometheus reader is installed (``metricsPort`` > 0)."""
REGISTRY: Any = None
"""The prometheus_client registry /metrics renders (services.common.telemetry.fast adds its
histograms to it); None while metrics are off."""
