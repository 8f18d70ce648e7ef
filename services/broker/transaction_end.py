"""EndTransaction: commit or roll back a half message, exactly once (SPEC §9).

The checks, in order (messaging.proto ``EndTransaction`` lists the codes):

| check                                                          | refusal                   |
|----------------------------------------------------------------|---------------------------|
| this broker is a master                                        | UNAVAILABLE NOT_MASTER    |
| producer group name valid; offsets >= 0; resolution given      | INVALID_ARGUMENT          |
| a half record (topic RMQ_SYS_TRANS_HALF_TOPIC) at the offset   | NOT_FOUND MESSAGE_NOT_FOUND |
| msg_id / transaction_id, when given, equal its UNIQ_KEY;       | INVALID_ARGUMENT          |
| producer_group equals its PGROUP                               |                           |
| COMMIT: its REAL_TOPIC exists and has queue REAL_QID           | NOT_FOUND TOPIC_NOT_EXIST |

Then, by resolution:

* UNKNOWN: nothing (logged); the check service asks again later.
* Already resolved (by transaction id, either way, or final and forgotten — see
  services.broker.transaction_half): nothing; a contradicting decision is logged as a warning.
  This is what makes the call idempotent: a late second commit, a commit after a rollback, an
  answer to a check whose transaction was meanwhile ended, all change nothing.
* COMMIT: the real message — the half record's body, flag, born time and host, properties minus
  REAL_TOPIC / REAL_QID / TRANSACTION_CHECK_TIMES / TRAN_MSG (PGROUP kept; RocketMQ clears
  TRAN_MSG too, so a committed message never looks like a half one), sys_flag COMMIT | the
  compressed bit, PREPARED TRANSACTION OFFSET = the half's commitlog offset, same UNIQ_KEY —
  and its op record go to the store in ONE append: a crash cannot keep the message and lose
  the op (which would make the check service commit it twice). Failpoint
  ``transaction_before_end_put`` sits just before that append.
* COMMIT of a batch half message (TRAN_BATCH, services.broker.transaction_batch): every
  message of the batch, then the op record, in the same ONE append.
* ROLLBACK: only the op record.

The decision enters the index in the same event-loop step as the append; the answer waits for
the flush policy and, on a SYNC_MASTER, replication like a Send (a timeout is logged: the
records are stored).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.validation import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, check_group
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.ha_tracker import HaWaiter, leadership_lost_error, sync_master_wait
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_batch import committed_batch
from services.broker.transaction_half import (
    COMMIT,
    ROLLBACK,
    TransactionIndex,
    ensure_topic,
    op_message,
    progress,
    real_queue,
)
from services.common import failpoints
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, invalid, not_found
from services.store.commitlog import AppendResult, MessageToStore
from services.store.flush import FlushDiskType
from services.store.message_store import MessageStore, StoreClosedError, StoreFullError

log = logging.getLogger(__name__)

_RESOLUTIONS = {
    messaging_pb2.TRANSACTION_COMMIT: COMMIT,
    messaging_pb2.TRANSACTION_ROLLBACK: ROLLBACK,
}
_DROPPED_ON_COMMIT = (
    Prop.REAL_TOPIC,
    Prop.REAL_QUEUE_ID,
    Prop.TRANSACTION_CHECK_TIMES,
    Prop.TRANSACTION_PREPARED,
)


def committed_message(record: codec.Record, topic: str, queue_id: int) -> MessageToStore:
    """The real message a commit stores for the half ``record``."""
    props = {k: v for k, v in record.properties.items() if k not in _DROPPED_ON_COMMIT}
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=record.body,
        properties=codec.encode_properties(props),
        tags_code=codec.tags_hash(props.get(Prop.TAGS, "")),
        keys=props.get(Prop.KEYS, ""),
        uniq_key=record.uniq_key,
        flag=record.flag,
        sys_flag=SysFlag.TRANSACTION_COMMIT | (record.sys_flag & SysFlag.COMPRESSED),
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
        reconsume_times=record.reconsume_times,
        prepared_transaction_offset=record.physical_offset,
    )


class EndTransactionProcessor:
    """Answers EndTransaction (one per broker)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        index: TransactionIndex,
        clock: Clock = SYSTEM_CLOCK,
        ha_waiter: Callable[[], HaWaiter | None] = lambda: None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.index = index
        self.clock = clock
        self.ha_waiter = ha_waiter
        """The master's replication waiter (the one Send uses), consulted under SYNC_MASTER."""

    async def end(
        self, request: messaging_pb2.EndTransactionRequest
    ) -> messaging_pb2.EndTransactionResponse:
        """Check, then commit / roll back / defer one half message; raises ServiceError."""
        self._check(request)
        record = self._half_record(request.commitlog_offset)
        txid = record.uniq_key
        self._check_identity(request, record, txid)
        source = "check answer" if request.from_transaction_check else "producer"
        if request.resolution == messaging_pb2.TRANSACTION_UNKNOWN:
            log.info(
                "transaction %s (group %s, %s): state UNKNOWN; it will be checked again",
                txid,
                request.producer_group,
                source,
            )
            return messaging_pb2.EndTransactionResponse()
        wanted = _RESOLUTIONS[request.resolution]
        half_progress = progress(self.offsets, self.store, TRANS_HALF_TOPIC)
        done = self.index.is_final(txid, record.queue_offset, half_progress)
        if done is not None:
            if done != wanted:
                log.warning(
                    "transaction %s (group %s): %s from %s ignored, it was already resolved (%s)",
                    txid,
                    request.producer_group,
                    wanted,
                    source,
                    done,
                )
            return messaging_pb2.EndTransactionResponse()
        to_store: list[MessageToStore] = []
        if wanted == COMMIT:
            topic, queue_id = self._real_queue(record, txid)
            if Prop.TRANSACTION_BATCH in record.properties:  # services/broker/transaction_batch
                to_store.extend(
                    committed_batch(
                        record, topic, queue_id,
                        now_ms=self.clock.now_ms(), config=self.config, topics=self.topics,
                    )
                )  # fmt: skip
            else:
                to_store.append(committed_message(record, topic, queue_id))
        ensure_topic(self.topics, TRANS_OP_HALF_TOPIC)
        to_store.append(op_message(txid, record.queue_offset, wanted, self.clock.now_ms()))
        failpoints.inject("transaction_before_end_put")
        results = self._append(to_store)
        # Same loop step as the append: a concurrent check round or second call sees it.
        self.index.resolve(txid, wanted, record.queue_offset, results[-1].queue_offset)
        if wanted == COMMIT:
            self.index.committed += 1
        else:
            self.index.rolled_back += 1
        log.debug("transaction %s %s by %s", txid, wanted, source)
        waited = await self._durable(results[-1].physical_offset + results[-1].size_bytes, txid)
        if waited and not self.config.is_master:  # the lease fence dropped during the wait
            raise leadership_lost_error()
        return messaging_pb2.EndTransactionResponse()

    # -- checks ----------------------------------------------------------------------------
    def _check(self, request: messaging_pb2.EndTransactionRequest) -> None:
        cfg = self.config
        if not cfg.is_master:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.NOT_MASTER,
                f"broker {cfg.broker_name} id {cfg.broker_id} is a slave; end transactions on "
                "its master",
            )
        try:
            check_group(request.producer_group, "producer group")
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
        if request.commitlog_offset < 0 or request.queue_offset < 0:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"offsets must not be negative (commitlog_offset {request.commitlog_offset}, "
                f"queue_offset {request.queue_offset})",
            )
        if request.resolution not in (*_RESOLUTIONS, messaging_pb2.TRANSACTION_UNKNOWN):
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"resolution {request.resolution} is not COMMIT (1), ROLLBACK (2) or UNKNOWN (3)",
            )

    def _half_record(self, offset: int) -> codec.Record:
        try:
            record = self.store.read_record(offset)
        except codec.CorruptRecord:
            record = None  # an offset inside a record, not at its start
        if record is None or record.topic != TRANS_HALF_TOPIC:
            not_found(
                common_pb2.MESSAGE_NOT_FOUND,
                f"no half message at commitlog offset {offset} on broker "
                f"{self.config.broker_name} (never stored here, not transactional, or removed "
                "by retention)",
            )
        return record

    @staticmethod
    def _check_identity(
        request: messaging_pb2.EndTransactionRequest, record: codec.Record, txid: str
    ) -> None:
        for name, given in (("transaction_id", request.transaction_id), ("msg_id", request.msg_id)):
            if given and given != txid:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"{name} {given} does not match the half message at commitlog offset "
                    f"{record.physical_offset}, whose transaction id is {txid}",
                )
        group = record.properties.get(Prop.PRODUCER_GROUP, "")
        if group != request.producer_group:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"producer_group {request.producer_group} does not match the half message's "
                f"producer group {group}",
                producer_group=request.producer_group,
            )

    def _real_queue(self, record: codec.Record, txid: str) -> tuple[str, int]:
        topic, queue_id = real_queue(record)
        cfg = self.topics.get(topic) if topic else None
        if cfg is None or not 0 <= queue_id < cfg.queue_nums:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"cannot commit transaction {txid}: topic {topic!r} queue {queue_id} no longer "
                f"exists on broker {self.config.broker_name}",
                topic=topic,
            )
        return topic, queue_id

    # -- store -----------------------------------------------------------------------------
    def _append(self, messages: list[MessageToStore]) -> list[AppendResult]:
        try:
            return self.store.append(messages)
        except StoreFullError as exc:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL, str(exc)
            ) from None
        except StoreClosedError as exc:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, common_pb2.SERVICE_NOT_AVAILABLE, str(exc)
            ) from None

    async def _durable(self, end_offset: int, txid: str) -> bool:
        """Wait for the flush policy and, on a SYNC_MASTER, an in-sync slave, like a Send; a
        timeout is logged, not an error (the records are stored). True if it waited."""
        if self.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH and not (
            await self.store.flusher.wait_flushed(end_offset)
        ):
            log.warning("transaction %s: stored, but the flush timed out", txid)
            return True
        waited = self.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        status = await sync_master_wait(self.ha_waiter(), self.config, end_offset)
        if status is None:
            return waited
        if status != messaging_pb2.SEND_OK:
            log.warning(
                "transaction %s: stored, but not replicated (%s)",
                txid,
                messaging_pb2.SendStatus.Name(status),
            )
        return True
