"""Pulled records straight into Arrow columns: the read path's hot loop.

A Pull answer is the stored records laid end to end (SPEC §11.1). Turning each into a
:class:`~rocketq.message.ReceivedMessage` and then into 13 Python lists cost about 10 µs a
message, most of a Spark read's time. Here the only Python loops per record find where each
starts (TOTALSIZE and magic checked) and copy its body and properties out (body CRC checked);
every length is checked against TOTALSIZE with numpy, and every column is cut from the bytes
at once with numpy and pyarrow compute:

| column                     | how                                                          |
|----------------------------|--------------------------------------------------------------|
| queueId, queueOffset,      | big-endian fields gathered at fixed offsets from each start  |
| timestamps, reconsumeTimes |                                                              |
| body                       | the bodies appended to one buffer + an offsets buffer        |
| properties, keys, tags,    | the properties slices as one string array, split on the      |
| msgId                      | separators by pyarrow; msgId is UNIQ_KEY, else the offset id |
| bornHost                   | the (ip, port) pairs made text once per distinct pair        |
| topic, brokerName          | the queue's (a consume queue holds records of its topic only) |

Records this layout does not cover (IPv6 hosts, compressed bodies, another topic: :func:`walk`
answers False; properties that are not UTF-8: :func:`columns` answers None) are decoded the
general way by the caller; the output is the same either way (tests/unit/test_spark_arrow.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from isal import isal_zlib  # zlib's crc32 (same polynomial), with SIMD

from rocketq import codec
from rocketq.codec import Prop

_I32 = np.dtype(">i4")
_I64 = np.dtype(">i8")
_BORN_TS_AT = codec.OFFSET_BORNHOST - 8
_BORN_HOST_AT = codec.OFFSET_BORNHOST
_STORE_TS_AT = codec.OFFSET_BORNHOST + 8
_STORE_HOST_AT = _STORE_TS_AT + 8
_RECONSUME_AT = _STORE_HOST_AT + 8
assert (_BORN_TS_AT, _STORE_TS_AT, _STORE_HOST_AT, _RECONSUME_AT) == (40, 56, 64, 72)
_PLAIN_FLAGS = codec.SysFlag.COMPRESSED | codec.HOST_V6_BITS
"""Records with any of these sys flags are left to the general decoder."""
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HIDDEN = pa.array([Prop.TAGS, Prop.KEYS])


@dataclass
class Walked:
    """Where the records of one or more Pull answers lie, gathered record by record."""

    parts: list[bytes] = field(default_factory=list)
    """The answers' record bytes, in order (joined once when the columns are built)."""
    starts: list[int] = field(default_factory=list)
    """Each record's first byte, counted over ``parts`` laid end to end."""
    bodies: bytearray = field(default_factory=bytearray)
    """The bodies laid end to end (appending memoryview slices to a bytearray is one copy at
    memcpy speed; ``b"".join`` of memoryviews was 25x slower)."""
    body_ends: list[int] = field(default_factory=list)
    props: bytearray = field(default_factory=bytearray)
    prop_ends: list[int] = field(default_factory=list)
    size_bytes: int = 0

    def __len__(self) -> int:
        return len(self.starts)


def walk(into: Walked, buf: bytes, topic: bytes, end_offset: int) -> bool:
    """Add the records of one Pull answer below queue offset ``end_offset`` to ``into``; False
    (and ``into`` unchanged) when one of them needs the general decoder. Every length is
    checked against TOTALSIZE, and every body against its CRC, before anything is kept
    (:class:`~rocketq.codec.CorruptRecord` names the first record that fails)."""
    first = _record_starts(buf)
    raw = np.frombuffer(buf, dtype=np.uint8)
    starts = np.asarray(first, dtype=np.int64)
    queue_offsets = _gather(raw, starts, codec.OFFSET_QUEUEOFFSET, _I64)
    count = int(np.searchsorted(queue_offsets, end_offset))  # stored in queue-offset order
    starts = starts[:count]
    if (_gather(raw, starts, codec.OFFSET_SYSFLAG, _I32) & _PLAIN_FLAGS).any():
        return False
    rec_end = starts + _gather(raw, starts, 0, _I32)
    body_at = starts + codec.FIXED_BYTES_V4 + 4
    body_end = body_at + _gather(raw, starts, codec.FIXED_BYTES_V4, _I32)
    _check(starts, (body_end < body_at) | (body_end + 3 > rec_end), "body length")
    topic_end = body_end + 1 + raw[body_end]
    _check(starts, topic_end + 2 > rec_end, "topic length")
    props_at = topic_end + 2
    props_len = (raw[topic_end].astype(np.int64) << 8) | raw[topic_end + 1]
    _check(starts, props_at + props_len != rec_end, "properties length")
    if (topic_end - body_end - 1 != len(topic)).any() or (
        len(topic)
        and (
            raw[(body_end + 1)[:, None] + np.arange(len(topic))] != np.frombuffer(topic, np.uint8)
        ).any()
    ):
        return False  # another topic's record (never in a consume queue; decoded as it is)
    view, crc32 = memoryview(buf), isal_zlib.crc32
    bodies, props = into.bodies, into.props
    body_had, props_had = len(bodies), len(props)
    crcs = []
    for a, b, c, d in zip(
        body_at.tolist(), body_end.tolist(), props_at.tolist(), rec_end.tolist(), strict=True
    ):
        body = view[a:b]
        crcs.append(crc32(body) & 0x7FFFFFFF)
        bodies += body
        props += view[c:d]
    bad = np.asarray(crcs, dtype=np.int64) != _gather(raw, starts, codec.OFFSET_BODYCRC, _I32)
    if bad.any():
        del bodies[body_had:], props[props_had:]
        _check(starts, bad, "body CRC")
    into.body_ends.extend((body_had + np.cumsum(body_end - body_at)).tolist())
    into.prop_ends.extend((props_had + np.cumsum(rec_end - props_at)).tolist())
    into.starts.extend((starts + into.size_bytes).tolist())
    into.parts.append(buf)
    into.size_bytes += len(buf)
    return True


def _record_starts(buf: bytes) -> list[int]:
    """Where each record of ``buf`` starts: the one step that must go record by record."""
    starts = []
    size_of, magic_ok, least = (
        codec.SIZE_MAGIC.unpack_from,
        codec.MESSAGE_MAGIC,
        codec.RECORD_MIN_BYTES,
    )
    pos, end = 0, len(buf)
    while pos < end:
        if end - pos < least:
            raise codec.CorruptRecord(f"at {pos}: {end - pos} bytes left, less than any record")
        total, magic = size_of(buf, pos)
        if magic != magic_ok or not least <= total <= end - pos:
            raise codec.CorruptRecord(
                f"at {pos}: not a message record (magic 0x{magic & 0xFFFFFFFF:08X}, "
                f"TOTALSIZE {total}, {end - pos} bytes left)"
            )
        starts.append(pos)
        pos += total
    return starts


def _check(starts: np.ndarray, bad: np.ndarray, what: str) -> None:
    if bad.any():
        at = int(starts[int(np.argmax(bad))])
        raise codec.CorruptRecord(f"at {at}: {what} does not fit the record")


def _binary(data: bytearray, ends: list[int], kind: pa.DataType) -> pa.Array:
    """A binary/string array over ``data`` (no copy), value i ending at ``ends[i]``."""
    offsets = np.zeros(len(ends) + 1, dtype=np.int32)
    offsets[1:] = ends
    return pa.Array.from_buffers(kind, len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _gather(raw: np.ndarray, starts: np.ndarray, at: int, dtype: np.dtype) -> np.ndarray:
    idx = starts[:, None] + np.arange(at, at + dtype.itemsize)
    return raw[idx].view(dtype).ravel().astype(dtype.newbyteorder("="))


def _by_name(names: pa.Array, values: pa.Array, parent: np.ndarray, n: int, name: str) -> pa.Array:
    """Per record, the value of property ``name`` (null when absent; the last one wins)."""
    hits = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
    pick = np.full(n, -1, dtype=np.int64)
    pick[parent[hits]] = hits
    return values.take(pa.array(pick, mask=pick < 0))


def _hosts(ip_port: np.ndarray) -> pa.Array:
    """ "ip:port" of each (4-byte ip, big-endian port) row, made text once per distinct pair."""
    keys = ip_port.view(">u8").ravel()
    uniq, inverse = np.unique(keys, return_inverse=True)
    texts = [codec.host_text(int(k >> 32).to_bytes(4, "big"), int(k & 0xFFFFFFFF)) for k in uniq]
    return pa.array(texts, type=pa.string()).take(pa.array(inverse.ravel()))


def columns(walked: Walked, topic: str, broker: str, schema: pa.Schema) -> pa.RecordBatch | None:
    """The records of ``walked`` as one record batch of ``schema`` (the reader's SCHEMA), or
    None when their properties are not UTF-8 (the general decoder replaces bad bytes)."""
    n = len(walked)
    try:
        props = _binary(walked.props, walked.prop_ends, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        return None
    raw = np.frombuffer(b"".join(walked.parts), dtype=np.uint8)
    starts = np.asarray(walked.starts, dtype=np.int64)
    items = pc.split_pattern(props, codec.PROPERTY_SEPARATOR)
    parent_all = pc.list_parent_indices(items).to_numpy()
    pairs = pc.split_pattern(items.flatten(), codec.NAME_VALUE_SEPARATOR, max_splits=1)
    named = pc.equal(pc.list_value_length(pairs), 2)
    pairs = pairs.filter(named)
    parent = parent_all[named.to_numpy(zero_copy_only=False)]
    names, values = pc.list_element(pairs, 0), pc.list_element(pairs, 1)
    shown = pc.invert(pc.is_in(names, value_set=_HIDDEN)).to_numpy(zero_copy_only=False)
    counts = np.bincount(parent[shown], minlength=n)
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=map_offsets[1:])
    prop_map = pa.MapArray.from_arrays(
        pa.array(map_offsets), names.filter(shown), values.filter(shown),
        type=schema.field("properties").type,
    )  # fmt: skip
    # The offset message id: store ip, port and commitlog offset as upper-case hex.
    phys_at = codec.OFFSET_PHYSICALOFFSET
    store = np.concatenate(
        [raw[starts[:, None] + np.arange(_STORE_HOST_AT, _STORE_HOST_AT + 8)],
         raw[starts[:, None] + np.arange(phys_at, phys_at + 8)]],
        axis=1,
    )  # fmt: skip
    hexed = np.empty((n, 32), dtype=np.uint8)
    hexed[:, 0::2], hexed[:, 1::2] = _HEX[store >> 4], _HEX[store & 0xF]
    id_offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    offset_ids = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(id_offsets), pa.py_buffer(hexed.tobytes())]
    )
    uniq = _by_name(names, values, parent, n, Prop.UNIQ_KEY)
    born_host = raw[starts[:, None] + np.arange(_BORN_HOST_AT, _BORN_HOST_AT + 8)]
    ts = pa.timestamp("us", tz="UTC")
    arrays = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(broker, pa.string()), n),
        pa.array(_gather(raw, starts, codec.OFFSET_QUEUEID, _I32)),
        pa.array(_gather(raw, starts, codec.OFFSET_QUEUEOFFSET, _I64)),
        pc.coalesce(uniq, offset_ids),
        _binary(walked.bodies, walked.body_ends, pa.binary()),
        _by_name(names, values, parent, n, Prop.KEYS),
        _by_name(names, values, parent, n, Prop.TAGS),
        prop_map,
        pa.array(_gather(raw, starts, _BORN_TS_AT, _I64) * 1000).cast(ts),
        pa.array(_gather(raw, starts, _STORE_TS_AT, _I64) * 1000).cast(ts),
        _hosts(np.ascontiguousarray(born_host)),
        pa.array(_gather(raw, starts, _RECONSUME_AT, _I32)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
