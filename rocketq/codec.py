"""The commitlog record codec: bytes in, bytes out, shared by the broker's store and the client.

A pulled message travels as the very bytes the broker stored (DESIGN.md §3), so the client
decodes with this same module. The layout is RocketMQ 4.x's v1 record (SPEC §11.1), big-endian:

| #  | field                       | bytes            | notes                                   |
|----|-----------------------------|------------------|-----------------------------------------|
| 1  | TOTALSIZE                   | 4                | whole record, this field included        |
| 2  | MAGICCODE                   | 4                | 0xDAA320A7 message, 0xCBD43194 blank     |
| 3  | BODYCRC                     | 4                | CRC32(body) & 0x7FFFFFFF                 |
| 4  | QUEUEID                     | 4                |                                          |
| 5  | FLAG                        | 4                | the user's flag                          |
| 6  | QUEUEOFFSET                 | 8                | logical offset in the consume queue      |
| 7  | PHYSICALOFFSET              | 8                | this record's commitlog offset           |
| 8  | SYSFLAG                     | 4                | see ``SysFlag``                          |
| 9  | BORNTIMESTAMP               | 8                | ms                                       |
| 10 | BORNHOST                    | 4+4 or 16+4      | IPv6 when SysFlag.BORNHOST_V6            |
| 11 | STORETIMESTAMP              | 8                | ms                                       |
| 12 | STOREHOSTADDRESS            | 4+4 or 16+4      | IPv6 when SysFlag.STOREHOST_V6           |
| 13 | RECONSUMETIMES              | 4                |                                          |
| 14 | PREPARED TRANSACTION OFFSET | 8                |                                          |
| 15 | BODY                        | 4 + n            | length, then bytes                       |
| 16 | TOPIC                       | 1 + n            | length, then UTF-8 (≤ 127 bytes)         |
| 17 | PROPERTIES                  | 2 + n            | ``name\\x01value\\x02`` repeated          |

A BLANK record fills the tail of a commitlog file that cannot hold the next record: TOTALSIZE
(the bytes left in the file) and the blank magic, nothing else is meaningful.

The fixed part (fields 1–14) is one ``struct.Struct`` per host-address family; the whole record
(fixed part and the three variable fields) is packed by one cached ``Struct`` per combination of
lengths, so encoding a message is a single C call.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from rocketq.java_hash import java_string_hash

MESSAGE_MAGIC = 0xDAA320A7
"""0xAABBCCDD ^ (1880681586 + 8), as RocketMQ derives it (SPEC §4.5)."""
BLANK_MAGIC = 0xCBD43194
"""0xBBCCDDEE ^ (1880681586 + 8): the end-of-file filler."""
assert MESSAGE_MAGIC == (0xAABBCCDD ^ (1880681586 + 8)) & 0xFFFFFFFF
assert BLANK_MAGIC == (0xBBCCDDEE ^ (1880681586 + 8)) & 0xFFFFFFFF

END_FILE_MIN_BLANK_BYTES = 8
"""A file always keeps room for a blank record's TOTALSIZE + MAGIC."""

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

TOPIC_MAX_BYTES = 127
"""The topic length is one signed byte; RocketMQ also caps topic names at 127 characters."""
PROPERTIES_MAX_BYTES = 32767
"""The properties length is a signed 16-bit field."""


class SysFlag:
    """Bits of the SYSFLAG field."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20


class Prop:
    """Names of the system properties the store and clients read (RocketMQ's spelling)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_LEVEL = "DELAY"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    """On a half message: how many times the broker has checked it back so far."""
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    """On a transactional message: seconds before the first check-back (else transactionTimeout)."""
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    RETRY_TOPIC = "RETRY_TOPIC"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    SHARDING_KEY = "__SHARDINGKEY"
    TRACE_CONTEXT = "TRACE_CONTEXT"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_MS = "TIMER_DELAY_MS"
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    TIMER_OUT_MS = "TIMER_OUT_MS"
    """Absolute delivery time the broker computed for a message in the timer topic."""
    TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
    TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
    TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
    TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
    """On a cancel marker in the timer topic: the unique id of the timer it cancels."""
    TIMER_SOURCE = "TIMER_SOURCE"
    """On a timer-wheel re-put: "{commitlog offset}" of the timer-topic record it came from, so
    the broker drops a second re-put of the same timer (after a timer-wheel crash)."""


# ---- fixed part -----------------------------------------------------------------------------
# One format fragment per field so the offsets below are computed, never typed in.
_F_TOTALSIZE = "i"
_F_MAGIC = "I"
_F_BODYCRC = "i"
_F_QUEUEID = "i"
_F_FLAG = "i"
_F_QUEUEOFFSET = "q"
_F_PHYSICALOFFSET = "q"
_F_SYSFLAG = "i"
_F_BORNTIMESTAMP = "q"
_F_HOST_V4 = "4si"  # IPv4 address, port
_F_HOST_V6 = "16si"  # IPv6 address, port
_F_STORETIMESTAMP = "q"
_F_RECONSUMETIMES = "i"
_F_PREPARED_TX_OFFSET = "q"

_HEAD = _F_TOTALSIZE + _F_MAGIC + _F_BODYCRC + _F_QUEUEID + _F_FLAG
_HEAD += _F_QUEUEOFFSET + _F_PHYSICALOFFSET + _F_SYSFLAG + _F_BORNTIMESTAMP


def _fixed_format(born_v6: bool, store_v6: bool) -> str:
    return (
        ">"
        + _HEAD
        + (_F_HOST_V6 if born_v6 else _F_HOST_V4)
        + _F_STORETIMESTAMP
        + (_F_HOST_V6 if store_v6 else _F_HOST_V4)
        + _F_RECONSUMETIMES
        + _F_PREPARED_TX_OFFSET
    )


_FIXED: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(_fixed_format(b, s)) for b in (False, True) for s in (False, True)
}
FIXED_BYTES_V4 = _FIXED[(False, False)].size
assert FIXED_BYTES_V4 == 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 == 84
FIXED_BYTES_V6 = _FIXED[(True, True)].size
"""The largest fixed part: enough bytes to read any record's header fields."""
assert FIXED_BYTES_V6 == FIXED_BYTES_V4 + 2 * 12

# Offsets of fields that readers peek at without decoding the whole record.
OFFSET_TOTALSIZE = 0
OFFSET_MAGIC = struct.calcsize(">" + _F_TOTALSIZE)
OFFSET_BODYCRC = struct.calcsize(">" + _F_TOTALSIZE + _F_MAGIC)
OFFSET_QUEUEOFFSET = struct.calcsize(">" + _F_TOTALSIZE + _F_MAGIC + _F_BODYCRC + "ii")
OFFSET_PHYSICALOFFSET = OFFSET_QUEUEOFFSET + 8
OFFSET_SYSFLAG = OFFSET_PHYSICALOFFSET + 8
OFFSET_BORNHOST = struct.calcsize(">" + _HEAD)
assert (OFFSET_MAGIC, OFFSET_BODYCRC, OFFSET_QUEUEOFFSET, OFFSET_SYSFLAG) == (4, 8, 20, 36)
assert OFFSET_BORNHOST == 48

_SIZE_MAGIC = struct.Struct(">iI")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


def store_timestamp_offset(sys_flag: int) -> int:
    """Byte offset of STORETIMESTAMP within a record with this SYSFLAG."""
    return OFFSET_BORNHOST + (20 if sys_flag & SysFlag.BORNHOST_V6 else 8)


_RECORD_STRUCTS: dict[tuple[bool, bool, int, int, int], struct.Struct] = {}
_RECORD_STRUCTS_MAX = 4096


def _record_struct(
    born_v6: bool, store_v6: bool, body: int, topic: int, props: int
) -> struct.Struct:
    """The whole record as one Struct for these variable-field lengths.

    Cached in a plain dict (cheaper per call than ``lru_cache`` on the hot path); real traffic
    has few distinct length combinations, and the cache is simply cleared if it fills up.
    """
    key = (born_v6, store_v6, body, topic, props)
    st = _RECORD_STRUCTS.get(key)
    if st is None:
        if len(_RECORD_STRUCTS) >= _RECORD_STRUCTS_MAX:
            _RECORD_STRUCTS.clear()
        fixed = _fixed_format(born_v6, store_v6)
        st = _RECORD_STRUCTS[key] = struct.Struct(f"{fixed}i{body}sB{topic}sH{props}s")
    return st


def body_crc(body: bytes) -> int:
    """CRC32 of the body, masked to a non-negative Java int as RocketMQ stores it."""
    return zlib.crc32(body) & 0x7FFFFFFF


# ---- hosts ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HostAddress:
    """An IP and port as stored in BORNHOST / STOREHOSTADDRESS."""

    ip: bytes
    """4 bytes (IPv4) or 16 bytes (IPv6), network order."""
    port: int

    @classmethod
    def parse(cls, text: str) -> HostAddress:
        """Parse ``"1.2.3.4:10911"`` or ``"[::1]:10911"``."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"address {text!r} is not host:port")
        host = host.strip("[]")
        return cls(ipaddress.ip_address(host).packed, int(port))

    @property
    def is_v6(self) -> bool:
        return len(self.ip) == 16

    def __str__(self) -> str:
        ip = ipaddress.ip_address(self.ip)
        return f"[{ip}]:{self.port}" if self.is_v6 else f"{ip}:{self.port}"


LOCALHOST = HostAddress(b"\x7f\x00\x00\x01", 0)


# ---- properties -----------------------------------------------------------------------------
def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for every property, as RocketMQ 4.x writes them."""
    if not props:
        return b""
    parts = []
    for name, value in props.items():
        if NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name:
            raise ValueError(f"property name {name!r} contains a separator character")
        if NAME_VALUE_SEPARATOR in value or PROPERTY_SEPARATOR in value:
            raise ValueError(f"property {name!r} value contains a separator character")
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts).encode()


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerates a missing trailing separator."""
    props: dict[str, str] = {}
    if not raw:
        return props
    for item in bytes(raw).decode("utf-8", errors="replace").split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            props[name] = value
    return props


# ---- message ids ----------------------------------------------------------------------------
def encode_offset_msg_id(store_host: HostAddress, physical_offset: int) -> str:
    """The "offset message id": store host IP + port + physical offset, as upper-case hex."""
    return (store_host.ip + _INT.pack(store_host.port) + _LONG.pack(physical_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[HostAddress, int]:
    """Inverse of :func:`encode_offset_msg_id`; raises ValueError on a malformed id."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"message id {msg_id!r} is not hexadecimal") from None
    if len(raw) == 16:
        ip_len = 4
    elif len(raw) == 28:
        ip_len = 16
    else:
        raise ValueError(f"message id {msg_id!r} has {len(raw)} bytes; expected 16 or 28")
    port = _INT.unpack_from(raw, ip_len)[0]
    (offset,) = _LONG.unpack_from(raw, ip_len + 4)
    return HostAddress(raw[:ip_len], port), offset


# ---- records --------------------------------------------------------------------------------
@dataclass(slots=True)
class Record:
    """One decoded commitlog record."""

    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: HostAddress
    store_timestamp_ms: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str] = field(default_factory=dict)
    total_size: int = 0
    body_crc: int = 0

    @property
    def tags(self) -> str:
        return self.properties.get(Prop.TAGS, "")

    @property
    def keys(self) -> str:
        return self.properties.get(Prop.KEYS, "")

    @property
    def uniq_key(self) -> str:
        return self.properties.get(Prop.UNIQ_KEY, "")

    @property
    def offset_msg_id(self) -> str:
        return encode_offset_msg_id(self.store_host, self.physical_offset)


class CorruptRecord(ValueError):
    """A record failed a check; the message says which and at what offset."""


def encode_record(
    *,
    topic_bytes: bytes,
    body: bytes,
    properties: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: HostAddress,
    store_timestamp_ms: int,
    store_host: HostAddress,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """Encode one record. ``sys_flag``'s host-v6 bits are set from the addresses given."""
    if len(topic_bytes) > TOPIC_MAX_BYTES:
        raise ValueError(f"topic is {len(topic_bytes)} bytes; the limit is {TOPIC_MAX_BYTES}")
    if len(properties) > PROPERTIES_MAX_BYTES:
        raise ValueError(f"properties are {len(properties)} bytes; limit {PROPERTIES_MAX_BYTES}")
    born_v6 = born_host.is_v6
    store_v6 = store_host.is_v6
    sys_flag &= ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    sys_flag |= (SysFlag.BORNHOST_V6 if born_v6 else 0) | (SysFlag.STOREHOST_V6 if store_v6 else 0)
    st = _record_struct(born_v6, store_v6, len(body), len(topic_bytes), len(properties))
    return st.pack(
        st.size,
        MESSAGE_MAGIC,
        body_crc(body) if crc is None else crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp_ms,
        born_host.ip,
        born_host.port,
        store_timestamp_ms,
        store_host.ip,
        store_host.port,
        reconsume_times,
        prepared_transaction_offset,
        len(body),
        body,
        len(topic_bytes),
        topic_bytes,
        len(properties),
        properties,
    )


def record_size(
    body_len: int, topic_len: int, props_len: int, born_v6: bool, store_v6: bool
) -> int:
    """Bytes a record with these lengths occupies (RocketMQ's ``calMsgLength``)."""
    return _FIXED[(born_v6, store_v6)].size + 4 + body_len + 1 + topic_len + 2 + props_len


def peek_size_magic(buf: bytes | memoryview | bytearray, pos: int = 0) -> tuple[int, int]:
    """TOTALSIZE and MAGIC at ``pos`` without decoding anything else."""
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return size, magic


def decode_record(
    buf: bytes | memoryview | bytearray, pos: int = 0, *, check_crc: bool = True
) -> Record:
    """Decode the record at ``pos``; raise :class:`CorruptRecord` on any inconsistency.

    Every length is checked against the buffer and TOTALSIZE before it is used, so garbage
    never causes an IndexError or a huge allocation.
    """
    avail = len(buf) - pos
    if avail < 8:
        raise CorruptRecord(f"at {pos}: {avail} bytes left, a record needs at least 8")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC:
        raise CorruptRecord(f"at {pos}: magic 0x{magic:08X} is not a message record")
    if total > avail:
        raise CorruptRecord(f"at {pos}: TOTALSIZE {total} exceeds the {avail} bytes available")
    if total < FIXED_BYTES_V4 + 7:
        raise CorruptRecord(f"at {pos}: TOTALSIZE {total} is smaller than any record")
    (sys_flag,) = _INT.unpack_from(buf, pos + OFFSET_SYSFLAG)
    born_v6 = bool(sys_flag & SysFlag.BORNHOST_V6)
    store_v6 = bool(sys_flag & SysFlag.STOREHOST_V6)
    fixed = _FIXED[(born_v6, store_v6)]
    if total < fixed.size + 7:
        raise CorruptRecord(f"at {pos}: TOTALSIZE {total} too small for its host fields")
    (
        _total,
        _magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        _sys,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
    ) = fixed.unpack_from(buf, pos)
    cur = pos + fixed.size
    end = pos + total
    (body_len,) = _INT.unpack_from(buf, cur)
    cur += 4
    if body_len < 0 or cur + body_len + 3 > end:
        raise CorruptRecord(f"at {pos}: body length {body_len} does not fit TOTALSIZE {total}")
    body = bytes(buf[cur : cur + body_len])
    cur += body_len
    topic_len = buf[cur]
    cur += 1
    if cur + topic_len + 2 > end:
        raise CorruptRecord(f"at {pos}: topic length {topic_len} does not fit TOTALSIZE {total}")
    topic_raw = bytes(buf[cur : cur + topic_len])
    cur += topic_len
    props_len = (buf[cur] << 8) | buf[cur + 1]
    cur += 2
    if cur + props_len != end:
        raise CorruptRecord(
            f"at {pos}: properties length {props_len} leaves {end - cur - props_len} bytes "
            f"unaccounted in TOTALSIZE {total}"
        )
    if check_crc and body_crc(body) != crc:
        raise CorruptRecord(
            f"at {pos}: body CRC mismatch (stored {crc}, computed {body_crc(body)})"
        )
    try:
        topic = topic_raw.decode()
    except UnicodeDecodeError:
        raise CorruptRecord(f"at {pos}: topic is not UTF-8") from None
    return Record(
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=HostAddress(born_ip, born_port),
        store_timestamp_ms=store_ts,
        store_host=HostAddress(store_ip, store_port),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties=decode_properties(buf[cur : cur + props_len]),
        total_size=total,
        body_crc=crc,
    )


def record_properties_bytes(buf: bytes | memoryview | bytearray, pos: int = 0) -> bytes:
    """The raw PROPERTIES field (``name\\x01value\\x02`` …) of the record at ``pos``.

    Skips the fixed part, body and topic by their lengths without decoding them, so a
    broker-side property filter pays only for the bytes it reads. Raises
    :class:`CorruptRecord` if the lengths do not fit the record.
    """
    avail = len(buf) - pos
    if avail < FIXED_BYTES_V4 + 7:
        raise CorruptRecord(f"at {pos}: {avail} bytes left, too few for a record")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    (sys_flag,) = _INT.unpack_from(buf, pos + OFFSET_SYSFLAG)
    fixed = _FIXED[(bool(sys_flag & SysFlag.BORNHOST_V6), bool(sys_flag & SysFlag.STOREHOST_V6))]
    end = pos + total
    if magic != MESSAGE_MAGIC or total > avail or total < fixed.size + 7:
        raise CorruptRecord(f"at {pos}: not a whole message record (TOTALSIZE {total})")
    cur = pos + fixed.size
    (body_len,) = _INT.unpack_from(buf, cur)
    cur += 4 + body_len
    if body_len < 0 or cur + 3 > end:
        raise CorruptRecord(f"at {pos}: body length {body_len} does not fit TOTALSIZE {total}")
    cur += 1 + buf[cur]
    if cur + 2 > end:
        raise CorruptRecord(f"at {pos}: topic length does not fit TOTALSIZE {total}")
    props_len = (buf[cur] << 8) | buf[cur + 1]
    cur += 2
    if cur + props_len != end:
        raise CorruptRecord(f"at {pos}: properties length {props_len} does not fit TOTALSIZE")
    return bytes(buf[cur:end])


def iter_records(buf: bytes | memoryview, *, check_crc: bool = True) -> Iterator[Record]:
    """Decode concatenated records (a Pull response's ``records`` field)."""
    pos = 0
    while pos < len(buf):
        rec = decode_record(buf, pos, check_crc=check_crc)
        pos += rec.total_size
        yield rec


def tags_hash(tags: str) -> int:
    """The consume-queue tagsCode of a TAGS value: Java's ``String.hashCode`` (0 for none)."""
    return _tags_hash_cached(tags) if tags else 0


@lru_cache(maxsize=65536)
def _tags_hash_cached(tags: str) -> int:
    # Few distinct tags in real traffic: cache, since the exact UTF-16 hash costs ~1 µs.
    return java_string_hash(tags)
