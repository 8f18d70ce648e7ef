"""A TCP proxy process a test controls, to cut the network between two RocketQ processes.

    python -m tests.integration.workers.tcp_proxy --listen 127.0.0.1:0 --target HOST:PORT \
        --ready-file F

It forwards every connection made to its listen address to the target, byte for byte, and
serves a line protocol on a second loopback port (the control port) so a test can break that
path on purpose. Once both ports are bound it writes ``{"addr", "pid", "control"}`` to the
ready file atomically, like the services; SIGTERM/SIGINT stop it (exit 0).

| command         | effect                                                                  |
|-----------------|-------------------------------------------------------------------------|
| ``cut``         | reset every open connection and reset new ones at once (peer down)     |
| ``blackhole``   | keep connections open but move no byte in either direction; new ones    |
|                 | are accepted and held (a partition: peers notice only by their timeouts)|
| ``heal``        | forward again; connections held by a blackhole resume where they stood |
| ``target H:P``  | forward new connections to another address (a restarted peer)           |
| ``stats``       | nothing changes                                                         |

Every command answers one JSON line ``{"ok": true, "mode", "open", "accepted", "refused"}``
once it has taken effect (after ``cut`` no forwarded connection is left open), so the test
never races the proxy. :class:`ProxyControl` is the test side of that protocol and
:func:`start_proxy` starts the process through tests/integration/cluster.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.integration.cluster import ServiceProcess

READ_CHUNK_BYTES = 64 * 1024
"""Largest read per pump step; the proxy holds at most this per direction per connection."""
CONTROL_LINE_MAX_BYTES = 1024
"""Longest control command accepted."""
CONNECTIONS_MAX = 256
"""Open forwarded connections at once; beyond it new ones are reset (tests open a handful)."""

MODES = ("forward", "blackhole", "cut")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a dead peer's kernel would answer: the other side sees
    a reset at once instead of a clean end of stream."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    """The forwarding state: one mode for every connection, a set of live connection tasks."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.mode = "forward"
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.accepted = 0
        self.refused = 0
        self._conns: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}

    def stats(self) -> dict[str, object]:
        return {
            "ok": True,
            "mode": self.mode,
            "target": self.target,
            "open": len(self._conns),
            "accepted": self.accepted,
            "refused": self.refused,
        }

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "cut" or len(self._conns) >= CONNECTIONS_MAX:
            self.refused += 1
            _reset(writer)
            return
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        writers = [writer]
        self._conns[task] = writers
        try:
            await self.flowing.wait()  # a blackhole holds new connections unconnected
            host, port = self.target.rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                _reset(writer)  # the target is down: so is the path through us
                return
            writers.append(up_writer)
            pumps = [
                asyncio.create_task(self._pump(reader, up_writer)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            try:
                # One side ending ends the connection as a whole (gRPC never half-closes).
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (asyncio.CancelledError, OSError):
            pass
        finally:
            for w in writers:
                _reset(w)
            self._conns.pop(task, None)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while True:
                await self.flowing.wait()
                data = await reader.read(READ_CHUNK_BYTES)
                if not data:
                    return
                # Bytes read just before a blackhole are held, like packets already in flight.
                await self.flowing.wait()
                writer.write(data)
                await writer.drain()

    async def command(self, line: str) -> dict[str, object]:
        word, _, arg = line.strip().partition(" ")
        if word == "cut":
            self.mode = "cut"
            self.flowing.set()
            tasks = list(self._conns)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        elif word == "blackhole":
            self.mode = "blackhole"
            self.flowing.clear()
        elif word == "heal":
            self.mode = "forward"
            self.flowing.set()
        elif word == "target" and arg:
            self.target = arg.strip()
        elif word != "stats":
            return {"ok": False, "error": f"unknown command {line.strip()!r}"}
        return self.stats()

    async def on_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                if len(line) > CONTROL_LINE_MAX_BYTES:
                    reply: dict[str, object] = {"ok": False, "error": "line too long"}
                else:
                    reply = await self.command(line.decode(errors="replace"))
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (OSError, ValueError):
            pass
        finally:
            writer.close()


def _write_ready(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


async def serve(listen: str, target: str, ready_file: Path) -> None:
    proxy = Proxy(target)
    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(proxy.on_client, host, int(port))
    control = await asyncio.start_server(proxy.on_control, host, 0)
    addr = server.sockets[0].getsockname()
    ctl = control.sockets[0].getsockname()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _write_ready(
        ready_file,
        {"addr": f"{addr[0]}:{addr[1]}", "pid": os.getpid(), "control": f"{ctl[0]}:{ctl[1]}"},
    )
    print(f"tcp_proxy {addr[0]}:{addr[1]} -> {target}", file=sys.stderr, flush=True)
    await stop.wait()
    server.close()
    control.close()
    await proxy.command("cut")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.target, args.ready_file))
    return 0


# ---- test side -------------------------------------------------------------------------------


class ProxyControl:
    """Blocking client of the control port; each call returns once the proxy has applied it."""

    def __init__(self, addr: str, timeout_s: float = 10.0) -> None:
        self.addr = addr
        self.timeout_s = timeout_s

    def command(self, line: str) -> dict[str, object]:
        host, port = self.addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=self.timeout_s) as sock:
            sock.sendall(line.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                part = sock.recv(4096)
                if not part:
                    break
                data += part
        reply: dict[str, object] = json.loads(data)
        if not reply.get("ok"):
            raise AssertionError(f"proxy refused {line!r}: {reply}")
        return reply

    def cut(self) -> dict[str, object]:
        return self.command("cut")

    def blackhole(self) -> dict[str, object]:
        return self.command("blackhole")

    def heal(self) -> dict[str, object]:
        return self.command("heal")

    def retarget(self, target: str) -> dict[str, object]:
        return self.command(f"target {target}")

    def stats(self) -> dict[str, object]:
        return self.command("stats")


def start_proxy(
    tmp_path: Path, target: str, name: str = "proxy", listen: str = "127.0.0.1:0"
) -> tuple[ServiceProcess, ProxyControl]:
    """Start a proxy to ``target``, listening on ``listen``; its ``.addr`` is where peers
    should dial instead."""
    from tests.integration.cluster import spawn

    workdir = tmp_path / name
    args = ["--target", target, "--listen", listen]
    sp = spawn(name, "tests.integration.workers.tcp_proxy", args, workdir, env=None)
    ready = json.loads((workdir / f"{name}.ready").read_text())
    return sp, ProxyControl(str(ready["control"]))


if __name__ == "__main__":
    sys.exit(main())
