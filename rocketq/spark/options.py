"""The options of the ``rocketq`` data source, checked when a query starts.

Names follow Spark's Kafka source where one exists (``startingOffsets``, ``endingOffsets``,
``maxOffsetsPerTrigger``, ``failOnDataLoss``, ...). Spark hands options over case-insensitively
(lower-cased keys), so they are matched without case. Every problem is an
:class:`OptionError` naming the option and saying what would be accepted.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from rocketq.sql92 import compile_sql92
from rocketq.validation import check_group, check_topic

EARLIEST = -2
"""In an offsets JSON, as in Kafka's: the queue's first stored offset."""
LATEST = -1
"""In an offsets JSON: the queue's end (the next offset to be stored)."""

PULL_BATCH_SIZE_DEFAULT = 1024
PULL_TIMEOUT_MS_DEFAULT = 10_000
MAX_OFFSETS_PER_TRIGGER_MAX = 10**12

_SOURCE_OPTIONS = {
    "nameserver",
    "topic",
    "topicpattern",
    "filter",
    "filtertype",
    "startingoffsets",
    "startingtimestamp",
    "endingoffsets",
    "endingtimestamp",
    "maxoffsetspertrigger",
    "failondataloss",
    "pullbatchsize",
    "pulltimeoutms",
    "group",
    "path",
}
_SINK_OPTIONS = {
    "nameserver",
    "topic",
    "producergroup",
    "commitstopic",
    "checkpointlocation",
    "path",
}


class OptionError(ValueError):
    """A bad ``rocketq`` data source option; the message names it."""


Offsets = dict[str, dict[str, dict[str, int]]]
"""{topic: {brokerName: {queueId (as a string): offset}}}, as in the offsets JSON."""


@dataclass(frozen=True)
class SourceOptions:
    nameserver: str
    topics: tuple[str, ...]
    topic_pattern: str
    filter_expression: str
    filter_type: str
    starting: str
    """"earliest", "latest", "json" or "timestamp"."""
    starting_offsets: Offsets
    starting_timestamp_ms: int
    ending: str
    """"latest", "json" or "timestamp" (batch reads)."""
    ending_offsets: Offsets
    ending_timestamp_ms: int
    max_offsets_per_trigger: int
    """0 = no limit."""
    fail_on_data_loss: bool
    pull_batch_size: int
    pull_timeout_ms: int
    group: str
    raw: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkOptions:
    nameserver: str
    topic: str
    """Default topic for rows without a ``topic`` column ("" = every row must name one)."""
    producer_group: str
    commits_topic: str


def _lower(options: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _unknown(opts: dict[str, str], known: set[str], what: str) -> None:
    for name in sorted(opts):
        if name not in known:
            raise OptionError(
                f"unknown option {name!r} for the rocketq {what}; known options: "
                + ", ".join(sorted(known - {"path"}))
            )


def _int(opts: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise OptionError(f"option {name} must be {low}..{high}, got {value}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None:
        return default
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise OptionError(f"option {name} must be true or false, got {text!r}")


def _nameserver(opts: dict[str, str]) -> str:
    ns = opts.get("nameserver", "").strip()
    if not ns:
        raise OptionError(
            'option nameserver is required, e.g. .option("nameserver", "127.0.0.1:9876")'
        )
    for addr in re.split(r"[;,]", ns):
        host, sep, port = addr.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OptionError(f"option nameserver: {addr!r} is not host:port")
    return ns


def parse_offsets_json(name: str, text: str, topics: tuple[str, ...]) -> Offsets:
    """An offsets JSON {topic: {brokerName: {queueId: offset}}}; -2 earliest, -1 latest."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {name} is not valid JSON ({exc.msg} at {exc.pos}): {text!r}"
        ) from None
    shape = f'option {name} must look like {{"topic": {{"broker-a": {{"0": 42}}}}}}'
    if not isinstance(data, dict):
        raise OptionError(f"{shape}, got {text!r}")
    out: Offsets = {}
    for topic, brokers in data.items():
        if topics and topic not in topics:
            raise OptionError(f"option {name} names topic {topic!r}, which the query does not read")
        if not isinstance(brokers, dict):
            raise OptionError(f"{shape}; topic {topic!r} maps to {brokers!r}")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise OptionError(f"{shape}; broker {broker!r} maps to {queues!r}")
            for qid, off in queues.items():
                if not str(qid).isdigit() or not isinstance(off, int) or off < EARLIEST:
                    raise OptionError(
                        f"{shape}; {topic}/{broker}: queue {qid!r} -> {off!r} is not "
                        "queueId -> offset (-2 earliest, -1 latest)"
                    )
                out.setdefault(topic, {}).setdefault(broker, {})[str(int(qid))] = off
    return out


def _start(opts: dict[str, str], topics: tuple[str, ...]) -> tuple[str, Offsets, int]:
    ts = opts.get("startingtimestamp")
    so = opts.get("startingoffsets")
    if ts is not None and so is not None:
        raise OptionError("give startingOffsets or startingTimestamp, not both")
    if ts is not None:
        return "timestamp", {}, _int(opts, "startingTimestamp", 0, 0, 2**62)
    text = (so or "latest").strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower(), {}, 0
    return "json", parse_offsets_json("startingOffsets", text, topics), 0


def _end(opts: dict[str, str], topics: tuple[str, ...]) -> tuple[str, Offsets, int]:
    ts = opts.get("endingtimestamp")
    eo = opts.get("endingoffsets")
    if ts is not None and eo is not None:
        raise OptionError("give endingOffsets or endingTimestamp, not both")
    if ts is not None:
        return "timestamp", {}, _int(opts, "endingTimestamp", 0, 0, 2**62)
    text = (eo or "latest").strip()
    if text.lower() == "latest":
        return "latest", {}, 0
    if text.lower() == "earliest":
        raise OptionError("option endingOffsets cannot be earliest; use latest or a JSON")
    return "json", parse_offsets_json("endingOffsets", text, topics), 0


def source_options(options: Any) -> SourceOptions:
    """Checked source options (OptionError naming the first bad one)."""
    opts = _lower(options)
    _unknown(opts, _SOURCE_OPTIONS, "source")
    ns = _nameserver(opts)
    topic_text, pattern = opts.get("topic", "").strip(), opts.get("topicpattern", "").strip()
    if bool(topic_text) == bool(pattern):
        raise OptionError(
            "give exactly one of the options topic (one or a comma list) and topicPattern"
        )
    topics: tuple[str, ...] = ()
    if topic_text:
        topics = tuple(t.strip() for t in topic_text.split(",") if t.strip())
        for t in topics:
            try:
                check_topic(t)
            except ValueError as exc:
                raise OptionError(f"option topic: {exc}") from None
    else:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option topicPattern is not a regular expression: {exc}") from None
    expression = opts.get("filter", "*").strip() or "*"
    ftype = opts.get("filtertype", "").strip().upper()
    if not ftype:
        ftype = (
            "TAG" if re.fullmatch(r"[^\s=<>()']+(\s*\|\|\s*[^\s=<>()']+)*", expression) else "SQL92"
        )
    if ftype not in ("TAG", "SQL92"):
        raise OptionError(f"option filterType must be TAG or SQL92, got {ftype!r}")
    _check_filter(expression, ftype)
    starting, start_offsets, start_ts = _start(opts, topics)
    ending, end_offsets, end_ts = _end(opts, topics)
    group = opts.get("group", "").strip() or default_group(opts)
    try:
        check_group(group)
    except ValueError as exc:
        raise OptionError(f"option group: {exc}") from None
    return SourceOptions(
        nameserver=ns,
        topics=topics,
        topic_pattern=pattern,
        filter_expression=expression,
        filter_type=ftype,
        starting=starting,
        starting_offsets=start_offsets,
        starting_timestamp_ms=start_ts,
        ending=ending,
        ending_offsets=end_offsets,
        ending_timestamp_ms=end_ts,
        max_offsets_per_trigger=_int(
            opts, "maxOffsetsPerTrigger", 0, 1, MAX_OFFSETS_PER_TRIGGER_MAX
        ),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        pull_batch_size=_int(opts, "pullBatchSize", PULL_BATCH_SIZE_DEFAULT, 1, 1024),
        pull_timeout_ms=_int(opts, "pullTimeoutMs", PULL_TIMEOUT_MS_DEFAULT, 100, 600_000),
        group=group,
        raw=opts,
    )


def _check_filter(expression: str, ftype: str) -> None:
    if ftype == "SQL92":
        try:
            compile_sql92(expression)
        except ValueError as exc:
            raise OptionError(f"option filter (SQL92): {exc}") from None
    elif expression != "*" and not [t for t in expression.split("||") if t.strip()]:
        raise OptionError(f"option filter names no tag: {expression!r}; use '*' or 'TagA || TagB'")


def default_group(opts: dict[str, str]) -> str:
    """The consumer group progress is stored under when no ``group`` option is given: derived
    from what identifies the query's input (the reader never sees Spark's query id)."""
    ident = json.dumps(
        {
            k: opts.get(k, "")
            for k in (
                "nameserver",
                "topic",
                "topicpattern",
                "filter",
                "startingoffsets",
                "startingtimestamp",
            )
        },
        sort_keys=True,
    )
    return "spark-rocketq-" + hashlib.sha256(ident.encode()).hexdigest()[:16]


def sink_options(options: Any) -> SinkOptions:
    """Checked sink options (OptionError naming the first bad one)."""
    opts = _lower(options)
    _unknown(opts, _SINK_OPTIONS, "sink")
    ns = _nameserver(opts)
    topic = opts.get("topic", "").strip()
    if topic:
        try:
            check_topic(topic)
        except ValueError as exc:
            raise OptionError(f"option topic: {exc}") from None
    group = opts.get("producergroup", "").strip() or "spark-rocketq-sink"
    commits = opts.get("commitstopic", "").strip() or COMMITS_TOPIC_DEFAULT
    for name, value, check in (
        ("producerGroup", group, check_group),
        ("commitsTopic", commits, check_topic),
    ):
        try:
            check(value)
        except ValueError as exc:
            raise OptionError(f"option {name}: {exc}") from None
    return SinkOptions(ns, topic, group, commits)


COMMITS_TOPIC_DEFAULT = "spark_rocketq_sink_commits"
"""Where the sink records each committed micro-batch (see rocketq.spark.sink)."""
