"""The telemetry keys every service (nameserver, broker, timer wheel) takes through its KeyTable.

| key              | default | meaning                                                   |
|------------------|---------|-----------------------------------------------------------|
| metricsPort      | 0       | Prometheus text on http://<listenAddress>:<port>/metrics; |
|                  |         | 0 = no endpoint                                           |
| traceExporter    | (unset) | none, console, otlp or file; unset = the standard          |
|                  |         | ``OTEL_TRACES_EXPORTER`` variable, else none              |
| traceSampleRatio | -1      | 0..1: share of new traces kept (a span with a parent      |
|                  |         | follows the parent); < 0 = ``OTEL_TRACES_SAMPLER``/``_ARG``,|
|                  |         | else parent-based always-on                               |
| traceFile        | (unset) | the file exporter's output: one JSON span per line        |

The OTLP exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers,
TLS). Environment variables per service follow the KeyTable rule: ``ROCKETQ_BROKER_METRICSPORT``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.config import Key

TRACE_EXPORTERS = ("none", "console", "otlp", "file")


def telemetry_keys() -> list[Key]:
    """The four keys, for a service's KeyTable (its config dataclass has the four fields)."""
    return [
        Key(
            "metricsPort",
            "metrics_port",
            int,
            "Prometheus /metrics port, 0 = off",
            low=0,
            high=65535,
        ),
        Key(
            "traceExporter",
            "trace_exporter",
            str.lower,
            "where spans go: none, console, otlp, file (unset: OTEL_TRACES_EXPORTER)",
            choices=TRACE_EXPORTERS,
        ),
        Key(
            "traceSampleRatio",
            "trace_sample_ratio",
            float,
            "share of new traces sampled, 0..1 (negative: OTEL_TRACES_SAMPLER)",
            low=-1,
            high=1,
        ),
        Key("traceFile", "trace_file", str, "JSON-lines span file of the file exporter (a path)"),
    ]


#: Keys that only take effect at startup (for a service with runtime config updates).
STARTUP_ONLY_KEYS = frozenset({"metricsPort", "traceExporter", "traceSampleRatio", "traceFile"})


@dataclass(frozen=True)
class TelemetryConfig:
    """What :func:`services.common.telemetry.setup` needs, read off a service's config."""

    service: str
    listen_host: str = "0.0.0.0"
    metrics_port: int = 0
    trace_exporter: str = "none"
    trace_sample_ratio: float | None = None
    """None = the SDK's own choice from ``OTEL_TRACES_SAMPLER`` (parent-based always-on)."""
    trace_file: Path | None = None

    @classmethod
    def of(cls, service: str, cfg: Any, environ: dict[str, str] | None = None) -> TelemetryConfig:
        """The telemetry part of a service config (fields missing from it keep defaults)."""
        env = os.environ if environ is None else environ
        exporter = getattr(cfg, "trace_exporter", "") or env.get("OTEL_TRACES_EXPORTER", "none")
        ratio = float(getattr(cfg, "trace_sample_ratio", -1.0))
        trace_file = str(getattr(cfg, "trace_file", "") or "").strip()
        out = cls(
            service=service,
            listen_host=str(getattr(cfg, "listen_host", "0.0.0.0")),
            metrics_port=int(getattr(cfg, "metrics_port", 0)),
            trace_exporter=exporter.strip().lower() or "none",
            trace_sample_ratio=ratio if ratio >= 0 else None,
            trace_file=Path(trace_file).expanduser() if trace_file else None,
        )
        out.validate()
        return out

    def validate(self) -> None:
        if self.trace_exporter not in TRACE_EXPORTERS:
            raise ValueError(
                f"trace exporter {self.trace_exporter!r} (traceExporter or OTEL_TRACES_EXPORTER): "
                "use none, console, otlp or file"
            )
        if self.trace_exporter == "file" and self.trace_file is None:
            raise ValueError("traceExporter=file needs traceFile, the path spans are written to")

    @property
    def tracing(self) -> bool:
        return self.trace_exporter != "none"
