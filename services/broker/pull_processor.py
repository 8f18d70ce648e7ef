"""Pull: read a queue from an offset, correct bad offsets, long-poll when there is nothing new.

Steps (SPEC §6.7, proto ``Messaging.Pull`` for the codes):

1. validate names, offset, ``max_msg_nums`` (1..1024, default 32) and sys flags
   (FLAG_CLASS_FILTER is refused); the broker must be readable;
2. the subscription group: ``find_or_create`` (NOT_FOUND SUBSCRIPTION_GROUP_NOT_EXIST when it is
   unknown and auto-create is off), ``consume_enable`` (PERMISSION_DENIED);
3. the topic: known (NOT_FOUND TOPIC_NOT_EXIST), readable, ``queue_id < read_queue_nums``;
4. the subscription: from the request under FLAG_SUBSCRIPTION, else from the group's heartbeat
   (FAILED_PRECONDITION when there is none, or when the broker's copy is older than the
   request's ``sub_version`` — the client should heartbeat and retry); a TAG or SQL92
   expression that does not parse is INVALID_ARGUMENT ILLEGAL_EXPRESSION (SQL92: with the
   ``position``), and so is SQL92 on a broker without ``enablePropertyFilter``;
5. the group's members must agree about the topic (``check_subscription_consistent``:
   FAILED_PRECONDITION SUBSCRIPTION_INCONSISTENT while they do not, under
   ``strictSubscriptionConsistency``);
6. FLAG_COMMIT_OFFSET on a master stores ``commit_offset`` (SPEC §6.12: every pull carries it;
   a slave stores it only while its master is unreachable, see ``ha_config_sync``),
   but never moves the stored offset back: a pull racing its consumer's release of the queue
   would otherwise undo the persisted offset under the next owner;
7. ``store.get_messages`` with the subscription's filters (TAG: the tag-hash filter on consume
   queue units; SQL92: the property filter on commitlog records, see ``filter.py``), and the
   status mapped as below. A filtered scan walks forward past non-matching messages: when a
   window holds none, the answer is NO_MATCHED_MSG with the offset to continue from;
8. NO_NEW_MSG at the end of the queue with FLAG_SUSPEND: hold (long polling, SPEC §6.9; only a
   matching arrival wakes the pull), then run step 7 once more without suspending.

| store status (SPEC §6.7)                     | PullStatus (SPEC §6.8)                       |
|----------------------------------------------|----------------------------------------------|
| FOUND                                        | FOUND                                        |
| NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING     | NO_MATCHED_MSG                               |
| NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE  | OFFSET_ILLEGAL if offset != 0, else NO_NEW_MSG |
| OFFSET_FOUND_NULL, OFFSET_OVERFLOW_ONE       | NO_NEW_MSG                                   |
| OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL      | OFFSET_ILLEGAL                               |

On a slave an OFFSET_ILLEGAL is not applied (RocketMQ's ``offsetCheckInSlave`` = false): the
answer is NO_MATCHED_MSG at the requested offset with the group's normal broker id suggested,
so the consumer retries on the master, which owns offset corrections.

``suggest_which_broker_id`` (SPEC §6.7 step 5, ``suggest_broker_id``): with ``slaveReadEnable``,
the group's ``which_broker_when_consume_slowly`` (1) when the store says the pulled messages lie
further behind the commitlog's end than ``accessMessageInMemoryMaxRatio`` % of physical memory
(so they are likely on disk, and a slave should serve them), else the group's ``broker_id``
(0); without ``slaveReadEnable``, always 0, the master. A slave answers the same way, so a
consumer sent there for a deep backlog comes back to the master once it has caught up.
"""

from __future__ import annotations

import logging
from typing import Any, TypeAlias

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.validation import PULL_BATCH_MAX, TIMER_TOPIC, check_group, check_topic, is_readable
from services.broker.client_manager import ClientManager
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.filter import (
    SubscriptionData,
    parse_subscription,
    record_filter_of,
    tags_filter_of,
)
from services.broker.ha_config_sync import SlaveOffsetCommits
from services.broker.model import SubscriptionGroupConfig
from services.broker.pull_hold import PullHoldService
from services.broker.query_processor import record_to_pb
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.timer_put import TIMER_CONSUMER_GROUP
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import denied, invalid, not_found, precondition
from services.store.message_store import GetResult, GetStatus, MessageStore

log = logging.getLogger(__name__)

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8
"""PullSysFlag bits (SPEC §11.6)."""
PULL_BATCH_DEFAULT = 32
MASTER_ID = 0
DEADLINE_MARGIN_MS = 50
"""A hold ends this long before the call's gRPC deadline, so the client gets NO_NEW_MSG, not
DEADLINE_EXCEEDED."""

PullStatus: TypeAlias = "messaging_pb2.PullStatus.ValueType"
FOUND = messaging_pb2.FOUND
NO_NEW_MSG = messaging_pb2.NO_NEW_MSG
NO_MATCHED_MSG = messaging_pb2.NO_MATCHED_MSG
OFFSET_ILLEGAL = messaging_pb2.OFFSET_ILLEGAL

_STATUS: dict[GetStatus, PullStatus] = {
    GetStatus.FOUND: FOUND,
    GetStatus.NO_MATCHED_MESSAGE: NO_MATCHED_MSG,
    GetStatus.MESSAGE_WAS_REMOVING: NO_MATCHED_MSG,
    GetStatus.OFFSET_FOUND_NULL: NO_NEW_MSG,
    GetStatus.OFFSET_OVERFLOW_ONE: NO_NEW_MSG,
    GetStatus.OFFSET_OVERFLOW_BADLY: OFFSET_ILLEGAL,
    GetStatus.OFFSET_TOO_SMALL: OFFSET_ILLEGAL,
}
_EMPTY_QUEUE = frozenset({GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE})
_HOLDABLE = frozenset({GetStatus.OFFSET_OVERFLOW_ONE, *_EMPTY_QUEUE})
"""Statuses meaning "at the end of the queue": only these wait for an arrival."""


def suggest_broker_id(
    *,
    slave_read_enable: bool,
    beyond_memory: bool,
    group_broker_id: int,
    which_broker_when_consume_slowly: int,
) -> int:
    """The broker id a pull response suggests for the queue's next pull (see above)."""
    if not slave_read_enable:
        return MASTER_ID
    return which_broker_when_consume_slowly if beyond_memory else group_broker_id


def pull_status(get: GetStatus, request_offset: int) -> PullStatus:
    """The PullStatus a client sees for a store status (the table above)."""
    if get in _EMPTY_QUEUE:
        return OFFSET_ILLEGAL if request_offset != 0 else NO_NEW_MSG
    return _STATUS[get]


class PullProcessor:
    """Answers Pull requests (one per broker)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        clients: ClientManager,
        hold: PullHoldService,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clients = clients
        self.hold = hold
        self.clock = clock
        self.slave_commits: SlaveOffsetCommits | None = None
        """On a slave: takes the pulls' commit offsets while its master is unreachable."""

    async def pull(
        self, req: messaging_pb2.PullRequest, context: grpc.aio.ServicerContext[Any, Any] | None
    ) -> messaging_pb2.PullResponse:
        """One Pull; raises ServiceError for a refused request (offset trouble is a status)."""
        max_nums, group_cfg = self._check(req)
        sub = self._subscription(req)
        self.clients.check_subscription_consistent(req.consumer_group, req.topic)
        property_filter_on = self.config.enable_property_filter
        tags_filter = tags_filter_of(sub, enable_property_filter=property_filter_on)
        record_filter = record_filter_of(sub, enable_property_filter=property_filter_on)
        topic, qid, offset = req.topic, req.queue_id, req.queue_offset
        flags = req.sys_flag
        if flags & FLAG_COMMIT_OFFSET and req.commit_offset >= 0:
            self._commit_offset(req, context)
        result = self.store.get_messages(
            topic, qid, offset, max_nums, tags_filter=tags_filter, record_filter=record_filter
        )
        if (
            result.status in _HOLDABLE
            and flags & FLAG_SUSPEND
            and pull_status(result.status, offset) == NO_NEW_MSG
        ):
            hold_ms = self._hold_ms(req.suspend_timeout_ms, context)
            if hold_ms > 0:
                await self.hold.hold(
                    topic,
                    qid,
                    result.next_begin_offset,
                    tags_filter,
                    hold_ms,
                    record_filter=record_filter,
                )
                # The group may have fallen out of agreement while this pull was held (a member
                # joined with another subscription): check again before serving anything.
                self.clients.check_subscription_consistent(req.consumer_group, req.topic)
                result = self.store.get_messages(
                    topic,
                    qid,
                    offset,
                    max_nums,
                    tags_filter=tags_filter,
                    record_filter=record_filter,
                )
        return self._response(req, result, group_cfg)

    # -- steps -----------------------------------------------------------------------------
    def _commit_offset(
        self, req: messaging_pb2.PullRequest, context: grpc.aio.ServicerContext[Any, Any] | None
    ) -> None:
        """Step 6. A slave stores it only while its master is unreachable (ha_config_sync)."""
        peer = context.peer() if context is not None else ""
        if self.config.is_master:
            target: ConsumerOffsetManager | SlaveOffsetCommits = self.offsets
        elif self.slave_commits is not None and self.slave_commits.accepting():
            target = self.slave_commits
        else:
            return
        target.commit(
            req.consumer_group,
            req.topic,
            req.queue_id,
            req.commit_offset,
            client=peer,
            increase_only=True,
        )

    def _check(self, req: messaging_pb2.PullRequest) -> tuple[int, SubscriptionGroupConfig]:
        """Every refusal of a pull, in order: the request itself, this broker readable, the
        group, the topic; the batch size and the group's config."""
        max_nums = _check_request(req)
        if not is_readable(self.config.broker_permission):
            denied(f"broker {self.config.broker_name} is not readable")
        group_cfg = self._check_group(req)
        self._check_topic(req)
        return max_nums, group_cfg

    def _check_group(self, req: messaging_pb2.PullRequest) -> SubscriptionGroupConfig:
        """The group's config (auto-created if allowed), if it may consume this way."""
        group_cfg = self.groups.find_or_create(req.consumer_group)
        if group_cfg is None:
            not_found(
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {req.consumer_group} does not exist and "
                "autoCreateSubscriptionGroup is false; create it with the admin tool",
                consumer_group=req.consumer_group,
            )
        if not group_cfg.consume_enable:
            denied(f"consumer group {req.consumer_group} may not consume (consume_enable false)")
        info = self.clients.consumer_group_info(req.consumer_group)
        if (
            info is not None
            and info.message_model == messaging_pb2.BROADCASTING
            and not group_cfg.consume_broadcast_enable
        ):
            denied(f"consumer group {req.consumer_group} may not consume in broadcasting mode")
        return group_cfg

    def _check_topic(self, req: messaging_pb2.PullRequest) -> None:
        """The topic exists here, is readable by this group, and has the queue."""
        topic_cfg = self.topics.get(req.topic)
        if topic_cfg is None:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"topic {req.topic} does not exist on broker {self.config.broker_name}",
                topic=req.topic,
            )
        if not is_readable(topic_cfg.perm):
            denied(f"topic {req.topic} is not readable (perm {topic_cfg.perm})", topic=req.topic)
        if req.topic == TIMER_TOPIC and req.consumer_group != TIMER_CONSUMER_GROUP:
            denied(
                f"{TIMER_TOPIC} holds pending timers; only the timer-wheel service "
                f"({TIMER_CONSUMER_GROUP}) may pull it",
                topic=req.topic,
            )
        if req.queue_id >= topic_cfg.read_queue_nums:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"queue id {req.queue_id} is outside [0, {topic_cfg.read_queue_nums}) for "
                f"topic {req.topic}",
                topic=req.topic,
            )

    def _subscription(self, req: messaging_pb2.PullRequest) -> SubscriptionData:
        if req.sys_flag & FLAG_SUBSCRIPTION:
            return parse_subscription(
                req.topic, req.subscription, req.expression_type, req.sub_version
            )
        sub = self.clients.subscription(req.consumer_group, req.topic)
        if sub is None:
            precondition(
                f"consumer group {req.consumer_group} has no subscription to {req.topic} on "
                "this broker; send a heartbeat on ClientStream first, or set FLAG_SUBSCRIPTION",
                consumer_group=req.consumer_group,
                topic=req.topic,
            )
        if sub.sub_version < req.sub_version:
            precondition(
                f"the broker holds subscription version {sub.sub_version} of group "
                f"{req.consumer_group} to {req.topic}, older than the pull's {req.sub_version}; "
                "heartbeat and retry",
                consumer_group=req.consumer_group,
                topic=req.topic,
            )
        return sub

    def _hold_ms(
        self, requested_ms: int, context: grpc.aio.ServicerContext[Any, Any] | None
    ) -> int:
        hold_ms = self.hold.hold_time_ms(requested_ms)
        remaining_s = context.time_remaining() if context is not None else None
        if remaining_s is not None:
            hold_ms = min(hold_ms, int(remaining_s * 1000) - DEADLINE_MARGIN_MS)
        return hold_ms

    def _suggest(self, beyond_memory: bool, group_cfg: SubscriptionGroupConfig) -> int:
        return suggest_broker_id(
            slave_read_enable=self.config.slave_read_enable,
            beyond_memory=beyond_memory,
            group_broker_id=group_cfg.broker_id,
            which_broker_when_consume_slowly=group_cfg.which_broker_when_consume_slowly,
        )

    def _response(
        self,
        req: messaging_pb2.PullRequest,
        result: GetResult,
        group_cfg: SubscriptionGroupConfig,
    ) -> messaging_pb2.PullResponse:
        status = pull_status(result.status, req.queue_offset)
        next_offset = result.next_begin_offset
        suggest = self._suggest(result.suggest_pull_from_slave, group_cfg)
        if status == OFFSET_ILLEGAL:
            if self.config.is_master:
                log.info(
                    "pull offset moved: group=%s topic=%s queue=%d offset=%d -> %d (%s, "
                    "min %d max %d)",
                    req.consumer_group,
                    req.topic,
                    req.queue_id,
                    req.queue_offset,
                    next_offset,
                    result.status.value,
                    result.min_offset,
                    result.max_offset,
                )
            else:
                status, next_offset = NO_MATCHED_MSG, req.queue_offset
                suggest = self._suggest(False, group_cfg)
        resp = messaging_pb2.PullResponse(
            status=status,
            next_begin_offset=next_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
            suggest_which_broker_id=suggest,
        )
        if status == FOUND:
            if req.decoded:
                resp.messages.extend(
                    record_to_pb(codec.decode_record(r, check_crc=False)) for r in result.records
                )
            else:
                resp.records = b"".join(result.records)
        return resp


def _check_request(req: messaging_pb2.PullRequest) -> int:
    """The request's own fields (names, offsets, batch size, flags); the batch size."""
    try:
        check_group(req.consumer_group)
        check_topic(req.topic)
    except ValueError as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
    if req.queue_offset < 0:
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"queue_offset {req.queue_offset} is negative")
    if req.queue_id < 0:
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"queue id {req.queue_id} is negative")
    max_nums = req.max_msg_nums if req.HasField("max_msg_nums") else PULL_BATCH_DEFAULT
    if not 1 <= max_nums <= PULL_BATCH_MAX:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"max_msg_nums {max_nums} is outside 1..{PULL_BATCH_MAX}",
        )
    if req.sys_flag & FLAG_CLASS_FILTER:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            "FLAG_CLASS_FILTER (0x8): class-filter mode is not supported; subscribe by TAG",
        )
    if req.suspend_timeout_ms < 0:
        invalid(common_pb2.ILLEGAL_ARGUMENT, "suspend_timeout_ms must not be negative")
    return max_nums
