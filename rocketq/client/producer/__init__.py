"""RocketQ producers: async first (:class:`Producer`, :class:`AccumulatingProducer`), with
blocking wrappers (:class:`SyncProducer`, :class:`SyncAccumulatingProducer`), and transactional
producers (:class:`TransactionProducer`, :class:`SyncTransactionProducer`, SPEC §9)."""

from __future__ import annotations

from rocketq.client.producer.accumulating import AccumulatingProducer
from rocketq.client.producer.config import AccumulatingProducerConfig, ProducerConfig
from rocketq.client.producer.producer import Producer, SendCallback
from rocketq.client.producer.selectors import (
    MessageQueueSelector,
    SelectByHash,
    SelectByRandom,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
)
from rocketq.client.producer.sync import SyncAccumulatingProducer, SyncProducer
from rocketq.client.producer.transaction import (
    LocalTransactionState,
    SyncTransactionProducer,
    TransactionListener,
    TransactionProducer,
    TransactionProducerConfig,
    TransactionSendResult,
)

__all__ = [
    "AccumulatingProducer",
    "AccumulatingProducerConfig",
    "LocalTransactionState",
    "MessageQueueSelector",
    "Producer",
    "ProducerConfig",
    "SelectByHash",
    "SelectByRandom",
    "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom",
    "SendCallback",
    "SyncAccumulatingProducer",
    "SyncProducer",
    "SyncTransactionProducer",
    "TransactionListener",
    "TransactionProducer",
    "TransactionProducerConfig",
    "TransactionSendResult",
]
