"""The broker's messaging parts on a small store in a temp dir, for unit tests (no sockets).

Real components throughout — store, topic/group/offset managers, client manager, hold service,
processors — with a ManualClock; only the gRPC transport is absent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from services.broker.client_manager import ClientManager
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.model import TopicConfig
from services.broker.pull_hold import PullHoldService
from services.broker.pull_processor import PullProcessor
from services.broker.query_processor import QueryProcessor
from services.broker.send_processor import SendProcessor
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import ManualClock
from services.store.commitlog import MessageToStore
from services.store.message_store import MessageStore

PEER = "ipv4:10.1.2.3:40000"


class BrokerParts:
    """One broker's messaging components, wired like server.py wires them."""

    def __init__(self, root: Path, *, held_pulls_max: int = 1000, **config: object) -> None:
        self.config = BrokerConfig(
            store_dir=root / "store",
            commitlog_file_bytes=1 << 20,
            consume_queue_units_per_file=1000,
            **config,  # type: ignore[arg-type]
        )
        self.clock = ManualClock()
        store_cfg = dataclasses.replace(
            self.config.store_config(10911), index_slot_num=64, index_num=512
        )
        self.store = MessageStore(
            store_cfg, clock=self.clock, disk_usage=lambda _p: 0.1, memory_bytes=1 << 34
        )
        self.store.open()
        self.topics = TopicConfigManager(self.config, store_cfg.config_dir, self.clock)
        self.topics.load()
        self.groups = SubscriptionGroupManager(self.config, store_cfg.config_dir)
        self.groups.load()
        self.offsets = ConsumerOffsetManager(store_cfg.config_dir, self.clock)
        self.offsets.load()
        self.clients = ClientManager(self.config, self.clock, group_config=self.groups.get)
        self.hold = PullHoldService(
            self.config, self.store, self.clock, held_pulls_max=held_pulls_max
        )
        self.sender = SendProcessor(
            config=self.config, store=self.store, topics=self.topics, clock=self.clock
        )
        self.puller = PullProcessor(
            config=self.config,
            store=self.store,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            clients=self.clients,
            hold=self.hold,
            clock=self.clock,
        )
        self.queries = QueryProcessor(store=self.store, topics=self.topics, clock=self.clock)

    def close(self) -> None:
        self.store.close_files()

    def create_topic(self, name: str, queues: int = 4, perm: int = 6, read: int = 0) -> None:
        self.topics.put(TopicConfig(name, read or queues, queues, perm))

    def append(
        self, topic: str, queue_id: int = 0, count: int = 1, *, tags: str = "", keys: str = ""
    ) -> None:
        """Store ``count`` messages directly (dispatch and arrival listeners run)."""
        props: dict[str, str] = {}
        if tags:
            props[codec.Prop.TAGS] = tags
        if keys:
            props[codec.Prop.KEYS] = keys
        self.store.append(
            [
                MessageToStore(
                    topic=topic,
                    queue_id=queue_id,
                    body=f"m{i}".encode(),
                    properties=codec.encode_properties(props),
                    tags_code=codec.tags_hash(tags),
                    keys=keys,
                )
                for i in range(count)
            ]
        )


def send_request(
    topic: str,
    bodies: Iterable[bytes] = (b"hello",),
    *,
    queue_id: int = 0,
    properties: dict[str, str] | None = None,
    **fields: object,
) -> messaging_pb2.SendRequest:
    return messaging_pb2.SendRequest(
        producer_group="pg",
        queue_id=queue_id,
        messages=[
            common_pb2.Message(topic=topic, body=b, properties=properties or {}) for b in bodies
        ],
        **fields,  # type: ignore[arg-type]
    )


def pull_request(
    topic: str,
    offset: int = 0,
    *,
    queue_id: int = 0,
    group: str = "cg",
    expression: str = "*",
    suspend_ms: int = 0,
    flags: int = 0x4,
    **fields: object,
) -> messaging_pb2.PullRequest:
    if suspend_ms:
        flags |= 0x2
    return messaging_pb2.PullRequest(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        sys_flag=flags,
        subscription=expression,
        suspend_timeout_ms=suspend_ms,
        **fields,  # type: ignore[arg-type]
    )
