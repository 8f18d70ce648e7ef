"""Send with ``SendRequest.records``: a batch the producer encoded as commitlog records.

DESIGN.md §12: the client encodes a batch once; the broker checks every record's sizes, magic,
body CRC, topic and properties here, and the store stamps the broker's fields into the same
bytes and appends them (``CommitLog.append_sent``). No protobuf ``Message`` is built per
message. What the checks refuse, naming the record and what was wrong (INVALID_ARGUMENT, and
nothing of the batch is stored):

| refusal                                                                          |
|----------------------------------------------------------------------------------|
| fewer bytes left than the smallest record; TOTALSIZE beyond the request's bytes   |
| TOTALSIZE smaller than any record; a magic that is not a message record's         |
| SYSFLAG bits other than 0x1 (compressed)                                          |
| body / topic / properties lengths that do not add up to TOTALSIZE                 |
| an empty body; a BODYCRC that is not the body's CRC                               |
| a topic that is not UTF-8, or differs from record 0's                             |
| properties that are not UTF-8 ``name\\x01value\\x02`` pairs                          |

Records that need per-message work beyond that (a reserved or special property: delays,
transactions, timer re-puts; no UNIQ_KEY; a %RETRY% topic; an IPv6 host) are turned back into
``Message``s by :func:`as_messages` and take the ordinary path, so every rule of
send_processor applies to them unchanged.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2
from rocketq.codec import Prop, SysFlag

_HEAD = codec.SENT_HEAD
_MIN = codec.RECORD_MIN_BYTES
_MAGIC = codec.MESSAGE_MAGIC
_COMPRESSED = SysFlag.COMPRESSED
SENT_RECORDS_MAX = 65_536
"""Records one request may hold (gRPC's message size limit bounds it first in practice)."""


class BadBatch(ValueError):
    """A sent batch that cannot be stored; the message says which record and why."""


@dataclass(slots=True)
class ParsedRecord:
    pos: int
    size: int
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    body_at: int
    body_end: int
    properties: bytes
    props: dict[str, str]


@dataclass(slots=True)
class ParsedBatch:
    topic: str
    topic_bytes: bytes
    records: list[ParsedRecord]


def parse(buf: bytes) -> ParsedBatch:
    """Check every record of ``buf``; raise :class:`BadBatch` at the first bad one."""
    records: list[ParsedRecord] = []
    end = len(buf)
    pos = 0
    topic_bytes = b""
    unpack, crc32, spans = _HEAD.unpack_from, zlib.crc32, codec.record_spans
    while pos < end:
        i = len(records)
        if i >= SENT_RECORDS_MAX:
            raise BadBatch(f"the batch holds more than {SENT_RECORDS_MAX} records")
        avail = end - pos
        if avail < _MIN:
            raise BadBatch(
                f"record {i} at byte {pos} is truncated: {avail} bytes left, a record needs at "
                f"least {_MIN}"
            )
        total, magic, crc, _qid, flag, _qoff, _phys, sys_flag, born = unpack(buf, pos)
        if total > avail:
            raise BadBatch(
                f"record {i} at byte {pos} claims TOTALSIZE {total}, beyond the {avail} bytes "
                "left in the request"
            )
        if total < _MIN:
            raise BadBatch(f"record {i} at byte {pos}: TOTALSIZE {total} is below {_MIN}")
        if magic != _MAGIC:
            raise BadBatch(f"record {i} at byte {pos}: magic 0x{magic:08X} is not a message's")
        if sys_flag & ~_COMPRESSED:
            raise BadBatch(
                f"record {i}: SYSFLAG 0x{sys_flag:x}; a sent record may set only 0x1 (compressed)"
            )
        try:
            body_at, body_end, topic_at, topic_end, props_at = spans(buf, pos, total, sys_flag)
        except codec.CorruptRecord as exc:
            raise BadBatch(f"record {i} at byte {pos}: {exc}") from None
        if body_at == body_end:
            raise BadBatch(f"record {i} has an empty body")
        actual = crc32(memoryview(buf)[body_at:body_end]) & 0x7FFFFFFF
        if actual != crc:
            raise BadBatch(f"record {i}: BODYCRC {crc} but the body's CRC is {actual}")
        tb = buf[topic_at:topic_end]
        if not records:
            topic_bytes = tb
        elif tb != topic_bytes:
            raise BadBatch(
                f"record {i} has topic {_text(tb)!r} but record 0 has {_text(topic_bytes)!r}; "
                "a batch must hold one topic"
            )
        raw = buf[props_at : pos + total]
        records.append(
            ParsedRecord(
                pos, total, flag, sys_flag, born, body_at, body_end, raw, _properties(raw, i)
            )
        )
        pos += total
    try:
        topic = topic_bytes.decode()
    except UnicodeDecodeError:
        raise BadBatch(f"record 0's topic {topic_bytes[:40]!r} is not UTF-8") from None
    return ParsedBatch(topic, topic_bytes, records)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _properties(raw: bytes, index: int) -> dict[str, str]:
    """``name\\x01value\\x02`` pairs, strictly: exactly one of each separator per pair."""
    if not raw:
        return {}
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise BadBatch(f"record {index}: its properties are not UTF-8") from None
    items = text.split("\x02")
    if items[-1]:
        raise BadBatch(f"record {index}: its properties do not end with \\x02")
    props: dict[str, str] = {}
    for item in items[:-1]:
        name, sep, value = item.partition("\x01")
        if not sep or not name or "\x01" in value:
            raise BadBatch(f"record {index}: property {item[:40]!r} is not name\\x01value")
        props[name] = value
    return props


def as_messages(batch: ParsedBatch, buf: bytes) -> tuple[list[common_pb2.Message], int]:
    """The records as ``Message``s for the ordinary path, and the request sys_flag they share
    (0 or 0x1). Raises :class:`BadBatch` if compressed and plain records are mixed."""
    flags = {r.sys_flag for r in batch.records}
    if len(flags) > 1:
        raise BadBatch("the batch mixes compressed and uncompressed records; send them apart")
    out = [
        common_pb2.Message(
            topic=batch.topic, flag=r.flag, body=buf[r.body_at : r.body_end], properties=r.props
        )
        for r in batch.records
    ]
    return out, flags.pop() if flags else 0


def needs_slow_path(batch: ParsedBatch, checked: frozenset[str]) -> bool:
    """Whether a record needs the per-message rules (special properties, no UNIQ_KEY)."""
    for r in batch.records:
        props = r.props
        if not props.get(Prop.UNIQ_KEY) or not checked.isdisjoint(props):
            return True
    return False
