"""OpenTelemetry spans of the SDK: a producer's send, a consumer's process, a transaction check.

**Trace context in a message.** A send span's W3C trace context travels in two message
properties, so the broker's store span, a consumer's process span and every later hop of the
message (retry, dead letter, delay, transaction check) join the producer's trace:

| property        | value                                                            |
|-----------------|------------------------------------------------------------------|
| ``TRACE_CONTEXT`` | the W3C ``traceparent`` header value, ``00-<trace id>-<span id>-<flags>`` |
| ``TRACE_STATE``   | the W3C ``tracestate`` value, only when it is not empty          |

``TRACE_CONTEXT`` is RocketMQ's own property name for a message's trace context (RocketMQ 5's
gateway maps the gRPC ``trace_context`` system property to it), so the same property carries
it whichever SDK sent the message. Every message of one send carries its send span's context:
one context per request, never one span per message.

**Who records.** The SDK uses the OpenTelemetry *API* only; the application installs an SDK
``TracerProvider`` (and its sampler and exporter). Without one, every hook here is a no-op that
costs one check of the global provider per send or listener call. An unsampled send still
carries its context (flags ``00``), so broker and consumer follow the producer's decision.

Spans follow the OpenTelemetry messaging conventions: ``send <topic>`` (kind PRODUCER) around a
whole send with its retries, ``process <topic>`` (kind CONSUMER) around one listener call, its
parent the messages' context when they share one and links to the others.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rocketq.codec import Prop
from rocketq.message import MessageQueue

TRACE_CONTEXT = Prop.TRACE_CONTEXT
"""Property holding the W3C ``traceparent`` value."""
TRACE_STATE = "TRACE_STATE"
"""Property holding the W3C ``tracestate`` value (absent when empty)."""
LINKS_MAX = 32
"""Most links a batch span carries to the other contexts of its messages."""
MESSAGING_SYSTEM = "rocketmq"
"""``messaging.system``: the semantic conventions' value for RocketMQ (RocketQ speaks it)."""

_HEADER_TO_PROPERTY = {"traceparent": TRACE_CONTEXT, "tracestate": TRACE_STATE}
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = trace.get_tracer("rocketq.client")
_NOT_RECORDING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_SendFn = TypeVar("_SendFn", bound=Callable[..., Awaitable[Any]])


class _Prepared(Protocol):
    """A prepared message (rocketq.client.producer._sender.PreparedMessage)."""

    topic: str

    def add_properties(self, extra: Mapping[str, str]) -> None: ...


class _Getter(Getter[dict[str, str]]):
    """Reads the W3C headers out of a message's properties."""

    def get(self, carrier: dict[str, str], key: str) -> list[str] | None:
        value = carrier.get(_HEADER_TO_PROPERTY.get(key, key))
        return [value] if value else None

    def keys(self, carrier: dict[str, str]) -> list[str]:
        return list(_HEADER_TO_PROPERTY)


_GETTER = _Getter()


# ``trace.get_tracer_provider()`` tests ``os.environ`` for OTEL_PYTHON_TRACER_PROVIDER on every
# call while no provider is set: 1-5 us, once or twice per send and per listener call, about
# 15 % of the consume path with tracing off. The global is read instead and the answer kept per
# provider object, so a provider set (or, as tests do, reset) later in the process is seen at
# the next call. When the environment names a provider at import, or a future API drops the
# global, the public call is kept: OpenTelemetry loads that provider lazily on it.
_UNSET = object()
_FAST = OTEL_PYTHON_TRACER_PROVIDER not in os.environ and hasattr(trace, "_TRACER_PROVIDER")
_seen: tuple[object, bool] = (_UNSET, False)


def enabled() -> bool:
    """True once the application installed an SDK tracer provider."""
    global _seen  # one cached answer per process, replaced with the provider
    if not _FAST:
        return not isinstance(trace.get_tracer_provider(), _NOT_RECORDING)
    provider = trace._TRACER_PROVIDER
    seen_provider, answer = _seen
    if provider is seen_provider:
        return answer
    answer = provider is not None and not isinstance(provider, _NOT_RECORDING)
    _seen = (provider, answer)
    return answer


def context_of(properties: dict[str, str]) -> Context | None:
    """The trace context a message carries, or None."""
    if TRACE_CONTEXT not in properties:
        return None
    ctx = _PROPAGATOR.extract(properties, getter=_GETTER)
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return ctx if span_ctx.is_valid else None


def _headers(ctx: trace.SpanContext) -> dict[str, str]:
    """The properties carrying ``ctx``: the W3C ``traceparent`` (version 00) and ``tracestate``
    values, formatted here rather than by the propagator (a tenth of its cost, once per send;
    :func:`context_of` reads them back with the propagator)."""
    out = {TRACE_CONTEXT: f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    if ctx.trace_state:
        out[TRACE_STATE] = ctx.trace_state.to_header()
    return out


@contextlib.contextmanager
def send_span(topic: str, items: Sequence[_Prepared]) -> Iterator[None]:
    """``send <topic>`` around one send with its retries; its context goes into every message
    of ``items`` (prepared messages, whether they travel as protobufs or encoded records)."""
    if not enabled():
        yield
        return
    attrs: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": topic,
        "messaging.batch.message_count": len(items),
    }
    if len(items) == 1:
        attrs["messaging.message.id"] = getattr(items[0], "msg_id", "")
    # start_span + attach rather than start_as_current_span: two generator layers fewer, a
    # third of this hook's cost (it runs once per send, sampled or not)
    span = _TRACER.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attrs)
    token = context_api.attach(trace.set_span_in_context(span))
    try:
        headers = _headers(span.get_span_context())
        for item in items:
            item.add_properties(headers)
        yield
    except BaseException as exc:
        if span.is_recording():
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        context_api.detach(token)
        span.end()


def process_span(
    group: str, mq: MessageQueue, msgs: Sequence[Any]
) -> contextlib.AbstractContextManager[None]:
    """``process <topic>`` around one listener call on ``msgs`` (ReceivedMessages)."""
    if not enabled():
        return _NO_SPAN
    unsampled = _unsampled_parent(msgs)
    if unsampled is not None:
        # The producer did not sample this trace and the application's sampler follows
        # parents: no span would be recorded. Only its context is made current (so calls the
        # listener makes still carry the trace), without making a span (a per-message cost
        # for the default batch size of 1).
        return _Attached(unsampled)
    return _recorded_process_span(group, mq, msgs)


_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class _Attached:
    """``context`` made current while inside: a class, not a generator, at a third of the
    cost (it wraps every listener call on an unsampled trace)."""

    __slots__ = ("_context", "_token")

    def __init__(self, context: Context) -> None:
        self._context = context

    def __enter__(self) -> None:
        self._token = context_api.attach(self._context)

    def __exit__(self, *_exc: object) -> None:
        context_api.detach(self._token)


@contextlib.contextmanager
def _recorded_process_span(group: str, mq: MessageQueue, msgs: Sequence[Any]) -> Iterator[None]:
    # only the messages that carry a context have all their properties read
    parent, links = _parent_and_links(
        m.properties for m in msgs if m.get_property(TRACE_CONTEXT) is not None
    )
    attrs: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": mq.topic,
        "messaging.destination.partition.id": str(mq.queue_id),
        "messaging.consumer.group.name": group,
        "messaging.batch.message_count": len(msgs),
    }
    if len(msgs) == 1:
        attrs["messaging.message.id"] = msgs[0].msg_id
        attrs["messaging.rocketmq.message.reconsume_times"] = msgs[0].reconsume_times
    with _TRACER.start_as_current_span(
        f"process {mq.topic}", context=parent, kind=SpanKind.CONSUMER, links=links,
        attributes=attrs,
    ):  # fmt: skip
        yield


@contextlib.contextmanager
def check_span(
    group: str, topic: str, transaction_id: str, props: dict[str, str]
) -> Iterator[None]:
    """``check <topic>``: a producer answering a broker's transaction check, in the half
    message's trace."""
    if not enabled():
        yield
        return
    attrs = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "check",
        "messaging.destination.name": topic,
        "messaging.rocketmq.client_group": group,
        "messaging.rocketmq.transaction.id": transaction_id,
    }
    with _TRACER.start_as_current_span(
        f"check {topic}", context=context_of(props), kind=SpanKind.CONSUMER, attributes=attrs
    ):
        yield


TRACEPARENT_CHARS = 55
"""Length of a version-00 ``traceparent``: ``00-`` 32 hex ``-`` 16 hex ``-`` 2 hex."""


def _unsampled_parent(msgs: Sequence[Any]) -> Context | None:
    """When every message carries one and the same unsampled context and the installed
    sampler is parent-based: that context, else None."""
    global _last_unsampled
    value = None
    for m in msgs:
        v = m.get_property(TRACE_CONTEXT)
        if v is None or (value is not None and v != value):
            return None
        value = v
    if value is None:
        return None
    # The messages of one producer batch share their send span's context, so consecutive
    # listener calls mostly read the same value: the last one's answer is kept.
    last_value, ctx = _last_unsampled
    if value != last_value:
        ctx = _read_unsampled(value)
        _last_unsampled = (value, ctx)
    if ctx is None or not _follows_parents():
        return None
    return ctx


_last_unsampled: tuple[str, Context | None] = ("", None)


def _read_unsampled(value: str) -> Context | None:
    """The context of ``traceparent`` ``value`` if it is unsampled (read by slicing the
    version-00 layout), else None."""
    if len(value) != TRACEPARENT_CHARS or value[:3] != "00-":
        return None
    try:
        trace_id, span_id, flags = int(value[3:35], 16), int(value[36:52], 16), int(value[53:], 16)
    except ValueError:
        return None
    if flags & 0x01 or not trace_id or not span_id:
        return None
    span_ctx = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span_ctx))


_parent_based: tuple[object, bool] = (None, False)


def _follows_parents() -> bool:
    """Whether the installed provider's sampler is parent-based (cached per provider)."""
    global _parent_based
    provider = trace.get_tracer_provider()
    if _parent_based[0] is not provider:
        from opentelemetry.sdk.trace.sampling import ParentBased  # noqa: PLC0415 - SDK optional

        _parent_based = (provider, isinstance(getattr(provider, "sampler", None), ParentBased))
    return _parent_based[1]


def _parent_and_links(props: Iterable[dict[str, str]]) -> tuple[Context | None, list[Link]]:
    """The first message's context as parent; links to up to LINKS_MAX other distinct ones."""
    seen: set[str] = set()
    contexts: list[Context] = []
    for p in props:
        value = p.get(TRACE_CONTEXT)
        if value and value not in seen and len(seen) <= LINKS_MAX:
            seen.add(value)
            ctx = context_of(p)
            if ctx is not None:
                contexts.append(ctx)
    if not contexts:
        return None, []
    links = [Link(trace.get_current_span(c).get_span_context()) for c in contexts[1:]]
    return contexts[0], links


def traced_send(fn: _SendFn) -> _SendFn:
    """Decorates a producer core's send method ``(self, topic | queue | None, items | item,
    ...)`` with :func:`send_span` (one line in the hot path's file)."""

    @functools.wraps(fn)
    async def send(self: Any, where: Any, items: Any, *args: Any, **kwargs: Any) -> Any:
        if not enabled():
            return await fn(self, where, items, *args, **kwargs)
        batch = items if isinstance(items, Sequence) else [items]
        with send_span(batch[0].topic, batch):
            return await fn(self, where, items, *args, **kwargs)

    return send  # type: ignore[return-value]
