"""Committed consume offsets of every clustering consumer group (SPEC §6.12, file format §11.7).

In memory: ``"topic@group"`` → {queueId: queue offset of the next message the group will
consume}. Neither topic nor group names may contain ``@`` (rocketq.validation), so the key
splits back unambiguously. On disk, consumerOffset.json in RocketMQ's shape, with quoted
integer keys so it is standard JSON (fastjson's unquoted keys are read too)::

    {"offsetTable": {"TopicTest@my-group": {"0": 335, "1": 335, "2": 333},
                     "%RETRY%my-group@my-group": {"0": 0}}}

A commit *overwrites*: the consumer owns its progress and may move it back (a reset, a
rebalance that resumes from an older commit). A decrease is logged, as RocketMQ's
"[NOTIFYME]" line does, because it usually means redelivery.

Commits arrive with every pull and every consumer's 5 s report, so they are not written one by
one: :meth:`run_persist_loop` writes the table every ``flushConsumerOffsetInterval`` (5 s) when
something changed, and once more when it is cancelled at shutdown. A crash loses at most one
interval of progress, which consumers see as redelivery, never as loss.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from services.broker.topic_config_manager import DataVersion, next_data_version
from services.common.clock import SYSTEM_CLOCK, Clock
from services.store.config_files import CONSUMER_OFFSETS, load_offset_table, save_offset_table

log = logging.getLogger(__name__)

KEY_SEPARATOR = "@"


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{KEY_SEPARATOR}{group}"


def split_key(key: str) -> tuple[str, str]:
    """(topic, group) of a table key."""
    topic, _, group = key.rpartition(KEY_SEPARATOR)
    return topic, group


class ConsumerOffsetManager:
    """The broker's consume offset table; every method runs on the event loop."""

    def __init__(self, config_dir: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = config_dir / CONSUMER_OFFSETS
        self.clock = clock
        self._table: dict[str, dict[int, int]] = {}
        self._dirty = False
        self.data_version: DataVersion = (0, 0)
        """Bumped on every change (slaves compare it to skip an unchanged table)."""
        self.persist_count = 0
        """How many times the file was written (tests check persist-only-when-dirty)."""

    def load(self) -> None:
        """Read consumerOffset.json (or its .bak); absent means no offsets yet."""
        self._table = {
            key: dict(queues)
            for key, queues in load_offset_table(self.path).items()
            if KEY_SEPARATOR in key
        }
        self._dirty = False

    # -- changes ---------------------------------------------------------------------------
    def commit(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        client: str = "",
        *,
        increase_only: bool = False,
    ) -> None:
        """Set the group's offset on one queue (overwrites; a decrease is logged).

        ``increase_only`` is for the offset a pull carries (FLAG_COMMIT_OFFSET): a pull sent
        just before its consumer persisted and released the queue can arrive after that persist,
        and its older offset must not move the next owner's start back (duplicates). Explicit
        updates (UpdateConsumerOffset, admin resets) still overwrite.
        """
        queues = self._table.setdefault(offset_key(topic, group), {})
        previous = queues.get(queue_id)
        if previous == offset or (increase_only and previous is not None and offset < previous):
            return
        if previous is not None and offset < previous:
            log.warning(
                "consumer offset moved back: group=%s topic=%s queue=%d %d -> %d client=%s",
                group,
                topic,
                queue_id,
                previous,
                offset,
                client or "?",
            )
        queues[queue_id] = offset
        self._mark_changed()

    def remove_group(self, group: str) -> None:
        """Forget every offset of ``group`` (its %RETRY% topic's included)."""
        gone = [k for k in self._table if split_key(k)[1] == group]
        for key in gone:
            del self._table[key]
        if gone:
            self._mark_changed()

    def remove_topic(self, topic: str) -> None:
        """Forget every group's offsets on ``topic`` (the topic was deleted)."""
        gone = [k for k in self._table if split_key(k)[0] == topic]
        for key in gone:
            del self._table[key]
        if gone:
            self._mark_changed()

    def _mark_changed(self) -> None:
        self._dirty = True
        self.data_version = next_data_version(self.data_version, self.clock)

    # -- queries ---------------------------------------------------------------------------
    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed on this queue."""
        return self._table.get(offset_key(topic, group), {}).get(queue_id, -1)

    def table(self, group: str, topic: str) -> dict[int, int]:
        """A copy of {queueId: offset} for one group on one topic (empty if none)."""
        return dict(self._table.get(offset_key(topic, group), {}))

    def topics_of_group(self, group: str) -> list[str]:
        return sorted(t for t, g in map(split_key, self._table) if g == group)

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted(g for t, g in map(split_key, self._table) if t == topic)

    def snapshot(self) -> dict[str, dict[int, int]]:
        """A deep copy of the whole table (replication, inspection)."""
        return {key: dict(queues) for key, queues in self._table.items()}

    # -- persistence -----------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return self._dirty

    def persist(self) -> None:
        """Write the table atomically if it changed since the last write."""
        if not self._dirty:
            return
        save_offset_table(self.path, dict(sorted(self._table.items())))
        self._dirty = False
        self.persist_count += 1

    async def run_persist_loop(self, interval_ms: int) -> None:
        """Persist every ``interval_ms`` until cancelled; persists once more on the way out."""
        try:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    self.persist()
                except OSError:  # a full or read-only disk: keep serving, retry next time
                    log.exception("writing %s failed; will retry", self.path)
        finally:
            try:
                self.persist()
            except OSError:
                log.exception("writing %s at shutdown failed", self.path)
