"""SDK side of SQL92 subscriptions: a malformed expression is refused at subscribe() time.

No broker is involved: ``build_subscription`` compiles the expression locally
(rocketq/client/consumer/_subscription.py), so every consumer flavour raises
:class:`~rocketq.sql92.Sql92Error` — a ValueError with the position — before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rocketq import (
    ExpressionType,
    LitePullConsumer,
    LitePullConsumerConfig,
    PushConsumer,
    PushConsumerConfig,
    SyncLitePullConsumer,
    SyncPushConsumer,
)
from rocketq._api.rocketq.v1 import common_pb2
from rocketq.client.consumer._subscription import build_subscription
from rocketq.sql92 import Sql92Error

pytestmark = pytest.mark.unit

SQL = ExpressionType.SQL92


def test_a_valid_expression_builds_a_sql92_subscription() -> None:
    sub = build_subscription("T", "  a BETWEEN 0 AND 3 AND b IN ('x')  ", SQL)
    assert sub.expression == "a BETWEEN 0 AND 3 AND b IN ('x')"
    assert sub.expression_type is SQL
    assert sub.tags == frozenset() and not sub.is_all
    assert sub.matches("any tag")  # the client does no second check of SQL92
    pb = sub.to_pb()
    assert (pb.expression, pb.expression_type) == (sub.expression, common_pb2.SQL92)


@pytest.mark.parametrize(
    ("expression", "position"),
    [("a >> 5", 3), ("a = 'x", 4), ("a > 'x'", 4), ("a BETWEEN 5 AND 1", 10), ("a b", 2)],
)
def test_a_malformed_expression_raises_with_its_position(expression: str, position: int) -> None:
    with pytest.raises(Sql92Error) as err:
        build_subscription("T", expression, SQL)
    assert isinstance(err.value, ValueError)
    assert err.value.position == position
    assert f"at position {position}" in str(err.value)


def test_positions_count_in_the_text_as_given() -> None:
    with pytest.raises(Sql92Error) as err:
        build_subscription("T", "   a >> 5", SQL)
    assert err.value.position == 6
    assert err.value.expression == "   a >> 5"


def test_an_empty_sql92_expression_is_refused() -> None:
    for empty in ("", "   ", None):
        with pytest.raises(ValueError, match="needs an expression"):
            build_subscription("T", empty, SQL)


def test_tag_expressions_are_not_compiled_as_sql() -> None:
    sub = build_subscription("T", "a >> 5")  # a (strange) tag, not SQL
    assert sub.tags == frozenset({"a >> 5"})


_CONSUMERS: list[tuple[str, Callable[[], object]]] = [
    ("push", lambda: PushConsumer(PushConsumerConfig("g", ("127.0.0.1:1",)), _listener)),
    ("lite", lambda: LitePullConsumer(LitePullConsumerConfig("g", ("127.0.0.1:1",)))),
    ("sync push", lambda: SyncPushConsumer(PushConsumerConfig("g", ("127.0.0.1:1",)), _listener)),
    ("sync lite", lambda: SyncLitePullConsumer(LitePullConsumerConfig("g", ("127.0.0.1:1",)))),
]


def _listener(msgs: object, ctx: object) -> None:
    return None


@pytest.mark.parametrize(("kind", "make"), _CONSUMERS, ids=[k for k, _ in _CONSUMERS])
def test_every_consumer_refuses_a_bad_expression_at_subscribe(
    kind: str, make: Callable[[], object]
) -> None:
    del kind  # the test id
    consumer = make()
    with pytest.raises(Sql92Error) as err:
        consumer.subscribe("T", "a > 1 AND (b = 2", SQL)  # type: ignore[attr-defined]
    assert err.value.position == 16
    consumer.subscribe("T", "a > 1 AND (b = 2)", SQL)  # type: ignore[attr-defined]
