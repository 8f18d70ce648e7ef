"""Runtime broker config updates that outlive a restart: ``config/broker.properties``.

Admin.UpdateBrokerConfig writes every runtime change here (``key=value`` lines, RocketMQ key
names) and the broker loads the file at startup after its config file and environment, before
command-line ``--set`` flags (which win). A key that is unknown or startup-only (a hand-edited
file, a key renamed in a later version) is logged and skipped rather than stopping the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from services.broker import config
from services.broker.config import STARTUP_ONLY_KEYS, BrokerConfig, canonical_key
from services.common.config import ConfigError, read_properties
from services.store.config_files import write_atomic

log = logging.getLogger(__name__)

BROKER_PROPERTIES = "broker.properties"
"""File under the store's config dir holding runtime config updates."""


def load_effective(
    config_file: Path | None,
    overrides: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """The broker's startup config: defaults ← file ← environment ← runtime updates saved in
    the store (found through the store dir the other sources give) ← ``overrides``."""
    first = config.load(config_file, overrides, environ)
    persisted = load_persisted_overrides(first.store_dir / "config")
    if not persisted:
        return first
    return config.load(config_file, overrides, environ, persisted)


def load_persisted_overrides(config_dir: Path) -> dict[str, str]:
    """Runtime config updates saved by UpdateBrokerConfig, keyed by canonical RocketMQ name.

    Unknown and startup-only keys (a file edited by hand, a key renamed in a later version) are
    logged and skipped rather than stopping the broker from starting.
    """
    path = config_dir / BROKER_PROPERTIES
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    for key, value in read_properties(path).items():
        try:
            canonical = canonical_key(key)
        except ConfigError:
            log.warning("%s: unknown key %r ignored", path, key)
            continue
        if canonical in STARTUP_ONLY_KEYS:
            log.warning("%s: startup-only key %r ignored", path, key)
            continue
        out[canonical] = value
    return out


def save_persisted_overrides(config_dir: Path, overrides: dict[str, str]) -> None:
    lines = [
        "# Runtime broker config updates (Admin.UpdateBrokerConfig). Loaded at startup after",
        "# the config file; command-line --set flags win over these.",
    ]
    lines += [f"{key}={overrides[key]}" for key in sorted(overrides)]
    write_atomic(config_dir / BROKER_PROPERTIES, ("\n".join(lines) + "\n").encode())
