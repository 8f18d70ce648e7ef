"""Subscription expressions: parsing them, and the TAG and SQL92 filters the store applies (§6.17).

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

An SQL92 subscription (``"a BETWEEN 0 AND 3"``, :mod:`rocketq.sql92`) is compiled when it is
parsed, so a syntax error refuses the heartbeat or pull that carries it (INVALID_ARGUMENT,
ILLEGAL_EXPRESSION, the 0-based ``position`` in the message and in the error's metadata). It
filters by properties, which live in the commitlog record, not in the consume queue: the store
calls :func:`record_filter_of`'s function on each candidate record, which reads only the
properties the expression names out of the record bytes and evaluates the compiled closures.
The broker must have ``enablePropertyFilter=true`` (off by default, as in RocketMQ); without it
a pull with an SQL92 subscription is refused with INVALID_ARGUMENT / ILLEGAL_EXPRESSION.

| subscription               | ``tags_filter`` (consume queue) | ``record_filter`` (commitlog)    |
|----------------------------|---------------------------------|----------------------------------|
| TAG ``"*"``                | None                            | None                             |
| TAG ``"A || B"``           | hash set lookup                 | None                             |
| SQL92, property filter on  | None                            | properties read + compiled match |
| SQL92, property filter off | INVALID_ARGUMENT                | INVALID_ARGUMENT                 |

Parsing is cached: every pull of a push consumer carries the same few expressions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.sql92 import Sql92Error, Sql92Filter, compile_sql92
from services.common.errors import invalid
from services.store.message_store import RecordFilter, TagsFilter

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
    sql: Sql92Filter | None = field(default=None, compare=False)
    """The compiled expression of an SQL92 subscription."""

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

    SQL92 expressions are compiled here (errors carry the position); whether they may be used
    is decided per broker by :func:`record_filter_of` (``enablePropertyFilter``), not here.
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
        try:
            sql = compile_sql92(expression)
        except Sql92Error as exc:
            invalid(common_pb2.ILLEGAL_EXPRESSION, str(exc), topic=topic, position=exc.position)
        return SubscriptionData(topic, expression, SQL92, sub_version, sql=sql)
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
    """The store's ``tags_filter`` for ``sub``: None for ``"*"`` and SQL92 (no per-unit call).

    Raises ServiceError for SQL92 when the property filter is off.
    """
    if sub.expression_type == SQL92:
        check_sql92_allowed(sub.topic, enable_property_filter=enable_property_filter)
        return None
    if not sub.tags:
        return None
    return sub.codes.__contains__


def record_filter_of(sub: SubscriptionData, *, enable_property_filter: bool) -> RecordFilter | None:
    """The store's ``record_filter`` for ``sub``: None unless it is SQL92.

    Raises ServiceError (INVALID_ARGUMENT, ILLEGAL_EXPRESSION) for SQL92 when the property
    filter is off. The function never raises: a record whose properties cannot be read does
    not match, like one whose values do not convert.
    """
    if sub.expression_type != SQL92:
        return None
    check_sql92_allowed(sub.topic, enable_property_filter=enable_property_filter)
    if sub.sql is None:  # built by hand without parse_subscription
        return _record_filter(compile_sql92(sub.expression))
    return _record_filter(sub.sql)


def check_sql92_allowed(topic: str, *, enable_property_filter: bool) -> None:
    """Refuse an SQL92 subscription on a broker whose property filter is off."""
    if not enable_property_filter:
        invalid(
            common_pb2.ILLEGAL_EXPRESSION,
            "SQL92 subscriptions need enablePropertyFilter=true on the broker, which is off; "
            "subscribe by TAG or set enablePropertyFilter=true in the broker's config",
            topic=topic,
        )


@lru_cache(maxsize=1024)
def _record_filter(sql: Sql92Filter) -> RecordFilter:
    """A record filter for ``sql`` (cached per compiled filter: one per distinct expression)."""
    read = property_reader(sql.property_names)
    matches = sql.matches

    def accept(record: memoryview) -> bool:
        try:
            props = read(codec.record_properties_bytes(record))
        except (codec.CorruptRecord, ValueError, IndexError):
            return False
        return matches(props)

    return accept


def property_reader(names: frozenset[str]) -> Callable[[bytes], dict[str, str]]:
    """A function reading just ``names`` out of a raw PROPERTIES field.

    Cheaper than decoding every property (a message carries UNIQ_KEY, TAGS, KEYS, WAIT and the
    user's own): one ``rfind`` per name. ``b"\\x02name\\x01"`` can only occur at a property
    boundary, since names and values never contain the separators; the last occurrence wins,
    as in :func:`rocketq.codec.decode_properties`.
    """
    patterns = tuple(
        (name, f"{name}\x01".encode(), f"\x02{name}\x01".encode()) for name in sorted(names)
    )

    def read(raw: bytes) -> dict[str, str]:
        props: dict[str, str] = {}
        for name, first, later in patterns:
            at = raw.rfind(later)
            if at >= 0:
                at += len(later)
            elif raw.startswith(first):
                at = len(first)
            else:
                continue
            end = raw.find(b"\x02", at)
            props[name] = raw[at : end if end >= 0 else len(raw)].decode("utf-8", "replace")
        return props

    return read
