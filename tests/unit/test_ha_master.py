"""Master-side replication bookkeeping (services.broker.ha_tracker, ha_master's pure checks,
ha_sync_tables): in-sync set, confirm offset, flow-control window, SYNC_MASTER waiter, lag
statistics and SyncConfig tables. ManualClock, no sockets, no sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2, replication_pb2
from rocketq.validation import TIMER_TOPIC
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.ha_master import check_hello, truncate_point
from services.broker.ha_sync_tables import SyncTables
from services.broker.ha_tracker import AppendSamples, ReplicaTracker, SlaveLink
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import ManualClock
from services.common.errors import ServiceError
from services.store.epoch_file import EpochEntry
from services.timer_wheel import TIMER_GROUP

pytestmark = pytest.mark.unit

SEND_OK = messaging_pb2.SEND_OK
SLAVE_NOT_AVAILABLE = messaging_pb2.SLAVE_NOT_AVAILABLE
FLUSH_SLAVE_TIMEOUT = messaging_pb2.FLUSH_SLAVE_TIMEOUT


class Master:
    """A tracker over a fake commitlog end, recording the bounds it applies."""

    def __init__(self, **config: object) -> None:
        keys: dict[str, object] = {
            "broker_name": "broker-a",
            "ha_housekeeping_interval_ms": 20_000,
            "ha_slave_fallbehind_max": 1000,
            "sync_flush_timeout_ms": 5000,
        }
        keys.update(config)
        self.config = BrokerConfig(**keys)  # type: ignore[arg-type]
        self.clock = ManualClock()
        self.max = 0
        self.bounds: list[int | None] = []
        self.stored_ms: dict[int, int] = {}
        self.tracker = ReplicaTracker(
            self.config,
            self.clock,
            max_offset=lambda: self.max,
            apply_bound=self.bounds.append,
            record_time_ms=self.stored_ms.get,
        )

    def append(self, size: int) -> None:
        self.max += size
        self.tracker.on_append()

    def connect(self, broker_id: int = 1, start: int = 0) -> SlaveLink:
        return self.tracker.connect(broker_id, f"127.0.0.1:{10000 + broker_id}", start)

    def stream(self, link: SlaveLink, upto: int | None = None) -> None:
        """Pretend the sender loop sent everything up to ``upto`` (default: the max)."""
        link.sent_offset = self.max if upto is None else upto

    def ack(self, link: SlaveLink, offset: int) -> None:
        self.tracker.on_ack(link, offset, offset)

    def confirm(self, link: SlaveLink) -> None:
        """Pretend the sender loop handed the current confirm offset to ``link``."""
        self.tracker.on_confirm_sent(link, self.tracker.confirm_offset())


# -- append samples ------------------------------------------------------------------------------


def test_samples_give_the_time_a_byte_was_written_by_and_coalesce_within_the_spacing() -> None:
    s = AppendSamples(100, samples_max=4, spacing_s=0.010)
    s.record(200, 1.000)
    s.record(250, 1.005)  # same 10 ms bucket: end and time move forward
    s.record(300, 1.020)
    assert len(s) == 2
    assert s.written_at(99) is None  # before the ring: unknown here
    assert s.written_at(100) == 1.005
    assert s.written_at(249) == 1.005
    assert s.written_at(250) == 1.020
    assert s.written_at(300) is None  # nothing written there yet
    s.record(300, 2.0)  # no new bytes: ignored
    assert len(s) == 2


def test_samples_ring_is_bounded_and_remembers_where_it_starts() -> None:
    s = AppendSamples(0, samples_max=4, spacing_s=0.010)
    for i in range(1, 20):
        s.record(i * 100, i * 1.0)
    assert len(s) <= 8
    assert s.covered_from > 0
    assert s.written_at(s.covered_from - 1) is None
    assert s.written_at(1850) == 19.0


# -- flow control --------------------------------------------------------------------------------


def test_chunk_size_is_a_batch_and_never_beyond_the_in_flight_window() -> None:
    link = SlaveLink(1, "a", 1000, 0.0)
    assert (link.sent_offset, link.acked_offset) == (1000, 1000)
    assert link.chunk_bytes(256, 1024) == 256
    link.sent_offset = 1000 + 900
    assert link.chunk_bytes(256, 1024) == 124  # only what the window has left
    link.sent_offset = 1000 + 1024
    assert link.chunk_bytes(256, 1024) == 0  # full: wait for an ack
    link.acked_offset = 1500
    assert link.chunk_bytes(256, 1024) == 256


def test_an_append_wakes_a_sender_only_when_it_may_ship_the_bytes() -> None:
    """haSmallChunksInFlightMax=1: with a chunk unacked, a small append waits for the ack, so
    it does not wake the sender; an append that fills a chunk does, and so does the ack."""
    m = Master(ha_small_chunks_in_flight_max=1, ha_transfer_batch_size=4096)
    link = m.connect()
    link.wake.clear()
    m.append(100)
    assert link.wake.is_set()  # nothing in flight: ship at once
    link.wake.clear()
    m.stream(link)
    link.chunk_ends.append(link.sent_offset)  # what the sender loop records per chunk
    m.append(100)
    assert not link.wake.is_set()  # a small tail behind an unacked chunk: held
    m.append(4096)
    assert link.wake.is_set()  # a full chunk waits: ship it
    link.wake.clear()
    m.ack(link, 100)
    assert link.wake.is_set()  # the ack releases the held tail


def test_an_append_does_not_wake_a_sender_whose_window_is_full() -> None:
    m = Master(
        ha_small_chunks_in_flight_max=0, ha_transfer_batch_size=4096, ha_max_in_flight_bytes=8192
    )
    link = m.connect()
    m.append(8192)
    m.stream(link)
    link.wake.clear()
    m.append(100)
    assert not link.wake.is_set()  # 8192 bytes unacked: nothing may go before an ack
    m.ack(link, 4096)
    assert link.wake.is_set()


# -- in-sync set and confirm offset ----------------------------------------------------------------


def test_a_slave_joins_only_after_acking_everything_and_bounds_the_confirm_offset() -> None:
    m = Master()
    m.append(500)
    link = m.connect()
    assert m.tracker.confirm_offset() == 500  # connected, not in sync: unbounded
    m.stream(link)
    m.ack(link, 300)
    assert not link.in_sync and m.bounds == []
    m.ack(link, 500)
    assert link.in_sync and m.bounds == [500]
    m.append(100)
    assert m.tracker.confirm_offset() == 500  # the new bytes wait for the slave
    m.stream(link)
    m.ack(link, 600)
    assert m.tracker.confirm_offset() == 600 and m.bounds == [500, 600]


def test_a_second_slave_behind_the_confirm_offset_does_not_pull_it_back() -> None:
    m = Master()
    m.append(1000)
    a = m.connect(1)
    m.stream(a)
    m.ack(a, 1000)
    m.append(200)
    b = m.connect(2)
    m.stream(b)
    m.ack(b, 900)  # within fallbehind but below what consumers may already read
    assert not b.in_sync
    assert m.tracker.confirm_offset() == 1000
    m.ack(b, 1100)
    assert b.in_sync
    m.stream(a)
    m.ack(a, 1200)
    assert m.tracker.confirm_offset() == 1100  # the minimum of the in-sync acks
    assert m.bounds == sorted(b for b in m.bounds if b is not None)  # never backwards


def test_a_slave_falling_behind_or_going_silent_leaves_and_the_bound_is_lifted() -> None:
    m = Master(ha_slave_fallbehind_max=1000)
    m.append(100)
    link = m.connect()
    m.stream(link)
    m.ack(link, 100)
    assert link.in_sync
    m.append(5000)  # now 5000 bytes behind
    m.tracker.housekeep()
    assert not link.in_sync and m.bounds[-1] is None
    assert m.tracker.confirm_offset() == m.max
    m.stream(link)
    m.ack(link, m.max)
    assert link.in_sync
    m.clock.advance_ms(20_001)
    m.tracker.housekeep()
    assert link.closed and "no ack" in link.close_reason
    assert m.tracker.links == {} and m.bounds[-1] is None


def test_an_ack_refreshes_freshness_so_a_slave_that_keeps_acking_stays() -> None:
    m = Master()
    m.append(100)
    link = m.connect()
    m.stream(link)
    for _ in range(5):
        m.clock.advance_ms(10_000)
        m.ack(link, 100)
        m.tracker.housekeep()
    assert link.in_sync and not link.closed


def test_acks_that_go_backwards_or_beyond_what_was_sent_are_protocol_errors() -> None:
    m = Master()
    m.append(1000)
    link = m.connect()
    m.stream(link, 600)
    m.ack(link, 400)
    with pytest.raises(ValueError, match="below the previous ack"):
        m.ack(link, 300)
    with pytest.raises(ValueError, match="beyond"):
        m.ack(link, 700)


def test_a_reconnect_replaces_the_older_stream_of_the_same_broker_id() -> None:
    m = Master()
    m.append(100)
    old = m.connect(1)
    m.stream(old)
    m.ack(old, 100)
    new = m.connect(1, start=100)
    assert old.closed and "newer stream" in old.close_reason and old.wake.is_set()
    assert m.tracker.links == {1: new}
    m.tracker.close(old, "stream ended")  # the old stream's own cleanup
    assert m.tracker.links == {1: new}


# -- SYNC_MASTER waiter --------------------------------------------------------------------------


async def test_waiter_answers_at_once_without_an_in_sync_slave_or_when_already_acked() -> None:
    m = Master()
    m.append(100)
    waiter = m.tracker.waiter
    assert await waiter.wait_replicated(100) == SLAVE_NOT_AVAILABLE
    link = m.connect()
    assert await waiter.wait_replicated(100) == SLAVE_NOT_AVAILABLE  # catching up
    m.stream(link)
    m.ack(link, 100)
    m.confirm(link)
    assert await waiter.wait_replicated(100) == SEND_OK
    assert waiter.pending == 0


async def test_waiters_are_released_in_offset_order_by_acks() -> None:
    m = Master()
    link = m.connect()
    m.ack(link, 0)
    assert link.in_sync
    ends = [100, 200, 300]
    tasks = []
    for end in ends:
        m.append(100)
        tasks.append(asyncio.create_task(m.tracker.waiter.wait_replicated(end)))
    await asyncio.sleep(0)
    assert m.tracker.waiter.pending == 3
    m.stream(link)
    m.ack(link, 250)
    await asyncio.sleep(0)
    assert not any(t.done() for t in tasks)  # acked, but the slave was not told yet
    m.confirm(link)
    await asyncio.sleep(0)
    assert [t.done() for t in tasks] == [True, True, False]
    m.ack(link, 300)
    m.confirm(link)
    assert [await t for t in tasks] == [SEND_OK] * 3
    assert m.tracker.waiter.pending == 0


async def test_waiter_times_out_on_the_injected_clock_with_flush_slave_timeout() -> None:
    m = Master(sync_flush_timeout_ms=5000)
    link = m.connect()
    m.ack(link, 0)
    m.append(100)
    task = asyncio.create_task(m.tracker.waiter.wait_replicated(100))
    await asyncio.sleep(0)
    m.clock.advance_ms(4999)
    assert m.tracker.waiter.expire_due() == 0
    m.clock.advance_ms(1)
    assert m.tracker.waiter.expire_due() == 1
    assert await task == FLUSH_SLAVE_TIMEOUT


async def test_one_shared_timer_expires_waiters_in_turn_without_anyone_calling_expire() -> None:
    m = Master(sync_flush_timeout_ms=20)
    link = m.connect()
    m.ack(link, 0)
    m.append(100)
    waiter = m.tracker.waiter
    first = asyncio.create_task(waiter.wait_replicated(100))
    await asyncio.sleep(0)
    m.clock.advance_ms(10)
    second = asyncio.create_task(waiter.wait_replicated(100))
    await asyncio.sleep(0)
    m.clock.advance_ms(10)  # the first deadline is due, the second 10 ms away
    assert await asyncio.wait_for(first, 5) == FLUSH_SLAVE_TIMEOUT
    assert not second.done()  # the timer re-armed for it, it did not expire it early
    m.clock.advance_ms(10)
    assert await asyncio.wait_for(second, 5) == FLUSH_SLAVE_TIMEOUT
    third = asyncio.create_task(waiter.wait_replicated(100))  # the timer is armed again
    await asyncio.sleep(0)
    m.clock.advance_ms(20)
    assert await asyncio.wait_for(third, 5) == FLUSH_SLAVE_TIMEOUT
    assert waiter.pending == 0


async def test_waiter_count_is_bounded_and_a_cancelled_waiter_is_forgotten() -> None:
    m = Master()
    link = m.connect()
    m.ack(link, 0)
    waiter = m.tracker.waiter
    waiter.waiters_max = 2
    m.append(100)
    first = asyncio.create_task(waiter.wait_replicated(100))
    second = asyncio.create_task(waiter.wait_replicated(100))
    await asyncio.sleep(0)
    assert await waiter.wait_replicated(100) == FLUSH_SLAVE_TIMEOUT  # over the cap
    first.cancel()
    await asyncio.sleep(0)
    assert waiter.pending == 1
    m.stream(link)
    m.ack(link, 100)
    m.confirm(link)
    assert await second == SEND_OK
    assert waiter.pending == 0


# -- stats ---------------------------------------------------------------------------------------


def test_slave_stats_report_ack_lag_bytes_and_lag_seconds() -> None:
    m = Master(ha_slave_fallbehind_max=10_000)
    m.stored_ms[0] = m.clock.now_ms() - 30_000  # written before the tracker's samples
    m.max = 100
    link = m.connect(2)
    m.stream(link)
    (stats,) = m.tracker.slave_stats()
    assert stats.broker_id == 2 and stats.broker_addr == "127.0.0.1:10002"
    assert stats.lag_bytes == 100 and stats.lag_seconds == pytest.approx(30.0)
    m.ack(link, 100)  # caught up with what existed: joins
    m.append(50)
    m.clock.advance_ms(2500)
    m.append(50)
    m.clock.advance_ms(1500)
    (stats,) = m.tracker.slave_stats()
    assert stats.acked_offset == 100 and stats.in_sync
    assert stats.last_ack_timestamp_ms == m.clock.now_ms() - 4000
    assert stats.lag_bytes == 100
    assert stats.lag_seconds == pytest.approx(4.0)  # the byte at 100 was written 4 s ago
    m.stream(link)
    m.ack(link, 150)
    (stats,) = m.tracker.slave_stats()
    assert stats.lag_seconds == pytest.approx(1.5)
    m.ack(link, 200)
    (stats,) = m.tracker.slave_stats()
    assert (stats.lag_bytes, stats.lag_seconds) == (0, 0.0)


# -- hello checks --------------------------------------------------------------------------------


def _hello(**fields: object) -> replication_pb2.SlaveHello:
    base: dict[str, object] = {"broker_name": "broker-a", "broker_id": 1}
    base.update(fields)
    return replication_pb2.SlaveHello(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        (_hello(broker_name=""), grpc.StatusCode.INVALID_ARGUMENT),
        (_hello(broker_id=0), grpc.StatusCode.INVALID_ARGUMENT),
        (_hello(max_physical_offset=-1), grpc.StatusCode.INVALID_ARGUMENT),
        (
            _hello(
                epochs=[
                    replication_pb2.EpochEntry(epoch=2, start_offset=0),
                    replication_pb2.EpochEntry(epoch=1, start_offset=10),
                ]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            _hello(
                epochs=[
                    replication_pb2.EpochEntry(epoch=1, start_offset=10),
                    replication_pb2.EpochEntry(epoch=2, start_offset=5),
                ]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (_hello(broker_name="broker-b"), grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_hello_checks(hello: replication_pb2.SlaveHello, code: grpc.StatusCode) -> None:
    with pytest.raises(ServiceError) as info:
        check_hello(hello, BrokerConfig(broker_name="broker-a"))
    assert info.value.code == code


def test_truncate_point_keeps_the_common_prefix_and_refuses_what_cannot_stream() -> None:
    e0 = [EpochEntry(0, 0)]
    assert truncate_point(e0, 0, 5000, [], 0) == 0  # empty slave
    assert truncate_point(e0, 0, 5000, e0, 3000) == 3000  # behind: keep everything
    assert truncate_point(e0, 0, 5000, e0, 9000) == 5000  # ahead: cut back to the master
    master = [EpochEntry(0, 0), EpochEntry(2, 4000)]
    slave = [EpochEntry(0, 0), EpochEntry(1, 3000)]
    assert truncate_point(master, 0, 5000, slave, 4500) == 3000  # diverged in epoch 1
    with pytest.raises(ServiceError) as info:
        truncate_point(e0, 0, 5000, [EpochEntry(0, 0), EpochEntry(3, 10)], 20)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION  # slave saw a newer epoch
    with pytest.raises(ServiceError) as info:
        truncate_point(e0, 1 << 20, 5 << 20, e0, 1000)
    assert info.value.code == grpc.StatusCode.OUT_OF_RANGE  # retention deleted its resume point


# -- SyncConfig tables ---------------------------------------------------------------------------


def _tables(tmp_path: Path) -> tuple[SyncTables, ConsumerOffsetManager, TopicConfigManager]:
    cfg = BrokerConfig(broker_name="broker-a", store_dir=tmp_path)
    clock = ManualClock()
    topics = TopicConfigManager(cfg, tmp_path, clock)
    topics.load()
    groups = SubscriptionGroupManager(cfg, tmp_path)
    groups.load()
    offsets = ConsumerOffsetManager(tmp_path, clock)
    offsets.load()
    return SyncTables(topics=topics, groups=groups, offsets=offsets, clock=clock), offsets, topics


def _request_with(resp: replication_pb2.SyncConfigResponse) -> replication_pb2.SyncConfigRequest:
    """The next request of a slave that applied ``resp``."""
    req = replication_pb2.SyncConfigRequest(broker_name="broker-a", broker_id=1)
    req.topics_version.CopyFrom(resp.topics.data_version)
    req.subscription_groups_version.CopyFrom(resp.subscription_groups.data_version)
    req.consumer_offsets_version.CopyFrom(resp.consumer_offsets.data_version)
    req.timer_offsets_version.CopyFrom(resp.timer_offsets.data_version)
    return req


def test_sync_config_sends_everything_first_then_only_what_changed(tmp_path: Path) -> None:
    tables, offsets, _topics = _tables(tmp_path)
    offsets.commit("g1", "T1", 0, 5)
    offsets.commit(TIMER_GROUP, TIMER_TOPIC, 3, 42)
    first = tables.response(replication_pb2.SyncConfigRequest(broker_name="broker-a"))
    for name in ("topics", "subscription_groups", "consumer_offsets", "timer_offsets"):
        assert first.HasField(name), name
    names = [t.topic_name for t in first.topics.topics]
    assert names == sorted(names) and names
    assert dict(first.timer_offsets.queue_offsets) == {3: 42}
    rows = [
        (e.topic, e.consumer_group, dict(e.queue_offsets)) for e in first.consumer_offsets.offsets
    ]
    assert ("T1", "g1", {0: 5}) in rows

    second = tables.response(_request_with(first))
    assert not any(
        second.HasField(n)
        for n in ("topics", "subscription_groups", "consumer_offsets", "timer_offsets")
    )
    offsets.commit(TIMER_GROUP, TIMER_TOPIC, 3, 50)
    third = tables.response(_request_with(first))
    assert third.HasField("consumer_offsets") and third.HasField("timer_offsets")
    assert not third.HasField("topics")
    assert dict(third.timer_offsets.queue_offsets) == {3: 50}
    assert third.timer_offsets.data_version != first.timer_offsets.data_version


def test_a_table_unchanged_since_load_is_sent_again_after_a_master_restart(
    tmp_path: Path,
) -> None:
    tables, offsets, _ = _tables(tmp_path)
    offsets.commit("g1", "T1", 0, 5)
    offsets.persist()
    first = tables.response(replication_pb2.SyncConfigRequest(broker_name="broker-a"))
    assert first.subscription_groups.data_version.timestamp_ms > 0  # (0, 0) stands for this run
    restarted, reloaded, _ = _tables(tmp_path)  # loads consumerOffset.json: version (0, 0)
    assert reloaded.data_version == (0, 0)
    restarted.started_ms += 1000
    again = restarted.response(_request_with(first))
    assert again.HasField("consumer_offsets") and again.HasField("subscription_groups")
    assert not restarted.response(_request_with(again)).HasField("consumer_offsets")


def test_slave_offsets_merge_only_where_ahead(tmp_path: Path) -> None:
    tables, offsets, _ = _tables(tmp_path)
    offsets.commit("g1", "T1", 0, 10)
    offsets.commit("g1", "T1", 1, 10)
    entry = common_pb2.ConsumerOffsetEntry(
        topic="T1", consumer_group="g1", queue_offsets={0: 15, 1: 7, 2: 3}
    )
    assert tables.merge_slave_offsets([entry]) == 2
    assert offsets.table("g1", "T1") == {0: 15, 1: 10, 2: 3}
    with pytest.raises(ValueError):
        tables.merge_slave_offsets(
            [common_pb2.ConsumerOffsetEntry(topic="bad topic", consumer_group="g1")]
        )
