"""RocketQ: a message queue that does what Apache RocketMQ does.

The public API, asyncio first with blocking wrappers::

    from rocketq import Message, Producer, ProducerConfig, PushConsumer, PushConsumerConfig

Producers (:class:`Producer`, :class:`AccumulatingProducer`, the transactional
:class:`TransactionProducer`), consumers (:class:`PushConsumer`,
:class:`LitePullConsumer`), the admin client (:class:`Admin`), the timer-wheel's client
(:class:`TimerClient`: stats, cancelling a delayed message), the message model
(:class:`Message`, :class:`ReceivedMessage`, :class:`SendResult`) and the error types
(:mod:`rocketq.client.errors`, base :class:`RocketQError`). :mod:`rocketq.codec` is the commitlog
record codec shared with the broker.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from rocketq.client import (
    AccumulatingProducer,
    AccumulatingProducerConfig,
    Admin,
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocateByConfig,
    AllocateByMachineRoom,
    AllocateConsistentHash,
    AllocateMachineRoomNearby,
    AllocateStrategy,
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    ExpressionType,
    LitePullConsumer,
    LitePullConsumerConfig,
    LocalFileOffsetStore,
    MessageListener,
    MessageModel,
    MessageQueueSelector,
    OffsetStore,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
    SendCallback,
    SyncAccumulatingProducer,
    SyncLitePullConsumer,
    SyncProducer,
    SyncPushConsumer,
)
from rocketq.client.consumer import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    OrderlyMessageListener,
    SubscriptionConflict,
)
from rocketq.client.errors import RocketQError
from rocketq.client.producer import (
    LocalTransactionState,
    SyncTransactionProducer,
    TransactionListener,
    TransactionProducer,
    TransactionProducerConfig,
    TransactionSendResult,
)
from rocketq.client.timer import TimerClient, TimerStats
from rocketq.message import Message, MessageQueue, ReceivedMessage, SendResult, SendStatus

try:
    __version__ = version("rocketq")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = [
    "AccumulatingProducer",
    "AccumulatingProducerConfig",
    "Admin",
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
    "LitePullConsumer",
    "LitePullConsumerConfig",
    "LocalFileOffsetStore",
    "LocalTransactionState",
    "Message",
    "MessageListener",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "OffsetStore",
    "OrderlyMessageListener",
    "Producer",
    "ProducerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "ReadOffsetType",
    "ReceivedMessage",
    "RemoteBrokerOffsetStore",
    "RocketQError",
    "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "SubscriptionConflict",
    "SyncAccumulatingProducer",
    "SyncLitePullConsumer",
    "SyncProducer",
    "SyncPushConsumer",
    "SyncTransactionProducer",
    "TimerClient",
    "TimerStats",
    "TransactionListener",
    "TransactionProducer",
    "TransactionProducerConfig",
    "TransactionSendResult",
    "__version__",
]
