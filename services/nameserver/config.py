"""Nameserver configuration: its key table (services.common.config) and defaults.

| key                         | default | meaning                                          |
|-----------------------------|---------|--------------------------------------------------|
| listenAddress / listenPort  | 0.0.0.0 / 9876 | gRPC address; port 0 = any free           |
| scanNotActiveBrokerInterval | 10000   | ms between scans that drop silent brokers        |
| logLevel                    | INFO    | DEBUG, INFO, WARNING, ERROR, CRITICAL            |
| tls*, acl*                  |         | TLS and ACL keys (services/common/security/keys) |

Environment variables: ``ROCKETQ_NAMESERVER_<KEY>`` (``ROCKETQ_NAMESERVER_LISTENPORT``).

Telemetry keys (metricsPort, traceExporter, traceSampleRatio, traceFile): see
services.common.telemetry.config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common import config
from services.common.config import Key, KeyTable, log_level_key
from services.common.security.keys import security_keys
from services.common.telemetry.config import telemetry_keys

DEFAULT_PORT = 9876
DEFAULT_SCAN_INTERVAL_MS = 10_000


@dataclass(frozen=True)
class NameServerConfig:
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    scan_interval_ms: int = DEFAULT_SCAN_INTERVAL_MS
    log_level: str = "INFO"
    # -- security (sec): TLS and ACL keys, services/common/security/settings.py --
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: str = "none"
    acl_enable: bool = False
    acl_file: str = ""
    # -- telemetry (services.common.telemetry.config) --
    metrics_port: int = 0
    """[metricsPort] Prometheus /metrics on listenAddress:metricsPort; 0 = no endpoint."""
    trace_exporter: str = ""
    """[traceExporter] none, console, otlp or file; empty = OTEL_TRACES_EXPORTER, else none."""
    trace_sample_ratio: float = -1.0
    """[traceSampleRatio] Share of new traces sampled (0..1); negative = OTEL_TRACES_SAMPLER."""
    trace_file: str = ""
    """[traceFile] The file exporter's JSON-lines output (a path)."""

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"


TABLE = KeyTable(
    "nameserver",
    [
        Key("listenAddress", "listen_host", doc="interface the gRPC server binds"),
        Key("listenPort", "listen_port", int, "gRPC port, 0 = any free", low=0, high=65535),
        Key(
            "scanNotActiveBrokerInterval",
            "scan_interval_ms",
            int,
            "how often expired brokers are removed (ms)",
            low=1,
        ),
        log_level_key(),
        *security_keys(),  # sec
        *telemetry_keys(),
    ],
)


def load(
    config_file: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NameServerConfig:
    """Defaults ← file ← environment ← overrides."""
    return config.load(TABLE, NameServerConfig(), config_file, overrides, environ)
