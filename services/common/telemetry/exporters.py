"""A span exporter that appends one JSON object per finished span to a file.

Why a file: it is the simplest real sink a test (or an operator without a collector) can read
from another process — no collector to run, nothing to mock. Each line is the SDK's own
``ReadableSpan.to_json`` (trace and span ids in hex, parent, attributes, events, links), minus
its indentation. Lines are written whole and flushed per export batch, so a reader never sees
half a span.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLinesSpanExporter(SpanExporter):
    """Appends spans to ``path`` as JSON lines (the ``file`` value of ``traceExporter``)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # indent=None: json.dumps on one line (newlines inside strings are escaped)
        lines = "".join(s.to_json(indent=None) + "\n" for s in spans)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
