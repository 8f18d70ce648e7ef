"""Consumer groups for the administration client: :meth:`Admin.consume_stats`,
:meth:`Admin.consumer_ids`, :meth:`Admin.consumer_connection` and :meth:`Admin.reset_offset`.

A group's state is spread over the brokers: each keeps the offsets committed on its own queues
and knows the members that heartbeat to it. So every call here asks several brokers at once
(the route's when a topic is given, else every master) through :meth:`Admin._fan_out` and
merges the answers; a broker that fails is reported in the result's ``errors`` and the call
raises only when none answered. A broker that does not know the group (NOT_FOUND) adds nothing.

Kept apart from :mod:`rocketq.client.admin` (which holds the public methods, their docstrings
and argument checks) because these merges are the bulk of the consumer-side code; the split
follows ``_admin_tx.py`` and ``_admin_ha.py``. ``reset_offset`` is the one write: it goes to
masters only, never to a slave standing in for one.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rocketq._api.rocketq.v1 import admin_pb2, messaging_pb2
from rocketq.client._admin_types import (
    ConsumerConnectionInfo,
    ConsumeStats,
    OffsetReset,
    QueueProgress,
    ResetResult,
)
from rocketq.client._admin_types import consumer_connection as connection_info
from rocketq.client.errors import NotFoundError

if TYPE_CHECKING:
    from rocketq.client.admin import Admin


async def consume_stats(admin: Admin, group: str, topic: str) -> ConsumeStats:
    """See :meth:`Admin.consume_stats` (arguments checked there)."""
    if topic:
        targets = await admin._route_members(topic)
    else:
        targets = await admin._groups_or(None)
    request = admin_pb2.GetConsumeStatsRequest(consumer_group=group, topic=topic)

    async def ask(name: str, addr: str) -> list[QueueProgress]:
        try:
            pb = await admin._guard(addr, admin._admin(addr).GetConsumeStats(request, **admin._kw))
        except NotFoundError:
            return []
        return [
            QueueProgress(
                q.topic,
                q.broker_name or name,
                q.queue_id,
                q.broker_offset,
                q.consumer_offset,
                q.lag,
                q.last_consumed_timestamp_ms,
            )
            for q in pb.queues
        ]

    answers, failures = await admin._fan_out_reads(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    queues = sorted(
        (q for qs in answers.values() for q in qs),
        key=lambda q: (q.topic, q.broker_name, q.queue_id),
    )
    return ConsumeStats(
        group=group,
        queues=tuple(queues),
        total_lag=sum(q.lag for q in queues),
        errors={n: e.message for n, e in sorted(failures.items())},
    )


async def consumer_ids(admin: Admin, group: str) -> list[str]:
    """See :meth:`Admin.consumer_ids` (arguments checked there)."""
    targets = await admin._groups_or(None)
    request = messaging_pb2.GetConsumerIdListRequest(consumer_group=group)

    async def ask(name: str, addr: str) -> list[str]:
        stub = admin._messaging(addr)
        pb = await admin._guard(addr, stub.GetConsumerIdList(request, **admin._kw))
        return list(pb.consumer_ids)

    answers, failures = await admin._fan_out_reads(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    return sorted({cid for ids in answers.values() for cid in ids})


async def consumer_connection(admin: Admin, group: str) -> ConsumerConnectionInfo:
    """See :meth:`Admin.consumer_connection` (arguments checked there)."""
    targets = await admin._groups_or(None)
    request = admin_pb2.GetConsumerConnectionRequest(consumer_group=group)

    async def ask(name: str, addr: str) -> admin_pb2.GetConsumerConnectionResponse | None:
        stub = admin._admin(addr)
        try:
            pb: admin_pb2.GetConsumerConnectionResponse = await admin._guard(
                addr, stub.GetConsumerConnection(request, **admin._kw)
            )
        except NotFoundError:
            return None
        return pb

    answers, failures = await admin._fan_out_reads(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    found = {name: pb for name, pb in answers.items() if pb is not None}
    if not found:
        raise NotFoundError(
            f"consumer group {group} has no live member on any broker "
            f"({', '.join(sorted(targets))})",
            code="NOT_FOUND",
        )
    info = connection_info(group, found)
    errors = {n: e.message for n, e in sorted(failures.items())}
    return dataclasses.replace(info, errors=errors) if errors else info


async def reset_offset(
    admin: Admin,
    group: str,
    topic: str,
    timestamp_ms: int | None,
    queue_offset: int | None,
    queue_id: int | None,
    broker: str | None,
) -> ResetResult:
    """See :meth:`Admin.reset_offset` (arguments checked there: exactly one position)."""
    request = admin_pb2.ResetOffsetRequest(consumer_group=group, topic=topic)
    if timestamp_ms is not None:
        request.timestamp_ms = timestamp_ms
    else:
        assert queue_offset is not None
        request.queue_offset = queue_offset
    if queue_id is not None:
        request.queue_id = queue_id
    targets = await admin._route_addrs(topic, broker)
    # A reset is a write: it must go to masters, never to a slave standing in for one.
    info = await admin.cluster_info()
    targets = {n: info.brokers[n].master_addr or a for n, a in targets.items()}

    async def ask(name: str, addr: str) -> admin_pb2.ResetOffsetResponse:
        return await admin._guard(addr, admin._admin(addr).ResetOffset(request, **admin._kw))

    answers, failures = await admin._fan_out(targets, ask)
    if failures and not answers:
        raise next(iter(failures.values()))
    return ResetResult(
        queues=tuple(
            OffsetReset(name, q.queue_id, q.old_offset, q.new_offset)
            for name in sorted(answers)
            for q in answers[name].queues
        ),
        notified_clients=sum(a.notified_clients for a in answers.values()),
        errors={n: e.message for n, e in sorted(failures.items())},
    )
