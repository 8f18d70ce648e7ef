"""The broker's Admin service (proto/rocketq/v1/admin.proto; SPEC §4.3, §6.12, §6.14).

The servicer routes each RPC to the handler group that owns it; handlers translate protobuf to
the managers and the store and hold no state of their own beyond the shared, live
:class:`BrokerConfig`.

| RPCs                                                | handled in                        |
|-----------------------------------------------------|-----------------------------------|
| Create/Update/Delete/List/DescribeTopic             | ``admin_topics.TopicAdmin``       |
| Create/Update/Delete/ListSubscriptionGroup(s)       | ``admin_groups.GroupAdmin``       |
| GetConsumeStats, GetConsumerConnection, ResetOffset | ``admin_consumers.ConsumerAdmin`` |
| ListDeadLetters, ResendDeadLetter                   | ``dead_letters.DeadLetters``      |
| ListHalfMessages                                    | ``transaction_admin``             |
| Switchover                                          | ``switchover`` (controller mode)  |
| Get/UpdateBrokerConfig, GetRuntimeStats             | here and ``admin_runtime``        |

A change to topics or groups runs in broker mode or on every master of a cluster
(``admin_fanout.ClusterFanout``, which describes the targets); checks the groups share are in
``admin_common``.

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

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from services.broker.admin_common import invalid_arg, require_master
from services.broker.admin_consumers import ConsumerAdmin
from services.broker.admin_fanout import FANOUT_TIMEOUT_MS, ClusterFanout
from services.broker.admin_groups import GroupAdmin
from services.broker.admin_runtime import apply_config, runtime_stats
from services.broker.admin_topics import TopicAdmin
from services.broker.config import STARTUP_ONLY_KEYS, BrokerConfig, canonical_key
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.dead_letters import DeadLetters
from services.broker.drain import Drainer
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.switchover import switchover
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_admin import list_half_messages
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, precondition, rpc
from services.store.message_store import MessageStore

if TYPE_CHECKING:
    from services.broker.client_manager import ClientManager
    from services.broker.ha_master import ReplicationService
    from services.broker.pull_hold import PullHoldService
    from services.broker.rebalance_lock import RebalanceLockManager
    from services.broker.roles import RoleManager

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class AdminService(admin_pb2_grpc.AdminServicer):
    """Admin RPCs of one broker; every handler runs on the broker's event loop.

    The attributes are the whole broker as the runtime side sees it (``admin_runtime`` reads
    them for GetRuntimeStats); the handler groups get only the parts they use.
    """

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
        self.locks = locks
        """Orderly queue locks, for GetConsumerConnection; None = no lock is listed."""
        self.dead_letters = DeadLetters(config=config, store=store, topics=topics, clock=clock)
        self.replication: ReplicationService | None = None
        """On a master: its slaves and confirm offset for GetRuntimeStats (set by server.py)."""
        self.extra_stats: list[Callable[[], dict[str, str]]] = []
        """More named values for GetRuntimeStats ``extra`` (transactions, a slave's stream)."""
        self.roles: RoleManager | None = None
        """Controller mode: role switches, Switchover and the controller stats (server.py)."""
        self.drainer: Drainer | None = None
        """DrainBroker (set by server.py, which owns the nameserver registration)."""
        self.gateway_commands: Any = None
        """AskGatewayClient: the v2 gateway's ClientCommands (server.py sets it when the gateway
        runs; typed loosely: the gateway's classes exist only where it is generated)."""
        self.fanout = ClusterFanout(config, advertised_addr, fanout_timeout_ms)
        """Broker or cluster mode of a change (its ``timeout_ms`` is each master's)."""
        self.topic_admin = TopicAdmin(
            config=config,
            store=store,
            topics=topics,
            offsets=offsets,
            fanout=self.fanout,
            registrar_trigger=registrar_trigger,
        )
        self.group_admin = GroupAdmin(groups=groups, offsets=offsets, fanout=self.fanout)
        self.consumer_admin = ConsumerAdmin(
            config=config,
            store=store,
            topics=topics,
            groups=groups,
            offsets=offsets,
            clients=clients,
            locks=locks,
        )

    # -- topics ----------------------------------------------------------------------------
    @rpc
    async def CreateTopic(
        self, request: admin_pb2.CreateTopicRequest, context: Context
    ) -> admin_pb2.CreateTopicResponse:
        return await self.topic_admin.create(request)

    @rpc
    async def UpdateTopic(
        self, request: admin_pb2.UpdateTopicRequest, context: Context
    ) -> admin_pb2.UpdateTopicResponse:
        return await self.topic_admin.update(request)

    @rpc
    async def DeleteTopic(
        self, request: admin_pb2.DeleteTopicRequest, context: Context
    ) -> admin_pb2.DeleteTopicResponse:
        return await self.topic_admin.delete(request)

    @rpc
    async def ListTopics(
        self, request: admin_pb2.ListTopicsRequest, context: Context
    ) -> admin_pb2.ListTopicsResponse:
        return self.topic_admin.list(request)

    @rpc
    async def DescribeTopic(
        self, request: admin_pb2.DescribeTopicRequest, context: Context
    ) -> admin_pb2.DescribeTopicResponse:
        return self.topic_admin.describe(request)

    # -- subscription groups ---------------------------------------------------------------
    @rpc
    async def CreateSubscriptionGroup(
        self, request: admin_pb2.CreateSubscriptionGroupRequest, context: Context
    ) -> admin_pb2.CreateSubscriptionGroupResponse:
        return await self.group_admin.create(request)

    @rpc
    async def UpdateSubscriptionGroup(
        self, request: admin_pb2.UpdateSubscriptionGroupRequest, context: Context
    ) -> admin_pb2.UpdateSubscriptionGroupResponse:
        return await self.group_admin.update(request)

    @rpc
    async def DeleteSubscriptionGroup(
        self, request: admin_pb2.DeleteSubscriptionGroupRequest, context: Context
    ) -> admin_pb2.DeleteSubscriptionGroupResponse:
        return await self.group_admin.delete(request)

    @rpc
    async def ListSubscriptionGroups(
        self, request: admin_pb2.ListSubscriptionGroupsRequest, context: Context
    ) -> admin_pb2.ListSubscriptionGroupsResponse:
        return self.group_admin.list(request)

    # -- consumers -------------------------------------------------------------------------
    @rpc
    async def GetConsumeStats(
        self, request: admin_pb2.GetConsumeStatsRequest, context: Context
    ) -> admin_pb2.GetConsumeStatsResponse:
        return self.consumer_admin.consume_stats(request)

    @rpc
    async def GetConsumerConnection(
        self, request: admin_pb2.GetConsumerConnectionRequest, context: Context
    ) -> admin_pb2.GetConsumerConnectionResponse:
        return self.consumer_admin.connection(request)

    @rpc
    async def ResetOffset(
        self, request: admin_pb2.ResetOffsetRequest, context: Context
    ) -> admin_pb2.ResetOffsetResponse:
        return self.consumer_admin.reset_offset(request)

    # -- messages --------------------------------------------------------------------------
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
                raise invalid_arg(exc, key=key) from None
        startup_only = sorted(k for k in changes if k in STARTUP_ONLY_KEYS)
        if startup_only:
            precondition(
                f"{', '.join(startup_only)} only take effect at startup; change the broker's "
                "config file or flags and restart it",
                keys=",".join(startup_only),
            )
        require_master(self.config)
        if changes:
            apply_config(self.config, self.store, self.config_dir, changes)
        return admin_pb2.UpdateBrokerConfigResponse(config=self.config.as_properties())

    # -- runtime statistics ----------------------------------------------------------------
    @rpc
    async def GetRuntimeStats(
        self, request: admin_pb2.GetRuntimeStatsRequest, context: Context
    ) -> admin_pb2.GetRuntimeStatsResponse:
        return runtime_stats(self)

    # -- leaving the cluster (Kubernetes scale-down, DESIGN.md §9) -------------------------
    @rpc
    async def DrainBroker(
        self, request: admin_pb2.DrainBrokerRequest, context: Context
    ) -> admin_pb2.DrainBrokerResponse:
        if self.drainer is None:
            precondition("this broker is still starting; drain it once it serves")
        return await self.drainer.drain(request)

    @rpc
    async def AskGatewayClient(
        self, request: admin_pb2.AskGatewayClientRequest, context: Context
    ) -> admin_pb2.AskGatewayClientResponse:
        """A server command to an official-SDK client (services/broker/gateway/commands.py)."""
        if self.gateway_commands is None:
            precondition(
                f"broker {self.config.broker_name} serves no RocketMQ 5 gateway (gatewayPort=0)"
            )
        response: admin_pb2.AskGatewayClientResponse = await self.gateway_commands.ask(request)
        return response
