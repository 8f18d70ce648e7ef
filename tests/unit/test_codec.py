"""The commitlog record codec against SPEC §11.1, byte for byte, plus fuzzing of the decoder."""

from __future__ import annotations

import ipaddress
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq import codec
from rocketq.codec import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    CorruptRecord,
    HostAddress,
    Prop,
    SysFlag,
)

pytestmark = pytest.mark.unit

V4_BORN = HostAddress(bytes([192, 168, 1, 7]), 50123)
V4_STORE = HostAddress(bytes([10, 0, 0, 1]), 10911)
V6_BORN = HostAddress(ipaddress.ip_address("2001:db8::7").packed, 40000)
V6_STORE = HostAddress(ipaddress.ip_address("fe80::1").packed, 10911)


def _encode(**overrides: object) -> bytes:
    fields: dict[str, object] = {
        "topic_bytes": b"TopicTest",
        "body": b"hello world",
        "properties": codec.encode_properties({"TAGS": "tagA", "KEYS": "k1 k2"}),
        "queue_id": 3,
        "flag": 7,
        "queue_offset": 42,
        "physical_offset": 123_456,
        "sys_flag": 0,
        "born_timestamp_ms": 1_700_000_000_001,
        "born_host": V4_BORN,
        "store_timestamp_ms": 1_700_000_000_002,
        "store_host": V4_STORE,
        "reconsume_times": 2,
        "prepared_transaction_offset": 99,
    }
    fields.update(overrides)
    return codec.encode_record(**fields)  # type: ignore[arg-type]


def _by_hand(
    *,
    topic: bytes,
    body: bytes,
    props: bytes,
    born: HostAddress,
    store: HostAddress,
    sys_flag: int,
) -> bytes:
    """SPEC §11.1 laid out field by field, independently of the codec's Struct."""
    host_len_born = len(born.ip) + 4
    host_len_store = len(store.ip) + 4
    total = (4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + host_len_born + 8 + host_len_store + 4 + 8) + (
        4 + len(body) + 1 + len(topic) + 2 + len(props)
    )
    out = b""
    out += struct.pack(">i", total)  # 1 TOTALSIZE
    out += struct.pack(">I", 0xDAA320A7)  # 2 MAGICCODE
    out += struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF)  # 3 BODYCRC
    out += struct.pack(">i", 3)  # 4 QUEUEID
    out += struct.pack(">i", 7)  # 5 FLAG
    out += struct.pack(">q", 42)  # 6 QUEUEOFFSET
    out += struct.pack(">q", 123_456)  # 7 PHYSICALOFFSET
    out += struct.pack(">i", sys_flag)  # 8 SYSFLAG
    out += struct.pack(">q", 1_700_000_000_001)  # 9 BORNTIMESTAMP
    out += born.ip + struct.pack(">i", born.port)  # 10 BORNHOST
    out += struct.pack(">q", 1_700_000_000_002)  # 11 STORETIMESTAMP
    out += store.ip + struct.pack(">i", store.port)  # 12 STOREHOSTADDRESS
    out += struct.pack(">i", 2)  # 13 RECONSUMETIMES
    out += struct.pack(">q", 99)  # 14 PREPARED TRANSACTION OFFSET
    out += struct.pack(">i", len(body)) + body  # 15 BODY
    out += struct.pack(">b", len(topic)) + topic  # 16 TOPIC
    out += struct.pack(">h", len(props)) + props  # 17 PROPERTIES
    assert len(out) == total
    return out


# ---- constants and byte layout ---------------------------------------------------------------
def test_magic_codes_are_rocketmqs() -> None:
    assert MESSAGE_MAGIC == 0xDAA320A7
    assert BLANK_MAGIC == 0xCBD43194
    assert struct.unpack(">i", struct.pack(">I", MESSAGE_MAGIC))[0] == -626843481
    assert struct.unpack(">i", struct.pack(">I", BLANK_MAGIC))[0] == -875286124


def test_body_crc_is_masked_zlib_crc32() -> None:
    for body in (b"", b"a", b"hello world", bytes(range(256)) * 3):
        assert codec.body_crc(body) == zlib.crc32(body) & 0x7FFFFFFF
        assert codec.body_crc(body) >= 0
    # A body whose raw CRC32 has the top bit set really gets masked.
    body = next(b for b in (bytes([i]) for i in range(256)) if zlib.crc32(b) & 0x80000000)
    assert codec.body_crc(body) == zlib.crc32(body) - 0x80000000


def test_ipv4_record_matches_hand_built_bytes() -> None:
    props = codec.encode_properties({"TAGS": "tagA", "KEYS": "k1 k2"})
    raw = _encode()
    expected = _by_hand(
        topic=b"TopicTest",
        body=b"hello world",
        props=props,
        born=V4_BORN,
        store=V4_STORE,
        sys_flag=0,
    )
    assert raw == expected
    assert len(raw) == 84 + 4 + 11 + 1 + 9 + 2 + len(props)
    assert codec.record_size(11, 9, len(props), False, False) == len(raw)


def test_fixed_field_offsets() -> None:
    raw = _encode()
    assert struct.unpack_from(">i", raw, 0)[0] == len(raw)
    assert struct.unpack_from(">I", raw, codec.OFFSET_MAGIC)[0] == MESSAGE_MAGIC
    assert struct.unpack_from(">i", raw, codec.OFFSET_BODYCRC)[0] == codec.body_crc(b"hello world")
    assert struct.unpack_from(">q", raw, codec.OFFSET_QUEUEOFFSET)[0] == 42
    assert struct.unpack_from(">q", raw, codec.OFFSET_PHYSICALOFFSET)[0] == 123_456
    assert struct.unpack_from(">i", raw, codec.OFFSET_SYSFLAG)[0] == 0
    assert raw[codec.OFFSET_BORNHOST : codec.OFFSET_BORNHOST + 4] == V4_BORN.ip
    at = codec.store_timestamp_offset(0)
    assert at == 56
    assert struct.unpack_from(">q", raw, at)[0] == 1_700_000_000_002
    assert codec.peek_size_magic(raw) == (len(raw), MESSAGE_MAGIC)


@pytest.mark.parametrize(
    ("born", "store", "bits"),
    [
        (V6_BORN, V4_STORE, SysFlag.BORNHOST_V6),
        (V4_BORN, V6_STORE, SysFlag.STOREHOST_V6),
        (V6_BORN, V6_STORE, SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6),
    ],
)
def test_ipv6_hosts_set_sysflag_bits_and_20_byte_fields(
    born: HostAddress, store: HostAddress, bits: int
) -> None:
    props = codec.encode_properties({"TAGS": "tagA", "KEYS": "k1 k2"})
    raw = _encode(born_host=born, store_host=store, sys_flag=SysFlag.MULTI_TAGS)
    expected = _by_hand(
        topic=b"TopicTest",
        body=b"hello world",
        props=props,
        born=born,
        store=store,
        sys_flag=SysFlag.MULTI_TAGS | bits,
    )
    assert raw == expected
    (sys_flag,) = struct.unpack_from(">i", raw, codec.OFFSET_SYSFLAG)
    assert sys_flag & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6) == bits
    born_field = 20 if born.is_v6 else 8
    store_field = 20 if store.is_v6 else 8
    assert raw[48 : 48 + born_field] == born.ip + struct.pack(">i", born.port)
    at = codec.store_timestamp_offset(sys_flag)
    assert at == 48 + born_field
    assert struct.unpack_from(">q", raw, at)[0] == 1_700_000_000_002
    assert raw[at + 8 : at + 8 + store_field] == store.ip + struct.pack(">i", store.port)
    rec = codec.decode_record(raw)
    assert rec.born_host == born
    assert rec.store_host == store
    assert rec.sys_flag == sys_flag


def test_v6_bits_in_sysflag_follow_the_addresses_not_the_caller() -> None:
    # A caller passing stale v6 bits with IPv4 hosts must not produce a mis-sized record.
    raw = _encode(sys_flag=SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6 | SysFlag.COMPRESSED)
    (sys_flag,) = struct.unpack_from(">i", raw, codec.OFFSET_SYSFLAG)
    assert sys_flag == SysFlag.COMPRESSED
    assert codec.decode_record(raw).sys_flag == SysFlag.COMPRESSED


def test_decode_returns_every_field() -> None:
    raw = _encode()
    rec = codec.decode_record(raw)
    assert rec.total_size == len(raw)
    assert rec.body_crc == codec.body_crc(b"hello world")
    assert (rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset) == (3, 7, 42, 123_456)
    assert rec.born_timestamp_ms == 1_700_000_000_001
    assert rec.store_timestamp_ms == 1_700_000_000_002
    assert rec.born_host == V4_BORN
    assert rec.store_host == V4_STORE
    assert (rec.reconsume_times, rec.prepared_transaction_offset) == (2, 99)
    assert rec.body == b"hello world"
    assert rec.topic == "TopicTest"
    assert rec.properties == {"TAGS": "tagA", "KEYS": "k1 k2"}
    assert rec.tags == "tagA"
    assert rec.keys == "k1 k2"
    assert rec.uniq_key == ""
    assert rec.offset_msg_id == codec.encode_offset_msg_id(V4_STORE, 123_456)


def test_decode_at_position_inside_larger_buffer() -> None:
    a = _encode(queue_offset=0)
    b = _encode(queue_offset=1, body=b"second")
    buf = bytearray(a + b)
    rec = codec.decode_record(buf, len(a))
    assert rec.queue_offset == 1
    assert rec.body == b"second"
    recs = list(codec.iter_records(memoryview(bytes(buf))))
    assert [r.queue_offset for r in recs] == [0, 1]


def test_encode_rejects_oversized_topic_and_properties() -> None:
    with pytest.raises(ValueError, match="topic"):
        _encode(topic_bytes=b"t" * 128)
    with pytest.raises(ValueError, match="properties"):
        _encode(properties=b"x" * 32768)
    assert codec.decode_record(_encode(topic_bytes=b"t" * 127)).topic == "t" * 127


def test_explicit_crc_is_stored_and_checked() -> None:
    raw = _encode(crc=12345)
    assert struct.unpack_from(">i", raw, codec.OFFSET_BODYCRC)[0] == 12345
    with pytest.raises(CorruptRecord, match="CRC"):
        codec.decode_record(raw)
    assert codec.decode_record(raw, check_crc=False).body_crc == 12345


# ---- properties ------------------------------------------------------------------------------
def test_properties_wire_form() -> None:
    raw = codec.encode_properties({"TAGS": "a", "KEYS": "k1 k2"})
    assert raw == b"TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert codec.decode_properties(raw) == {"TAGS": "a", "KEYS": "k1 k2"}
    assert codec.encode_properties({}) == b""
    assert codec.decode_properties(b"") == {}


def test_properties_decode_tolerates_missing_trailing_separator() -> None:
    assert codec.decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}
    assert codec.decode_properties(memoryview(b"A\x011\x02")) == {"A": "1"}


@pytest.mark.parametrize("props", [{"A\x01": "v"}, {"A\x02": "v"}, {"A": "v\x01"}, {"A": "v\x02w"}])
def test_properties_reject_separator_characters(props: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="separator"):
        codec.encode_properties(props)


_prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    max_size=20,
)


@given(st.dictionaries(_prop_text, _prop_text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert codec.decode_properties(codec.encode_properties(props)) == props


# ---- message ids -----------------------------------------------------------------------------
def test_offset_msg_id_ipv4_is_16_bytes() -> None:
    host = HostAddress(bytes([10, 10, 10, 10]), 10911)
    msg_id = codec.encode_offset_msg_id(host, 0x1122334455)
    assert msg_id == "0A0A0A0A00002A9F0000001122334455"
    assert len(bytes.fromhex(msg_id)) == 16
    assert codec.decode_offset_msg_id(msg_id) == (host, 0x1122334455)
    assert codec.decode_offset_msg_id(msg_id.lower()) == (host, 0x1122334455)


def test_offset_msg_id_ipv6_is_28_bytes() -> None:
    msg_id = codec.encode_offset_msg_id(V6_STORE, 1 << 40)
    raw = bytes.fromhex(msg_id)
    assert len(raw) == 28
    assert raw[:16] == V6_STORE.ip
    assert raw[16:20] == struct.pack(">i", 10911)
    assert raw[20:] == struct.pack(">q", 1 << 40)
    assert codec.decode_offset_msg_id(msg_id) == (V6_STORE, 1 << 40)


@pytest.mark.parametrize(
    "bad",
    [
        "ZZ0A0A0A00002A9F0000001122334455",  # not hex
        "0A0A0A0A00002A9F000000112233445",  # odd number of digits
        "0A0A0A0A00002A9F00000011223344",  # 15 bytes
        "0A0A0A0A00002A9F000000112233445566",  # 17 bytes
        "",
    ],
)
def test_offset_msg_id_malformed_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        codec.decode_offset_msg_id(bad)


@given(
    st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
)
def test_offset_msg_id_round_trip(ip: bytes, port: int, offset: int) -> None:
    host = HostAddress(ip, port)
    assert codec.decode_offset_msg_id(codec.encode_offset_msg_id(host, offset)) == (host, offset)


def test_host_address_parse_and_str() -> None:
    assert HostAddress.parse("10.0.0.1:10911") == V4_STORE
    assert str(V4_STORE) == "10.0.0.1:10911"
    v6 = HostAddress.parse("[fe80::1]:10911")
    assert v6 == V6_STORE
    assert v6.is_v6
    assert str(v6) == "[fe80::1]:10911"
    for bad in ("10.0.0.1", "10.0.0.1:x", "nohost:1"):
        with pytest.raises(ValueError):
            HostAddress.parse(bad)


# ---- tags hash -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "java_hash"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("TagA", 2598919),
        ("polygenelubricants", -(2**31)),  # Java's famous Integer.MIN_VALUE hashCode
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # one code point, two UTF-16 units in Java
        ("é", 0xE9),
    ],
)
def test_tags_hash_equals_java_string_hashcode(text: str, java_hash: int) -> None:
    assert codec.tags_hash(text) == java_hash


def _java_hash_reference(s: str) -> int:
    h = 0
    raw = s.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) % 2**32
    return h - 2**32 if h >= 2**31 else h


@given(st.text(max_size=40))
def test_tags_hash_is_a_signed_java_int(text: str) -> None:
    h = codec.tags_hash(text)
    assert -(2**31) <= h < 2**31
    assert h == _java_hash_reference(text)


# ---- hypothesis round trips ------------------------------------------------------------------
_topics = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60
).filter(lambda t: len(t.encode()) <= codec.TOPIC_MAX_BYTES)
_hosts = st.builds(
    HostAddress,
    st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)),
    st.integers(0, 65535),
)
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)


_scalar_fields = st.fixed_dictionaries(
    {
        "queue_id": _i32,
        "flag": _i32,
        "queue_offset": _i64,
        "physical_offset": _i64,
        "sys_flag": st.integers(0, 0xF),
        "born_timestamp_ms": _i64,
        "store_timestamp_ms": _i64,
        "reconsume_times": _i32,
        "prepared_transaction_offset": _i64,
    }
)


@given(
    topic=_topics,
    body=st.binary(max_size=2048),
    props=st.dictionaries(_prop_text, _prop_text, max_size=6),
    hosts=st.tuples(_hosts, _hosts),
    scalars=_scalar_fields,
)
def test_encode_decode_round_trip(
    topic: str,
    body: bytes,
    props: dict[str, str],
    hosts: tuple[HostAddress, HostAddress],
    scalars: dict[str, int],
) -> None:
    born, store = hosts
    properties = codec.encode_properties(props)
    raw = codec.encode_record(
        topic_bytes=topic.encode(),
        body=body,
        properties=properties,
        born_host=born,
        store_host=store,
        **scalars,
    )
    lengths = (len(body), len(topic.encode()), len(properties))
    assert len(raw) == codec.record_size(*lengths, born.is_v6, store.is_v6)
    rec = codec.decode_record(raw)
    assert rec.topic == topic
    assert rec.body == body
    assert rec.properties == props
    assert rec.born_host == born
    assert rec.store_host == store
    for name, value in scalars.items():
        if name != "sys_flag":
            assert getattr(rec, name) == value, name
    assert rec.sys_flag & 0xF == scalars["sys_flag"]
    assert bool(rec.sys_flag & SysFlag.BORNHOST_V6) == born.is_v6
    assert bool(rec.sys_flag & SysFlag.STOREHOST_V6) == store.is_v6
    assert rec.total_size == len(raw)
    assert rec.body_crc == codec.body_crc(body)


# ---- the decoder never crashes on bad input --------------------------------------------------
def _decode_or_corrupt(buf: bytes | bytearray | memoryview, pos: int = 0) -> codec.Record | None:
    """Decode; CorruptRecord is the only exception allowed (IndexError etc. fail the test)."""
    try:
        return codec.decode_record(buf, pos)
    except CorruptRecord:
        return None


_sample_records = st.builds(
    lambda body, topic, props, born, store: codec.encode_record(
        topic_bytes=topic.encode(),
        body=body,
        properties=codec.encode_properties(props),
        queue_id=1,
        flag=0,
        queue_offset=5,
        physical_offset=1000,
        sys_flag=0,
        born_timestamp_ms=1,
        born_host=born,
        store_timestamp_ms=2,
        store_host=store,
    ),
    st.binary(max_size=300),
    _topics,
    st.dictionaries(_prop_text, _prop_text, max_size=3),
    _hosts,
    _hosts,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.integers(0, 16))
def test_decode_garbage_raises_only_corrupt_record(garbage: bytes, pos: int) -> None:
    _decode_or_corrupt(garbage, pos)
    _decode_or_corrupt(memoryview(garbage), pos)


@settings(max_examples=300)
@given(st.binary(max_size=400), st.integers(-(2**31), 2**31 - 1))
def test_decode_garbage_behind_a_valid_magic(tail: bytes, total: int) -> None:
    # The magic check passes, so every later length check has to hold on its own.
    buf = struct.pack(">iI", total, MESSAGE_MAGIC) + tail
    _decode_or_corrupt(buf)


@settings(max_examples=200)
@given(_sample_records, st.data())
def test_decode_truncated_record_raises_corrupt_record(raw: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CorruptRecord):
        codec.decode_record(raw[:cut])


@settings(max_examples=300)
@given(_sample_records, st.data())
def test_decode_bit_flipped_record_never_crashes(raw: bytes, data: st.DataObject) -> None:
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    flipped = bytearray(raw)
    flipped[bit // 8] ^= 1 << (bit % 8)
    rec = _decode_or_corrupt(flipped)
    byte = bit // 8
    (sys_flag,) = struct.unpack_from(">i", raw, codec.OFFSET_SYSFLAG)
    body_at = codec._FIXED[
        (bool(sys_flag & SysFlag.BORNHOST_V6), bool(sys_flag & SysFlag.STOREHOST_V6))
    ].size
    (body_len,) = struct.unpack_from(">i", raw, body_at)
    # Fields the decoder checks (size, magic, CRC, the body it covers) must never pass.
    if byte < 12 or body_at + 4 <= byte < body_at + 4 + body_len:
        assert rec is None


@settings(max_examples=200)
@given(_sample_records, st.data())
def test_decode_overwritten_bytes_never_crash(raw: bytes, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(raw) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=32))
    damaged = bytearray(raw)
    damaged[start : start + len(junk)] = junk
    _decode_or_corrupt(bytes(damaged))


def test_decode_rejects_blank_record() -> None:
    blank = struct.pack(">iI", 64, BLANK_MAGIC) + bytes(56)
    with pytest.raises(CorruptRecord, match="magic"):
        codec.decode_record(blank)


def test_decode_rejects_huge_declared_sizes_without_allocating() -> None:
    raw = bytearray(_encode())
    struct.pack_into(">i", raw, 84, 2**31 - 1)  # body length
    with pytest.raises(CorruptRecord, match="body length"):
        codec.decode_record(raw)
    raw = bytearray(_encode())
    struct.pack_into(">i", raw, 84, -5)
    with pytest.raises(CorruptRecord, match="body length"):
        codec.decode_record(raw)


def test_decode_rejects_non_utf8_topic() -> None:
    raw = _encode(topic_bytes=b"\xff\xfe")
    with pytest.raises(CorruptRecord, match="UTF-8"):
        codec.decode_record(raw)


def test_uniq_key_property_name() -> None:
    rec = codec.decode_record(_encode(properties=codec.encode_properties({Prop.UNIQ_KEY: "U1"})))
    assert rec.uniq_key == "U1"


# ---- peeking single fields ---------------------------------------------------------------------
_HOST_COMBINATIONS = [
    (V4_BORN, V4_STORE),
    (V6_BORN, V4_STORE),
    (V4_BORN, V6_STORE),
    (V6_BORN, V6_STORE),
]


@pytest.mark.parametrize(("born", "store"), _HOST_COMBINATIONS)
def test_peeks_agree_with_a_full_decode(born: HostAddress, store: HostAddress) -> None:
    raw = b"junk" + _encode(born_host=born, store_host=store, sys_flag=SysFlag.TRANSACTION_COMMIT)
    rec = codec.decode_record(raw, 4)
    assert codec.peek_size_magic(raw, 4) == (rec.total_size, MESSAGE_MAGIC)
    assert codec.peek_flag(raw, 4) == rec.flag
    assert codec.peek_physical_offset(raw, 4) == rec.physical_offset
    assert codec.peek_sys_flag(raw, 4) == rec.sys_flag
    assert codec.peek_store_timestamp(raw, 4) == rec.store_timestamp_ms
    assert codec.peek_reconsume_times(raw, 4) == rec.reconsume_times
    assert codec.peek_prepared_transaction_offset(raw, 4) == rec.prepared_transaction_offset
    head = codec.RECORD_HEAD.unpack_from(raw, 4)
    assert head == (
        rec.total_size,
        MESSAGE_MAGIC,
        rec.body_crc,
        rec.queue_id,
        rec.flag,
        rec.queue_offset,
        rec.physical_offset,
        rec.sys_flag,
    )
    assert codec.fixed_bytes(rec.sys_flag) == codec._FIXED[(born.is_v6, store.is_v6)].size


@pytest.mark.parametrize(("born", "store"), _HOST_COMBINATIONS)
def test_record_spans_locate_body_topic_and_properties(
    born: HostAddress, store: HostAddress
) -> None:
    props = codec.encode_properties({"TAGS": "tagA"})
    raw = b"xy" + _encode(born_host=born, store_host=store, body=b"the body", properties=props)
    total, _magic = codec.peek_size_magic(raw, 2)
    sys_flag = codec.peek_sys_flag(raw, 2)
    body_at, body_end, topic_at, topic_end, props_at = codec.record_spans(raw, 2, total, sys_flag)
    assert raw[body_at:body_end] == b"the body"
    assert raw[topic_at:topic_end] == b"TopicTest"
    assert raw[props_at : 2 + total] == props
    assert codec.record_properties_bytes(raw, 2) == props


def test_record_spans_name_the_length_that_does_not_fit() -> None:
    raw = bytearray(_encode())
    struct.pack_into(">i", raw, codec.FIXED_BYTES_V4, len(raw))  # body length past the end
    with pytest.raises(CorruptRecord, match="body length"):
        codec.record_spans(raw, 0, len(raw), 0)
    with pytest.raises(CorruptRecord, match="host fields"):
        codec.record_spans(raw, 0, codec.FIXED_BYTES_V4 + 2, 0)


def test_peeks_raise_corrupt_record_on_a_short_buffer() -> None:
    raw = _encode()
    with pytest.raises(CorruptRecord):
        codec.peek_store_timestamp(raw[:50])
    with pytest.raises(CorruptRecord):
        codec.peek_physical_offset(raw[:30])


def test_field_offsets_match_the_spec_table() -> None:
    # SPEC §11.1: fields 1–8 are 4, 4, 4, 4, 4, 8, 8, 4 bytes.
    assert codec.OFFSET_QUEUEID == 12 and codec.OFFSET_FLAG == 16
    assert codec.OFFSET_PHYSICALOFFSET == 28 and codec.OFFSET_SYSFLAG == 36
    assert codec.store_timestamp_offset(0) == 56
    assert codec.store_timestamp_offset(SysFlag.BORNHOST_V6) == 68
    assert codec.record_size(0, 0, 0, False, False) == codec.RECORD_MIN_BYTES
