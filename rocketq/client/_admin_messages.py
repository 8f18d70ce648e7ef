"""Stored messages for the administration client: :meth:`Admin.query_by_key`,
:meth:`Admin.query_by_id`, :meth:`Admin.view_message`, :meth:`Admin.dead_letters` and
:meth:`Admin.resend_dead_letter`.

Two ways to find a broker. A key or a unique id says nothing about where the message went, so
those queries ask every broker group hosting the topic at once (its master, or any live member
when the master is down) and merge the answers newest first; a broker that fails is reported
or skipped, and the query raises only when none answered. An offset message id encodes the
address of the broker that stored it (:func:`rocketq.codec.decode_offset_msg_id`), so viewing
or resending one asks that broker alone; the broker name in the answer comes from the cluster
map and is left empty if the nameserver cannot say. Dead letters live in ``%DLQ%{group}`` on
every master, which are paged through like the key queries.

Kept apart from :mod:`rocketq.client.admin` (which holds the public methods, their docstrings
and argument checks) so that module reads as the list of operations; the split follows
``_admin_tx.py`` and ``_admin_ha.py``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from rocketq import codec
from rocketq._api.rocketq.v1 import admin_pb2, messaging_pb2
from rocketq.client._admin_types import (
    DeadLetterPage,
    DeadLetters,
    ResentDeadLetter,
    dead_letter_page,
    received_message,
)
from rocketq.client.errors import InvalidArgumentError, MessageNotFoundError, RocketQError
from rocketq.message import ReceivedMessage

if TYPE_CHECKING:
    from rocketq.client.admin import Admin


async def query_by_key(
    admin: Admin,
    topic: str,
    key: str,
    begin_timestamp_ms: int,
    end_timestamp_ms: int | None,
    max_num: int,
) -> list[ReceivedMessage]:
    """See :meth:`Admin.query_by_key` (arguments checked there)."""
    request = messaging_pb2.QueryMessageByKeyRequest(
        topic=topic, key=key, begin_timestamp_ms=begin_timestamp_ms, max_num=max_num
    )
    if end_timestamp_ms is not None:
        request.end_timestamp_ms = end_timestamp_ms
    targets = await admin._route_members(topic)

    async def ask(name: str, addr: str) -> list[ReceivedMessage]:
        stub = admin._messaging(addr)
        pb = await admin._guard(addr, stub.QueryMessageByKey(request, **admin._kw))
        return [received_message(m, name) for m in pb.messages]

    answers, failures = await admin._fan_out_reads(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    found = [m for ms in answers.values() for m in ms]
    found.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
    return found[:max_num]


async def query_by_id(admin: Admin, topic: str, msg_id: str) -> list[ReceivedMessage]:
    """See :meth:`Admin.query_by_id` (arguments checked there)."""
    request = messaging_pb2.QueryMessageByIdRequest(topic=topic, msg_id=msg_id)
    targets = await admin._route_members(topic)

    async def ask(name: str, addr: str) -> list[ReceivedMessage]:
        stub = admin._messaging(addr)
        try:
            pb = await admin._guard(addr, stub.QueryMessageById(request, **admin._kw))
        except MessageNotFoundError:
            return []
        return [received_message(m, name) for m in pb.messages]

    answers, failures = await admin._fan_out_reads(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    found = [m for ms in answers.values() for m in ms]
    if not found:
        raise MessageNotFoundError(
            f"no message with id {msg_id} in topic {topic!r}", code="NOT_FOUND"
        )
    found.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
    return found


def _stored_by(offset_msg_id: str) -> str:
    """The "host:port" of the broker an offset message id says stored the message."""
    try:
        host, _ = codec.decode_offset_msg_id(offset_msg_id)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc), code="INVALID_ARGUMENT") from None
    return str(host)


async def view_message(admin: Admin, offset_msg_id: str) -> ReceivedMessage:
    """See :meth:`Admin.view_message`."""
    addr = _stored_by(offset_msg_id)
    request = messaging_pb2.ViewMessageRequest(offset_msg_id=offset_msg_id)
    broker_name, members = addr, [(0, addr)]
    with contextlib.suppress(RocketQError):  # unknown to the nameserver: ask the address only
        group = (await admin.cluster_info()).group_of(addr)
        if group is not None:
            # the offset is the same on every replica (byte-identical commitlogs), so a slave
            # can answer for a master that does not
            # the address that stored it first, then the group's other members
            others = [m for m in group.read_order() if m[1] != addr]
            broker_name = group.broker_name
            members = [m for m in group.read_order() if m[1] == addr] + others

    async def ask(name: str, member_addr: str) -> messaging_pb2.ViewMessageResponse:
        stub = admin._messaging(member_addr)
        return await admin._guard(member_addr, stub.ViewMessage(request, **admin._kw))

    pb = await admin._read_members(broker_name, members, ask)
    return received_message(pb.message, broker_name if broker_name != addr else "")


async def dead_letters(
    admin: Admin, group: str, broker: str | None, offset: int | None, max_num: int
) -> DeadLetters:
    """See :meth:`Admin.dead_letters` (arguments checked there)."""
    request = admin_pb2.ListDeadLettersRequest(consumer_group=group, max_num=max_num)
    if offset is not None:
        request.offset = offset
    targets = await admin._groups_or(broker)

    async def ask(name: str, addr: str) -> DeadLetterPage:
        stub = admin._admin(addr)
        pb = await admin._guard(addr, stub.ListDeadLetters(request, **admin._kw))
        return dead_letter_page(pb, name)

    answers, failures = await admin._fan_out_reads(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    return DeadLetters(
        group=group,
        pages=tuple(answers[n] for n in sorted(answers)),
        errors={n: e.message for n, e in sorted(failures.items())},
    )


async def resend_dead_letter(admin: Admin, group: str, offset_msg_id: str) -> ResentDeadLetter:
    """See :meth:`Admin.resend_dead_letter` (the group is checked there)."""
    addr = _stored_by(offset_msg_id)
    request = admin_pb2.ResendDeadLetterRequest(consumer_group=group, offset_msg_id=offset_msg_id)
    pb = await admin._guard(addr, admin._admin(addr).ResendDeadLetter(request, **admin._kw))
    broker_name = ""
    with contextlib.suppress(RocketQError):  # the name is a nicety; the resend happened
        broker_name = (await admin.cluster_info()).broker_name_of(addr)
    return ResentDeadLetter(pb.topic, pb.msg_id, broker_name, pb.queue_id, pb.queue_offset)
