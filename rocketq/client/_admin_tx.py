"""Pending transactions for the administration client: :meth:`Admin.half_messages` (SPEC §9).

A transactional message waits in ``RMQ_SYS_TRANS_HALF_TOPIC`` of the broker that stored it
until its producer commits or rolls it back (or the broker's check gives up). Each broker lists
its own through ``Admin.ListHalfMessages`` (only the latest copy of each transaction, resolved
ones left out, oldest first), so this asks every master, or one named broker, and merges the
answers oldest first. Slaves answer the same call (read only), but the pending state lives on
the master, which is what is asked here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rocketq._api.rocketq.v1 import admin_pb2
from rocketq.client._admin_types import received_message
from rocketq.client.errors import InvalidArgumentError
from rocketq.message import ReceivedMessage
from rocketq.validation import check_topic

if TYPE_CHECKING:
    from rocketq.client.admin import Admin

#: ListHalfMessages accepts 1..1000 messages per broker.
HALF_MESSAGES_MAX_NUM_MAX = 1000


@dataclass(frozen=True)
class HalfMessage:
    """One transactional message still waiting for its producer's decision."""

    broker_name: str
    message: ReceivedMessage
    """As the producer sent it: real topic, body, tags, keys, properties; ``msg_id`` is the
    transaction id."""
    producer_group: str
    """Check-backs go to a live member of this group."""
    transaction_id: str
    check_times: int
    """Times the broker has asked a producer about it so far."""
    born_timestamp_ms: int
    """When the producer first stored it."""
    commitlog_offset: int
    """Of its latest copy in RMQ_SYS_TRANS_HALF_TOPIC."""
    queue_offset: int
    """Of its latest copy in RMQ_SYS_TRANS_HALF_TOPIC."""

    @property
    def topic(self) -> str:
        return self.message.topic


@dataclass(frozen=True)
class HalfMessages:
    """Pending transactional messages over the brokers asked, oldest first."""

    messages: tuple[HalfMessage, ...]
    """At most ``max_num`` in all, the oldest first (by born time, then broker)."""
    totals: dict[str, int]
    """Broker name -> half messages pending there, before any cut."""
    errors: dict[str, str] = field(default_factory=dict)
    """Broker name -> why it could not be asked."""

    @property
    def total(self) -> int:
        """Half messages pending over every broker asked."""
        return sum(self.totals.values())


def half_message(pb: admin_pb2.HalfMessage, broker_name: str) -> HalfMessage:
    return HalfMessage(
        broker_name=broker_name,
        message=received_message(pb.message, broker_name),
        producer_group=pb.producer_group,
        transaction_id=pb.transaction_id,
        check_times=pb.check_times,
        born_timestamp_ms=pb.born_timestamp_ms,
        commitlog_offset=pb.commitlog_offset,
        queue_offset=pb.queue_offset,
    )


def merge(
    answers: dict[str, admin_pb2.ListHalfMessagesResponse], max_num: int
) -> tuple[tuple[HalfMessage, ...], dict[str, int]]:
    """Every broker's rows merged oldest first and cut at ``max_num``; totals by broker."""
    rows = [half_message(pb, name) for name, answer in answers.items() for pb in answer.messages]
    rows.sort(key=lambda h: (h.born_timestamp_ms, h.broker_name, h.queue_offset))
    totals = {name: answers[name].total for name in sorted(answers)}
    return tuple(rows[:max_num]), totals


async def half_messages(
    admin: Admin, topic: str = "", broker: str | None = None, max_num: int = 100
) -> HalfMessages:
    """See :meth:`Admin.half_messages`."""
    if topic:
        try:
            check_topic(topic)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc), code="INVALID_ARGUMENT") from None
    if not 1 <= max_num <= HALF_MESSAGES_MAX_NUM_MAX:
        raise InvalidArgumentError(f"max_num is {max_num}; use 1..{HALF_MESSAGES_MAX_NUM_MAX}")
    request = admin_pb2.ListHalfMessagesRequest(topic=topic, max_num=max_num)
    targets = await admin._masters_or(broker)

    async def ask(name: str, addr: str) -> admin_pb2.ListHalfMessagesResponse:
        stub = admin._admin(addr)
        return await admin._guard(addr, stub.ListHalfMessages(request, **admin._kw))

    answers, failures = await admin._fan_out(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    rows, totals = merge(answers, max_num)
    return HalfMessages(rows, totals, {n: e.message for n, e in sorted(failures.items())})
