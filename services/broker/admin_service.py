"""The broker's Admin service (proto/rocketq/v1/admin.proto; SPEC §4.3, §6.12, §6.14).

Handlers translate protobuf to the managers and the store; they hold no state of their own
beyond the shared, live :class:`BrokerConfig`.

Targets of a change (``ApplyTarget``, mqadmin's ``-b`` / ``-c``):

- broker mode: the receiving broker only; ``broker_name`` must be ours, which catches a request
  sent to the wrong address.
- cluster mode: the receiving broker asks a nameserver (the first of ``namesrvAddr`` that
  answers) for the cluster's masters (broker id 0) and calls the same RPC in broker mode on each
  of them, itself included, concurrently, each with a timeout. Every master gets one
  ``BrokerApplyResult``; a master that already has the topic says ALREADY_EXISTS, one without
  it NOT_FOUND, one that does not answer UNAVAILABLE. The call itself succeeds so that the
  caller sees partial outcomes instead of a single error hiding them. Going through the network
  even for ourselves keeps one code path; the cost is one loopback call.

GetConsumerConnection answers from this broker's own view: the group's live members with their
own subscriptions (from their heartbeats), the topics they disagree about (SPEC §6.17, see
services/broker/client_manager.py) and, for orderly groups, who holds each queue lock here. A
group with more than ``CONNECTIONS_LISTED_MAX`` live members lists the first ones by client id;
its conflicts still consider every member.

Changes (topics, groups, offset resets, config updates) are for masters only: a slave answers
UNAVAILABLE with reason NOT_MASTER and gets the same changes through replication.

Runtime config updates are all or nothing: every key is checked (known, not startup-only,
parses, in range) before any is applied. Applied keys are set in place on the shared config
object (and on the store's config, for the store keys) and merged into
``{config_dir}/broker.properties``, which the server loads at startup after the config file, so
an update survives a restart.
"""

# ruff: noqa: N802  (servicer methods carry the proto's RPC names)

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
    nameserver_pb2_grpc,
)
from rocketq.validation import (
    check_group,
    check_perm,
    check_queue_nums,
    check_topic,
    is_system_topic,
    retry_topic,
)
from services.broker.admin_runtime import apply_config, runtime_stats
from services.broker.config import (
    STARTUP_ONLY_KEYS,
    BrokerConfig,
    canonical_key,
)
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.dead_letters import DeadLetters
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.subscription_group_manager import (
    SubscriptionGroupManager,
    check_group_config,
)
from services.broker.switchover import switchover
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_admin import list_half_messages
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import (
    ServiceError,
    denied,
    invalid,
    not_found,
    precondition,
    rpc,
    unavailable,
)
from services.store.consume_queue import PRE_BLANK_SIZE
from services.store.message_store import MessageStore

if TYPE_CHECKING:
    from services.broker.client_manager import ClientManager
    from services.broker.ha_master import ReplicationService
    from services.broker.pull_hold import PullHoldService
    from services.broker.rebalance_lock import RebalanceLockManager
    from services.broker.roles import RoleManager

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
StatusCode = grpc.StatusCode

#: How long a cluster-mode change waits for each master, and a nameserver for cluster info.
FANOUT_TIMEOUT_MS = 5000
NAMESRV_TIMEOUT_MS = 3000
#: Members one GetConsumerConnection answer lists (each with up to 1024 subscriptions).
CONNECTIONS_LISTED_MAX = 1000


def _invalid_arg(exc: ValueError, **meta: object) -> ServiceError:
    return ServiceError(StatusCode.INVALID_ARGUMENT, common_pb2.ILLEGAL_ARGUMENT, str(exc), **meta)


def _enum_name(enum: Any, number: int) -> str:
    """The proto enum value's name; the number as text for one this build does not know."""
    try:
        return str(enum.Name(number))
    except ValueError:
        return str(number)


class AdminService(admin_pb2_grpc.AdminServicer):
    """Admin RPCs of one broker; every handler runs on the broker's event loop."""

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
        registrar_trigger: Callable[[], None],
        advertised_addr: str,
        started_ms: int,
        clock: Clock = SYSTEM_CLOCK,
        config_dir: Path | None = None,
        put_rate: Callable[[], float] | None = None,
        get_rate: Callable[[], float] | None = None,
        fanout_timeout_ms: int = FANOUT_TIMEOUT_MS,
        locks: RebalanceLockManager | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clients = clients
        self.hold = hold
        self.registrar_trigger = registrar_trigger
        self.advertised_addr = advertised_addr
        self.started_ms = started_ms
        self.clock = clock
        self.config_dir = config_dir if config_dir is not None else config.store_dir / "config"
        self.put_rate = put_rate
        self.get_rate = get_rate
        self.fanout_timeout_ms = fanout_timeout_ms
        self.locks = locks
        """Orderly queue locks, for GetConsumerConnection; None = no lock is listed."""
        self.dead_letters = DeadLetters(config=config, store=store, topics=topics, clock=clock)
        self.replication: ReplicationService | None = None
        """On a master: its slaves and confirm offset for GetRuntimeStats (set by server.py)."""
        self.extra_stats: list[Callable[[], dict[str, str]]] = []
        """More named values for GetRuntimeStats ``extra`` (transactions, a slave's stream)."""
        self.roles: RoleManager | None = None
        """Controller mode: role switches, Switchover and the controller stats (server.py)."""

    # -- common checks ---------------------------------------------------------------------
    def _require_master(self) -> None:
        if not self.config.is_master:
            unavailable(
                common_pb2.NOT_MASTER,
                f"broker {self.config.broker_name} id {self.config.broker_id} is a slave; "
                "send changes to its master (broker id 0)",
                broker_name=self.config.broker_name,
            )

    def _check_topic_name(self, topic: str, *, change: bool) -> None:
        try:
            check_topic(topic)
        except ValueError as exc:
            raise _invalid_arg(exc, topic=topic) from None
        if change and is_system_topic(topic):
            denied(
                f"{topic} is a reserved system topic; the broker manages it itself",
                topic=topic,
            )

    def _check_group_name(self, group: str) -> None:
        try:
            check_group(group)
        except ValueError as exc:
            raise _invalid_arg(exc, group=group) from None

    def _topic_from_request(self, pb: common_pb2.TopicConfig) -> TopicConfig:
        self._check_topic_name(pb.topic_name, change=True)
        try:
            check_queue_nums(pb.read_queue_nums, pb.write_queue_nums)
            check_perm(pb.perm)
            if pb.topic_sys_flag < 0:
                raise ValueError(f"topic_sys_flag is {pb.topic_sys_flag}; it must be >= 0")
        except ValueError as exc:
            raise _invalid_arg(exc, topic=pb.topic_name) from None
        return TopicConfig.from_pb(pb)

    def _group_from_request(
        self, pb: common_pb2.SubscriptionGroupConfig
    ) -> SubscriptionGroupConfig:
        cfg = SubscriptionGroupConfig.from_pb(pb)
        try:
            check_group_config(cfg)
        except ValueError as exc:
            raise _invalid_arg(exc, group=pb.group_name) from None
        return cfg

    def _result(self, code: grpc.StatusCode, message: str = "") -> admin_pb2.BrokerApplyResult:
        """This broker's outcome of a change."""
        return admin_pb2.BrokerApplyResult(
            broker_name=self.config.broker_name,
            broker_addr=self.advertised_addr,
            status_code=code.value[0],
            error_message=message,
        )

    def _topics_changed(self) -> None:
        """Tell the nameservers now (the server usually hooks the registrar on topics too)."""
        if self.registrar_trigger not in self.topics.on_change:
            self.registrar_trigger()

    # -- targets and cluster fan-out -------------------------------------------------------
    async def _apply(
        self,
        target: admin_pb2.ApplyTarget,
        rpc_name: str,
        make_request: Callable[[admin_pb2.ApplyTarget], Any],
        apply_here: Callable[[], admin_pb2.BrokerApplyResult],
    ) -> list[admin_pb2.BrokerApplyResult]:
        """Run a change in broker mode here, or in cluster mode on every master."""
        kind = target.WhichOneof("target")
        if kind is None:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                "no target: set target.cluster_name (every master of a cluster) or "
                "target.broker_name (this broker)",
            )
        if kind == "broker_name":
            if target.broker_name != self.config.broker_name:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"target broker {target.broker_name!r} is not this broker "
                    f"({self.config.broker_name} at {self.advertised_addr})",
                    broker_name=target.broker_name,
                )
            self._require_master()
            return [apply_here()]
        if not target.cluster_name:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "target.cluster_name is empty")
        self._require_master()
        masters = await self._cluster_masters(target.cluster_name)
        calls = [
            self._call_master(
                name, addr, rpc_name, make_request(admin_pb2.ApplyTarget(broker_name=name))
            )
            for name, addr in masters
        ]
        results = await asyncio.gather(*calls)
        return sorted(results, key=lambda r: r.broker_name)

    async def _cluster_masters(self, cluster: str) -> list[tuple[str, str]]:
        """(broker name, master address or "") of every broker group of ``cluster``."""
        info = await self._cluster_info()
        if cluster not in info.cluster_addr_table:
            not_found(
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"cluster {cluster!r} has no live brokers on the nameservers "
                f"({';'.join(self.config.namesrv_addrs)})",
                cluster_name=cluster,
            )
        out: list[tuple[str, str]] = []
        for name in sorted(info.cluster_addr_table[cluster].broker_names):
            addr = ""
            if name in info.broker_addr_table:
                addr = info.broker_addr_table[name].broker_addrs.get(0, "")
            out.append((name, addr))
        return out

    async def _cluster_info(self) -> nameserver_pb2.GetClusterInfoResponse:
        errors: list[str] = []
        for addr in self.config.namesrv_addrs:
            async with grpc.aio.insecure_channel(addr) as channel:
                stub = nameserver_pb2_grpc.NameServerStub(channel)
                try:
                    info: nameserver_pb2.GetClusterInfoResponse = await stub.GetClusterInfo(
                        nameserver_pb2.GetClusterInfoRequest(), timeout=NAMESRV_TIMEOUT_MS / 1000
                    )
                    return info
                except grpc.aio.AioRpcError as err:
                    errors.append(f"{addr}: {err.code().name} {err.details()}")
        unavailable(
            common_pb2.SERVICE_NOT_AVAILABLE,
            "no nameserver answered GetClusterInfo, so the cluster's masters are unknown: "
            + ("; ".join(errors) or "namesrvAddr is empty"),
        )

    async def _call_master(
        self, name: str, addr: str, rpc_name: str, request: Any
    ) -> admin_pb2.BrokerApplyResult:
        def failed(code: grpc.StatusCode, message: str) -> admin_pb2.BrokerApplyResult:
            return admin_pb2.BrokerApplyResult(
                broker_name=name,
                broker_addr=addr,
                status_code=code.value[0],
                error_message=message,
            )

        if not addr:
            return failed(StatusCode.UNAVAILABLE, f"broker {name} has no live master (id 0)")
        async with grpc.aio.insecure_channel(addr) as channel:
            method = getattr(admin_pb2_grpc.AdminStub(channel), rpc_name)
            try:
                response = await method(request, timeout=self.fanout_timeout_ms / 1000)
            except grpc.aio.AioRpcError as err:
                if err.code() == StatusCode.DEADLINE_EXCEEDED:
                    return failed(
                        StatusCode.UNAVAILABLE,
                        f"master {addr} did not answer within {self.fanout_timeout_ms} ms",
                    )
                return failed(err.code(), err.details() or err.code().name)
        for result in response.results:
            if result.broker_name == name:
                out = admin_pb2.BrokerApplyResult()
                out.CopyFrom(result)
                out.broker_addr = addr
                return out
        return failed(StatusCode.INTERNAL, f"master {addr} answered without a result for {name}")

    # -- topics ----------------------------------------------------------------------------
    @rpc
    async def CreateTopic(
        self, request: admin_pb2.CreateTopicRequest, context: Context
    ) -> admin_pb2.CreateTopicResponse:
        cfg = self._topic_from_request(request.config)

        def here() -> admin_pb2.BrokerApplyResult:
            if self.topics.get(cfg.topic_name) is not None:
                return self._result(
                    StatusCode.ALREADY_EXISTS, f"topic {cfg.topic_name} already exists"
                )
            self.topics.put(cfg)
            self._topics_changed()
            return self._result(StatusCode.OK)

        results = await self._apply(
            request.target,
            "CreateTopic",
            lambda t: admin_pb2.CreateTopicRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.CreateTopicResponse(results=results)

    @rpc
    async def UpdateTopic(
        self, request: admin_pb2.UpdateTopicRequest, context: Context
    ) -> admin_pb2.UpdateTopicResponse:
        cfg = self._topic_from_request(request.config)

        def here() -> admin_pb2.BrokerApplyResult:
            if self.topics.get(cfg.topic_name) is None:
                return self._result(
                    StatusCode.NOT_FOUND, f"topic {cfg.topic_name} does not exist here"
                )
            self.topics.put(cfg)
            self._topics_changed()
            return self._result(StatusCode.OK)

        results = await self._apply(
            request.target,
            "UpdateTopic",
            lambda t: admin_pb2.UpdateTopicRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.UpdateTopicResponse(results=results)

    @rpc
    async def DeleteTopic(
        self, request: admin_pb2.DeleteTopicRequest, context: Context
    ) -> admin_pb2.DeleteTopicResponse:
        topic = request.topic
        self._check_topic_name(topic, change=True)

        def here() -> admin_pb2.BrokerApplyResult:
            if not self.topics.delete(topic):
                return self._result(StatusCode.NOT_FOUND, f"topic {topic} does not exist here")
            # Consume queues and offsets go now; commitlog bytes age out with retention.
            self.store.queues.delete_topic(topic)
            self.offsets.remove_topic(topic)
            self.offsets.persist()
            self._topics_changed()
            log.info("topic %s deleted", topic)
            return self._result(StatusCode.OK)

        results = await self._apply(
            request.target,
            "DeleteTopic",
            lambda t: admin_pb2.DeleteTopicRequest(target=t, topic=topic),
            here,
        )
        return admin_pb2.DeleteTopicResponse(results=results)

    @rpc
    async def ListTopics(
        self, request: admin_pb2.ListTopicsRequest, context: Context
    ) -> admin_pb2.ListTopicsResponse:
        return admin_pb2.ListTopicsResponse(
            topics=[
                t.to_pb()
                for t in self.topics.all()
                if request.include_system_topics or not self.topics.is_system(t.topic_name)
            ]
        )

    @rpc
    async def DescribeTopic(
        self, request: admin_pb2.DescribeTopicRequest, context: Context
    ) -> admin_pb2.DescribeTopicResponse:
        self._check_topic_name(request.topic, change=False)
        cfg = self.topics.get(request.topic)
        if cfg is None:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"topic {request.topic} does not exist on broker {self.config.broker_name}",
                topic=request.topic,
            )
        queues = []
        for qid in range(cfg.queue_nums):
            max_offset = int(self.store.max_offset(cfg.topic_name, qid))
            queues.append(
                admin_pb2.TopicQueueStats(
                    queue_id=qid,
                    min_offset=int(self.store.min_offset(cfg.topic_name, qid)),
                    max_offset=max_offset,
                    last_update_timestamp_ms=self._store_time(cfg.topic_name, qid, max_offset - 1),
                )
            )
        return admin_pb2.DescribeTopicResponse(
            broker_name=self.config.broker_name, config=cfg.to_pb(), queues=queues
        )

    def _store_time(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """Store timestamp of the message at ``queue_offset``; 0 if it is not stored."""
        cq = self.store.queues.find(topic, queue_id)
        if cq is None or queue_offset < 0:
            return 0
        unit = cq.unit(queue_offset)
        if unit is None or unit[1] == PRE_BLANK_SIZE:
            return 0
        return self.store.commitlog.read_store_timestamp(unit[0], unit[1]) or 0

    # -- subscription groups ---------------------------------------------------------------
    @rpc
    async def CreateSubscriptionGroup(
        self, request: admin_pb2.CreateSubscriptionGroupRequest, context: Context
    ) -> admin_pb2.CreateSubscriptionGroupResponse:
        cfg = self._group_from_request(request.config)

        def here() -> admin_pb2.BrokerApplyResult:
            if self.groups.get(cfg.group_name) is not None:
                return self._result(
                    StatusCode.ALREADY_EXISTS,
                    f"subscription group {cfg.group_name} already exists",
                )
            self.groups.put(cfg)
            return self._result(StatusCode.OK)

        results = await self._apply(
            request.target,
            "CreateSubscriptionGroup",
            lambda t: admin_pb2.CreateSubscriptionGroupRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.CreateSubscriptionGroupResponse(results=results)

    @rpc
    async def UpdateSubscriptionGroup(
        self, request: admin_pb2.UpdateSubscriptionGroupRequest, context: Context
    ) -> admin_pb2.UpdateSubscriptionGroupResponse:
        cfg = self._group_from_request(request.config)

        def here() -> admin_pb2.BrokerApplyResult:
            if self.groups.get(cfg.group_name) is None:
                return self._result(
                    StatusCode.NOT_FOUND,
                    f"subscription group {cfg.group_name} does not exist here",
                )
            self.groups.put(cfg)
            return self._result(StatusCode.OK)

        results = await self._apply(
            request.target,
            "UpdateSubscriptionGroup",
            lambda t: admin_pb2.UpdateSubscriptionGroupRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.UpdateSubscriptionGroupResponse(results=results)

    @rpc
    async def DeleteSubscriptionGroup(
        self, request: admin_pb2.DeleteSubscriptionGroupRequest, context: Context
    ) -> admin_pb2.DeleteSubscriptionGroupResponse:
        group = request.group_name
        self._check_group_name(group)

        def here() -> admin_pb2.BrokerApplyResult:
            if not self.groups.delete(group):
                return self._result(
                    StatusCode.NOT_FOUND, f"subscription group {group} does not exist here"
                )
            if request.clean_offsets:
                self.offsets.remove_group(group)
                self.offsets.persist()
            return self._result(StatusCode.OK)

        results = await self._apply(
            request.target,
            "DeleteSubscriptionGroup",
            lambda t: admin_pb2.DeleteSubscriptionGroupRequest(
                target=t, group_name=group, clean_offsets=request.clean_offsets
            ),
            here,
        )
        return admin_pb2.DeleteSubscriptionGroupResponse(results=results)

    @rpc
    async def ListSubscriptionGroups(
        self, request: admin_pb2.ListSubscriptionGroupsRequest, context: Context
    ) -> admin_pb2.ListSubscriptionGroupsResponse:
        return admin_pb2.ListSubscriptionGroupsResponse(
            groups=[g.to_pb() for g in self.groups.all()]
        )

    # -- consumer progress -----------------------------------------------------------------
    @rpc
    async def GetConsumeStats(
        self, request: admin_pb2.GetConsumeStatsRequest, context: Context
    ) -> admin_pb2.GetConsumeStatsResponse:
        group = request.consumer_group
        self._check_group_name(group)
        if request.topic:
            self._check_topic_name(request.topic, change=False)
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
                    last_consumed_timestamp_ms=self._store_time(topic, qid, consumer_offset - 1),
                )
            )
        return out

    @rpc
    async def GetConsumerConnection(
        self, request: admin_pb2.GetConsumerConnectionRequest, context: Context
    ) -> admin_pb2.GetConsumerConnectionResponse:
        group = request.consumer_group
        self._check_group_name(group)
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
        locks = self.locks.locks_of_group(group) if self.locks is not None else []
        return admin_pb2.GetConsumerConnectionResponse(
            connections=connections,
            consume_type=_enum_name(messaging_pb2.ConsumeType, info.consume_type),
            message_model=_enum_name(messaging_pb2.MessageModel, info.message_model),
            consume_from_where=_enum_name(messaging_pb2.ConsumeFromWhere, info.consume_from_where),
            consume_orderly=info.consume_orderly,
            conflicts=self.clients.conflicts(group),
            locks=[
                admin_pb2.QueueLock(
                    topic=lk.topic,
                    queue_id=lk.queue_id,
                    client_id=lk.client_id,
                    last_lock_ms=lk.last_lock_ms,
                )
                for lk in locks
            ],
        )

    @rpc
    async def ListDeadLetters(
        self, request: admin_pb2.ListDeadLettersRequest, context: Context
    ) -> admin_pb2.ListDeadLettersResponse:
        return self.dead_letters.list(request)

    @rpc
    async def ResendDeadLetter(
        self, request: admin_pb2.ResendDeadLetterRequest, context: Context
    ) -> admin_pb2.ResendDeadLetterResponse:
        return await self.dead_letters.resend(request)

    @rpc
    async def ListHalfMessages(
        self, request: admin_pb2.ListHalfMessagesRequest, context: Context
    ) -> admin_pb2.ListHalfMessagesResponse:
        return await list_half_messages(request, self.store, self.offsets)

    @rpc
    async def Switchover(
        self, request: admin_pb2.SwitchoverRequest, context: Context
    ) -> admin_pb2.SwitchoverResponse:
        if self.roles is None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.ERROR_REASON_UNSPECIFIED,
                "switchover needs controller mode (etcdEndpoints set on every replica)",
            )
        return await switchover(request, self.roles)

    @rpc
    async def ResetOffset(
        self, request: admin_pb2.ResetOffsetRequest, context: Context
    ) -> admin_pb2.ResetOffsetResponse:
        group, topic = request.consumer_group, request.topic
        self._check_group_name(group)
        self._check_topic_name(topic, change=False)
        position = request.WhichOneof("position")
        if position is None:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "set timestamp_ms or queue_offset")
        if getattr(request, position) < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"{position} is negative")
        if request.HasField("queue_id") and request.queue_id < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"queue_id {request.queue_id} is negative")
        self._require_master()
        cfg = self.topics.get(topic)
        if cfg is None:
            not_found(common_pb2.TOPIC_NOT_EXIST, f"topic {topic} does not exist here", topic=topic)
        if self.groups.get(group) is None:
            not_found(
                common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {group} does not exist here",
                consumer_group=group,
            )
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
            if position == "timestamp_ms":
                new = int(self.store.offset_by_time(topic, qid, request.timestamp_ms))
            else:
                low = int(self.store.min_offset(topic, qid))
                high = int(self.store.max_offset(topic, qid))
                new = min(max(request.queue_offset, low), high)
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

    # -- broker configuration --------------------------------------------------------------
    @rpc
    async def GetBrokerConfig(
        self, request: admin_pb2.GetBrokerConfigRequest, context: Context
    ) -> admin_pb2.GetBrokerConfigResponse:
        return admin_pb2.GetBrokerConfigResponse(config=self.config.as_properties())

    @rpc
    async def UpdateBrokerConfig(
        self, request: admin_pb2.UpdateBrokerConfigRequest, context: Context
    ) -> admin_pb2.UpdateBrokerConfigResponse:
        changes: dict[str, str] = {}
        for key, value in request.updates.items():
            try:
                changes[canonical_key(key)] = value
            except ValueError as exc:
                raise _invalid_arg(exc, key=key) from None
        startup_only = sorted(k for k in changes if k in STARTUP_ONLY_KEYS)
        if startup_only:
            precondition(
                f"{', '.join(startup_only)} only take effect at startup; change the broker's "
                "config file or flags and restart it",
                keys=",".join(startup_only),
            )
        self._require_master()
        if changes:
            apply_config(self.config, self.store, self.config_dir, changes)
        return admin_pb2.UpdateBrokerConfigResponse(config=self.config.as_properties())

    # -- runtime statistics ----------------------------------------------------------------
    @rpc
    async def GetRuntimeStats(
        self, request: admin_pb2.GetRuntimeStatsRequest, context: Context
    ) -> admin_pb2.GetRuntimeStatsResponse:
        return runtime_stats(self)
