"""A slave's copy of its master's metadata, and the offsets consumers commit on the slave.

Replication (``ha_slave``) copies the commitlog; everything a broker keeps *beside* it comes
through ``Replication.SyncConfig`` (replication.proto), so a slave holds what consumers need if
they read from it while the master is away, and a slave promoted later starts from the
master's state:

| table                | master's copy              | what the slave does with it                  |
|----------------------|----------------------------|----------------------------------------------|
| topics               | topics.json                | replaces its table (one write), re-registers |
|                      |                            | with the nameservers so routes list them     |
| subscription groups  | subscriptionGroup.json     | replaces its table (one write)               |
| consumer offsets     | consumerOffset.json        | overwrites each entry the master has, except |
|                      |                            | where a local commit is ahead (below)        |
| timer offsets        | the timer-wheel's commits  | overwrites group ``rmq_sys_timer_wheel`` on  |
|                      |                            | ``rmq_sys_wheel_timer``                      |

A table comes back only when its version differs from the one the slave last applied, so a
quiet cluster costs one small call per ``slaveSyncConfigInterval`` (10 s); the slave also
syncs right after its replication stream connects, and at once when the master's
ConfirmOffset carries a new ``config_version`` (a topic or group changed there), so a new
topic is on the slaves within a round trip rather than up to 10 s later. The versions the
slave sends are the *master's* versions it last applied, not its own tables' versions (those
move with local changes such as auto-created groups), and they live in memory: a restarted
slave asks for everything once.

Tables are replaced by writing the file in the manager's own format and reloading it, not
by one ``put`` per entry: every put is an fsynced write, and a first sync of a thousand
topics would block the event loop for seconds.

**Offsets committed on a slave.** While the slave has no live replication stream (its master
is unreachable), consumers reading from it commit their offsets here instead of getting
NOT_MASTER (:class:`SlaveOffsetCommits`). Such an offset is stored in the slave's own table
and remembered as *local*; every SyncConfig carries the local ones as ``slave_offsets`` (the
master merges each one that is ahead of its own), and a local offset is forgotten once the
master's table shows an offset at or beyond it. Until then the master's older value never
overwrites it, so progress made on the slave survives the master's return. The local set is
persisted in ``slaveLocalOffsets.json`` beside the offset table, so a slave restarted before
its master returns still knows which entries are ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from rocketq._api.rocketq.v1 import common_pb2, replication_pb2, replication_pb2_grpc
from rocketq.aio import wait_event
from rocketq.client.security import security_channel
from rocketq.validation import TIMER_TOPIC
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager, offset_key, split_key
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.timer_put import TIMER_CONSUMER_GROUP
from services.broker.topic_config_manager import (
    DataVersion,
    TopicConfigManager,
    data_version_json,
)
from services.common.grpc_server import PEER_CHANNEL_OPTIONS
from services.store.config_files import load_offset_table, save_offset_table, write_json

log = logging.getLogger(__name__)

LOCAL_OFFSETS_FILE = "slaveLocalOffsets.json"
SYNC_TIMEOUT_MS = 5_000
"""One SyncConfig call; the next round retries."""
SLAVE_OFFSETS_PER_REQUEST_MAX = 65_536
"""Queue offsets sent in one SyncConfig; the rest go in the next rounds."""
LOCAL_OFFSETS_MAX = 1_000_000
"""Queue entries remembered as local; beyond it, the oldest are forgotten (logged)."""

QueueKey = tuple[str, str, int]
"""(topic, group, queue id)."""


def version_pb(version: DataVersion | None) -> common_pb2.DataVersion | None:
    if version is None:
        return None
    return common_pb2.DataVersion(timestamp_ms=version[0], counter=version[1])


def version_of(pb: common_pb2.DataVersion) -> DataVersion:
    return (pb.timestamp_ms, pb.counter)


class SlaveOffsetCommits:
    """Offset commits a slave accepts while its master is unreachable (see the module doc)."""

    def __init__(
        self,
        offsets: ConsumerOffsetManager,
        master_reachable: Callable[[], bool],
        config_dir: Path | None = None,
        local_max: int = LOCAL_OFFSETS_MAX,
    ) -> None:
        self.offsets = offsets
        self._master_reachable = master_reachable
        self.path = config_dir / LOCAL_OFFSETS_FILE if config_dir is not None else None
        self.local_max = local_max
        self.local: dict[QueueKey, int] = {}
        """Offsets committed here that the master has not shown yet (insertion = age order)."""
        self._dirty = False

    def accepting(self) -> bool:
        """True while commits belong here: the replication stream is down."""
        return not self._master_reachable()

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
        """Store the commit in the slave's table and remember it as local."""
        before = self.offsets.query(group, topic, queue_id)
        self.offsets.commit(
            group, topic, queue_id, offset, client=client, increase_only=increase_only
        )
        stored = self.offsets.query(group, topic, queue_id)
        if stored == before:  # nothing moved (a repeat, or a pull's older offset refused)
            return
        key = (topic, group, queue_id)
        self.local.pop(key, None)  # re-insert: the dict's order stays oldest-first
        self.local[key] = stored
        self._dirty = True
        if len(self.local) > self.local_max:
            oldest = next(iter(self.local))
            del self.local[oldest]
            log.warning("more than %d slave-local offsets; forgot %s", self.local_max, oldest)

    def entries(
        self, limit: int = SLAVE_OFFSETS_PER_REQUEST_MAX
    ) -> list[common_pb2.ConsumerOffsetEntry]:
        """Up to ``limit`` local offsets as wire entries (oldest first), for slave_offsets."""
        grouped: dict[tuple[str, str], dict[int, int]] = {}
        for n, ((topic, group, qid), offset) in enumerate(self.local.items()):
            if n >= limit:
                break
            grouped.setdefault((topic, group), {})[qid] = offset
        return [
            common_pb2.ConsumerOffsetEntry(topic=t, consumer_group=g, queue_offsets=queues)
            for (t, g), queues in sorted(grouped.items())
        ]

    def settle(self, key: QueueKey, master_offset: int) -> bool:
        """The master's table shows ``master_offset`` for ``key``: True if it may overwrite
        the slave's entry (no local commit, or the master caught up with it, which ends it)."""
        local = self.local.get(key)
        if local is None:
            return True
        if master_offset >= local:
            del self.local[key]
            self._dirty = True
            return True
        return False

    def clear(self) -> None:
        """Forget every local offset (this broker became the master: they are its own now)."""
        if self.local:
            self.local.clear()
            self._dirty = True
            self.persist()

    # -- persistence -----------------------------------------------------------------------
    def load(self) -> None:
        """Read the local set left by a previous run (absent = none)."""
        if self.path is None:
            return
        table = load_offset_table(self.path)
        self.local = {
            (*split_key(key), qid): offset
            for key, queues in table.items()
            for qid, offset in queues.items()
        }
        self._dirty = False

    def persist(self) -> None:
        """Write the local set if it changed (same shape as consumerOffset.json)."""
        if self.path is None or not self._dirty:
            return
        table: dict[str, dict[int, int]] = {}
        for (topic, group, qid), offset in self.local.items():
            table.setdefault(offset_key(topic, group), {})[qid] = offset
        save_offset_table(self.path, table)
        self._dirty = False


class ConfigSync:
    """Copies the master's tables into this slave's managers (see the module doc)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        commits: SlaveOffsetCommits,
        master_addr: Callable[[], str],
    ) -> None:
        self.config = config
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.commits = commits
        self._master_addr = master_addr
        self.topics_version: DataVersion | None = None
        self.groups_version: DataVersion | None = None
        self.offsets_version: DataVersion | None = None
        self.timer_version: DataVersion | None = None
        """The master's versions last applied (None = ask for everything)."""
        self.rounds_ok = 0
        """Successful SyncConfig calls (stats, tests)."""
        self._wake = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._channel_addr = ""
        self._failing = False

    # -- request / apply (no I/O but the managers' files) -----------------------------------
    def request(self) -> replication_pb2.SyncConfigRequest:
        """The next SyncConfig request: the versions held and the local offsets."""
        return replication_pb2.SyncConfigRequest(
            broker_name=self.config.broker_name,
            broker_id=self.config.broker_id,
            topics_version=version_pb(self.topics_version),
            subscription_groups_version=version_pb(self.groups_version),
            consumer_offsets_version=version_pb(self.offsets_version),
            timer_offsets_version=version_pb(self.timer_version),
            slave_offsets=self.commits.entries(),
        )

    def apply(self, resp: replication_pb2.SyncConfigResponse) -> None:
        """Apply every table the master sent."""
        if resp.HasField("topics"):
            self._apply_topics(resp.topics)
        if resp.HasField("subscription_groups"):
            self._apply_groups(resp.subscription_groups)
        if resp.HasField("consumer_offsets"):
            self._apply_offsets(resp.consumer_offsets)
        if resp.HasField("timer_offsets"):
            self._apply_timer_offsets(resp.timer_offsets)
        self.commits.persist()

    def _apply_topics(self, table: replication_pb2.TopicTable) -> None:
        version = version_of(table.data_version)
        entries = {t.topic_name: _topic_json(t) for t in table.topics}
        write_json(
            self.topics.path,
            {
                "topicConfigTable": dict(sorted(entries.items())),
                "dataVersion": data_version_json(version),
            },
        )
        self.topics.load()  # validates each entry and adds this broker's own system topics
        self.topics_version = version
        log.info("topics synced from the master: %d topics, version %s", len(entries), version)
        if self.topics.data_version != version:
            return  # load added system topics the master lacks and announced the change itself
        for callback in list(self.topics.on_change):  # re-register: routes list the new topics
            try:
                callback()
            except Exception:
                log.exception("topic on_change callback failed after a sync")

    def _apply_groups(self, table: replication_pb2.SubscriptionGroupTable) -> None:
        version = version_of(table.data_version)
        entries = {g.group_name: _group_json(g) for g in table.groups}
        write_json(
            self.groups.path,
            {
                "subscriptionGroupTable": dict(sorted(entries.items())),
                "dataVersion": data_version_json(version),
            },
        )
        self.groups.load()
        self.groups_version = version
        log.info("subscription groups synced from the master: %d groups", len(entries))

    def _apply_offsets(self, table: replication_pb2.ConsumerOffsetTable) -> None:
        kept = 0
        for entry in table.offsets:
            topic, group = entry.topic, entry.consumer_group
            for qid, offset in entry.queue_offsets.items():
                if self.commits.settle((topic, group, qid), offset):
                    self.offsets.commit(group, topic, qid, offset, client="master")
                else:
                    kept += 1
        self.offsets_version = version_of(table.data_version)
        log.debug("consumer offsets synced; %d local commits ahead of the master kept", kept)

    def _apply_timer_offsets(self, table: replication_pb2.TimerOffsetTable) -> None:
        for qid, offset in table.queue_offsets.items():
            self.offsets.commit(TIMER_CONSUMER_GROUP, TIMER_TOPIC, qid, offset, client="master")
        self.timer_version = version_of(table.data_version)

    def reset(self) -> None:
        """Ask for every table next round (a different master, controller mode)."""
        self.topics_version = self.groups_version = None
        self.offsets_version = self.timer_version = None

    # -- the loop ----------------------------------------------------------------------------
    def wake(self) -> None:
        """Sync now (the replication stream just connected)."""
        self._wake.set()

    async def run(self) -> None:
        """Sync every ``slaveSyncConfigInterval`` and on :meth:`wake`, until cancelled."""
        interval_s = self.config.slave_sync_config_interval_ms / 1000
        try:
            while True:
                await self.sync_once()
                await wait_event(self._wake, interval_s)
                self._wake.clear()
        finally:
            with contextlib.suppress(OSError):
                self.commits.persist()

    async def sync_once(self) -> bool:
        """One SyncConfig round; False (logged once per outage) when it failed."""
        addr = self._master_addr()
        if not addr:
            return False
        stub = replication_pb2_grpc.ReplicationStub(await self._channel_to(addr))
        try:
            resp = await stub.SyncConfig(self.request(), timeout=SYNC_TIMEOUT_MS / 1000)
            self.apply(resp)
        except grpc.aio.AioRpcError as exc:
            self._fail(addr, f"{exc.code().name}: {exc.details()}")
            return False
        except (OSError, ValueError) as exc:  # a table that cannot be written or read back
            self._fail(addr, f"{type(exc).__name__}: {exc}")
            return False
        if self._failing:
            log.info("config sync with master %s works again", addr)
        self._failing = False
        self.rounds_ok += 1
        return True

    def _fail(self, addr: str, why: str) -> None:
        if not self._failing:
            log.warning("config sync with master %s failed: %s (retrying)", addr, why)
        self._failing = True

    async def _channel_to(self, addr: str) -> grpc.aio.Channel:
        if self._channel is None or addr != self._channel_addr:
            if self._channel is not None:
                await self._channel.close()
            self._channel = security_channel(addr, PEER_CHANNEL_OPTIONS)
            self._channel_addr = addr
        return self._channel

    async def close(self) -> None:
        """Close the channel and persist the local offsets (after the task is cancelled)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        self.commits.persist()


def _topic_json(pb: common_pb2.TopicConfig) -> dict[str, object]:
    return TopicConfig.from_pb(pb).to_json()


def _group_json(pb: common_pb2.SubscriptionGroupConfig) -> dict[str, object]:
    return SubscriptionGroupConfig.from_pb(pb).to_json()
