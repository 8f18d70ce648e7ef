"""The broker's topic table (SPEC §4.3): what topics this broker hosts, persisted in topics.json.

The file has RocketMQ's shape, so a person who knows RocketMQ reads it at a glance::

    {"topicConfigTable": {"TopicTest": {"topicName": "TopicTest", "readQueueNums": 4,
                                         "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0,
                                         "order": false}, ...},
     "dataVersion": {"timestamp": 1700000000000, "counter": 12}}

Every change bumps ``data_version`` (wall-clock ms, counter) and is written at once, atomically
(services.store.config_files keeps the previous file as ``.bak``): topic changes are rare and an
admin or a producer is waiting for them, so there is nothing to batch. ``on_change`` callbacks
run after each change; the broker hooks its nameserver registration there so routes learn about
new and deleted topics within a moment instead of a 30 s heartbeat.

System topics made at load (as RocketMQ's TopicConfigManager does):

| topic               | queues                | perm                     | when                  |
|---------------------|-----------------------|--------------------------|-----------------------|
| TBW102              | defaultTopicQueueNums | 7 (inherit, read, write) | autoCreateTopicEnable |
| SELF_TEST_TOPIC     | 1                     | 6                        | always                |
| {brokerClusterName} | 1                     | 6                        | always                |
| {brokerName}        | 1                     | 6                        | always                |
| rmq_sys_wheel_timer | timerTopicQueueNums   | 6                        | always                |

The timer topic holds delayed messages until the timer-wheel service re-puts them
(services.broker.timer_put); producers may not send to it and only the timer-wheel's group may
pull it. An existing one keeps its queue count when timerTopicQueueNums changes (shrinking it
would strand the timers in the dropped queues).

Auto-create on send (SPEC §4.3 steps 3–5): a producer that found no route sends to TBW102's
queues; the broker then creates the real topic from the template: queue count = the client's
wish clamped to the template's write queue count, perm = the template's minus INHERIT.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocketq.validation import (
    AUTO_CREATE_TOPIC_KEY,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    SELF_TEST_TOPIC,
    TIMER_TOPIC,
    check_queue_nums,
    check_topic,
    is_system_topic,
)
from services.broker.config import BrokerConfig
from services.broker.model import TopicConfig, check_message_type
from services.common.clock import SYSTEM_CLOCK, Clock
from services.store.config_files import TOPICS, read_json, write_json

log = logging.getLogger(__name__)

DataVersion = tuple[int, int]
"""(timestamp_ms of the last change, change counter); the counter is the comparison key."""

PERM_ALL_BITS = PERM_INHERIT | PERM_READ | PERM_WRITE


def next_data_version(previous: DataVersion, clock: Clock) -> DataVersion:
    """The version after one more change."""
    return (clock.now_ms(), previous[1] + 1)


def data_version_json(version: DataVersion) -> dict[str, int]:
    return {"timestamp": version[0], "counter": version[1]}


def data_version_from_json(raw: Any) -> DataVersion:
    if not isinstance(raw, dict):
        return (0, 0)
    return (int(raw.get("timestamp", 0)), int(raw.get("counter", 0)))


def check_topic_config(cfg: TopicConfig) -> None:
    """Raise ValueError if ``cfg`` could not be a topic of this broker (name, counts, perm)."""
    check_topic(cfg.topic_name)
    check_queue_nums(cfg.read_queue_nums, cfg.write_queue_nums)
    if cfg.perm & ~PERM_ALL_BITS or cfg.perm < 0:
        raise ValueError(f"perm is {cfg.perm}; only bits 1, 2 and 4 exist")
    if cfg.topic_sys_flag < 0:
        raise ValueError(f"topic_sys_flag is {cfg.topic_sys_flag}; it must not be negative")
    check_message_type(cfg.message_type)


class TopicConfigManager:
    """Topic configs of one broker; every method runs on the broker's event loop."""

    def __init__(self, config: BrokerConfig, config_dir: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.path = config_dir / TOPICS
        self.clock = clock
        self._topics: dict[str, TopicConfig] = {}
        self.data_version: DataVersion = (0, 0)
        self.on_change: list[Callable[[], None]] = []
        """Called after every change (the broker adds its registrar's trigger)."""

    # -- load / persist --------------------------------------------------------------------
    def load(self) -> None:
        """Read topics.json (or its .bak), then make sure the system topics exist."""
        raw = read_json(self.path, {})
        table = raw.get("topicConfigTable", {}) if isinstance(raw, dict) else {}
        self._topics = {}
        for name, entry in table.items():
            try:
                cfg = TopicConfig.from_json(entry)
                check_topic_config(cfg)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("%s: topic %r skipped: %s", self.path, name, exc)
                continue
            self._topics[cfg.topic_name] = cfg
        self.data_version = data_version_from_json(
            raw.get("dataVersion") if isinstance(raw, dict) else None
        )
        if self._ensure_system_topics():
            self._changed()

    def _ensure_system_topics(self) -> bool:
        wanted: list[TopicConfig] = []
        if self.config.auto_create_topic_enable:
            n = self.config.default_topic_queue_nums
            wanted.append(TopicConfig(AUTO_CREATE_TOPIC_KEY, n, n, PERM_ALL_BITS))
        wanted.append(TopicConfig(SELF_TEST_TOPIC, 1, 1, PERM_READ | PERM_WRITE))
        timer_queues = self.config.timer_topic_queue_nums
        wanted.append(TopicConfig(TIMER_TOPIC, timer_queues, timer_queues, PERM_READ | PERM_WRITE))
        for name in (self.config.cluster_name, self.config.broker_name):
            try:
                check_topic(name)
            except ValueError:
                continue  # a name topics cannot have simply gets no topic, as in RocketMQ
            wanted.append(TopicConfig(name, 1, 1, PERM_READ | PERM_WRITE))
        added = False
        for cfg in wanted:
            if cfg.topic_name not in self._topics:
                self._topics[cfg.topic_name] = cfg
                added = True
        return added

    def _persist(self) -> None:
        write_json(
            self.path,
            {
                "topicConfigTable": {
                    name: cfg.to_json() for name, cfg in sorted(self._topics.items())
                },
                "dataVersion": data_version_json(self.data_version),
            },
        )

    def _changed(self) -> None:
        self.data_version = next_data_version(self.data_version, self.clock)
        self._persist()
        for callback in list(self.on_change):
            try:
                callback()
            except Exception:  # a listener's bug must not undo or hide a committed change
                log.exception("topic on_change callback failed")

    # -- queries ---------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def all(self) -> list[TopicConfig]:
        """Every topic, sorted by name."""
        return [self._topics[name] for name in sorted(self._topics)]

    def is_system(self, topic: str) -> bool:
        """Topics the broker manages itself: reserved names plus the cluster/broker topics."""
        return is_system_topic(topic) or topic in (
            self.config.cluster_name,
            self.config.broker_name,
        )

    # -- changes ---------------------------------------------------------------------------
    def put(self, cfg: TopicConfig) -> bool:
        """Create or replace ``cfg``; True if it was created. Raises ValueError if invalid."""
        check_topic_config(cfg)
        existing = self._topics.get(cfg.topic_name)
        if existing == cfg:
            return False  # nothing changes: no version bump, no write, no re-registration
        self._topics[cfg.topic_name] = dataclasses.replace(cfg)
        self._changed()
        return existing is None

    def delete(self, topic: str) -> bool:
        """Remove ``topic``; False if it is unknown."""
        if self._topics.pop(topic, None) is None:
            return False
        self._changed()
        return True

    def create_in_send(self, topic: str, default_topic: str, queue_nums: int) -> TopicConfig | None:
        """Auto-create ``topic`` from the template ``default_topic`` for a send (SPEC §4.3).

        Returns the topic (existing or new), or None when auto-creation is off or the template
        is missing here or does not allow inheriting.
        """
        existing = self._topics.get(topic)
        if existing is not None:
            return existing
        if not self.config.auto_create_topic_enable:
            return None
        template = self._topics.get(default_topic)
        if template is None or not template.perm & PERM_INHERIT:
            return None
        n = max(1, min(queue_nums, template.write_queue_nums))
        cfg = TopicConfig(
            topic_name=topic,
            read_queue_nums=n,
            write_queue_nums=n,
            perm=template.perm & ~PERM_INHERIT,
            topic_sys_flag=template.topic_sys_flag,
        )
        check_topic_config(cfg)
        self._topics[topic] = cfg
        log.info("auto-created topic %s from %s with %d queues", topic, default_topic, n)
        self._changed()
        return cfg

    def create_system_topic(self, topic: str, queue_nums: int, perm: int) -> TopicConfig:
        """Return ``topic``, creating it with ``queue_nums`` queues and ``perm`` if missing.

        For topics the broker makes itself (%RETRY%{group}, %DLQ%{group}, the timer topic).
        """
        existing = self._topics.get(topic)
        if existing is not None:
            return existing
        cfg = TopicConfig(topic, queue_nums, queue_nums, perm)
        check_topic_config(cfg)
        self._topics[topic] = cfg
        self._changed()
        return cfg
