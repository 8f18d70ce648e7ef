"""Subscription expressions: parsing them, and the tag-hash filter the store applies (SPEC §6.17).

A TAG subscription is ``"*"`` (everything) or tags joined by ``||`` (``"TagA || TagB"``). The
consume queue keeps only each message's tag *hash* (Java ``String.hashCode``, 8 bytes of every
20-byte unit, SPEC §11.2), so the broker filters by hash without touching the commitlog, and the
client re-checks tag strings to drop the rare collision. A parsed subscription therefore carries
both the tag strings (for clients and for admin listings) and their hash codes (for the store's
``tags_filter`` hook and for waking held pulls).

| expression        | tags          | codes                  | tags_filter            |
|-------------------|---------------|------------------------|------------------------|
| ``""`` or ``"*"`` | {}            | {}                     | None (match all)       |
| ``"A"``           | {"A"}         | {hash("A")}            | ``codes.__contains__`` |
| ``"A || B"``      | {"A", "B"}    | {hash("A"), hash("B")} | ``codes.__contains__`` |
| ``"A || *"``      | {}            | {}                     | None (match all)       |
| ``"||"``          | —             | —                      | ILLEGAL_EXPRESSION     |

SQL92 subscriptions belong to a later issue (the property filter). Until then the broker says
so plainly: without ``enablePropertyFilter`` an SQL92 expression is refused like RocketMQ
refuses it (INVALID_ARGUMENT, ILLEGAL_EXPRESSION); with it, FAILED_PRECONDITION says the
filter is not implemented yet, rather than silently delivering unfiltered messages.

Parsing is cached: every pull of a push consumer carries the same few expressions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from services.common.errors import invalid, precondition
from services.store.message_store import TagsFilter

SUB_ALL = "*"
TAG_SEPARATOR = "||"
EXPRESSION_MAX_CHARS = 4096
"""A longer expression is refused: nothing legitimate needs it, and it is parsed per pull."""
TAGS_PER_EXPRESSION_MAX = 256

TAG = common_pb2.TAG
SQL92 = common_pb2.SQL92


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    """One parsed subscription of a consumer group to a topic."""

    topic: str
    expression: str
    """As the client sent it (``"*"`` when it sent nothing)."""
    expression_type: common_pb2.ExpressionType.ValueType = TAG
    """``common_pb2.TAG`` or ``common_pb2.SQL92``."""
    sub_version: int = 0
    """The client's version stamp (a timestamp); newer replaces older."""
    tags: frozenset[str] = frozenset()
    """Tag strings; empty means every message (``"*"``)."""
    codes: frozenset[int] = frozenset()
    """``tags_hash`` of every tag."""

    @property
    def match_all(self) -> bool:
        return self.expression_type == TAG and not self.tags

    @property
    def is_sql92(self) -> bool:
        return self.expression_type == SQL92

    def matches_code(self, tags_code: int) -> bool:
        """Hash-level match of one consume-queue unit (TAG subscriptions only)."""
        return not self.tags or tags_code in self.codes

    def to_pb(self) -> messaging_pb2.SubscriptionData:
        return messaging_pb2.SubscriptionData(
            topic=self.topic,
            expression=self.expression,
            expression_type=self.expression_type,
            sub_version=self.sub_version,
        )


def parse_subscription(
    topic: str,
    expression: str,
    expression_type: common_pb2.ExpressionType.ValueType = TAG,
    sub_version: int = 0,
) -> SubscriptionData:
    """Parse one subscription; raises ServiceError (ILLEGAL_EXPRESSION) if it does not parse.

    SQL92 expressions are kept as text: whether they may be used is decided per broker by
    :func:`tags_filter_of` (``enablePropertyFilter``), not here.
    """
    if expression_type == common_pb2.EXPRESSION_TYPE_UNSPECIFIED:
        expression_type = TAG
    if expression_type not in (TAG, SQL92):
        invalid(
            common_pb2.ILLEGAL_EXPRESSION,
            f"expression type {expression_type} is unknown; use TAG or SQL92",
            topic=topic,
        )
    if len(expression) > EXPRESSION_MAX_CHARS:
        invalid(
            common_pb2.ILLEGAL_EXPRESSION,
            f"subscription expression is {len(expression)} characters; "
            f"the limit is {EXPRESSION_MAX_CHARS}",
            topic=topic,
        )
    if expression_type == SQL92:
        if not expression.strip():
            invalid(common_pb2.ILLEGAL_EXPRESSION, "SQL92 expression is empty", topic=topic)
        return SubscriptionData(topic, expression, SQL92, sub_version)
    tags, codes = _parse_tags(expression)
    return SubscriptionData(topic, expression or SUB_ALL, TAG, sub_version, tags, codes)


@lru_cache(maxsize=4096)
def _parse_tags(expression: str) -> tuple[frozenset[str], frozenset[int]]:
    """Tags and their hashes; raises ServiceError on an expression with no tag in it.

    ServiceError is never cached by ``lru_cache`` (exceptions are not results), so a bad
    expression costs a parse each time — acceptable, it is refused anyway.
    """
    text = expression.strip()
    if not text or text == SUB_ALL:
        return frozenset(), frozenset()
    tags = [t.strip() for t in text.split(TAG_SEPARATOR)]
    tags = [t for t in tags if t]
    if not tags:
        invalid(
            common_pb2.ILLEGAL_EXPRESSION,
            f'subscription expression {expression!r} names no tag; use "*" or "TagA || TagB"',
        )
    if len(tags) > TAGS_PER_EXPRESSION_MAX:
        invalid(
            common_pb2.ILLEGAL_EXPRESSION,
            f"subscription expression names {len(tags)} tags; the limit is "
            f"{TAGS_PER_EXPRESSION_MAX}",
        )
    if SUB_ALL in tags:
        # "A || *" subscribes to everything, as "*" does.
        return frozenset(), frozenset()
    return frozenset(tags), frozenset(codec.tags_hash(t) for t in tags)


def tags_filter_of(sub: SubscriptionData, *, enable_property_filter: bool) -> TagsFilter | None:
    """The store's ``tags_filter`` for ``sub``: None for ``"*"`` (no per-unit call at all).

    Raises ServiceError for SQL92 (see the module docstring for why and which code).
    """
    if sub.expression_type == SQL92:
        check_sql92_allowed(sub.topic, enable_property_filter=enable_property_filter)
    if not sub.tags:
        return None
    return sub.codes.__contains__


def check_sql92_allowed(topic: str, *, enable_property_filter: bool) -> None:
    """Refuse an SQL92 subscription with the clearest error this broker can give."""
    if not enable_property_filter:
        invalid(
            common_pb2.ILLEGAL_EXPRESSION,
            "SQL92 subscriptions need enablePropertyFilter=true on the broker, which is off; "
            "subscribe by TAG or enable the property filter",
            topic=topic,
        )
    precondition(
        "SQL92 filtering is not implemented yet on this broker; subscribe by TAG for now",
        topic=topic,
    )
