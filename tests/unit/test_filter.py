"""Subscription parsing and the tag-hash filter (services/broker/filter.py, SPEC §6.17)."""

from __future__ import annotations

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2
from services.broker.filter import (
    SubscriptionData,
    parse_subscription,
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
    with pytest.raises(ServiceError) as err:
        tags_filter_of(sub, enable_property_filter=False)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION
    assert "enablePropertyFilter" in err.value.message


def test_sql92_with_property_filter_says_not_implemented() -> None:
    sub = parse_subscription("T", "a > 1", common_pb2.SQL92)
    with pytest.raises(ServiceError) as err:
        tags_filter_of(sub, enable_property_filter=True)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "not implemented yet" in err.value.message


def test_empty_sql92_is_illegal() -> None:
    with pytest.raises(ServiceError) as err:
        parse_subscription("T", "  ", common_pb2.SQL92)
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION


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
