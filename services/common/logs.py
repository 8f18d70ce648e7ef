"""Service logging: one structlog pipeline for every line a RocketQ server writes.

:func:`configure` sends the root logger to stderr through structlog's ``ProcessorFormatter``,
so the existing ``logging.getLogger(__name__)`` calls keep working unchanged and render in the
same format as structlog loggers. Stderr that is not a terminal (a log file, a container) gets
one JSON object per line; a terminal gets structlog's readable console renderer.

Every line carries ``ts`` (UTC, ISO 8601), ``level`` (upper case: ``ERROR``), ``service``,
``pid``, ``logger`` and ``event`` (the message), plus whatever the service binds (a broker
binds ``broker``, its brokerName). An exception's traceback is the ``exception`` field. A line
written inside an OpenTelemetry span carries ``trace_id`` and ``span_id``
(services.common.telemetry.log_context).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor

from services.common.telemetry.log_context import add_trace_ids

_FIRST_KEYS = ("ts", "level", "service", "broker", "pid", "logger", "event", "trace_id", "span_id")
"""Key order of a JSON line: what every reader scans for first."""


def _upper_level(_logger: Any, _method: str, event: EventDict) -> EventDict:
    event["level"] = str(event.get("level", "")).upper()
    return event


def _bind(context: dict[str, Any]) -> Processor:
    def add(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> EventDict:
        for key, value in context.items():
            event.setdefault(key, value)
        return dict(event)

    return add


def _ordered(_logger: Any, _method: str, event: EventDict) -> EventDict:
    first = {k: event.pop(k) for k in _FIRST_KEYS if k in event}
    return {**first, **event}


def configure(
    service: str,
    level: str = "INFO",
    stream: TextIO | None = None,
    json_lines: bool | None = None,
    **context: Any,
) -> None:
    """Route all logging of this process to ``stream`` (stderr) in the one service format.

    ``json_lines`` None picks JSON unless ``stream`` is a terminal. ``context`` (e.g.
    ``broker="broker-a"``) is bound on every line next to ``service`` and ``pid``.
    """
    out = sys.stderr if stream is None else stream
    if json_lines is None:
        json_lines = not out.isatty()
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        _upper_level,
        structlog.stdlib.add_logger_name,
        _bind({"service": service, "pid": os.getpid(), **context}),
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        add_trace_ids,
    ]
    renderer: Processor
    if json_lines:
        renderer = structlog.processors.JSONRenderer()
        final: list[Processor] = [structlog.processors.format_exc_info, _ordered, renderer]
    else:
        final = [structlog.dev.ConsoleRenderer()]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
