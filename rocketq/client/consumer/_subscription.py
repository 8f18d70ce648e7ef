"""Subscription expressions and the client-side tag re-filter (SPEC §6.17).

A TAG expression is ``"*"`` (everything) or tags joined by ``||``: ``"TagA || TagB"``. The
broker compares only the tags' 32-bit hashes (the consume queue stores the hash, so entries
keep a fixed length), so two different tags with the same hash both pass the broker; the client
therefore checks the tag string of every pulled message again (``matches``). A message with no
tag passes only ``"*"``.

An empty expression or ``"*"`` means everything, like RocketMQ's ``SUB_ALL``. An expression
whose parts are all blank (``" || "``) is refused rather than silently meaning "nothing".
SQL92 expressions (``"a BETWEEN 0 AND 3"``) are compiled here too (:mod:`rocketq.sql92`), only
to refuse a malformed one at ``subscribe()`` with :class:`~rocketq.sql92.Sql92Error` (a
ValueError naming the 0-based position); the broker evaluates them over the properties of each
message, needs ``enablePropertyFilter=true``, and the client does no second check.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.consumer.config import ExpressionType
from rocketq.message import ReceivedMessage
from rocketq.sql92 import compile_sql92
from rocketq.validation import check_topic

SUB_ALL = "*"
TAG_SEPARATOR = "||"
EXPRESSION_MAX_CHARS = 4096
"""A guard against pasting a file as an expression; RocketMQ has no limit, brokers do."""

_EXPRESSION_TYPE_PB = {
    ExpressionType.TAG: common_pb2.TAG,
    ExpressionType.SQL92: common_pb2.SQL92,
}


@dataclass(frozen=True)
class Subscription:
    """One topic a consumer subscribes to (RocketMQ's ``SubscriptionData``)."""

    topic: str
    expression: str = SUB_ALL
    expression_type: ExpressionType = ExpressionType.TAG
    tags: frozenset[str] = frozenset()
    """The tags of a TAG expression; empty for ``"*"`` and for SQL92."""
    tag_hashes: frozenset[int] = frozenset()
    """Their hashes, as the broker compares them."""
    sub_version: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    """When it was made; a broker keeps the newest version of a group's subscription."""

    @property
    def is_all(self) -> bool:
        return self.expression_type is ExpressionType.TAG and not self.tags

    def matches(self, tags: str) -> bool:
        """Whether a message with these tags is wanted, by the client-side string check."""
        if self.expression_type is not ExpressionType.TAG or not self.tags:
            return True
        return bool(tags) and tags in self.tags

    def to_pb(self) -> messaging_pb2.SubscriptionData:
        return messaging_pb2.SubscriptionData(
            topic=self.topic,
            expression=self.expression,
            expression_type=_EXPRESSION_TYPE_PB[self.expression_type],
            sub_version=self.sub_version,
        )

    @property
    def expression_type_pb(self) -> common_pb2.ExpressionType.ValueType:
        return _EXPRESSION_TYPE_PB[self.expression_type]


def parse_tags(expression: str) -> frozenset[str]:
    """The tags of a TAG expression; empty for ``"*"`` / ``""``. ValueError if malformed."""
    text = expression.strip()
    if not text or text == SUB_ALL:
        return frozenset()
    tags = frozenset(part.strip() for part in text.split(TAG_SEPARATOR) if part.strip())
    if not tags:
        raise ValueError(
            f"subscription expression {expression!r} names no tag; use '*' or 'TagA || TagB'"
        )
    return tags


def build_subscription(
    topic: str, expression: str | None = SUB_ALL, expression_type: ExpressionType | None = None
) -> Subscription:
    """Validate and parse a subscription (RocketMQ's ``FilterAPI.buildSubscriptionData``).

    Raises ValueError for a bad topic or TAG expression, and its subclass
    :class:`~rocketq.sql92.Sql92Error` (with ``position``) for an SQL92 one that does not compile.
    """
    check_topic(topic)
    kind = expression_type or ExpressionType.TAG
    text = (expression or "").strip()
    if len(text) > EXPRESSION_MAX_CHARS:
        raise ValueError(
            f"subscription expression is {len(text)} characters; the limit is "
            f"{EXPRESSION_MAX_CHARS}"
        )
    if kind is ExpressionType.SQL92:
        if not text:
            raise ValueError('a SQL92 subscription needs an expression, e.g. "a > 5"')
        compile_sql92(expression or "")  # raises Sql92Error (positions in the given text)
        return Subscription(topic, text, kind)
    tags = parse_tags(text)
    if not tags:
        return Subscription(topic, SUB_ALL, kind)
    # Keep the user's order of tags in the expression the broker parses; the set is for lookups.
    ordered = [t.strip() for t in text.split(TAG_SEPARATOR) if t.strip()]
    return Subscription(
        topic,
        " || ".join(dict.fromkeys(ordered)),
        kind,
        tags=tags,
        tag_hashes=frozenset(codec.tags_hash(t) for t in tags),
    )


def filter_by_tags(
    messages: Iterable[ReceivedMessage], subscription: Subscription
) -> list[ReceivedMessage]:
    """The messages whose tag string the subscription wants (SPEC §6.8 processPullResult)."""
    if subscription.is_all or subscription.expression_type is not ExpressionType.TAG:
        return list(messages)
    return [m for m in messages if subscription.matches(m.tags)]
