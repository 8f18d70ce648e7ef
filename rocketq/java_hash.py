"""Java's ``String.hashCode`` in Python, one key at a time and for whole batches.

The index file (``index_file.py``) stores ``abs(hashCode(topic + "#" + key))`` in every entry
and picks the slot from it, so a RocketMQ broker and RocketQ must agree on this number bit for
bit or neither could read the other's index files.

Java defines ``s.hashCode()`` over the string's UTF-16 code units::

    h = s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1]      (mod 2^32, read as a signed int)

A Python ``str`` counts code points, not UTF-16 units: a character outside the Basic
Multilingual Plane (an emoji, say) is one code point but two units (a surrogate pair) in Java,
so the exact path encodes to UTF-16 first. Every character below U+0100 is one unit whose value
equals its Latin-1 byte, which is what lets the fast paths work on plain bytes.

Batch hashing: keys of one length ``L`` become an ``(n, L)`` ``uint8`` matrix; one matrix-vector
product with the powers ``31^(L-1) .. 31^0`` (kept mod 2^64 in ``uint64``, which wraps) gives
every hash at once, and the low 32 bits of a sum mod 2^64 are the sum mod 2^32. Grouping by
length (rather than padding every key to the longest) keeps one very long key from inflating
the whole matrix.
"""

from __future__ import annotations

import sys

import numpy as np

_MASK32 = 0xFFFF_FFFF
_INT32_MIN = -(2**31)
_TWO_POW_31 = 2**31
_TWO_POW_32 = 2**32

# Keys this long or shorter are hashed without masking inside the loop: the unmasked value has
# at most ~5 bits per character, and a few hundred bits of int is cheaper than masking each step.
_UNMASKED_LEN_MAX = 128

# A length group smaller than this is hashed key by key: building a matrix has a fixed cost of
# a few microseconds, which only pays off over several keys.
_GROUP_MIN = 8

# Powers of 31 mod 2^64, grown on demand; index i holds 31^i.
_powers31: list[int] = [1]

# UTF-16 in the machine's byte order, so a memoryview cast to "H" reads the code units directly.
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def _to_signed32(h: int) -> int:
    h &= _MASK32
    return h - _TWO_POW_32 if h >= _TWO_POW_31 else h


def _hash_units(units: bytes | memoryview) -> int:
    """Unsigned 32-bit hash of a sequence of code units (bytes or UTF-16 units)."""
    h = 0
    if len(units) <= _UNMASKED_LEN_MAX:
        for c in units:
            h = h * 31 + c
        return h & _MASK32
    for c in units:
        h = (h * 31 + c) & _MASK32
    return h


def _java_hash_unsigned(s: str) -> int:
    if s.isascii():
        return _hash_units(s.encode("ascii"))
    # surrogatepass: a Python str may hold a lone surrogate, which Java also allows as one unit.
    raw = s.encode(_UTF16_NATIVE, "surrogatepass")
    return _hash_units(memoryview(raw).cast("H"))


def java_string_hash(s: str) -> int:
    """Return Java's ``s.hashCode()``: a signed 32-bit int over the UTF-16 code units of ``s``."""
    return _to_signed32(_java_hash_unsigned(s))


def _key_hash_from_unsigned(h: int) -> int:
    # Java's Math.abs(Integer.MIN_VALUE) is still negative; RocketMQ maps that one value to 0.
    if h < _TWO_POW_31:
        return h
    if h == _TWO_POW_31:
        return 0
    return _TWO_POW_32 - h


def index_key_hash(s: str) -> int:
    """Return the index-file hash of ``s``: ``abs(s.hashCode())``, or 0 for ``Integer.MIN_VALUE``.

    Always in ``[0, 2^31 - 1]``; the slot is this value modulo the slot count.
    """
    return _key_hash_from_unsigned(_java_hash_unsigned(s))


def _powers_desc(length: int) -> np.ndarray:
    """``[31^(length-1), ..., 31^1, 31^0]`` mod 2^64 as ``uint64``."""
    while len(_powers31) < length:
        _powers31.append((_powers31[-1] * 31) & 0xFFFF_FFFF_FFFF_FFFF)
    return np.array(_powers31[length - 1 :: -1] if length else [], dtype=np.uint64)


def _hash_group(keys: list[str], length: int) -> np.ndarray:
    """Unsigned 32-bit hashes (as ``uint64``) of same-length Latin-1 keys, by one mat-vec."""
    flat = np.frombuffer("".join(keys).encode("latin-1"), dtype=np.uint8)
    matrix = flat.reshape(len(keys), length).astype(np.uint64)
    # uint64 products and sums wrap mod 2^64, so the low 32 bits are exact mod 2^32.
    hashes: np.ndarray = (matrix @ _powers_desc(length)) & np.uint64(_MASK32)
    return hashes


def _hash_latin1(keys: list[str], out: np.ndarray, positions: np.ndarray) -> None:
    """Write the unsigned hashes of Latin-1 ``keys`` into ``out[positions]``, grouped by length."""
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    order = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[order]
    # Start of each run of equal lengths in the sorted order, plus the end sentinel.
    bounds = np.flatnonzero(np.diff(sorted_lengths)) + 1
    starts = [0, *bounds.tolist()]
    ends = [*bounds.tolist(), len(keys)]
    for a, b in zip(starts, ends, strict=True):
        length = int(sorted_lengths[a])
        members_idx = order[a:b]
        if b - a < _GROUP_MIN or length == 0:
            for i in members_idx.tolist():
                out[positions[i]] = _hash_units(keys[i].encode("latin-1"))
            continue
        members = keys if b - a == len(keys) else [keys[i] for i in members_idx.tolist()]
        out[positions[members_idx]] = _hash_group(members, length).astype(np.int64)


def _unsigned_hashes(keys: list[str]) -> np.ndarray:
    """Unsigned 32-bit Java hashes of ``keys`` as an ``int64`` array, batched where it pays."""
    count = len(keys)
    out = np.zeros(count, dtype=np.int64)
    try:
        # The common case: every key is Latin-1 (one UTF-16 unit per character, unit == byte).
        "".join(keys).encode("latin-1")
    except UnicodeEncodeError:
        fast = [i for i, k in enumerate(keys) if k.isascii()]
        for i in sorted(set(range(count)).difference(fast)):
            out[i] = _java_hash_unsigned(keys[i])  # exact UTF-16 path for non-ASCII keys
        if fast:
            _hash_latin1([keys[i] for i in fast], out, np.asarray(fast, dtype=np.int64))
        return out
    if count:
        _hash_latin1(keys, out, np.arange(count, dtype=np.int64))
    return out


def index_key_hashes_array(keys: list[str]) -> np.ndarray:
    """:func:`index_key_hash` of every key, as an ``int64`` numpy array (for vectorised callers)."""
    return _key_hashes_from_unsigned(_unsigned_hashes(keys))


def index_key_hashes_of_rows(prefix: str, rows: np.ndarray) -> np.ndarray | None:
    """:func:`index_key_hash` of ``prefix`` + each row of ``rows`` (an ``(n, L)`` ``uint8``
    array of ASCII keys, one per row), as an ``int64`` array, without a ``str`` per key; None
    when ``prefix`` is not ASCII. Java's hash of a concatenation is the first part's hash times
    ``31^L`` plus the second's, so the prefix is hashed once."""
    if not prefix.isascii():
        return None
    length = rows.shape[1]
    head = (_hash_units(prefix.encode("ascii")) * pow(31, length, _TWO_POW_32)) & _MASK32
    unsigned = ((rows.astype(np.uint64) @ _powers_desc(length)) + np.uint64(head)) & np.uint64(
        _MASK32
    )
    return _key_hashes_from_unsigned(unsigned.astype(np.int64))


def _key_hashes_from_unsigned(h: np.ndarray) -> np.ndarray:
    """:func:`_key_hash_from_unsigned` of every element of ``h`` (``int64``)."""
    result = np.where(h >= _TWO_POW_31, _TWO_POW_32 - h, h)
    result[h == _TWO_POW_31] = 0  # the Integer.MIN_VALUE case, as in index_key_hash
    return result


def index_key_hashes(keys: list[str]) -> list[int]:
    """:func:`index_key_hash` of every key; equal to ``[index_key_hash(k) for k in keys]``."""
    return [int(v) for v in index_key_hashes_array(keys).tolist()]


def java_string_hashes(keys: list[str]) -> list[int]:
    """:func:`java_string_hash` of every key, batched."""
    h = _unsigned_hashes(keys)
    return [int(v) for v in np.where(h >= _TWO_POW_31, h - _TWO_POW_32, h).tolist()]


__all__ = [
    "index_key_hash",
    "index_key_hashes",
    "index_key_hashes_array",
    "index_key_hashes_of_rows",
    "java_string_hash",
    "java_string_hashes",
]
