"""Reading RocketQ topics into Spark: the streaming reader, the batch reader and ``read()``.

One Spark partition per queue and trigger (``maxRecordsPerPartition`` splits a queue's range
into several). A partition reads its queue from a start offset up to (not including) an end
offset with plain Pull calls, filtered on the broker (TAG or SQL92), one pull always in flight,
and yields Arrow record batches cut straight from the pulled bytes (:mod:`._arrow`).
``minOffsetsPerTrigger`` / ``maxTriggerDelay`` hold a trigger back in ``latestOffset``
(:class:`~rocketq.spark.offsets.TriggerGate`).

Where a start comes from (:meth:`RocketQStreamReader.initialOffset`):

- ``earliest``: each queue's first stored offset; a JSON names offsets per queue (-2 earliest,
  -1 latest; queues it leaves out start at earliest);
- ``latest``, ``startingTimestamp``, ``startingOffsetsByTimestamp`` and JSON with -1:
  resolved once and stored as the consume offsets of the query's consumer group (option
  ``group``) on the brokers. Spark asks for the initial offset again when batch 0 is replayed
  after a crash; the stored offsets are found then and returned, so a restart cannot move the
  start. The group's offsets then follow every
  committed trigger (``commit``), which is what ``rocketq group describe`` shows; they are
  progress for people, Spark's checkpoint stays the truth for exactly-once.

Queues that appear later (a topic scaled, a broker group added) are read from their earliest
offset. A start below a queue's first stored offset (retention deleted it) fails the query
naming the queue with ``failOnDataLoss`` (the default), else is skipped with a warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rocketq.client.errors import RocketQError
from rocketq.codec import Prop
from rocketq.message import MessageQueue, ReceivedMessage, decode_records
from rocketq.spark import _arrow, _client
from rocketq.spark.offsets import (
    Offsets,
    TriggerGate,
    from_json_dict,
    split,
    spread,
    to_json_dict,
)
from rocketq.spark.options import EARLIEST, LATEST, OptionError, SourceOptions, source_options

log = logging.getLogger(__name__)

SCHEMA = (
    "topic string, brokerName string, queueId int, queueOffset bigint, msgId string, "
    "body binary, keys string, tags string, properties map<string,string>, "
    "bornTimestamp timestamp, storeTimestamp timestamp, bornHost string, reconsumeTimes int"
)
SCHEMA_TYPE = StructType(
    [
        StructField("topic", StringType()),
        StructField("brokerName", StringType()),
        StructField("queueId", IntegerType()),
        StructField("queueOffset", LongType()),
        StructField("msgId", StringType()),
        StructField("body", BinaryType()),
        StructField("keys", StringType()),
        StructField("tags", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("bornTimestamp", TimestampType()),
        StructField("storeTimestamp", TimestampType()),
        StructField("bornHost", StringType()),
        StructField("reconsumeTimes", IntegerType()),
    ]
)
"""SCHEMA as a type (no SparkSession needed to build its Arrow schema; a unit test keeps the
two the same)."""
ARROW_ROWS_MAX = 8192
"""Rows per yielded record batch (at least: pull answers are not cut)."""
ARROW_BYTES_MAX = 64 * 1024 * 1024
"""Pulled bytes per yielded record batch (binary columns have 32-bit offsets)."""
PULLS_PER_PARTITION_MAX = 10_000_000
"""A bound on the pulls of one partition (a loop guard; far beyond any real range)."""
_HIDDEN_PROPS = frozenset({Prop.TAGS, Prop.KEYS})


class DataLossError(RuntimeError):
    """Offsets a query must read are no longer stored (failOnDataLoss=true)."""


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One queue's [start, end) for one trigger; ``start`` -2 = the queue's earliest (new)."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    nameserver: str
    group: str
    expression: str
    expression_type: str
    pull_batch_size: int
    pull_timeout_ms: int
    fail_on_data_loss: bool


# ---- resolving queues and offsets (driver side) --------------------------------------------


def topics_of(opts: SourceOptions, client: _client.SparkClient) -> list[str]:
    if opts.topics:
        return list(opts.topics)
    pattern = re.compile(opts.topic_pattern)
    return sorted(t for t in client.list_topics() if pattern.fullmatch(t))


def queues_of(opts: SourceOptions, client: _client.SparkClient, strict: bool) -> list[MessageQueue]:
    """Every readable queue of the query's topics; with ``strict`` a missing topic is an
    OptionError naming it (query start), later it just has no queues yet."""
    out: list[MessageQueue] = []
    for topic in topics_of(opts, client):
        try:
            out.extend(client.queues(topic))
        except RocketQError as exc:
            if strict:
                raise OptionError(
                    f"option topic: {topic!r} cannot be read from nameserver "
                    f"{opts.nameserver}: {exc}"
                ) from None
    return out


def _connect(opts: SourceOptions) -> _client.SparkClient:
    return _client.client(opts.nameserver, opts.group)


def resolve(
    client: _client.SparkClient,
    mqs: list[MessageQueue],
    mode: str,
    given: Offsets,
    timestamp_ms: int,
    unnamed: str = "min",
) -> dict[MessageQueue, int]:
    """Offsets of ``mqs`` for a start/end ``mode``: earliest, latest, timestamp, json or
    timestamps (per queue; queues it leaves out at ``unnamed``: "min" for a start, "max" for
    an end)."""
    if not mqs:
        return {}
    if mode == "earliest":
        return dict(zip(mqs, client.offsets(mqs, "min"), strict=True))
    if mode == "latest":
        return dict(zip(mqs, client.offsets(mqs, "max"), strict=True))
    if mode == "timestamp":
        return dict(zip(mqs, client.offsets(mqs, "time", timestamp_ms), strict=True))
    if mode == "timestamps":
        stamps = from_json_dict(given)
        named = [mq for mq in mqs if mq in stamps]
        rest = [mq for mq in mqs if mq not in stamps]
        out = dict(zip(rest, client.offsets(rest, unnamed), strict=True)) if rest else {}
        for mq in named:
            [out[mq]] = client.offsets([mq], "time", stamps[mq])
        return out
    wanted = from_json_dict(given)
    mins = dict(zip(mqs, client.offsets(mqs, "min"), strict=True))
    maxs = dict(zip(mqs, client.offsets(mqs, "max"), strict=True))
    out = {}
    for mq in mqs:
        off = wanted.get(mq, EARLIEST)
        out[mq] = mins[mq] if off == EARLIEST else maxs[mq] if off == LATEST else off
    return out


# ---- read(): one queue range as Arrow record batches (executor side) -------------------------


def read_range(part: QueueRange, arrow_schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The messages of ``part``'s queue in [start, end) as record batches. One pull is always
    in flight while the last one is turned into Arrow columns (_arrow.py, the fast path)."""
    client = _client.client(part.nameserver, part.group)
    mq = MessageQueue(part.topic, part.broker, part.queue_id)
    offset = part.start
    if offset == EARLIEST:
        [offset] = client.offsets([mq], "min")
    wait_s = _client.pull_wait_s(part.pull_timeout_ms)
    batches = _Batches(part, arrow_schema)

    def start(at: int) -> Future[_client.RawPull] | None:
        if at >= part.end:
            return None
        want = min(part.pull_batch_size, part.end - at)
        return client.start_pull(
            mq, at, want, part.expression, part.expression_type, part.pull_timeout_ms
        )

    pending = start(offset)
    for _ in range(PULLS_PER_PARTITION_MAX):
        if pending is None:
            break
        res = pending.result(wait_s)
        if offset < res.min_offset:
            offset = _data_loss(part, mq, offset, res.min_offset)
            pending = start(offset)
            continue
        # nothing more is stored below the end when the next offset does not move (the range
        # was planned from the queue's max offset)
        moved = res.next_offset > offset
        offset = res.next_offset
        pending = start(offset) if moved else None
        yield from batches.add(res)
    yield from batches.flush()


class _Batches:
    """Pull answers gathered into record batches of about ARROW_ROWS_MAX rows."""

    def __init__(self, part: QueueRange, schema: pa.Schema) -> None:
        self.part, self.schema = part, schema
        self.topic_bytes = part.topic.encode()
        self.walked = _arrow.Walked()

    def add(self, res: _client.RawPull) -> Iterator[pa.RecordBatch]:
        if not res.records:
            return
        if not _arrow.walk(self.walked, res.records, self.topic_bytes, self.part.end):
            yield from self.flush()
            yield from self._general([res.records])
        elif len(self.walked) >= ARROW_ROWS_MAX or self.walked.size_bytes >= ARROW_BYTES_MAX:
            yield from self.flush()

    def flush(self) -> Iterator[pa.RecordBatch]:
        walked, self.walked = self.walked, _arrow.Walked()
        if not walked:
            return
        batch = _arrow.columns(walked, self.part.topic, self.part.broker, self.schema)
        if batch is None:
            yield from self._general(walked.parts)
        else:
            yield batch

    def _general(self, parts: list[bytes]) -> Iterator[pa.RecordBatch]:
        """Records the fast path does not cover, decoded into messages first."""
        rows = _Columns()
        for records in parts:
            for msg in decode_records(records, self.part.broker):
                if msg.queue_offset >= self.part.end:
                    break
                rows.add(msg)
        if len(rows):
            yield rows.batch(self.schema)


def _data_loss(part: QueueRange, mq: MessageQueue, offset: int, min_offset: int) -> int:
    text = (
        f"queue {mq}: offsets {offset}..{min_offset - 1} are no longer stored (deleted by "
        "retention) but the query has not read them"
    )
    if part.fail_on_data_loss:
        raise DataLossError(
            f"{text}; set failOnDataLoss=false to skip them, or start the query anew"
        )
    log.warning("%s; skipped (failOnDataLoss=false)", text)
    return min_offset


class _Columns:
    """Rows gathered column by column, then one Arrow record batch."""

    def __init__(self) -> None:
        self.cols: list[list[Any]] = [[] for _ in range(13)]

    def __len__(self) -> int:
        return len(self.cols[0])

    def add(self, m: ReceivedMessage) -> None:
        c = self.cols
        props = m.properties
        c[0].append(m.topic)
        c[1].append(m.broker_name)
        c[2].append(m.queue_id)
        c[3].append(m.queue_offset)
        c[4].append(m.msg_id)
        c[5].append(m.body)
        c[6].append(props.get(Prop.KEYS))
        c[7].append(props.get(Prop.TAGS))
        c[8].append([(k, v) for k, v in props.items() if k not in _HIDDEN_PROPS])
        c[9].append(m.born_timestamp_ms * 1000)
        c[10].append(m.store_timestamp_ms * 1000)
        c[11].append(m.born_host)
        c[12].append(m.reconsume_times)

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        arrays = [pa.array(col, type=f.type) for col, f in zip(self.cols, schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def plan(
    opts: SourceOptions,
    client: _client.SparkClient,
    begin: dict[MessageQueue, int],
    ends: dict[MessageQueue, int],
) -> list[QueueRange]:
    """The Spark partitions reading each queue from ``begin`` (missing or -2: its earliest) to
    ``ends``: one per queue, or ranges of at most maxRecordsPerPartition offsets."""
    most = opts.max_records_per_partition
    parts = []
    for mq, stop in sorted(ends.items()):
        first = begin.get(mq, EARLIEST)
        if first == EARLIEST and most:
            [first] = client.offsets([mq], "min")  # known now, so the range can be split
        if first != EARLIEST and stop <= first:
            continue
        for a, b in split(first, stop, most) if first != EARLIEST else [(first, stop)]:
            parts.append(_partition(opts, mq, a, b))
    return parts


def _partition(opts: SourceOptions, mq: MessageQueue, start: int, end: int) -> QueueRange:
    return QueueRange(
        mq.topic,
        mq.broker_name,
        mq.queue_id,
        start,
        end,
        opts.nameserver,
        opts.group,
        opts.filter_expression,
        opts.filter_type,
        opts.pull_batch_size,
        opts.pull_timeout_ms,
        opts.fail_on_data_loss,
    )


# ---- the streaming reader -------------------------------------------------------------------


class RocketQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads of RocketQ queues (see the module docstring)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.opts = options
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._available_now: dict[MessageQueue, int] | None = None
        self._shown: dict[MessageQueue, int] = {}
        self._gate = TriggerGate(options.min_offsets_per_trigger, options.max_trigger_delay_ms)
        # Fail at query start, naming the option, when the nameserver or a topic is wrong.
        queues_of(options, _connect(options), strict=True)

    def initialOffset(self) -> dict[str, Any]:
        opts, client = self.opts, _connect(self.opts)
        mqs = queues_of(opts, client, strict=True)
        if opts.starting == "earliest" or (
            opts.starting == "json" and LATEST not in from_json_dict(opts.starting_offsets).values()
        ):
            return to_json_dict(resolve(client, mqs, opts.starting, opts.starting_offsets, 0))
        stored = dict(zip(mqs, client.offsets(mqs, "group"), strict=True))
        if mqs and all(off >= 0 for off in stored.values()):
            return to_json_dict(stored)  # resolved by an earlier start of this query
        start = resolve(
            client, mqs, opts.starting, opts.starting_offsets, opts.starting_timestamp_ms
        )
        client.store_offsets(start)
        return to_json_dict(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the ends as they are now, then stop."""
        client = _connect(self.opts)
        mqs = queues_of(self.opts, client, strict=False)
        self._available_now = dict(zip(mqs, client.offsets(mqs, "max"), strict=True))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        client = _connect(self.opts)
        begin = from_json_dict(start)
        # Spark plans from ``start`` only once the batch ending there is committed; commit()
        # of the last batch may never come (Trigger.AvailableNow stops first).
        self._show_progress(begin)
        if self._available_now is not None:
            ends = dict(self._available_now)
        else:
            mqs = queues_of(self.opts, client, strict=False)
            ends = dict(zip(mqs, client.offsets(mqs, "max"), strict=True))
        for mq in [q for q in ends if q not in begin]:  # a new queue: from its earliest
            [begin[mq]] = client.offsets([mq], "min")
        ends = {mq: max(end, begin.get(mq, end)) for mq, end in ends.items()}
        for mq, off in begin.items():
            ends.setdefault(mq, off)  # a queue gone from the route keeps its offset
        max_rows = getattr(limit, "max_rows", None)
        if isinstance(limit, ReadMaxRows) and max_rows:
            backlogs = {mq: ends[mq] - begin.get(mq, ends[mq]) for mq in ends}
            take = spread(backlogs, int(max_rows))
            ends = {mq: begin.get(mq, ends[mq]) + take[mq] for mq in ends}
        if self.opts.min_offsets_per_trigger and self._available_now is None:
            new = sum(end - begin.get(mq, end) for mq, end in ends.items())
            if not self._gate.admit(new):
                return start  # no new batch yet: fewer than minOffsetsPerTrigger, not overdue
        return to_json_dict(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueueRange]:
        if start == end:
            return []
        return plan(self.opts, _connect(self.opts), from_json_dict(start), from_json_dict(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)
        return read_range(partition, self.arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed the trigger ending at ``end``: show it as the group's progress."""
        self._show_progress(from_json_dict(end))

    def _show_progress(self, offsets: dict[MessageQueue, int]) -> None:
        if not offsets or offsets == self._shown:
            return
        try:
            _connect(self.opts).store_offsets(offsets)
            self._shown = offsets
        except RocketQError as exc:  # progress for people only; never fail the query on it
            log.warning("could not store progress of group %s: %s", self.opts.group, exc)

    def stop(self) -> None:
        pass


# ---- the batch reader -----------------------------------------------------------------------


class RocketQBatchReader(DataSourceReader):
    """A bounded read: startingOffsets/startingTimestamp to endingOffsets/endingTimestamp."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.opts = options
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        client = _connect(options)
        mqs = queues_of(options, client, strict=True)
        o = options
        # Like Kafka's batch reads, a batch read starts at earliest unless told otherwise.
        given = any(k.startswith("starting") for k in o.raw)
        starting = o.starting if given else "earliest"
        self.start = resolve(client, mqs, starting, o.starting_offsets, o.starting_timestamp_ms)
        self.end = resolve(
            client, mqs, o.ending, o.ending_offsets, o.ending_timestamp_ms, unnamed="max"
        )

    def partitions(self) -> list[QueueRange]:
        ends = {mq: stop for mq, stop in self.end.items() if stop > self.start.get(mq, stop)}
        return plan(self.opts, _connect(self.opts), self.start, ends)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)
        return read_range(partition, self.arrow_schema)


def stream_reader(options: Any, schema: StructType) -> RocketQStreamReader:
    return RocketQStreamReader(source_options(options), schema)


def batch_reader(options: Any, schema: StructType) -> RocketQBatchReader:
    return RocketQBatchReader(source_options(options), schema)
