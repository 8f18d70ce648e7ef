"""The broker's subscription group table (SPEC §6.14), persisted in subscriptionGroup.json.

One :class:`SubscriptionGroupConfig` per consumer group says how this broker treats the group
(may it consume, may it broadcast, how many retry queues, retries before the DLQ, ...). The file
has RocketMQ's shape::

    {"subscriptionGroupTable": {"my-group": {"groupName": "my-group", "consumeEnable": true,
                                             "retryQueueNums": 1, "retryMaxTimes": 16, ...}},
     "dataVersion": {"timestamp": 1700000000000, "counter": 3}}

With ``autoCreateSubscriptionGroup`` (default true) a group gets a default config the first
time a consumer uses it; otherwise an admin must create it first. Changes are written at once
(they are rare) and bump ``data_version``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from rocketq.validation import check_group
from services.broker.config import BrokerConfig
from services.broker.model import SubscriptionGroupConfig
from services.broker.topic_config_manager import (
    DataVersion,
    data_version_from_json,
    data_version_json,
    next_data_version,
)
from services.common.clock import SYSTEM_CLOCK, Clock
from services.store.config_files import SUBSCRIPTION_GROUPS, read_json, write_json

log = logging.getLogger(__name__)


def check_group_config(cfg: SubscriptionGroupConfig) -> None:
    """Raise ValueError naming the first bad field of ``cfg`` (admin.proto's rules)."""
    check_group(cfg.group_name)
    if cfg.retry_max_times < -1:
        raise ValueError(
            f"retry_max_times is {cfg.retry_max_times}; use -1 (unlimited, orderly) or >= 0"
        )
    if cfg.retry_queue_nums < 0:
        raise ValueError(f"retry_queue_nums is {cfg.retry_queue_nums}; it must be >= 0")
    if cfg.broker_id < 0:
        raise ValueError(f"broker_id is {cfg.broker_id}; it must be >= 0")
    if cfg.which_broker_when_consume_slowly < 0:
        raise ValueError(
            f"which_broker_when_consume_slowly is {cfg.which_broker_when_consume_slowly}; "
            "it must be >= 0"
        )


class SubscriptionGroupManager:
    """Subscription group configs of one broker; every method runs on the event loop."""

    def __init__(self, config: BrokerConfig, config_dir: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.path = config_dir / SUBSCRIPTION_GROUPS
        self.clock = clock
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self.data_version: DataVersion = (0, 0)
        self.on_change: list[Callable[[], None]] = []
        """Called after every change (replication to slaves can hook here)."""

    def load(self) -> None:
        """Read subscriptionGroup.json (or its .bak); a bad entry is logged and skipped."""
        raw = read_json(self.path, {})
        table = raw.get("subscriptionGroupTable", {}) if isinstance(raw, dict) else {}
        self._groups = {}
        for name, entry in table.items():
            try:
                cfg = SubscriptionGroupConfig.from_json(entry)
                check_group_config(cfg)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("%s: group %r skipped: %s", self.path, name, exc)
                continue
            self._groups[cfg.group_name] = cfg
        self.data_version = data_version_from_json(
            raw.get("dataVersion") if isinstance(raw, dict) else None
        )

    def _changed(self) -> None:
        self.data_version = next_data_version(self.data_version, self.clock)
        write_json(
            self.path,
            {
                "subscriptionGroupTable": {
                    name: cfg.to_json() for name, cfg in sorted(self._groups.items())
                },
                "dataVersion": data_version_json(self.data_version),
            },
        )
        for callback in list(self.on_change):
            try:
                callback()
            except Exception:  # a listener's bug must not hide a committed change
                log.exception("subscription group on_change callback failed")

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(group)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; created with defaults (and persisted) if auto-create is on."""
        cfg = self._groups.get(group)
        if cfg is not None:
            return cfg
        if not self.config.auto_create_subscription_group:
            return None
        cfg = SubscriptionGroupConfig(group_name=group)
        check_group_config(cfg)
        self._groups[group] = cfg
        log.info("auto-created subscription group %s", group)
        self._changed()
        return cfg

    def put(self, cfg: SubscriptionGroupConfig) -> bool:
        """Create or replace ``cfg``; True if it was created. Raises ValueError if invalid."""
        check_group_config(cfg)
        existing = self._groups.get(cfg.group_name)
        if existing == cfg:
            return False
        self._groups[cfg.group_name] = dataclasses.replace(cfg)
        self._changed()
        return existing is None

    def delete(self, group: str) -> bool:
        """Remove ``group``'s config; False if it is unknown."""
        if self._groups.pop(group, None) is None:
            return False
        self._changed()
        return True

    def all(self) -> list[SubscriptionGroupConfig]:
        """Every group config, sorted by name."""
        return [self._groups[name] for name in sorted(self._groups)]
