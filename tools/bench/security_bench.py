"""TLS + ACL cost: produce and consume throughput as a ratio to plaintext (issue 20).

    python -m tools.bench.security_bench [--duration S] [--quick]

Starts a nameserver and a broker twice on free loopback ports, in temporary directories:
plaintext without ACL, then mutual TLS (a throwaway CA) with ``aclEnable`` (a ``user`` role
with PUB|SUB on the topic and SUB on every group, so each request is signed, verified and
checked against its topic and group). Each run: 16 sync senders of 1 KiB messages
(per-request cost: handshake-free but signed and encrypted), an AccumulatingProducer (batched
sends), then a push consumer draining the backlog they left (timed from its first message to the
last); two interleaved rounds, the best figure of each mode kept. Then the CPU one small RPC
costs in each mode (tools/bench/_security_cpu.py), which a loaded machine disturbs less. The
goal is a ratio >= 0.9; figures are printed, never asserted. One Python client process against
one broker on this machine: on a shared machine they say more about the machine than about
RocketQ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rocketq.cli._bench import ProduceOptions, run_produce
from rocketq.client.admin import Admin
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.security import ClientSecurity, set_default_security
from rocketq.message import ReceivedMessage
from services.common import launch, supervisor
from services.common.security.certs import TestCA
from services.common.supervisor import Process
from tools.bench._security_cpu import cpu_per_call

TOPIC = "SecurityBench"


def _quiet(line: str) -> None:
    print("   ", line, flush=True)


def _secure_setup(base: Path) -> tuple[dict[str, object], ClientSecurity, ClientSecurity]:
    """Keys for every service, the bench user's and the admin's client security."""
    ca = TestCA(base / "pki")
    server, client = ca.issue("server"), ca.issue("client")
    acl_file = base / "acl.json"
    users = {
        "internal": {"role": "internal", "secretKey": "internal-secret"},
        "ops": {"role": "admin", "secretKey": "ops-secret"},
        "bench": {
            "secretKey": "bench-secret",
            "topics": {TOPIC: "PUB|SUB"},
            "groups": {"*": "SUB"},
        },
    }
    acl_file.write_text(json.dumps({"users": users}))
    keys: dict[str, object] = {
        "tlsCertFile": server.cert_file,
        "tlsKeyFile": server.key_file,
        "tlsCaFile": ca.ca_file,
        "tlsClientAuth": "require",
        "aclEnable": True,
        "aclFile": acl_file,
    }
    tls = (str(ca.ca_file), str(client.cert_file), str(client.key_file))
    return (
        keys,
        ClientSecurity(*tls, access_key="bench", secret_key="bench-secret"),
        ClientSecurity(*tls, access_key="ops", secret_key="ops-secret"),
    )


@contextmanager
def _cluster(base: Path, keys: dict[str, object]) -> Iterator[str]:
    procs: list[Process] = []
    try:
        procs.append(launch.start_nameserver(base, *launch.set_flags(keys)))
        procs.append(launch.start_broker(base, [procs[0].addr], "broker-a", keys))
        yield procs[0].addr
    finally:
        for p in reversed(procs):
            p.stop()


async def _run(
    namesrv: str, admin: ClientSecurity, user: ClientSecurity, dur_s: float
) -> dict[str, float]:
    set_default_security(admin)
    async with Admin([namesrv]) as a:
        await a.create_topic(TOPIC)
        for _ in range(100):
            try:
                await a.route(TOPIC)
                break
            except Exception:
                await asyncio.sleep(0.1)
    set_default_security(user)  # the bench clients take the process default
    ns = (namesrv,)
    out: dict[str, float] = {}
    print("  sync send, 16 senders, 1 KiB", flush=True)
    s = await run_produce(ProduceOptions(ns, topic=TOPIC, concurrency=16, duration_s=dur_s), _quiet)
    out["sync send msgs/s"] = s.tps
    backlog = s.count - s.failures
    print("  accumulating producer, 1 KiB", flush=True)
    opts = ProduceOptions(ns, topic=TOPIC, accumulate=True, concurrency=64, duration_s=dur_s)
    s = await run_produce(opts, _quiet)
    out["accumulating send msgs/s"] = s.tps
    backlog += s.count - s.failures
    print(f"  push consumer draining the backlog (~{backlog} messages)", flush=True)
    out["consume msgs/s"] = await _drain(ns, backlog, dur_s * 4)
    set_default_security(None)
    print("  " + ", ".join(f"{k} {v:.0f}" for k, v in out.items()), flush=True)
    return out


async def _drain(ns: tuple[str, ...], backlog: int, limit_s: float) -> float:
    """Messages per second from the first message consumed to the last of the backlog (the
    consumer's start-up, rebalance and first pulls are left out: they are not throughput)."""
    count = 0
    first = last = 0.0
    done = asyncio.Event()

    async def listener(msgs: list[ReceivedMessage], _ctx: ConsumeContext) -> ConsumeResult:
        nonlocal count, first, last
        now = time.monotonic()
        if count == 0:
            first = now
        count += len(msgs)
        last = now
        if count >= backlog:
            done.set()
        return ConsumeResult.CONSUME_SUCCESS

    config = PushConsumerConfig(
        "bench-drain",
        ns,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=32,
        pull_batch_size=64,
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe(TOPIC)
    async with consumer:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), limit_s)
    print(f"    consumed {count} of ~{backlog} in {last - first:.1f} s", flush=True)
    return count / (last - first) if last > first else 0.0


def _best(into: dict[str, float], got: dict[str, float]) -> None:
    for name, value in got.items():
        into[name] = max(into.get(name, 0.0), value)


def main() -> None:
    supervisor.children_die_with_this_process()  # a killed bench leaves nothing running
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per produce run")
    parser.add_argument("--quick", action="store_true", help="3-second runs, one round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best kept)")
    args = parser.parse_args()
    dur_s = 3.0 if args.quick else args.duration
    if args.quick:
        args.rounds = 1
    base = Path(tempfile.mkdtemp(prefix="rocketq-secbench-"))
    plain: dict[str, float] = {}
    secure: dict[str, float] = {}
    try:
        for r in range(args.rounds):
            # interleaved rounds, best of each: a loaded machine's noise hits both modes
            print(f"round {r + 1}: plaintext, no ACL", flush=True)
            with _cluster(base / f"plain{r}", {}) as ns:
                _best(plain, asyncio.run(_run(ns, ClientSecurity(), ClientSecurity(), dur_s)))
            print(f"round {r + 1}: mutual TLS + ACL (signed, topic and group checks)", flush=True)
            keys, user, admin = _secure_setup(base / f"secure{r}")
            with _cluster(base / f"secure{r}", keys) as ns:
                _best(secure, asyncio.run(_run(ns, admin, user, dur_s)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\nCPU per small RPC, client + server in one process (best of the rounds)", flush=True)
    cpu_base = Path(tempfile.mkdtemp(prefix="rocketq-seccpu-"))
    try:
        cpu = cpu_per_call(cpu_base, 2000 if args.quick else 6000, args.rounds)
    finally:
        shutil.rmtree(cpu_base, ignore_errors=True)
    for name, us in cpu.items():
        print(f"  {name:<8} {us:6.0f} us  (plain / this = {cpu['plain'] / us:.2f})")
    print("\nTLS + ACL vs plaintext, throughput (goal: ratio >= 0.9)")
    for name, value in plain.items():
        ratio = secure[name] / value if value else 0.0
        verdict = "met" if ratio >= 0.9 else "NOT met"
        print(f"  {name:<26} plain {value:>9.0f}  tls+acl {secure[name]:>9.0f}  "
              f"ratio {ratio:.2f} ({verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
