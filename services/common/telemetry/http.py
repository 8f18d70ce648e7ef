"""The Prometheus endpoint: ``GET /metrics`` on the service's own event loop.

Why not prometheus_client's ``start_http_server``: it serves from a thread, and a scrape runs
every observable callback (consumer lag, replication, timer backlog) in that thread while the
event loop changes the very dicts they read. Served here, a scrape is one more task on the loop:
callbacks see a consistent state and need no locks. A scrape of a broker with a few hundred
queues takes a few milliseconds of loop time; Prometheus scrapes every 15 s or so.

Limits: a request head of at most :data:`REQUEST_HEAD_MAX_BYTES`, read within
:data:`READ_TIMEOUT_S`; one request per connection (``Connection: close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

REQUEST_HEAD_MAX_BYTES = 8192
READ_TIMEOUT_S = 5.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsHttpServer:
    """Answers ``GET /metrics`` (and ``/``) with ``render()``; 404 elsewhere, 405 for non-GET."""

    def __init__(self, render: Callable[[], bytes], host: str, port: int) -> None:
        self._render = render
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port (OSError naming the address if taken)."""
        try:
            self._server = await asyncio.start_server(
                self._handle, self.host, self.port, limit=REQUEST_HEAD_MAX_BYTES
            )
        except OSError as exc:
            raise OSError(
                f"metrics endpoint cannot listen on {self.host}:{self.port}: {exc}"
            ) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            status, body, ctype = self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, body, ctype = "400 Bad Request", b"bad request\n", "text/plain"
        except ConnectionError:
            writer.close()
            return
        except Exception:  # a failing callback must not take the endpoint down
            log.exception("rendering /metrics failed")
            status, body, ctype = "500 Internal Server Error", b"metrics failed\n", "text/plain"
        head_out = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            writer.write(head_out.encode() + body)
            await writer.drain()
        writer.close()

    def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        if len(head) > REQUEST_HEAD_MAX_BYTES:
            return "431 Request Header Fields Too Large", b"request head too large\n", "text/plain"
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method != b"GET":
            return "405 Method Not Allowed", b"use GET /metrics\n", "text/plain"
        if path not in (b"/metrics", b"/"):
            return "404 Not Found", b"metrics are at /metrics\n", "text/plain"
        return "200 OK", self._render(), CONTENT_TYPE
