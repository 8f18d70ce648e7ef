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

import struct
from dataclasses import dataclass

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2
from rocketq.codec import HostAddress, Prop, SysFlag
from services.store.commitlog import SentBatch

_HEAD = codec.SENT_HEAD
_MIN = codec.RECORD_MIN_BYTES
_MAGIC = codec.MESSAGE_MAGIC
_COMPRESSED = SysFlag.COMPRESSED
_BODY_AT = codec.FIXED_BYTES_V4 + 4
"""Where an IPv4 record's body starts: the fixed fields, then BODYLENGTH (4 bytes); after the
body come TOPICLENGTH (1 byte), the topic, PROPERTIESLENGTH (2 bytes), the properties."""
_HEAD_AND_BODY_LEN = struct.Struct(_HEAD.format + f"{codec.FIXED_BYTES_V4 - _HEAD.size}xi")
"""SENT_HEAD's fields, then BODYLENGTH (the host and store fields between are skipped): one
unpack per record instead of two."""
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
class SentColumns:
    """A checked batch, one list per field (index i = record i): the broker's hot path reads
    these without building an object per record."""

    topic: str
    topic_bytes: bytes
    pos: list[int]
    size: list[int]
    flag: list[int]
    sys_flag: list[int]
    born_timestamp_ms: list[int]
    body_at: list[int]
    body_end: list[int]
    props_at: list[int]
    props: list[dict[str, str]]


@dataclass(slots=True)
class ParsedBatch:
    topic: str
    topic_bytes: bytes
    records: list[ParsedRecord]


def parse(buf: bytes) -> ParsedBatch:
    """Check every record of ``buf``; raise :class:`BadBatch` at the first bad one."""
    return as_parsed(parse_columns(buf), buf)


def as_parsed(c: SentColumns, buf: bytes) -> ParsedBatch:
    """The columns as one :class:`ParsedRecord` per record (the per-message paths)."""
    records = [
        ParsedRecord(
            pos, size, flag, sys_flag, born, body_at, body_end, buf[at : pos + size], props
        )
        for pos, size, flag, sys_flag, born, body_at, body_end, at, props in zip(
            c.pos, c.size, c.flag, c.sys_flag, c.born_timestamp_ms, c.body_at, c.body_end,
            c.props_at, c.props, strict=True,
        )
    ]  # fmt: skip
    return ParsedBatch(c.topic, c.topic_bytes, records)


def parse_columns(buf: bytes) -> SentColumns:
    """:func:`parse`'s checks, in the same order and with the same refusals, into columns.

    One pass; the field lengths of an IPv4 record (the only kind a sent batch may hold) are
    read inline, and only a record whose lengths do not add up goes through
    :func:`rocketq.codec.record_spans`, for the refusal it names."""
    end = len(buf)
    pos = 0
    topic_bytes = b""
    topic_len = -1
    unpack, crc32, spans = _HEAD_AND_BODY_LEN.unpack_from, codec.crc32, codec.record_spans
    view = memoryview(buf)
    c = SentColumns("", b"", [], [], [], [], [], [], [], [], [])
    add_pos, add_size, add_flag, add_sys = (
        c.pos.append,
        c.size.append,
        c.flag.append,
        c.sys_flag.append,
    )
    add_born, add_body_at, add_body_end = (
        c.born_timestamp_ms.append,
        c.body_at.append,
        c.body_end.append,
    )
    add_props, add_props_at = c.props.append, c.props_at.append
    i = 0
    while pos < end:
        if i >= SENT_RECORDS_MAX:
            raise BadBatch(f"the batch holds more than {SENT_RECORDS_MAX} records")
        avail = end - pos
        if avail < _MIN:
            raise BadBatch(
                f"record {i} at byte {pos} is truncated: {avail} bytes left, a record needs at "
                f"least {_MIN}"
            )
        total, magic, crc, _qid, flag, _qoff, _phys, sys_flag, born, body_len = unpack(buf, pos)
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
        # record_spans, inlined for the IPv4 layout (sys_flag has no host bits here)
        rec_end = pos + total
        body_at = pos + _BODY_AT
        body_end = body_at + body_len
        topic_end = props_at = -1
        if body_len >= 0 and body_end + 3 <= rec_end:
            topic_end = body_end + 1 + buf[body_end]
            props_at = topic_end + 2
            if (
                props_at > rec_end
                or props_at + ((buf[topic_end] << 8) | buf[topic_end + 1]) != rec_end
            ):
                props_at = -1
        if props_at < 0:
            try:
                spans(buf, pos, total, sys_flag)
            except codec.CorruptRecord as exc:
                raise BadBatch(f"record {i} at byte {pos}: {exc}") from None
            raise AssertionError("record_spans accepted what the inline check refused")
        if body_at == body_end:
            raise BadBatch(f"record {i} has an empty body")
        actual = crc32(view[body_at:body_end]) & 0x7FFFFFFF
        if actual != crc:
            raise BadBatch(f"record {i}: BODYCRC {crc} but the body's CRC is {actual}")
        if topic_len < 0:
            topic_bytes = buf[body_end + 1 : topic_end]
            topic_len = len(topic_bytes)
        elif topic_end - body_end - 1 != topic_len or not buf.startswith(topic_bytes, body_end + 1):
            raise BadBatch(
                f"record {i} has topic {_text(buf[body_end + 1 : topic_end])!r} but record 0 has "
                f"{_text(topic_bytes)!r}; a batch must hold one topic"
            )
        # _properties, inlined (a call per record costs a tenth of the record's parse)
        props: dict[str, str] = {}
        if props_at < rec_end:
            try:
                items = buf[props_at:rec_end].decode().split("\x02")
                if items.pop():
                    raise ValueError("no \\x02 at the end")
                for item in items:
                    name, value = item.split("\x01")
                    props[name] = value
            except ValueError:  # UnicodeDecodeError is one
                props = _properties(buf[props_at:rec_end], i)
            if "" in props:
                props = _properties(buf[props_at:rec_end], i)
        add_props(props)
        add_pos(pos)
        add_size(total)
        add_flag(flag)
        add_sys(sys_flag)
        add_born(born)
        add_body_at(body_at)
        add_body_end(body_end)
        add_props_at(props_at)
        pos = rec_end
        i += 1
    try:
        c.topic = topic_bytes.decode()
    except UnicodeDecodeError:
        raise BadBatch(f"record 0's topic {topic_bytes[:40]!r} is not UTF-8") from None
    c.topic_bytes = topic_bytes
    return c


def too_large_at(c: SentColumns, limit: int) -> int | None:
    """The record at which topic + bodies + properties pass ``limit`` (counted as the
    per-message path counts them, the topic in characters); None if the batch fits."""
    count = len(c.pos)
    topic_len = len(c.topic)
    # each record's size less its fixed fields, length fields and topic bytes, plus the topic
    end = c.pos[-1] + c.size[-1] if count else 0
    if end - count * (codec.RECORD_MIN_BYTES + len(c.topic_bytes) - topic_len) <= limit:
        return None
    total = 0
    for i, (body_at, body_end, props_at, pos, size) in enumerate(
        zip(c.body_at, c.body_end, c.props_at, c.pos, c.size, strict=True)
    ):
        total += topic_len + body_end - body_at + pos + size - props_at
        if total > limit:
            return i
    return count - 1


def as_sent_batch(
    c: SentColumns,
    buf: bytes,
    queue_id: int,
    born_host: HostAddress,
    reconsume_times: int,
    checked: frozenset[str],
) -> tuple[SentBatch, bool] | None:
    """The batch to store as it came, and whether its answer waits for the flush policy (a
    record without WAIT=false); None when a record needs the per-message rules (a property in
    ``checked``, no UNIQ_KEY). One pass over the records' properties, no object per record."""
    tags_hash = codec.tags_hash
    uniq_keys: list[str] = []
    tags_codes: list[int] = []
    keys: list[str] = []
    add_uniq, add_tags, add_keys = uniq_keys.append, tags_codes.append, keys.append
    wait = False
    for props in c.props:
        uniq = props.get(Prop.UNIQ_KEY)
        if not uniq or not checked.isdisjoint(props):
            return None
        add_uniq(uniq)
        tags = props.get(Prop.TAGS)
        add_tags(tags_hash(tags) if tags else 0)
        add_keys(props.get(Prop.KEYS, ""))
        if not wait and props.get(Prop.WAIT_STORE_MSG_OK) != "false":
            wait = True
    sent = SentBatch(
        c.topic, queue_id, bytearray(buf), c.pos, c.size, c.flag, c.sys_flag,
        c.born_timestamp_ms, tags_codes, keys, uniq_keys, born_host, reconsume_times,
    )  # fmt: skip
    return sent, wait


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _properties(raw: bytes, index: int) -> dict[str, str]:
    """``name\\x01value\\x02`` pairs, strictly: exactly one of each separator per pair; raises
    :class:`BadBatch` naming the first fault (parse_columns has the fast way in its loop)."""
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
