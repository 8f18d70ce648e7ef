"""Pulled records straight into Arrow columns: the read path's hot loop.

A Pull answer is the stored records laid end to end (SPEC §11.1). Turning each into a
:class:`~rocketq.message.ReceivedMessage` and then into 13 Python lists cost about 10 µs a
message, most of a Spark read's time. Here one Python loop per record only walks the records
(lengths checked by :mod:`rocketq.codec`, body CRC checked) and notes where each starts; every
column is then cut from the bytes at once with numpy and pyarrow compute:

| column                     | how                                                          |
|----------------------------|--------------------------------------------------------------|
| queueId, queueOffset,      | big-endian fields gathered at fixed offsets from each start  |
| timestamps, reconsumeTimes |                                                              |
| body                       | the body slices joined into one buffer + an offsets buffer   |
| properties, keys, tags,    | the properties slices as one string array, split on the      |
| msgId                      | separators by pyarrow; msgId is UNIQ_KEY, else the offset id |
| bornHost                   | the (ip, port) pairs made text once per distinct pair        |
| topic, brokerName          | the queue's (a consume queue holds records of its topic only) |

Records this layout does not cover (IPv6 hosts, compressed bodies, another topic, properties
that are not UTF-8) are returned as ``None`` by :func:`columns`, and the caller decodes them the
general way; the output is the same either way (tests/unit/test_spark_arrow.py).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    bodies: list[memoryview] = field(default_factory=list)
    props: list[memoryview] = field(default_factory=list)
    size_bytes: int = 0

    def __len__(self) -> int:
        return len(self.starts)


def walk(into: Walked, buf: bytes, topic: bytes, end_offset: int) -> bool:
    """Add the records of one Pull answer below queue offset ``end_offset`` to ``into``; False
    (and ``into`` unchanged) when one of them needs the general decoder."""
    view = memoryview(buf)
    base = into.size_bytes
    starts: list[int] = []
    bodies: list[memoryview] = []
    props: list[memoryview] = []
    check_head, spans, crc32 = codec._check_head, codec.record_spans, zlib.crc32
    qoff_of = codec._LONG.unpack_from
    crc_of = codec._INT.unpack_from
    pos, end = 0, len(buf)
    while pos < end:
        total, sys_flag = check_head(buf, pos)
        if sys_flag & _PLAIN_FLAGS:
            return False
        if qoff_of(buf, pos + codec.OFFSET_QUEUEOFFSET)[0] >= end_offset:
            break
        try:
            body_at, body_end, topic_at, topic_end, props_at = spans(buf, pos, total, sys_flag)
        except codec.CorruptRecord as exc:
            raise codec.CorruptRecord(f"at {pos}: {exc}") from None
        if view[topic_at:topic_end] != topic:
            return False
        body = view[body_at:body_end]
        if crc32(body) & 0x7FFFFFFF != crc_of(buf, pos + codec.OFFSET_BODYCRC)[0]:
            raise codec.CorruptRecord(f"at {pos}: body CRC mismatch")
        starts.append(base + pos)
        bodies.append(body)
        props.append(view[props_at : pos + total])
        pos += total
    into.parts.append(buf)
    into.starts.extend(starts)
    into.bodies.extend(bodies)
    into.props.extend(props)
    into.size_bytes += len(buf)
    return True


def _binary(slices: list[memoryview], kind: pa.DataType) -> pa.Array:
    """One binary/string array of ``slices`` (one copy: the join)."""
    lengths = np.fromiter((len(s) for s in slices), dtype=np.int64, count=len(slices))
    offsets = np.zeros(len(slices) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = pa.py_buffer(b"".join(slices))
    return pa.Array.from_buffers(kind, len(slices), [None, pa.py_buffer(offsets), data])


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
        props = _binary(walked.props, pa.binary()).cast(pa.string())
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
        _binary(walked.bodies, pa.binary()),
        _by_name(names, values, parent, n, Prop.KEYS),
        _by_name(names, values, parent, n, Prop.TAGS),
        prop_map,
        pa.array(_gather(raw, starts, _BORN_TS_AT, _I64) * 1000).cast(ts),
        pa.array(_gather(raw, starts, _STORE_TS_AT, _I64) * 1000).cast(ts),
        _hosts(np.ascontiguousarray(born_host)),
        pa.array(_gather(raw, starts, _RECONSUME_AT, _I32)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
