"""What a master answers to ``Replication.SyncConfig``: its tables, when the slave's copy is
out of date, and the merge of offsets consumers committed on the slave (replication.proto).

| table                 | source on the master                             | version              |
|-----------------------|--------------------------------------------------|----------------------|
| topics                | TopicConfigManager.all()                         | its data_version     |
| subscription groups   | SubscriptionGroupManager.all()                   | its data_version     |
| consumer offsets      | ConsumerOffsetManager.snapshot()                 | its data_version     |
| timer offsets         | offsets of group ``rmq_sys_timer_wheel`` on the  | bumped here whenever |
|                       | timer topic ``rmq_sys_wheel_timer`` (what the    | that table changes   |
|                       | timer-wheel commits after each checkpoint)       |                      |

A table is sent when the slave sent no version or when its version differs from the
master's (not only when older: a restarted master's counters start again, and "different" is
what matters). A master version of (0, 0) means "unchanged since loaded from disk" (the consumer
offset table's version is not persisted at all); it is answered as (start of this process, 0),
so a slave that synced it once is not sent it again, and a restarted master's table - perhaps
changed just before the restart - is sent again.

Slave offsets (consumers committed on the slave while the master was unreachable) are merged
only where they are ahead of the master's (``increase_only``): the master's own newer commits
win, and a slave cannot move a group back.
"""

from __future__ import annotations

from collections.abc import Iterable

from rocketq._api.rocketq.v1 import common_pb2, replication_pb2
from rocketq.validation import TIMER_TOPIC, check_group, check_topic
from services.broker.consumer_offset_manager import ConsumerOffsetManager, split_key
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.timer_put import TIMER_CONSUMER_GROUP
from services.broker.topic_config_manager import (
    DataVersion,
    TopicConfigManager,
    next_data_version,
)
from services.common.clock import SYSTEM_CLOCK, Clock

SLAVE_OFFSET_ENTRIES_MAX = 100_000
"""(topic, group) entries one SyncConfig may carry; more is refused as INVALID_ARGUMENT."""


def _version_pb(version: DataVersion) -> common_pb2.DataVersion:
    return common_pb2.DataVersion(timestamp_ms=version[0], counter=version[1])


def needs_table(
    request: replication_pb2.SyncConfigRequest, field_name: str, master: DataVersion
) -> bool:
    """Whether the slave's copy (``field_name`` of the request) must be replaced."""
    if not request.HasField(field_name):  # type: ignore[arg-type]
        return True
    slave: common_pb2.DataVersion = getattr(request, field_name)
    return (slave.timestamp_ms, slave.counter) != master


class SyncTables:
    """Builds SyncConfig answers from the broker's managers."""

    def __init__(
        self,
        *,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clock = clock
        self._timer_table: dict[int, int] | None = None
        self._timer_version: DataVersion = (0, 0)
        self.started_ms = clock.now_ms()

    def _effective(self, version: DataVersion) -> DataVersion:
        """A version that tells this process's unchanged-since-load table apart from the same
        table's (0, 0) in another run (see the module docstring)."""
        return (self.started_ms, 0) if version == (0, 0) else version

    def timer_offsets(self) -> tuple[dict[int, int], DataVersion]:
        """The timer-wheel's committed offsets and their version (bumped on change)."""
        table = self.offsets.table(TIMER_CONSUMER_GROUP, TIMER_TOPIC)
        if table != self._timer_table:
            self._timer_table = table
            self._timer_version = next_data_version(self._timer_version, self.clock)
        return table, self._timer_version

    def merge_slave_offsets(self, entries: Iterable[common_pb2.ConsumerOffsetEntry]) -> int:
        """Take each slave offset that is ahead of the master's; how many were taken.
        ValueError on a malformed entry (nothing is merged then)."""
        checked: list[tuple[str, str, int, int]] = []
        for n, entry in enumerate(entries):
            if n >= SLAVE_OFFSET_ENTRIES_MAX:
                raise ValueError(f"more than {SLAVE_OFFSET_ENTRIES_MAX} slave offset entries")
            check_topic(entry.topic)
            check_group(entry.consumer_group)
            for qid, offset in entry.queue_offsets.items():
                if qid < 0 or offset < 0:
                    raise ValueError(
                        f"slave offset {entry.topic}@{entry.consumer_group} queue {qid}: "
                        f"negative queue id or offset ({offset})"
                    )
                checked.append((entry.topic, entry.consumer_group, qid, offset))
        merged = 0
        for topic, group, qid, offset in checked:
            if offset > self.offsets.query(group, topic, qid):
                self.offsets.commit(group, topic, qid, offset, "slave", increase_only=True)
                merged += 1
        return merged

    def response(
        self, request: replication_pb2.SyncConfigRequest
    ) -> replication_pb2.SyncConfigResponse:
        """The tables the slave lacks."""
        out = replication_pb2.SyncConfigResponse()
        topics_version = self._effective(self.topics.data_version)
        if needs_table(request, "topics_version", topics_version):
            out.topics.data_version.CopyFrom(_version_pb(topics_version))
            out.topics.topics.extend(
                t.to_pb() for t in sorted(self.topics.all(), key=lambda t: t.topic_name)
            )
        groups_version = self._effective(self.groups.data_version)
        if needs_table(request, "subscription_groups_version", groups_version):
            out.subscription_groups.data_version.CopyFrom(_version_pb(groups_version))
            out.subscription_groups.groups.extend(
                g.to_pb() for g in sorted(self.groups.all(), key=lambda g: g.group_name)
            )
        offsets_version = self._effective(self.offsets.data_version)
        if needs_table(request, "consumer_offsets_version", offsets_version):
            out.consumer_offsets.data_version.CopyFrom(_version_pb(offsets_version))
            rows = sorted(
                ((*split_key(key), queues) for key, queues in self.offsets.snapshot().items()),
                key=lambda row: (row[0], row[1]),
            )
            out.consumer_offsets.offsets.extend(
                common_pb2.ConsumerOffsetEntry(topic=topic, consumer_group=group, queue_offsets=q)
                for topic, group, q in rows
            )
        timer_table, timer_version = self.timer_offsets()
        if needs_table(request, "timer_offsets_version", timer_version):
            out.timer_offsets.data_version.CopyFrom(_version_pb(timer_version))
            out.timer_offsets.queue_offsets.update(timer_table)
        return out
