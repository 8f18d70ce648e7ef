"""Timer-wheel service configuration: RocketMQ-style key names, from ``--set key=value``.

Sources, later ones winning: defaults → environment ``ROCKETQ_<KEY>`` → ``--set`` overrides →
the explicit command-line options (``--namesrv``, ``--data-dir``, ``--listen``). Unknown keys
are an error naming the key, so a typo never silently does nothing.

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
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PORT = 10931


def _addrs(text: str) -> list[str]:
    return [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"expected a positive integer, got {value}")
    return value


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

    @property
    def window_ms(self) -> int:
        """Delays farther than this from the hand are rolled (SPEC §8.2)."""
        return self.wheel_slots * self.precision_ms

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    def updated(self, changes: Mapping[str, str]) -> TimerConfig:
        """A copy with RocketMQ-named keys changed; ValueError naming a bad key or value."""
        kwargs: dict[str, Any] = {}
        for key, text in changes.items():
            name, parse = lookup_key(key)
            try:
                kwargs[name] = parse(text.strip())
            except ValueError as exc:
                raise ValueError(f"{key}={text!r}: {exc}") from exc
        return dataclasses.replace(self, **kwargs)


Parser = Callable[[str], Any]

KEYS: dict[str, tuple[str, Parser]] = {
    "namesrvAddr": ("namesrv_addrs", _addrs),
    "dataDir": ("data_dir", lambda t: Path(t).expanduser()),
    "listenAddress": ("listen_host", str),
    "listenPort": ("listen_port", int),
    "timerPrecisionMs": ("precision_ms", _positive),
    "timerWheelSlots": ("wheel_slots", _positive),
    "timerLogFileSize": ("timer_log_file_bytes", _positive),
    "timerMessageLogFileSize": ("message_log_file_bytes", _positive),
    "timerFlushIntervalMs": ("flush_interval_ms", _positive),
    "timerPullBatchSize": ("pull_batch_max", _positive),
    "timerSendBatchSize": ("send_batch_max", _positive),
    "timerDeliverBatchSize": ("deliver_batch_max", _positive),
    "timerRebalanceIntervalMs": ("rebalance_interval_ms", _positive),
    "timerRequestTimeoutMs": ("request_timeout_ms", _positive),
    "timerPullSuspendMs": ("pull_suspend_ms", _positive),
}
_BY_LOWER = {k.lower(): k for k in KEYS}


def lookup_key(key: str) -> tuple[str, Parser]:
    canonical = _BY_LOWER.get(key.lower().replace("_", ""))
    if canonical is None:
        raise ValueError(f"unknown timer-wheel key {key!r}; known keys: {', '.join(sorted(KEYS))}")
    return KEYS[canonical]


ENV_PREFIX = "ROCKETQ_"


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``ROCKETQ_<KEY>`` variables naming timer-wheel keys (others belong to other parts)."""
    out: dict[str, str] = {}
    for name, value in environ.items():
        key = name[len(ENV_PREFIX) :].lower().replace("_", "")
        if name.startswith(ENV_PREFIX) and key in _BY_LOWER:
            out[_BY_LOWER[key]] = value
    return out


def load(
    overrides: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> TimerConfig:
    """Defaults ← environment ← overrides; ValueError on a bad key, value or combination."""
    changes = from_environment(os.environ if environ is None else environ)
    changes.update(overrides or {})
    cfg = TimerConfig().updated(changes)
    if cfg.precision_ms > 60_000 or (1000 % cfg.precision_ms and cfg.precision_ms % 1000):
        raise ValueError(
            f"timerPrecisionMs={cfg.precision_ms}: use a divisor or multiple of 1000 up to 60000"
        )
    if cfg.wheel_slots < 2:
        raise ValueError("timerWheelSlots must be at least 2")
    return cfg
