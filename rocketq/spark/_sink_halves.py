"""The sink's wire work: rows packed into batch half messages, and their ends.

A *batch half message* (services/broker/transaction_batch.py) is one transactional half
message whose body is many records; its commit stores them all in one append, or none. The
sink packs the rows of a task by target queue into such halves (at most
:data:`HALF_ROWS_MAX` rows and :data:`HALF_BYTES_MAX` bytes each), so a task costs one Send per
few hundred rows and a commit one EndTransaction per half instead of one of each per row.

Which queue a row goes to:

* with a ``shardingKey``: ``SelectMessageQueueByHash`` over the topic's writable queues, as
  the SDK's orderly send does, so one key always lands in one queue; the halves of one queue
  are ended one after another in the order they were written, so rows keep their order;
* without: the task's current queue of the topic, moved round-robin after every half.

A half that could not be stored is sent again with a new transaction id (to another queue
when no sharding key pins it). An earlier try the broker did store after all is never in the
commit record, so it is rolled back (rocketq.spark.sink answers its check-back ROLLBACK).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.admin import Admin
from rocketq.client.errors import RocketQError, from_rpc_error
from rocketq.client.producer.selectors import java_hash_code
from rocketq.client.producer.transaction import TransactionProducer
from rocketq.codec import Prop, SysFlag
from rocketq.message import MessageQueue, check_user_properties, new_unique_id

HALF_ROWS_MAX = 512
"""Rows per batch half message."""
HALF_BYTES_MAX = 1024 * 1024
"""Encoded records per batch half message (a lone bigger row gets a half of its own; the
broker's maxMessageSize, 4 MiB by default, bounds that)."""
HALVES_IN_FLIGHT_MAX = 8
"""Batch half messages one task has in flight at once."""
SEND_ATTEMPTS = 3
SEND_TIMEOUT_S = 30.0
END_ATTEMPTS = 4
END_TIMEOUT_S = 15.0
RETRY_PAUSE_S = 0.5


@dataclass(frozen=True)
class HalfRef:
    """A stored batch half message: what ending it needs, and its lane (target queue)."""

    broker: str
    commitlog_offset: int
    queue_offset: int
    txid: str
    topic: str
    queue_id: int
    rows: int

    def as_list(self) -> list[Any]:
        return [
            self.broker,
            self.commitlog_offset,
            self.queue_offset,
            self.txid,
            self.topic,
            self.queue_id,
            self.rows,
        ]

    @classmethod
    def of(cls, item: list[Any]) -> HalfRef:
        b, clo, qo, txid, topic, qid, rows = item
        return cls(str(b), int(clo), int(qo), str(txid), str(topic), int(qid), int(rows))


class RowError(ValueError):
    """A row the sink cannot write; the message says which column and why."""


# ---- rows -> records ------------------------------------------------------------------------


def _ms(value: Any, column: str) -> int:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError(f"column {column} holds {value!r}; give milliseconds as an integer")
    if value < 0:
        raise RowError(f"column {column} is {value}; it must be >= 0")
    return value


def row_properties(
    cols: dict[str, list[Any]], i: int, sink_props: dict[str, str]
) -> dict[str, str]:
    """The stored properties of row ``i`` (user properties checked like the SDK does)."""
    props: dict[str, str] = {}
    user = cols.get("properties")
    if user is not None and user[i]:
        raw = dict(user[i])
        try:
            check_user_properties(raw)
        except ValueError as exc:
            raise RowError(f"column properties: {exc}") from None
        props.update({str(k): str(v) for k, v in raw.items()})
    props.update(sink_props)
    tags = cols.get("tags")
    if tags is not None and tags[i]:
        props[Prop.TAGS] = str(tags[i])
    keys = cols.get("keys")
    if keys is not None and keys[i]:
        k = keys[i]
        props[Prop.KEYS] = " ".join(x for x in (k.split(" ") if isinstance(k, str) else k) if x)
    delay = cols.get("delayms")
    deliver = cols.get("delivertimems")
    d = delay[i] if delay is not None else None
    t = deliver[i] if deliver is not None else None
    if d is not None and t is not None:
        raise RowError("a row gives both delayMs and deliverTimeMs; give one of them")
    if d is not None and _ms(d, "delayMs") > 0:
        # Counted by the broker from the commit: a row is never visible before it commits.
        props[Prop.TIMER_DELAY_MS] = str(_ms(d, "delayMs"))
    if t is not None:
        props[Prop.TIMER_DELIVER_MS] = str(_ms(t, "deliverTimeMs"))
    shard = cols.get("shardingkey")
    if shard is not None and shard[i] is not None:
        props[Prop.SHARDING_KEY] = str(shard[i])
    props[Prop.UNIQ_KEY] = new_unique_id()
    return props


def record(topic_bytes: bytes, body: Any, props: dict[str, str]) -> bytes:
    """One record of a batch half message's body."""
    if body is None:
        raise RowError("a row has a null body; the sink sends only rows with a body")
    data = body.encode() if isinstance(body, str) else bytes(body)
    if not data:
        raise RowError("a row has an empty body; the sink sends only rows with a body")
    try:
        encoded = codec.encode_properties(props)
    except ValueError as exc:
        raise RowError(str(exc)) from None
    if len(encoded) > codec.PROPERTIES_MAX_BYTES:
        raise RowError(
            f"a row's properties take {len(encoded)} bytes encoded; the limit is "
            f"{codec.PROPERTIES_MAX_BYTES}"
        )
    return codec.encode_sent_record(topic_bytes, data, encoded, 0, 0, int(time.time() * 1000))


# ---- the lanes of one task ------------------------------------------------------------------


@dataclass
class _Open:
    """Records collected for one target queue, not yet sent."""

    records: list[bytes]
    size_bytes: int = 0


class Packer:
    """Packs the rows of one task into batch halves per target queue (see the module)."""

    def __init__(self, queues_of: Callable[[str], list[MessageQueue]], seed: int) -> None:
        self._queues_of = queues_of
        """topic -> its writable queues (sorted), fetched once per topic per task."""
        self._rr: dict[str, int] = {}
        self._seed = seed
        self.open: dict[MessageQueue, _Open] = {}

    def target(self, topic: str, sharding_key: Any) -> MessageQueue:
        queues = self._queues_of(topic)
        if sharding_key is not None:
            # SelectMessageQueueByHash's rule, so a key lands where the SDK's orderly send puts it.
            key = sharding_key if isinstance(sharding_key, (str, int)) else str(sharding_key)
            return queues[abs(java_hash_code(key)) % len(queues)]
        i = self._rr.setdefault(topic, self._seed % len(queues))
        return queues[i % len(queues)]

    def add(
        self, topic: str, sharding_key: Any, rec: bytes
    ) -> list[tuple[MessageQueue, list[bytes]]]:
        """Add one record of ``topic``; the halves that are full now (to send)."""
        out = []
        mq = self.target(topic, sharding_key)
        lane = self.open.get(mq)
        if lane is not None and (
            len(lane.records) >= HALF_ROWS_MAX or lane.size_bytes + len(rec) > HALF_BYTES_MAX
        ):
            out.append(self._close(mq))
            mq = self.target(topic, sharding_key)  # a row no key pins starts the next queue
            lane = self.open.get(mq)
        if lane is None:
            lane = self.open[mq] = _Open([])
        lane.records.append(rec)
        lane.size_bytes += len(rec)
        return out

    def _close(self, mq: MessageQueue) -> tuple[MessageQueue, list[bytes]]:
        lane = self.open.pop(mq)
        if mq.topic in self._rr:  # no sharding key pins it: the next half goes elsewhere
            self._rr[mq.topic] += 1
        return mq, lane.records

    def rest(self) -> list[tuple[MessageQueue, list[bytes]]]:
        return [self._close(mq) for mq in list(self.open)]


# ---- sends and ends -------------------------------------------------------------------------


async def send_half(
    p: TransactionProducer,
    mq: MessageQueue,
    records: list[bytes],
    props: dict[str, str],
    pinned: bool,
) -> HalfRef:
    """Store one batch half message (retried with a new transaction id, on another queue
    unless ``pinned``); raises RocketQError when every attempt failed."""
    body = b"".join(records)
    instance = p.instance
    group = p.config.group
    last: RocketQError | None = None
    for attempt in range(SEND_ATTEMPTS):
        route = await instance.get_route(mq.topic, refresh=attempt > 0)
        if attempt and not pinned:
            queues = route.write_queues()
            if queues:
                mq = queues[(queues.index(mq) + 1) % len(queues) if mq in queues else 0]
        addr = route.master_addr(mq.broker_name)
        txid = new_unique_id()
        msg = common_pb2.Message(
            topic=mq.topic,
            body=body,
            properties={
                **props,
                Prop.UNIQ_KEY: txid,
                Prop.TRANSACTION_PREPARED: "true",
                Prop.PRODUCER_GROUP: group,
                Prop.TRANSACTION_BATCH: str(len(records)),
            },
        )
        req = messaging_pb2.SendRequest(
            producer_group=group,
            queue_id=mq.queue_id,
            born_timestamp_ms=int(time.time() * 1000),
            sys_flag=SysFlag.TRANSACTION_PREPARED,
            messages=[msg],
        )
        try:
            if addr is None:
                raise RocketQError(f"broker {mq.broker_name} has no live master")
            resp = await instance.messaging(addr).Send(req, timeout=SEND_TIMEOUT_S)
        except grpc.RpcError as err:
            last = from_rpc_error(err, addr or "")
            if not last.retriable:
                raise last from None
        except RocketQError as exc:
            last = exc
        else:
            r = resp.results[0]
            if r.status != messaging_pb2.SEND_OK:
                last = RocketQError(
                    f"batch half {txid} to {mq} stored with "
                    f"{messaging_pb2.SendStatus.Name(r.status)}"
                )
            else:
                _, commitlog_offset = codec.decode_offset_msg_id(r.offset_msg_id)
                return HalfRef(
                    mq.broker_name,
                    commitlog_offset,
                    r.queue_offset,
                    r.transaction_id or txid,
                    mq.topic,
                    mq.queue_id,
                    len(records),
                )
        await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))
    assert last is not None
    raise last


def lanes(halves: Iterable[HalfRef]) -> dict[tuple[str, str, int], list[HalfRef]]:
    """Halves by target queue, each lane in the given (write) order."""
    out: dict[tuple[str, str, int], list[HalfRef]] = {}
    for h in halves:
        out.setdefault((h.broker, h.topic, h.queue_id), []).append(h)
    return out


async def end_halves(
    p: TransactionProducer, admin: Admin, halves: list[HalfRef], commit: bool
) -> None:
    """EndTransaction for every half: lanes in parallel, each lane in order (so rows of one
    queue become visible in the order they were written). An end is idempotent on the broker,
    so a retry or a second commit of the same batch changes nothing. Raises RocketQError
    when a half could not be ended (its lane stops there: later halves wait for the replay)."""
    resolution = messaging_pb2.TRANSACTION_COMMIT if commit else messaging_pb2.TRANSACTION_ROLLBACK
    group = p.config.group
    masters = _Masters(admin)

    async def lane(items: list[HalfRef]) -> None:
        for h in items:
            req = messaging_pb2.EndTransactionRequest(
                producer_group=group,
                commitlog_offset=h.commitlog_offset,
                queue_offset=h.queue_offset,
                msg_id=h.txid,
                transaction_id=h.txid,
                resolution=resolution,
                from_transaction_check=False,
            )
            await _end_one(p, masters, h, req)

    await asyncio.gather(*(lane(items) for items in lanes(halves).values()))


class _Masters:
    """Broker name -> master address, asked again after a failed end (a failover moves it)."""

    def __init__(self, admin: Admin) -> None:
        self.admin = admin
        self.known: dict[str, str] | None = None
        self.lock = asyncio.Lock()

    async def get(self, broker: str, fresh: bool) -> str | None:
        async with self.lock:
            if self.known is None or fresh:
                try:
                    self.known = (await self.admin.cluster_info()).masters()
                except RocketQError:
                    if self.known is None:
                        raise
            return self.known.get(broker)


async def _end_one(
    p: TransactionProducer,
    masters: _Masters,
    h: HalfRef,
    req: messaging_pb2.EndTransactionRequest,
) -> None:
    last: RocketQError | None = None
    for attempt in range(END_ATTEMPTS):
        addr = await masters.get(h.broker, fresh=attempt > 0)
        if addr is None:
            last = RocketQError(f"broker {h.broker} has no live master")
        else:
            try:
                await p.instance.messaging(addr).EndTransaction(req, timeout=END_TIMEOUT_S)
                return
            except grpc.RpcError as err:
                last = from_rpc_error(err, addr)
                if not last.retriable:
                    raise last from None
        await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))
    assert last is not None
    raise last


def seed() -> int:
    return random.randrange(1 << 16)
