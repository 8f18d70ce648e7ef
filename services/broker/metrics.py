"""The broker's scrape-time metrics (services.common.telemetry.gauges), read off the same
GetRuntimeStats answer ``rocketq admin`` shows, and the commitlog fsync latency histogram.

| metric (OpenTelemetry name → Prometheus)                 | labels                         |
|-----------------------------------------------------------|--------------------------------|
| rocketmq.consumer.lag.messages → rocketmq_consumer_lag_messages | group, topic, queue id  |
| rocketmq.storage.size → rocketmq_storage_size_bytes       |                                |
| rocketmq.storage.disk.used_ratio → …_ratio                |                                |
| rocketmq.storage.flush.behind / dispatch.behind (bytes)    |                                |
| rocketmq.storage.flush.duration → …_milliseconds (histogram) |                             |
| rocketmq.replication.lag (bytes, seconds)                 | slave broker id                |
| rocketmq.replication.in_sync.replicas                     |                                |
| rocketmq.controller.epoch, rocketmq.controller.elections  |                                |
| rocketmq.transaction.checks / discards (counters), .half.pending |                        |
| rocketmq.connections, rocketmq.pull.held, topics, groups  |                                |

Elections: each election raises the group's epoch by exactly one, so the epoch is the count of
elections the group has held; it is reported both as a gauge and as a counter (Prometheus's
``increase()`` then shows elections per interval).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from rocketq._api.rocketq.v1 import admin_pb2
from services.broker.consumer_offset_manager import ConsumerOffsetManager, split_key
from services.common.telemetry import state
from services.common.telemetry.fast import FastHistogram
from services.common.telemetry.gauges import Reading, Snapshot, Values, one, register
from services.common.telemetry.setup import LATENCY_BUCKETS_MS
from services.store.message_store import MessageStore

Stats = admin_pb2.GetRuntimeStatsResponse
GROUP = "messaging.consumer.group.name"
TOPIC = "messaging.destination.name"
QUEUE = "messaging.destination.partition.id"


def install(
    stats: Callable[[], Stats], offsets: ConsumerOffsetManager, store: MessageStore
) -> None:
    """Register the broker's readings and hook the fsync histogram (no-op with metrics off)."""
    if not state.METRICS:
        return
    snap = Snapshot(stats)
    register(_readings(snap, offsets, store))
    fsync = FastHistogram(
        "rocketmq_storage_flush_duration_milliseconds",
        "Duration of one commitlog flush (fsync)",
        (),
        LATENCY_BUCKETS_MS,
    )
    store.flusher.on_flush = lambda seconds: fsync.record(seconds * 1000, ())


def _readings(
    snap: Snapshot[Stats], offsets: ConsumerOffsetManager, store: MessageStore
) -> list[Reading]:
    def s() -> Stats:
        return snap.get()

    def extra(key: str) -> Values:
        value = s().extra.get(key)
        return one(float(value)) if value not in (None, "") else []

    return [
        Reading("rocketmq.consumer.lag.messages", "{message}", "Messages stored but not yet "
                "committed by the group, per queue", lambda: _lag(offsets, store)),
        Reading("rocketmq.storage.size", "By", "Bytes of commitlog files on disk",
                lambda: one(s().commitlog_disk_bytes)),
        Reading("rocketmq.storage.disk.used_ratio", "1", "Fraction of the store disk in use",
                lambda: one(s().disk_used_ratio)),
        Reading("rocketmq.storage.flush.behind", "By", "Commitlog bytes written, not yet on disk",
                lambda: one(s().commitlog_max_offset - s().commitlog_flushed_offset)),
        Reading("rocketmq.storage.dispatch.behind", "By", "Commitlog bytes not yet in consume "
                "queues", lambda: one(s().dispatch_behind_bytes)),
        Reading("rocketmq.storage.commitlog.max_offset", "By", "Commitlog end offset",
                lambda: one(s().commitlog_max_offset)),
        Reading("rocketmq.replication.lag", "By", "Bytes a slave has not acknowledged",
                lambda: ((x.lag_bytes, {"rocketq.slave.id": x.broker_id}) for x in s().slaves)),
        Reading("rocketmq.replication.lag.time", "s", "Age of the oldest byte a slave lacks",
                lambda: ((x.lag_seconds, {"rocketq.slave.id": x.broker_id}) for x in s().slaves)),
        Reading("rocketmq.replication.in_sync.replicas", "{replica}", "Replicas in the in-sync "
                "set, the master's included", lambda: one(_in_sync(s()))),
        Reading("rocketmq.controller.epoch", "1", "The group's failover epoch",
                lambda: one(s().epoch)),
        Reading("rocketmq.controller.elections", "{election}", "Elections the group has held "
                "(each raises the epoch by one)", lambda: one(s().epoch), kind="counter"),
        Reading("rocketmq.broker.is_master", "1", "1 while this replica is the master",
                lambda: one(1 if s().role != admin_pb2.SLAVE else 0)),
        Reading("rocketmq.transaction.checks", "{check}", "Transaction check-backs sent",
                lambda: extra("transaction_checks"), kind="counter"),
        Reading("rocketmq.transaction.discards", "{message}", "Half messages discarded after "
                "transactionCheckMax checks", lambda: extra("transaction_discarded"),
                kind="counter"),
        Reading("rocketmq.transaction.half.pending", "{message}", "Half messages awaiting a "
                "decision", lambda: extra("transaction_half_pending")),
        Reading("rocketmq.connections", "{client}", "Live client streams",
                lambda: one(s().connected_clients)),
        Reading("rocketmq.pull.held", "{request}", "Pulls held by long polling",
                lambda: one(s().held_pull_requests)),
        Reading("rocketmq.topics", "{topic}", "Topics on this broker", lambda: extra("topics")),
        Reading("rocketmq.consumer_groups", "{group}", "Subscription groups on this broker",
                lambda: extra("subscription_groups")),
    ]  # fmt: skip


def _in_sync(stats: Stats) -> int:
    if stats.in_sync_replica_ids:
        return len(stats.in_sync_replica_ids)
    if stats.role == admin_pb2.SLAVE:
        return 0
    return 1 + sum(1 for x in stats.slaves if x.in_sync)


def _lag(
    offsets: ConsumerOffsetManager, store: MessageStore
) -> Iterator[tuple[float, dict[str, str | int]]]:
    """Per group, topic and queue: the queue's end minus the group's committed offset."""
    for key, queues in offsets.snapshot().items():
        topic, group = split_key(key)
        for qid, committed in queues.items():
            end = int(store.max_offset(topic, qid))
            yield max(0, end - committed), {GROUP: group, TOPIC: topic, QUEUE: str(qid)}
