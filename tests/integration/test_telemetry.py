"""Traces and metrics across real processes (DESIGN.md §11, issue 20).

One cluster serves the module: a nameserver, a broker and a timer wheel with a Prometheus
endpoint each (``metricsPort``: the nameserver's through its environment variable, the others'
through ``--set``), broker and timer wheel exporting their spans to JSON-lines files
(``traceExporter=file``). The
producer and consumer run in the test process with an OpenTelemetry SDK whose spans land in an
in-memory exporter, so one trace is followed from the producer's send span, through the
broker's store span in the broker process, to the consumer's process span.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once
from prometheus_client.parser import text_string_to_metric_families

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.client.admin import Admin
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, ReceivedMessage
from tests.integration.cluster import free_port
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration


@dataclass
class Env:
    c: Cluster
    spans: InMemorySpanExporter
    broker_spans: Path
    broker_metrics: str
    namesrv_metrics: str
    timer_spans: Path
    timer_metrics: str


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("telemetry")
    spans_file = root / "broker-spans.jsonl"
    timer_file = root / "timer-spans.jsonl"
    broker_port, ns_port, timer_port = free_port(), free_port(), free_port()
    keys = {"metricsPort": broker_port, "traceExporter": "file", "traceFile": spans_file}
    timer_keys = {"metricsPort": timer_port, "traceExporter": "file", "traceFile": timer_file}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # The nameserver takes its key from the environment (ROCKETQ_<SERVICE>_<KEY>).
    os.environ["ROCKETQ_NAMESERVER_METRICSPORT"] = str(ns_port)
    try:
        with cluster(root, broker_keys=keys, timer_wheel=True, timer_keys=timer_keys) as c:
            os.environ.pop("ROCKETQ_NAMESERVER_METRICSPORT")
            yield Env(
                c,
                exporter,
                spans_file,
                f"http://127.0.0.1:{broker_port}/metrics",
                f"http://127.0.0.1:{ns_port}/metrics",
                timer_file,
                f"http://127.0.0.1:{timer_port}/metrics",
            )
    finally:
        os.environ.pop("ROCKETQ_NAMESERVER_METRICSPORT", None)
        provider.shutdown()
        # The API installs a provider once per process; later modules must not record spans.
        # (opentelemetry's own test utilities reset these two globals the same way.)
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


# ---- helpers ----------------------------------------------------------------------------------


def producer(e: Env, name: str) -> Producer:
    return Producer(ProducerConfig(group=f"pg-{name}", namesrv_addrs=e.c.namesrv_addrs))


def consumer(e: Env, group: str, topic: str, listener: object) -> PushConsumer:
    cfg = PushConsumerConfig(
        group,
        tuple(e.c.namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        persist_consumer_offset_interval_ms=200,  # the lag gauge reads committed offsets
    )
    pc = PushConsumer(cfg, listener)  # type: ignore[arg-type]
    pc.subscribe(topic, "*")
    return pc


async def make_topic(e: Env, topic: str, broker: str = "broker-a", addr: str = "") -> None:
    """``topic`` with one queue on ``broker`` only (its spans and counters are that broker's,
    whichever brokers the module has started), routed before it returns."""
    async with RawClient(addr or e.c.broker.addr) as rc:
        await rc.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name=broker),
                config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=6
                ),
            ),
            timeout=10,
        )
    await wait_routed(e.c.namesrv_addrs, topic, 1)


def client_spans(e: Env, name: str) -> list[ReadableSpan]:
    return [s for s in e.spans.get_finished_spans() if s.name == name]


def broker_spans(e: Env, name: str, path: Path | None = None) -> list[dict[str, Any]]:
    """Spans called ``name`` in the broker's span file (or ``path``, the timer wheel's)."""
    path = path or e.broker_spans
    if not path.exists():
        return []
    return [s for s in map(json.loads, path.read_text().splitlines()) if s["name"] == name]


def hex_id(value: int, width: int) -> str:
    return "0x" + format(value, f"0{width}x")


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the endpoint: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


# ---- traces -----------------------------------------------------------------------------------


async def test_one_trace_spans_producer_broker_and_consumer(env: Env) -> None:
    topic, group = "TelemetryTrace", "cg-telemetry-trace"
    await make_topic(env, topic)
    got: list[ReceivedMessage] = []
    seen_context: list[str] = []

    def listener(msgs: list[ReceivedMessage], _ctx: ConsumeContext) -> ConsumeResult:
        # the listener runs inside the process span (on the consume thread pool)
        seen_context.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
        got.extend(msgs)
        return ConsumeResult.CONSUME_SUCCESS

    async with producer(env, "trace") as p:
        result = await p.send(Message(topic, b"traced"))
    pc = consumer(env, group, topic, listener)
    await pc.start()
    try:
        await until(lambda: got, "the message to be consumed", 20)
    finally:
        await pc.close()

    [send] = client_spans(env, f"send {topic}")
    assert send.kind is SpanKind.PRODUCER
    assert send.attributes is not None
    assert send.attributes["messaging.message.id"] == result.msg_id
    ctx = send.context
    # the message carries the send span's W3C traceparent, flags saying "sampled"
    head, flags = got[0].properties["TRACE_CONTEXT"].rsplit("-", 1)
    assert head == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}"
    assert int(flags, 16) & 0x01

    [process] = client_spans(env, f"process {topic}")
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == ctx.trace_id
    assert process.parent is not None and process.parent.span_id == ctx.span_id
    assert seen_context == [f"{ctx.trace_id:032x}"]

    stored = await until(lambda: broker_spans(env, f"store {topic}"), "the broker's store span")
    [store] = stored
    assert store["context"]["trace_id"] == hex_id(ctx.trace_id, 32)  # type: ignore[index]
    assert store["parent_id"] == hex_id(ctx.span_id, 16)
    assert store["kind"] == "SpanKind.SERVER"
    assert store["resource"]["attributes"]["service.name"] == "rocketq-broker"  # type: ignore[index]
    assert store["attributes"]["messaging.message.id"] == result.msg_id  # type: ignore[index]


async def test_a_batch_sent_as_records_carries_its_send_span_to_the_consumer(env: Env) -> None:
    # A batch travels as encoded records (SendRequest.records), not protobuf messages: the
    # trace context must be in the records' properties all the same.
    topic, group = "TelemetryBatchTrace", "cg-telemetry-batch-trace"
    await make_topic(env, topic)
    got: list[ReceivedMessage] = []

    def listener(msgs: list[ReceivedMessage], _ctx: ConsumeContext) -> ConsumeResult:
        got.extend(msgs)
        return ConsumeResult.CONSUME_SUCCESS

    async with producer(env, "batch-trace") as p:
        await p.send_batch([Message(topic, b"b%d" % i) for i in range(3)])
    pc = consumer(env, group, topic, listener)
    await pc.start()
    try:
        await until(lambda: len(got) == 3, "the batch to be consumed", 20)
    finally:
        await pc.close()
    [send] = client_spans(env, f"send {topic}")
    ctx = send.context
    heads = {m.properties["TRACE_CONTEXT"].rsplit("-", 1)[0] for m in got}
    assert heads == {f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}"}
    processes = client_spans(env, f"process {topic}")
    assert processes and all(sp.context.trace_id == ctx.trace_id for sp in processes)


async def test_an_async_listener_runs_inside_its_process_span_across_awaits(env: Env) -> None:
    # A coroutine listener takes the consumer's fast path (batches of a pulled run, the call
    # run by hand until it suspends): its span must be current before and after its awaits,
    # and a listener that raises leaves the error on its span.
    topic, group = "TelemetryAsyncListener", "cg-telemetry-async-listener"
    await make_topic(env, topic)
    seen: dict[bytes, tuple[int, int]] = {}  # body -> current span id before and after an await

    async def listener(msgs: list[ReceivedMessage], _ctx: ConsumeContext) -> ConsumeResult:
        before = trace.get_current_span().get_span_context().span_id
        await asyncio.sleep(0)  # suspends: other tasks run before the call goes on
        after = trace.get_current_span().get_span_context().span_id
        seen.setdefault(msgs[0].body, (before, after))
        if msgs[0].body == b"fails":
            raise RuntimeError("the listener refuses this one")
        return ConsumeResult.CONSUME_SUCCESS

    async with producer(env, "async-listener") as p:
        await p.send_batch([Message(topic, b"first"), Message(topic, b"second")])
        await p.send(Message(topic, b"fails"))
    async with consumer(env, group, topic, listener):
        await until(lambda: len(seen) == 3, "each message's first listener call", 20)

    spans = {sp.context.span_id: sp for sp in client_spans(env, f"process {topic}")}
    for body, (before, after) in seen.items():
        assert before == after and before in spans, f"{body!r} ran outside its process span"
    failed = spans[seen[b"fails"][0]]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert spans[seen[b"first"][0]].status.status_code is StatusCode.UNSET


async def test_a_dead_letter_joins_the_original_trace(env: Env) -> None:
    """A consumer gives the message up at once (delay level -1): the broker's dead-letter span
    is in the producer's trace."""
    topic, group = "TelemetryDlq", "cg-telemetry-dlq"
    await make_topic(env, topic)
    calls: list[str] = []

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append(msgs[0].msg_id)
        ctx.delay_level_when_next_consume = -1
        return ConsumeResult.RECONSUME_LATER

    async with producer(env, "dlq") as p:
        await p.send(Message(topic, b"doomed"))
    pc = consumer(env, group, topic, listener)
    await pc.start()
    try:
        dead = await until(
            lambda: broker_spans(env, f"dead letter {group}"), "the broker's dead-letter span", 20
        )
    finally:
        await pc.close()
    [send] = client_spans(env, f"send {topic}")
    assert dead[0]["context"]["trace_id"] == hex_id(send.context.trace_id, 32)  # type: ignore[index]
    assert dead[0]["parent_id"] == hex_id(send.context.span_id, 16)
    assert len(calls) == 1
    dlq = {"messaging_consumer_group_name": group, "rocketq_send_back_outcome": "dlq"}
    await until(
        lambda: total(scrape(env.broker_metrics), "rocketmq_send_back_messages_total", **dlq) == 1,
        "the dead letter to be counted",
    )


async def test_a_delayed_message_keeps_its_trace_through_the_timer_wheel(env: Env) -> None:
    """Delay level 1: broker stores it in the timer topic, the timer wheel re-puts it when due
    (its ``deliver`` span), the consumer processes it - all in the producer's trace; the timer
    wheel's metrics count the delivery."""
    topic, group = "TelemetryDelayed", "cg-telemetry-delayed"
    await make_topic(env, topic)
    got: list[ReceivedMessage] = []

    def listener(msgs: list[ReceivedMessage], _ctx: ConsumeContext) -> ConsumeResult:
        got.extend(msgs)
        return ConsumeResult.CONSUME_SUCCESS

    async with producer(env, "delayed") as p:
        await p.send(Message(topic, b"later", delay_level=1))
    pc = consumer(env, group, topic, listener)
    await pc.start()
    try:
        await until(lambda: got, "the delayed message to be consumed", 30)
    finally:
        await pc.close()
    [send] = client_spans(env, f"send {topic}")
    trace_id = hex_id(send.context.trace_id, 32)
    delivered = await until(
        lambda: broker_spans(env, f"deliver {topic}", env.timer_spans), "the deliver span"
    )
    assert delivered[0]["context"]["trace_id"] == trace_id
    assert delivered[0]["resource"]["attributes"]["service.name"] == "rocketq-timer-wheel"
    stores = {s["context"]["trace_id"] for s in broker_spans(env, f"store {topic}")}
    assert stores == {trace_id}  # the first store (into the timer topic) and the re-put
    [process] = client_spans(env, f"process {topic}")
    assert process.context.trace_id == send.context.trace_id
    assert total(scrape(env.timer_metrics), "rocketq_timer_delivered_total") >= 1


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: the Export RPC of the OpenTelemetry collector protocol, keeping
    every span it is sent with its resource's service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for rs in request.resource_spans:
            service = next(
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            )
            for scope in rs.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


async def test_a_broker_exports_its_spans_over_otlp(env: Env) -> None:
    """traceExporter=otlp with the standard OTEL_EXPORTER_OTLP_* variables: the store span
    reaches an OTLP receiver, in the producer's trace."""
    collector = Collector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    otel_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    topic = "TelemetryOtlp"
    try:
        os.environ.update(otel_env)
        try:
            broker = env.c.start_broker("broker-otlp", traceExporter="otlp")
        finally:
            for key in otel_env:
                os.environ.pop(key)
        await make_topic(env, topic, "broker-otlp", broker.addr)
        async with producer(env, "otlp") as p:
            await p.send(Message(topic, b"over otlp"))
        [send] = client_spans(env, f"send {topic}")

        def exported() -> list[Any]:
            return [sp for svc, sp in collector.spans if sp.name == f"store {topic}"]

        [store] = await until(exported, "the store span at the OTLP receiver", 20)
        assert store.trace_id == send.context.trace_id.to_bytes(16, "big")
        assert store.parent_span_id == send.context.span_id.to_bytes(8, "big")
        assert {svc for svc, _ in collector.spans} == {"rocketq-broker"}
    finally:
        await server.stop(None)


async def test_without_a_tracer_provider_nothing_is_added_to_messages(env: Env) -> None:
    """Tracing off (no SDK provider in the application): messages carry no trace context."""
    provider = trace.get_tracer_provider()
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    try:
        async with producer(env, "untraced") as p:
            result = await p.send(Message("TelemetryUntraced", b"plain"))
    finally:
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved  # type: ignore[attr-defined]
    assert trace.get_tracer_provider() is provider
    async with Admin(env.c.namesrv_addrs) as admin:
        stored = await admin.view_message(result.offset_msg_id)
    assert stored.body == b"plain"
    assert "TRACE_CONTEXT" not in stored.properties


# ---- metrics ----------------------------------------------------------------------------------


async def test_broker_metrics_move_with_traffic(env: Env) -> None:
    topic, group, n = "TelemetryMetrics", "cg-telemetry-metrics", 20
    await make_topic(env, topic)
    async with producer(env, "metrics") as p:
        await p.send(Message(topic, b"first"))
        before = scrape(env.broker_metrics)
        await p.send_batch([Message(topic, b"x" * 100) for _ in range(n)])
    after = scrape(env.broker_metrics)
    label = {"messaging_destination_name": topic}
    assert (
        total(after, "rocketmq_messages_in_total", **label)
        - total(before, "rocketmq_messages_in_total", **label)
        == n
    )
    assert (
        total(after, "rocketmq_throughput_in_bytes_total", **label)
        - total(before, "rocketmq_throughput_in_bytes_total", **label)
        > n * 100
    )
    sends = {"rpc_method": "Send", "rpc_grpc_status_code": "0"}
    assert total(after, "rpc_server_duration_milliseconds_count", **sends) > total(
        before, "rpc_server_duration_milliseconds_count", **sends
    )

    # A consumer that reads everything and commits: messages out rise, the lag falls to 0.
    got: list[ReceivedMessage] = []

    def listener(msgs: list[ReceivedMessage], _ctx: ConsumeContext) -> ConsumeResult:
        got.extend(msgs)
        return ConsumeResult.CONSUME_SUCCESS

    pc = consumer(env, group, topic, listener)
    await pc.start()
    try:
        await until(lambda: len(got) == n + 1, "every message consumed", 20)
        lag = {"messaging_consumer_group_name": group, "messaging_destination_name": topic}

        def drained() -> bool:
            s = scrape(env.broker_metrics)
            return (
                bool(
                    [
                        k
                        for k in s
                        if k[0] == "rocketmq_consumer_lag_messages" and set(lag.items()) <= k[1]
                    ]
                )
                and total(s, "rocketmq_consumer_lag_messages", **lag) == 0
            )

        await until(drained, "the group's lag to be reported as 0", 20, 0.2)
    finally:
        await pc.close()
    out = scrape(env.broker_metrics)
    assert total(out, "rocketmq_messages_out_total", **lag) >= n + 1
    assert total(out, "rocketmq_storage_size_bytes") > 0
    assert total(out, "rocketmq_replication_in_sync_replicas") == 1


async def test_refused_calls_are_counted_by_status(env: Env) -> None:
    before = scrape(env.broker_metrics)
    async with RawClient(env.c.broker.addr) as rc:
        with pytest.raises(Exception, match=r"INVALID_ARGUMENT|no message"):
            await rc.messaging.Send(messaging_pb2.SendRequest(), timeout=5)
    refused = {"rpc_method": "Send", "rpc_grpc_status_code": "3"}
    key = "rpc_server_duration_milliseconds_count"
    # grpc.aio sends an aborted call's status before the handler (and the interceptor that
    # counts it) has unwound, so the count may land just after the client has its answer.
    want = total(before, key, **refused) + 1
    await until(
        lambda: total(scrape(env.broker_metrics), key, **refused) == want,
        "the refused Send to be counted under status 3 (INVALID_ARGUMENT)",
    )


async def test_nameserver_serves_metrics_from_its_environment_key(env: Env) -> None:
    samples = scrape(env.namesrv_metrics)
    registrations = {"rpc_method": "RegisterBroker", "rpc_grpc_status_code": "0"}
    assert total(samples, "rpc_server_duration_milliseconds_count", **registrations) >= 1
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(env.namesrv_metrics.replace("/metrics", "/nope"), timeout=5)


def _http(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def test_the_metrics_endpoint_refuses_what_is_not_a_scrape(env: Env) -> None:
    """Bad requests get an HTTP error, never a crash; the endpoint keeps serving."""
    port = int(env.namesrv_metrics.rsplit(":", 1)[1].split("/")[0])
    assert _http(port, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert _http(port, b"GET /other HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
    assert _http(port, huge).startswith(b"HTTP/1.1 400")
    assert _http(port, b"\x00\xff garbage without an end").startswith(b"HTTP/1.1 400")
    ok = _http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200") and b"rpc_server_duration_milliseconds" in ok


def test_unusable_telemetry_settings_stop_a_service_with_the_reason() -> None:
    """A taken metrics port exits 1 naming the address; a file exporter without its file exits
    2 naming the key - before anything is served."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    base = [sys.executable, "-m", "services.nameserver", "--listen", "127.0.0.1:0"]
    try:
        busy = subprocess.run(
            [*base, "--set", f"metricsPort={port}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        taken.close()
    assert busy.returncode == 1
    assert f"metrics endpoint cannot listen on 127.0.0.1:{port}" in busy.stderr
    no_file = subprocess.run(
        [*base, "--set", "traceExporter=file"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_file.returncode == 2
    assert "traceExporter=file needs traceFile" in no_file.stderr
