"""The driver's way into the lab: loopback TCP forwarders whose far end lives in a namespace.

When the cluster runs in network namespaces (:mod:`~tests.robustness.chaos.netns`), nothing is
reachable from the host's namespace, where the driver runs - by design, the lab adds nothing
there. Yet the driver must ask brokers who leads, create topics and read queues back. A
:class:`Gateway` listens on ``127.0.0.1:<port 0>`` for each remote address it is asked about and
forwards every accepted connection to that address *from inside* a lab node's namespace: the
thread that dials first joins the namespace with ``setns(2)`` (per thread, through libc), opens
the socket - a socket belongs to the namespace it was created in, for good - and goes back.

    gw = Gateway(lab.namespace("driver"))
    with grpc.insecure_channel(gw.local("10.77.0.5:41234")) as ch: ...

Connections are piped by one thread each (select over both sockets); :meth:`Gateway.close`
stops the listeners and closes every connection. The driver's node must not be partitioned.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import socket
import threading

log = logging.getLogger("chaos.gateway")

CLONE_NEWNET = 0x40000000
DIAL_TIMEOUT_S = 5.0
PIPE_CHUNK_BYTES = 64 * 1024
CONNECTIONS_MAX = 256

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def dial_in(netns: str, host: str, port: int) -> socket.socket:
    """A TCP connection to ``host:port`` made from inside network namespace ``netns``."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(own)  # back at once: only the socket stays in the namespace
        sock.settimeout(DIAL_TIMEOUT_S)
        sock.connect((host, port))
        sock.settimeout(None)
        return sock
    finally:
        os.close(own)
        os.close(target)


class Gateway:
    """Loopback forwarders into the lab namespace ``netns`` (see the module doc)."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self._local: dict[str, str] = {}
        self._listeners: list[socket.socket] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def local(self, remote: str) -> str:
        """The loopback ``host:port`` that reaches ``remote`` (``ip:port`` in the lab)."""
        with self._lock:
            if remote in self._local:
                return self._local[remote]
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(16)
            self._listeners.append(listener)
            addr = f"127.0.0.1:{listener.getsockname()[1]}"
            self._local[remote] = addr
        threading.Thread(
            target=self._accept, args=(listener, remote), daemon=True, name=f"gw-{remote}"
        ).start()
        return addr

    def _accept(self, listener: socket.socket, remote: str) -> None:
        host, port = remote.rsplit(":", 1)
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(client, host, int(port)), daemon=True
            ).start()

    def _serve(self, client: socket.socket, host: str, port: int) -> None:
        try:
            upstream = dial_in(self.netns, host, port)
        except OSError as exc:
            log.debug("gateway: cannot reach %s:%d: %s", host, port, exc)
            client.close()
            return
        with self._lock:
            if self._closed or len(self._conns) >= CONNECTIONS_MAX:
                client.close()
                upstream.close()
                return
            self._conns.update((client, upstream))
        try:
            _pipe(client, upstream)
        finally:
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(upstream)
            client.close()
            upstream.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = [*self._listeners, *self._conns]
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side closes."""
    peer = {a: b, b: a}
    while True:
        try:
            ready, _, _ = select.select([a, b], [], [], 1.0)
        except (OSError, ValueError):
            return
        for s in ready:
            try:
                data = s.recv(PIPE_CHUNK_BYTES)
            except OSError:
                return
            if not data:
                return
            try:
                peer[s].sendall(data)
            except OSError:
                return
