"""The fault-injection proxy the replication tests put between a slave and its master, on its
own (tests/integration/workers/tcp_proxy.py): it forwards bytes both ways, ``cut`` resets
every connection and refuses new ones, ``blackhole`` stalls them without a reset, ``heal``
restores the path (stalled bytes arrive), and a gRPC channel through it sees exactly that.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc
from tests.integration.cluster import start_nameserver
from tests.integration.workers.tcp_proxy import start_proxy
from tests.support.until import until_sync

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """A loopback echo server in a thread; yields its "host:port"."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.2)
    stop = threading.Event()

    def echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{lsock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        lsock.close()


def dial(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(5)
    return sock


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        part = sock.recv(65536)
        if not part:
            break
        got += part
    return got


def is_reset(sock: socket.socket) -> bool:
    """True when the connection is dead: a reset, or an end of stream, within 5 s."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except OSError:
        return True


def dial_is_reset(addr: str) -> bool:
    """True when a new connection is reset. The proxy accepts, then resets; on loopback the reset
    can arrive before connect() has polled its outcome, so connect() itself may report it."""
    try:
        sock = dial(addr)
    except ConnectionResetError:
        return True
    with sock:
        return is_reset(sock)


def test_forward_cut_heal_and_blackhole(tmp_path: Path) -> None:
    with echo_server() as target:
        proxy, ctl = start_proxy(tmp_path, target)
        try:
            a = dial(proxy.addr)
            payload = bytes(range(256)) * 1000  # 256 KB: several pump steps each way
            assert roundtrip(a, payload) == payload
            assert ctl.stats()["open"] == 1

            reply = ctl.cut()
            assert reply["mode"] == "cut" and reply["open"] == 0
            assert is_reset(a), "an open connection survived the cut"
            assert dial_is_reset(proxy.addr), "a new connection went through a cut"
            assert int(str(ctl.stats()["refused"])) >= 1

            ctl.heal()
            c = dial(proxy.addr)
            assert roundtrip(c, b"after heal") == b"after heal"

            ctl.blackhole()
            c.sendall(b"held")
            c.settimeout(0.5)
            with pytest.raises(TimeoutError):
                c.recv(16)  # no byte moves, and no reset either
            d = dial(proxy.addr)  # accepted, held unconnected
            d.sendall(b"late")
            c.settimeout(5)
            ctl.heal()
            assert c.recv(16) == b"held"  # what was in flight arrives once healed
            assert d.recv(16) == b"late"
            for s in (a, c, d):
                s.close()
        finally:
            assert proxy.stop() == 0


def test_grpc_through_proxy_sees_cut_and_retarget(tmp_path: Path) -> None:
    ns1 = start_nameserver(tmp_path, name="ns1")
    ns2 = start_nameserver(tmp_path, name="ns2")
    proxy, ctl = start_proxy(tmp_path, ns1.addr)
    try:
        with grpc.insecure_channel(proxy.addr) as ch:
            stub = nameserver_pb2_grpc.NameServerStub(ch)
            stub.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), timeout=5)
            ctl.cut()
            with pytest.raises(grpc.RpcError) as err:
                stub.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), timeout=2)
            assert err.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            ctl.retarget(ns2.addr)
            ctl.heal()

            def call_goes_through() -> bool:
                try:
                    stub.GetClusterInfo(
                        nameserver_pb2.GetClusterInfoRequest(), timeout=2, wait_for_ready=True
                    )
                except grpc.RpcError:
                    return False
                return True

            # The channel reconnects with its own backoff.
            until_sync(call_goes_through, "a call through the healed proxy", 10, 0)
        ns1.kill()
        with grpc.insecure_channel(proxy.addr) as ch:  # now forwarding to ns2
            nameserver_pb2_grpc.NameServerStub(ch).GetClusterInfo(
                nameserver_pb2.GetClusterInfoRequest(), timeout=5
            )
    finally:
        proxy.stop()
        ns2.stop()
        ns1.kill()
