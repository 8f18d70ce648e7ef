"""Choosing a queue yourself: ordered messages and custom spreading (SPEC §5.3, §5.4).

A :class:`MessageQueueSelector` gets the topic's writable queues (sorted by broker name, then
queue id, the order every RocketQ and RocketMQ client sees), the message and the caller's
argument, and returns one queue. Sends through a selector are never retried on another queue
(SPEC §5.2): that would break the per-queue order the selector exists for.

:class:`SelectMessageQueueByHash` is RocketMQ's selector of the same name, bit for bit:
``abs(arg.hashCode() % n)`` with Java's ``hashCode`` — ``String.hashCode`` for a ``str``,
``Integer.hashCode``/``Long.hashCode`` for an ``int`` — so a Python and a Java producer put the
same order id in the same queue. (Java's ``%`` truncates toward zero, so ``abs`` of the
remainder equals Python's ``abs(h) % n`` for every ``h``, ``Integer.MIN_VALUE`` included.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from rocketq.java_hash import java_string_hash
from rocketq.message import Message, MessageQueue

_INT_MIN = -(2**31)
_INT_MAX = 2**31 - 1
_LONG_MIN = -(2**63)
_LONG_MAX = 2**63 - 1


class MessageQueueSelector(Protocol):
    """Picks the queue for one message (RocketMQ's ``MessageQueueSelector``)."""

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: object) -> MessageQueue: ...


def java_hash_code(arg: object) -> int:
    """Java's ``hashCode()`` of the boxed equivalent of ``arg`` (str, int, bool, bytes-as-str)."""
    if isinstance(arg, str):
        return java_string_hash(arg)
    if isinstance(arg, bool):  # Boolean.hashCode
        return 1231 if arg else 1237
    if isinstance(arg, int):
        if _INT_MIN <= arg <= _INT_MAX:  # Integer.hashCode
            return arg
        if _LONG_MIN <= arg <= _LONG_MAX:  # Long.hashCode: (int)(value ^ (value >>> 32))
            unsigned = arg & 0xFFFF_FFFF_FFFF_FFFF
            h = (unsigned ^ (unsigned >> 32)) & 0xFFFF_FFFF
            return h - 2**32 if h >= 2**31 else h
        raise ValueError(f"{arg} does not fit a Java long; pass it as a string")
    if isinstance(arg, bytes):
        return java_string_hash(arg.decode("utf-8"))
    raise TypeError(
        f"cannot hash a {type(arg).__name__} the way Java does; pass a str or int sharding key"
    )


class SelectMessageQueueByHash:
    """``mqs[abs(hashCode(arg) % len(mqs))]``: the same argument always lands in the same queue."""

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: object) -> MessageQueue:
        if not mqs:
            raise ValueError(f"topic {msg.topic!r} has no writable queue")
        return mqs[abs(java_hash_code(arg)) % len(mqs)]


class SelectMessageQueueByRandom:
    """A uniformly random queue."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: object) -> MessageQueue:
        if not mqs:
            raise ValueError(f"topic {msg.topic!r} has no writable queue")
        return mqs[self._rng.randrange(len(mqs))]


# Short names used in the SDK interface notes.
SelectByHash = SelectMessageQueueByHash
SelectByRandom = SelectMessageQueueByRandom
