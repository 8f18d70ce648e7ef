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
lengths (:func:`record_struct`, :func:`pack_record`), so encoding a message is a single C call.

Code that needs a few fields of a stored record without decoding it (recovery, replication,
the timer wheel's re-put, a property filter) reads them here: the ``peek_*`` functions,
:func:`record_spans` for the variable fields, :data:`RECORD_HEAD` for loops over many records.
Every offset is computed from the field formats above it and asserted at import; none is typed
in elsewhere.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from isal import isal_zlib

from rocketq.java_hash import java_string_hash

# The property names and their encoding live in rocketq.properties; codec.X keeps working.
from rocketq.properties import NAME_VALUE_SEPARATOR as NAME_VALUE_SEPARATOR
from rocketq.properties import PROPERTY_SEPARATOR as PROPERTY_SEPARATOR
from rocketq.properties import Prop as Prop
from rocketq.properties import decode_properties as decode_properties
from rocketq.properties import encode_properties as encode_properties

crc32 = isal_zlib.crc32
"""zlib.crc32's results (same polynomial and initial value), SIMD-computed: ~0.1 µs per KiB
against zlib's ~0.55. Every body CRC of the project goes through it: the producer's encode, the
broker's and the slave's checks, the consumer's decode."""

MESSAGE_MAGIC = 0xDAA320A7
"""0xAABBCCDD ^ (1880681586 + 8), as RocketMQ derives it (SPEC §4.5)."""
BLANK_MAGIC = 0xCBD43194
"""0xBBCCDDEE ^ (1880681586 + 8): the end-of-file filler."""
assert MESSAGE_MAGIC == (0xAABBCCDD ^ (1880681586 + 8)) & 0xFFFFFFFF
assert BLANK_MAGIC == (0xBBCCDDEE ^ (1880681586 + 8)) & 0xFFFFFFFF

END_FILE_MIN_BLANK_BYTES = 8
"""A file always keeps room for a blank record's TOTALSIZE + MAGIC."""

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
_F_BODY_LEN = "i"  # then the body
_F_TOPIC_LEN = "B"  # then the topic
_F_PROPS_LEN = "H"  # then the properties

_UP_TO_SYSFLAG = _F_TOTALSIZE + _F_MAGIC + _F_BODYCRC + _F_QUEUEID + _F_FLAG
_UP_TO_SYSFLAG += _F_QUEUEOFFSET + _F_PHYSICALOFFSET + _F_SYSFLAG
"""Fields 1–8: the same bytes in every record (the host fields after them vary in size)."""
_HEAD = _UP_TO_SYSFLAG + _F_BORNTIMESTAMP
_TAIL = _F_RECONSUMETIMES + _F_PREPARED_TX_OFFSET
"""The last two fixed fields, after the store host: located from the fixed part's end."""


def _fixed_format(born_v6: bool, store_v6: bool) -> str:
    return (
        ">"
        + _HEAD
        + (_F_HOST_V6 if born_v6 else _F_HOST_V4)
        + _F_STORETIMESTAMP
        + (_F_HOST_V6 if store_v6 else _F_HOST_V4)
        + _TAIL
    )


def _size(*fragments: str) -> int:
    """Bytes the big-endian fields ``fragments`` occupy, laid end to end."""
    return struct.calcsize(">" + "".join(fragments))


_FIXED: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(_fixed_format(b, s)) for b in (False, True) for s in (False, True)
}
FIXED_BYTES_V4 = _FIXED[(False, False)].size
assert FIXED_BYTES_V4 == 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 == 84
FIXED_BYTES_V6 = _FIXED[(True, True)].size
"""The largest fixed part: enough bytes to read any record's header fields."""
assert FIXED_BYTES_V6 == FIXED_BYTES_V4 + 2 * 12
_BODY_LEN_BYTES = _size(_F_BODY_LEN)
_TOPIC_LEN_BYTES = _size(_F_TOPIC_LEN)
_PROPS_LEN_BYTES = _size(_F_PROPS_LEN)
assert (_BODY_LEN_BYTES, _TOPIC_LEN_BYTES, _PROPS_LEN_BYTES) == (4, 1, 2)
_AFTER_BODY_BYTES = _TOPIC_LEN_BYTES + _PROPS_LEN_BYTES
"""The least a record holds after its body: the topic and properties lengths."""
_VARIABLE_LENGTHS_BYTES = _BODY_LEN_BYTES + _AFTER_BODY_BYTES
"""The three length fields of BODY, TOPIC and PROPERTIES."""
RECORD_MIN_BYTES = FIXED_BYTES_V4 + _VARIABLE_LENGTHS_BYTES
"""The smallest possible record: IPv4 hosts, empty body, topic and properties."""
assert RECORD_MIN_BYTES == 91

# Offsets of fields that readers peek at without decoding the whole record, each computed from
# the fields before it (never typed in); the asserts pin them to SPEC §11.1's table.
OFFSET_TOTALSIZE = 0
OFFSET_MAGIC = _size(_F_TOTALSIZE)
OFFSET_BODYCRC = _size(_F_TOTALSIZE, _F_MAGIC)
OFFSET_QUEUEID = _size(_F_TOTALSIZE, _F_MAGIC, _F_BODYCRC)
OFFSET_FLAG = _size(_F_TOTALSIZE, _F_MAGIC, _F_BODYCRC, _F_QUEUEID)
OFFSET_QUEUEOFFSET = _size(_F_TOTALSIZE, _F_MAGIC, _F_BODYCRC, _F_QUEUEID, _F_FLAG)
OFFSET_PHYSICALOFFSET = OFFSET_QUEUEOFFSET + _size(_F_QUEUEOFFSET)
OFFSET_SYSFLAG = OFFSET_PHYSICALOFFSET + _size(_F_PHYSICALOFFSET)
OFFSET_BORNHOST = _size(_HEAD)
assert (OFFSET_MAGIC, OFFSET_BODYCRC, OFFSET_QUEUEID, OFFSET_FLAG) == (4, 8, 12, 16)
assert (OFFSET_QUEUEOFFSET, OFFSET_PHYSICALOFFSET) == (20, 28)
assert (OFFSET_SYSFLAG, OFFSET_BORNHOST) == (36, 48)
_STORETIMESTAMP_AFTER_V4 = OFFSET_BORNHOST + _size(_F_HOST_V4)
_STORETIMESTAMP_AFTER_V6 = OFFSET_BORNHOST + _size(_F_HOST_V6)
assert (_STORETIMESTAMP_AFTER_V4, _STORETIMESTAMP_AFTER_V6) == (56, 68)
_TAIL_BYTES = _size(_TAIL)
"""RECONSUMETIMES starts this many bytes before the fixed part's end."""
_PREPARED_TX_BYTES = _size(_F_PREPARED_TX_OFFSET)
"""PREPARED TRANSACTION OFFSET starts this many bytes before the fixed part's end."""
assert (_TAIL_BYTES, _PREPARED_TX_BYTES) == (12, 8)
HOST_V6_BITS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
_FIXED_BYTES_BY_HOST_BITS: dict[int, int] = {
    (SysFlag.BORNHOST_V6 if b else 0) | (SysFlag.STOREHOST_V6 if s else 0): st.size
    for (b, s), st in _FIXED.items()
}

RECORD_HEAD = struct.Struct(">" + _UP_TO_SYSFLAG)
"""TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG: the fields
at the same place in every record, for loops that read many records (``unpack_from``)."""
assert RECORD_HEAD.size == OFFSET_SYSFLAG + _size(_F_SYSFLAG)
SIZE_MAGIC = struct.Struct(">" + _F_TOTALSIZE + _F_MAGIC)
"""TOTALSIZE and MAGIC: all a BLANK record holds."""
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


def fixed_bytes(sys_flag: int) -> int:
    """Size of the fixed part (fields 1–14) of a record with this SYSFLAG: where BODY starts."""
    return _FIXED_BYTES_BY_HOST_BITS[sys_flag & HOST_V6_BITS]


def store_timestamp_offset(sys_flag: int) -> int:
    """Byte offset of STORETIMESTAMP within a record with this SYSFLAG."""
    if sys_flag & SysFlag.BORNHOST_V6:
        return _STORETIMESTAMP_AFTER_V6
    return _STORETIMESTAMP_AFTER_V4


_RECORD_STRUCTS: dict[tuple[bool, bool, int, int, int], struct.Struct] = {}
_RECORD_STRUCTS_MAX = 4096


def record_struct(
    born_v6: bool, store_v6: bool, body: int, topic: int, props: int
) -> struct.Struct:
    """The whole record as one ``Struct`` for these variable-field lengths; its ``size`` is the
    record's TOTALSIZE. Give it to :func:`pack_record`.

    Cached in a plain dict (cheaper per call than ``lru_cache`` on the hot path); real traffic
    has few distinct length combinations, and the cache is simply cleared if it fills up.
    """
    key = (born_v6, store_v6, body, topic, props)
    st = _RECORD_STRUCTS.get(key)
    if st is None:
        if len(_RECORD_STRUCTS) >= _RECORD_STRUCTS_MAX:
            _RECORD_STRUCTS.clear()
        fixed = _fixed_format(born_v6, store_v6)
        layout = f"{fixed}{_F_BODY_LEN}{body}s{_F_TOPIC_LEN}{topic}s{_F_PROPS_LEN}{props}s"
        st = _RECORD_STRUCTS[key] = struct.Struct(layout)
    return st


# ---- sent batches (DESIGN.md §12): records as a producer encodes them ------------------------
SENT_HEAD = struct.Struct(">" + _HEAD)
"""TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG,
BORNTIMESTAMP: what a broker reads of each record of a sent batch (``unpack_from``)."""
_BEFORE_QUEUEID = len(_F_TOTALSIZE + _F_MAGIC + _F_BODYCRC)
SENT_STAMP = struct.Struct(">" + _fixed_format(False, False)[1 + _BEFORE_QUEUEID :])
"""QUEUEID through PREPARED TRANSACTION OFFSET of an IPv4 record: what the store writes into a
sent record in place (``pack_into`` at :data:`OFFSET_QUEUEID`)."""
assert OFFSET_QUEUEID + SENT_STAMP.size == FIXED_BYTES_V4
_NO_HOST = b"\0\0\0\0"


def encode_sent_record(
    topic_bytes: bytes, body: bytes, properties: bytes, flag: int, sys_flag: int, born_ms: int
) -> bytes:
    """One record of a sent batch (SendRequest.records): the producer's fields filled, the
    broker's zero. ``sys_flag`` may carry only SysFlag.COMPRESSED."""
    st = record_struct(False, False, len(body), len(topic_bytes), len(properties))
    return st.pack(
        st.size, MESSAGE_MAGIC, crc32(body) & 0x7FFFFFFF, 0, flag, 0, 0, sys_flag,
        born_ms, _NO_HOST, 0, 0, _NO_HOST, 0, 0, 0,
        len(body), body, len(topic_bytes), topic_bytes, len(properties), properties,
    )  # fmt: skip


V4_FIXED_AND_BODY_LEN = struct.Struct(_fixed_format(False, False) + _F_BODY_LEN)
"""Every fixed field of an IPv4 record (hosts as 4-byte address + port), then BODYLENGTH: one
``unpack_from`` for a loop that needs most of a record's header (a slave's replicated chunks)."""
_TOPIC_LEN = struct.Struct(">" + _F_TOPIC_LEN)
_PROPS_LEN = struct.Struct(">" + _F_PROPS_LEN)


def encode_sent_batch(
    topic_bytes: bytes, messages: Iterable[tuple[bytes, bytes, int]], born_ms: int
) -> bytes:
    """The records of a sent batch (SendRequest.records) of ``(body, properties, flag)``
    messages of one topic, concatenated: the same bytes as :func:`encode_sent_record` of each
    with SYSFLAG 0, made in one pass. Each body is copied once, by the final join (packing a
    whole record copied it once more), and the topic's bytes are shared by every record."""
    topic_part = _TOPIC_LEN.pack(len(topic_bytes)) + topic_bytes
    fixed = V4_FIXED_AND_BODY_LEN.size + len(topic_part) + _PROPS_LEN.size
    pack_head, pack_props_len = V4_FIXED_AND_BODY_LEN.pack, _PROPS_LEN.pack
    crc, magic, no_host = crc32, MESSAGE_MAGIC, _NO_HOST
    parts: list[bytes] = []
    add = parts.append
    for body, properties, flag in messages:
        body_len, props_len = len(body), len(properties)
        add(
            pack_head(
                fixed + body_len + props_len, magic, crc(body) & 0x7FFFFFFF, 0, flag, 0, 0, 0,
                born_ms, no_host, 0, 0, no_host, 0, 0, 0, body_len,
            )
        )  # fmt: skip
        add(body)
        add(topic_part)
        add(pack_props_len(props_len))
        add(properties)
    return b"".join(parts)


def count_records(buf: bytes | memoryview) -> int:
    """How many records ``buf`` holds, walking TOTALSIZE only (no checks: for a sender's own
    batch)."""
    n = pos = 0
    end = len(buf)
    unpack = _INT.unpack_from
    while pos + 4 <= end:
        (total,) = unpack(buf, pos)
        if total <= 0:
            break
        pos += total
        n += 1
    return n


def body_crc(body: bytes) -> int:
    """CRC32 of the body, masked to a non-negative Java int as RocketMQ stores it."""
    return crc32(body) & 0x7FFFFFFF


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
        return host_text(self.ip, self.port)


_HOST_TEXT: dict[tuple[bytes, int], str] = {}
_HOST_TEXT_MAX = 4096


LOCALHOST = HostAddress(b"\x7f\x00\x00\x01", 0)


def host_text(ip: bytes, port: int) -> str:
    """``str(HostAddress(ip, port))``, remembered: consumers turn two hosts of every pulled
    record into text, and a queue's records share a handful of hosts."""
    key = (ip, port)
    text = _HOST_TEXT.get(key)
    if text is None:
        addr = ipaddress.ip_address(ip)
        text = f"[{addr}]:{port}" if len(ip) == 16 else f"{addr}:{port}"
        if len(_HOST_TEXT) >= _HOST_TEXT_MAX:
            _HOST_TEXT.clear()
        _HOST_TEXT[key] = text
    return text


# ---- message ids ----------------------------------------------------------------------------
def offset_msg_id_of(ip: bytes, port: int, physical_offset: int) -> str:
    """:func:`encode_offset_msg_id` from the raw store host fields."""
    return (ip + _INT.pack(port) + _LONG.pack(physical_offset)).hex().upper()


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


def with_host_bits(sys_flag: int, born_v6: bool, store_v6: bool) -> int:
    """``sys_flag`` with its two host-family bits set from the addresses, as stored."""
    sys_flag &= ~HOST_V6_BITS
    if born_v6:
        sys_flag |= SysFlag.BORNHOST_V6
    if store_v6:
        sys_flag |= SysFlag.STOREHOST_V6
    return sys_flag


def pack_record(
    st: struct.Struct,
    crc: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: HostAddress,
    store_timestamp_ms: int,
    store_host: HostAddress,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: bytes,
    topic_bytes: bytes,
    properties: bytes,
) -> bytes:
    """Pack one record with ``st`` from :func:`record_struct`: the one packing routine that
    both :func:`encode_record` and the commitlog's batch append use.

    Unchecked and positional, for the append hot path: ``sys_flag`` must already carry the
    host bits (:func:`with_host_bits`) and the lengths must be those ``st`` was made for."""
    return st.pack(
        st.size,
        MESSAGE_MAGIC,
        crc,
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
    return pack_record(
        record_struct(born_v6, store_v6, len(body), len(topic_bytes), len(properties)),
        body_crc(body) if crc is None else crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        with_host_bits(sys_flag, born_v6, store_v6),
        born_timestamp_ms,
        born_host,
        store_timestamp_ms,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body,
        topic_bytes,
        properties,
    )


def record_size(
    body_len: int, topic_len: int, props_len: int, born_v6: bool, store_v6: bool
) -> int:
    """Bytes a record with these lengths occupies (RocketMQ's ``calMsgLength``)."""
    return (
        _FIXED[(born_v6, store_v6)].size
        + _VARIABLE_LENGTHS_BYTES
        + body_len
        + topic_len
        + props_len
    )


# ---- peeking: single fields, without decoding the record ---------------------------------------
# Each reads at ``pos`` in ``buf`` and raises CorruptRecord if the buffer ends before the field.
def _peek(st: struct.Struct, buf: bytes | memoryview | bytearray, at: int) -> int:
    try:
        return int(st.unpack_from(buf, at)[0])
    except struct.error:
        raise CorruptRecord(f"at {at}: the buffer ends inside a record's fixed part") from None


def peek_size_magic(buf: bytes | memoryview | bytearray, pos: int = 0) -> tuple[int, int]:
    """TOTALSIZE and MAGIC at ``pos`` without decoding anything else."""
    try:
        size, magic = SIZE_MAGIC.unpack_from(buf, pos)
    except struct.error:
        raise CorruptRecord(f"at {pos}: fewer than {SIZE_MAGIC.size} bytes left") from None
    return size, magic


def peek_flag(buf: bytes | memoryview | bytearray, pos: int = 0) -> int:
    """FLAG (the user's flag) of the record at ``pos``."""
    return _peek(_INT, buf, pos + OFFSET_FLAG)


def peek_physical_offset(buf: bytes | memoryview | bytearray, pos: int = 0) -> int:
    """PHYSICALOFFSET of the record at ``pos``: where it says it lies in the commitlog."""
    return _peek(_LONG, buf, pos + OFFSET_PHYSICALOFFSET)


def peek_sys_flag(buf: bytes | memoryview | bytearray, pos: int = 0) -> int:
    """SYSFLAG of the record at ``pos``."""
    return _peek(_INT, buf, pos + OFFSET_SYSFLAG)


def peek_store_timestamp(buf: bytes | memoryview | bytearray, pos: int = 0) -> int:
    """STORETIMESTAMP (ms) of the record at ``pos``."""
    return _peek(_LONG, buf, pos + store_timestamp_offset(peek_sys_flag(buf, pos)))


def peek_reconsume_times(buf: bytes | memoryview | bytearray, pos: int = 0) -> int:
    """RECONSUMETIMES of the record at ``pos``."""
    return _peek(_INT, buf, pos + fixed_bytes(peek_sys_flag(buf, pos)) - _TAIL_BYTES)


def peek_prepared_transaction_offset(buf: bytes | memoryview | bytearray, pos: int = 0) -> int:
    """PREPARED TRANSACTION OFFSET of the record at ``pos``."""
    return _peek(_LONG, buf, pos + fixed_bytes(peek_sys_flag(buf, pos)) - _PREPARED_TX_BYTES)


def prepared_transaction_offset_at(sys_flag: int) -> int:
    """Byte offset of PREPARED TRANSACTION OFFSET within a record with this SYSFLAG."""
    return fixed_bytes(sys_flag) - _PREPARED_TX_BYTES


def record_spans(
    buf: bytes | memoryview | bytearray, pos: int, total: int, sys_flag: int
) -> tuple[int, int, int, int, int]:
    """Where the variable fields of the ``total``-byte record at ``pos`` lie, checked.

    Returns ``(body_at, body_end, topic_at, topic_end, props_at)``: the body is
    ``buf[body_at:body_end]``, the topic ``buf[topic_at:topic_end]``, the properties
    ``buf[props_at:pos + total]``.
    Every length is checked against TOTALSIZE before it is used; CorruptRecord (without a
    position: the caller knows where the record is) names the first that does not fit.
    ``total`` must not exceed the bytes ``buf`` holds from ``pos``.
    """
    end = pos + total
    body_at = pos + _FIXED_BYTES_BY_HOST_BITS[sys_flag & HOST_V6_BITS] + _BODY_LEN_BYTES
    if body_at + _AFTER_BODY_BYTES > end:
        raise CorruptRecord(f"TOTALSIZE {total} too small for its host fields")
    (body_len,) = _INT.unpack_from(buf, body_at - _BODY_LEN_BYTES)
    body_end = body_at + body_len
    if body_len < 0 or body_end + _AFTER_BODY_BYTES > end:
        raise CorruptRecord(f"body length {body_len} does not fit TOTALSIZE {total}")
    topic_at = body_end + _TOPIC_LEN_BYTES
    topic_end = topic_at + buf[body_end]
    if topic_end + _PROPS_LEN_BYTES > end:
        raise CorruptRecord(f"topic length {buf[body_end]} does not fit TOTALSIZE {total}")
    props_at = topic_end + _PROPS_LEN_BYTES
    props_len = (buf[topic_end] << 8) | buf[topic_end + 1]
    if props_at + props_len != end:
        raise CorruptRecord(
            f"properties length {props_len} leaves {end - props_at - props_len} bytes "
            f"unaccounted in TOTALSIZE {total}"
        )
    return body_at, body_end, topic_at, topic_end, props_at


# ---- decoding ---------------------------------------------------------------------------------
def _check_head(buf: bytes | memoryview | bytearray, pos: int) -> tuple[int, int]:
    """TOTALSIZE and SYSFLAG of the message record at ``pos``, checked against the buffer."""
    avail = len(buf) - pos
    if avail < 8:
        raise CorruptRecord(f"at {pos}: {avail} bytes left, a record needs at least 8")
    total, magic = SIZE_MAGIC.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC:
        raise CorruptRecord(f"at {pos}: magic 0x{magic:08X} is not a message record")
    if total > avail:
        raise CorruptRecord(f"at {pos}: TOTALSIZE {total} exceeds the {avail} bytes available")
    if total < RECORD_MIN_BYTES:
        raise CorruptRecord(f"at {pos}: TOTALSIZE {total} is smaller than any record")
    return total, _INT.unpack_from(buf, pos + OFFSET_SYSFLAG)[0]


def decode_record(
    buf: bytes | memoryview | bytearray, pos: int = 0, *, check_crc: bool = True
) -> Record:
    """Decode the record at ``pos``; raise :class:`CorruptRecord` on any inconsistency.

    Every length is checked against the buffer and TOTALSIZE before it is used, so garbage
    never causes an IndexError or a huge allocation.
    """
    total, sys_flag = _check_head(buf, pos)
    try:
        body_at, body_end, topic_at, topic_end, props_at = record_spans(buf, pos, total, sys_flag)
    except CorruptRecord as exc:
        raise CorruptRecord(f"at {pos}: {exc}") from None
    fixed = _FIXED[(bool(sys_flag & SysFlag.BORNHOST_V6), bool(sys_flag & SysFlag.STOREHOST_V6))]
    f = fixed.unpack_from(buf, pos)  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, …: the table's order
    body = bytes(buf[body_at:body_end])
    if check_crc and crc32(body) & 0x7FFFFFFF != f[2]:
        raise CorruptRecord(
            f"at {pos}: body CRC mismatch (stored {f[2]}, computed {body_crc(body)})"
        )
    try:
        topic = bytes(buf[topic_at:topic_end]).decode()
    except UnicodeDecodeError:
        raise CorruptRecord(f"at {pos}: topic is not UTF-8") from None
    # Positional, in Record's field order (cheaper than keywords on this hot path).
    return Record(
        f[3],  # queue id
        f[4],  # flag
        f[5],  # queue offset
        f[6],  # physical offset
        f[7],  # sys flag
        f[8],  # born timestamp
        HostAddress(f[9], f[10]),
        f[11],
        HostAddress(f[12], f[13]),
        f[14],
        f[15],
        body,
        topic,
        decode_properties(buf[props_at : pos + total]),
        total,
        f[2],
    )


def record_properties_bytes(buf: bytes | memoryview | bytearray, pos: int = 0) -> bytes:
    """The raw PROPERTIES field (``name\\x01value\\x02`` …) of the record at ``pos``.

    Skips the fixed part, body and topic by their lengths without decoding them, so a
    broker-side property filter pays only for the bytes it reads. Raises
    :class:`CorruptRecord` if the lengths do not fit the record.
    """
    total, sys_flag = _check_head(buf, pos)
    try:
        props_at = record_spans(buf, pos, total, sys_flag)[4]
    except CorruptRecord as exc:
        raise CorruptRecord(f"at {pos}: {exc}") from None
    return bytes(buf[props_at : pos + total])


def record_topic(buf: bytes | memoryview | bytearray, pos: int = 0) -> str:
    """The TOPIC field of the record at ``pos``, read by its lengths without decoding the rest
    (an access check of an encoded batch needs only this). Raises :class:`CorruptRecord` if the
    lengths do not fit the record or the topic is not UTF-8."""
    total, sys_flag = _check_head(buf, pos)
    try:
        topic_at, topic_end = record_spans(buf, pos, total, sys_flag)[2:4]
        return bytes(buf[topic_at:topic_end]).decode()
    except CorruptRecord as exc:
        raise CorruptRecord(f"at {pos}: {exc}") from None
    except UnicodeDecodeError:
        raise CorruptRecord(f"at {pos}: topic is not UTF-8") from None


def iter_records(buf: bytes | memoryview, *, check_crc: bool = True) -> Iterator[Record]:
    """Decode concatenated records (a Pull response's ``records`` field)."""
    pos = 0
    while pos < len(buf):
        rec = decode_record(buf, pos, check_crc=check_crc)
        pos += rec.total_size
        yield rec


PULLED_HEAD_V4 = struct.Struct(
    ">" + _UP_TO_SYSFLAG + f"{FIXED_BYTES_V4 - RECORD_HEAD.size}x" + _F_BODY_LEN
)
""":data:`RECORD_HEAD`'s fields, then BODY's length, of a record with IPv4 hosts (nearly every
record): what a pulled batch's decode (``rocketq.message.decode_records``) reads per record in
one C call, skipping the hosts, timestamps and the other fields a lazy decode reads later. The
record's parts then lie at fixed distances from what it gives: BODY at ``pos + size``, then
TOPIC's length byte and TOPIC, then PROPERTIES' length; see :func:`pulled_record_parts`."""
assert PULLED_HEAD_V4.size == FIXED_BYTES_V4 + _BODY_LEN_BYTES
PULLED_AFTER_TOPIC_BYTES = _PROPS_LEN_BYTES
"""Bytes between a record's TOPIC and its PROPERTIES: their length (big-endian)."""


@lru_cache(maxsize=256)
def pulled_tail_struct(tail: bytes) -> struct.Struct:
    """What follows a record's BODY when its TOPIC (with its length byte) is ``tail``: those
    ``len(tail)`` bytes, then PROPERTIES' length. A pull's records share one topic, so its
    decode compares each record's with one unpack (cached: a consumer reads a few topics)."""
    return struct.Struct(f">{len(tail)}s{_F_PROPS_LEN}")


def pulled_record_parts(buf: bytes, pos: int) -> tuple[tuple[int, ...], int, int, int, int]:
    """A pulled record at ``pos`` checked field by field (magic, TOTALSIZE against ``buf``,
    each length against TOTALSIZE; :class:`CorruptRecord` says what is wrong, and where): its
    :data:`RECORD_HEAD` fields and where its body and topic lie, ``(head, body_at, body_end,
    topic_at, topic_end)``. The body CRC and the topic's UTF-8 are the caller's to check.

    The every-case path of a pulled batch's decode: a record with an IPv6 host, and any record
    its inline checks of :data:`PULLED_HEAD_V4`'s fields did not pass, comes here."""
    _check_head(buf, pos)
    f = RECORD_HEAD.unpack_from(buf, pos)
    try:
        body_at, body_end, topic_at, topic_end, _ = record_spans(buf, pos, f[0], f[7])
    except CorruptRecord as exc:
        raise CorruptRecord(f"at {pos}: {exc}") from None
    return f, body_at, body_end, topic_at, topic_end


_TAIL_FIELDS: dict[tuple[bool, bool], struct.Struct] = {
    (b, s): struct.Struct(">" + _F_BORNTIMESTAMP + _fixed_format(b, s)[1 + len(_HEAD) :])
    for b in (False, True)
    for s in (False, True)
}
"""BORNTIMESTAMP through PREPARED TRANSACTION OFFSET, from :data:`OFFSET_BORNHOST` - 8."""
_TAIL_FIELDS_AT = OFFSET_BORNHOST - _size(_F_BORNTIMESTAMP)


def record_host_fields(buf: bytes | memoryview, pos: int, sys_flag: int) -> tuple[Any, ...]:
    """BORNTIMESTAMP, born ip, born port, STORETIMESTAMP, store ip, store port, RECONSUMETIMES,
    PREPARED TRANSACTION OFFSET of a record already checked (by ``decode_records``: what a
    lazily decoded message reads when first asked for one of them)."""
    st = _TAIL_FIELDS[(bool(sys_flag & SysFlag.BORNHOST_V6), bool(sys_flag & SysFlag.STOREHOST_V6))]
    return st.unpack_from(buf, pos + _TAIL_FIELDS_AT)


def tags_hash(tags: str) -> int:
    """The consume-queue tagsCode of a TAGS value: Java's ``String.hashCode`` (0 for none)."""
    return _tags_hash_cached(tags) if tags else 0


@lru_cache(maxsize=65536)
def _tags_hash_cached(tags: str) -> int:
    # Few distinct tags in real traffic: cache, since the exact UTF-16 hash costs ~1 µs.
    return java_string_hash(tags)
