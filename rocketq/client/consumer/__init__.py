"""Consumers: push (listener called with pulled messages) and lite pull (the application polls).

Public names are re-exported here from the private modules that implement them (SPEC §6):

- :class:`PushConsumer` / :class:`SyncPushConsumer` with :class:`PushConsumerConfig`, a
  listener returning :class:`ConsumeResult` and receiving a :class:`ConsumeContext`, or with
  ``orderly=True`` one returning :class:`ConsumeOrderlyStatus` and receiving a
  :class:`ConsumeOrderlyContext`;
- :class:`SubscriptionConflict`: group members disagreeing about a topic, from
  ``subscription_conflicts()``;
- :class:`SimpleConsumer` / :class:`SyncSimpleConsumer` with :class:`SimpleConsumerConfig`: pop
  consumption (receive, ack, change the invisible duration of popped messages; stale handles
  raise :class:`InvalidReceiptHandleError`);
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
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeResult,
    ExpressionType,
    LitePullConsumerConfig,
    MessageListener,
    MessageModel,
    OrderlyMessageListener,
    PushConsumerConfig,
    SubscriptionConflict,
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
from rocketq.client.consumer.simple_consumer import (
    InvalidReceiptHandleError,
    PoppedMessage,
    SimpleConsumer,
    SimpleConsumerConfig,
    SyncSimpleConsumer,
)
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
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeResult",
    "ExpressionType",
    "InvalidReceiptHandleError",
    "LitePullConsumer",
    "LitePullConsumerConfig",
    "LocalFileOffsetStore",
    "MessageListener",
    "MessageModel",
    "OffsetStore",
    "OrderlyMessageListener",
    "PoppedMessage",
    "ProcessQueue",
    "PushConsumer",
    "PushConsumerConfig",
    "ReadOffsetType",
    "RemoteBrokerOffsetStore",
    "SimpleConsumer",
    "SimpleConsumerConfig",
    "SubscriptionConflict",
    "SyncLitePullConsumer",
    "SyncPushConsumer",
    "SyncSimpleConsumer",
]
