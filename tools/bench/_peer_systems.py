"""The systems tools/bench/peers.py compares: how each is installed, started and driven.

Every system gets the same three phases (see peers.py). Each driver keeps the same amount of
work in flight while producing (1 024 messages: Redis pipelines of 1 024, NATS and RabbitMQ
1 024 outstanding publishes, RocketQ 8 batches of 128) and reads the backlog with its client's
bulk read (XREAD COUNT, JetStream pull fetch, an AMQP consumer with auto-ack, a PushConsumer).
Peer servers are Debian's packages, started on 127.0.0.1 with fresh data directories through
the shared supervisor, so they are stopped by pid like RocketQ's own processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketq.cli._bench import ensure_topic
from rocketq.client.consumer import (
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message
from services.common import launch, supervisor
from services.common.supervisor import Process

IN_FLIGHT_MSGS = 1024
"""Messages outstanding while producing, for every system."""
ROCKETQ_BATCH = 128
DRAIN_READ_MAX = 1024
"""Messages per bulk read while draining."""
APT_LOCK_TIMEOUT_S = 600
"""apt-get waits this long for another apt-get (the machine is shared) before giving up."""
PORT_WAIT_S = 60.0

PEER_PACKAGES = {"redis-server": "redis-server", "nats-server": "nats-server"}
RABBIT_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
"""Debian's script without the root -> rabbitmq user wrapper of /usr/sbin (we run our own
node, as ourselves, in a temporary directory)."""


def ensure_installed() -> None:
    """Install Debian's redis-server, nats-server and rabbitmq-server when missing."""
    missing = [pkg for cmd, pkg in PEER_PACKAGES.items() if shutil.which(cmd) is None]
    if not RABBIT_SERVER.exists():
        missing.append("rabbitmq-server")
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise SystemExit(f"missing {', '.join(missing)} and no apt-get: install them first")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print(f"installing Debian packages: {' '.join(missing)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"
    subprocess.run([*sudo, "apt-get", "-o", lock, "update", "-qq"], check=True, env=env)
    subprocess.run(
        [*sudo, "apt-get", "-o", lock, "install", "-y", "-qq", "--no-install-recommends", *missing],
        check=True,
        env=env,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> Callable[[Process], str | None]:
    def ready(sp: Process) -> str | None:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return f"127.0.0.1:{port}"
        return None

    return ready


def start_peer(
    name: str, argv: list[str], workdir: Path, port: int, env: dict[str, str] | None = None
) -> Process:
    """A peer server in its own session (so its helpers can be stopped with it), ready once
    ``port`` accepts connections."""
    return supervisor.launch(
        name, argv, workdir, _port_open(port), env=env, new_session=True, timeout_s=PORT_WAIT_S
    )


def stop(processes: list[Process]) -> None:
    """Stop what we started, newest first: SIGTERM to its pid, then its process group (the
    session the supervisor gave it) is killed if a helper of it is still there."""
    for sp in reversed(processes):
        with contextlib.suppress(supervisor.StopTimeout):
            sp.stop()
        if sp.new_session:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sp.pid, signal.SIGKILL)


# ---- one system under test ------------------------------------------------------------------
class Clock:
    """When a drain read its first message, and when it stopped."""

    def __init__(self) -> None:
        self.first_s: float | None = None
        self.end_s: float | None = None

    def first(self) -> None:
        if self.first_s is None:
            self.first_s = time.monotonic()

    def done(self) -> None:
        if self.end_s is None:
            self.end_s = time.monotonic()

    def seconds(self) -> float:
        self.done()
        assert self.end_s is not None
        return self.end_s - self.first_s if self.first_s is not None else 0.0


@dataclass
class Phases:
    """Figures of one system, filled by peers.py."""

    name: str
    produce_tps: float = 0.0
    consume_tps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    produced: int = 0
    consumed: int = 0
    note: str = ""


@dataclass
class Driver:
    """How to drive one started system: produce for a while, drain, send one at a time."""

    name: str
    peer: bool
    produce: Callable[[bytes, float], Awaitable[int]]
    """(body, seconds) -> messages acknowledged."""
    drain: Callable[[int, float, Clock], Awaitable[int]]
    """(count, time limit s, clock) -> messages read (stops at count); calls the clock's
    ``first()`` when the first message arrives (consumer start-up is not counted)."""
    send_one: Callable[[bytes], Awaitable[None]]
    close: Callable[[], Awaitable[None]]
    processes: list[Process] = field(default_factory=list)


# ---- Redis Streams --------------------------------------------------------------------------
async def redis_driver(root: Path, fsync: str) -> Driver:
    import redis.asyncio as aioredis  # noqa: PLC0415 (the [bench] extra: only when run)

    port = free_port()
    data = root / f"redis-{fsync}"
    argv = [
        "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data),
        "--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no",
    ]  # fmt: skip
    sp = start_peer(f"redis-{fsync}", argv, data, port)
    r = aioredis.Redis(host="127.0.0.1", port=port)
    stream = "bench"

    async def produce(body: bytes, seconds: float) -> int:
        deadline, n = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            pipe = r.pipeline(transaction=False)
            for _ in range(IN_FLIGHT_MSGS):
                pipe.xadd(stream, {"b": body})
            n += len(await pipe.execute())
        return n

    async def drain(count: int, limit_s: float, clock: Clock) -> int:
        deadline, n, last = time.monotonic() + limit_s, 0, b"0-0"
        while n < count and time.monotonic() < deadline:
            got: Any = await r.xread({stream: last}, count=DRAIN_READ_MAX)
            if not got:
                break
            clock.first()
            entries = got[0][1]
            n += len(entries)
            last = entries[-1][0]
        return n

    async def send_one(body: bytes) -> None:
        await r.xadd(stream, {"b": body})

    async def close() -> None:
        await r.aclose()

    return Driver(f"Redis Streams, AOF {fsync}", True, produce, drain, send_one, close, [sp])


# ---- NATS JetStream -------------------------------------------------------------------------
async def nats_driver(root: Path) -> Driver:
    import nats  # noqa: PLC0415 (the [bench] extra)
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType  # noqa: PLC0415

    port = free_port()
    data = root / "nats"
    argv = ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data)]
    sp = start_peer("nats", argv, data, port)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="BENCH", subjects=["bench"], storage=StorageType.FILE)

    async def produce(body: bytes, seconds: float) -> int:
        deadline, n = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            acks = await asyncio.gather(*(js.publish("bench", body) for _ in range(IN_FLIGHT_MSGS)))
            n += len(acks)
        return n

    async def drain(count: int, limit_s: float, clock: Clock) -> int:
        config = ConsumerConfig(ack_policy=AckPolicy.NONE)
        psub = await js.pull_subscribe("bench", durable="drain", config=config)
        deadline, n = time.monotonic() + limit_s, 0
        while n < count and time.monotonic() < deadline:
            try:
                msgs = await psub.fetch(min(DRAIN_READ_MAX, count - n), timeout=5)
            except nats.errors.TimeoutError:
                break
            clock.first()
            n += len(msgs)
        await psub.unsubscribe()
        return n

    async def send_one(body: bytes) -> None:
        await js.publish("bench", body)

    async def close() -> None:
        await nc.drain()

    return Driver("NATS JetStream, file store", True, produce, drain, send_one, close, [sp])


# ---- RabbitMQ -------------------------------------------------------------------------------
async def rabbit_driver(root: Path) -> Driver:
    import aio_pika  # noqa: PLC0415 (the [bench] extra)

    data = root / "rabbitmq"
    data.mkdir(parents=True, exist_ok=True)
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    (data / "enabled_plugins").write_text("[].\n")
    env = {
        "HOME": str(data),  # the Erlang cookie
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODENAME": f"rocketqbench{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(data / "mnesia"),
        "RABBITMQ_LOG_BASE": str(data / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(data / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(data / "rabbitmq"),  # none: defaults
    }
    epmd = start_peer(
        "epmd", ["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)], data, epmd_port
    )
    try:
        sp = start_peer("rabbitmq", [str(RABBIT_SERVER)], data, port, env=env)
    except supervisor.SpawnError:
        stop([epmd])
        raise
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    pub = await conn.channel(publisher_confirms=True)
    queue = await pub.declare_queue("bench", durable=True)

    def message(body: bytes) -> Any:
        return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    async def produce(body: bytes, seconds: float) -> int:
        deadline, n = time.monotonic() + seconds, 0
        x = pub.default_exchange
        while time.monotonic() < deadline:
            sends = (x.publish(message(body), routing_key="bench") for _ in range(IN_FLIGHT_MSGS))
            n += len(await asyncio.gather(*sends))
        return n

    async def drain(count: int, limit_s: float, clock: Clock) -> int:
        ch = await conn.channel()
        q = await ch.get_queue("bench")
        done = asyncio.Event()
        n = 0

        def on_message(_msg: Any) -> None:
            nonlocal n
            if not n:
                clock.first()
            n += 1
            if n >= count:
                clock.done()
                done.set()

        tag = await q.consume(on_message, no_ack=True)  # type: ignore[arg-type]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), limit_s)
        await q.cancel(tag)
        await ch.close()
        return n

    async def send_one(body: bytes) -> None:
        await pub.default_exchange.publish(message(body), routing_key="bench")

    async def close() -> None:
        await conn.close()

    del queue
    name = "RabbitMQ, durable queue, confirms"
    return Driver(name, True, produce, drain, send_one, close, [epmd, sp])


# ---- RocketQ --------------------------------------------------------------------------------
async def rocketq_driver(root: Path, flush: str) -> Driver:
    base = root / f"rocketq-{flush}"
    ns = launch.start_nameserver(base)
    try:
        broker = launch.start_broker(base, [ns.addr], keys={"flushDiskType": flush})
    except supervisor.SpawnError:
        stop([ns])
        raise
    namesrv = (ns.addr,)
    topic = "BenchPeers"
    await ensure_topic(namesrv, topic, 8)
    producer = Producer(ProducerConfig("bench-peers", namesrv))
    await producer.start()

    async def produce(body: bytes, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        counts = [0]

        async def worker() -> None:
            while time.monotonic() < deadline:
                batch = [Message(topic, body, tags="bench") for _ in range(ROCKETQ_BATCH)]
                results = await producer.send_batch(batch)
                counts[0] += len(results)  # after the await: `+=` would read the count first

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT_MSGS // ROCKETQ_BATCH)))
        return counts[0]

    async def drain(count: int, limit_s: float, clock: Clock) -> int:
        done = asyncio.Event()
        n = 0

        async def listener(msgs: list[Any], _ctx: Any) -> ConsumeResult:
            nonlocal n
            clock.first()
            n += len(msgs)
            if n >= count:
                clock.done()
                done.set()
            return ConsumeResult.CONSUME_SUCCESS

        config = PushConsumerConfig(
            "bench-peers-drain",
            namesrv,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        consumer = PushConsumer(config, listener)
        consumer.subscribe(topic)
        async with consumer:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), limit_s)
        return n

    async def send_one(body: bytes) -> None:
        await producer.send(Message(topic, body, tags="bench"))

    async def close() -> None:
        await producer.close()

    return Driver(f"RocketQ, {flush}", False, produce, drain, send_one, close, [ns, broker])
