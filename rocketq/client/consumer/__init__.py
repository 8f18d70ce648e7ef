"""Consumers: push (listener called with pulled messages) and lite pull (the application polls).

Public names are re-exported here from the private modules that implement them (SPEC §6):

- :class:`PushConsumer` / :class:`SyncPushConsumer` with :class:`PushConsumerConfig`, a
  listener returning :class:`ConsumeResult` and receiving a :class:`ConsumeContext`;
- :class:`LitePullConsumer` / :class:`SyncLitePullConsumer` with :class:`LitePullConsumerConfig`;
- :class:`MessageModel`, :class:`ConsumeFromWhere`, :class:`ExpressionType`;
- allocation strategies (``Allocate*``) and offset stores, for custom setups.
"""

from __future__ import annotations

from rocketq.client.consumer.allocate import (
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocateByConfig,
    AllocateByMachineRoom,
    AllocateConsistentHash,
    AllocateMachineRoomNearby,
    AllocateStrategy,
)
from rocketq.client.consumer.config import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    ExpressionType,
    LitePullConsumerConfig,
    MessageListener,
    MessageModel,
    PushConsumerConfig,
)
from rocketq.client.consumer.lite_pull import LitePullConsumer
from rocketq.client.consumer.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
)
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.consumer.push_consumer import PushConsumer
from rocketq.client.consumer.sync import SyncLitePullConsumer, SyncPushConsumer

__all__ = [
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateByConfig",
    "AllocateByMachineRoom",
    "AllocateConsistentHash",
    "AllocateMachineRoomNearby",
    "AllocateStrategy",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeResult",
    "ExpressionType",
    "LitePullConsumer",
    "LitePullConsumerConfig",
    "LocalFileOffsetStore",
    "MessageListener",
    "MessageModel",
    "OffsetStore",
    "ProcessQueue",
    "PushConsumer",
    "PushConsumerConfig",
    "ReadOffsetType",
    "RemoteBrokerOffsetStore",
    "SyncLitePullConsumer",
    "SyncPushConsumer",
]
