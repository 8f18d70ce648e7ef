"""Subscription parsing, the tag-hash filter and the SQL92 record filter (filter.py, SPEC §6.17)."""

from __future__ import annotations

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2
from services.broker.filter import (
    SubscriptionData,
    parse_subscription,
    property_reader,
    record_filter_of,
    tags_filter_of,
)
from services.common.errors import ServiceError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("expression", ["", "*", "  *  ", "A || *"])
def test_match_all_expressions_have_no_filter(expression: str) -> None:
    sub = parse_subscription("T", expression)
    assert sub.match_all
    assert sub.tags == frozenset()
    assert tags_filter_of(sub, enable_property_filter=False) is None


def test_empty_expression_reads_as_star() -> None:
    assert parse_subscription("T", "").expression == "*"


def test_tags_are_split_trimmed_and_hashed() -> None:
    sub = parse_subscription("T", " TagA ||TagB||  TagC ", sub_version=7)
    assert sub.tags == {"TagA", "TagB", "TagC"}
    assert sub.codes == {codec.tags_hash(t) for t in ("TagA", "TagB", "TagC")}
    assert sub.sub_version == 7
    assert sub.expression_type == common_pb2.TAG
    assert not sub.match_all


def test_tags_filter_matches_by_hash_only() -> None:
    sub = parse_subscription("T", "TagA || TagB")
    accept = tags_filter_of(sub, enable_property_filter=False)
    assert accept is not None
    assert accept(codec.tags_hash("TagA"))
    assert accept(codec.tags_hash("TagB"))
    assert not accept(codec.tags_hash("TagC"))
    assert not accept(0)  # a message without a tag has tags code 0
    assert sub.matches_code(codec.tags_hash("TagB"))
    assert not sub.matches_code(codec.tags_hash("Other"))


def test_java_hash_collision_passes_the_broker_filter() -> None:
    # "Aa" and "BB" share Java's String.hashCode: the broker lets both through, and the client
    # drops the wrong one by string (SPEC §6.17).
    assert codec.tags_hash("Aa") == codec.tags_hash("BB")
    accept = tags_filter_of(parse_subscription("T", "Aa"), enable_property_filter=False)
    assert accept is not None and accept(codec.tags_hash("BB"))


def test_unspecified_type_is_tag() -> None:
    sub = parse_subscription("T", "A", common_pb2.EXPRESSION_TYPE_UNSPECIFIED)
    assert sub.expression_type == common_pb2.TAG


@pytest.mark.parametrize("expression", ["||", " || || "])
def test_expression_without_a_tag_is_illegal(expression: str) -> None:
    with pytest.raises(ServiceError) as err:
        parse_subscription("T", expression)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION


def test_overlong_expression_is_illegal() -> None:
    with pytest.raises(ServiceError) as err:
        parse_subscription("T", "A" * 5000)
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION


def test_too_many_tags_is_illegal() -> None:
    with pytest.raises(ServiceError) as err:
        parse_subscription("T", " || ".join(f"t{i}" for i in range(300)))
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION


def test_unknown_expression_type_is_illegal() -> None:
    with pytest.raises(ServiceError) as err:
        parse_subscription("T", "A", 9)  # type: ignore[arg-type]
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION


def test_sql92_without_property_filter_is_illegal_expression() -> None:
    sub = parse_subscription("T", "a > 1", common_pb2.SQL92)
    assert sub.is_sql92
    for make in (tags_filter_of, record_filter_of):
        with pytest.raises(ServiceError) as err:
            make(sub, enable_property_filter=False)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION
        assert "enablePropertyFilter=true" in err.value.message


def test_sql92_with_property_filter_filters_records() -> None:
    sub = parse_subscription("T", "a BETWEEN 0 AND 3", common_pb2.SQL92, sub_version=3)
    assert sub.sql is not None and sub.sql.expression == "a BETWEEN 0 AND 3"
    assert tags_filter_of(sub, enable_property_filter=True) is None
    accept = record_filter_of(sub, enable_property_filter=True)
    assert accept is not None
    assert accept(memoryview(_record({"a": "3", "TAGS": "x"})))
    assert not accept(memoryview(_record({"a": "4"})))
    assert not accept(memoryview(_record({})))
    assert not accept(memoryview(b"\x00" * 200))  # not a record: no match, no exception
    assert not accept(memoryview(_record({"a": "1"})[:-3]))  # truncated


def test_tag_subscriptions_have_no_record_filter() -> None:
    for expression in ("*", "A || B"):
        sub = parse_subscription("T", expression)
        assert record_filter_of(sub, enable_property_filter=True) is None


@pytest.mark.parametrize(
    ("expression", "position"),
    [("a >> 5", 3), ("  ", 0), ("a = 'x", 4), ("a > 'x'", 4), ("a = 1 b", 6)],
)
def test_sql92_errors_are_illegal_expression_with_the_position(
    expression: str, position: int
) -> None:
    with pytest.raises(ServiceError) as err:
        parse_subscription("T", expression, common_pb2.SQL92)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION
    assert err.value.metadata["position"] == str(position)
    assert f"at position {position}" in err.value.message
    assert err.value.metadata["topic"] == "T"


def test_the_compiled_filter_does_not_affect_equality() -> None:
    one = parse_subscription("T", "a > 1", common_pb2.SQL92, sub_version=1)
    two = SubscriptionData("T", "a > 1", common_pb2.SQL92, 1)
    assert one == two  # sql derives from the expression; a hand-built one compiles on use
    accept = record_filter_of(two, enable_property_filter=True)
    assert accept is not None and accept(memoryview(_record({"a": "2"})))


@pytest.mark.parametrize(
    "props",
    [
        {},
        {"a": "1"},
        {"a": "1", "b": ""},
        {"b": "x", "a": "2", "ab": "3", "ba": "4"},
        {"x_a": "1", "a": "é€", "xb": "b"},
    ],
)
def test_property_reader_agrees_with_a_full_decode(props: dict[str, str]) -> None:
    raw = codec.encode_properties(props)
    names = frozenset({"a", "b", "missing"})
    full = codec.decode_properties(raw)
    assert property_reader(names)(raw) == {k: v for k, v in full.items() if k in names}
    # a repeated name: the last one wins, as in decode_properties
    twice = raw + codec.encode_properties({"a": "last"})
    assert property_reader(names)(twice)["a"] == codec.decode_properties(twice)["a"] == "last"
    # no trailing separator (decode_properties tolerates it, so does the reader)
    if raw:
        assert property_reader(names)(raw[:-1]) == property_reader(names)(raw)


def test_record_properties_bytes_skips_body_and_topic() -> None:
    props = {"a": "1", "TAGS": "x"}
    record = _record(props)
    assert codec.record_properties_bytes(record) == codec.encode_properties(props)
    assert codec.record_properties_bytes(b"pad" + record, 3) == codec.encode_properties(props)
    for bad in (record[:-1], record[:50], b"\x00" * 120):
        with pytest.raises(codec.CorruptRecord):
            codec.record_properties_bytes(bad)


def _record(props: dict[str, str]) -> bytes:
    host = codec.HostAddress.parse("127.0.0.1:10911")
    return codec.encode_record(
        topic_bytes=b"T",
        body=b"body \x01a\x01 \x02a\x011\x02",  # separators in the body must not confuse
        properties=codec.encode_properties(props),
        queue_id=0,
        flag=0,
        queue_offset=0,
        physical_offset=0,
        sys_flag=0,
        born_timestamp_ms=1,
        born_host=host,
        store_timestamp_ms=2,
        store_host=host,
    )


def test_to_pb_round_trip() -> None:
    sub = parse_subscription("T", "A || B", sub_version=42)
    pb = sub.to_pb()
    assert (pb.topic, pb.expression, pb.expression_type, pb.sub_version) == (
        "T",
        "A || B",
        common_pb2.TAG,
        42,
    )
    assert isinstance(sub, SubscriptionData)
