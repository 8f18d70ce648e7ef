"""The revive log's records, the pop state rebuilt from them, and receipt handles.

The log is the system topic ``rmq_sys_REVIVE_LOG_{cluster}`` (one queue). Each record's body is
a small JSON object; its ``t`` says what it is:

| t      | written by                 | fields                                                   |
|--------|----------------------------|----------------------------------------------------------|
| ``ck`` | Pop, ChangeInvisibleTime   | id, group g, asked topic at, read topic rt, queue q,     |
|        |                            | offsets o (queue offsets handed out), next n (the pop    |
|        |                            | offset after this read), until u (epoch ms); FIFO groups |
|        |                            | also f (true) and the delivery attempt a                 |
| ``ack``| Ack, ChangeInvisibleTime   | id, offset o                                             |
| ``done``| the revive loop           | id (every unacked offset was copied for redelivery)      |

A checkpoint (RocketMQ's PopCheckPoint) is in flight until each of its offsets is acked or the
revive loop marks it done; then it is forgotten. A receipt handle names one offset of one
checkpoint: ``rq1|{broker}|{checkpoint id}|{queue offset}``. The id is 128 random bits, so a
handle cannot be guessed; it is valid exactly while that offset is in flight, so an acked,
changed or redelivered message's handle is refused (stale), as is any handle this broker never
issued (forged), both as INVALID_ARGUMENT INVALID_RECEIPT_HANDLE.
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
    attempt: int = 1
    """FIFO checkpoints: which delivery of these offsets this is (the first is 1)."""
    fifo: bool = False
    """A FIFO group's checkpoint: it blocks its queue until acked, and is redelivered from
    the queue itself, in order, rather than through the retry topic."""
    acked: set[int] = field(default_factory=set)

    def unacked(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]


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
        """(group, read topic, queue) → the next queue offset to pop."""
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
        ck = Checkpoint(
            ck_id=rec["id"],
            group=rec["g"],
            asked_topic=rec["at"],
            read_topic=rec["rt"],
            queue_id=int(rec["q"]),
            offsets=tuple(int(o) for o in rec["o"]),
            until_ms=int(rec["u"]),
            log_offset=log_offset,
            attempt=int(rec.get("a", 1)),
            fifo=bool(rec.get("f", False)),
        )
        key = (ck.group, ck.read_topic, ck.queue_id)
        self.next_offsets[key] = max(self.next_offsets.get(key, -1), int(rec["n"]))
        if ck.offsets:
            self.cks[ck.ck_id] = ck

    def _apply_ack(self, ck_id: str, offset: int) -> None:
        ck = self.cks.get(ck_id)
        if ck is None:
            return  # acked before a replay's start, or already done
        ck.acked.add(offset)
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

    def fifo_holder(self, group: str, topic: str, queue_id: int) -> Checkpoint | None:
        """The FIFO checkpoint holding a queue for a group, if any (at most one: a Pop skips a
        held queue)."""
        for ck in self.cks.values():
            if ck.fifo and (ck.group, ck.read_topic, ck.queue_id) == (group, topic, queue_id):
                return ck
        return None

    def replay_start(self) -> int:
        """The oldest in-flight checkpoint's log offset, else where the next record goes."""
        oldest = min((ck.log_offset for ck in self.cks.values()), default=None)
        return self.applied_upto if oldest is None else oldest
