"""Timer-wheel service configuration: RocketMQ-style key names, from ``--set key=value``.

Sources, later ones winning: defaults → a config file (``-c``, ``key=value`` lines) →
environment ``ROCKETQ_TIMER_WHEEL_<KEY>`` → ``--set`` overrides → the explicit command-line
options (``--namesrv``, ``--data-dir``, ``--listen``). The keys are the table ``TABLE`` below
(services.common.config). Unknown keys are an error naming the key, so a typo never silently
does nothing.

| key                      | default        | meaning                               |
|--------------------------|----------------|---------------------------------------|
| namesrvAddr              | 127.0.0.1:9876 | nameservers, ``;``-separated          |
| dataDir                  | ~/timerwheel   | timerlog/, messagelog/, wheel, ckpt   |
| listenAddress/listenPort | 0.0.0.0/10931  | TimerAdmin gRPC address               |
| timerPrecisionMs         | 1000           | width of one wheel slot               |
| timerWheelSlots          | 604800         | slots in the window (7 days)          |
| timerLogFileSize         | 104857600      | one TimerLog file                     |
| timerMessageLogFileSize  | 1073741824     | one MessageLog file                   |
| timerFlushIntervalMs     | 100            | checkpoint + offset commit period     |
| timerPullBatchSize       | 256            | records per pull                      |
| timerSendBatchSize       | 256            | messages per re-put Send              |
| timerDeliverBatchSize    | 4096           | due timers handled per round          |
| timerRebalanceIntervalMs | 20000          | queue rebalance period                |
| timerRequestTimeoutMs    | 3000           | deadline of broker calls              |
| timerPullSuspendMs       | 15000          | long-poll hold of an empty pull       |
| logLevel                 | INFO           | DEBUG, INFO, WARNING, ERROR, CRITICAL |

Telemetry keys (metricsPort, traceExporter, traceSampleRatio, traceFile): see
services.common.telemetry.config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common import config
from services.common.config import Key, KeyTable, log_level_key, parse_addrs, parse_path
from services.common.security.keys import security_keys
from services.common.telemetry.config import telemetry_keys

DEFAULT_PORT = 10931
POSITIVE = 1


@dataclass(frozen=True)
class TimerConfig:
    """Everything one timer-wheel process needs."""

    namesrv_addrs: list[str] = field(default_factory=lambda: ["127.0.0.1:9876"])
    data_dir: Path = field(default_factory=lambda: Path.home() / "timerwheel")
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    precision_ms: int = 1000
    wheel_slots: int = 604_800
    timer_log_file_bytes: int = 100 * 1024 * 1024
    message_log_file_bytes: int = 1024 * 1024 * 1024
    flush_interval_ms: int = 100
    pull_batch_max: int = 256
    send_batch_max: int = 256
    deliver_batch_max: int = 4096
    rebalance_interval_ms: int = 20_000
    request_timeout_ms: int = 3000
    pull_suspend_ms: int = 15_000
    """Long-poll hold of an empty pull (the call's deadline is 5 s longer)."""
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
    def window_ms(self) -> int:
        """Delays farther than this from the hand are rolled (SPEC §8.2)."""
        return self.wheel_slots * self.precision_ms

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    def updated(self, changes: Mapping[str, str], source: str = "--set") -> TimerConfig:
        """A copy with RocketMQ-named keys changed; ConfigError naming a bad key or value."""
        return TABLE.apply(self, TABLE.from_overrides(changes, source))


def _positive(name: str, field_name: str) -> Key:
    return Key(name, field_name, int, low=POSITIVE)


TABLE = KeyTable(
    "timer-wheel",
    [
        Key("namesrvAddr", "namesrv_addrs", parse_addrs),
        Key("dataDir", "data_dir", parse_path),
        Key("listenAddress", "listen_host"),
        Key("listenPort", "listen_port", int, low=0, high=65535),
        _positive("timerPrecisionMs", "precision_ms"),
        _positive("timerWheelSlots", "wheel_slots"),
        _positive("timerLogFileSize", "timer_log_file_bytes"),
        _positive("timerMessageLogFileSize", "message_log_file_bytes"),
        _positive("timerFlushIntervalMs", "flush_interval_ms"),
        _positive("timerPullBatchSize", "pull_batch_max"),
        _positive("timerSendBatchSize", "send_batch_max"),
        _positive("timerDeliverBatchSize", "deliver_batch_max"),
        _positive("timerRebalanceIntervalMs", "rebalance_interval_ms"),
        _positive("timerRequestTimeoutMs", "request_timeout_ms"),
        _positive("timerPullSuspendMs", "pull_suspend_ms"),
        log_level_key(),
        *security_keys(),  # sec
        *telemetry_keys(),
    ],
)


def load(
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> TimerConfig:
    """Defaults ← file ← environment ← overrides; ConfigError on a bad key, value or combination."""
    cfg = config.load(TABLE, TimerConfig(), config_file, overrides, environ)
    if cfg.precision_ms > 60_000 or (1000 % cfg.precision_ms and cfg.precision_ms % 1000):
        raise config.ConfigError(
            f"timerPrecisionMs={cfg.precision_ms}: use a divisor or multiple of 1000 up to 60000"
        )
    if cfg.wheel_slots < 2:
        raise config.ConfigError("timerWheelSlots must be at least 2")
    return cfg
