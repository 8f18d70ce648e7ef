"""Spans and counters of the message path on the server side: the broker's Send and Pull, and
the later hops of a message (retry, dead letter, delayed delivery, transaction check).

Each hook is one line in its service's file and tests :mod:`.state` first: with telemetry off
it is a plain call. With it on, the work is per request, never per message, except reading the
trace context of at most ``LINKS_MAX + 1`` messages of a traced batch.

Spans (their parent is the trace context the message carries, ``TRACE_CONTEXT``, so they join
the producer's trace; a span is recorded when the producer's trace was sampled):

| span                  | where                        | kind     |
|-----------------------|------------------------------|----------|
| ``store <topic>``     | broker Send                  | SERVER   |
| ``retry <group>``     | broker ConsumerSendBack      | INTERNAL |
| ``dead letter <group>`` | broker ConsumerSendBack to %DLQ% | INTERNAL |
| ``check <topic>``, ``discard <topic>`` | broker transaction check service | INTERNAL |
| ``deliver <topic>``   | timer wheel re-put of a due delayed message | PRODUCER |

Counters (RocketMQ 5's broker metric names; labels after the OpenTelemetry messaging
conventions): ``rocketmq.messages.in`` / ``rocketmq.throughput.in`` per topic (Send),
``rocketmq.messages.out`` / ``rocketmq.throughput.out`` per topic and group (Pull),
``rocketmq.send_back.messages`` per group and outcome (retry or DLQ).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.internal import TRACE_CONTEXT, trace_context_of
from services.common.telemetry import state
from services.common.telemetry.fast import CounterTable

LINKS_MAX = 32
"""Most links a batch's store span carries to other trace contexts in the batch."""
MESSAGING_SYSTEM = "rocketmq"

_TRACER = trace.get_tracer("rocketq.server")
R = TypeVar("R")


class _Counters:
    """The message-path totals, made on first use (after setup installed the provider)."""

    def __init__(self) -> None:
        system = {"messaging.system": MESSAGING_SYSTEM}
        self.sent = CounterTable(
            ("messaging.destination.name",),
            [("rocketmq.messages.in", "{message}", "Messages stored by Send"),
             ("rocketmq.throughput.in", "By", "Send request bytes received")],
            constant=system,
        )  # fmt: skip
        self.pulled = CounterTable(
            ("messaging.destination.name", "messaging.consumer.group.name"),
            [("rocketmq.messages.out", "{message}", "Messages returned by Pull"),
             ("rocketmq.throughput.out", "By", "Record bytes returned by Pull")],
            constant=system,
        )  # fmt: skip
        self.sent_back = CounterTable(
            ("messaging.consumer.group.name", "rocketq.send_back.outcome"),
            [("rocketmq.send_back.messages", "{message}", "Messages consumers sent back")],
            constant=system,
        )


_counters: _Counters | None = None


def counters() -> _Counters:
    global _counters
    if _counters is None:
        _counters = _Counters()
    return _counters


# ---- broker Send / Pull ------------------------------------------------------------------------


async def send(fn: Callable[[Any, str], Awaitable[R]], request: Any, peer: str) -> R:
    """Run the broker's Send ``fn(request, peer)`` inside a ``store`` span; count what it stored."""
    if not (state.TRACING or state.METRICS):
        return await fn(request, peer)
    msgs = request.messages
    topic = msgs[0].topic if msgs else _records_topic(request.records)
    # An encoded batch (SendRequest.records) gets no store span: its trace context is in the
    # records' properties, which the consumer's process span reads; parsing them here for a
    # span would cost the per-message work that format exists to save.
    if state.TRACING and msgs and _worth_a_span(msgs[0].properties):
        parent, links = _parent_and_links(msgs)
        attrs = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.name": "store",
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(request.queue_id),
            "messaging.batch.message_count": len(msgs),
        }
        with _TRACER.start_as_current_span(
            f"store {topic}", context=parent, kind=SpanKind.SERVER, links=links, attributes=attrs
        ) as span:
            response: Any = await fn(request, peer)
            if len(response.results) == 1:
                span.set_attribute("messaging.message.id", response.results[0].msg_id)
    else:
        response = await fn(request, peer)
    if state.METRICS:
        stored = len(response.results) or len(response.batch.physical_offsets)
        counters().sent.add((topic,), stored, request.ByteSize())
    return response  # type: ignore[no-any-return]


def _records_topic(records: bytes) -> str:
    """The topic of an encoded batch (every record names the first one's, or it is refused)."""
    if not records:
        return ""
    try:
        return codec.record_topic(records)
    except codec.CorruptRecord:
        return ""


FOUND = messaging_pb2.FOUND


async def pull(fn: Callable[[Any, Any], Awaitable[R]], request: Any, context: Any) -> R:
    """Run the broker's Pull ``fn(request, context)``; count the messages and bytes it returned.

    Messages are counted as the offsets the pull advanced over (a filtered pull skips some of
    them), so no record is parsed for the count."""
    response: Any = await fn(request, context)
    if state.METRICS and response.status == FOUND:
        n = len(response.messages) or max(0, response.next_begin_offset - request.queue_offset)
        size = len(response.records) or response.ByteSize()
        counters().pulled.add((request.topic, request.consumer_group), n, size)
    return response  # type: ignore[no-any-return]


# ---- later hops of a message ---------------------------------------------------------------------


@contextlib.contextmanager
def send_back(dead_letter: bool, group: str, props: Mapping[str, str]) -> Iterator[None]:
    """Around re-storing a message a consumer gave back: a ``retry`` or ``dead letter`` span in
    the message's trace, and the send-back counter (counted once it is stored)."""
    if not state.TRACING:
        yield
        _count_send_back(dead_letter, group)
        return
    name = f"{'dead letter' if dead_letter else 'retry'} {group}"
    attrs = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.consumer.group.name": group,
        "messaging.message.id": props.get("UNIQ_KEY", ""),
    }
    with _TRACER.start_as_current_span(name, context=_context(props), attributes=attrs):
        yield
    _count_send_back(dead_letter, group)


def _count_send_back(dead_letter: bool, group: str) -> None:
    if state.METRICS:
        counters().sent_back.add((group, "dlq" if dead_letter else "retry"), 1)


def mark(
    name: str,
    props: Mapping[str, str],
    kind: SpanKind = SpanKind.INTERNAL,
    attrs: Mapping[str, str | int] | None = None,
) -> None:
    """An instant span ``name`` in the trace ``props`` carries (a transaction check or discard,
    a timer delivery); nothing when the message carries no context or tracing is off."""
    if not state.TRACING or TRACE_CONTEXT not in props:
        return
    span = _TRACER.start_span(
        name,
        context=_context(props),
        kind=kind,
        attributes={"messaging.system": MESSAGING_SYSTEM, **(attrs or {})},
    )
    span.end()


TRACEPARENT_CHARS = 55
"""Length of a version-00 W3C traceparent: ``00-`` 32 hex ``-`` 16 hex ``-`` 2 hex."""


def _worth_a_span(props: Mapping[str, str]) -> bool:
    """False for a message whose trace context says "not sampled": the broker samples
    parent-based, so its store span would not be recorded; deciding it from the flags byte
    skips parsing the context and making a span nobody sees (at 1 % sampling, 99 sends in
    100). A message without a context gets a span (a new trace, at traceSampleRatio)."""
    value = props.get(TRACE_CONTEXT) if TRACE_CONTEXT in props else None
    if value is None or len(value) != TRACEPARENT_CHARS:
        return True
    try:
        return bool(int(value[-2:], 16) & 0x01)
    except ValueError:
        return True


def _context(props: Mapping[str, str]) -> Context | None:
    return trace_context_of(props)  # type: ignore[arg-type]


def _parent_and_links(msgs: Any) -> tuple[Context | None, list[Link]]:
    """The first message's context as the parent; links to the other distinct contexts among
    the first ``LINKS_MAX + 1`` messages."""
    parent: Context | None = None
    seen: set[str] = set()
    links: list[Link] = []
    for m in msgs[: LINKS_MAX + 1]:
        props = m.properties
        value = props.get(TRACE_CONTEXT) if TRACE_CONTEXT in props else None
        if not value or value in seen:
            continue
        seen.add(value)
        ctx = trace_context_of(props)
        if ctx is None:
            continue
        if parent is None:
            parent = ctx
        else:
            links.append(Link(trace.get_current_span(ctx).get_span_context()))
    return parent, links
