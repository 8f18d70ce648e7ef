"""The slave side of replication without sockets: reconnect backoff, ack pacing, what the
stream's messages do to a real store, config-sync apply/merge rules and the offsets a slave
takes while its master is unreachable (services/broker/ha_slave.py, ha_config_sync.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, replication_pb2
from rocketq.validation import PERM_READ, PERM_WRITE, TIMER_TOPIC
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.ha_config_sync import ConfigSync, SlaveOffsetCommits
from services.broker.ha_pacing import ACK_PACE_MAX_MS
from services.broker.ha_slave import (
    DATA_SOCKET_RETRY_S,
    AckPacer,
    Backoff,
    DataSocketOffers,
    ProtocolError,
    SlaveReplica,
)
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.timer_put import TIMER_CONSUMER_GROUP
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import ManualClock
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.epoch_file import EpochEntry
from services.store.message_store import GetStatus, MessageStore
from tests.unit._broker_parts import BrokerParts, pull_request

pytestmark = pytest.mark.unit


# -- backoff and ack pacing -----------------------------------------------------------------


def test_backoff_doubles_from_100_ms_to_5_s_and_resets() -> None:
    b = Backoff()
    assert [b.next_delay_ms() for _ in range(9)] == [
        100,
        200,
        400,
        800,
        1600,
        3200,
        5000,
        5000,
        5000,
    ]
    b.reset()
    assert b.next_delay_ms() == 100


def test_ack_pacer_acks_at_once_unless_the_chunk_asks_for_a_pace_then_heartbeat() -> None:
    clock = ManualClock()
    pacer = AckPacer(clock, heartbeat_ms=5000)
    pacer.note_written(100)
    assert pacer.wait_ms() <= 0  # nothing sent yet on this stream: ack at once
    pacer.sent(100)
    assert pacer.wait_ms() == pytest.approx(5000)  # idle: the next one is the heartbeat
    clock.advance_ms(1)
    pacer.note_written(200)  # an idle master's chunk (pace 0) ...
    assert pacer.wait_ms() <= 0  # ... is acked at once, however recent the last ack
    pacer.sent(200)
    clock.advance_ms(1)
    pacer.note_written(300, pace_ms=3)  # a busy master's chunks ...
    pacer.note_written(400, pace_ms=3)
    assert pacer.wait_ms() == pytest.approx(2)  # ... wait out 3 ms since the last ack
    clock.advance_ms(2)
    assert pacer.wait_ms() <= 0
    pacer.sent(400)  # ... and cost one ack
    clock.advance_ms(4999)
    assert pacer.wait_ms() == pytest.approx(1)
    clock.advance_ms(1)
    assert pacer.wait_ms() <= 0  # heartbeat while idle


def test_ack_pacer_holds_no_ack_longer_than_its_cap_whatever_a_chunk_asks() -> None:
    clock = ManualClock()
    pacer = AckPacer(clock, heartbeat_ms=5000)
    pacer.note_written(100)
    pacer.sent(100)
    pacer.note_written(200, pace_ms=60_000)
    assert pacer.wait_ms() == pytest.approx(ACK_PACE_MAX_MS)


def test_ack_pacer_written_offset_never_goes_back() -> None:
    pacer = AckPacer(ManualClock(), heartbeat_ms=5000)
    pacer.note_written(500)
    pacer.note_written(400)
    assert pacer.written == 500


def test_ack_pacer_after_the_store_was_cut_back_waits_for_the_heartbeat() -> None:
    # A chunk refused for lack of room drops the partial record before it: the ack then says
    # less than was written. The pacer must not ask for the next ack at once, forever.
    pacer = AckPacer(ManualClock(), heartbeat_ms=5000)
    pacer.note_written(500)
    pacer.sent(300)
    assert pacer.wait_ms() == pytest.approx(5000)
    pacer.note_written(400)  # the master resends from 300
    assert pacer.wait_ms() <= 0


def test_a_master_whose_data_socket_was_unreachable_gets_no_offer_for_a_while() -> None:
    clock = ManualClock()
    offers = DataSocketOffers(clock)
    assert offers.offer("m:1") and offers.offer("m:2")
    offers.unreachable("m:1")
    assert not offers.offer("m:1") and offers.offer("m:2")
    clock.advance_ms(int(DATA_SOCKET_RETRY_S * 1000) - 1)
    assert not offers.offer("m:1")
    clock.advance_ms(1)
    assert offers.offer("m:1") and offers.offer("m:1")


# -- what the stream does to a real store ---------------------------------------------------


def open_store(root: Path, *, slave: bool) -> MessageStore:
    store = MessageStore(
        StoreConfig(store_dir=root, commitlog_file_bytes=64 * 1024, slave=slave),
        clock=ManualClock(),
    )
    store.open()
    return store


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[MessageStore, MessageStore]]:
    master = open_store(tmp_path / "master", slave=False)
    slave = open_store(tmp_path / "slave", slave=True)
    try:
        yield master, slave
    finally:
        master.close_files()
        slave.close_files()


def put(store: MessageStore, count: int, topic: str = "T", queue_id: int = 0) -> None:
    store.append(
        [
            MessageToStore(
                topic=topic,
                queue_id=queue_id,
                body=f"body-{i}".encode() * 20,
                properties=codec.encode_properties({}),
            )
            for i in range(count)
        ]
    )


def slave_config() -> BrokerConfig:
    return BrokerConfig(
        store_dir=Path("/nonexistent"),
        namesrv_addrs=[],
        broker_name="broker-a",
        broker_id=1,
        broker_role="SLAVE",
    )


def copy_in_chunks(
    master: MessageStore, replica: SlaveReplica, chunk_bytes: int, upto: int | None = None
) -> None:
    end = master.commitlog.max_offset if upto is None else upto
    while (pos := replica.store.commitlog.max_offset) < end:
        data = master.read_replica(pos, min(chunk_bytes, end - pos))
        assert data
        replica.apply_chunk(pos, data)


def bodies(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[bytes]:
    got = store.get_messages(topic, queue_id, 0, 1000)
    return [codec.decode_record(r).body for r in got.records]


def test_hello_states_the_max_offset_and_epochs(
    stores: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = stores
    replica = SlaveReplica(slave_config(), slave, "127.0.0.1:7")
    hello = replica.hello()
    assert (hello.broker_name, hello.broker_id, hello.broker_addr) == ("broker-a", 1, "127.0.0.1:7")
    assert hello.max_physical_offset == 0 and list(hello.epochs) == []
    put(master, 5)
    replica.apply_truncate(
        replication_pb2.TruncateTo(
            physical_offset=0, epochs=[replication_pb2.EpochEntry(epoch=0, start_offset=0)]
        )
    )
    copy_in_chunks(master, replica, 4096)
    hello = replica.hello()
    assert hello.max_physical_offset == master.commitlog.max_offset
    assert [(e.epoch, e.start_offset) for e in hello.epochs] == [(0, 0)]


def test_chunks_ending_mid_record_are_served_up_to_the_confirm_offset(
    stores: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = stores
    put(master, 40)
    replica = SlaveReplica(slave_config(), slave, "")
    replica.apply_truncate(replication_pb2.TruncateTo(physical_offset=0))
    copy_in_chunks(master, replica, 333)  # chunks end inside records
    assert slave.commitlog.max_offset == master.commitlog.max_offset
    assert slave.max_offset("T", 0) == 40
    # Connected but nothing confirmed yet: the slave serves nothing new.
    assert slave.get_messages("T", 0, 0, 10).status == GetStatus.OFFSET_OVERFLOW_ONE
    tenth = codec.decode_record(master.get_messages("T", 0, 9, 1).records[0])
    replica.apply_confirm(tenth.physical_offset + tenth.total_size)
    assert len(bodies(slave)) == 10
    replica.apply_confirm(master.commitlog.max_offset)
    assert bodies(slave) == bodies(master)
    ack = replica.ack()
    assert ack.max_physical_offset == master.commitlog.max_offset
    assert 0 <= ack.flushed_offset <= ack.max_physical_offset
    assert replica.behind_bytes() == 0


def test_confirm_beyond_the_slave_bounds_at_its_dispatched_offset(
    stores: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = stores
    put(master, 10)
    replica = SlaveReplica(slave_config(), slave, "")
    replica.apply_truncate(replication_pb2.TruncateTo(physical_offset=0))
    half = master.commitlog.max_offset // 2
    copy_in_chunks(master, replica, 100, upto=half)
    replica.apply_confirm(master.commitlog.max_offset)
    assert slave.confirm_offset == slave.replica_dispatched_offset <= half
    assert replica.behind_bytes() == master.commitlog.max_offset - slave.replica_dispatched_offset
    copy_in_chunks(master, replica, 100)  # the rest arrives: the earlier confirm covers it
    assert slave.confirm_offset == master.commitlog.max_offset
    assert bodies(slave) == bodies(master)


def test_truncate_drops_the_diverged_tail_and_takes_the_masters_epochs(
    stores: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = stores
    put(master, 10)
    replica = SlaveReplica(slave_config(), slave, "")
    replica.apply_truncate(replication_pb2.TruncateTo(physical_offset=0))
    copy_in_chunks(master, replica, 1000)
    replica.apply_confirm(master.commitlog.max_offset)
    assert slave.max_offset("T", 0) == 10
    # The master's history and this slave's part at the 6th record (a failover, say).
    sixth = codec.decode_record(master.get_messages("T", 0, 5, 1).records[0])
    replica.apply_truncate(
        replication_pb2.TruncateTo(
            physical_offset=sixth.physical_offset,
            epochs=[
                replication_pb2.EpochEntry(epoch=0, start_offset=0),
                replication_pb2.EpochEntry(epoch=3, start_offset=sixth.physical_offset),
            ],
        )
    )
    assert slave.commitlog.max_offset == sixth.physical_offset
    assert slave.max_offset("T", 0) == 5
    assert slave.epochs.entries == [EpochEntry(0, 0), EpochEntry(3, sixth.physical_offset)]
    assert slave.confirm_offset == sixth.physical_offset  # never beyond what is left
    assert len(bodies(slave)) == 5
    copy_in_chunks(master, replica, 1000)  # and it streams on from there
    replica.apply_confirm(master.commitlog.max_offset)
    assert bodies(slave) == bodies(master)


def test_stream_contract_violations_are_protocol_errors(
    stores: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = stores
    put(master, 3)
    replica = SlaveReplica(slave_config(), slave, "")
    with pytest.raises(ProtocolError):  # cannot truncate beyond what it has
        replica.apply_truncate(replication_pb2.TruncateTo(physical_offset=10))
    replica.apply_truncate(replication_pb2.TruncateTo(physical_offset=0))
    data = master.read_replica(0, 4096)
    with pytest.raises(ProtocolError):  # a chunk must start at the slave's max offset
        replica.apply_chunk(8, data)


# -- config sync ---------------------------------------------------------------------------


class SlaveParts:
    """A slave's metadata managers in a temp config dir, with a ConfigSync on them."""

    def __init__(self, root: Path, reachable: bool = True) -> None:
        self.clock = ManualClock()
        self.config = BrokerConfig(
            store_dir=root,
            namesrv_addrs=[],
            broker_name="broker-a",
            cluster_name="c1",
            broker_id=1,
            broker_role="SLAVE",
        )
        config_dir = root / "config"
        self.topics = TopicConfigManager(self.config, config_dir, self.clock)
        self.topics.load()
        self.groups = SubscriptionGroupManager(self.config, config_dir, self.clock)
        self.groups.load()
        self.offsets = ConsumerOffsetManager(config_dir, self.clock)
        self.offsets.load()
        self.reachable = reachable
        self.commits = SlaveOffsetCommits(self.offsets, lambda: self.reachable, config_dir)
        self.commits.load()
        self.registrations = 0
        self.topics.on_change.append(self._registered)
        self.sync = ConfigSync(
            config=self.config,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            commits=self.commits,
            master_addr=lambda: "127.0.0.1:1",
        )

    def _registered(self) -> None:
        self.registrations += 1


def dv(counter: int) -> common_pb2.DataVersion:
    return common_pb2.DataVersion(timestamp_ms=1_700_000_000_000 + counter, counter=counter)


def offsets_table(
    counter: int, *entries: tuple[str, str, dict[int, int]]
) -> replication_pb2.ConsumerOffsetTable:
    return replication_pb2.ConsumerOffsetTable(
        data_version=dv(counter),
        offsets=[
            common_pb2.ConsumerOffsetEntry(topic=t, consumer_group=g, queue_offsets=q)
            for t, g, q in entries
        ],
    )


def test_first_request_asks_for_everything(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path)
    req = parts.sync.request()
    assert (req.broker_name, req.broker_id) == ("broker-a", 1)
    for name in (
        "topics_version",
        "subscription_groups_version",
        "consumer_offsets_version",
        "timer_offsets_version",
    ):
        assert not req.HasField(name), name
    assert list(req.slave_offsets) == []


def test_topics_replace_the_table_persist_and_reregister(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path)
    parts.topics.put(TopicConfig("Stale", 2, 2))  # the master does not have it any more
    before = parts.registrations
    table = replication_pb2.TopicTable(
        data_version=dv(7),
        topics=[
            TopicConfig("Orders", 8, 8, PERM_READ | PERM_WRITE).to_pb(),
            TopicConfig("Audit", 2, 4, PERM_READ, order=True).to_pb(),
        ],
    )
    parts.sync.apply(replication_pb2.SyncConfigResponse(topics=table))
    assert parts.topics.get("Orders") == TopicConfig("Orders", 8, 8, PERM_READ | PERM_WRITE)
    assert parts.topics.get("Audit") == TopicConfig("Audit", 2, 4, PERM_READ, order=True)
    assert parts.topics.get("Stale") is None
    assert parts.topics.get("broker-a") is not None  # its own system topics stay
    assert parts.registrations == before + 1  # routes learn the new topics now
    assert parts.sync.request().topics_version == dv(7)
    reloaded = TopicConfigManager(parts.config, tmp_path / "config", parts.clock)
    reloaded.load()
    assert reloaded.get("Orders") is not None and reloaded.get("Stale") is None
    assert reloaded.data_version[1] >= 7


def test_subscription_groups_replace_the_table(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path)
    parts.groups.put(SubscriptionGroupConfig("gone"))
    table = replication_pb2.SubscriptionGroupTable(
        data_version=dv(3),
        groups=[SubscriptionGroupConfig("g1", retry_max_times=3, broker_id=1).to_pb()],
    )
    parts.sync.apply(replication_pb2.SyncConfigResponse(subscription_groups=table))
    assert parts.groups.get("g1") == SubscriptionGroupConfig("g1", retry_max_times=3, broker_id=1)
    assert parts.groups.get("gone") is None
    assert parts.sync.request().subscription_groups_version == dv(3)


def test_absent_tables_change_nothing(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path)
    parts.offsets.commit("g", "T", 0, 5)
    topics_before = parts.topics.all()
    parts.sync.apply(replication_pb2.SyncConfigResponse())
    assert parts.topics.all() == topics_before
    assert parts.offsets.query("g", "T", 0) == 5
    assert not parts.sync.request().HasField("consumer_offsets_version")


def test_master_offsets_overwrite_entries_without_local_commits(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path)
    parts.offsets.commit("g", "T", 0, 50)  # an older copy from the master
    parts.sync.apply(
        replication_pb2.SyncConfigResponse(
            consumer_offsets=offsets_table(4, ("T", "g", {0: 40, 1: 7}))
        )
    )
    assert parts.offsets.table("g", "T") == {0: 40, 1: 7}  # master wins, even backwards
    assert parts.sync.request().consumer_offsets_version == dv(4)


def test_local_commit_ahead_survives_until_the_master_catches_up(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path, reachable=False)
    assert parts.commits.accepting()
    parts.commits.commit("g", "T", 0, 120, client="c1")
    parts.commits.commit("g", "T", 1, 30, client="c1")
    req = parts.sync.request()
    assert [(e.topic, e.consumer_group, dict(e.queue_offsets)) for e in req.slave_offsets] == [
        ("T", "g", {0: 120, 1: 30})
    ]
    # The master has not merged yet: its older offsets must not overwrite the local ones.
    parts.sync.apply(
        replication_pb2.SyncConfigResponse(consumer_offsets=offsets_table(5, ("T", "g", {0: 100})))
    )
    assert parts.offsets.query("g", "T", 0) == 120
    assert set(parts.commits.local) == {("T", "g", 0), ("T", "g", 1)}
    # The master merged queue 0 (and moved on); queue 1 is still only local.
    parts.sync.apply(
        replication_pb2.SyncConfigResponse(
            consumer_offsets=offsets_table(6, ("T", "g", {0: 125, 1: 20}))
        )
    )
    assert parts.offsets.table("g", "T") == {0: 125, 1: 30}
    assert set(parts.commits.local) == {("T", "g", 1)}
    # Equal counts as caught up.
    parts.sync.apply(
        replication_pb2.SyncConfigResponse(consumer_offsets=offsets_table(7, ("T", "g", {1: 30})))
    )
    assert parts.commits.local == {}
    assert list(parts.sync.request().slave_offsets) == []


def test_pull_commit_on_slave_never_moves_back_and_repeats_are_not_local(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path, reachable=False)
    parts.offsets.commit("g", "T", 0, 40)  # synced from the master
    parts.commits.commit("g", "T", 0, 40)  # a consumer repeating it: no progress, not local
    parts.commits.commit("g", "T", 0, 30, increase_only=True)  # an older pull: refused
    assert parts.commits.local == {}
    assert parts.offsets.query("g", "T", 0) == 40
    parts.commits.commit("g", "T", 0, 45, increase_only=True)
    assert parts.commits.local == {("T", "g", 0): 45}


def test_commits_accepted_only_while_the_master_is_unreachable(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path, reachable=True)
    assert not parts.commits.accepting()
    parts.reachable = False
    assert parts.commits.accepting()


def test_local_offsets_survive_a_restart(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path, reachable=False)
    parts.commits.commit("g", "%RETRY%g", 0, 9)
    parts.commits.commit("g", "T", 3, 77)
    parts.commits.persist()
    parts.offsets.persist()
    again = SlaveParts(tmp_path, reachable=False)
    assert again.commits.local == {("%RETRY%g", "g", 0): 9, ("T", "g", 3): 77}
    assert again.offsets.query("g", "T", 3) == 77


def test_local_offsets_are_bounded_oldest_forgotten(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path, ManualClock())
    commits = SlaveOffsetCommits(offsets, lambda: False, local_max=2)
    for qid in range(3):
        commits.commit("g", "T", qid, 10 + qid)
    assert commits.local == {("T", "g", 1): 11, ("T", "g", 2): 12}
    assert len(commits.entries(limit=1)[0].queue_offsets) == 1


def test_timer_offsets_land_on_the_timer_group(tmp_path: Path) -> None:
    parts = SlaveParts(tmp_path)
    table = replication_pb2.TimerOffsetTable(data_version=dv(2), queue_offsets={0: 11, 5: 3})
    parts.sync.apply(replication_pb2.SyncConfigResponse(timer_offsets=table))
    assert parts.offsets.table(TIMER_CONSUMER_GROUP, TIMER_TOPIC) == {0: 11, 5: 3}
    assert parts.sync.request().timer_offsets_version == dv(2)


async def test_pull_commit_offsets_on_a_slave_only_while_its_master_is_unreachable(
    tmp_path: Path,
) -> None:
    parts = BrokerParts(tmp_path, broker_id=1, broker_role="SLAVE")
    try:
        parts.create_topic("T", queues=1)
        parts.append("T", count=3)
        reachable = True
        commits = SlaveOffsetCommits(parts.offsets, lambda: reachable)
        parts.puller.slave_commits = commits
        commit_pull = pull_request("T", 0, flags=0x4 | 0x1, commit_offset=2)
        await parts.puller.pull(commit_pull, None)
        assert parts.offsets.query("cg", "T", 0) == -1  # the master owns it while reachable
        reachable = False
        await parts.puller.pull(commit_pull, None)
        assert parts.offsets.query("cg", "T", 0) == 2
        assert commits.local == {("T", "cg", 0): 2}
    finally:
        parts.close()
