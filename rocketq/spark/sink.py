"""Writing Spark rows to RocketQ, exactly once across task retries and restarts.

How (DESIGN.md §10):

1. ``write()`` (one per task attempt, on an executor) sends every row as a *half*
   (transactional) message of the producer group ``producerGroup``, invisible to consumers.
   Each half carries three properties: ``spark.queryId`` (Spark's query id, stable across
   restarts from one checkpoint; a fresh id per batch write job), ``spark.batchId`` and
   ``spark.attempt`` (a random id of this task attempt). The task returns the halves it stored.
2. ``commit(batchId)`` (after every task succeeded) first records the decision: a message on the
   commits topic (``commitsTopic``) keyed ``<queryId>:<batchId>`` whose body lists the task
   attempts Spark committed. That message is the commit point. Then it commits the halves of
   those attempts (EndTransaction COMMIT) and rolls back every other half of this query up to
   this batch that the brokers still hold (failed or retried attempts, a replay's first run),
   found with ``Admin.half_messages``.
3. ``abort()`` rolls back the halves it is given.

A replayed batch (the driver died after step 2's record but before Spark wrote its own commit
log) is skipped: ``write()`` finds the record and sends nothing, and ``commit()`` finishes the
recorded decision (halves of recorded attempts are committed, others rolled back), so a commit
cut off half way is completed, never doubled. A batch whose record was never written is written
again by the replay; the first run's halves are rolled back by the replay's commit.

When no commit comes at all (the driver is gone for good), the broker asks a live producer of
the group about each half after ``transactionTimeout``: every sink process (tasks and commits,
kept alive with the Python worker) is one, and :class:`RecordedDecision` answers from the
commits topic: COMMIT when the half's attempt is recorded for its batch, ROLLBACK when its batch
is recorded without it, UNKNOW otherwise (asked again later; after ``transactionCheckMax``
checks the broker discards it).

Guarantee: each row of a committed micro-batch (or batch write job) becomes visible exactly once;
rows of aborted or failed attempts never. Delayed delivery cannot be combined with a half
message (the broker refuses it), so the sink has no delay columns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
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

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.errors import RocketQError, TopicNotFoundError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.client.producer.transaction import (
    LocalTransactionState,
    TransactionProducer,
)
from rocketq.message import Message, ReceivedMessage, SendResult, SendStatus
from rocketq.spark import _client
from rocketq.spark.options import OptionError, SinkOptions, sink_options

log = logging.getLogger(__name__)

PROP_QUERY = "spark.queryId"
PROP_BATCH = "spark.batchId"
PROP_ATTEMPT = "spark.attempt"
SENDS_IN_FLIGHT_MAX = 128
"""Half messages one task has in flight at once."""
ENDS_IN_FLIGHT_MAX = 128
SWEEP_ROUNDS_MAX = 20
"""Pages of pending half messages one commit looks through (1000 each)."""
HALF_PAGE_MAX = 1000
COMMITS_TOPIC_WAIT_S = 15.0
"""How long a newly created commits topic may take to show in the nameserver's routes."""
_COLUMNS = {"body", "topic", "tags", "keys", "properties"}
_RESOLUTION = {
    LocalTransactionState.COMMIT_MESSAGE: messaging_pb2.TRANSACTION_COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: messaging_pb2.TRANSACTION_ROLLBACK,
}


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """OptionError (at query start) for columns the sink cannot write."""
    names = set(schema.fieldNames())
    if "body" not in names:
        raise OptionError("the sink needs a column named body (binary or string)")
    unknown = sorted(names - _COLUMNS)
    if unknown:
        raise OptionError(
            f"the sink does not know the column(s) {', '.join(unknown)}; it writes "
            + ", ".join(sorted(_COLUMNS))
            + " (select only these; delay columns cannot be combined with exactly-once)"
        )
    if "topic" not in names and not opts.topic:
        raise OptionError("give the option topic or a column named topic")


# ---- what tasks hand to the commit ----------------------------------------------------------


@dataclass
class SinkCommit(WriterCommitMessage):
    query: str
    batch: int
    attempt: str
    skipped: bool = False
    halves: list[tuple[str | None, SendResult]] = field(default_factory=list)


# ---- the recorded decisions (commits topic) -------------------------------------------------


def record_key(query: str, batch: int) -> str:
    return f"{query}:{batch}"


def lookup(admin: Admin, topic: str, query: str, batch: int) -> set[str] | None:
    """The attempts recorded for ``batch`` of ``query``; None when it has no record."""

    async def go() -> list[ReceivedMessage]:
        try:
            return await admin.query_by_key(topic, record_key(query, batch), max_num=8)
        except TopicNotFoundError:
            return []

    found = _client.retrying(go)
    mine = [m for m in found if json.loads(m.body).get("query") == query]
    if not mine:
        return None
    first = min(mine, key=lambda m: (m.store_timestamp_ms, m.queue_offset))
    return set(json.loads(first.body)["attempts"])


class RecordedDecision:
    """The transaction listener of every sink producer: answers check-backs from the commits
    topic (see the module docstring). Local transactions are never run through it."""

    def __init__(self, admin: Admin, commits_topic: str) -> None:
        self.admin = admin
        self.commits_topic = commits_topic

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        return decide(self.admin, self.commits_topic, message.properties)


def decide(admin: Admin, commits_topic: str, props: dict[str, str]) -> LocalTransactionState:
    query, batch, attempt = props.get(PROP_QUERY), props.get(PROP_BATCH), props.get(PROP_ATTEMPT)
    if not query or batch is None or not attempt:
        return LocalTransactionState.UNKNOW
    recorded = lookup(admin, commits_topic, query, int(batch))
    if recorded is None:
        return LocalTransactionState.UNKNOW
    if attempt in recorded:
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


def _messages(batch: pa.RecordBatch, opts: SinkOptions, props: dict[str, str]) -> list[Message]:
    cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    out = []
    for i in range(batch.num_rows):
        body = cols["body"][i]
        if body is None:
            raise ValueError("a row has a null body; the sink sends only rows with a body")
        user = dict(cols["properties"][i] or []) if "properties" in cols else {}
        out.append(
            Message(
                topic=(cols["topic"][i] if "topic" in cols else None) or opts.topic,
                body=body.encode() if isinstance(body, str) else bytes(body),
                tags=(cols["tags"][i] if "tags" in cols else None) or "",
                keys=(cols["keys"][i] if "keys" in cols else None) or (),
                properties={**user, **props},
            )
        )
    return out


def write_task(
    opts: SinkOptions, query: str, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> SinkCommit:
    """One task attempt: every row as a half message (none when the batch is recorded)."""
    attempt = uuid.uuid4().hex
    p, admin = producer(opts)
    if lookup(admin, opts.commits_topic, query, batch_id) is not None:
        log.info("batch %d of query %s is already committed: a replay, skipped", batch_id, query)
        return SinkCommit(query, batch_id, attempt, skipped=True)
    props = {PROP_QUERY: query, PROP_BATCH: str(batch_id), PROP_ATTEMPT: attempt}
    loop = _client.loop()
    halves: list[tuple[str | None, SendResult]] = []
    for batch in batches:
        msgs = _messages(batch, opts, props)
        for i in range(0, len(msgs), SENDS_IN_FLIGHT_MAX):
            chunk = msgs[i : i + SENDS_IN_FLIGHT_MAX]
            results = loop.run(_send_halves(p, chunk))
            for half, addr in results:
                if half.status is not SendStatus.SEND_OK:
                    raise RuntimeError(
                        f"half message {half.msg_id} was stored with {half.status.value}; "
                        "the task fails so Spark retries it (the half is rolled back)"
                    )
                halves.append((addr, half))
    return SinkCommit(query, batch_id, attempt, halves=halves)


async def _send_halves(
    p: TransactionProducer, msgs: list[Message]
) -> list[tuple[SendResult, str | None]]:
    return list(await asyncio.gather(*(p.send_half(m) for m in msgs)))


# ---- commit / abort (driver side) -----------------------------------------------------------


def commit_batch(opts: SinkOptions, messages: list[Any], batch_id: int) -> None:
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    if not commits:
        return
    query = commits[0].query
    p, admin = producer(opts)
    recorded = lookup(admin, opts.commits_topic, query, batch_id)
    if recorded is None:
        recorded = {c.attempt for c in commits if not c.skipped}
        body = json.dumps({"query": query, "batch": batch_id, "attempts": sorted(recorded)})
        _client.loop().run(_record(p, opts.commits_topic, record_key(query, batch_id), body))
    ends = [(addr, half, c.attempt in recorded) for c in commits for addr, half in c.halves]
    _client.loop().run(_end_all(p, ends))
    sweep(p, admin, opts, query, batch_id)


async def _record(p: TransactionProducer, topic: str, key: str, body: str) -> None:
    """The commit point: a plain message (not a half) on the commits topic, stored SEND_OK."""
    plain = _plain.get(p.config.group)
    if plain is None:
        plain = Producer(
            ProducerConfig(
                group=p.config.group + "-records",
                namesrv_addrs=p.config.namesrv_addrs,
                instance_name=f"spark-record-{uuid.uuid4().hex[:12]}",
            )
        )
        await plain.start()
        _plain[p.config.group] = plain
    result = await plain.send(Message(topic=topic, body=body.encode(), keys=key))
    if result.status is not SendStatus.SEND_OK:
        raise RuntimeError(f"the commit record {key} was stored with {result.status.value}")


_plain: dict[str, Producer] = {}
"""The process's producer of commit records, by sink producer group (used on the loop)."""


async def _end_all(p: TransactionProducer, ends: list[tuple[str | None, SendResult, bool]]) -> None:
    for i in range(0, len(ends), ENDS_IN_FLIGHT_MAX):
        await asyncio.gather(
            *(
                p.end_transaction(
                    addr,
                    half,
                    LocalTransactionState.COMMIT_MESSAGE
                    if ok
                    else LocalTransactionState.ROLLBACK_MESSAGE,
                )
                for addr, half, ok in ends[i : i + ENDS_IN_FLIGHT_MAX]
            )
        )


def sweep(
    p: TransactionProducer, admin: Admin, opts: SinkOptions, query: str, batch_id: int
) -> int:
    """End every half of ``query`` up to ``batch_id`` still pending on the brokers, as the
    records decide (batches without a record are rolled back: Spark moved past them). Returns
    how many were ended."""
    loop = _client.loop()
    masters = _client.retrying(admin.cluster_info).masters()
    decided: dict[int, set[str] | None] = {}
    ended = 0
    for _ in range(SWEEP_ROUNDS_MAX):
        page = _client.retrying(lambda: admin.half_messages(max_num=HALF_PAGE_MAX))
        mine = [
            h
            for h in page.messages
            if h.producer_group == opts.producer_group
            and h.message.properties.get(PROP_QUERY) == query
            and int(h.message.properties.get(PROP_BATCH, "-1")) <= batch_id
        ]
        if not mine:
            return ended
        reqs = []
        for h in mine:
            b = int(h.message.properties[PROP_BATCH])
            if b not in decided:
                decided[b] = lookup(admin, opts.commits_topic, query, b)
            attempts = decided[b] or set()
            ok = h.message.properties.get(PROP_ATTEMPT) in attempts
            state = (
                LocalTransactionState.COMMIT_MESSAGE
                if ok
                else LocalTransactionState.ROLLBACK_MESSAGE
            )
            reqs.append((masters.get(h.broker_name), _end_request(opts, h, state)))
        loop.run(_send_ends(p, reqs))
        ended += len(reqs)
        if len(page.messages) < HALF_PAGE_MAX:
            return ended
    return ended


def _end_request(
    opts: SinkOptions, h: Any, state: LocalTransactionState
) -> messaging_pb2.EndTransactionRequest:
    return messaging_pb2.EndTransactionRequest(
        producer_group=opts.producer_group,
        commitlog_offset=h.commitlog_offset,
        queue_offset=h.queue_offset,
        msg_id=h.transaction_id,
        transaction_id=h.transaction_id,
        resolution=_RESOLUTION[state],
        from_transaction_check=True,
    )


async def _send_ends(
    p: TransactionProducer, reqs: list[tuple[str | None, messaging_pb2.EndTransactionRequest]]
) -> None:
    async def one(addr: str | None, req: messaging_pb2.EndTransactionRequest) -> None:
        if addr is None:
            return
        try:
            await p.instance.messaging(addr).EndTransaction(req, timeout=5)
        except Exception as exc:  # the broker's check-back decides it later
            log.warning("ending half %s at %s failed: %s", req.transaction_id, addr, exc)

    await asyncio.gather(*(one(a, r) for a, r in reqs))


def abort_batch(opts: SinkOptions, messages: list[Any], batch_id: int) -> None:
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    if not commits:
        return
    p, admin = producer(opts)
    recorded = lookup(admin, opts.commits_topic, commits[0].query, batch_id) or set()
    ends = [(addr, half, c.attempt in recorded) for c in commits for addr, half in c.halves]
    _client.loop().run(_end_all(p, ends))


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
