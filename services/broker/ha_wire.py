"""The replication data socket: chunks, confirm offsets and acks without a gRPC message each.

A ``Replication.Stream`` message costs each broker a gRPC write or read, ~150 µs of CPU on a
small machine, and its bytes ~1 µs per KiB more; under a saturating SYNC_MASTER load that was
a third of a slave's CPU. RocketMQ moves its replicated bytes over a plain TCP connection of its
own (HAService, haListenPort); RocketQ does too, but keeps the gRPC stream for what it does well:
the hello is checked, ACL-guarded and answered there with the statuses replication.proto lists,
and the stream's status still says why replication ended. The socket carries only the data::

    slave                                   master
      ── Stream: SlaveHello(accepts_data_socket) ──▶
      ◀── Stream: TruncateTo(data_port, data_token) ──
      ── connect to data_port, send data_token ──▶      (DataListener hands the socket over)
      ◀── frames: chunk / confirm ──
      ── acks ──▶
      ... either side closes the socket; the Stream then ends with the master's status

When the gRPC port runs TLS the socket does too, with the same files (re-read on a rotation,
as the gRPC port does) and the same client-certificate rule; the slave connects with the trust
and certificate of its own channels. ``haListenPort`` -1 turns the socket off, and a slave
offers to take it unless ``haDataSocket=false``; otherwise the data stays on the stream.

Layouts, big-endian:

| frame                  | direction      | fields (bytes)                                        |
|------------------------|----------------|-------------------------------------------------------|
| token                  | slave → master | data_token (16), once, first                          |
| chunk or confirm       | master → slave | kind (1), physical_offset (8), data length (4),       |
|                        |                | ack_pace_ms (4), confirm_offset (8), config_version   |
|                        |                | (8), then the data                                    |
| ack                    | slave → master | max_physical_offset (8), flushed_offset (8)           |

``kind`` is :data:`CHUNK` (data follows; confirm_offset -1 when no confirm rides with it) or
:data:`CONFIRM` (length 0). Field meanings are those of replication.proto's CommitLogChunk,
ConfirmOffset and SlaveAck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable

log = logging.getLogger(__name__)

CHUNK_BYTES_MAX = 1024 * 1024
"""The proto's limit for one CommitLogChunk (on the stream or the socket)."""
TOKEN_BYTES = 16
FRAME = struct.Struct(">BqIIqq")
"""kind, physical_offset, data length, ack_pace_ms, confirm_offset, config_version."""
ACK = struct.Struct(">qq")
"""max_physical_offset, flushed_offset."""
CHUNK = 1
CONFIRM = 2
NO_CONFIRM = -1
"""A chunk's confirm_offset when no ConfirmOffset rides with it."""
TOKEN_WAIT_S = 10.0
"""How long a new connection has to send its token (a master waits haHousekeepingInterval for
its slave's connection after TruncateTo)."""
READ_ROOM_BYTES = 256 * 1024
"""What a slave's :class:`FrameReader` offers the transport beyond one whole frame."""

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def no_delay(end: asyncio.StreamWriter | asyncio.BaseTransport) -> None:
    """Acks and lone chunks are small: send them at once (no Nagle)."""
    sock = end.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close()


class FrameError(Exception):
    """A frame that breaks the layout above (the slave reconnects)."""


FrameHandler = Callable[[int, int, memoryview, int, int, int], None]
"""kind, physical_offset, data, ack_pace_ms, confirm_offset, config_version. ``data`` is a view
of the reader's buffer, valid only during the call: a handler that keeps the bytes copies them
(a slave's store copies each chunk once, behind its partial tail)."""


class FrameReader(asyncio.BufferedProtocol):
    """A slave's end of the data socket: the transport reads (and TLS decrypts) straight into
    one buffer of this protocol's, and each frame goes to ``on_frame`` as soon as it is whole,
    from the transport's read callback. A StreamReader copied every read into its own buffer
    and again out of it; under TLS asyncio also copied and joined each record before that.

    ``ended`` completes when the connection closes (None), or with the error of a frame that
    breaks the layout or that ``on_frame`` raised (the connection is then aborted).
    ``last_frame_s`` is the loop time of the last whole frame (a silent master is dropped)."""

    def __init__(self, on_frame: FrameHandler) -> None:
        loop = asyncio.get_running_loop()
        self._on_frame = on_frame
        self._buf = bytearray(FRAME.size + CHUNK_BYTES_MAX + READ_ROOM_BYTES)
        self._view = memoryview(self._buf)
        self._end = 0
        """Bytes in the buffer, from its start: at most one partial frame between reads."""
        self._time = loop.time
        self.transport: asyncio.Transport | None = None
        self.ended: asyncio.Future[None] = loop.create_future()
        self.last_frame_s = loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view[self._end :]  # never empty: whole frames are taken out at once

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        try:
            self._take_frames()
        except Exception as exc:
            if not self.ended.done():
                self.ended.set_exception(exc)
            if self.transport is not None:
                self.transport.abort()

    def _take_frames(self) -> None:
        buf, view, start, end = self._buf, self._view, 0, self._end
        head = FRAME.size
        unpack = FRAME.unpack_from
        try:
            while end - start >= head:
                kind, offset, length, pace_ms, confirm, version = unpack(buf, start)
                if length > CHUNK_BYTES_MAX or (kind == CONFIRM and length):
                    raise FrameError(f"data socket frame of kind {kind}, {length} bytes")
                if end - start < head + length:
                    break
                data = view[start + head : start + head + length]
                start += head + length
                self.last_frame_s = self._time()
                self._on_frame(kind, offset, data, pace_ms, confirm, version)
        finally:
            if start == end:
                self._end = 0
            elif start:  # a partial frame: to the front, so the next read has a frame's room
                kept = end - start
                buf[:kept] = view[start:end]
                self._end = kept

    def eof_received(self) -> bool:
        return False  # close: the master ended the socket

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)  # a reset too: the stream's status says why


class DataListener:
    """The master's data socket: accepts connections, hands each to the stream whose token it
    sends (:meth:`expect`), and closes any other."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._waiting: dict[bytes, asyncio.Future[Connection]] = {}
        self.port = 0
        """The bound port once started (0 before)."""

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._accept,
            self._host,
            self._port,
            ssl=self._ssl,
            ssl_handshake_timeout=TOKEN_WAIT_S if self._ssl else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def expect(self) -> tuple[bytes, asyncio.Future[Connection]]:
        """A fresh token and the future its connection will complete."""
        token = os.urandom(TOKEN_BYTES)
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        return token, future

    def forget(self, token: bytes) -> None:
        future = self._waiting.pop(token, None)
        if future is not None and future.done() and not future.cancelled():
            close(future.result()[1])  # connected after its stream gave up

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(TOKEN_WAIT_S):
                token = await reader.readexactly(TOKEN_BYTES)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            log.warning("replication data socket: %s sent no token; closed", peer)
            close(writer)
            return
        future = self._waiting.get(token)
        if future is None or future.done():
            log.warning("replication data socket: %s sent an unknown token; closed", peer)
            close(writer)
            return
        no_delay(writer)
        future.set_result((reader, writer))


async def read_acks(reader: asyncio.StreamReader) -> AsyncIterator[tuple[int, int]]:
    """(max_physical_offset, flushed_offset) per ack until the slave closes the socket."""
    unpack = ACK.unpack
    while True:
        try:
            raw = await reader.readexactly(ACK.size)
        except asyncio.IncompleteReadError:
            return
        yield unpack(raw)
