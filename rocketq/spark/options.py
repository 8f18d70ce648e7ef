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
MAX_TRIGGER_DELAY_DEFAULT_MS = 15 * 60 * 1000
"""Kafka's default ``maxTriggerDelay`` (15m)."""
MAX_TRIGGER_DELAY_MAX_MS = 7 * 24 * 3600 * 1000
TIMESTAMP_MAX_MS = 2**62
_DURATION_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}

_SOURCE_OPTIONS = {
    "nameserver",
    "topic",
    "topicpattern",
    "filter",
    "filtertype",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "endingoffsets",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "maxrecordsperpartition",
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
    """"earliest", "latest", "json", "timestamp" or "timestamps" (per queue)."""
    starting_offsets: Offsets
    """The offsets JSON ("json") or the per-queue timestamps in ms ("timestamps")."""
    starting_timestamp_ms: int
    ending: str
    """"latest", "json", "timestamp" or "timestamps" (batch reads)."""
    ending_offsets: Offsets
    ending_timestamp_ms: int
    max_offsets_per_trigger: int
    """0 = no limit."""
    fail_on_data_loss: bool
    pull_batch_size: int
    pull_timeout_ms: int
    group: str
    min_offsets_per_trigger: int = 0
    """0 = a trigger runs whatever is available; else it waits for this many new offsets..."""
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_DEFAULT_MS
    """... or at most this long since the last trigger that ran."""
    max_records_per_partition: int = 0
    """0 = one Spark partition per queue and trigger; else ranges are split to at most this."""
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


def parse_offsets_json(
    name: str, text: str, topics: tuple[str, ...], timestamps: bool = False
) -> Offsets:
    """An offsets JSON {topic: {brokerName: {queueId: offset}}}; -2 earliest, -1 latest. With
    ``timestamps`` the values are store timestamps in ms (Kafka's ``*OffsetsByTimestamp``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {name} is not valid JSON ({exc.msg} at {exc.pos}): {text!r}"
        ) from None
    example = 1700000000000 if timestamps else 42
    shape = f'option {name} must look like {{"topic": {{"broker-a": {{"0": {example}}}}}}}'
    low, what = (
        (0, "timestamp in ms") if timestamps else (EARLIEST, "offset (-2 earliest, -1 latest)")
    )
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
                if (
                    not str(qid).isdigit()
                    or not isinstance(off, int)
                    or isinstance(off, bool)
                    or not low <= off <= TIMESTAMP_MAX_MS
                ):
                    raise OptionError(
                        f"{shape}; {topic}/{broker}: queue {qid!r} -> {off!r} is not "
                        f"queueId -> {what}"
                    )
                out.setdefault(topic, {}).setdefault(broker, {})[str(int(qid))] = off
    return out


def _bound(
    opts: dict[str, str], side: str, topics: tuple[str, ...], default: str
) -> tuple[str, Offsets, int]:
    """The start (``side`` "starting") or end ("ending") of a read: (mode, offsets or per-queue
    timestamps, timestamp); at most one of the side's three options may be given."""
    names = [f"{side}Offsets", f"{side}Timestamp", f"{side}OffsetsByTimestamp"]
    given = [n for n in names if n.lower() in opts]
    if len(given) > 1:
        raise OptionError(
            f"give only one of the options {', '.join(names)}; got {' and '.join(given)}"
        )
    if names[1].lower() in opts:
        return "timestamp", {}, _int(opts, names[1], 0, 0, TIMESTAMP_MAX_MS)
    if names[2].lower() in opts:
        by_ts = parse_offsets_json(names[2], opts[names[2].lower()], topics, timestamps=True)
        return "timestamps", by_ts, 0
    text = opts.get(names[0].lower(), default).strip()
    if text.lower() in ("earliest", "latest"):
        if side == "ending" and text.lower() == "earliest":
            raise OptionError("option endingOffsets cannot be earliest; use latest or a JSON")
        return text.lower(), {}, 0
    return "json", parse_offsets_json(names[0], text, topics), 0


def duration_ms(name: str, text: str, low_ms: int, high_ms: int) -> int:
    """A duration like Spark's time strings: "500ms", "30s", "15m", "2h", "1d" (a bare number
    is milliseconds)."""
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    unit = (found.group(2) or "ms") if found else ""
    if not found or unit not in _DURATION_UNITS_MS:
        raise OptionError(
            f"option {name} must be a duration like 500ms, 30s, 15m, 2h or 1d, got {text!r}"
        )
    value_ms = int(found.group(1)) * _DURATION_UNITS_MS[unit]
    if not low_ms <= value_ms <= high_ms:
        raise OptionError(f"option {name} must be {low_ms} ms..{high_ms} ms, got {text!r}")
    return value_ms


def _trigger_limits(opts: dict[str, str]) -> tuple[int, int, int]:
    """(maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay in ms), checked together."""
    most = _int(opts, "maxOffsetsPerTrigger", 0, 1, MAX_OFFSETS_PER_TRIGGER_MAX)
    least = _int(opts, "minOffsetsPerTrigger", 0, 1, MAX_OFFSETS_PER_TRIGGER_MAX)
    delay_ms = MAX_TRIGGER_DELAY_DEFAULT_MS
    if "maxtriggerdelay" in opts:
        if not least:
            raise OptionError(
                "option maxTriggerDelay only applies with minOffsetsPerTrigger; give both"
            )
        delay_ms = duration_ms(
            "maxTriggerDelay", opts["maxtriggerdelay"], 0, MAX_TRIGGER_DELAY_MAX_MS
        )
    if most and least > most:
        raise OptionError(
            f"option minOffsetsPerTrigger ({least}) must not exceed maxOffsetsPerTrigger ({most})"
        )
    return most, least, delay_ms


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
    starting, start_offsets, start_ts = _bound(opts, "starting", topics, "latest")
    ending, end_offsets, end_ts = _bound(opts, "ending", topics, "latest")
    most, least, delay_ms = _trigger_limits(opts)
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
        max_offsets_per_trigger=most,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        pull_batch_size=_int(opts, "pullBatchSize", PULL_BATCH_SIZE_DEFAULT, 1, 1024),
        pull_timeout_ms=_int(opts, "pullTimeoutMs", PULL_TIMEOUT_MS_DEFAULT, 100, 600_000),
        group=group,
        min_offsets_per_trigger=least,
        max_trigger_delay_ms=delay_ms,
        max_records_per_partition=_int(
            opts, "maxRecordsPerPartition", 0, 1, MAX_OFFSETS_PER_TRIGGER_MAX
        ),
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
    keys = ["nameserver", "topic", "topicpattern", "filter", "startingoffsets", "startingtimestamp"]
    # Added later: only when given, so the group of a query that does not use it stays the same.
    keys += [k for k in ("startingoffsetsbytimestamp",) if k in opts]
    ident = json.dumps({k: opts.get(k, "") for k in keys}, sort_keys=True)
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
