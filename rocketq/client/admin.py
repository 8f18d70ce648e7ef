"""The administration client: RocketQ's ``mqadmin`` as an asyncio library.

:class:`Admin` talks to the nameservers (cluster map, routes, topic names) and to the brokers'
``Admin`` and ``Messaging`` services (proto/rocketq/v1/admin.proto, messaging.proto). Every
answer is a plain frozen dataclass defined here, so callers never see protobuf types and the
``--json`` output of the CLI is ``dataclasses.asdict`` of the same objects.

Where a request goes:

| operation                          | asked                                                     |
|------------------------------------|-----------------------------------------------------------|
| cluster_info, list_topics          | a nameserver (the next one on failure)                    |
| create/update/delete topic, group  | cluster mode: one master of the cluster, which fans out;  |
|                                    | broker mode: the master of that broker name               |
| broker_topics, list_groups         | every master (or one named broker)                        |
| describe_topic, query_by_key,      | the master of every broker group in the topic's route *   |
| query_by_id                        |                                                           |
| reset_offset                       | the master of every broker group in the topic's route     |
| consume_stats, consumer_ids        | every master of the route (topic given) or of the cluster*|
| consumer_connection                | every master of every cluster (members, conflicts, locks)*|
| dead_letters                       | every master (or one named broker) *                      |
| half_messages                      | every master (or one named broker)                        |
| view_message                       | the broker whose address the offset message id encodes *  |
| resend_dead_letter                 | the broker whose address the offset message id encodes    |
| broker_config, runtime_stats       | one broker, by name (its master) or by "host:port"        |
| ha_status                          | every registered replica of every group (or of one)       |
| switchover                         | the replica that reports leading the group (_admin_ha.py) |

Reads marked *: when a group's master does not answer (unreachable, or silent for half the call's
time; the nameserver lists a dead master for up to 120 s), its slaves are asked in id order
within the same timeout, and :attr:`Admin.replica_fallbacks` notes which replica answered.

Fan-out calls run concurrently. A broker that fails in a fan-out read is reported in the
result's ``errors`` (broker name -> message) rather than failing the whole call, because an
operator looking at a half-broken cluster wants to see the half that works; the call raises
only when no broker answered.

Where the code lives: this module has the plumbing (channels, nameserver failover, fan-out,
target resolution), the cluster, topic and group calls, and every public method with its
docstring and argument checks, so it reads as the list of what the admin can do. The longer
fan-out-and-merge bodies live next to it, one module per subject, each a function of the
``Admin`` it is given: ``_admin_consumers.py`` (consume stats, members, offset reset),
``_admin_messages.py`` (queries, view, dead letters), ``_admin_tx.py`` (half messages) and
``_admin_ha.py`` (failover state, switchover); the result types are in ``_admin_types.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    messaging_pb2_grpc,
    nameserver_pb2,
    nameserver_pb2_grpc,
)
from rocketq.client._admin_consumers import (
    consume_stats,
    consumer_connection,
    consumer_ids,
    reset_offset,
)
from rocketq.client._admin_ha import HaGroup, HaReplica, SwitchoverResult, ha_status, switchover
from rocketq.client._admin_messages import (
    dead_letters,
    query_by_id,
    query_by_key,
    resend_dead_letter,
    view_message,
)
from rocketq.client._admin_replicas import Members, read_members
from rocketq.client._admin_tx import HalfMessage, HalfMessages, half_messages
from rocketq.client._admin_types import (
    TOPIC_MESSAGE_TYPES,
    ApplyResult,
    BrokerGroup,
    BrokerTopic,
    ClusterInfo,
    ConflictMember,
    ConsumerConnectionInfo,
    ConsumerMember,
    ConsumeStats,
    DeadLetterPage,
    DeadLetters,
    GroupConfig,
    LiveBroker,
    OffsetReset,
    QueueLockInfo,
    QueueOffsets,
    QueueProgress,
    ReplicaFallback,
    ResentDeadLetter,
    ResetResult,
    RouteQueue,
    RuntimeStats,
    SlaveInfo,
    SubscriptionConflictInfo,
    SubscriptionInfo,
    TopicConfig,
    TopicDescription,
    TopicRouteInfo,
    apply_results,
    broker_group,
    runtime_stats,
)
from rocketq.client._channels import open_channel
from rocketq.client.errors import (
    InvalidArgumentError,
    NameServerUnavailableError,
    NotFoundError,
    RocketQError,
    from_rpc_error,
)
from rocketq.client.security import ClientSecurity, transport_hint
from rocketq.message import ReceivedMessage
from rocketq.validation import (
    check_group,
    check_perm,
    check_queue_nums,
    check_topic,
    is_system_topic,
)

__all__ = [
    "TOPIC_MESSAGE_TYPES",
    "Admin",
    "ApplyResult",
    "BrokerGroup",
    "BrokerTopic",
    "ClusterInfo",
    "ConflictMember",
    "ConsumeStats",
    "ConsumerConnectionInfo",
    "ConsumerMember",
    "DeadLetterPage",
    "DeadLetters",
    "GroupConfig",
    "HaGroup",
    "HaReplica",
    "HalfMessage",
    "HalfMessages",
    "LiveBroker",
    "OffsetReset",
    "QueueLockInfo",
    "QueueOffsets",
    "QueueProgress",
    "ResentDeadLetter",
    "ResetResult",
    "RouteQueue",
    "RuntimeStats",
    "SlaveInfo",
    "SubscriptionConflictInfo",
    "SubscriptionInfo",
    "SwitchoverResult",
    "TopicConfig",
    "TopicDescription",
    "TopicRouteInfo",
]

#: Channels the admin keeps open at once (one per broker or nameserver address).
_CHANNELS_MAX = 256
#: QueryMessageByKey accepts 1..64 results per broker.
QUERY_MAX_NUM_MAX = 64
#: ListDeadLetters accepts 1..256 messages per broker.
DEAD_LETTERS_MAX_NUM_MAX = 256

_T = TypeVar("_T")
_A = TypeVar("_A")
_NAMESRV_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _checked(check: Callable[..., None], *args: Any) -> None:
    """Run a rocketq.validation check, reporting a ValueError as the SDK's error type."""
    try:
        check(*args)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc), code="INVALID_ARGUMENT") from None


def _first_error(failures: dict[str, RocketQError]) -> RocketQError:
    return next(iter(failures.values()))


# ---- the client -------------------------------------------------------------------------------
class Admin:
    """Asynchronous administration client of a RocketQ cluster.

    ``namesrv_addrs`` are "host:port" strings (a single "a:9876;b:9876" string is split too).
    Use as ``async with Admin(["127.0.0.1:9876"]) as admin: ...`` or call :meth:`close`.
    Every call waits at most ``timeout_ms`` per request.
    """

    def __init__(
        self,
        namesrv_addrs: Iterable[str] | str,
        timeout_ms: int = 5000,
        security: ClientSecurity | None = None,
    ) -> None:
        self._security = security
        if isinstance(namesrv_addrs, str):
            namesrv_addrs = [namesrv_addrs]
        addrs = [a.strip() for s in namesrv_addrs for a in s.replace(",", ";").split(";")]
        self._namesrv_addrs = [a for a in addrs if a]
        if not self._namesrv_addrs:
            raise InvalidArgumentError("no nameserver address given; pass host:port")
        # Start at a random nameserver so many admin processes spread their load (SPEC §2.5).
        self._namesrv_index = random.randrange(len(self._namesrv_addrs))
        self._timeout_s = timeout_ms / 1000
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Future[None]] = set()
        self.replica_fallbacks: list[ReplicaFallback] = []
        """Reads that a slave answered because its master did not, oldest first (the CLI
        prints them); the caller may clear the list."""

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel this client opened."""
        channels, self._channels = self._channels, {}
        await asyncio.gather(*(c.close() for c in channels.values()), return_exceptions=True)

    # ---- plumbing ------------------------------------------------------------------------------
    def _channel(self, addr: str) -> grpc.aio.Channel:
        channel = self._channels.get(addr)
        if channel is None:
            if len(self._channels) >= _CHANNELS_MAX:
                # Close the oldest; admin sessions touch few addresses, so this is rare.
                oldest = next(iter(self._channels))
                task = asyncio.ensure_future(self._channels.pop(oldest).close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            channel = open_channel(addr, self._security)
            self._channels[addr] = channel
        return channel

    def _admin(self, addr: str) -> Any:
        return admin_pb2_grpc.AdminStub(self._channel(addr))

    def _messaging(self, addr: str) -> Any:
        return messaging_pb2_grpc.MessagingStub(self._channel(addr))

    async def _guard(self, addr: str, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, addr) from None

    async def _namesrv(self, method: str, request: Any) -> Any:
        """Ask the current nameserver; on no answer, the next one (round robin)."""
        last: grpc.aio.AioRpcError | None = None
        n = len(self._namesrv_addrs)
        for _ in range(n):
            addr = self._namesrv_addrs[self._namesrv_index]
            stub = nameserver_pb2_grpc.NameServerStub(self._channel(addr))
            try:
                return await getattr(stub, method)(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as err:
                if err.code() not in _NAMESRV_RETRY_CODES:
                    raise from_rpc_error(err, addr) from None
                last = err
                self._namesrv_index = (self._namesrv_index + 1) % n
        detail = last.details() if last is not None else ""
        raise NameServerUnavailableError(
            f"no nameserver answered ({', '.join(self._namesrv_addrs)}): {detail}"
            f"{transport_hint(detail)}",
            code="UNAVAILABLE",
        )

    async def _fan_out(
        self, targets: Mapping[str, _A], call: Callable[[str, _A], Awaitable[_T]]
    ) -> tuple[dict[str, _T], dict[str, RocketQError]]:
        """Run ``call(broker_name, target)`` on every target at once; split answers and
        errors."""
        names = list(targets)
        outcomes = await asyncio.gather(
            *(call(name, targets[name]) for name in names), return_exceptions=True
        )
        answers: dict[str, _T] = {}
        failures: dict[str, RocketQError] = {}
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, RocketQError):
                failures[name] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answers[name] = outcome
        return answers, failures

    async def _fan_out_reads(
        self, targets: Mapping[str, Members], call: Callable[[str, str], Awaitable[_T]]
    ) -> tuple[dict[str, _T], dict[str, RocketQError]]:
        """:meth:`_fan_out` for reads: each group is asked master first and, when the master
        does not answer, its slaves in id order (:meth:`_read_members`)."""

        async def read(name: str, members: Members) -> _T:
            return await self._read_members(name, members, call)

        return await self._fan_out(targets, read)

    async def _read_members(
        self, name: str, members: Members, call: Callable[[str, str], Awaitable[_T]]
    ) -> _T:
        """The first answer of ``call(name, addr)`` over ``members``, master first
        (:func:`~rocketq.client._admin_replicas.read_members`)."""
        return await read_members(self, name, members, call)

    async def _route_members(self, topic: str) -> dict[str, Members]:
        """Broker name -> members to read from (master first) of every group hosting
        ``topic``."""
        route = await self.route(topic)
        return {g.broker_name: g.read_order() for g in route.brokers if g.addrs}

    async def _groups_or(self, broker: str | None) -> dict[str, Members]:
        """Broker name -> members to read from (master first): of ``broker`` (a name, or one
        "host:port"), else of every registered group."""
        if broker and ":" in broker:
            return {broker: [(0, broker)]}
        info = await self.cluster_info()
        groups = {name: g.read_order() for name, g in info.brokers.items() if g.addrs}
        if broker is None:
            if not groups:
                raise NotFoundError("no live broker is registered with the nameserver")
            return groups
        if broker not in groups:
            known = ", ".join(sorted(info.brokers)) or "none"
            raise NotFoundError(f"no live broker named {broker!r} is registered (known: {known})")
        return {broker: groups[broker]}

    async def _route_addrs(self, topic: str, broker: str | None = None) -> dict[str, str]:
        """Broker name -> address to send a change to (the master; the first live member when
        the nameserver lists none, which refuses with NOT_MASTER) for every group hosting
        ``topic``."""
        out = {
            name: members[0][1]
            for name, members in (await self._route_members(topic)).items()
            if broker is None or name == broker
        }
        if broker is not None and not out:
            raise NotFoundError(f"broker {broker!r} does not host topic {topic!r}")
        return out

    async def _broker_addr(self, broker: str) -> str:
        """Resolve a broker name to its master's address; "host:port" is used as given."""
        if ":" in broker:
            return broker
        info = await self.cluster_info()
        group = info.brokers.get(broker)
        if group is None:
            known = ", ".join(sorted(info.brokers)) or "none"
            raise NotFoundError(f"no broker named {broker!r} is registered (known: {known})")
        if group.master_addr is None:
            raise NotFoundError(f"broker {broker!r} has no live master")
        return group.master_addr

    async def _targets(
        self, cluster: str | None, broker: str | None
    ) -> tuple[admin_pb2.ApplyTarget, list[str]]:
        """The ApplyTarget of a change and the addresses that may receive it, in order."""
        if cluster and broker:
            raise InvalidArgumentError("give a cluster or a broker, not both")
        info = await self.cluster_info()
        if not info.clusters:
            raise NotFoundError("no broker is registered with the nameserver; start one first")
        if broker:
            return admin_pb2.ApplyTarget(broker_name=broker), [await self._broker_addr(broker)]
        if not cluster:
            if len(info.clusters) != 1:
                known = ", ".join(sorted(info.clusters))
                raise InvalidArgumentError(
                    f"say which cluster or broker to apply this to (clusters: {known})"
                )
            cluster = next(iter(info.clusters))
        if cluster not in info.clusters:
            known = ", ".join(sorted(info.clusters))
            raise NotFoundError(f"no cluster named {cluster!r} (clusters: {known})")
        masters = list(info.masters(cluster).values())
        if not masters:
            raise NotFoundError(f"cluster {cluster!r} has no live master")
        random.shuffle(masters)  # any master fans the change out to the others
        return admin_pb2.ApplyTarget(cluster_name=cluster), masters

    async def _apply(
        self, cluster: str | None, broker: str | None, send: Callable[[Any, Any], Awaitable[Any]]
    ) -> list[ApplyResult]:
        """Send a change to the first master that answers; cluster-mode masters fan out."""
        target, addrs = await self._targets(cluster, broker)
        error: RocketQError | None = None
        for addr in addrs:
            try:
                response = await self._guard(addr, send(self._admin(addr), target))
            except RocketQError as exc:
                if not exc.retriable:
                    raise
                error = exc
                continue
            return apply_results(response.results)
        assert error is not None
        raise error

    # ---- cluster -------------------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        """Every cluster, broker group and live broker the nameserver knows."""
        pb = await self._namesrv("GetClusterInfo", nameserver_pb2.GetClusterInfoRequest())
        return ClusterInfo(
            clusters={
                name: tuple(sorted(names.broker_names))
                for name, names in sorted(pb.cluster_addr_table.items())
            },
            brokers={
                name: broker_group(data) for name, data in sorted(pb.broker_addr_table.items())
            },
            live_brokers=tuple(
                LiveBroker(
                    b.broker_addr,
                    b.broker_name,
                    b.broker_id,
                    b.last_update_timestamp_ms,
                    b.heartbeat_timeout_ms,
                    b.ha_server_addr,
                    b.epoch,
                )
                for b in pb.live_brokers
            ),
        )

    async def route(self, topic: str) -> TopicRouteInfo:
        """The topic's route (TopicNotFoundError when no live broker hosts it)."""
        _checked(check_topic, topic)
        pb = await self._namesrv(
            "GetRouteInfoByTopic", nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic)
        )
        return TopicRouteInfo(
            topic=topic,
            queues=tuple(
                RouteQueue(
                    q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag
                )
                for q in pb.route.queues
            ),
            brokers=tuple(broker_group(b) for b in pb.route.brokers),
        )

    async def runtime_stats(self, broker: str) -> RuntimeStats:
        """Role, offsets, throughput and disk use of one broker (name -> master, or host:port)."""
        addr = await self._broker_addr(broker)
        pb = await self._guard(
            addr, self._admin(addr).GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest(), **self._kw)
        )
        return runtime_stats(pb)

    async def broker_config(self, broker: str) -> dict[str, str]:
        """One broker's effective configuration, RocketMQ key names -> values as text."""
        addr = await self._broker_addr(broker)
        pb = await self._guard(
            addr, self._admin(addr).GetBrokerConfig(admin_pb2.GetBrokerConfigRequest(), **self._kw)
        )
        return dict(sorted(pb.config.items()))

    async def update_broker_config(self, broker: str, updates: dict[str, str]) -> dict[str, str]:
        """Change keys at runtime on one broker (all or nothing); returns the new configuration."""
        addr = await self._broker_addr(broker)
        request = admin_pb2.UpdateBrokerConfigRequest(updates=updates)
        pb = await self._guard(addr, self._admin(addr).UpdateBrokerConfig(request, **self._kw))
        return dict(sorted(pb.config.items()))

    @property
    def _kw(self) -> dict[str, float]:
        return {"timeout": self._timeout_s}

    # ---- topics --------------------------------------------------------------------------------
    async def create_topic(
        self, config: TopicConfig | str, *, cluster: str | None = None, broker: str | None = None
    ) -> list[ApplyResult]:
        """Create a topic on every master of ``cluster`` or on ``broker`` only.

        With neither, the only registered cluster is used. Per-broker outcomes (ALREADY_EXISTS,
        UNAVAILABLE) are in the results; bad input raises InvalidArgumentError.
        """
        cfg = TopicConfig(config) if isinstance(config, str) else config
        self._check_topic_config(cfg)
        pb = cfg._to_pb()
        return await self._apply(
            cluster,
            broker,
            lambda stub, target: stub.CreateTopic(
                admin_pb2.CreateTopicRequest(target=target, config=pb), **self._kw
            ),
        )

    async def update_topic(
        self, config: TopicConfig, *, cluster: str | None = None, broker: str | None = None
    ) -> list[ApplyResult]:
        """Replace an existing topic's config (shrink: lower write first, drain, then read)."""
        self._check_topic_config(config)
        pb = config._to_pb()
        return await self._apply(
            cluster,
            broker,
            lambda stub, target: stub.UpdateTopic(
                admin_pb2.UpdateTopicRequest(target=target, config=pb), **self._kw
            ),
        )

    async def delete_topic(
        self, topic: str, *, cluster: str | None = None, broker: str | None = None
    ) -> list[ApplyResult]:
        """Delete a topic with its consume queues and consumer offsets."""
        _checked(check_topic, topic)
        return await self._apply(
            cluster,
            broker,
            lambda stub, target: stub.DeleteTopic(
                admin_pb2.DeleteTopicRequest(target=target, topic=topic), **self._kw
            ),
        )

    @staticmethod
    def _check_topic_config(cfg: TopicConfig) -> None:
        _checked(check_topic, cfg.topic_name)
        _checked(check_queue_nums, cfg.read_queue_nums, cfg.write_queue_nums)
        _checked(check_perm, cfg.perm)

    async def list_topics(self, cluster: str = "", *, include_system: bool = False) -> list[str]:
        """Topic names registered by live brokers (of one cluster, if given), sorted."""
        pb = await self._namesrv(
            "GetAllTopics", nameserver_pb2.GetAllTopicsRequest(cluster_name=cluster)
        )
        if include_system:
            return list(pb.topics)
        # Brokers also register their cluster and broker names as topics (RocketMQ does the
        # same, for auto-create by cluster); they are not user topics either.
        info = await self.cluster_info()
        internal = set(info.clusters) | set(info.brokers)
        return [t for t in pb.topics if not is_system_topic(t) and t not in internal]

    async def broker_topics(
        self, broker: str | None = None, *, include_system: bool = False
    ) -> dict[str, list[TopicConfig]]:
        """Broker name -> its topic configs, from every master (or one broker)."""
        targets = await self._masters_or(broker)
        request = admin_pb2.ListTopicsRequest(include_system_topics=include_system)

        async def ask(name: str, addr: str) -> list[TopicConfig]:
            pb = await self._guard(addr, self._admin(addr).ListTopics(request, **self._kw))
            return [TopicConfig._from_pb(t) for t in pb.topics]

        answers, failures = await self._fan_out(targets, ask)
        if failures and not answers:
            raise _first_error(failures)
        return answers

    async def _masters_or(self, broker: str | None) -> dict[str, str]:
        if broker:
            return {broker: await self._broker_addr(broker)}
        masters = (await self.cluster_info()).masters()
        if not masters:
            raise NotFoundError("no broker with a live master is registered with the nameserver")
        return masters

    async def describe_topic(self, topic: str) -> TopicDescription:
        """The topic's route and, from each hosting master, its config and per-queue offsets."""
        route = await self.route(topic)
        targets = {g.broker_name: g.read_order() for g in route.brokers if g.addrs}
        request = admin_pb2.DescribeTopicRequest(topic=topic)

        async def ask(name: str, addr: str) -> BrokerTopic:
            pb = await self._guard(addr, self._admin(addr).DescribeTopic(request, **self._kw))
            queues = tuple(
                QueueOffsets(
                    pb.broker_name or name,
                    q.queue_id,
                    q.min_offset,
                    q.max_offset,
                    q.last_update_timestamp_ms,
                )
                for q in pb.queues
            )
            return BrokerTopic(name, addr, TopicConfig._from_pb(pb.config), queues)

        answers, failures = await self._fan_out_reads(targets, ask)
        return TopicDescription(
            topic=topic,
            route=route,
            brokers=tuple(answers[n] for n in sorted(answers)),
            errors={n: e.message for n, e in sorted(failures.items())},
        )

    # ---- subscription groups -------------------------------------------------------------------
    async def create_group(
        self, config: GroupConfig | str, *, cluster: str | None = None, broker: str | None = None
    ) -> list[ApplyResult]:
        """Create a subscription group config on a cluster's masters or one broker."""
        cfg = GroupConfig(config) if isinstance(config, str) else config
        _checked(check_group, cfg.group_name)
        pb = cfg._to_pb()
        return await self._apply(
            cluster,
            broker,
            lambda stub, target: stub.CreateSubscriptionGroup(
                admin_pb2.CreateSubscriptionGroupRequest(target=target, config=pb), **self._kw
            ),
        )

    async def update_group(
        self, config: GroupConfig, *, cluster: str | None = None, broker: str | None = None
    ) -> list[ApplyResult]:
        """Replace an existing subscription group config."""
        _checked(check_group, config.group_name)
        pb = config._to_pb()
        return await self._apply(
            cluster,
            broker,
            lambda stub, target: stub.UpdateSubscriptionGroup(
                admin_pb2.UpdateSubscriptionGroupRequest(target=target, config=pb), **self._kw
            ),
        )

    async def delete_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker: str | None = None,
        clean_offsets: bool = False,
    ) -> list[ApplyResult]:
        """Delete a subscription group config (and its consumer offsets, if asked)."""
        _checked(check_group, group)
        return await self._apply(
            cluster,
            broker,
            lambda stub, target: stub.DeleteSubscriptionGroup(
                admin_pb2.DeleteSubscriptionGroupRequest(
                    target=target, group_name=group, clean_offsets=clean_offsets
                ),
                **self._kw,
            ),
        )

    async def list_groups(self, broker: str | None = None) -> dict[str, list[GroupConfig]]:
        """Broker name -> its subscription group configs, from every master (or one broker)."""
        targets = await self._masters_or(broker)
        request = admin_pb2.ListSubscriptionGroupsRequest()

        async def ask(name: str, addr: str) -> list[GroupConfig]:
            pb = await self._guard(
                addr, self._admin(addr).ListSubscriptionGroups(request, **self._kw)
            )
            return [GroupConfig._from_pb(g) for g in pb.groups]

        answers, failures = await self._fan_out(targets, ask)
        if failures and not answers:
            raise _first_error(failures)
        return answers

    # ---- consumer groups (_admin_consumers.py) -------------------------------------------------
    async def consume_stats(self, group: str, topic: str = "") -> ConsumeStats:
        """A group's offsets and lag on every queue, summed over brokers.

        With a topic, the brokers of its route are asked; without, every master. Brokers where
        the group has no offsets contribute nothing; the result is empty if none has any.
        """
        _checked(check_group, group)
        if topic:
            _checked(check_topic, topic)
        return await consume_stats(self, group, topic)

    async def consumer_ids(self, group: str) -> list[str]:
        """Client ids of the group's live members, as the brokers know them from heartbeats."""
        _checked(check_group, group)
        return await consumer_ids(self, group)

    async def consumer_connection(self, group: str) -> ConsumerConnectionInfo:
        """The group's live members (address, subscriptions), the topics they subscribe to
        differently (SPEC §6.17) and its orderly queue locks, merged over every master.

        NotFoundError if no broker has a live member of the group.
        """
        _checked(check_group, group)
        return await consumer_connection(self, group)

    async def reset_offset(
        self,
        group: str,
        topic: str,
        *,
        timestamp_ms: int | None = None,
        queue_offset: int | None = None,
        queue_id: int | None = None,
        broker: str | None = None,
    ) -> ResetResult:
        """Move a group's offsets on a topic to a time or a queue offset, on every broker of the
        topic (or one), and tell the group's live members. Give exactly one position."""
        _checked(check_group, group)
        _checked(check_topic, topic)
        if (timestamp_ms is None) == (queue_offset is None):
            raise InvalidArgumentError("give exactly one of timestamp_ms and queue_offset")
        return await reset_offset(self, group, topic, timestamp_ms, queue_offset, queue_id, broker)

    # ---- messages (_admin_messages.py) ---------------------------------------------------------
    async def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp_ms: int = 0,
        end_timestamp_ms: int | None = None,
        max_num: int = 32,
    ) -> list[ReceivedMessage]:
        """Messages of ``topic`` carrying business key ``key``, newest first, from every broker
        hosting the topic (at most ``max_num``, 1..64)."""
        _checked(check_topic, topic)
        if not key:
            raise InvalidArgumentError("the key is empty; give one word of the message's KEYS")
        if not 1 <= max_num <= QUERY_MAX_NUM_MAX:
            raise InvalidArgumentError(f"max_num is {max_num}; use 1..{QUERY_MAX_NUM_MAX}")
        return await query_by_key(self, topic, key, begin_timestamp_ms, end_timestamp_ms, max_num)

    async def query_by_id(self, topic: str, msg_id: str) -> list[ReceivedMessage]:
        """Messages with unique id ``msg_id`` (SendResult.msg_id); several if a producer retry
        stored it twice. MessageNotFoundError if no broker has it."""
        _checked(check_topic, topic)
        return await query_by_id(self, topic, msg_id)

    async def view_message(self, offset_msg_id: str) -> ReceivedMessage:
        """The message an offset message id (SendResult.offset_msg_id) points at, read from the
        broker whose address the id encodes."""
        return await view_message(self, offset_msg_id)

    # ---- dead letters (_admin_messages.py) -----------------------------------------------------
    async def dead_letters(
        self,
        group: str,
        broker: str | None = None,
        offset: int | None = None,
        max_num: int = 32,
    ) -> DeadLetters:
        """Dead letters of ``group`` (its ``%DLQ%{group}``, which consumers cannot read), oldest
        first, at most ``max_num`` (1..256) per broker, from every master or one broker.

        ``offset`` is a DLQ queue offset to start from on each broker asked (None = the oldest
        still stored); page through one broker with ``broker`` and its page's ``next_offset``.
        """
        _checked(check_group, group)
        if not 1 <= max_num <= DEAD_LETTERS_MAX_NUM_MAX:
            raise InvalidArgumentError(f"max_num is {max_num}; use 1..{DEAD_LETTERS_MAX_NUM_MAX}")
        if offset is not None and offset < 0:
            raise InvalidArgumentError(f"offset is {offset}; DLQ offsets start at 0")
        return await dead_letters(self, group, broker, offset, max_num)

    async def resend_dead_letter(self, group: str, offset_msg_id: str) -> ResentDeadLetter:
        """Send the dead letter ``offset_msg_id`` (from :meth:`dead_letters`) of ``group`` back to
        the topic it was first sent to, as a new message with its reconsume times reset; asks the
        broker whose address the id encodes. The dead letter stays in the DLQ."""
        _checked(check_group, group)
        return await resend_dead_letter(self, group, offset_msg_id)

    # ---- transactions --------------------------------------------------------------------------
    async def half_messages(
        self, topic: str = "", broker: str | None = None, max_num: int = 100
    ) -> HalfMessages:
        """Transactional messages waiting for their producer's commit or rollback (SPEC §9),
        oldest first, at most ``max_num`` (1..1000) in all, from every master or one broker;
        ``topic`` keeps only those for that real topic."""
        return await half_messages(self, topic, broker, max_num)

    # ---- failover (controller mode, DESIGN.md §6) ----------------------------------------------
    async def ha_status(self, broker_name: str | None = None) -> list[HaGroup]:
        """Per broker group (all, or ``broker_name``): its replicas (id, address, role, epoch,
        max offset, in-sync or not, lease left), the master, the epoch and the in-sync set."""
        return await ha_status(self, broker_name)

    async def switchover(
        self, broker_name: str, target_replica_id: int = 0, timeout_ms: int = 10_000
    ) -> SwitchoverResult:
        """Hand ``broker_name``'s master role to in-sync replica ``target_replica_id`` (0 = the
        best-ranked one) for maintenance; returns once the new master leads. The target must
        catch up within ``timeout_ms`` (1..120000), else RequestTimeoutError and nothing
        changes."""
        return await switchover(self, broker_name, target_replica_id, timeout_ms)
