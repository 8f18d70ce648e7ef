"""The message model every RocketQ user touches: what a producer sends, what a consumer gets.

Plain dataclasses, no protobuf types (STYLE.md habit 4). A :class:`Message`'s tags, keys and
delay are stored as record properties — TAGS, KEYS, DELAY — exactly as RocketMQ stores them
(SPEC §11.1), so :meth:`Message.wire_properties` is the one place that folds them in.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rocketq import codec
from rocketq.codec import Prop
from rocketq.properties import find_property

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


@dataclass(slots=True, eq=False)
class ReceivedMessage:
    """A stored message as a consumer or a query returns it (RocketMQ's ``MessageExt``).

    Pulled messages are decoded lazily (issue 16): :func:`decode_records` checks every record
    and fills the fields a consumer needs per message (topic, body, queue and offsets, flags,
    CRC, size); the properties, message ids, hosts, timestamps, reconsume count and prepared
    transaction offset are read from the pulled buffer the first time one is asked for. The
    message is the same either way: same type, same fields, same values, equal (``==``) to the
    eager decode, and every field can be assigned.
    """

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
        return self.get_property(Prop.TAGS) or ""

    @property
    def keys(self) -> list[str]:
        return [k for k in (self.get_property(Prop.KEYS) or "").split(" ") if k]

    def get_property(self, name: str) -> str | None:
        """``properties.get(name)``; a pulled message whose properties were not read yet
        finds this one in its record without decoding the others."""
        return self.properties.get(name)

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _RECEIVED_FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: unhashable

    @classmethod
    def from_record(cls, record: codec.Record, broker_name: str = "") -> ReceivedMessage:
        body = record.body
        if record.sys_flag & codec.SysFlag.COMPRESSED:
            body = inflate(body, record.physical_offset)
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


def inflate(body: bytes, at: int) -> bytes:
    """The body of a record flagged COMPRESSED; a body that does not inflate is a corrupt
    record (``at``: where it is, for the message), as a CRC mismatch is."""
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        raise codec.CorruptRecord(
            f"at {at}: body flagged compressed does not inflate: {exc}"
        ) from None


_RECEIVED_FIELDS = tuple(f.name for f in dataclasses.fields(ReceivedMessage))
_SLOT = {name: ReceivedMessage.__dict__[name] for name in _RECEIVED_FIELDS}
"""The slot descriptor of each field: a lazy message's property reads and writes through it."""
_GET_PROPERTIES = _SLOT["properties"].__get__
_SET_PROPERTIES = _SLOT["properties"].__set__
_FIXED_FIELDS = (
    "born_timestamp_ms",
    "store_timestamp_ms",
    "born_host",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "offset_msg_id",
)
"""A pulled message's fields read from its record's fixed part, all at once (``_fill_fixed``)."""
(
    _SET_BORN_MS,
    _SET_STORE_MS,
    _SET_BORN_HOST,
    _SET_STORE_HOST,
    _SET_RECONSUME,
    _SET_PREPARED,
    _SET_OFFSET_MSG_ID,
) = (_SLOT[name].__set__ for name in _FIXED_FIELDS)
_SET_MSG_ID = _SLOT["msg_id"].__set__
_PROPERTIES_READ: dict[str, str] = {}
"""A pulled message's ``_extra`` once its properties are in their slot (decoded or assigned):
asking for a property then costs a test, where an unset slot would raise AttributeError."""


class _PulledMessage(ReceivedMessage):
    """A :class:`ReceivedMessage` from :func:`decode_records` whose rarely used fields stay in
    the pulled buffer until first read (then they live in the field's own slot, as in an eager
    message: a value assigned before the first read is simply kept)."""

    __slots__ = ("_buf", "_extra", "_pos")
    _buf: bytes
    _pos: int
    _extra: dict[str, str] | None
    """The pull's extra properties until the message's own are read, then _PROPERTIES_READ."""

    def __repr__(self) -> str:
        return "ReceivedMessage" + ReceivedMessage.__repr__(self).removeprefix("_PulledMessage")

    def __reduce__(self) -> tuple[Any, ...]:
        # Copied or pickled as the plain message it is, without the pulled buffer.
        return (ReceivedMessage, self._values())

    def _fill_fixed(self) -> None:
        born_ms, born_ip, born_port, store_ms, store_ip, store_port, reconsume, prepared = (
            codec.record_host_fields(self._buf, self._pos, self.sys_flag)
        )
        # All seven are unset here: a lazy field's write fills them first (see _lazy_field).
        _SET_BORN_MS(self, born_ms)
        _SET_STORE_MS(self, store_ms)
        _SET_BORN_HOST(self, codec.host_text(born_ip, born_port))
        _SET_STORE_HOST(self, codec.host_text(store_ip, store_port))
        _SET_RECONSUME(self, reconsume)
        _SET_PREPARED(self, prepared)
        _SET_OFFSET_MSG_ID(
            self, codec.offset_msg_id_of(store_ip, store_port, self.commitlog_offset)
        )

    def _fill_properties(self) -> None:
        _, _, _, _, props_at = codec.record_spans(
            self._buf, self._pos, self.store_size_bytes, self.sys_flag
        )
        props = codec.decode_properties(self._buf[props_at : self._pos + self.store_size_bytes])
        if self._extra:
            props.update(self._extra)
        _SET_PROPERTIES(self, props)
        self._extra = _PROPERTIES_READ

    def _fill_msg_id(self) -> None:
        uniq = self.get_property(Prop.UNIQ_KEY)
        _SET_MSG_ID(self, uniq if uniq is not None else self.offset_msg_id)

    def get_property(self, name: str) -> str | None:
        extra = self._extra
        if extra is _PROPERTIES_READ:
            return _GET_PROPERTIES(self, None).get(name)  # type: ignore[no-any-return]
        if extra and name in extra:  # the extras win, as in _fill_properties
            return extra[name]
        _, _, _, _, props_at = codec.record_spans(
            self._buf, self._pos, self.store_size_bytes, self.sys_flag
        )
        return find_property(self._buf, props_at, self._pos + self.store_size_bytes, name)


def _read_properties(self: _PulledMessage) -> dict[str, str]:
    if self._extra is not _PROPERTIES_READ:
        self._fill_properties()
    return _GET_PROPERTIES(self, None)  # type: ignore[no-any-return]


def _write_properties(self: _PulledMessage, value: dict[str, str]) -> None:
    _SET_PROPERTIES(self, value)
    self._extra = _PROPERTIES_READ


def _lazy_field(name: str, fill: Callable[[_PulledMessage], None]) -> property:
    """A field read from the pulled record by ``fill``, which sets every field of its group
    at once. The fields of a group are all set or all unset, so a fill sets them without
    asking which: a write to an unset field fills its group first, then replaces the value."""
    get, put = _SLOT[name].__get__, _SLOT[name].__set__

    def read(self: _PulledMessage) -> Any:
        try:
            return get(self, None)
        except AttributeError:
            fill(self)
            return get(self, None)

    def write(self: _PulledMessage, value: Any) -> None:
        try:
            get(self, None)
        except AttributeError:
            fill(self)
        put(self, value)

    return property(read, write, doc=f"``{name}``, read from the pulled record when first asked")


for _name in _FIXED_FIELDS:
    setattr(_PulledMessage, _name, _lazy_field(_name, _PulledMessage._fill_fixed))
_PulledMessage.properties = property(  # type: ignore[assignment]
    _read_properties, _write_properties, doc="``properties``, decoded when first asked"
)
_PulledMessage.msg_id = _lazy_field("msg_id", _PulledMessage._fill_msg_id)  # type: ignore[assignment]
del _name


def decode_records(
    buf: bytes | bytearray | memoryview,
    broker_name: str = "",
    extra_properties: dict[str, str] | None = None,
) -> list[ReceivedMessage]:
    """Decode a Pull response's concatenated records: one message per record.

    Every record is checked here, all of it (magic, sizes, CRC, topic; a problem raises
    :class:`~rocketq.codec.CorruptRecord`), but only the fields a consumer needs per message are
    built; the rest are read from ``buf`` when first asked for (see :class:`ReceivedMessage`).
    ``extra_properties`` (shared, not copied: do not change it afterwards) are added to each
    message's properties, as a push consumer stamps MIN_OFFSET and MAX_OFFSET.

    The consumer's hot loop (issue 16), so it is written out here: a record with IPv4 hosts
    whose topic is the previous record's (all of a pull, usually) is checked from two unpacks
    (:data:`~rocketq.codec.PULLED_HEAD_V4` and :func:`~rocketq.codec.pulled_tail_struct`: its
    topic's length byte and bytes, its properties' length); any other record, or one that
    fails a check there, goes through :func:`~rocketq.codec.pulled_record_parts`, which names
    what is wrong. The body CRC is checked for every record (isal's CRC32: 0.2 µs per KiB).
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    out: list[ReceivedMessage] = []
    append = out.append
    new = _PulledMessage.__new__
    cls = _PulledMessage
    compressed = codec.SysFlag.COMPRESSED
    unpack_head = codec.PULLED_HEAD_V4.unpack_from
    head_size = codec.PULLED_HEAD_V4.size
    after_topic = codec.PULLED_AFTER_TOPIC_BYTES
    v6_bits = codec.HOST_V6_BITS
    magic = codec.MESSAGE_MAGIC
    crc32 = codec.crc32
    tail = b""  # the previous record's TOPIC length byte and TOPIC; empty: none yet
    unpack_tail = codec.pulled_tail_struct(tail).unpack_from  # that tail, then PROPERTIES' length
    topic = ""
    pos = 0
    end = len(buf)
    while pos < end:
        # f: TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG [BODY len]
        f = unpack_head(buf, pos) if end - pos >= head_size else None
        if f is not None:
            rec_end = pos + f[0]
            body_at = pos + head_size
            body_end = body_at + f[8]
            props_at = body_end + len(tail) + after_topic
            # Each bound is checked before the bytes it guards are read.
            if (
                not tail
                or f[1] != magic
                or f[7] & v6_bits
                or rec_end > end
                or f[8] < 0
                or props_at > rec_end
            ):
                f = None
            else:
                same_tail, props_len = unpack_tail(buf, body_end)
                if same_tail != tail or props_at + props_len != rec_end:
                    f = None
        if f is None:
            f, body_at, body_end, topic_at, topic_end = codec.pulled_record_parts(buf, pos)
            rec_end = pos + f[0]
            if buf[topic_at - 1 : topic_end] != tail:
                try:
                    topic = buf[topic_at:topic_end].decode()
                except UnicodeDecodeError:
                    raise codec.CorruptRecord(f"at {pos}: topic is not UTF-8") from None
                tail = buf[topic_at - 1 : topic_end]
                unpack_tail = codec.pulled_tail_struct(tail).unpack_from
        body = buf[body_at:body_end]
        if crc32(body) & 0x7FFFFFFF != f[2]:
            raise codec.CorruptRecord(
                f"at {pos}: body CRC mismatch (stored {f[2]}, computed {codec.body_crc(body)})"
            )
        m = new(cls)
        m._buf = buf
        m._pos = pos
        m._extra = extra_properties
        m.topic = topic
        m.body = inflate(body, pos) if f[7] & compressed else body
        m.queue_id = f[3]
        m.queue_offset = f[5]
        m.commitlog_offset = f[6]
        m.sys_flag = f[7]
        m.flag = f[4]
        m.store_size_bytes = f[0]
        m.body_crc = f[2]
        m.broker_name = broker_name
        append(m)
        pos = rec_end
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
