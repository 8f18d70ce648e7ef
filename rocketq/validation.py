"""Name and size rules shared by clients and brokers (RocketMQ's ``Validators``/``TopicValidator``).

A client checks before it sends, so a mistake is reported where it was made; the broker checks
again, because any gRPC caller can reach it. Each check raises :class:`ValueError` whose text
says what is wrong and how to fix it.
"""

from __future__ import annotations

import re

TOPIC_NAME_MAX_CHARS = 127
GROUP_NAME_MAX_CHARS = 255
#: Default and ceiling of a message or batch: topic, bodies and properties together.
MESSAGE_MAX_BYTES = 4 * 1024 * 1024
QUEUE_NUMS_MAX = 1024
PULL_BATCH_MAX = 1024

PERM_WRITE = 2
PERM_READ = 4
PERM_INHERIT = 1
VALID_PERMS = (PERM_WRITE, PERM_READ, PERM_WRITE | PERM_READ)

#: The auto-create template topic (SPEC §4.3).
AUTO_CREATE_TOPIC_KEY = "TBW102"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
TIMER_TOPIC = "rmq_sys_wheel_timer"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"

_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")

QUOTE_MAX_CHARS = 48
"""The most of an input an error message repeats (:func:`quote`)."""


def quote(value: object, max_chars: int = QUOTE_MAX_CHARS) -> str:
    """A short, escaped excerpt of an input, for an error message: the ``repr`` of at most
    ``max_chars`` characters, and the input's length when it was cut.

    Error texts travel in gRPC trailers, whose size a standard client caps at 16 KiB, and land
    in logs: a message that echoed a whole 20 000-character input would reach the caller as
    RESOURCE_EXHAUSTED instead of its real status, and would let any caller flood the logs.
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= max_chars:
        return repr(text)
    return f"{text[:max_chars]!r}… ({len(text)} characters)"


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, saying so (a bound on composed messages)."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… (cut at {max_chars} of {len(text)} characters)"


def check_topic(topic: str) -> None:
    """Topic names: 1..127 characters of ``[A-Za-z0-9_%|-]``."""
    if not topic:
        raise ValueError("topic name is empty; give a name of 1..127 characters [A-Za-z0-9_%|-]")
    if len(topic) > TOPIC_NAME_MAX_CHARS:
        raise ValueError(
            f"topic name is {len(topic)} characters; the limit is {TOPIC_NAME_MAX_CHARS}"
        )
    if not _NAME.match(topic):
        raise ValueError(
            f"topic name {quote(topic)} has characters outside [A-Za-z0-9_%|-]; use only those"
        )


def check_group(group: str, what: str = "consumer group") -> None:
    """Group names: 1..255 characters of ``[A-Za-z0-9_%|-]``."""
    if not group:
        raise ValueError(f"{what} name is empty; give a name of 1..255 characters [A-Za-z0-9_%|-]")
    if len(group) > GROUP_NAME_MAX_CHARS:
        raise ValueError(
            f"{what} name is {len(group)} characters; the limit is {GROUP_NAME_MAX_CHARS}"
        )
    if not _NAME.match(group):
        raise ValueError(f"{what} name {quote(group)} has characters outside [A-Za-z0-9_%|-]")
    if group.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
        # the group's own retry and dead-letter topics are %RETRY%{group} and %DLQ%{group};
        # a group named like one would get topics such as %RETRY%%RETRY%G
        raise ValueError(
            f"{what} name {quote(group)} starts with {RETRY_GROUP_TOPIC_PREFIX} or "
            f"{DLQ_GROUP_TOPIC_PREFIX}, the prefixes of a group's retry and dead-letter topics; "
            "choose a name without them"
        )


def check_queue_nums(read_queue_nums: int, write_queue_nums: int) -> None:
    for name, n in (("read_queue_nums", read_queue_nums), ("write_queue_nums", write_queue_nums)):
        if not 1 <= n <= QUEUE_NUMS_MAX:
            raise ValueError(f"{name} is {n}; it must be between 1 and {QUEUE_NUMS_MAX}")


def check_perm(perm: int) -> None:
    if perm not in VALID_PERMS:
        raise ValueError(f"perm is {perm}; use 2 (write only), 4 (read only) or 6 (read and write)")


def is_system_topic(topic: str) -> bool:
    """Topics RocketQ manages itself; users may not create or delete them."""
    return (
        topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX, SYSTEM_TOPIC_PREFIX))
        or topic.startswith("RMQ_SYS_")
        or topic in (AUTO_CREATE_TOPIC_KEY, SELF_TEST_TOPIC)
    )


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)
