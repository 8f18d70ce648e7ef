"""Pulled messages decoded lazily (issue 16): every check still made at decode time, every field
equal to the eager decode's, whatever is read first and whatever is assigned before."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketq import codec
from rocketq.codec import CorruptRecord, HostAddress, Prop, SysFlag
from rocketq.message import ReceivedMessage, decode_records
from rocketq.properties import find_property

pytestmark = pytest.mark.unit

V4 = HostAddress(b"\x7f\x00\x00\x01", 5555)
V6 = HostAddress(bytes(15) + b"\x01", 10911)


def record(
    offset: int,
    *,
    body: bytes = b"hello",
    props: dict[str, str] | None = None,
    born: HostAddress = V4,
    store: HostAddress = V4,
    sys_flag: int = 0,
    topic: bytes = b"Orders",
) -> bytes:
    properties = {Prop.TAGS: "t", Prop.UNIQ_KEY: f"U{offset}", "k": "v"} if props is None else props
    return codec.encode_record(
        topic_bytes=topic,
        body=body,
        properties=codec.encode_properties(properties),
        queue_id=3,
        flag=7,
        queue_offset=offset,
        physical_offset=1000 * offset,
        sys_flag=sys_flag,
        born_timestamp_ms=111 + offset,
        born_host=born,
        store_timestamp_ms=222 + offset,
        store_host=store,
        reconsume_times=offset % 4,
        prepared_transaction_offset=99,
    )


def eager(buf: bytes, broker: str = "b") -> list[ReceivedMessage]:
    return [ReceivedMessage.from_record(r, broker) for r in codec.iter_records(buf)]


@pytest.mark.parametrize(
    ("born", "store"), [(V4, V4), (V6, V4), (V4, V6), (V6, V6)], ids=["v4", "born6", "store6", "v6"]
)
def test_every_field_equals_the_eager_decode_for_each_host_family(
    born: HostAddress, store: HostAddress
) -> None:
    buf = b"".join(record(i, born=born, store=store) for i in range(3))
    for lazy, full in zip(decode_records(buf, "b"), eager(buf), strict=True):
        # Field by field, each one the first read of a fresh message.
        for f in dataclasses.fields(ReceivedMessage):
            fresh = decode_records(buf, "b")[full.queue_offset]
            assert getattr(fresh, f.name) == getattr(full, f.name), f.name
        assert lazy == full and full == lazy
        assert dataclasses.asdict(lazy) == dataclasses.asdict(full)
    assert decode_records(buf)[0].store_host == str(store)


def test_without_a_unique_key_the_msg_id_is_the_offset_msg_id() -> None:
    (m,) = decode_records(record(5, props={Prop.TAGS: "x"}))
    assert m.msg_id == m.offset_msg_id == codec.encode_offset_msg_id(V4, 5000)
    assert m.tags == "x" and m.keys == []


def test_a_compressed_body_is_inflated_at_decode() -> None:
    raw = b"abc" * 100
    buf = record(1, body=zlib.compress(raw), sys_flag=SysFlag.COMPRESSED)
    (m,) = decode_records(buf)
    assert m.body == raw and m == eager(buf, "")[0]


def test_the_pull_s_extra_properties_join_each_message_s_own() -> None:
    bounds = {Prop.MIN_OFFSET: "0", Prop.MAX_OFFSET: "42"}
    a, b = decode_records(record(1) + record(2), "b", bounds)
    assert a.properties[Prop.MAX_OFFSET] == "42" and a.properties["k"] == "v"
    a.properties["mine"] = "1"  # each message its own dict
    assert "mine" not in b.properties and "mine" not in bounds


def test_a_field_assigned_before_its_first_read_keeps_the_assigned_value() -> None:
    m, n = decode_records(record(1) + record(2))
    m.reconsume_times += 1  # a read then a write, as a failed send-back does
    n.store_host = "elsewhere:1"  # a write first: the other fixed fields still decode
    assert m.reconsume_times == 2 and m.born_timestamp_ms == 112
    assert n.store_host == "elsewhere:1" and n.born_host == str(V4) and n.reconsume_times == 2
    m.properties = {"only": "this"}
    assert m.msg_id == m.offset_msg_id  # no UNIQ_KEY in what was assigned


_PROPERTY_TEXT = st.text(st.sampled_from("ab\u00e9\x01\x02"), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(
        st.one_of(_PROPERTY_TEXT.map(str.encode), st.sampled_from([b"\xff", b"\xc3"])),
        max_size=12,
    ).map(b"".join),
    name=_PROPERTY_TEXT.filter(lambda n: "\x01" not in n and "\x02" not in n),
)
def test_one_property_is_found_as_decoding_them_all_finds_it(raw: bytes, name: str) -> None:
    # any bytes, separators and broken UTF-8 among them, and a name given twice: the last wins
    framed = b"junk" + raw + b"junk"
    want = codec.decode_properties(raw)
    for n in {name, *want}:
        assert find_property(framed, 4, 4 + len(raw), n) == want.get(n), n


def test_a_pulled_message_reads_one_property_without_decoding_them_all() -> None:
    bounds = {Prop.MIN_OFFSET: "0", Prop.MAX_OFFSET: "42", "k": "from the pull"}
    buf = record(1, props={Prop.TAGS: "t", Prop.UNIQ_KEY: "U1", "k": "v", "e": ""}) + record(2)
    for m, full in zip(decode_records(buf, "b", bounds), eager(buf), strict=True):
        full.properties.update(bounds)
        for name in (Prop.TAGS, Prop.UNIQ_KEY, Prop.MAX_OFFSET, "k", "e", "missing"):
            assert m.get_property(name) == full.properties.get(name), name
        assert (m.tags, m.keys, m.msg_id) == (full.tags, full.keys, full.msg_id)
        m.properties = {"only": "this"}  # assigned: what it holds from then on
        assert m.get_property("only") == "this" and m.get_property(Prop.TAGS) is None


def test_copies_and_pickles_are_plain_messages_without_the_pulled_buffer() -> None:
    (m,) = decode_records(record(1) * 1 + record(2))[:1]
    for other in (copy.copy(m), pickle.loads(pickle.dumps(m))):
        assert type(other) is ReceivedMessage and other == m
    assert len(pickle.dumps(m)) < 1024
    assert repr(m).startswith("ReceivedMessage(topic='Orders'")


def _body_at(rec: bytes) -> int:
    return codec.fixed_bytes(0) + 4


def _flip_body_byte(rec: bytes) -> bytes:
    at = _body_at(rec)
    return rec[:at] + bytes([rec[at] ^ 1]) + rec[at + 1 :]


def _set_topic_len(rec: bytes, n: int) -> bytes:
    at = _body_at(rec) + 10
    return rec[:at] + bytes([n]) + rec[at + 1 :]


def _set_topic_bytes(rec: bytes, raw: bytes) -> bytes:
    at = _body_at(rec) + 10 + 1
    return rec[:at] + raw + rec[at + len(raw) :]


def _set_props_len(rec: bytes, n: int) -> bytes:
    at = _body_at(rec) + 10 + 1 + len(b"Orders")
    return rec[:at] + n.to_bytes(2, "big") + rec[at + 2 :]


def test_a_pull_mixing_topics_and_host_families_decodes_as_the_eager_decode() -> None:
    """The decode checks a record whose topic is the previous record's inline; a new topic, an
    IPv6 host or anything unusual takes the field-by-field path. Both give the eager decode's
    messages, whatever the order."""
    buf = (
        record(0)
        + record(1, topic=b"Other")
        + record(2, topic="Bestellungen-\u00e9".encode())
        + record(3, topic="Bestellungen-\u00e9".encode(), born=V6)
        + record(4, topic="Bestellungen-\u00e9".encode())
        + record(5, store=V6)
        + record(6)
    )
    got = decode_records(buf, "b")
    assert got == eager(buf)
    assert [m.topic for m in got] == ["Orders", "Other"] + ["Bestellungen-\u00e9"] * 3 + [
        "Orders"
    ] * 2
    assert [m.born_host for m in got[2:5]] == [str(V4), str(V6), str(V4)]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda b: b[:-1], "exceeds the"),  # truncated: TOTALSIZE beyond the buffer
        (lambda b: b[:4] + b"\0\0\0\0" + b[8:], "magic"),
        (lambda b: b + b"\0" * 5, "bytes left"),  # a tail too short for a record
        (_flip_body_byte, "CRC"),
        (lambda b: _set_topic_len(b, 200), "topic length"),
        (lambda b: _set_topic_bytes(b, b"\xff\xfe"), "UTF-8"),
        (lambda b: _set_props_len(b, 3), "properties length"),
        (lambda b: _set_props_len(b, 60_000), "properties length"),
    ],
    ids=[
        "truncated",
        "magic",
        "short-tail",
        "crc",
        "topic-length",
        "topic-utf8",
        "props-short",
        "props-long",
    ],
)
def test_a_corrupt_record_fails_loudly_at_decode_not_at_first_read(damage, says) -> None:  # type: ignore[no-untyped-def]
    good = record(1, body=b"0123456789")
    buf = record(0) + damage(good)
    with pytest.raises(CorruptRecord, match=says):
        decode_records(buf)
    with pytest.raises(CorruptRecord, match=says):
        eager(buf)  # the eager decode agrees


_CLEAN = record(0, born=V6) + record(1, body=b"0123456789") + record(2, store=V6)


@settings(max_examples=300, deadline=None)
@given(
    at=st.integers(0, len(_CLEAN) - 1),
    value=st.integers(0, 255),
    cut=st.integers(1, len(_CLEAN)),
)
def test_any_damaged_byte_or_cut_is_refused_or_decoded_as_the_eager_decode_does(
    at: int, value: int, cut: int
) -> None:
    buf = (_CLEAN[:at] + bytes([value]) + _CLEAN[at + 1 :])[:cut]
    try:
        want = eager(buf)
    except CorruptRecord:
        with pytest.raises(CorruptRecord):
            decode_records(buf, "b")
        return
    assert decode_records(buf, "b") == want
