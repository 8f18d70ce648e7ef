"""Test doubles shared by the consumer unit tests (no sockets, no brokers)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rocketq import codec
from rocketq.client.consumer.offset_store import ReadOffsetType
from rocketq.message import MessageQueue, ReceivedMessage

MQ = MessageQueue("T", "broker-a", 0)


def msg(
    offset: int, tags: str = "", topic: str = "T", body: bytes = b"x", *, queue_id: int = 0
) -> ReceivedMessage:
    """A pulled message at ``offset`` of queue ``queue_id`` of ``topic`` (TAGS set when given)."""
    props = {codec.Prop.TAGS: tags} if tags else {}
    return ReceivedMessage(
        topic=topic,
        body=body,
        properties=props,
        queue_id=queue_id,
        queue_offset=offset,
        commitlog_offset=1000 + offset,
        msg_id=f"id{offset}",
        offset_msg_id="",
        born_timestamp_ms=0,
        store_timestamp_ms=0,
        born_host="",
        store_host="",
        broker_name="broker-a",
    )


class MemoryOffsets:
    """A minimal in-memory OffsetStore."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}
        self.persisted: list[MessageQueue] = []

    async def load(self) -> None:
        pass

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        old = self.table.get(mq)
        if increase_only and old is not None and offset < old:
            return
        self.table[mq] = offset

    async def read_offset(self, mq: MessageQueue, type_: ReadOffsetType) -> int:
        return self.table.get(mq, -1)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        self.persisted += list(mqs)

    async def persist(self, mq: MessageQueue) -> None:
        self.persisted.append(mq)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return dict(self.table)


def qs(n: int, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, "broker-a", i) for i in range(n)]


def ids_of(cids: list[str]) -> Any:
    async def f(topic: str) -> list[str]:
        return cids

    return f
