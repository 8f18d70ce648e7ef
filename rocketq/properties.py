"""Message properties: the names RocketMQ gives its system properties, and their encoding in a
record's PROPERTIES field (``name\\x01value\\x02`` repeated, SPEC §11.1).

Kept apart from the record layout in :mod:`rocketq.codec`, which re-exports every name here, so
``codec.Prop`` and ``codec.encode_properties`` keep working.
"""

from __future__ import annotations

from collections.abc import Mapping

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class Prop:
    """Names of the system properties the store and clients read (RocketMQ's spelling)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_LEVEL = "DELAY"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    """On a half message: how many times the broker has checked it back so far."""
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    """On a transactional message: seconds before the first check-back (else transactionTimeout)."""
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    RETRY_TOPIC = "RETRY_TOPIC"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    SHARDING_KEY = "__SHARDINGKEY"
    TRACE_CONTEXT = "TRACE_CONTEXT"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_MS = "TIMER_DELAY_MS"
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    TIMER_OUT_MS = "TIMER_OUT_MS"
    """Absolute delivery time the broker computed for a message in the timer topic."""
    TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
    TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
    TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
    TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
    """On a cancel marker in the timer topic: the unique id of the timer it cancels."""
    TIMER_SOURCE = "TIMER_SOURCE"
    """On a timer-wheel re-put: "{commitlog offset}" of the timer-topic record it came from, so
    the broker drops a second re-put of the same timer (after a timer-wheel crash)."""
    # -- batch half messages (services/broker/transaction_batch.py) --
    TRANSACTION_BATCH = "TRAN_BATCH"
    """On a half message: its body is a batch of records (as SendRequest.records) that its
    commit stores together; the value is how many."""


def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for every property, as RocketMQ 4.x writes them."""
    if not props:
        return b""
    text = ""
    for name, value in props.items():  # for a few properties, cheaper than a join
        text += f"{name}\x01{value}\x02"
    # One count per separator over the whole text instead of four scans per property: the
    # text holds exactly one of each per property unless a name or value holds one.
    count = len(props)
    if text.count(NAME_VALUE_SEPARATOR) != count or text.count(PROPERTY_SEPARATOR) != count:
        _refuse_separators(props)
    return text.encode()


def _refuse_separators(props: Mapping[str, str]) -> None:
    for name, value in props.items():
        if NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name:
            raise ValueError(f"property name {name!r} contains a separator character")
        if NAME_VALUE_SEPARATOR in value or PROPERTY_SEPARATOR in value:
            raise ValueError(f"property {name!r} value contains a separator character")


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerates a missing trailing separator."""
    props: dict[str, str] = {}
    if not raw:
        return props
    for item in bytes(raw).decode("utf-8", errors="replace").split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            props[name] = value
    return props


def find_property(raw: bytes, start: int, end: int, name: str) -> str | None:
    """The value of property ``name`` in the encoded properties ``raw[start:end]``, as
    :func:`decode_properties` of those bytes would give it (the last one of that name), without
    decoding the others: a consumer that asks for one property of a pulled message (its tag,
    its id, its trace context) pays for that one."""
    if "\ufffd" in name:  # it may stand for bytes that are not UTF-8: decode them all
        return decode_properties(raw[start:end]).get(name)
    key = name.encode()
    at = raw.rfind(b"\x02" + key + b"\x01", start, end)
    if at >= 0:
        at += len(key) + 2
    elif raw.startswith(key + b"\x01", start, end):
        at = start + len(key) + 1
    else:
        return None
    stop = raw.find(b"\x02", at, end)
    return raw[at : end if stop < 0 else stop].decode("utf-8", errors="replace")
