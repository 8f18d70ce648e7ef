"""Start-up pieces shared by the push and the lite pull consumer.

- the client id: instance "DEFAULT" becomes "{pid}#{ns}" in clustering mode (RocketMQ's
  changeInstanceNameToPID), so every consumer object is a group member of its own even when a
  process runs several; broadcasting keeps "DEFAULT", because the client id names the local
  offsets directory and must survive a restart;
- the offset store: the broker in clustering mode, ``offsets.json`` in broadcasting mode;
- the offset source of computePullFromWhere and the readable queues of a topic.
"""

from __future__ import annotations

import os
import time

from rocketq.client._instance import ClientConfig, ClientInstance, local_ip
from rocketq.client.consumer._api import BrokerApi
from rocketq.client.consumer.config import MessageModel
from rocketq.client.consumer.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
)
from rocketq.client.errors import TopicNotFoundError
from rocketq.message import MessageQueue

DEFAULT_INSTANCE_NAME = "DEFAULT"


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
