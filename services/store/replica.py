"""Replicated commitlog bytes: what a master reads out, what a slave writes in (DESIGN.md §6).

A slave's commitlog is a byte-for-byte copy of its master's, at the same physical offsets, so an
offset message id, a consume-queue unit or an index entry means the same on both. The master
reads raw bytes (records and file-end BLANK fillers as stored, never across a file end:
:func:`read_replica`); the slave writes them and builds its own consume queues and index from
them (:class:`ReplicaWriter`).

Slave write path, per chunk
---------------------------
1. The chunk must start at the commitlog's max offset. It is written as received, but a chunk
   may end inside a record: that *partial tail* is also kept in memory, and its first 8 bytes
   (TOTALSIZE, MAGIC) are written as zeros until the next chunk completes the record. A crash
   in between therefore leaves recovery a zero header, which it reads as the end of the log
   (and the bytes after it as a torn tail to cut), never half a record that happens to pass
   its checks (the CRC covers only the body: a record cut inside its properties would).
2. Every whole record is checked: magic, TOTALSIZE against the file's remaining room, the
   stored physical offset against where it lands, every length field, the body CRC (the bodies
   of one length in a chunk by one fold: :func:`_crcs_hold`). A BLANK must reach exactly the
   file's end. The checked prefix is written (``CommitLog.append_raw``).
3. The records are dispatched exactly as on the master: the queue offset stored inside each
   record is used as is (never re-assigned), so consume-queue units and queue offsets match.
   Only the fields dispatch needs are read (topic, queue id and offset, store time, sys flag,
   prepared offset, and the TAGS / KEYS / UNIQ_KEY properties found by byte search), not a full
   decode: a slave must keep up with a busy master on one core. A chunk of enough plain
   records is read by numpy and dispatched as runs of one queue (``DispatchRun``: columns, as
   a master dispatches a producer's batch), anything else one DispatchRequest per record.
   When such a chunk holds one topic and no KEYS, the index is handed the hashes of its
   ``topic#UNIQ_KEY`` keys, computed from the ids' bytes (``DispatchRun.index_hashes``).
4. On a failed check the good prefix is written and dispatched, the bad bytes and everything
   after them are dropped, and :class:`ReplicaCorruptError` is raised: the slave's store is
   consistent and the stream restarts from its end.

Truncation (:meth:`ReplicaWriter.truncate`) cuts the commitlog, every consume queue (binary
search for the first unit past the cut) and the index back to a record boundary, the same
invariant recovery restores after a torn tail.
"""

from __future__ import annotations

import functools
import itertools
import re
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple, overload

import numpy as np

from rocketq import codec, java_hash
from rocketq.codec import BLANK_MAGIC, MESSAGE_MAGIC
from services.store.commitlog import NOT_QUEUED, TRANSACTION_MASK, CommitLog
from services.store.consume_queue import CQ_UNIT, CQ_UNIT_BYTES, PRE_BLANK_SIZE, ConsumeQueue
from services.store.dispatch import Dispatcher
from services.store.errors import ReplicaCorruptError, ReplicaRangeError
from services.store.mapped_file import MappedFileQueue
from services.store.types import DispatchRequest, DispatchRun, PhysicalOffset, QueueOffset

DISPATCH_BATCH_MAX = 4096
"""Records handed to the dispatcher at once (bounds one event-loop step on a big chunk)."""
TOPIC_CACHE_MAX = 100_000

_HEADER_BYTES = codec.SIZE_MAGIC.size
"""TOTALSIZE + MAGIC: withheld from the commitlog while their record is partial."""
_TAGS = (codec.Prop.TAGS + codec.NAME_VALUE_SEPARATOR).encode()
_KEYS = (codec.Prop.KEYS + codec.NAME_VALUE_SEPARATOR).encode()
_UNIQ = (codec.Prop.UNIQ_KEY + codec.NAME_VALUE_SEPARATOR).encode()
_LONG = struct.Struct(">q")
_V4 = codec.V4_FIXED_AND_BODY_LEN
_V4_BODY_AT = _V4.size
"""Where an IPv4 record's body starts: its fixed fields, then BODYLENGTH."""
_HOST_BITS = codec.HOST_V6_BITS
_HOST_BIT_VALUES = (0, codec.SysFlag.BORNHOST_V6, codec.SysFlag.STOREHOST_V6, _HOST_BITS)
# The codec's field offsets for each host family, looked up per record without a call.
_STORE_TS_AT = {bits: codec.store_timestamp_offset(bits) for bits in _HOST_BIT_VALUES}
_PREPARED_AT = {bits: codec.prepared_transaction_offset_at(bits) for bits in _HOST_BIT_VALUES}


_V4_FIELDS = (
    "size", "magic", "crc", "queue_id", "flag", "queue_offset", "phys", "sys_flag", "born_ts",
    "born_ip", "born_port", "store_ts", "store_ip", "store_port", "reconsume", "prepared",
    "body_len",
)  # fmt: skip
"""The names of ``codec.V4_FIXED_AND_BODY_LEN``'s fields, in order."""


def _numpy_dtype(fmt: str, names: tuple[str, ...]) -> np.dtype:
    """A structured numpy dtype with the layout of the big-endian struct format ``fmt``."""
    kinds = {"i": ">i4", "I": ">u4", "q": ">i8", "h": ">i2", "H": ">u2", "B": "u1"}
    fields = [
        (f"S{count}" if code == "s" else kinds[code])
        for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt.lstrip(">"))
        for _ in range(1 if code == "s" else int(count or 1))
    ]
    assert len(fields) == len(names), (fmt, names)
    return np.dtype(list(zip(names, fields, strict=True)))


_V4_DTYPE = _numpy_dtype(_V4.format, _V4_FIELDS)
assert _V4_DTYPE.itemsize == _V4.size
_SIZE_MAGIC_DTYPE = _numpy_dtype(codec.SIZE_MAGIC.format, ("size", "magic"))
FAST_RECORDS_MIN = 8
"""From this many whole records on, a chunk's headers are read and checked by numpy (one read
of every header, a strided view or a gather, ~35 µs per chunk) rather than one unpack and a
dozen comparisons per record; below it the fixed cost does not pay."""


def read_replica(commitlog: CommitLog, physical_offset: PhysicalOffset, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` stored bytes from ``physical_offset``, never past a file's end.

    b"" at the max offset (nothing new). :class:`ReplicaRangeError` below the oldest retained
    byte or beyond the max offset.
    """
    lo, hi = commitlog.min_offset, commitlog.max_offset
    if physical_offset < lo or physical_offset > hi:
        raise ReplicaRangeError(
            f"replication read at {physical_offset}: the commitlog holds [{lo}, {hi})"
        )
    if physical_offset == hi or max_bytes <= 0:
        return b""
    mf = commitlog.files.find(physical_offset)
    if mf is None:
        return b""
    pos = physical_offset - mf.file_from_offset
    n = min(max_bytes, mf.wrote_position - pos)
    return bytes(mf.view[pos : pos + n]) if n > 0 else b""


def _prop(buf: bytes, name: bytes, i: int, start: int, end: int) -> str:
    """The value of property ``name`` (given with its ``\\x01``) in ``buf[start:end]``, or "".

    ``i`` is ``buf.find(name, start, end)``, done by the caller (a miss costs no call)."""
    while i > start and buf[i - 1] != 2:  # must start an item, not end another item's name
        i = buf.find(name, i + 1, end)
    if i < 0:
        return ""
    vs = i + len(name)
    ve = buf.find(b"\x02", vs, end)
    return buf[vs : ve if ve >= 0 else end].decode("utf-8", "replace")


def _variable_part(
    buf: bytes,
    mv: memoryview,
    pos: int,
    size: int,
    sys_flag: int,
    crc: int,
    topics: dict[bytes, str],
) -> tuple[str, int] | str:
    """Check the body (lengths, CRC), topic and properties of the ``size``-byte record at
    ``pos``; (topic, where the properties start), or the problem."""
    try:
        body_at, body_end, topic_at, topic_end, props_at = codec.record_spans(
            buf, pos, size, sys_flag
        )
    except codec.CorruptRecord as exc:
        return str(exc)
    if codec.crc32(mv[body_at:body_end]) & 0x7FFFFFFF != crc:
        return "body CRC mismatch"
    topic_raw = buf[topic_at:topic_end]
    topic = topics.get(topic_raw)
    if topic is None:
        try:
            topic = topic_raw.decode()
        except UnicodeDecodeError:
            return "topic is not UTF-8"
        if len(topics) < TOPIC_CACHE_MAX:
            topics[topic_raw] = topic
    return topic, props_at


def _whole_records(buf: bytes, pos: int = 0) -> list[int]:
    """Where each whole message record in ``buf`` from ``pos`` on begins (up to a BLANK, a bad
    magic or size, or a partial record)."""
    size_magic = codec.SIZE_MAGIC.unpack_from
    n = len(buf)
    starts: list[int] = []
    add = starts.append
    while n - pos >= _HEADER_BYTES:
        size, magic = size_magic(buf, pos)
        if magic != MESSAGE_MAGIC or size < codec.RECORD_MIN_BYTES or n - pos < size:
            break
        add(pos)
        pos += size
    return starts


def _record_starts(buf: bytes) -> np.ndarray | None:
    """:func:`_whole_records` for a numpy read, or None for fewer than FAST_RECORDS_MIN (a
    chunk of a few records builds no array at all). A producer's batch is records of one size,
    so the first record's size is taken as a guess for all: one strided view of the buffer
    checks every guessed header at once, and only from the first one that does not match does
    the walk go record by record (a chunk of mixed sizes pays a few µs for nothing)."""
    n = len(buf)
    if n < _HEADER_BYTES:
        return None
    size, magic = codec.SIZE_MAGIC.unpack_from(buf, 0)
    if magic != MESSAGE_MAGIC or size < codec.RECORD_MIN_BYTES or n // size < FAST_RECORDS_MIN:
        starts = _whole_records(buf)
        return np.array(starts, dtype=np.int64) if len(starts) >= FAST_RECORDS_MIN else None
    count = n // size
    at = np.arange(0, count * size, size, dtype=np.int64)
    head = np.ndarray((count,), _SIZE_MAGIC_DTYPE, buf, 0, (size,))  # a view: no copy
    same = (head["size"] == size) & (head["magic"] == MESSAGE_MAGIC)
    if same.all():
        return at
    same_end = int(same.argmin())  # the first guess that missed; the ones before it are whole
    rest = _whole_records(buf, same_end * size)
    if same_end + len(rest) < FAST_RECORDS_MIN:
        return None
    return np.concatenate((at[:same_end], np.array(rest, dtype=np.int64)))


def _rows(buf: bytes, starts: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes at each of ``starts`` (all inside ``buf``) as the rows of a
    ``(len(starts), width)`` uint8 array: a strided view of ``buf`` when the starts are evenly
    spaced (records of one size, a producer's batch), else one gather (a copy). The gather
    picks rows of a view whose row ``i`` is the ``width`` bytes at ``i`` (each row one copy):
    5x faster than indexing the bytes by a ``(len(starts), width)`` array of positions."""
    first, last = int(starts[0]), int(starts[-1])
    step = (last - first) // max(1, len(starts) - 1)
    if step > 0 and (np.diff(starts) == step).all():
        return np.ndarray((len(starts), width), np.uint8, buf, first, (step, 1))
    windows = np.ndarray((len(buf) - width + 1, width), np.uint8, buf, 0, (1, 1))
    rows: np.ndarray = windows[starts]
    return rows


def _crcs_hold(buf: bytes, body_at: np.ndarray, body_len: np.ndarray, crcs: np.ndarray) -> bool:
    """Whether the bodies at ``body_at`` have their stored (31-bit) CRCs. Bodies of one length,
    a producer's batch, are checked together: a CRC-32 is linear apart from a constant of the
    length, so the XOR of n bodies' CRCs is the CRC of their XOR, plus the CRC of that many
    zero bytes when n is even. One numpy fold and one CRC call replace a call per record
    (0.45 µs each in a chunk); anything else is checked record by record.

    Folding keeps what a slave checks for: damage to the bytes between the master's check of
    each record (as it was sent, or as the master made it) and this one, on a disk, in memory
    or on the wire. Damage within one record changes the fold exactly as it changes that
    record's CRC, so it is caught as surely; only damage to two or more records whose effects
    cancel would pass, one chance in 2**31 for damage at random. A fold that fails sends the
    chunk to the record-by-record read, which names the record."""
    length = int(body_len[0])
    if len(body_at) > 1 and (body_len == length).all():
        folded = np.bitwise_xor.reduce(_rows(buf, body_at, length), axis=0)
        crc = codec.crc32(folded.tobytes())
        if len(body_at) % 2 == 0:
            crc ^= _zeros_crc(length)
        return bool(crc & 0x7FFFFFFF == int(np.bitwise_xor.reduce(crcs)))
    crc32, mv = codec.crc32, memoryview(buf)
    ends = (body_at + body_len).tolist()
    actual = [crc32(mv[b:e]) for b, e in zip(body_at.tolist(), ends, strict=True)]
    return bool(((np.array(actual, dtype=np.int64) & 0x7FFFFFFF) == crcs).all())


@functools.lru_cache(maxsize=64)
def _zeros_crc(length: int) -> int:
    """The CRC of ``length`` zero bytes: the constant a fold of an even number of bodies of
    that length lacks (see :func:`_crcs_hold`)."""
    return codec.crc32(bytes(length))


def _decode_fast(
    buf: bytes, base: int, file_size_bytes: int, topics: dict[bytes, str], tag_codes: TagCodes
) -> tuple[int, list[DispatchRun]] | None:
    """The whole message records at the start of ``buf``, checked as :func:`decode_chunk`
    checks them, with every header read by one numpy gather, as runs of one queue each (what
    dispatch takes as columns); None when there are too few to pay, when one is a transaction's
    (those take the record-by-record path), or when any check fails (:func:`decode_chunk` then
    reads them one by one and names the problem). Returns (where they end, the runs)."""
    at = _record_starts(buf)
    if at is None:
        return None
    raw = np.frombuffer(buf, dtype=np.uint8)
    head = _rows(buf, at, _V4.size).view(_V4_DTYPE)[:, 0]
    size = head["size"].astype(np.int64)
    here = at + base
    room = file_size_bytes - here % file_size_bytes
    body_at = at + _V4_BODY_AT
    body_end = body_at + head["body_len"]
    ends = at + size
    if not (
        (head["phys"] == here).all()
        and not (head["sys_flag"] & (_HOST_BITS | TRANSACTION_MASK)).any()
        and not head["prepared"].any()
        and (head["body_len"] > 0).all()
        and (size <= room).all()
        and not ((room - size > 0) & (room - size < _HEADER_BYTES)).any()
        and (body_end + 3 <= ends).all()
    ):
        return None
    topic_end = body_end + 1 + raw[body_end]
    props_at = topic_end + 2
    if not (props_at <= ends).all():
        return None
    props_len = (raw[topic_end].astype(np.int64) << 8) | raw[topic_end + 1]
    if not (props_at + props_len == ends).all():
        return None
    if not _crcs_hold(buf, body_at, head["body_len"], head["crc"]):
        return None
    names = _topics(buf, body_end + 1, topic_end, topics)
    if names is None:
        return None  # a topic not seen yet: the slow path decodes and checks it
    uniform = _uniform_properties(buf, props_at, ends, tag_codes)
    uniqs: Sequence[str]
    index_hashes = None
    if uniform is None:
        each = [
            _record_properties(buf, cur, end, tag_codes)
            for cur, end in zip(props_at.tolist(), ends.tolist(), strict=True)
        ]
        tags_codes, keys, uniqs = (list(column) for column in zip(*each, strict=True))
    else:
        count = len(at)
        tags_codes, keys = [uniform.tags_code] * count, [uniform.keys] * count
        width = uniform.ids.shape[1]
        uniqs = FixedWidthStrings(uniform.ids.tobytes().decode("ascii"), width, count)
        if isinstance(names, str) and width and not uniform.keys:
            index_hashes = java_hash.index_key_hashes_of_rows(names + "#", uniform.ids)
    queue_id, queue_offset = head["queue_id"], head["queue_offset"]
    cut = (queue_id[1:] != queue_id[:-1]) | (queue_offset[1:] != queue_offset[:-1] + 1)
    if isinstance(names, list):
        cut |= np.array([a is not b for a, b in zip(names[1:], names, strict=False)])
    bounds = [0, *(np.flatnonzero(cut) + 1).tolist(), len(at)]
    phys, sizes, stamps = here.tolist(), size.tolist(), head["store_ts"].tolist()
    qids, qoffs, flags = queue_id.tolist(), queue_offset.tolist(), head["sys_flag"].tolist()
    runs = [
        DispatchRun(
            names if isinstance(names, str) else names[i],
            qids[i],
            QueueOffset(qoffs[i]),
            phys[i:j],
            sizes[i:j],
            tags_codes[i:j],
            stamps[i:j],
            keys[i:j],
            uniqs[i:j],
            flags[i:j],
            PhysicalOffset(phys[j - 1] + sizes[j - 1]),
            index_hashes[i:j] if index_hashes is not None else None,
        )
        for i, j in itertools.pairwise(bounds)
    ]
    return ends[-1].item(), runs


def _topics(
    buf: bytes, starts: np.ndarray, ends: np.ndarray, topics: dict[bytes, str]
) -> str | list[str] | None:
    """The topic of every record (its name is ``buf[start:end]``): one name when all are the
    same bytes (compared by numpy), else one per record, the same str object for the same
    topic; None when one is not in ``topics``."""
    lengths = ends - starts
    length = int(lengths[0])
    if (lengths == length).all():
        grid = _rows(buf, starts, length)
        if (grid == grid[0]).all():
            return topics.get(buf[int(starts[0]) : int(ends[0])])
    get = topics.get
    names = [get(buf[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    return None if None in names else names  # type: ignore[return-value]


class UniformProperties(NamedTuple):
    """What the properties of a producer's batch share, and their UNIQ_KEYs."""

    tags_code: int
    keys: str
    ids: np.ndarray
    """One row per record: its UNIQ_KEY value, ASCII bytes (``uint8``), all of one length."""


class FixedWidthStrings(Sequence[str]):
    """``count`` strings of ``width`` characters laid end to end in ``text``, each cut only when
    read: a slave's UNIQ_KEY column, whose index entries come from the bytes (most are never
    read as strings at all)."""

    __slots__ = ("_count", "_start", "_text", "_width")

    def __init__(self, text: str, width: int, count: int, start: int = 0) -> None:
        self._text = text
        self._width = width
        self._count = count
        self._start = start

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._count)
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            return FixedWidthStrings(
                self._text, self._width, max(0, stop - start), self._start + start
            )
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(i)
        at = (self._start + i) * self._width
        return self._text[at : at + self._width]


def _record_properties(buf: bytes, cur: int, end: int, tag_codes: TagCodes) -> tuple[int, str, str]:
    """The TAGS code, KEYS and UNIQ_KEY of the properties ``buf[cur:end]``, by byte search (a
    miss costs no call); a value that starts the properties or follows a \\x02 is read here,
    anything else by _prop. A TAGS value's code is cached by its bytes (a queue's records
    mostly share one)."""
    find = buf.find
    i = find(_TAGS, cur, end)
    if i < 0:
        tags_code = 0
    elif i == cur or buf[i - 1] == 2:
        at = i + len(_TAGS)
        ve = find(b"\x02", at, end)
        value = buf[at : ve if ve >= 0 else end]
        cached = tag_codes.get(value)
        tags_code = cached if cached is not None else tag_codes.learn(value)
    else:
        tags_code = codec.tags_hash(_prop(buf, _TAGS, i, cur, end))
    i = find(_KEYS, cur, end)
    keys = "" if i < 0 else _prop(buf, _KEYS, i, cur, end)
    i = find(_UNIQ, cur, end)
    if i < 0:
        uniq = ""
    elif i == cur or buf[i - 1] == 2:
        at = i + len(_UNIQ)
        ve = find(b"\x02", at, end)
        uniq = buf[at : ve if ve >= 0 else end].decode("utf-8", "replace")
    else:
        uniq = _prop(buf, _UNIQ, i, cur, end)
    return tags_code, keys, uniq


def _uniform_properties(
    buf: bytes, starts: np.ndarray, ends: np.ndarray, tag_codes: TagCodes
) -> UniformProperties | None:
    """:func:`_record_properties` of records whose properties are the same bytes but for an
    ASCII UNIQ_KEY value of one length (a producer's batch: same tags and keys, a unique id
    each): the first record's TAGS and KEYS stand for all, the ids are rows of the records'
    bytes. None for any other records.

    Why one search stands for all: with no \\x01 or \\x02 inside the ids, every name search
    finds in each record what it finds in the first (a match cannot start or end inside an
    id), and the bytes around the ids are equal."""
    lengths = ends - starts
    length = int(lengths[0])
    if not (lengths == length).all():
        return None
    cur = int(starts[0])
    end = cur + length
    i = buf.find(_UNIQ, cur, end)
    while i > cur and buf[i - 1] != 2:  # as _prop: the name must start an item
        i = buf.find(_UNIQ, i + 1, end)
    if i < 0:
        return None
    value_at = i + len(_UNIQ) - cur
    value_end = buf.find(b"\x02", cur + value_at, end)
    value_end = (value_end if value_end >= 0 else end) - cur
    grid = _rows(buf, starts, length)
    ids = grid[:, value_at:value_end]
    if not (
        (grid[:, :value_at] == grid[0, :value_at]).all()
        and (grid[:, value_end:] == grid[0, value_end:]).all()
        and (ids < 0x80).all()
        and not ((ids == 1) | (ids == 2)).any()
    ):
        return None
    tags_code, keys, _ = _record_properties(buf, cur, end, tag_codes)
    return UniformProperties(tags_code, keys, ids)


class TagCodes(dict[bytes, int]):
    """TAGS values (bytes, as stored) to their consume-queue tags codes, bounded."""

    def learn(self, value: bytes) -> int:
        code = codec.tags_hash(value.decode("utf-8", "replace"))
        if len(self) < TOPIC_CACHE_MAX:
            self[value] = code
        return code


class Decoded(NamedTuple):
    """What :func:`decode_chunk` found: the first ``good`` bytes are whole and good records
    (and BLANKs), to be dispatched as ``runs`` then ``requests``. With no ``problem`` the rest
    of the chunk is a partial tail; with one, the rest starts with bad bytes."""

    good: int
    runs: list[DispatchRun]
    """The records the numpy read took (a prefix), as columns."""
    requests: list[DispatchRequest]
    """The records after them, read one by one."""
    problem: str | None

    def all_requests(self) -> list[DispatchRequest]:
        """Every good record as a DispatchRequest, in order (for tests and comparisons)."""
        return [req for run in self.runs for req in run.requests()] + self.requests


def decode_chunk(
    buf: bytes,
    base: int,
    file_size_bytes: int,
    topics: dict[bytes, str],
    tag_codes: TagCodes | None = None,
) -> Decoded:
    """Check the whole records and BLANKs at the start of ``buf`` (which lands at ``base``).
    ``topics`` caches decoded topic names, ``tag_codes`` TAGS codes."""
    codes = tag_codes if tag_codes is not None else TagCodes()
    fast = _decode_fast(buf, base, file_size_bytes, topics, codes)
    pos, runs = fast if fast is not None else (0, [])
    reqs: list[DispatchRequest] = []
    mv = memoryview(buf)
    n = len(buf)
    head = codec.RECORD_HEAD.unpack_from
    size_magic = codec.SIZE_MAGIC.unpack_from
    long_at = _LONG.unpack_from
    v4 = _V4.unpack_from
    crc32 = codec.crc32
    while n - pos >= _HEADER_BYTES:
        here = base + pos
        room = file_size_bytes - here % file_size_bytes
        size, magic = size_magic(buf, pos)
        if magic == BLANK_MAGIC:
            if size != room:
                return Decoded(
                    pos,
                    runs,
                    reqs,
                    f"at {here}: a {size}-byte BLANK does not end its file ({room})",
                )
            if n - pos < size:
                break
            pos += size
            continue
        if magic != MESSAGE_MAGIC:
            return Decoded(
                pos, runs, reqs, f"at {here}: magic 0x{magic:08X} starts neither record nor BLANK"
            )
        if size < codec.RECORD_MIN_BYTES or size > room or 0 < room - size < _HEADER_BYTES:
            return Decoded(
                pos, runs, reqs, f"at {here}: TOTALSIZE {size} does not fit ({room} bytes left)"
            )
        if n - pos < size:
            break
        end = pos + size
        # The IPv4 layout, checked inline: one unpack for the whole header; anything that does
        # not add up takes the general path below, which names the problem.
        (_s, _m, crc, queue_id, _f, queue_offset, phys, sys_flag, _bt, _bh, _bp, store_ts,
         _sh, _sp, _rt, prepared, body_len) = v4(buf, pos)  # fmt: skip
        topic = None
        if not sys_flag & _HOST_BITS and phys == here and body_len > 0:
            body_at = pos + _V4_BODY_AT
            body_end = body_at + body_len
            if body_end + 3 <= end:
                topic_end = body_end + 1 + buf[body_end]
                cur = topic_end + 2
                if (
                    cur <= end
                    and cur + ((buf[topic_end] << 8) | buf[topic_end + 1]) == end
                    and crc32(mv[body_at:body_end]) & 0x7FFFFFFF == crc
                ):
                    topic = topics.get(buf[body_end + 1 : topic_end])
        if topic is None:  # another layout, a topic not seen yet, or a problem
            _size, _magic, crc, queue_id, _flag, queue_offset, phys, sys_flag = head(buf, pos)
            if phys != here:
                return Decoded(pos, runs, reqs, f"at {here}: the record says it is at {phys}")
            checked = _variable_part(buf, mv, pos, size, sys_flag, crc, topics)
            if isinstance(checked, str):
                return Decoded(pos, runs, reqs, f"at {here}: {checked}")
            topic, cur = checked
            store_ts = long_at(buf, pos + _STORE_TS_AT[sys_flag & _HOST_BITS])[0]
            prepared = long_at(buf, pos + _PREPARED_AT[sys_flag & _HOST_BITS])[0]
        tags_code, keys, uniq = _record_properties(buf, cur, end, codes)
        reqs.append(
            DispatchRequest(
                topic,
                queue_id,
                PhysicalOffset(here),
                size,
                tags_code,
                store_ts,
                QueueOffset(queue_offset),
                keys,
                uniq,
                sys_flag,
                prepared,
            )
        )
        pos = end
    return Decoded(pos, runs, reqs, None)


class ReplicaWriter:
    """A slave's side: append replicated chunks, dispatch them, truncate. One per store."""

    def __init__(self, commitlog: CommitLog, dispatcher: Dispatcher) -> None:
        self.commitlog = commitlog
        self.dispatcher = dispatcher
        self.pending = b""
        """The partial tail: the bytes between the last whole record and the commitlog's end."""
        self._topics: dict[bytes, str] = {}
        self._tag_codes = TagCodes()
        self.records_appended = 0

    @property
    def dispatched_offset(self) -> PhysicalOffset:
        """End of the last whole record written and dispatched (the partial tail excluded)."""
        return PhysicalOffset(self.commitlog.max_offset - len(self.pending))

    def append(self, physical_offset: PhysicalOffset, data: bytes | memoryview) -> PhysicalOffset:
        """Write and dispatch a chunk; return the commitlog's new max offset.

        ``physical_offset`` must be the commitlog's max offset, else ValueError (or the end of
        the last whole record: the stream restarted there, the partial tail is dropped first).
        Raises :class:`ReplicaCorruptError` after keeping the good prefix.
        """
        cl = self.commitlog
        received = cl.max_offset
        whole_end = self.dispatched_offset
        if physical_offset != received:
            if physical_offset != whole_end:
                raise ValueError(
                    f"replicated chunk at {physical_offset}, but this commitlog ends at "
                    f"{received} (the last whole record at {whole_end})"
                )
            self.drop_partial()
            received = whole_end
        if not data:
            return received
        # One copy: the caller's buffer is reused once this returns (a data-socket frame is a
        # view of the reader's buffer), so the chunk is copied, behind the partial tail when
        # there is one (the bytes written are that copy's end).
        held = len(self.pending)
        buf = self.pending + data if held else bytes(data)
        good, runs, reqs, problem = decode_chunk(
            buf, whole_end, cl.file_size_bytes, self._topics, self._tag_codes
        )
        cl.append_raw(received, memoryview(buf)[held:] if held else buf)
        if good and self.pending:  # the old partial is whole now: give it its header back
            _write_at(cl, whole_end, buf[: min(_HEADER_BYTES, len(self.pending))])
        if problem is None:
            self.pending = buf[good:]
            if self.pending:  # a new partial tail: withhold its header (module docstring)
                tail = PhysicalOffset(whole_end + good)
                _write_at(cl, tail, bytes(min(_HEADER_BYTES, len(self.pending))))
        else:
            self.pending = b""
            truncate_keeping_position(cl.files, whole_end + good)
        for run in runs:
            self._dispatch_run(run)
        if reqs:
            self._dispatch(reqs)
        if problem is not None:
            raise ReplicaCorruptError(
                f"replicated bytes rejected {problem}; the commitlog now ends at "
                f"{cl.max_offset} (the last good record)"
            )
        return cl.max_offset

    def drop_partial(self) -> None:
        """Cut the partial tail off the commitlog (before a clean shutdown, a stream restart)."""
        if self.pending:
            end = self.commitlog.max_offset - len(self.pending)
            self.pending = b""
            truncate_keeping_position(self.commitlog.files, end)

    def _dispatch(self, reqs: list[DispatchRequest]) -> None:
        offsets = self.commitlog.queue_offsets
        for r in reqs:
            if r.sys_flag & TRANSACTION_MASK not in NOT_QUEUED:
                key = (r.topic, r.queue_id)
                nxt = r.queue_offset + 1
                if offsets.get(key, 0) < nxt:
                    offsets[key] = nxt
        cl = self.commitlog
        cl.last_store_timestamp_ms = max(cl.last_store_timestamp_ms, reqs[-1].store_timestamp_ms)
        for i in range(0, len(reqs), DISPATCH_BATCH_MAX):
            self.dispatcher.dispatch(reqs[i : i + DISPATCH_BATCH_MAX])
        self.records_appended += len(reqs)

    def _dispatch_run(self, run: DispatchRun) -> None:
        """:meth:`_dispatch` for a run (one queue, nothing transactional)."""
        offsets = self.commitlog.queue_offsets
        key = (run.topic, run.queue_id)
        nxt = run.first_queue_offset + len(run.physical_offsets)
        if offsets.get(key, 0) < nxt:
            offsets[key] = nxt
        cl = self.commitlog
        cl.last_store_timestamp_ms = max(cl.last_store_timestamp_ms, run.store_timestamps_ms[-1])
        self.dispatcher.dispatch_run(run)
        self.records_appended += len(run.physical_offsets)

    def truncate(self, physical_offset: PhysicalOffset, queues: Iterable[ConsumeQueue]) -> None:
        """Drop everything at or after ``physical_offset``: commitlog bytes (a partial tail
        too), consume-queue units and index entries built from them.

        :class:`ReplicaRangeError` below the commitlog's oldest byte or beyond its end. Queue
        max offsets go back with their units; the epoch history is the caller's (the slave
        adopts its master's).
        """
        cl = self.commitlog
        received = cl.max_offset
        if physical_offset > received or (physical_offset < cl.min_offset and cl.files.files):
            raise ReplicaRangeError(
                f"cannot truncate at {physical_offset}: the commitlog holds "
                f"[{cl.min_offset}, {received})"
            )
        whole_end = received - len(self.pending)
        self.pending = self.pending[: max(0, physical_offset - whole_end)]
        if physical_offset < received:
            truncate_keeping_position(cl.files, physical_offset)
        if physical_offset >= whole_end:
            return
        for cq in queues:
            truncate_queue(cq, physical_offset)
            cl.queue_offsets[(cq.topic, cq.queue_id)] = cq.max_offset
        if self.dispatcher.index is not None:
            self.dispatcher.index.truncate(physical_offset)
        self.dispatcher.dispatched_offset = min(self.dispatcher.dispatched_offset, physical_offset)


def _write_at(commitlog: CommitLog, physical_offset: PhysicalOffset, data: bytes) -> None:
    """Overwrite written bytes in place (a record header never spans two files)."""
    mf = commitlog.files.find(physical_offset)
    assert mf is not None, f"offset {physical_offset} lies inside the commitlog's files"
    mf.write_at(physical_offset - mf.file_from_offset, data)


def truncate_keeping_position(files: MappedFileQueue, offset: int) -> None:
    """Cut ``files`` at ``offset`` so that its max offset becomes exactly ``offset``.

    ``MappedFileQueue.truncate`` deletes a file that starts at the cut; when that is the only
    file left (retention deleted the older ones), the queue would forget where it stood and
    report 0. Here the first file is kept, empty, instead.
    """
    first = files.first
    if first is not None and offset == first.file_from_offset and offset > 0:
        files.truncate(offset + files.file_size_bytes, written_only=True)
        first.zero_from(0, first.wrote_position)
    else:
        files.truncate(offset, written_only=True)


def truncate_queue(cq: ConsumeQueue, physical_offset: PhysicalOffset) -> None:
    """Drop the units of ``cq`` whose record ends past ``physical_offset``.

    A queue's units point at increasing physical offsets, so the first unit to drop is found
    by binary search (pre-blank units at the front always stay).
    """
    files = cq.files
    if not files.files:
        return
    first_unit = files.min_offset() // CQ_UNIT_BYTES
    lo, hi = first_unit, files.max_offset() // CQ_UNIT_BYTES
    end_unit = hi
    while lo < hi:
        mid = (lo + hi) // 2
        off, size = _unit(files, mid)
        if size == PRE_BLANK_SIZE or off + size <= physical_offset:
            lo = mid + 1
        else:
            hi = mid
    if lo == end_unit:
        return
    truncate_keeping_position(files, lo * CQ_UNIT_BYTES)
    cq.min_logic_offset = min(cq.min_logic_offset, lo * CQ_UNIT_BYTES)
    cq.max_physical_end = 0
    if lo > first_unit:
        off, size = _unit(files, lo - 1)
        if size != PRE_BLANK_SIZE:
            cq.max_physical_end = off + size


def _unit(files: MappedFileQueue, queue_offset: int) -> tuple[PhysicalOffset, int]:
    at = queue_offset * CQ_UNIT_BYTES
    mf = files.find(at)
    assert mf is not None, f"unit {queue_offset} lies inside the queue's files"
    off, size, _tags = CQ_UNIT.unpack_from(mf.view, at - mf.file_from_offset)
    return off, size
