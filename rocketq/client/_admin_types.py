"""The administration client's result types: plain frozen dataclasses, and their conversion
from protobuf (the one place that reads admin/nameserver messages field by field).

Public through :mod:`rocketq.client.admin`; kept apart so the client module reads as the list
of operations it offers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, nameserver_pb2
from rocketq.message import ReceivedMessage
from rocketq.validation import PERM_READ, PERM_WRITE


# ---- results ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerGroup:
    """A master and its slaves sharing a broker name."""

    cluster: str
    broker_name: str
    addrs: dict[int, str]
    """Broker id -> "host:port"; id 0 is the master. Only live brokers appear."""

    @property
    def master_addr(self) -> str | None:
        return self.addrs.get(0)

    def read_order(self) -> list[tuple[int, str]]:
        """(broker id, address) of every member to try for a read: the master first, then the
        slaves by id. The nameserver lists a dead master for up to 120 s, so a read must be
        ready to move past it (:meth:`Admin` does, within the call's timeout)."""
        return sorted(self.addrs.items())


@dataclass(frozen=True)
class ReplicaFallback:
    """A read that a slave answered because its group's master did not."""

    broker_name: str
    master_addr: str
    master_error: str
    """Why the master's answer was not used (unreachable, timed out)."""
    replica_addr: str
    replica_id: int

    def describe(self) -> str:
        return (
            f"{self.broker_name}: answered by slave {self.replica_id} at {self.replica_addr}; "
            f"the master {self.master_addr} did not answer ({self.master_error})"
        )


@dataclass(frozen=True)
class LiveBroker:
    """One live broker process as the nameserver sees it."""

    broker_addr: str
    broker_name: str
    broker_id: int
    last_update_timestamp_ms: int
    heartbeat_timeout_ms: int
    ha_server_addr: str
    epoch: int


@dataclass(frozen=True)
class ClusterInfo:
    """The nameserver's cluster map."""

    clusters: dict[str, tuple[str, ...]]
    """Cluster name -> broker group names, sorted."""
    brokers: dict[str, BrokerGroup]
    """Broker group name -> its members."""
    live_brokers: tuple[LiveBroker, ...]

    def masters(self, cluster: str | None = None) -> dict[str, str]:
        """Broker name -> master address, of one cluster or all, for groups with a live master."""
        names = self.clusters.get(cluster, ()) if cluster else self.brokers.keys()
        out = {}
        for name in sorted(names):
            group = self.brokers.get(name)
            if group is not None and group.master_addr:
                out[name] = group.master_addr
        return out

    def group_of(self, addr: str) -> BrokerGroup | None:
        """The broker group an address belongs to, if the nameserver lists it."""
        for group in self.brokers.values():
            if addr in group.addrs.values():
                return group
        return None

    def broker_name_of(self, addr: str) -> str:
        """Which broker group an address belongs to; empty if unknown."""
        for group in self.brokers.values():
            if addr in group.addrs.values():
                return group.broker_name
        return ""


TOPIC_MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
"""A topic's accepted message types (Apache RocketMQ's topic attribute message.type)."""


@dataclass(frozen=True)
class TopicConfig:
    """A topic's configuration on one broker (SPEC §4.3).

    The broker creates max(read, write) queues; producers write to [0, write_queue_nums) and
    consumers read [0, read_queue_nums).
    """

    topic_name: str
    read_queue_nums: int = 8
    """Queues consumers read from, 1..1024 (mqadmin's default is 8)."""
    write_queue_nums: int = 8
    """Queues producers write to, 1..1024."""
    perm: int = PERM_READ | PERM_WRITE
    """2 = write only, 4 = read only, 6 = read and write."""
    topic_sys_flag: int = 0
    """Unit / unit-subscription marker bits; 0 for ordinary topics."""
    order: bool = False
    """An ordered-message topic: do not change its queue counts while it is in use."""
    message_type: str = "MIXED"
    """What RocketMQ 5 SDKs may send to it through the gateway: NORMAL, FIFO, DELAY,
    TRANSACTION or MIXED (any; RocketQ's own protocol is not checked)."""

    def _to_pb(self) -> common_pb2.TopicConfig:
        if self.message_type not in TOPIC_MESSAGE_TYPES:
            raise ValueError(
                f"message_type {self.message_type!r}: use one of {', '.join(TOPIC_MESSAGE_TYPES)}"
            )
        return common_pb2.TopicConfig(
            topic_name=self.topic_name,
            read_queue_nums=self.read_queue_nums,
            write_queue_nums=self.write_queue_nums,
            perm=self.perm,
            topic_sys_flag=self.topic_sys_flag,
            order=self.order,
            message_type=common_pb2.TopicMessageType.Value(self.message_type),
        )

    @classmethod
    def _from_pb(cls, pb: common_pb2.TopicConfig) -> TopicConfig:
        return cls(
            pb.topic_name,
            pb.read_queue_nums,
            pb.write_queue_nums,
            pb.perm,
            pb.topic_sys_flag,
            pb.order,
            # unset (a topic of before the field, or of an older broker) accepts everything
            common_pb2.TopicMessageType.Name(pb.message_type or common_pb2.MIXED),
        )


@dataclass(frozen=True)
class GroupConfig:
    """How brokers treat a consumer group (RocketMQ's SubscriptionGroupConfig, SPEC §6.14)."""

    group_name: str
    consume_enable: bool = True
    """Whether members may pull."""
    consume_broadcast_enable: bool = True
    """Whether the group may consume in BROADCASTING mode."""
    retry_queue_nums: int = 1
    """Queues of the group's %RETRY% topic on each broker."""
    retry_max_times: int = 16
    """Redeliveries before a message goes to the group's %DLQ% topic (-1: unlimited, orderly)."""
    broker_id: int = 0
    """Broker id members normally pull from (0 = master)."""
    which_broker_when_consume_slowly: int = 1
    """Broker id suggested to members whose backlog exceeds the broker's memory."""
    notify_consumer_ids_changed_enable: bool = True
    """Whether brokers push membership changes to members (faster rebalance)."""
    consume_message_orderly: bool = False
    """Whether the group consumes orderly (queue locks, local retries)."""

    def _to_pb(self) -> common_pb2.SubscriptionGroupConfig:
        return common_pb2.SubscriptionGroupConfig(
            group_name=self.group_name,
            consume_enable=self.consume_enable,
            consume_broadcast_enable=self.consume_broadcast_enable,
            retry_queue_nums=self.retry_queue_nums,
            retry_max_times=self.retry_max_times,
            broker_id=self.broker_id,
            which_broker_when_consume_slowly=self.which_broker_when_consume_slowly,
            notify_consumer_ids_changed_enable=self.notify_consumer_ids_changed_enable,
            consume_message_orderly=self.consume_message_orderly,
        )

    @classmethod
    def _from_pb(cls, pb: common_pb2.SubscriptionGroupConfig) -> GroupConfig:
        d = GroupConfig(pb.group_name)

        def pick(name: str, default: Any) -> Any:
            return getattr(pb, name) if pb.HasField(name) else default  # type: ignore[arg-type]

        return cls(
            group_name=pb.group_name,
            consume_enable=pick("consume_enable", d.consume_enable),
            consume_broadcast_enable=pick("consume_broadcast_enable", d.consume_broadcast_enable),
            retry_queue_nums=pick("retry_queue_nums", d.retry_queue_nums),
            retry_max_times=pick("retry_max_times", d.retry_max_times),
            broker_id=pick("broker_id", d.broker_id),
            which_broker_when_consume_slowly=pick(
                "which_broker_when_consume_slowly", d.which_broker_when_consume_slowly
            ),
            notify_consumer_ids_changed_enable=pick(
                "notify_consumer_ids_changed_enable", d.notify_consumer_ids_changed_enable
            ),
            consume_message_orderly=pick("consume_message_orderly", d.consume_message_orderly),
        )


@dataclass(frozen=True)
class ApplyResult:
    """What one broker answered to a create, update or delete."""

    broker_name: str
    broker_addr: str
    code: str
    """gRPC status code name: "OK", "ALREADY_EXISTS", "NOT_FOUND", "UNAVAILABLE", ..."""
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return self.code == "OK"


@dataclass(frozen=True)
class RouteQueue:
    """Which queues of a topic one broker group hosts, and what they allow."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int


@dataclass(frozen=True)
class TopicRouteInfo:
    """A topic's route as the nameserver gives it to clients."""

    topic: str
    queues: tuple[RouteQueue, ...]
    brokers: tuple[BrokerGroup, ...]


@dataclass(frozen=True)
class QueueOffsets:
    """One queue's offsets: [min_offset, max_offset) are the stored queue offsets."""

    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp_ms: int
    """Store time of the newest message; 0 for an empty queue."""


@dataclass(frozen=True)
class BrokerTopic:
    """A topic on one broker: its config there and the offsets of each queue."""

    broker_name: str
    broker_addr: str
    config: TopicConfig
    queues: tuple[QueueOffsets, ...]


@dataclass(frozen=True)
class TopicDescription:
    """Route plus per-broker config and queue offsets of one topic."""

    topic: str
    route: TopicRouteInfo
    brokers: tuple[BrokerTopic, ...]
    errors: dict[str, str] = field(default_factory=dict)
    """Broker name -> why it could not be described."""


@dataclass(frozen=True)
class QueueProgress:
    """A consumer group's progress on one queue."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    """The queue's max offset (one past the newest message)."""
    consumer_offset: int
    """The group's committed offset; -1 if it has none."""
    lag: int
    last_consumed_timestamp_ms: int


@dataclass(frozen=True)
class ConsumeStats:
    """A consumer group's progress over every broker that has offsets for it."""

    group: str
    queues: tuple[QueueProgress, ...]
    total_lag: int
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OffsetReset:
    """One queue moved by an offset reset."""

    broker_name: str
    queue_id: int
    old_offset: int
    """-1 if the group had no committed offset."""
    new_offset: int


@dataclass(frozen=True)
class ResetResult:
    """What an offset reset did on every broker of the topic."""

    queues: tuple[OffsetReset, ...]
    notified_clients: int
    """Live members told to drop their cached offsets."""
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SlaveInfo:
    """One slave as its master sees it (admin.proto SlaveStats)."""

    broker_id: int
    broker_addr: str
    acked_offset: int
    """Commitlog offset up to which the slave has acknowledged."""
    in_sync: bool
    """Whether it is in the in-sync set (close enough and acking: SYNC_MASTER waits for it)."""
    last_ack_timestamp_ms: int
    lag_bytes: int = 0
    """The master's max commitlog offset minus ``acked_offset``."""
    lag_seconds: float = 0.0
    """Age of the oldest byte the slave has not acknowledged (0 when it has everything)."""


@dataclass(frozen=True)
class RuntimeStats:
    """A broker's role, offsets, throughput and disk use."""

    cluster_name: str
    broker_name: str
    broker_id: int
    role: str
    """"SYNC_MASTER", "ASYNC_MASTER" or "SLAVE"."""
    epoch: int
    version: str
    start_timestamp_ms: int
    commitlog_min_offset: int
    commitlog_max_offset: int
    commitlog_flushed_offset: int
    confirm_offset: int
    dispatch_behind_bytes: int
    put_messages_per_second: float
    get_messages_per_second: float
    held_pull_requests: int
    disk_used_ratio: float
    commitlog_disk_bytes: int
    connected_clients: int
    slaves: tuple[SlaveInfo, ...]
    extra: dict[str, str]
    replica_id: int = 0
    """This replica's stable id (its configured brokerId); ``broker_id`` is 0 while it leads."""
    controller_mode: bool = False
    """Roles come from elections through etcd (DESIGN.md §6), not from configuration."""
    in_sync_replica_ids: tuple[int, ...] = ()
    """Controller mode: the group's in-sync replica set as recorded in etcd."""
    lease_remaining_ms: int = 0
    """Controller mode: how long this replica's etcd lease stays valid without renewal."""
    leader_addr: str = ""
    """Controller mode: the group's current master as this replica sees it ("" = none)."""


@dataclass(frozen=True)
class SubscriptionInfo:
    """One subscription of a consumer group member."""

    topic: str
    expression: str
    """"*", "TagA || TagB" or an SQL92 predicate."""
    expression_type: str
    """"TAG" or "SQL92"."""
    sub_version: int


@dataclass(frozen=True)
class ConsumerMember:
    """A live member of a consumer group, merged over the brokers that see it."""

    client_id: str
    addr: str
    """Its address as the broker that heard from it last sees it (host:port)."""
    last_heartbeat_ms: int
    subscriptions: tuple[SubscriptionInfo, ...]
    """Its own subscriptions (its retry topic included), sorted by topic."""
    broker_names: tuple[str, ...]
    """Brokers it has a live stream to."""


@dataclass(frozen=True)
class ConflictMember:
    """What one member subscribes to a topic its group disagrees about."""

    client_id: str
    expression: str | None
    """None when the member does not subscribe to the topic at all."""
    expression_type: str


@dataclass(frozen=True)
class SubscriptionConflictInfo:
    """Members of a clustering group that subscribe to one topic differently (SPEC §6.17).
    They share the topic's queues, so a member's filter would drop messages another wants;
    while ``pulls_refused`` the brokers refuse the group's pulls of it (nothing is lost, it
    resumes once they agree), otherwise they only report it (messages can be lost)."""

    topic: str
    members: tuple[ConflictMember, ...]
    pulls_refused: bool
    broker_names: tuple[str, ...]
    """Brokers reporting the conflict."""


@dataclass(frozen=True)
class QueueLockInfo:
    """An orderly queue lock and its holder (SPEC §6.15)."""

    topic: str
    broker_name: str
    queue_id: int
    client_id: str
    last_lock_ms: int
    """When the holder last took or renewed it; it expires rebalanceLockMaxLiveTime later."""


@dataclass(frozen=True)
class ConsumerConnectionInfo:
    """A consumer group's live members, subscription conflicts and queue locks, over every
    master (mqadmin's consumerConnection)."""

    group: str
    consume_type: str
    """"CONSUME_TYPE_PUSH" or "CONSUME_TYPE_PULL"."""
    message_model: str
    """"CLUSTERING" or "BROADCASTING"."""
    consume_from_where: str
    consume_orderly: bool
    members: tuple[ConsumerMember, ...]
    conflicts: tuple[SubscriptionConflictInfo, ...]
    locks: tuple[QueueLockInfo, ...]
    errors: dict[str, str] = field(default_factory=dict)
    """Broker name -> why it could not be asked."""


@dataclass(frozen=True)
class DeadLetterPage:
    """Dead letters of a consumer group on one broker (its ``%DLQ%{group}`` queue 0)."""

    broker_name: str
    messages: tuple[ReceivedMessage, ...]
    """Oldest first; ``queue_offset`` is the DLQ offset, RETRY_TOPIC / ORIGIN_MESSAGE_ID name
    where each came from, ``offset_msg_id`` is what :meth:`Admin.resend_dead_letter` takes."""
    next_offset: int
    """DLQ offset to continue from on this broker."""
    total: int
    """Dead letters stored in this broker's DLQ now."""


@dataclass(frozen=True)
class DeadLetters:
    """A consumer group's dead letters, one page per broker asked (SPEC §6.16)."""

    group: str
    pages: tuple[DeadLetterPage, ...]
    """By broker name; brokers whose DLQ is empty or absent have an empty page."""
    errors: dict[str, str] = field(default_factory=dict)
    """Broker name -> why it could not be asked."""

    @property
    def messages(self) -> list[ReceivedMessage]:
        """Every page's messages, by broker then DLQ offset."""
        return [m for page in self.pages for m in page.messages]

    @property
    def total(self) -> int:
        """Dead letters stored over every broker asked."""
        return sum(page.total for page in self.pages)


@dataclass(frozen=True)
class ResentDeadLetter:
    """Where :meth:`Admin.resend_dead_letter` sent a dead letter: a new message in its original
    topic (the dead letter itself stays in the DLQ)."""

    topic: str
    msg_id: str
    """Unique id of the new message."""
    broker_name: str
    queue_id: int
    queue_offset: int


# ---- protobuf -> dataclass ------------------------------------------------------------------
def broker_group(pb: nameserver_pb2.BrokerData) -> BrokerGroup:
    return BrokerGroup(pb.cluster, pb.broker_name, dict(sorted(pb.broker_addrs.items())))


def apply_results(results: Iterable[admin_pb2.BrokerApplyResult]) -> list[ApplyResult]:
    return [
        ApplyResult(r.broker_name, r.broker_addr, code_name(r.status_code), r.error_message)
        for r in results
    ]


def code_name(number: int) -> str:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return str(code.name)
    return f"CODE_{number}"


def received_message(pb: common_pb2.StoredMessage, broker_name: str = "") -> ReceivedMessage:
    m = pb.message
    return ReceivedMessage(
        topic=m.topic,
        body=m.body,
        properties=dict(m.properties),
        queue_id=pb.queue_id,
        queue_offset=pb.queue_offset,
        commitlog_offset=pb.commitlog_offset,
        msg_id=pb.msg_id,
        offset_msg_id=pb.offset_msg_id,
        born_timestamp_ms=pb.born_timestamp_ms,
        store_timestamp_ms=pb.store_timestamp_ms,
        born_host=pb.born_host,
        store_host=pb.store_host,
        reconsume_times=pb.reconsume_times,
        sys_flag=pb.sys_flag,
        flag=m.flag,
        store_size_bytes=pb.store_size_bytes,
        body_crc=pb.body_crc,
        prepared_transaction_offset=pb.prepared_transaction_offset,
        broker_name=broker_name,
    )


def runtime_stats(pb: admin_pb2.GetRuntimeStatsResponse) -> RuntimeStats:
    return RuntimeStats(
        cluster_name=pb.cluster_name,
        broker_name=pb.broker_name,
        broker_id=pb.broker_id,
        role=admin_pb2.BrokerRole.Name(pb.role),
        epoch=pb.epoch,
        version=pb.version,
        start_timestamp_ms=pb.start_timestamp_ms,
        commitlog_min_offset=pb.commitlog_min_offset,
        commitlog_max_offset=pb.commitlog_max_offset,
        commitlog_flushed_offset=pb.commitlog_flushed_offset,
        confirm_offset=pb.confirm_offset,
        dispatch_behind_bytes=pb.dispatch_behind_bytes,
        put_messages_per_second=pb.put_messages_per_second,
        get_messages_per_second=pb.get_messages_per_second,
        held_pull_requests=pb.held_pull_requests,
        disk_used_ratio=pb.disk_used_ratio,
        commitlog_disk_bytes=pb.commitlog_disk_bytes,
        connected_clients=pb.connected_clients,
        slaves=tuple(
            SlaveInfo(
                s.broker_id,
                s.broker_addr,
                s.acked_offset,
                s.in_sync,
                s.last_ack_timestamp_ms,
                s.lag_bytes,
                s.lag_seconds,
            )
            for s in pb.slaves
        ),
        extra=dict(sorted(pb.extra.items())),
        replica_id=pb.replica_id or pb.broker_id,
        controller_mode=pb.controller_mode,
        in_sync_replica_ids=tuple(sorted(pb.in_sync_replica_ids)),
        lease_remaining_ms=pb.lease_remaining_ms,
        leader_addr=pb.leader_addr,
    )


def _expression_type(number: int) -> str:
    return "SQL92" if number == common_pb2.SQL92 else "TAG"


def consumer_connection(
    group: str, answers: dict[str, admin_pb2.GetConsumerConnectionResponse]
) -> ConsumerConnectionInfo:
    """Merge brokers' GetConsumerConnection answers (broker name -> answer, at least one)."""
    names = sorted(answers)
    members: dict[str, tuple[admin_pb2.ConsumerConnection, list[str]]] = {}
    conflicts: dict[str, tuple[dict[str, ConflictMember], bool, list[str]]] = {}
    locks: list[QueueLockInfo] = []
    for name in names:
        pb = answers[name]
        for conn in pb.connections:
            seen = members.get(conn.client_id)
            if seen is None or conn.last_heartbeat_ms > seen[0].last_heartbeat_ms:
                members[conn.client_id] = (conn, seen[1] if seen else [])
            members[conn.client_id][1].append(name)
        for c in pb.conflicts:
            by_id, refused, brokers = conflicts.get(c.topic, ({}, False, []))
            for m in c.members:
                by_id.setdefault(
                    m.client_id,
                    ConflictMember(
                        m.client_id,
                        m.expression if m.subscribed else None,
                        _expression_type(m.expression_type),
                    ),
                )
            conflicts[c.topic] = (by_id, refused or c.pulls_refused, [*brokers, name])
        locks += [
            QueueLockInfo(lk.topic, name, lk.queue_id, lk.client_id, lk.last_lock_ms)
            for lk in pb.locks
        ]
    first = answers[names[0]]
    return ConsumerConnectionInfo(
        group=group,
        consume_type=first.consume_type,
        message_model=first.message_model,
        consume_from_where=first.consume_from_where,
        consume_orderly=any(a.consume_orderly for a in answers.values()),
        members=tuple(
            ConsumerMember(
                cid,
                conn.peer,
                conn.last_heartbeat_ms,
                tuple(
                    SubscriptionInfo(
                        s.topic, s.expression, _expression_type(s.expression_type), s.sub_version
                    )
                    for s in sorted(conn.subscriptions, key=lambda s: s.topic)
                ),
                tuple(brokers),
            )
            for cid, (conn, brokers) in sorted(members.items())
        ),
        conflicts=tuple(
            SubscriptionConflictInfo(
                topic, tuple(by_id[c] for c in sorted(by_id)), refused, tuple(brokers)
            )
            for topic, (by_id, refused, brokers) in sorted(conflicts.items())
        ),
        locks=tuple(sorted(locks, key=lambda lk: (lk.topic, lk.broker_name, lk.queue_id))),
    )


def dead_letter_page(pb: admin_pb2.ListDeadLettersResponse, broker_name: str) -> DeadLetterPage:
    return DeadLetterPage(
        broker_name=broker_name,
        messages=tuple(received_message(m, broker_name) for m in pb.messages),
        next_offset=pb.next_offset,
        total=pb.total,
    )
