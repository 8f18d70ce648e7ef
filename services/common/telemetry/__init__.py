"""Telemetry of RocketQ's services: OpenTelemetry traces and metrics, a Prometheus endpoint,
trace ids on log lines (DESIGN.md §11).

The pieces, each its own module so a process loads only what it uses (this ``__init__``
imports nothing: a service's config module imports :mod:`.config` for its keys, and must not
drag in the SDK):

- :mod:`.config`: the keys every service takes (``metricsPort``, ``traceExporter``,
  ``traceSampleRatio``, ``traceFile``);
- :mod:`.setup`: installs the tracer and meter providers from them; the /metrics endpoint
  (:mod:`.http`) is served on the service's own event loop;
- :mod:`.state`: the two flags every hot-path hook reads first;
- :mod:`.grpc_metrics`: the server interceptor (call duration and status per method);
- :mod:`.messaging`: the broker's Send/Pull spans and counters, the spans of a message's later
  hops (retry, dead letter, delay, transaction check);
- :mod:`.gauges`: scrape-time gauges read off a service's runtime stats (lag, disk,
  replication, elections, timer backlog);
- :mod:`.exporters`: the JSON-lines span file;
- :mod:`.log_context`: the structlog processor that adds ``trace_id`` / ``span_id``.

Alternatives weighed: prometheus_client's own instruments (simpler, but then traces and metrics
would be two systems, and OTLP export of metrics would need a rewrite), and instrumenting every
message (exact per-message latency, at a cost per message the hot paths cannot pay: counters here
move once per request).
"""
