"""Admin's consumer handlers: progress and lag, live connections, offset reset.

GetConsumerConnection answers from this broker's own view: the group's live members with their
own subscriptions (from their heartbeats), the topics they disagree about (SPEC §6.17, see
services/broker/client_manager.py) and, for orderly groups, who holds each queue lock here. A
group with more than ``CONNECTIONS_LISTED_MAX`` live members lists the first ones by client id;
its conflicts still consider every member.

ResetOffset is a change (masters only): it commits the new offsets, persists them at once and
tells the group's live clients.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.validation import retry_topic
from services.broker.admin_common import (
    check_group_name,
    check_topic_name,
    enum_name,
    require_master,
    store_time,
)
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.model import TopicConfig
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.errors import invalid, not_found
from services.store.message_store import MessageStore

if TYPE_CHECKING:
    from services.broker.client_manager import ClientManager
    from services.broker.rebalance_lock import RebalanceLockManager

log = logging.getLogger(__name__)

#: Members one GetConsumerConnection answer lists (each with up to 1024 subscriptions).
CONNECTIONS_LISTED_MAX = 1000


class ConsumerAdmin:
    """GetConsumeStats, GetConsumerConnection and ResetOffset of one broker."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        clients: ClientManager,
        locks: RebalanceLockManager | None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clients = clients
        self.locks = locks
        """Orderly queue locks, for GetConsumerConnection; None = no lock is listed."""

    # -- progress --------------------------------------------------------------------------
    def consume_stats(
        self, request: admin_pb2.GetConsumeStatsRequest
    ) -> admin_pb2.GetConsumeStatsResponse:
        group = request.consumer_group
        check_group_name(group)
        if request.topic:
            check_topic_name(request.topic, change=False)
            topics = [request.topic] if self.offsets.table(group, request.topic) else []
        else:
            topics = self.offsets.topics_of_group(group)
            retry = retry_topic(group)
            if retry not in topics and self.topics.get(retry) is not None:
                topics.append(retry)  # the group retries here but has not consumed them yet
        if not any(self.offsets.table(group, t) for t in topics):
            where = f" on topic {request.topic}" if request.topic else ""
            not_found(
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"consumer group {group} has no offsets{where} on broker {self.config.broker_name}",
                consumer_group=group,
            )
        stats: list[admin_pb2.QueueConsumeStats] = []
        for topic in sorted(topics):
            stats.extend(self._queue_stats(group, topic))
        return admin_pb2.GetConsumeStatsResponse(queues=stats, total_lag=sum(s.lag for s in stats))

    def _queue_stats(self, group: str, topic: str) -> list[admin_pb2.QueueConsumeStats]:
        committed = self.offsets.table(group, topic)
        cfg = self.topics.get(topic)
        queue_ids = set(committed)
        if cfg is not None:
            queue_ids.update(range(cfg.read_queue_nums))
        out = []
        for qid in sorted(queue_ids):
            broker_offset = int(self.store.max_offset(topic, qid))
            min_offset = int(self.store.min_offset(topic, qid))
            consumer_offset = committed.get(qid, -1)
            out.append(
                admin_pb2.QueueConsumeStats(
                    topic=topic,
                    broker_name=self.config.broker_name,
                    queue_id=qid,
                    broker_offset=broker_offset,
                    consumer_offset=consumer_offset,
                    lag=max(0, broker_offset - max(consumer_offset, min_offset)),
                    last_consumed_timestamp_ms=store_time(
                        self.store, topic, qid, consumer_offset - 1
                    ),
                )
            )
        return out

    # -- connections -----------------------------------------------------------------------
    def connection(
        self, request: admin_pb2.GetConsumerConnectionRequest
    ) -> admin_pb2.GetConsumerConnectionResponse:
        group = request.consumer_group
        check_group_name(group)
        info = self.clients.consumer_group_info(group)
        if info is None or not info.members:
            not_found(
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"consumer group {group} has no live member on broker {self.config.broker_name}",
                consumer_group=group,
            )
        connections = []
        for cid in info.member_ids()[:CONNECTIONS_LISTED_MAX]:
            channel = self.clients.channel(cid)
            connections.append(
                admin_pb2.ConsumerConnection(
                    client_id=cid,
                    peer=channel.peer_addr if channel is not None else "",
                    last_heartbeat_ms=info.members[cid],
                    subscriptions=[s.to_pb() for s in info.subscriptions_of(cid)],
                )
            )
        return admin_pb2.GetConsumerConnectionResponse(
            connections=connections,
            consume_type=enum_name(messaging_pb2.ConsumeType, info.consume_type),
            message_model=enum_name(messaging_pb2.MessageModel, info.message_model),
            consume_from_where=enum_name(messaging_pb2.ConsumeFromWhere, info.consume_from_where),
            consume_orderly=info.consume_orderly,
            conflicts=self.clients.conflicts(group),
            locks=self._locks_of(group),
        )

    def _locks_of(self, group: str) -> list[admin_pb2.QueueLock]:
        locks = self.locks.locks_of_group(group) if self.locks is not None else []
        return [
            admin_pb2.QueueLock(
                topic=lk.topic,
                queue_id=lk.queue_id,
                client_id=lk.client_id,
                last_lock_ms=lk.last_lock_ms,
            )
            for lk in locks
        ]

    # -- offset reset ----------------------------------------------------------------------
    def reset_offset(self, request: admin_pb2.ResetOffsetRequest) -> admin_pb2.ResetOffsetResponse:
        group, topic = request.consumer_group, request.topic
        cfg = self._check_reset(request)
        if request.HasField("queue_id"):
            if request.queue_id >= cfg.queue_nums:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"queue_id {request.queue_id}: topic {topic} has queues "
                    f"0..{cfg.queue_nums - 1} here",
                )
            queue_ids = [request.queue_id]
        else:
            queue_ids = list(range(cfg.queue_nums))
        resets: list[admin_pb2.QueueOffsetReset] = []
        new_offsets: dict[int, int] = {}
        for qid in queue_ids:
            new = self._reset_target(request, qid)
            old = self.offsets.query(group, topic, qid)
            self.offsets.commit(group, topic, qid, new, client="admin:ResetOffset")
            new_offsets[qid] = new
            resets.append(admin_pb2.QueueOffsetReset(queue_id=qid, old_offset=old, new_offset=new))
        self.offsets.persist()  # an operator's reset must survive a crash right after it
        notified = self.clients.notify_reset_offset(group, topic, new_offsets)
        log.info(
            "offsets of %s on %s reset to %s (%d clients told)", group, topic, new_offsets, notified
        )
        return admin_pb2.ResetOffsetResponse(queues=resets, notified_clients=notified)

    def _check_reset(self, request: admin_pb2.ResetOffsetRequest) -> TopicConfig:
        """The request's checks, in order (names, position, this broker a master, the topic
        and group known here); the topic's config."""
        group, topic = request.consumer_group, request.topic
        check_group_name(group)
        check_topic_name(topic, change=False)
        position = request.WhichOneof("position")
        if position is None:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "set timestamp_ms or queue_offset")
        if getattr(request, position) < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"{position} is negative")
        if request.HasField("queue_id") and request.queue_id < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"queue_id {request.queue_id} is negative")
        require_master(self.config)
        cfg = self.topics.get(topic)
        if cfg is None:
            not_found(common_pb2.TOPIC_NOT_EXIST, f"topic {topic} does not exist here", topic=topic)
        if self.groups.get(group) is None:
            not_found(
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {group} does not exist here",
                consumer_group=group,
            )
        return cfg

    def _reset_target(self, request: admin_pb2.ResetOffsetRequest, queue_id: int) -> int:
        """The offset one queue is reset to: the first at or after a time, or the requested
        offset clamped into what the queue holds."""
        topic = request.topic
        if request.WhichOneof("position") == "timestamp_ms":
            return int(self.store.offset_by_time(topic, queue_id, request.timestamp_ms))
        low = int(self.store.min_offset(topic, queue_id))
        high = int(self.store.max_offset(topic, queue_id))
        return min(max(request.queue_offset, low), high)
