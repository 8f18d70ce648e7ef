"""A fuzzer of every RPC of every RocketQ service, over real sockets (issue 21).

    python -m tests.robustness.fuzz_rpc [--budget-s 60] [--seed 1] [--keep DIR]

It starts a nameserver, a broker and a timer-wheel on loopback, asks each for the services it
serves (gRPC reflection) and finds their methods in the generated descriptors, so a new RPC is
fuzzed without anyone listing it. Until the budget is spent it goes round every method sending:

* random messages of the method's request type - negative, huge and zero numbers; empty, long
  (40 KB) and unicode strings; names the cluster really has (so checks past validation run);
  nested and repeated fields, maps, unknown enum values - built from the descriptor;
* raw bytes that are not protobuf (and the empty payload);
* on client-streaming methods, a stream of such frames, valid and not.

Then it checks what the issue asks for: every server alive and SERVING, a send/pull round trip
working on a fresh topic, no answer INTERNAL or UNKNOWN (a bug, or a request grpcio could not
parse before RocketQ saw it), no trailers a standard client refuses, no handler traceback in any
log, and - after a clean stop - ``store verify`` clean on the broker's store.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor, message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
    nameserver_pb2,
    replication_pb2,
    timer_pb2,
)
from services.broker.gateway._v2api import service_pb2 as gateway_v2_pb2
from services.store.inspect import detect_layout, verify
from tests.integration.cluster import (
    ServiceProcess,
    free_port,
    start_broker,
    start_nameserver,
    start_timer_wheel,
)

DESCRIPTOR_MODULES = (
    admin_pb2,
    messaging_pb2,
    nameserver_pb2,
    replication_pb2,
    timer_pb2,
    gateway_v2_pb2,  # the broker's apache.rocketmq.v2 gateway (services/broker/gateway)
)
SKIPPED_SERVICES = frozenset({"grpc.reflection.v1alpha.ServerReflection"})
"""Reflection is grpcio's own; the health service is fuzzed like ours."""
CALL_TIMEOUT_S = 2.0
STREAM_FRAMES_MAX = 6
NESTING_MAX = 3
REPEATED_MAX = 3
TOPIC = "FuzzTopic"
GROUP = "fuzz-group"
FLAG_SUBSCRIPTION = 0x4
"""Pull sys_flag: the request carries its subscription (no ClientStream heartbeat needed)."""
BAD_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
TRAILER_LIMIT_TEXT = "metadata size exceeds"
"""What a client says when the server's trailers are over its limit (an input echoed whole)."""


# ---- request generation ---------------------------------------------------------------------


class Inputs:
    """Random request payloads for one method's request type."""

    def __init__(self, rng: random.Random, names: list[str]) -> None:
        self.rng = rng
        self.names = names

    def payload(self, message_type: descriptor.Descriptor) -> bytes:
        """A serialized random message most of the time, else bytes that are not one."""
        roll = self.rng.random()
        if roll < 0.75:
            return self.message(message_type, 0).SerializeToString()
        if roll < 0.95:
            return self.rng.randbytes(self.rng.choice((1, 2, 7, 64, 1000)))
        return b""

    def message(self, message_type: descriptor.Descriptor, depth: int) -> Any:
        msg = message_factory.GetMessageClass(message_type)()
        for f in message_type.fields:
            if self.rng.random() < 0.4:
                continue  # leave it unset
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                self._fill_map(getattr(msg, f.name), f.message_type, depth)
            elif f.is_repeated:
                for _ in range(self.rng.randint(0, REPEATED_MAX)):
                    self._append(msg, f, depth)
            elif f.message_type is not None:
                if depth < NESTING_MAX:
                    getattr(msg, f.name).CopyFrom(self.message(f.message_type, depth + 1))
            else:
                setattr(msg, f.name, self.scalar(f))
        return msg

    def _append(self, msg: Any, f: FieldDescriptor, depth: int) -> None:
        items = getattr(msg, f.name)
        if f.message_type is not None:
            if depth < NESTING_MAX:
                items.add().CopyFrom(self.message(f.message_type, depth + 1))
        else:
            items.append(self.scalar(f))

    def _fill_map(self, target: Any, entry: descriptor.Descriptor, depth: int) -> None:
        key_f, value_f = entry.fields_by_name["key"], entry.fields_by_name["value"]
        for _ in range(self.rng.randint(0, REPEATED_MAX)):
            key = self.scalar(key_f)
            if value_f.message_type is not None:
                if depth < NESTING_MAX:
                    target[key].CopyFrom(self.message(value_f.message_type, depth + 1))
            else:
                target[key] = self.scalar(value_f)

    def scalar(self, f: FieldDescriptor) -> Any:
        t = f.type
        if t == FieldDescriptor.TYPE_STRING:
            return self.string()
        if t == FieldDescriptor.TYPE_BYTES:
            return self.rng.randbytes(self.rng.choice((0, 1, 16, 300, 5000)))
        if t == FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
            return self.rng.choice((0.0, -1.0, 1e300, float("nan"), 0.5))
        if t == FieldDescriptor.TYPE_ENUM:
            values = [v.number for v in f.enum_type.values]
            return self.rng.choice([*values, 999])
        return self.integer(f)

    def integer(self, f: FieldDescriptor) -> int:
        unsigned = f.type in (
            FieldDescriptor.TYPE_UINT32,
            FieldDescriptor.TYPE_UINT64,
            FieldDescriptor.TYPE_FIXED32,
            FieldDescriptor.TYPE_FIXED64,
        )
        wide = f.type in (
            FieldDescriptor.TYPE_INT64,
            FieldDescriptor.TYPE_SINT64,
            FieldDescriptor.TYPE_SFIXED64,
            FieldDescriptor.TYPE_UINT64,
            FieldDescriptor.TYPE_FIXED64,
        )
        top = (
            2**64 - 1
            if unsigned and wide
            else 2**32 - 1
            if unsigned
            else 2**63 - 1
            if wide
            else 2**31 - 1
        )
        low = 0 if unsigned else -top - 1
        return self.rng.choice(
            (0, 1, -1 if low else 0, low, top, self.rng.randint(low, top), 15, 4096)
        )

    def string(self) -> str:
        roll = self.rng.random()
        if roll < 0.35:
            return self.rng.choice(self.names)
        if roll < 0.5:
            return ""
        if roll < 0.6:
            return "é" * 20_000  # the 16 KiB-trailer case of issue 21
        if roll < 0.7:
            return "".join(chr(self.rng.randint(1, 0x2FFF)) for _ in range(self.rng.randint(1, 40)))
        if roll < 0.8:
            return "x" * 40_000
        return "".join(self.rng.choice("abcAZ09_-%|.:; ") for _ in range(self.rng.randint(1, 30)))


# ---- the run --------------------------------------------------------------------------------


@dataclass
class Method:
    server: str
    addr: str
    path: str
    request: descriptor.Descriptor
    client_streaming: bool
    server_streaming: bool


@dataclass
class Findings:
    calls: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    bad: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    timed_out: Counter[str] = field(default_factory=Counter)
    answered_ok: Counter[str] = field(default_factory=Counter)

    def note(self, m: Method, code: grpc.StatusCode, details: str) -> None:
        self.calls += 1
        self.codes[code.name] += 1
        if code == grpc.StatusCode.OK:
            self.answered_ok[m.path] += 1
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.timed_out[m.path] += 1  # a long poll held, or a stream left open: not a fault
        if code in BAD_CODES or TRAILER_LIMIT_TEXT in details:
            examples = self.bad[m.path]
            if len(examples) < 3:
                examples.append(f"{code.name}: {details[:300]}")

    @property
    def ok(self) -> bool:
        return not self.bad and not self.problems

    def summary(self) -> str:
        lines = [f"{self.calls} calls; codes: {dict(sorted(self.codes.items()))}"]
        if self.timed_out:
            lines.append(f"held to the {CALL_TIMEOUT_S} s deadline: {dict(self.timed_out)}")
        lines += [f"BAD {path}: {ex}" for path, exs in sorted(self.bad.items()) for ex in exs]
        lines += [f"PROBLEM {p}" for p in self.problems]
        return "\n".join(lines)


def _descriptors() -> dict[str, descriptor.ServiceDescriptor]:
    services = {}
    for module in (*DESCRIPTOR_MODULES, health_pb2):
        for svc in module.DESCRIPTOR.services_by_name.values():
            services[svc.full_name] = svc
    return services


def served_services(addr: str) -> list[str]:
    """What the server at ``addr`` says it serves (gRPC reflection)."""
    with grpc.insecure_channel(addr) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        [resp] = list(stub.ServerReflectionInfo(iter([req]), timeout=10))
        return [s.name for s in resp.list_services_response.service]


def methods_of(servers: dict[str, str]) -> list[Method]:
    """Every method of every service of every server, from reflection and the descriptors."""
    known = _descriptors()
    out = []
    for server, addr in servers.items():
        for name in served_services(addr):
            if name in SKIPPED_SERVICES:
                continue
            svc = known.get(name)
            if svc is None:
                raise AssertionError(f"{server} serves {name}, which no generated module describes")
            for md in svc.methods:
                out.append(
                    Method(server, addr, f"/{name}/{md.name}", md.input_type,
                           md.client_streaming, md.server_streaming)
                )  # fmt: skip
    return out


def call(ch: grpc.Channel, m: Method, inputs: Inputs) -> tuple[grpc.StatusCode, str]:
    """One fuzzed call; its status and details (OK when it answered)."""
    try:
        if m.client_streaming:
            frames = [
                inputs.payload(m.request) for _ in range(inputs.rng.randint(1, STREAM_FRAMES_MAX))
            ]
            stream = ch.stream_stream(m.path)(iter(frames), timeout=CALL_TIMEOUT_S)
            for _ in stream:
                pass
        elif m.server_streaming:
            for _ in ch.unary_stream(m.path)(inputs.payload(m.request), timeout=CALL_TIMEOUT_S):
                pass
        else:
            ch.unary_unary(m.path)(inputs.payload(m.request), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def fuzz(methods: list[Method], budget_s: float, seed: int, names: list[str]) -> Findings:
    """Round-robin over ``methods`` until ``budget_s`` is spent (at least one round)."""
    inputs = Inputs(random.Random(seed), names)
    findings = Findings()
    channels: dict[str, grpc.Channel] = {}
    deadline = time.monotonic() + budget_s
    try:
        rounds = 0
        while rounds == 0 or time.monotonic() < deadline:
            for m in methods:
                ch = channels.get(m.addr) or channels.setdefault(
                    m.addr, grpc.insecure_channel(m.addr)
                )
                code, details = call(ch, m, inputs)
                findings.note(m, code, details)
            rounds += 1
    finally:
        for ch in channels.values():
            ch.close()
    return findings


# ---- the cluster and the checks afterwards --------------------------------------------------


@dataclass
class FuzzCluster:
    namesrv: ServiceProcess
    broker: ServiceProcess
    timer: ServiceProcess
    gateway_port: int = 0
    """The broker's apache.rocketmq.v2 gateway (a second server in the broker process)."""

    @property
    def servers(self) -> dict[str, ServiceProcess]:
        return {"nameserver": self.namesrv, "broker": self.broker, "timer-wheel": self.timer}


@contextlib.contextmanager
def fuzz_cluster(root: Path) -> Iterator[FuzzCluster]:
    started: list[ServiceProcess] = []
    try:
        ns = start_nameserver(root)
        started.append(ns)
        gateway_port = free_port()
        broker = start_broker(root, [ns.addr], gatewayPort=gateway_port)
        started.append(broker)
        timer = start_timer_wheel(root, [ns.addr])
        started.append(timer)
        yield FuzzCluster(ns, broker, timer, gateway_port)
    finally:
        for sp in reversed(started):
            if sp.alive():
                with contextlib.suppress(AssertionError):
                    sp.stop(timeout_s=15)


def round_trip(broker_addr: str, topic: str) -> str | None:
    """Create ``topic`` on the broker, send one message and pull it back; None when it worked."""
    body = f"round trip {time.monotonic_ns()}".encode()
    with grpc.insecure_channel(broker_addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        msg = common_pb2.Message(topic=topic, body=body)
        create = admin_pb2.CreateTopicRequest(
            target=admin_pb2.ApplyTarget(broker_name="broker-a"),
            config=common_pb2.TopicConfig(
                topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=6
            ),
        )
        try:
            admin_pb2_grpc.AdminStub(ch).CreateTopic(create, timeout=10)
            stub.Send(messaging_pb2.SendRequest(queue_id=0, messages=[msg]), timeout=10)
            resp = stub.Pull(
                messaging_pb2.PullRequest(
                    consumer_group=GROUP, topic=topic, queue_id=0, queue_offset=0,
                    max_msg_nums=1, suspend_timeout_ms=0, decoded=True, subscription="*",
                    sys_flag=FLAG_SUBSCRIPTION,
                ),
                timeout=10,
            )  # fmt: skip
        except grpc.RpcError as err:
            return f"round trip on {topic}: {err.code().name} {err.details()}"
        bodies = [m.message.body for m in resp.messages]
        return (
            None
            if body in bodies
            else f"round trip on {topic}: pulled {len(bodies)} other message(s)"
        )


DRAIN_PATH = "/rocketq.v1.Admin/DrainBroker"
"""A DrainBroker that succeeds turns the broker's write permission off until it restarts (the
scale-down drain, issue 19): a state change a valid request makes, which the round trip sees."""
DRAINED_TEXT = "is not writable"


def after_checks(c: FuzzCluster, drained: bool = False) -> list[str]:
    """Alive, SERVING, a round trip (after an accepted drain: the send refused as not writable);
    then (stopped cleanly) no tracebacks, store verify clean."""
    problems = []
    for name, sp in c.servers.items():
        if not sp.alive():
            problems.append(f"{name} died:\n{sp.log_tail(40)}")
            continue
        with grpc.insecure_channel(sp.addr) as ch:
            try:
                status = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            except grpc.RpcError as err:
                problems.append(f"{name} health check: {err.code().name} {err.details()}")
                continue
            if status.status != health_pb2.HealthCheckResponse.SERVING:
                problems.append(
                    f"{name} is {health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)}"
                )
    if c.broker.alive():
        trouble = round_trip(c.broker.addr, f"FuzzRoundTrip{time.monotonic_ns() % 10**6}")
        if drained and trouble and "PERMISSION_DENIED" in trouble and DRAINED_TEXT in trouble:
            trouble = None  # what the accepted drain does, not damage
        if trouble:
            problems.append(trouble)
    for name, sp in c.servers.items():
        if sp.alive() and sp.stop(timeout_s=15) != 0:
            problems.append(f"{name} did not stop cleanly:\n{sp.log_tail(40)}")
        text = sp.log_path.read_text(errors="replace")
        if "Traceback" in text:
            at = text.index("Traceback")
            problems.append(f"{name} logged a traceback:\n{text[max(0, at - 300) : at + 1500]}")
    report = verify(detect_layout(c.broker.workdir / "store"))
    problems += [f"store verify: {p}" for p in report.problems[:20]]
    return problems


def seed_cluster(c: FuzzCluster) -> list[str]:
    """A topic with messages and a group with an offset, so fuzzed names hit real state; the
    names the string generator draws from."""
    trouble = round_trip(c.broker.addr, TOPIC)
    assert trouble is None, trouble
    return [
        TOPIC, GROUP, "broker-a", "DefaultCluster", "TBW102", f"%RETRY%{GROUP}", f"%DLQ%{GROUP}",
        c.broker.addr, c.namesrv.addr, "rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC",
    ]  # fmt: skip


def run(root: Path, budget_s: float, seed: int) -> Findings:
    with fuzz_cluster(root) as c:
        names = seed_cluster(c)
        servers = {name: sp.addr for name, sp in c.servers.items()}
        servers["gateway"] = f"127.0.0.1:{c.gateway_port}"
        findings = fuzz(methods_of(servers), budget_s, seed, names)
        findings.problems += after_checks(c, drained=findings.answered_ok[DRAIN_PATH] > 0)
    return findings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--budget-s", type=float, default=60.0, help="time to spend fuzzing")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", type=Path, help="keep the cluster's data and logs here")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz-rpc-"))
        )
        findings = run(root, args.budget_s, args.seed)
    print(findings.summary())
    print("OK" if findings.ok else "FAILED")
    return 0 if findings.ok else 1


if __name__ == "__main__":
    sys.exit(main())
