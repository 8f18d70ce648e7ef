"""The message model every RocketQ user touches: what a producer sends, what a consumer gets.

Plain dataclasses, no protobuf types (STYLE.md habit 4). A :class:`Message`'s tags, keys and
delay are stored as record properties — TAGS, KEYS, DELAY — exactly as RocketMQ stores them
(SPEC §11.1), so :meth:`Message.wire_properties` is the one place that folds them in.
"""

from __future__ import annotations

import enum
import itertools
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from rocketq import codec
from rocketq.codec import Prop

#: Highest delay level a client lets through: a broker's messageDelayLevel may define up to 64
#: levels (18 by default, SPEC §8.1; level 1 = 1 s), and the broker refuses a level it lacks.
DELAY_LEVEL_MAX = 64


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker group; sorts by topic, broker name, queue id."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(slots=True)
class Message:
    """A message to send.

    ``keys`` are business keys, indexed for :meth:`Admin.query_by_key`; give one string or
    several. ``tags`` is the one tag consumers filter on. ``delay_level`` 1..18 (the default
    levels; up to 64 on a broker configured with more) delays delivery (SPEC §8.1),
    ``deliver_time_ms`` sets an absolute delivery time (ms since the epoch) and ``delay_ms`` a
    delay from when the broker stores it (all need the timer-wheel service; the send's
    ``msg_id`` is the timer's handle for cancelling). ``properties`` are user
    properties; names RocketQ reserves are refused at send.
    """

    topic: str
    body: bytes
    tags: str = ""
    keys: str | tuple[str, ...] | list[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0
    deliver_time_ms: int = 0
    wait_store_msg_ok: bool = True
    delay_ms: int = 0

    @property
    def key_list(self) -> list[str]:
        if isinstance(self.keys, str):
            return [k for k in self.keys.split(" ") if k]
        return [k for k in self.keys if k]

    def wire_properties(self) -> dict[str, str]:
        """User properties plus TAGS / KEYS / DELAY / TIMER_DELIVER_MS / TIMER_DELAY_MS / WAIT
        as stored."""
        props = dict(self.properties) if self.properties else {}
        if self.tags:
            props[Prop.TAGS] = self.tags
        if self.keys:
            keys = self.key_list
            if keys:
                props[Prop.KEYS] = " ".join(keys)
        if self.delay_level:
            props[Prop.DELAY_LEVEL] = str(self.delay_level)
        if self.deliver_time_ms:
            props[Prop.TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        if self.delay_ms:
            props[Prop.TIMER_DELAY_MS] = str(self.delay_ms)
        if not self.wait_store_msg_ok:
            props[Prop.WAIT_STORE_MSG_OK] = "false"
        return props


@dataclass(slots=True)
class ReceivedMessage:
    """A stored message as a consumer or a query returns it (RocketMQ's ``MessageExt``)."""

    topic: str
    body: bytes
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    offset_msg_id: str
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int = 0
    sys_flag: int = 0
    flag: int = 0
    store_size_bytes: int = 0
    body_crc: int = 0
    prepared_transaction_offset: int = 0
    broker_name: str = ""

    @property
    def tags(self) -> str:
        return self.properties.get(Prop.TAGS, "")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(Prop.KEYS, "").split(" ") if k]

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @classmethod
    def from_record(cls, record: codec.Record, broker_name: str = "") -> ReceivedMessage:
        body = record.body
        if record.sys_flag & codec.SysFlag.COMPRESSED:
            body = zlib.decompress(body)
        offset_msg_id = record.offset_msg_id
        return cls(
            topic=record.topic,
            body=body,
            properties=record.properties,
            queue_id=record.queue_id,
            queue_offset=record.queue_offset,
            commitlog_offset=record.physical_offset,
            msg_id=record.properties.get(Prop.UNIQ_KEY, offset_msg_id),
            offset_msg_id=offset_msg_id,
            born_timestamp_ms=record.born_timestamp_ms,
            store_timestamp_ms=record.store_timestamp_ms,
            born_host=str(record.born_host),
            store_host=str(record.store_host),
            reconsume_times=record.reconsume_times,
            sys_flag=record.sys_flag,
            flag=record.flag,
            store_size_bytes=record.total_size,
            body_crc=record.body_crc,
            prepared_transaction_offset=record.prepared_transaction_offset,
            broker_name=broker_name,
        )


def decode_records(buf: bytes, broker_name: str = "") -> list[ReceivedMessage]:
    """Decode a Pull response's concatenated records (CRC-checked): one object per message,
    built positionally (the consumer's hot loop; :meth:`ReceivedMessage.from_record` is the
    readable equivalent)."""
    out: list[ReceivedMessage] = []
    host_text, offset_msg_id_of = codec.host_text, codec.offset_msg_id_of
    compressed, uniq_key = codec.SysFlag.COMPRESSED, Prop.UNIQ_KEY
    for f, stored, topic, props, total in codec.iter_record_parts(buf):
        # f: TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORN
        #    born-ip born-port STORE store-ip store-port RECONSUMETIMES PREPARED-TX-OFFSET
        sys_flag = f[7]
        body = zlib.decompress(stored) if sys_flag & compressed else stored
        offset_msg_id = offset_msg_id_of(f[12], f[13], f[6])
        out.append(
            ReceivedMessage(
                topic, body, props, f[3], f[5], f[6], props.get(uniq_key, offset_msg_id),
                offset_msg_id, f[8], f[11], host_text(f[9], f[10]), host_text(f[12], f[13]),
                f[14], sys_flag, f[4], total, f[2], f[15], broker_name,
            )
        )  # fmt: skip
    return out


class SendStatus(enum.Enum):
    """How durable a stored message is (SPEC §5.2). Anything but SEND_OK is still stored."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message was stored."""

    status: SendStatus
    msg_id: str
    """Unique id (UNIQ_KEY), the same across producer retries."""
    offset_msg_id: str
    """Store host + commitlog offset; new on every store."""
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str = ""


_SEND_RESULT_SETTERS = tuple(
    SendResult.__dict__[name].__set__
    for name in (
        "status", "msg_id", "offset_msg_id", "message_queue", "queue_offset", "transaction_id",
    )
)  # fmt: skip
assert [f.name for f in fields(SendResult)] == [
    "status", "msg_id", "offset_msg_id", "message_queue", "queue_offset", "transaction_id",
], "send_result() fills SendResult's fields by position"  # fmt: skip


def send_result(
    status: SendStatus,
    msg_id: str,
    offset_msg_id: str,
    message_queue: MessageQueue,
    queue_offset: int,
    transaction_id: str = "",
) -> SendResult:
    """``SendResult(...)``, equal to it, at a quarter of the cost: a frozen dataclass's
    ``__init__`` assigns each field through ``object.__setattr__``, and a producer makes one
    result per sent message. The slots are filled through their descriptors instead."""
    result = object.__new__(SendResult)
    s_status, s_msg_id, s_offset_msg_id, s_queue, s_offset, s_tx = _SEND_RESULT_SETTERS
    s_status(result, status)
    s_msg_id(result, msg_id)
    s_offset_msg_id(result, offset_msg_id)
    s_queue(result, message_queue)
    s_offset(result, queue_offset)
    s_tx(result, transaction_id)
    return result


# ---- unique message ids -------------------------------------------------------------------
# RocketMQ's MessageClientIDSetter layout, 16 bytes as 32 hex characters:
# | ip (4) | pid (2) | class-loader hash (4) | ms since month start (4) | counter (2) |
# The third field has no meaning in Python; a per-process random value keeps ids of two
# processes with a recycled pid apart. The first 10 bytes are fixed per process, so they are
# kept as hex text and each id only formats its time and counter (a send of 128 messages
# made 128 ids: struct packing, hex() and upper() of each were a tenth of the producer's CPU).
# ``next()`` of an itertools.count is atomic under the GIL, so no lock is taken per id.
_uniq_prefix_hex = ""
_uniq_counter = itertools.count(1)
_uniq_lock = threading.Lock()


def _local_ipv4() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return b"\x7f\x00\x00\x01"


def _month_start_ms(now_ms: int) -> int:
    t = time.gmtime(now_ms / 1000)
    return int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) * 1000)


_month_start = 0
_month_end = 0


def _forget_prefix() -> None:
    # A forked child has another pid, so its ids get a prefix of their own.
    global _uniq_prefix_hex, _uniq_lock
    _uniq_prefix_hex = ""
    _uniq_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_prefix)


def _uniq_head(now_ms: int) -> str:
    """The first 28 hex characters of an id made at ``now_ms``: prefix and time."""
    global _uniq_prefix_hex, _month_start, _month_end
    if not _uniq_prefix_hex or now_ms >= _month_end:
        with _uniq_lock:
            if not _uniq_prefix_hex:
                raw = _local_ipv4() + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
                _uniq_prefix_hex = raw.hex().upper()
            if now_ms >= _month_end:
                _month_start = _month_start_ms(now_ms)
                _month_end = _month_start + 31 * 24 * 3600 * 1000
    return f"{_uniq_prefix_hex}{(now_ms - _month_start) & 0x7FFFFFFF:08X}"


def new_unique_id() -> str:
    """A new UNIQ_KEY: 32 upper-case hex characters, unique across processes and time."""
    return f"{_uniq_head(time.time_ns() // 1_000_000)}{next(_uniq_counter) & 0xFFFF:04X}"


def new_unique_ids(count: int) -> list[str]:
    """``count`` new UNIQ_KEYs made at one instant (a batch's), as :func:`new_unique_id`."""
    head = _uniq_head(time.time_ns() // 1_000_000)
    counter = _uniq_counter
    return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(count)]


RESERVED_PROPERTIES = frozenset(
    {
        Prop.UNIQ_KEY,
        Prop.REAL_TOPIC,
        Prop.REAL_QUEUE_ID,
        Prop.RETRY_TOPIC,
        Prop.ORIGIN_MESSAGE_ID,
        Prop.RECONSUME_TIME,
        Prop.MAX_RECONSUME_TIMES,
        Prop.MIN_OFFSET,
        Prop.MAX_OFFSET,
        Prop.TRANSACTION_PREPARED,
        Prop.PRODUCER_GROUP,
    }
)


def check_user_properties(props: Mapping[str, str] | Iterable[str]) -> None:
    """Refuse reserved names and the two separator characters the record encoding uses."""
    if not props:
        return
    if isinstance(props, Mapping):
        for name, value in props.items():
            if name in RESERVED_PROPERTIES:
                raise ValueError(f"property {name!r} is reserved for RocketQ; choose another name")
            check_property_text(name, value)
        return
    for name in props:
        if name in RESERVED_PROPERTIES:
            raise ValueError(f"property {name!r} is reserved for RocketQ; choose another name")
        check_property_text(name, "")


def check_property_text(name: str, value: str) -> None:
    """Refuse a property whose name or value holds a separator character of the encoding."""
    if (
        _NAME_VALUE_SEPARATOR in name
        or _PROPERTY_SEPARATOR in name
        or _NAME_VALUE_SEPARATOR in value
        or _PROPERTY_SEPARATOR in value
    ):
        raise ValueError(
            f"property {name!r} contains U+0001 or U+0002, which the record encoding "
            "reserves; remove them"
        )


_NAME_VALUE_SEPARATOR = codec.NAME_VALUE_SEPARATOR
_PROPERTY_SEPARATOR = codec.PROPERTY_SEPARATOR
