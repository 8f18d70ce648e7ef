"""TLS on every gRPC port against real processes (issue 20, DESIGN.md §11).

One cluster for the module, every process serving mutual TLS (``tlsClientAuth=require``) with
certificates from a CA this module makes: a nameserver, a master, its slave (replication over
TLS) and a timer wheel (which consumes from and re-puts to the broker over TLS). The services'
own calls use their server certificate as client certificate.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc
from rocketq.client.admin import Admin
from rocketq.client.consumer import ConsumeFromWhere, LitePullConsumer, LitePullConsumerConfig
from rocketq.client.errors import NameServerUnavailableError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.client.security import ClientSecurity
from rocketq.client.timer import TimerClient
from rocketq.message import Message
from services.common.launch import set_flags
from services.common.security.certs import Leaf, TestCA
from tests.integration.cluster import (
    ServiceProcess,
    start_broker,
    start_nameserver,
    start_slave,
    start_timer_wheel,
)
from tests.support.cluster import stop_all
from tests.support.until import until

pytestmark = pytest.mark.integration


@dataclass
class Env:
    root: Path
    ca: TestCA
    server: Leaf
    client: ClientSecurity
    ns: ServiceProcess
    broker: ServiceProcess
    slave: ServiceProcess
    timer: ServiceProcess

    @property
    def namesrv(self) -> list[str]:
        return [self.ns.addr]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("tls")
    ca = TestCA(root / "pki")
    server, client = ca.issue("server"), ca.issue("client")
    keys = {
        "tlsCertFile": server.cert_file,
        "tlsKeyFile": server.key_file,
        "tlsCaFile": ca.ca_file,
        "tlsClientAuth": "require",
    }
    procs: list[ServiceProcess] = []
    try:
        procs.append(start_nameserver(root, *set_flags(keys)))
        ns = procs[0].addr
        procs.append(start_broker(root, [ns], "broker-a", None, **keys))
        procs.append(start_slave(root, [ns], "broker-a", 1, None, **keys))
        procs.append(start_timer_wheel(root, [ns], "timer-0", None, timerPrecisionMs=100, **keys))
        sec = ClientSecurity(str(ca.ca_file), str(client.cert_file), str(client.key_file))
        yield Env(root, ca, server, sec, *procs)
    finally:
        stop_all(list(reversed(procs)))


async def _make_topic(env: Env, topic: str) -> None:
    async with Admin(env.namesrv, security=env.client) as admin:
        await admin.create_topic(topic)

        async def routed() -> bool:
            try:
                return bool((await admin.route(topic)).queues)
            except Exception:
                return False

        await until(routed, f"a route for {topic}", 15)


async def _max_offsets(env: Env, addr: str, topic: str) -> list[int]:
    ca, key, cert = env.client.read_tls_files()
    creds = grpc.ssl_channel_credentials(ca, key, cert)
    async with grpc.aio.secure_channel(addr, creds) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        out = []
        for q in range(4):
            resp = await stub.GetMaxOffset(
                messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=q)
            )
            out.append(resp.offset)
        return out


async def test_mutual_tls_round_trip_through_every_port(env: Env) -> None:
    await _make_topic(env, "tls-orders")
    async with Producer(ProducerConfig("pg-tls", env.namesrv, security=env.client)) as producer:
        for i in range(4):
            await producer.send(Message("tls-orders", f"now{i}".encode()))
        await producer.send(Message("tls-orders", b"later", delay_level=1))
    cfg = LitePullConsumerConfig(
        "g-tls",
        tuple(env.namesrv),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        security=env.client,
    )
    consumer = LitePullConsumer(cfg)
    consumer.subscribe("tls-orders", "*")
    await consumer.start()
    got: list[str] = []
    try:

        async def all_polled() -> bool:
            got.extend(m.body.decode() for m in await consumer.poll(200))
            return len(got) >= 5

        # "later" came back through the timer wheel's TLS consumer and producer
        await until(all_polled, "four messages and the delayed one", 30)
    finally:
        await consumer.close()
    assert sorted(got) == ["later", "now0", "now1", "now2", "now3"]
    async with TimerClient(env.timer.addr, security=env.client) as timers:
        assert (await timers.stats()).delivered_total >= 1
    master = await _max_offsets(env, env.broker.addr, "tls-orders")

    async def replicated() -> bool:
        return await _max_offsets(env, env.slave.addr, "tls-orders") == master

    await until(replicated, "the slave caught up over TLS", 15)
    # The bytes themselves went over the data socket, in TLS like the gRPC port: the slave
    # never fell back to the stream.
    assert _data_addr(env)
    assert "is not reachable" not in env.slave.log_path.read_text()


def _data_addr(env: Env) -> str:
    """The master's replication data socket, from its log (TLS, like its gRPC port)."""
    found = re.search(
        r"replication data socket on (\S+:\d+) \(TLS\)", env.broker.log_path.read_text()
    )
    assert found, "the TLS master opened no TLS data socket"
    return found.group(1)


def _data_socket_answer(env: Env, ctx: ssl.SSLContext | None) -> bytes:
    """What the data socket sends back to a client that connects (in TLS with ``ctx``, else
    plain) and sends a token it was never given, until the master closes the connection."""
    host, port = _data_addr(env).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        if ctx is None:
            raw.sendall(bytes(16))
            return raw.recv(1024)
        try:
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(bytes(16))
                return tls.recv(1024)
        except (ssl.SSLError, OSError):
            return b""  # the handshake failed, or the master closed at once


async def test_the_data_socket_takes_only_mutual_tls_and_a_token(env: Env) -> None:
    ctx = ssl.create_default_context(cafile=str(env.ca.ca_file))
    no_cert = _data_socket_answer(env, ctx)
    ctx.load_cert_chain(env.client.tls_cert_file, env.client.tls_key_file)
    assert _data_socket_answer(env, None) == b""  # plaintext: the handshake never completes
    assert no_cert == b""  # no client certificate, where mutual TLS is required
    assert _data_socket_answer(env, ctx) == b""  # in TLS, but an unknown token: closed
    assert "sent an unknown token" in env.broker.log_path.read_text()


async def test_plaintext_and_certless_clients_are_refused_with_a_clear_error(env: Env) -> None:
    async with Admin(env.namesrv, security=ClientSecurity(), timeout_ms=2000) as admin:
        with pytest.raises(NameServerUnavailableError) as caught:
            await admin.cluster_info()
    assert "if it serves TLS, give the client its CA" in str(caught.value)
    # TLS without a client certificate, where mutual TLS is required
    no_cert = ClientSecurity(tls_ca_file=str(env.ca.ca_file))
    async with Admin(env.namesrv, security=no_cert, timeout_ms=2000) as admin:
        with pytest.raises(NameServerUnavailableError):
            await admin.cluster_info()
    # a CA that did not sign the server's certificate
    other = TestCA(env.root / "other-pki")
    async with Admin(
        env.namesrv, security=ClientSecurity(str(other.ca_file)), timeout_ms=2000
    ) as admin:
        with pytest.raises(NameServerUnavailableError):
            await admin.cluster_info()


def _served_serial(env: Env, addr: str) -> int:
    """The serial of the certificate a new TLS connection to ``addr`` is shown."""
    ctx = ssl.create_default_context(cafile=str(env.ca.ca_file))
    ctx.load_cert_chain(env.client.tls_cert_file, env.client.tls_key_file)
    ctx.set_alpn_protocols(["h2"])
    host, port = addr.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_certificate_rotation_under_traffic(env: Env) -> None:
    await _make_topic(env, "tls-rotate")
    before = _served_serial(env, env.broker.addr)
    before_data = _served_serial(env, _data_addr(env))
    sent = 0
    stop = asyncio.Event()

    async def traffic() -> None:
        nonlocal sent
        async with Producer(ProducerConfig("pg-rot", env.namesrv, security=env.client)) as p:
            while not stop.is_set():
                await p.send(Message("tls-rotate", b"x"))
                sent += 1
                await asyncio.sleep(0.01)

    task = asyncio.create_task(traffic())
    try:
        await until(lambda: sent >= 10, "traffic flowing before the rotation", 15)
        rotated = env.ca.issue("server")  # same files, new key and certificate
        assert rotated.cert_file == env.server.cert_file
        await until(
            lambda: _served_serial(env, env.broker.addr) != before,
            "new connections shown the new certificate",
            10,
        )
        # The replication data socket follows the same files.
        await until(
            lambda: _served_serial(env, _data_addr(env)) != before_data,
            "new data socket connections shown the new certificate",
            10,
        )
        at_rotation = sent
        await until(lambda: sent >= at_rotation + 10, "traffic still flowing after it", 15)
    finally:
        stop.set()
        await task  # a failed send would raise here
    # a client connecting now (new channels) still completes the handshake
    async with Admin(env.namesrv, security=env.client) as admin:
        assert "broker-a" in (await admin.cluster_info()).brokers
