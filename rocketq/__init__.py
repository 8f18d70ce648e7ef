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

import typing as _typing
from importlib import import_module as _import_module
from importlib.metadata import PackageNotFoundError, version

from rocketq import _grpc_env  # noqa: F401  (sets GRPC_EXPERIMENTS before any grpc import)

#: Where each public name lives. ``from rocketq import Producer`` imports
#: :mod:`rocketq.client` on first use (PEP 562), not when ``rocketq`` is imported: the store and
#: the codec modules import ``rocketq.codec``, and a package ``__init__`` that pulled in the client
#: would load grpc and protobuf into every process that only needs the record codec
#: (DESIGN.md §2; tests/unit/test_layering.py checks it).
_MODULE_OF: dict[str, str] = {
    "AccumulatingProducer": "rocketq.client",
    "AccumulatingProducerConfig": "rocketq.client",
    "Admin": "rocketq.client",
    "AllocateAveragely": "rocketq.client",
    "AllocateAveragelyByCircle": "rocketq.client",
    "AllocateByConfig": "rocketq.client",
    "AllocateByMachineRoom": "rocketq.client",
    "AllocateConsistentHash": "rocketq.client",
    "AllocateMachineRoomNearby": "rocketq.client",
    "AllocateStrategy": "rocketq.client",
    "ConsumeContext": "rocketq.client",
    "ConsumeFromWhere": "rocketq.client",
    "ConsumeOrderlyContext": "rocketq.client.consumer",
    "ConsumeOrderlyStatus": "rocketq.client.consumer",
    "ConsumeResult": "rocketq.client",
    "ExpressionType": "rocketq.client",
    "LitePullConsumer": "rocketq.client",
    "LitePullConsumerConfig": "rocketq.client",
    "LocalFileOffsetStore": "rocketq.client",
    "LocalTransactionState": "rocketq.client.producer",
    "Message": "rocketq.message",
    "MessageListener": "rocketq.client",
    "MessageModel": "rocketq.client",
    "MessageQueue": "rocketq.message",
    "MessageQueueSelector": "rocketq.client",
    "OffsetStore": "rocketq.client",
    "OrderlyMessageListener": "rocketq.client.consumer",
    "PoppedMessage": "rocketq.client.consumer",
    "Producer": "rocketq.client",
    "ProducerConfig": "rocketq.client",
    "PushConsumer": "rocketq.client",
    "PushConsumerConfig": "rocketq.client",
    "ReadOffsetType": "rocketq.client",
    "ReceivedMessage": "rocketq.message",
    "RemoteBrokerOffsetStore": "rocketq.client",
    "RocketQError": "rocketq.client.errors",
    "SelectMessageQueueByHash": "rocketq.client",
    "SelectMessageQueueByRandom": "rocketq.client",
    "SendCallback": "rocketq.client",
    "SendResult": "rocketq.message",
    "SendStatus": "rocketq.message",
    "SimpleConsumer": "rocketq.client.consumer",
    "SimpleConsumerConfig": "rocketq.client.consumer",
    "SyncSimpleConsumer": "rocketq.client.consumer",
    "SubscriptionConflict": "rocketq.client.consumer",
    "SyncAccumulatingProducer": "rocketq.client",
    "SyncLitePullConsumer": "rocketq.client",
    "SyncProducer": "rocketq.client",
    "SyncPushConsumer": "rocketq.client",
    "SyncTransactionProducer": "rocketq.client.producer",
    "TimerClient": "rocketq.client.timer",
    "TimerStats": "rocketq.client.timer",
    "TransactionListener": "rocketq.client.producer",
    "TransactionProducer": "rocketq.client.producer",
    "TransactionProducerConfig": "rocketq.client.producer",
    "TransactionSendResult": "rocketq.client.producer",
}

# Type checkers and IDEs see the names as ordinary imports; at run time they load on first use.
if _typing.TYPE_CHECKING:
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
        PoppedMessage,
        SimpleConsumer,
        SimpleConsumerConfig,
        SubscriptionConflict,
        SyncSimpleConsumer,
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
    "PoppedMessage",
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
    "SimpleConsumer",
    "SimpleConsumerConfig",
    "SubscriptionConflict",
    "SyncAccumulatingProducer",
    "SyncLitePullConsumer",
    "SyncProducer",
    "SyncPushConsumer",
    "SyncSimpleConsumer",
    "SyncTransactionProducer",
    "TimerClient",
    "TimerStats",
    "TransactionListener",
    "TransactionProducer",
    "TransactionProducerConfig",
    "TransactionSendResult",
    "__version__",
]


# Hidden from type checkers, which see the imports above instead: a module __getattr__ they could
# see would make them accept any name, typos included.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Import the module that defines ``name`` on first access and cache the name here."""
        module_name = _MODULE_OF.get(name)
        if module_name is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_import_module(module_name), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
