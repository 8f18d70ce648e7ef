"""Start-up pieces shared by the push and the lite pull consumer.

- the client id: instance "DEFAULT" becomes "{pid}#{ns}" in clustering mode (RocketMQ's
  changeInstanceNameToPID), so every consumer object is a group member of its own even when a
  process runs several; broadcasting keeps "DEFAULT", because the client id names the local
  offsets directory and must survive a restart;
- the offset store: the broker in clustering mode, ``offsets.json`` in broadcasting mode;
- the offset source of computePullFromWhere and the readable queues of a topic;
- subscription conflicts (SPEC §6.17): the notices a broker pushes, kept per topic, and the
  ERROR log of pulls the broker refuses for them, at most once per 30 s per topic.
"""

from __future__ import annotations

import logging
import os
import time

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.client._instance import ClientConfig, ClientInstance, local_ip
from rocketq.client.consumer._api import BrokerApi
from rocketq.client.consumer.config import MessageModel, SubscriptionConflict
from rocketq.client.consumer.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
)
from rocketq.client.errors import (
    RocketQError,
    SubscriptionInconsistentError,
    TopicNotFoundError,
)
from rocketq.client.security import ClientSecurity
from rocketq.message import MessageQueue

DEFAULT_INSTANCE_NAME = "DEFAULT"

SUBSCRIPTION_INCONSISTENT = "SUBSCRIPTION_INCONSISTENT"
"""ErrorReason name of a pull refused because the group's members disagree (SPEC §6.17)."""
REFUSED_PULL_LOG_INTERVAL_S = 30.0
"""A refused topic is logged at ERROR at most this often (pulls retry every 3 s)."""


def unique_instance_name() -> str:
    """RocketMQ's changeInstanceNameToPID: "{pid}#{ns}"."""
    return f"{os.getpid()}#{time.time_ns()}"


def client_config(
    *,
    namesrv_addrs: tuple[str, ...],
    instance_name: str,
    client_ip: str | None,
    message_model: MessageModel,
    poll_name_server_interval_ms: int,
    heartbeat_broker_interval_ms: int,
    request_timeout_ms: int,
    security: ClientSecurity | None = None,
) -> ClientConfig:
    """The ClientInstance settings of a consumer (SPEC §6.3 step 2)."""
    if message_model is MessageModel.CLUSTERING and instance_name == DEFAULT_INSTANCE_NAME:
        instance_name = unique_instance_name()
    return ClientConfig(
        namesrv_addrs=namesrv_addrs,
        instance_name=instance_name,
        client_ip=client_ip or local_ip(),
        poll_name_server_interval_ms=poll_name_server_interval_ms,
        heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
        request_timeout_ms=request_timeout_ms,
        security=security,
    )


def make_offset_store(
    api: BrokerApi,
    *,
    client_id: str,
    group: str,
    message_model: MessageModel,
    offset_store_dir: str | None,
) -> OffsetStore:
    """RemoteBrokerOffsetStore for clustering, LocalFileOffsetStore for broadcasting."""
    if message_model is MessageModel.BROADCASTING:
        return LocalFileOffsetStore(client_id, group, offset_store_dir)
    return RemoteBrokerOffsetStore(group, api.query_offset, api.update_offset)


class OffsetSourceImpl:
    """compute_pull_from_where's view of an offset store and the brokers."""

    def __init__(self, store: OffsetStore, api: BrokerApi) -> None:
        self._store = store
        self._api = api

    async def read_stored(self, mq: MessageQueue) -> int:
        return await self._store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._api.max_offset(mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._api.min_offset(mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._api.search_offset(mq, timestamp_ms)


async def readable_queues(
    instance: ClientInstance, topic: str, refresh: bool = False
) -> list[MessageQueue]:
    """The topic's readable queues from its (cached) route; empty if it has no route."""
    route = None if refresh else instance.cached_route(topic)
    if route is None:
        try:
            route = await instance.get_route(topic, refresh=refresh)
        except TopicNotFoundError:
            return []
    return route.read_queues()


# ---- subscription conflicts (SPEC §6.17) -----------------------------------------------------


def is_subscription_inconsistent(exc: BaseException) -> bool:
    """True for a pull the broker refused because the group's members subscribe differently."""
    return isinstance(exc, SubscriptionInconsistentError) or (
        isinstance(exc, RocketQError) and exc.reason == SUBSCRIPTION_INCONSISTENT
    )


def conflict_from_pb(pb: common_pb2.SubscriptionConflict) -> SubscriptionConflict:
    return SubscriptionConflict(
        consumer_group=pb.consumer_group,
        topic=pb.topic,
        members=tuple(
            (m.client_id, m.expression if m.subscribed else None)
            for m in sorted(pb.members, key=lambda m: m.client_id)
        ),
        pulls_refused=pb.pulls_refused,
    )


class SubscriptionConflicts:
    """The latest conflict notice per topic of one consumer, and the refused-pull log."""

    def __init__(self, group: str, logger: logging.Logger) -> None:
        self._group = group
        self._log = logger
        self._by_topic: dict[str, SubscriptionConflict] = {}
        self._last_logged_s: dict[str, float] = {}

    def on_notice(self, pb: common_pb2.SubscriptionConflict) -> None:
        """Store a broker's notice; one with no members means the conflict is resolved."""
        if pb.consumer_group and pb.consumer_group != self._group:
            return
        if not pb.members:
            self._by_topic.pop(pb.topic, None)
            self._last_logged_s.pop(pb.topic, None)
            return
        self._by_topic[pb.topic] = conflict_from_pb(pb)

    def current(self) -> list[SubscriptionConflict]:
        """Conflicts not yet resolved, sorted by topic."""
        return [self._by_topic[t] for t in sorted(self._by_topic)]

    def log_refused_pull(self, topic: str, exc: BaseException) -> None:
        """ERROR-log a refused pull of ``topic``, at most every 30 s per topic."""
        now_s = time.monotonic()
        last_s = self._last_logged_s.get(topic)
        if last_s is not None and now_s - last_s < REFUSED_PULL_LOG_INTERVAL_S:
            return
        self._last_logged_s[topic] = now_s
        self._log.error(
            "group %s: the broker refuses pulls of %s because the group's members subscribe to "
            "it differently; nothing is consumed from it until they agree (retrying every 3 s): "
            "%s",
            self._group,
            topic,
            exc,
        )
