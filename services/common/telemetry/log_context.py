"""``trace_id`` and ``span_id`` on every log line written while a span is current.

A structlog processor (services.common.logs puts it in the shared chain, so stdlib
``logging`` lines get it too). It reads the OpenTelemetry context of the running task or
thread; outside a span, or with tracing off (the API's invalid span), it adds nothing. Ids are
lowercase hex as in W3C ``traceparent``, so a log line and its span are found by the same text.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from structlog.typing import EventDict


def add_trace_ids(_logger: Any, _method: str, event: EventDict) -> EventDict:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event
