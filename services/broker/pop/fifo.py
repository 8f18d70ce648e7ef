"""FIFO groups: a queue's messages in order per message group, the groups side by side.

A FIFO consumer group (``consumeMessageOrderly``) gets the messages of one message group (the
``__SHARDINGKEY`` property; the v2 SDKs' ``message_group``; none = the group "" of the queue)
in queue order, the next one only once everything before it of that group is acked, while the
other message groups of the same queue keep going to whichever consumer asks. Apache RocketMQ's
pop holds the whole queue instead (one consumer per queue at a time); per message group is what
a FIFO producer asks for when it names a group.

A Pop scans a queue from its frontier (:class:`~services.broker.pop.state.FifoQueue`: every
offset below it is done) for at most :data:`SCAN_WINDOW` offsets:

| offset is                                 | the scan                                       |
|-------------------------------------------|------------------------------------------------|
| acked (above the frontier), or filtered   | skips it                                       |
| in flight, invisible time not over        | skips it and holds its message group           |
| in flight, invisible time over            | hands it out again, attempt + 1, unless its    |
|                                           | group is held; past the group's retryMaxTimes  |
|                                           | it goes to ``%DLQ%{group}`` and counts as done |
| never handed out                          | hands it out (attempt 1) unless its group is   |
|                                           | held                                           |

A skipped message holds its group too, so nothing later of that group overtakes it. The
frontier moves past the leading offsets that are done. The window bounds both the work of a
Pop and how far the other groups may run ahead of a group that is stuck (its messages are
retried and finally dead-lettered, so the queue moves on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocketq import codec
from rocketq.codec import Prop
from services.broker.pop.dead_letter import copy_message
from services.store.message_store import GetStatus

if TYPE_CHECKING:
    from services.broker.pop.processor import PopProcessor

SCAN_WINDOW = 512
"""Offsets past the frontier a Pop looks at, at most."""
SCAN_CHUNK = 32


_PASSED = frozenset(
    {
        GetStatus.NO_MATCHED_MESSAGE,
        GetStatus.MESSAGE_WAS_REMOVING,
        GetStatus.OFFSET_FOUND_NULL,
        GetStatus.OFFSET_TOO_SMALL,
    }
)
"""Statuses whose next_begin_offset skips offsets that hold nothing to deliver."""


def message_group(rec: codec.Record) -> str:
    return rec.properties.get(Prop.SHARDING_KEY, "")


@dataclass(slots=True)
class FifoTake:
    """What one scan of one queue found."""

    frontier: int
    hold_offset: int
    """Where a long poll on this queue waits for arrivals (the end of what was scanned)."""
    picked: list[tuple[codec.Record, int]] = field(default_factory=list)
    """Messages to hand out, in queue order, with their delivery attempt (1 = first)."""
    dead: list[tuple[str, int]] = field(default_factory=list)
    """(checkpoint id, offset) moved to %DLQ%{group}: to ack."""


@dataclass(slots=True)
class _Scan:
    pops: PopProcessor
    group: str
    asked_topic: str
    topic: str
    queue_id: int
    now_ms: int
    max_times: int
    take: FifoTake
    held: set[str] = field(default_factory=set)
    leading: bool = True
    """No offset that is not done was met yet (the frontier follows the scan)."""

    def done(self, offset: int) -> None:
        if self.leading:
            self.take.frontier = max(self.take.frontier, offset + 1)

    def skip(self, group: str) -> None:
        self.held.add(group)
        self.leading = False

    async def visit(self, rec: codec.Record) -> None:
        offset = rec.queue_offset
        fq = self.pops.state.fifo_queue(self.group, self.topic, self.queue_id)
        if offset in fq.done:
            self.done(offset)
            return
        group = message_group(rec)
        ck_id = fq.owner.get(offset)
        ck = self.pops.state.cks.get(ck_id) if ck_id is not None else None
        if ck is not None and (offset not in ck.offsets or offset in ck.acked):
            ck = None  # not held by it any more (the state keeps them in step; never trusted)
        if ck is not None and ck.until_ms > self.now_ms:
            self.skip(group)  # in flight
            return
        if group in self.held:
            self.skip(group)
            return
        attempt = ck.attempt_of(offset) + 1 if ck is not None else 1
        if ck is not None and 0 <= self.max_times < attempt - 1:
            await copy_message(
                self.pops, self.group, self.asked_topic, rec,
                reconsume_times=attempt - 1, to_dlq=True,
            )  # fmt: skip
            self.take.dead.append((ck.ck_id, offset))
            self.done(offset)
            return
        self.take.picked.append((rec, attempt))
        self.leading = False


async def scan(
    pops: PopProcessor,
    *,
    group: str,
    asked_topic: str,
    topic: str,
    queue_id: int,
    start: int,
    want: int,
    now_ms: int,
    max_times: int,
    tags_filter: Any,
    record_filter: Any,
) -> FifoTake:
    """Scan one queue of a FIFO group from its frontier ``start`` (see the module docstring).
    ``max_times`` is the group's retryMaxTimes (-1: no limit)."""
    s = _Scan(pops, group, asked_topic, topic, queue_id, now_ms, max_times, FifoTake(start, start))
    cursor, end = start, start + SCAN_WINDOW
    while cursor < end and len(s.take.picked) < want:
        got = pops.store.get_messages(
            topic, queue_id, cursor, min(SCAN_CHUNK, end - cursor),
            tags_filter=tags_filter, record_filter=record_filter,
        )  # fmt: skip
        if got.status is not GetStatus.FOUND:
            if got.status in _PASSED and got.next_begin_offset > cursor:
                # Removed by retention, or nothing matching the filter: done either way.
                s.done(got.next_begin_offset - 1)
                cursor = got.next_begin_offset
                continue
            break  # the end of the queue (or of what the in-sync replicas hold)
        for offset, raw in zip(got.queue_offsets, got.records, strict=True):
            if len(s.take.picked) >= want:
                break
            s.done(offset - 1)  # the offsets before it were filtered out
            await s.visit(codec.decode_record(raw, check_crc=False))
            cursor = offset + 1
        else:
            s.done(got.next_begin_offset - 1)
            cursor = got.next_begin_offset
    s.take.hold_offset = cursor
    return s.take
