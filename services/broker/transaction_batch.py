"""Batch half messages: one transactional half message that commits many messages at once.

Why: a producer that must make many messages visible atomically (the Spark sink,
rocketq.spark.sink) would otherwise pay one half message and one EndTransaction per message.
RocketMQ has no batch transaction; this is RocketQ's, kept to two hooks (send and commit).

A half message (SYSFLAG 0x4, TRAN_MSG) that carries ``TRAN_BATCH = n`` has, as its body, ``n``
records in the sent-batch format of ``SendRequest.records`` (send_records.py), all of the half
message's own topic. Checked when the half is sent, so its commit cannot fail on its content:

| refusal (INVALID_ARGUMENT, nothing stored)                                       |
|----------------------------------------------------------------------------------|
| TRAN_BATCH not a number 1..BATCH_RECORDS_MAX, or not the number of records       |
| the half message itself compressed (send the batch uncompressed; records may be) |
| a record that send_records.parse refuses (sizes, magic, CRC, topic, properties)  |
| a record of another topic than the half message's                               |
| a record without UNIQ_KEY, or with a property RocketQ reserves (not the delays)  |
| a record's delay (DELAY / TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC)   |
| that the send path would refuse (malformed, two of them, beyond timerMaxDelaySec)|

A delayed record is allowed here, unlike a delayed transactional message (which the send path
refuses, as RocketMQ does): its delay is evaluated at the COMMIT, so ``TIMER_DELAY_MS`` counts
from the moment the transaction commits and ``TIMER_DELIVER_MS`` is a time that is not delivered
before. COMMIT (:func:`committed_batch`) stores every record as a message of the real topic and
queue, or, when delayed into the future, of the timer topic (as a delayed send would), together
with the op record in ONE append (transaction_end.py): all of them, or none. ROLLBACK, check-backs,
discards and the index are the same as for any half message: the batch is one transaction.
"""

from __future__ import annotations

import logging

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.message import RESERVED_PROPERTIES
from rocketq.validation import TIMER_TOPIC, is_writeable
from services.broker.config import BrokerConfig
from services.broker.send_records import BadBatch, ParsedBatch, parse
from services.broker.timer_put import (
    DELAY_PROPERTIES,
    DelayError,
    delivery_ms,
    ensure_timer_topic,
    timer_properties,
    timer_queue_id,
)
from services.broker.topic_config_manager import TopicConfigManager
from services.common.errors import denied, invalid
from services.store.commitlog import MessageToStore

log = logging.getLogger(__name__)

BATCH_RECORDS_MAX = 65_536
"""Records one batch half message may hold (maxMessageSize bounds it first in practice)."""
_FORBIDDEN_IN_RECORD = (RESERVED_PROPERTIES - {Prop.UNIQ_KEY}) | {
    Prop.TRANSACTION_BATCH,
    Prop.TRANSACTION_CHECK_TIMES,
    Prop.CHECK_IMMUNITY_TIME_IN_SECONDS,
    Prop.TIMER_SOURCE,
    Prop.TIMER_DEL_UNIQKEY,
    Prop.TIMER_OUT_MS,
}


def check_batch_half(
    props: dict[str, str],
    body: bytes,
    sys_flag: int,
    topic: str,
    *,
    now_ms: int,
    config: BrokerConfig,
) -> None:
    """Refuse (INVALID_ARGUMENT) a batch half message its commit could not store (see the
    module docstring)."""
    text = props.get(Prop.TRANSACTION_BATCH, "")
    try:
        count = int(text)
    except ValueError:
        count = -1
    if not 1 <= count <= BATCH_RECORDS_MAX:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"{Prop.TRANSACTION_BATCH}={text!r}: a batch half message gives how many records its "
            f"body holds, 1..{BATCH_RECORDS_MAX}",
            topic=topic,
        )
    if sys_flag & SysFlag.COMPRESSED:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            "a batch half message must not be compressed as a whole (its records may be); send "
            "it without the compressed flag",
            topic=topic,
        )
    batch = _parsed(body, topic)
    if len(batch.records) != count:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"{Prop.TRANSACTION_BATCH}={count} but the body holds {len(batch.records)} records",
            topic=topic,
        )
    if batch.topic != topic:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"the records are for topic {batch.topic!r}, the half message for {topic!r}; a "
            "batch half message holds records of its own topic",
            topic=topic,
        )
    levels_ms = config.delay_levels_ms()
    max_delay_ms = config.timer_max_delay_sec * 1000
    for i, r in enumerate(batch.records):
        if not r.props.get(Prop.UNIQ_KEY):
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"record {i} has no UNIQ_KEY; give each one",
                topic=topic,
            )
        bad = sorted(_FORBIDDEN_IN_RECORD.intersection(r.props))
        if bad:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"record {i} sets {', '.join(bad)}, which RocketQ sets itself",
                topic=topic,
            )
        try:
            delivery_ms(r.props, now_ms=now_ms, levels_ms=levels_ms, max_delay_ms=max_delay_ms)
        except DelayError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"record {i}: {exc}", topic=topic)


def _parsed(body: bytes, topic: str) -> ParsedBatch:
    try:
        return parse(body)
    except BadBatch as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"batch half message body: {exc}", topic=topic)


def committed_batch(
    half: codec.Record,
    topic: str,
    queue_id: int,
    *,
    now_ms: int,
    config: BrokerConfig,
    topics: TopicConfigManager,
) -> list[MessageToStore]:
    """The messages the commit of batch half ``half`` stores, in record order: each in
    ``topic``/``queue_id``, or in the timer topic when its delay (counted from ``now_ms``) is
    still ahead. PERMISSION_DENIED (nothing stored, the half stays pending) when a record is
    delayed and the timer topic is not writable."""
    body = half.body
    batch = _parsed(body, topic)  # checked when the half was sent; parse is the cheap check
    group = half.properties.get(Prop.PRODUCER_GROUP, "")
    levels_ms = config.delay_levels_ms()
    max_delay_ms = config.timer_max_delay_sec * 1000
    out: list[MessageToStore] = []
    for r in batch.records:
        props = dict(r.props)
        to_topic, to_qid = topic, queue_id
        if not DELAY_PROPERTIES_SET.isdisjoint(props):
            out_ms = _commit_delivery_ms(props, now_ms, levels_ms, max_delay_ms, half)
            if out_ms is None or out_ms <= now_ms:
                for name in DELAY_PROPERTIES:
                    props.pop(name, None)
            else:
                timer_cfg = ensure_timer_topic(topics, config)
                if not is_writeable(timer_cfg.perm) or timer_cfg.write_queue_nums < 1:
                    denied(
                        f"timer topic {TIMER_TOPIC} is not writable (perm {timer_cfg.perm}); "
                        "the batch holds delayed messages and cannot be committed now",
                        topic=topic,
                    )
                uniq = props[Prop.UNIQ_KEY]
                props = timer_properties(props, real_topic=topic, real_qid=queue_id, out_ms=out_ms)
                to_topic = TIMER_TOPIC
                to_qid = timer_queue_id(uniq, timer_cfg.write_queue_nums)
        if group:
            props[Prop.PRODUCER_GROUP] = group
        out.append(
            MessageToStore(
                topic=to_topic,
                queue_id=to_qid,
                body=body[r.body_at : r.body_end],
                properties=codec.encode_properties(props),
                tags_code=codec.tags_hash(props.get(Prop.TAGS, "")),
                keys=props.get(Prop.KEYS, ""),
                uniq_key=props[Prop.UNIQ_KEY],
                flag=r.flag,
                sys_flag=SysFlag.TRANSACTION_COMMIT | (r.sys_flag & SysFlag.COMPRESSED),
                born_timestamp_ms=r.born_timestamp_ms,
                born_host=half.born_host,
                reconsume_times=0,
                prepared_transaction_offset=half.physical_offset,
            )
        )
    return out


DELAY_PROPERTIES_SET = frozenset(DELAY_PROPERTIES)


def _commit_delivery_ms(
    props: dict[str, str], now_ms: int, levels_ms: list[int], max_delay_ms: int, half: codec.Record
) -> int | None:
    try:
        return delivery_ms(props, now_ms=now_ms, levels_ms=levels_ms, max_delay_ms=max_delay_ms)
    except DelayError as exc:
        # Checked when the half was sent; only a config change since (fewer delay levels, a
        # lower timerMaxDelaySec) gets here. Refusing would leave the transaction to be
        # discarded, losing a committed message: deliver it now instead, and say so.
        log.warning(
            "batch half %s: a record's delay is no longer valid (%s); delivered now",
            half.uniq_key,
            exc,
        )
        return None
