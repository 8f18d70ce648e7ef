"""Message queries: by business key, by unique id, by offset message id (SPEC §7, §4.7).

| RPC               | lookup                                                 | no match          |
|-------------------|--------------------------------------------------------|-------------------|
| QueryMessageByKey | index file, key ``topic#key``; keep records whose KEYS | empty list        |
|                   | property holds the key (the index is a hash index)     |                   |
| QueryMessageById  | the same index (the store indexes UNIQ_KEY as a key);  | NOT_FOUND         |
|                   | keep records whose UNIQ_KEY equals the id              | MESSAGE_NOT_FOUND |
| ViewMessage       | decode the offset id (store host + commitlog offset)   | NOT_FOUND         |
|                   | and read the record there                              | MESSAGE_NOT_FOUND |

Results are newest first. :func:`record_to_pb` is the one place a stored record becomes a
``StoredMessage`` (decoded pulls use it too); bodies the producer compressed (SYSFLAG 0x1) are
inflated, with a ceiling so a hostile record cannot inflate without bound.
"""

from __future__ import annotations

import zlib

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.validation import check_topic
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import invalid, not_found
from services.store.message_store import MessageStore

QUERY_MAX_NUM_DEFAULT = 32
QUERY_MAX_NUM_MAX = 64
UNIQUE_ID_HEX_CHARS = 32
INFLATED_BODY_MAX_BYTES = 64 * 1024 * 1024
"""A compressed body is never inflated beyond this (the largest maxMessageSize allowed)."""
_BY_ID_SCAN_MAX = 64
"""Index candidates read for one unique id (a producer retry may store it a few times)."""


def record_to_pb(rec: codec.Record) -> common_pb2.StoredMessage:
    """A decoded commitlog record as the wire's ``StoredMessage``, body uncompressed."""
    body = rec.body
    if rec.sys_flag & codec.SysFlag.COMPRESSED:
        body = _inflate(body)
    offset_msg_id = rec.offset_msg_id
    return common_pb2.StoredMessage(
        message=common_pb2.Message(
            topic=rec.topic, flag=rec.flag, body=body, properties=rec.properties
        ),
        msg_id=rec.properties.get(codec.Prop.UNIQ_KEY) or offset_msg_id,
        offset_msg_id=offset_msg_id,
        queue_id=rec.queue_id,
        queue_offset=rec.queue_offset,
        commitlog_offset=rec.physical_offset,
        store_size_bytes=rec.total_size,
        body_crc=rec.body_crc,
        sys_flag=rec.sys_flag,
        born_timestamp_ms=rec.born_timestamp_ms,
        born_host=str(rec.born_host),
        store_timestamp_ms=rec.store_timestamp_ms,
        store_host=str(rec.store_host),
        reconsume_times=rec.reconsume_times,
        prepared_transaction_offset=rec.prepared_transaction_offset,
    )


def _inflate(body: bytes) -> bytes:
    """zlib-inflate a compressed body; a body that does not inflate is returned as stored."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, INFLATED_BODY_MAX_BYTES)
    except zlib.error:
        return body
    if inflater.unconsumed_tail:
        return body  # larger than any message may be: not a body RocketQ compressed
    return out


def _newest_first(records: list[codec.Record]) -> list[codec.Record]:
    return sorted(records, key=lambda r: (r.store_timestamp_ms, r.physical_offset), reverse=True)


class QueryProcessor:
    """Answers the three query RPCs from the store's index and commitlog."""

    def __init__(
        self, *, store: MessageStore, topics: TopicConfigManager, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.store = store
        self.topics = topics
        self.clock = clock

    def _known_topic(self, topic: str) -> None:
        try:
            check_topic(topic)
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
        if self.topics.get(topic) is None:
            not_found(common_pb2.TOPIC_NOT_EXIST, f"topic {topic} does not exist", topic=topic)

    def by_key(
        self, req: messaging_pb2.QueryMessageByKeyRequest
    ) -> messaging_pb2.QueryMessageByKeyResponse:
        if not req.key:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "key is empty; give one business key")
        if " " in req.key:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"key {req.key!r} contains a space; keys are indexed one word at a time",
            )
        max_num = req.max_num if req.HasField("max_num") else QUERY_MAX_NUM_DEFAULT
        if not 1 <= max_num <= QUERY_MAX_NUM_MAX:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"max_num {max_num} is outside 1..{QUERY_MAX_NUM_MAX}",
            )
        begin = req.begin_timestamp_ms
        end = req.end_timestamp_ms if req.HasField("end_timestamp_ms") else self.clock.now_ms()
        if begin < 0 or end < begin:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"time range [{begin}, {end}] is empty or negative; end must not precede begin",
            )
        self._known_topic(req.topic)
        records = self.store.query_by_key(req.topic, req.key, max_num, begin, end)
        # The store also accepts a UNIQ_KEY match (one index serves both); here only KEYS count.
        matches = [r for r in records if req.key in r.keys.split(" ")]
        return messaging_pb2.QueryMessageByKeyResponse(
            messages=[record_to_pb(r) for r in _newest_first(matches)]
        )

    def by_id(
        self, req: messaging_pb2.QueryMessageByIdRequest
    ) -> messaging_pb2.QueryMessageByIdResponse:
        msg_id = req.msg_id
        if len(msg_id) != UNIQUE_ID_HEX_CHARS or not _is_hex(msg_id):
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"message id {msg_id!r} is not {UNIQUE_ID_HEX_CHARS} hexadecimal characters",
            )
        self._known_topic(req.topic)
        now = self.clock.now_ms()
        records = self.store.query_by_key(req.topic, msg_id, _BY_ID_SCAN_MAX, 0, now)
        # Clients write ids in upper case; compare without case so a lower-case id still finds it.
        wanted = msg_id.upper()
        matches = [r for r in records if r.uniq_key.upper() == wanted]
        if not matches and msg_id != wanted:
            records = self.store.query_by_key(req.topic, wanted, _BY_ID_SCAN_MAX, 0, now)
            matches = [r for r in records if r.uniq_key.upper() == wanted]
        if not matches:
            not_found(
                common_pb2.MESSAGE_NOT_FOUND,
                f"no message with id {msg_id} in topic {req.topic} (it may have expired, or "
                "the broker's messageIndexEnable is off)",
                topic=req.topic,
                msg_id=msg_id,
            )
        return messaging_pb2.QueryMessageByIdResponse(
            messages=[record_to_pb(r) for r in _newest_first(matches)]
        )

    def view(self, req: messaging_pb2.ViewMessageRequest) -> messaging_pb2.ViewMessageResponse:
        try:
            _host, offset = codec.decode_offset_msg_id(req.offset_msg_id)
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"malformed offset message id: {exc}")
        if offset < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"offset message id encodes offset {offset} < 0")
        try:
            rec = self.store.read_record(offset)
        except codec.CorruptRecord:
            rec = None  # an offset inside a record, not at its start
        if rec is None:
            not_found(
                common_pb2.MESSAGE_NOT_FOUND,
                f"no message at commitlog offset {offset} on this broker (never stored here, "
                "or removed by retention)",
                offset_msg_id=req.offset_msg_id,
            )
        return messaging_pb2.ViewMessageResponse(message=record_to_pb(rec))


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
