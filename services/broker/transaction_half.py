"""Transactional half messages on the broker: where they are stored, and what is resolved.

SPEC §9, DESIGN.md §8. Two system topics hold the whole state; everything in memory here is
rebuilt from them at startup (:meth:`TransactionIndex.rebuild`):

| topic (queue 0)                | record                                                       |
|--------------------------------|--------------------------------------------------------------|
| ``RMQ_SYS_TRANS_HALF_TOPIC``   | a half message: the producer's body, flag, born time/host and |
|                                | properties + REAL_TOPIC, REAL_QID, TRAN_MSG=true, PGROUP;     |
|                                | sys_flag 0 (NOT_TYPE) so it has a consume-queue unit; a       |
|                                | check-back re-puts a copy with TRANSACTION_CHECK_TIMES + 1    |
| ``RMQ_SYS_TRANS_OP_HALF_TOPIC``| an op record: tags ``d``, body = the half queue offset        |
|                                | (decimal), TRAN_ID = the transaction id (UNIQ_KEY), TRAN_STATE |
|                                | = COMMIT / ROLLBACK / DISCARD                                 |

Both topics are created on first use with one queue and perm 2 (write only), like a
dead-letter topic: no consumer can pull them (Pull refuses an unreadable topic) and Send refuses
every ``RMQ_SYS_`` topic, while the broker reads them straight from its store.

Progress lives in the consumer offset table, group :data:`CHECK_GROUP` (so it persists and
replicates like any offset): on the half topic, every copy below it is dead (resolved, discarded,
or re-put further on); on the op topic, every op below it concerns only dead copies.

The index (one per broker) maps a transaction id to the queue offset of its latest half copy and
its decision, if any. Copies at or above the half progress are always in it; a decided entry
is forgotten once the half progress passes its latest copy (the op walk in
:meth:`TransactionIndex.advance_ops`, amortised O(1) per op), so memory holds pending
transactions plus those resolved since the last check round. A half copy below the progress
whose id is not in the index is therefore final: a late EndTransaction for it changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.validation import PERM_WRITE, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.model import TopicConfig
from services.broker.query_processor import record_to_pb
from services.broker.topic_config_manager import TopicConfigManager
from services.common.errors import invalid
from services.store.commitlog import MessageToStore
from services.store.message_store import GetStatus, MessageStore

log = logging.getLogger(__name__)

CHECK_GROUP = "CID_RMQ_SYS_TRANS"
"""Consumer group whose offsets on the two topics are the check service's progress."""
TRANSACTION_TOPIC_PERM = PERM_WRITE
"""Write only: consumers cannot pull half or op records; the broker reads its store."""
OP_TAG = "d"
TRAN_ID = "TRAN_ID"
"""Op record property: the transaction id it resolves (RocketQ addition)."""
TRAN_STATE = "TRAN_STATE"
"""Op record property: COMMIT, ROLLBACK or DISCARD."""
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
DISCARD = "DISCARD"
DECISIONS = (COMMIT, ROLLBACK, DISCARD)

READ_BATCH = 32
"""Records read per store call while walking a queue."""
SCAN_SLICE_MAX = 2000
"""Records walked before an async walk yields to the event loop."""
_BROKER_PROPERTIES = (Prop.TRANSACTION_CHECK_TIMES, TRAN_ID, TRAN_STATE)
"""Names a producer may not smuggle onto a half message: the broker owns them."""


def ensure_topic(topics: TopicConfigManager, name: str) -> TopicConfig:
    """``name`` (the half or the op topic), created with 1 write-only queue if missing."""
    cfg = topics.get(name)
    if cfg is None:
        cfg = topics.create_system_topic(name, 1, TRANSACTION_TOPIC_PERM)
        log.info("created transaction topic %s", name)
    return cfg


def half_message(
    message: MessageToStore, *, producer_group: str, topics: TopicConfigManager
) -> MessageToStore:
    """The half-topic record of a transactional ``message`` bound for its own topic/queue.

    INVALID_ARGUMENT without a producer group (check-backs go to a live member of it).
    """
    if not producer_group:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            "a transactional message needs producer_group (check-backs are sent to a live "
            "producer of that group)",
            topic=message.topic,
        )
    ensure_topic(topics, TRANS_HALF_TOPIC)
    props = codec.decode_properties(message.properties)
    for name in _BROKER_PROPERTIES:
        props.pop(name, None)
    props[Prop.REAL_TOPIC] = message.topic
    props[Prop.REAL_QUEUE_ID] = str(message.queue_id)
    props[Prop.TRANSACTION_PREPARED] = "true"
    props[Prop.PRODUCER_GROUP] = producer_group
    return MessageToStore(
        topic=TRANS_HALF_TOPIC,
        queue_id=0,
        body=message.body,
        properties=codec.encode_properties(props),
        tags_code=message.tags_code,
        keys=message.keys,
        uniq_key=message.uniq_key,
        flag=message.flag,
        sys_flag=message.sys_flag & SysFlag.COMPRESSED,  # NOT_TYPE: it gets a queue unit
        born_timestamp_ms=message.born_timestamp_ms,
        born_host=message.born_host,
        reconsume_times=message.reconsume_times,
    )


def op_message(txid: str, half_queue_offset: int, state: str, born_ms: int) -> MessageToStore:
    """The op record that makes a half message's fate final."""
    props = {Prop.TAGS: OP_TAG, TRAN_ID: txid, TRAN_STATE: state}
    return MessageToStore(
        topic=TRANS_OP_HALF_TOPIC,
        queue_id=0,
        body=str(half_queue_offset).encode(),
        properties=codec.encode_properties(props),
        tags_code=codec.tags_hash(OP_TAG),
        born_timestamp_ms=born_ms,
    )


def check_times(record: codec.Record) -> int:
    """TRANSACTION_CHECK_TIMES of a half record (0 if absent or malformed)."""
    try:
        return max(0, int(record.properties.get(Prop.TRANSACTION_CHECK_TIMES, "0")))
    except ValueError:
        return 0


def progress(offsets: ConsumerOffsetManager, store: MessageStore, topic: str) -> int:
    """The check service's progress on ``topic`` queue 0 (its min offset if never committed)."""
    committed = offsets.query(CHECK_GROUP, topic, 0)
    return max(committed, int(store.min_offset(topic, 0)))


def walk(store: MessageStore, topic: str, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(queue offset, record bytes) of queue 0 of ``topic`` from ``start`` up to ``end``;
    skips what retention removed."""
    offset = start
    while offset < end:
        got = store.get_messages(topic, 0, offset, READ_BATCH)
        if got.status is not GetStatus.FOUND:
            if got.next_begin_offset <= offset:
                return
            offset = got.next_begin_offset
            continue
        for q, raw in zip(got.queue_offsets, got.records, strict=True):
            if q >= end:
                return
            yield q, raw
        offset = got.next_begin_offset


@dataclass(slots=True)
class TxEntry:
    """What the broker knows of one transaction id."""

    latest_offset: int
    """Half queue offset of its latest copy."""
    decision: str | None = None
    """COMMIT / ROLLBACK / DISCARD once final; None while pending."""


@dataclass(slots=True)
class TransactionIndex:
    """Resolved-state index (see the module docstring) and the transaction counters."""

    entries: dict[str, TxEntry] = field(default_factory=dict)
    ops: deque[tuple[int, int, str]] = field(default_factory=deque)
    """(op queue offset, half queue offset, transaction id) of ops not yet below op progress."""
    checks: int = 0
    discarded: int = 0
    committed: int = 0
    rolled_back: int = 0

    def note_half(self, txid: str, queue_offset: int) -> None:
        """A half copy of ``txid`` was stored at ``queue_offset`` (a send or a re-put)."""
        entry = self.entries.get(txid)
        if entry is None:
            self.entries[txid] = TxEntry(queue_offset)
        elif queue_offset > entry.latest_offset:
            entry.latest_offset = queue_offset

    def decision(self, txid: str) -> str | None:
        entry = self.entries.get(txid)
        return entry.decision if entry is not None else None

    def resolve(self, txid: str, state: str, half_offset: int, op_offset: int) -> None:
        """Record an op (written now, or read back at rebuild)."""
        entry = self.entries.get(txid)
        if entry is None:
            self.entries[txid] = TxEntry(half_offset, state)
        else:
            entry.decision = entry.decision or state
            entry.latest_offset = max(entry.latest_offset, half_offset)
        self.ops.append((op_offset, half_offset, txid))

    def is_final(self, txid: str, half_queue_offset: int, half_progress: int) -> str | None:
        """The decision on ``txid``, "forgotten" for a copy below the progress with no entry
        (final, decision no longer kept), else None (pending)."""
        entry = self.entries.get(txid)
        if entry is not None:
            return entry.decision
        return "forgotten" if half_queue_offset < half_progress else None

    def advance_ops(self, half_progress: int) -> int | None:
        """Forget decided entries whose copies are all below ``half_progress``, in op order;
        the new op progress, or None if it did not move."""
        moved = None
        ops = self.ops
        entries = self.entries
        while ops:
            op_offset, _half, txid = ops[0]
            entry = entries.get(txid)
            if entry is not None:
                if entry.decision is None or entry.latest_offset >= half_progress:
                    break
                del entries[txid]
            ops.popleft()
            moved = op_offset + 1
        return moved

    def pending(self) -> int:
        return sum(1 for e in self.entries.values() if e.decision is None)

    def stats(self) -> dict[str, str]:
        """Counters for GetRuntimeStats.extra."""
        return {
            "transaction_half_pending": str(self.pending()),
            "transaction_checks": str(self.checks),
            "transaction_discarded": str(self.discarded),
        }

    # -- rebuild ---------------------------------------------------------------------------
    def clear(self) -> None:
        self.entries.clear()
        self.ops.clear()

    def load_op(self, q: int, raw: bytes) -> None:
        """Read one op record back (rebuild)."""
        rec = codec.decode_record(raw)
        txid = rec.properties.get(TRAN_ID, "")
        state = rec.properties.get(TRAN_STATE, "")
        try:
            half_offset = int(rec.body.decode())
        except ValueError:
            log.warning("op record at %d has a malformed body %r; ignored", q, rec.body[:32])
            return
        if txid and state in DECISIONS:
            self.resolve(txid, state, half_offset, q)

    def load_half(self, q: int, raw: bytes) -> None:
        txid = codec.decode_record(raw).uniq_key
        if txid:
            self.note_half(txid, q)

    def rebuild(self, store: MessageStore, offsets: ConsumerOffsetManager) -> None:
        """Read the op queue and the half queue from their progress (startup, promotion)."""
        self.clear()
        for q, raw in walk(store, TRANS_OP_HALF_TOPIC, *_bounds(store, offsets, op=True)):
            self.load_op(q, raw)
        for q, raw in walk(store, TRANS_HALF_TOPIC, *_bounds(store, offsets, op=False)):
            self.load_half(q, raw)
        log.info(
            "transaction index: %d pending, %d resolved since the op progress",
            self.pending(),
            len(self.ops),
        )

    async def rebuild_async(self, store: MessageStore, offsets: ConsumerOffsetManager) -> None:
        """:meth:`rebuild` yielding to the event loop every :data:`SCAN_SLICE_MAX` records."""
        self.clear()
        n = 0
        for q, raw in walk(store, TRANS_OP_HALF_TOPIC, *_bounds(store, offsets, op=True)):
            self.load_op(q, raw)
            n += 1
            if n % SCAN_SLICE_MAX == 0:
                await asyncio.sleep(0)
        for q, raw in walk(store, TRANS_HALF_TOPIC, *_bounds(store, offsets, op=False)):
            self.load_half(q, raw)
            n += 1
            if n % SCAN_SLICE_MAX == 0:
                await asyncio.sleep(0)


def _bounds(store: MessageStore, offsets: ConsumerOffsetManager, *, op: bool) -> tuple[int, int]:
    topic = TRANS_OP_HALF_TOPIC if op else TRANS_HALF_TOPIC
    return progress(offsets, store, topic), int(store.max_offset(topic, 0))


def real_queue(record: codec.Record) -> tuple[str, int]:
    """REAL_TOPIC and REAL_QID of a half record (-1 for a malformed queue id)."""
    try:
        queue_id = int(record.properties.get(Prop.REAL_QUEUE_ID, ""))
    except ValueError:
        queue_id = -1
    return record.properties.get(Prop.REAL_TOPIC, ""), queue_id


def producer_view(
    record: codec.Record, *, commitlog_offset: int, queue_offset: int
) -> common_pb2.StoredMessage:
    """A half record as its producer knows it: the real topic and queue (REAL_TOPIC / REAL_QID
    moved back into place), at the half copy ``commitlog_offset`` / ``queue_offset``."""
    topic, queue_id = real_queue(record)
    pb = record_to_pb(record)
    pb.message.topic = topic
    for name in (Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID):
        if name in pb.message.properties:
            del pb.message.properties[name]
    pb.queue_id = max(queue_id, 0)
    pb.queue_offset = queue_offset
    pb.commitlog_offset = commitlog_offset
    pb.offset_msg_id = codec.encode_offset_msg_id(record.store_host, commitlog_offset)
    return pb
