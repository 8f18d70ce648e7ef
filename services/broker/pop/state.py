"""The revive log's records, the pop state rebuilt from them, and receipt handles.

The log is the system topic ``rmq_sys_REVIVE_LOG_{cluster}`` (one queue). Each record's body is
a small JSON object; its ``t`` says what it is:

| t      | written by                 | fields                                                   |
|--------|----------------------------|----------------------------------------------------------|
| ``ck`` | Pop, ChangeInvisibleTime   | id, group g, asked topic at, read topic rt, queue q,     |
|        |                            | offsets o (queue offsets handed out), next n (the pop    |
|        |                            | offset after this read), until u (epoch ms); FIFO groups |
|        |                            | also f (true), the delivery attempt a (one number, or    |
|        |                            | one per offset) and d, the queue's offsets acked above   |
|        |                            | n (as differences from n): see :class:`FifoQueue`        |
| ``ack``| Ack, ChangeInvisibleTime   | id, offset o                                             |
| ``done``| the revive loop           | id (every unacked offset was copied for redelivery)      |

A checkpoint (RocketMQ's PopCheckPoint) is in flight until each of its offsets is acked or the
revive loop marks it done; then it is forgotten. A receipt handle names one offset of one
checkpoint: ``rq1|{broker}|{checkpoint id}|{queue offset}``. The id is 128 random bits, so a
handle cannot be guessed; it is valid exactly while that offset is in flight, so an acked,
changed or redelivered message's handle is refused (stale), as is any handle this broker never
issued (forged), both as INVALID_ARGUMENT INVALID_RECEIPT_HANDLE.

FIFO groups (the group's ``consumeMessageOrderly``) are ordered per *message group* (the
``__SHARDINGKEY`` property: the v2 SDKs' message_group; messages without one form the group
"" of their queue). For a FIFO checkpoint ``n`` is the queue's *frontier*: every offset below
it is acked (or skipped by the filter, or dead-lettered). Above the frontier a queue has
offsets in flight (each held by exactly one checkpoint: a later checkpoint of the same offset
takes it over, which is how a redelivery or a changed invisible time moves it), offsets acked
out of order (another message group went ahead) and offsets not handed out yet. Each FIFO
checkpoint carries the acked-above-frontier set ``d`` as its writer knew it, so a replay that
starts at the queue's newest checkpoint knows it too (:meth:`PopState.replay_start`).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from rocketq._api.rocketq.v1 import common_pb2
from services.common.errors import invalid

log = logging.getLogger(__name__)

REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
REVIVE_QUEUE_ID = 0
HANDLE_PREFIX = "rq1|"
HANDLE_MAX_CHARS = 512
REPLAY_GROUP = "rmq_sys_pop_revive"
"""The consumer offset of this group on the revive log is where a replay starts: the oldest
checkpoint still in flight (or the log's end)."""
RECORD_MAX_BYTES = 64 * 1024


def revive_topic(cluster: str) -> str:
    return f"{REVIVE_TOPIC_PREFIX}{cluster}"


def new_checkpoint_id() -> str:
    return secrets.token_hex(16)


@dataclass(slots=True)
class Checkpoint:
    """One Pop's messages from one queue, in flight."""

    ck_id: str
    group: str
    asked_topic: str
    """The topic the consumer popped (handles are checked against it)."""
    read_topic: str
    """The topic the messages were read from: ``asked_topic`` or ``%RETRY%{group}``."""
    queue_id: int
    offsets: tuple[int, ...]
    until_ms: int
    log_offset: int
    """Queue offset of the ``ck`` record in the revive log."""
    attempt: int | tuple[int, ...] = 1
    """FIFO checkpoints: which delivery of these offsets this is (the first is 1), for all of
    them or one per offset."""
    fifo: bool = False
    """A FIFO group's checkpoint: it holds its messages' message groups until acked, and is
    redelivered from the queue itself, in order, rather than through the retry topic."""
    acked: set[int] = field(default_factory=set)

    def unacked(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]

    def attempt_of(self, offset: int) -> int:
        if isinstance(self.attempt, int):
            return self.attempt
        return self.attempt[self.offsets.index(offset)]


FIFO_DONE_MAX = 4096
"""Offsets acked above a FIFO queue's frontier kept at most (the pop scan window bounds them
far below this; the cap only guards against a log written by something else)."""


@dataclass(slots=True)
class FifoQueue:
    """One FIFO group's progress on one queue above its frontier (see the module docstring)."""

    owner: dict[int, str] = field(default_factory=dict)
    """Offset in flight → the checkpoint holding it."""
    done: set[int] = field(default_factory=set)
    """Offsets acked above the frontier."""
    last_ck_log_offset: int = -1
    """Revive-log offset of this queue's newest checkpoint (a replay that has to know ``done``
    starts there at the latest)."""

    def done_above(self, frontier: int) -> list[int]:
        return sorted(o - frontier for o in self.done if o >= frontier)


def _attempts(ck: Checkpoint) -> tuple[int, ...]:
    if isinstance(ck.attempt, int):
        return (ck.attempt,) * len(ck.offsets)
    return ck.attempt


def handle_of(broker: str, ck_id: str, offset: int) -> str:
    return f"{HANDLE_PREFIX}{broker}|{ck_id}|{offset}"


def parse_handle(handle: str, broker: str) -> tuple[str, int]:
    """(checkpoint id, queue offset); INVALID_RECEIPT_HANDLE if it is not one of ours."""
    if not handle:
        invalid(common_pb2.INVALID_RECEIPT_HANDLE, "the receipt handle is empty")
    shown = handle[:80]
    if len(handle) > HANDLE_MAX_CHARS or not handle.startswith(HANDLE_PREFIX):
        invalid(
            common_pb2.INVALID_RECEIPT_HANDLE,
            f"{shown!r} is not a receipt handle from Pop (they start with {HANDLE_PREFIX!r})",
        )
    owner, _, rest = handle[len(HANDLE_PREFIX) :].rpartition("|")
    owner, _, ck_id = owner.rpartition("|")
    if owner != broker:
        invalid(
            common_pb2.INVALID_RECEIPT_HANDLE,
            f"receipt handle {shown!r} was issued by broker {owner!r}; this is {broker!r}: "
            "ack on the broker the message was popped from",
            broker_name=broker,
        )
    if not rest.isdigit() or len(ck_id) != 32:
        invalid(common_pb2.INVALID_RECEIPT_HANDLE, f"receipt handle {shown!r} is malformed")
    return ck_id, int(rest)


def encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


class PopState:
    """Checkpoints in flight and pop offsets, as the revive log says (applied in order)."""

    def __init__(self) -> None:
        self.cks: dict[str, Checkpoint] = {}
        self.next_offsets: dict[tuple[str, str, int], int] = {}
        """(group, read topic, queue) → the next queue offset to pop (a FIFO queue's frontier)."""
        self.fifo: dict[tuple[str, str, int], FifoQueue] = {}
        """(group, read topic, queue) of FIFO groups with offsets in flight or acked above the
        frontier."""
        self.applied_upto = -1
        """Revive-log offset of the next record to apply; -1 = not replayed yet."""

    def pop_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self.next_offsets.get((group, topic, queue_id), -1)

    def apply(self, body: bytes, log_offset: int) -> None:
        """Apply one revive-log record; a record that does not parse is logged and skipped (the
        log is only written by brokers, but must never stop a broker from starting)."""
        try:
            rec = json.loads(body)
            kind = rec["t"]
            if kind == "ck":
                self._apply_ck(rec, log_offset)
            elif kind == "ack":
                self._apply_ack(rec["id"], int(rec["o"]))
            elif kind == "done":
                self.cks.pop(rec["id"], None)
        except (ValueError, KeyError, TypeError):
            log.warning("revive log record at %d does not parse; skipped", log_offset)

    def _apply_ck(self, rec: dict[str, Any], log_offset: int) -> None:
        attempt = rec.get("a", 1)
        ck = Checkpoint(
            ck_id=rec["id"],
            group=rec["g"],
            asked_topic=rec["at"],
            read_topic=rec["rt"],
            queue_id=int(rec["q"]),
            offsets=tuple(int(o) for o in rec["o"]),
            until_ms=int(rec["u"]),
            log_offset=log_offset,
            attempt=int(attempt) if isinstance(attempt, int) else tuple(int(a) for a in attempt),
            fifo=bool(rec.get("f", False)),
        )
        if not isinstance(ck.attempt, int) and len(ck.attempt) != len(ck.offsets):
            raise ValueError("one attempt per offset")
        key = (ck.group, ck.read_topic, ck.queue_id)
        self.next_offsets[key] = max(self.next_offsets.get(key, -1), int(rec["n"]))
        if ck.fifo:
            self._apply_fifo_ck(key, ck, [int(d) for d in rec.get("d", ())], log_offset)
        if ck.offsets:
            self.cks[ck.ck_id] = ck

    def _apply_fifo_ck(
        self, key: tuple[str, str, int], ck: Checkpoint, done: list[int], log_offset: int
    ) -> None:
        """Take over the checkpoint's offsets from whichever checkpoint held them; learn the
        queue's acked-above-frontier set."""
        frontier = self.next_offsets[key]
        fq = self.fifo.setdefault(key, FifoQueue())
        fq.last_ck_log_offset = log_offset
        fq.done.update(frontier + d for d in done[:FIFO_DONE_MAX])
        for offset in ck.offsets:
            held_by = fq.owner.get(offset)
            if held_by is not None and held_by != ck.ck_id:
                self._release(held_by, offset)
            fq.owner[offset] = ck.ck_id
            fq.done.discard(offset)
        self._prune(key, fq)

    def _release(self, ck_id: str, offset: int) -> None:
        """``offset`` is no longer in flight under ``ck_id`` (a newer checkpoint holds it)."""
        old = self.cks.get(ck_id)
        if old is None:
            return
        kept = [(o, a) for o, a in zip(old.offsets, _attempts(old), strict=True) if o != offset]
        old.offsets = tuple(o for o, _a in kept)
        if not isinstance(old.attempt, int):
            old.attempt = tuple(a for _o, a in kept)
        if not old.unacked():
            del self.cks[ck_id]

    def _prune(self, key: tuple[str, str, int], fq: FifoQueue) -> None:
        """Forget what is below the frontier; advance the frontier over acked offsets."""
        frontier = self.next_offsets.get(key, -1)
        while frontier in fq.done:
            fq.done.discard(frontier)
            frontier += 1
        self.next_offsets[key] = frontier
        if any(o < frontier for o in fq.done):
            fq.done = {o for o in fq.done if o >= frontier}
        for offset in [o for o in fq.owner if o < frontier]:  # removed by retention
            self._release(fq.owner.pop(offset), offset)
        if not fq.owner and not fq.done:
            del self.fifo[key]

    def _apply_ack(self, ck_id: str, offset: int) -> None:
        ck = self.cks.get(ck_id)
        if ck is None:
            return  # acked before a replay's start, or already done
        ck.acked.add(offset)
        if ck.fifo:
            key = (ck.group, ck.read_topic, ck.queue_id)
            fq = self.fifo.get(key)
            if fq is not None and fq.owner.get(offset) == ck_id:
                del fq.owner[offset]
                if offset >= self.next_offsets.get(key, -1) and len(fq.done) < FIFO_DONE_MAX:
                    fq.done.add(offset)
                self._prune(key, fq)
        if not ck.unacked():
            del self.cks[ck_id]

    def in_flight(self, ck_id: str, offset: int) -> Checkpoint | None:
        """The checkpoint holding ``offset`` unacked, or None (stale or never issued)."""
        ck = self.cks.get(ck_id)
        if ck is None or offset not in ck.offsets or offset in ck.acked:
            return None
        return ck

    def due(self, now_ms: int) -> list[Checkpoint]:
        """Checkpoints past their invisible time that the revive loop redelivers (FIFO ones are
        redelivered by the next Pop of their queue)."""
        return [ck for ck in self.cks.values() if ck.until_ms <= now_ms and not ck.fifo]

    def fifo_queue(self, group: str, topic: str, queue_id: int) -> FifoQueue:
        """A FIFO queue's state (an empty one if nothing is in flight or acked above it)."""
        return self.fifo.get((group, topic, queue_id)) or FifoQueue()

    def fifo_next_expiry_ms(self, group: str, now_ms: int) -> int | None:
        """When the group's next FIFO checkpoint passes its invisible time (its messages may
        then go out again), if any is in flight."""
        untils = [c.until_ms for c in self.cks.values() if c.fifo and c.group == group]
        return min((u for u in untils if u > now_ms), default=None)

    def replay_start(self) -> int:
        """The oldest in-flight checkpoint's log offset, or the newest checkpoint of a FIFO
        queue with offsets acked above its frontier if older; else where the next record
        goes."""
        oldest = min(
            [ck.log_offset for ck in self.cks.values()]
            + [fq.last_ck_log_offset for fq in self.fifo.values() if fq.done],
            default=None,
        )
        return self.applied_upto if oldest is None else oldest
