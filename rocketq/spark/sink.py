"""Writing Spark rows to RocketQ, exactly once across task retries and restarts.

How (DESIGN.md §10):

1. ``write()`` (one per task attempt, on an executor) packs the rows into *batch half
   messages* (rocketq.spark._sink_halves; services/broker/transaction_batch.py): one
   transactional half message holds up to a few hundred rows of one target queue, invisible
   to consumers, and its commit stores all of them in one append. Each half carries
   ``spark.queryId`` (Spark's query id, stable across restarts from one checkpoint; a fresh
   id per batch write job), ``spark.batchId`` and ``spark.attempt`` (a random id of this task
   attempt). The task returns the halves it stored, in the order it wrote them.
2. ``commit(batchId)`` (after every task succeeded) first records the decision: a message on
   the commits topic (``commitsTopic``) keyed ``<queryId>:<batchId>`` whose body lists the
   halves Spark committed (broker, offsets, transaction id). That message is the commit point.
   Then it ends exactly those halves with COMMIT, one target queue after another in write
   order (so a ``shardingKey`` keeps its rows' order), queues in parallel.
3. ``abort()`` rolls back the halves it is given.

A replayed batch (the driver died after step 2's record but before Spark wrote its own commit
log) is skipped: ``write()`` finds the record and sends nothing, and ``commit()`` ends the
recorded halves again — an EndTransaction of a half already ended changes nothing, so a commit
cut off half way is completed, never doubled. A batch whose record was never written is
written again by the replay, with new halves.

Every half nobody ends (a failed or retried task attempt, a half re-sent after a timeout, the
first run of a replayed batch, the driver gone) is settled by the broker's check-back, which
asks a live producer of the group after ``transactionTimeout``: every sink process (tasks and
commits, kept alive with the Python worker) is one, and :class:`RecordedDecision` answers
from the commits topic — COMMIT when the half is listed in its batch's record, ROLLBACK when
the batch is recorded without it, UNKNOW while its batch has no record (asked again later;
after ``transactionCheckMax`` checks the broker discards it, which is a rollback).

Delays (``delayMs`` / ``deliverTimeMs`` columns): a delayed transactional message is refused by
RocketMQ and by the ordinary send path, because a half message waits for its decision. A batch
half message instead carries each row's delay inside its records, and the broker evaluates it
when the half COMMITS: a due row goes to its queue, a row still ahead goes to the timer topic
in the same append, and the timer wheel delivers it once (its re-puts are de-duplicated). So
``delayMs`` counts from the commit of the micro-batch, and no delayed row is ever visible
before its batch commits or before its time; exactly-once is the same as for other rows.

Guarantee: each row of a committed micro-batch (or batch write job) becomes visible exactly
once; rows of aborted or failed attempts never. Limits: a driver that stays away longer than
``transactionCheckMax`` × ``transactionCheckInterval`` (15 min by default) after recording a
batch but before ending all its halves, with no other sink process of the producer group
alive to answer check-backs, loses the halves not yet ended (the broker discards them); a
micro-batch must commit within ``transactionTimeout`` + ``transactionCheckMax`` ×
``transactionCheckInterval`` of its first write for the same reason; one record lists at most
:data:`RECORD_HALVES_MAX` halves (about 30 million rows per micro-batch).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.errors import RocketQError, TopicNotFoundError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.client.producer.transaction import (
    LocalTransactionState,
    TransactionProducer,
)
from rocketq.codec import Prop
from rocketq.message import Message, MessageQueue, ReceivedMessage, SendStatus
from rocketq.spark import _client
from rocketq.spark._sink_halves import (
    HALVES_IN_FLIGHT_MAX,
    HalfRef,
    Packer,
    RowError,
    end_halves,
    record,
    row_properties,
    seed,
    send_half,
)
from rocketq.spark.options import OptionError, SinkOptions, sink_options

log = logging.getLogger(__name__)

PROP_QUERY = "spark.queryId"
PROP_BATCH = "spark.batchId"
PROP_ATTEMPT = "spark.attempt"
COMMITS_TOPIC_WAIT_S = 15.0
"""How long a newly created commits topic may take to show in the nameserver's routes."""
RECORD_SEND_TIMEOUT_MS = 15_000
RECORD_HALVES_MAX = 60_000
"""Halves one commit record lists (~70 bytes each: the record stays under 4 MiB)."""
_COLUMNS = {
    "body",
    "topic",
    "tags",
    "keys",
    "properties",
    "delayms",
    "delivertimems",
    "shardingkey",
}
_SPELLING = {
    "delayms": "delayMs",
    "delivertimems": "deliverTimeMs",
    "shardingkey": "shardingKey",
}


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """OptionError (at query start) for columns the sink cannot write."""
    names = {n.lower() for n in schema.fieldNames()}
    if "body" not in names:
        raise OptionError("the sink needs a column named body (binary or string)")
    unknown = sorted(n for n in schema.fieldNames() if n.lower() not in _COLUMNS)
    if unknown:
        raise OptionError(
            f"the sink does not know the column(s) {', '.join(unknown)}; it writes "
            + ", ".join(sorted(_SPELLING.get(c, c) for c in _COLUMNS))
            + " (select only these)"
        )
    if "topic" not in names and not opts.topic:
        raise OptionError("give the option topic or a column named topic")


# ---- what tasks hand to the commit ----------------------------------------------------------


@dataclass
class SinkCommit(WriterCommitMessage):
    query: str
    batch: int
    attempt: str
    partition: int = 0
    skipped: bool = False
    halves: list[HalfRef] = field(default_factory=list)


# ---- the recorded decisions (commits topic) -------------------------------------------------


def record_key(query: str, batch: int) -> str:
    return f"{query}:{batch}"


@dataclass(frozen=True)
class Recorded:
    """A batch's commit record: the halves to commit, in commit order."""

    halves: list[HalfRef]
    legacy_attempts: frozenset[str] = frozenset()
    """A record of the sink before batch halves (no ``halves`` field): its per-row halves are
    committed by task attempt, as that sink's check-backs did."""

    @property
    def txids(self) -> set[str]:
        return {h.txid for h in self.halves}


def lookup(admin: Admin, topic: str, query: str, batch: int) -> Recorded | None:
    """The record of ``batch`` of ``query``; None when it has none."""

    async def go() -> list[ReceivedMessage]:
        try:
            return await admin.query_by_key(topic, record_key(query, batch), max_num=8)
        except TopicNotFoundError:
            return []

    found = _client.retrying(go)
    mine = [m for m in found if json.loads(m.body).get("query") == query]
    if not mine:
        return None
    first = json.loads(min(mine, key=lambda m: (m.store_timestamp_ms, m.queue_offset)).body)
    if "halves" not in first:
        return Recorded([], frozenset(first.get("attempts", [])))
    return Recorded([HalfRef.of(h) for h in first["halves"]])


class RecordedDecision:
    """The transaction listener of every sink producer: answers check-backs from the commits
    topic (see the module docstring). Local transactions are never run through it."""

    def __init__(self, admin: Admin, commits_topic: str) -> None:
        self.admin = admin
        self.commits_topic = commits_topic

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        txids = {message.msg_id, message.properties.get(Prop.UNIQ_KEY, "")} - {""}
        return decide(self.admin, self.commits_topic, message.properties, txids)


def decide(
    admin: Admin, commits_topic: str, props: dict[str, str], txids: set[str]
) -> LocalTransactionState:
    query, batch = props.get(PROP_QUERY), props.get(PROP_BATCH)
    if not query or batch is None:
        return LocalTransactionState.UNKNOW
    recorded = lookup(admin, commits_topic, query, int(batch))
    if recorded is None:
        return LocalTransactionState.UNKNOW
    if txids & recorded.txids or props.get(PROP_ATTEMPT) in recorded.legacy_attempts:
        return LocalTransactionState.COMMIT_MESSAGE
    return LocalTransactionState.ROLLBACK_MESSAGE


# ---- the process's producer (kept with the worker so it answers check-backs) -----------------

_lock = threading.Lock()
_producers: dict[tuple[str, str, str], tuple[TransactionProducer, Admin]] = {}


def producer(opts: SinkOptions) -> tuple[TransactionProducer, Admin]:
    key = (opts.nameserver, opts.producer_group, opts.commits_topic)
    with _lock:
        if key in _producers:
            return _producers[key]
        loop = _client.loop()

        async def start() -> tuple[TransactionProducer, Admin]:
            admin = Admin(opts.nameserver, timeout_ms=_client.REQUEST_TIMEOUT_MS)
            config = ProducerConfig(
                group=opts.producer_group,
                namesrv_addrs=opts.nameserver,
                instance_name=f"spark-sink-{uuid.uuid4().hex[:12]}",
            )
            p = TransactionProducer(config, RecordedDecision(admin, opts.commits_topic))
            await p.start()
            return p, admin

        made = loop.run(start())
        _producers[key] = made
        return made


# ---- write (executor) -----------------------------------------------------------------------


def write_task(
    opts: SinkOptions, query: str, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> SinkCommit:
    """One task attempt: its rows as batch half messages (none when the batch is recorded)."""
    attempt = uuid.uuid4().hex
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    p, admin = producer(opts)
    if lookup(admin, opts.commits_topic, query, batch_id) is not None:
        log.info("batch %d of query %s is already committed: a replay, skipped", batch_id, query)
        return SinkCommit(query, batch_id, attempt, partition, skipped=True)
    loop = _client.loop()
    queues: dict[str, list[MessageQueue]] = {}

    def queues_of(topic: str) -> list[MessageQueue]:
        if topic not in queues:
            route = _client.retrying(lambda: p.instance.get_route(topic, refresh=True))
            found = route.write_queues()
            if not found:
                raise RocketQError(f"topic {topic!r} has no writable queue on a live master")
            queues[topic] = found
        return queues[topic]

    props = {PROP_QUERY: query, PROP_BATCH: str(batch_id), PROP_ATTEMPT: attempt}
    packer = Packer(queues_of, seed() + partition)
    sending: list[Future[HalfRef]] = []

    def ship(full: list[tuple[MessageQueue, list[bytes]]], pinned: bool) -> None:
        for mq, records in full:
            while sum(not f.done() for f in sending) >= HALVES_IN_FLIGHT_MAX:
                next(f for f in sending if not f.done()).result()
            sending.append(
                asyncio.run_coroutine_threadsafe(
                    send_half(p, mq, records, props, pinned), loop.loop
                )
            )

    sharded = False
    for batch in batches:
        cols = {n.lower(): batch.column(i).to_pylist() for i, n in enumerate(batch.schema.names)}
        topics = cols.get("topic")
        shard = cols.get("shardingkey")
        sharded = sharded or shard is not None
        bodies = cols["body"]
        for i in range(batch.num_rows):
            topic = (topics[i] if topics is not None else None) or opts.topic
            if not topic:
                raise RowError("a row has a null topic and the sink has no topic option")
            key = shard[i] if shard is not None else None
            rec = record(topic.encode(), bodies[i], row_properties(cols, i, props))
            ship(packer.add(topic, key, rec), sharded)
    ship(packer.rest(), sharded)
    halves = [f.result() for f in sending]  # in write order; raises what a send raised
    return SinkCommit(query, batch_id, attempt, partition, halves=halves)


# ---- commit / abort (driver side) -----------------------------------------------------------


def commit_batch(opts: SinkOptions, messages: list[Any], batch_id: int) -> None:
    """Step 2 of the module docstring: record the batch (unless it is), then end its halves."""
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    if not commits:
        return
    p, admin = producer(opts)
    recorded = record_batch(opts, commits, batch_id)
    _client.loop().run(end_halves(p, admin, recorded.halves, commit=True))


def record_batch(opts: SinkOptions, commits: list[SinkCommit], batch_id: int) -> Recorded:
    """The batch's record: the one found, else a new one listing the halves of ``commits``
    (in partition order, each task's in write order). Writing it is the commit point."""
    commits = sorted(commits, key=lambda c: c.partition)
    query = commits[0].query
    p, admin = producer(opts)
    recorded = lookup(admin, opts.commits_topic, query, batch_id)
    if recorded is not None:
        return recorded
    recorded = Recorded([h for c in commits if not c.skipped for h in c.halves])
    if len(recorded.halves) > RECORD_HALVES_MAX:
        raise RuntimeError(
            f"batch {batch_id} wrote {len(recorded.halves)} half messages; one commit "
            f"record lists at most {RECORD_HALVES_MAX}: make the micro-batches smaller "
            "(maxOffsetsPerTrigger, or fewer rows per batch write)"
        )
    body = json.dumps(
        {
            "query": query,
            "batch": batch_id,
            "attempts": sorted(c.attempt for c in commits if not c.skipped),
            "halves": [h.as_list() for h in recorded.halves],
        },
        separators=(",", ":"),
    )
    _client.loop().run(_record(p, opts.commits_topic, record_key(query, batch_id), body))
    return recorded


async def _record(p: TransactionProducer, topic: str, key: str, body: str) -> None:
    """The commit point: a plain message (not a half) on the commits topic, stored SEND_OK."""
    where = (tuple(p.config.namesrv_addrs), p.config.group)
    plain = _plain.get(where)
    if plain is None:
        plain = Producer(
            ProducerConfig(
                group=p.config.group + "-records",
                namesrv_addrs=p.config.namesrv_addrs,
                instance_name=f"spark-record-{uuid.uuid4().hex[:12]}",
                # Loaded Spark hosts answer slowly; a record stored twice is harmless (lookup
                # takes the first, and both list the same halves).
                send_msg_timeout_ms=RECORD_SEND_TIMEOUT_MS,
            )
        )
        await plain.start()
        _plain[where] = plain
    result = await plain.send(Message(topic=topic, body=body.encode(), keys=key))
    if result.status is not SendStatus.SEND_OK:
        raise RuntimeError(f"the commit record {key} was stored with {result.status.value}")


_plain: dict[tuple[tuple[str, ...], str], Producer] = {}
"""The process's producers of commit records, by nameservers and sink producer group (used on
the loop): one process may write to several clusters."""


def abort_batch(opts: SinkOptions, messages: list[Any], batch_id: int) -> None:
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    if not commits:
        return
    p, admin = producer(opts)
    recorded = lookup(admin, opts.commits_topic, commits[0].query, batch_id)
    keep = recorded.txids if recorded is not None else set()
    # A recorded batch is committed whatever Spark says now: only unlisted halves roll back.
    halves = [h for c in commits for h in c.halves if h.txid not in keep]
    try:
        _client.loop().run(end_halves(p, admin, halves, commit=False))
    except RocketQError as exc:  # the check-back rolls back what could not be ended here
        log.warning("rolling back the halves of batch %d failed: %s", batch_id, exc)


# ---- the writers Spark drives ---------------------------------------------------------------


def _local(name: str) -> str | None:
    ctx = TaskContext.get()
    return ctx.getLocalProperty(name) if ctx is not None else None


class RocketQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        query = _local("sql.streaming.queryId")
        batch = _local("streaming.sql.batchId")
        if not query or batch is None:
            raise RuntimeError("no streaming query id / batch id in the task's local properties")
        return write_task(self.opts, query, int(batch), iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        commit_batch(self.opts, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        abort_batch(self.opts, messages, batchId)


class RocketQBatchWriter(DataSourceArrowWriter):
    """One batch write job: exactly once across its task retries (a fresh id per job)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.job = "job-" + uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return write_task(self.opts, self.job, 0, iterator)

    def commit(self, messages: list[Any]) -> None:
        commit_batch(self.opts, messages, 0)

    def abort(self, messages: list[Any]) -> None:
        abort_batch(self.opts, messages, 0)


def _checked(options: Any, schema: StructType) -> SinkOptions:
    opts = sink_options(options)
    check_schema(schema, opts)
    _client.loop().run(ensure_commits_topic(opts))
    return opts


async def ensure_commits_topic(opts: SinkOptions) -> None:
    """Create the commits topic (one queue per master) when no broker hosts it yet, and wait
    until the nameserver routes it; an unreachable nameserver is an OptionError."""
    async with Admin(opts.nameserver, timeout_ms=_client.REQUEST_TIMEOUT_MS) as admin:
        try:
            await admin.route(opts.commits_topic)
            return
        except TopicNotFoundError:
            pass
        except RocketQError as exc:
            raise OptionError(
                f"option nameserver: {opts.nameserver} cannot be asked: {exc}"
            ) from None
        await admin.create_topic(TopicConfig(opts.commits_topic, 1, 1))
        deadline = time.monotonic() + COMMITS_TOPIC_WAIT_S
        while True:
            try:
                await admin.route(opts.commits_topic)
                return
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)  # the brokers register the new topic with the nameserver


def stream_writer(options: Any, schema: StructType) -> RocketQStreamWriter:
    return RocketQStreamWriter(_checked(options, schema))


def batch_writer(options: Any, schema: StructType) -> RocketQBatchWriter:
    return RocketQBatchWriter(_checked(options, schema))
