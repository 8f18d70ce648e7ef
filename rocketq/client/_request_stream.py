"""A client's SendStream or PullStream per broker (proto ``Messaging.SendStream`` /
``Messaging.PullStream``, issue 16).

A unary call costs grpc.aio on both sides far more CPU than a message on an open stream, so a
producer sends its Send requests, and a consumer its Pull requests, down one stream per broker
address, opened on first use:

- each request gets an id and a future; the reader task resolves the future with the answer
  of that id (a response, or the error the unary call would have raised, built by
  ``from_status``);
- a request not answered within its timeout raises what a unary call past its deadline raises
  (RequestTimeoutError, DEADLINE_EXCEEDED) and its late answer is dropped;
- when the stream breaks (broker gone, connection lost, server stopping) every request waiting
  on it fails with the error the unary call would have failed with (``from_rpc_error``), and
  the next request opens a new stream; a broker that does not serve the stream (UNIMPLEMENTED,
  an older broker) is sent unary calls from then on (:class:`StreamUnsupported`);
- a stream already carrying its kind's ``pending_max`` unanswered requests, those given up on
  included, takes no more (:class:`StreamFull`): the consumer sends that pull unary.

Signed clients (an access key) never use them: the ACL checks each request's topic permissions,
and a stream needs the admin role (rules.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc
from rocketq.client.errors import (
    BrokerUnavailableError,
    ClientStateError,
    from_rpc_error,
    from_status,
    status_code,
)
from rocketq.client.security import ClientSecurity, default_security

SEND_PENDING_MAX = 100_000
"""Sends waiting on one stream, a safety bound: the producer's own in-flight limits (e.g.
``async_in_flight_max``) bound it first."""

PULL_PENDING_MAX = 256
"""Pulls waiting on one stream; the consumer sends the next ones as unary Pulls. A broker
handles at most 512 requests of a stream at once (``STREAM_IN_FLIGHT_MAX``) and reads no more
until one is answered, and a held pull takes its slot for up to its suspend time: pulls of a
consumer with more queues on one broker than that would wait behind the holds of idle queues."""


class StreamUnsupported(Exception):
    """The broker does not serve the stream: send this request (and the next ones) unary."""


class StreamFull(ClientStateError):
    """The stream already carries its kind's ``pending_max`` requests."""


@dataclass(frozen=True)
class StreamKind:
    """Which stream, and how its errors name it."""

    open: Callable[[messaging_pb2_grpc.MessagingAsyncStub], Any]
    """Opens the call on a broker's stub."""
    request: Callable[..., Any]
    """The stream's request message (id=, request=)."""
    what: str
    """The unary call each request stands for, in messages: "send", "pull"."""
    owner: str
    """Who closes the streams, in messages: "producer", "consumer"."""
    pending_max: int
    """Requests the broker may be handling at once on one stream, counting those the client
    gave up on (a timed-out or cancelled pull is still held by the broker until it answers)."""


SEND = StreamKind(
    lambda stub: stub.SendStream(),
    messaging_pb2.SendStreamRequest,
    "send",
    "producer",
    SEND_PENDING_MAX,
)
PULL = StreamKind(
    lambda stub: stub.PullStream(),
    messaging_pb2.PullStreamRequest,
    "pull",
    "consumer",
    PULL_PENDING_MAX,
)


class _Stream:
    """One open request stream call and the requests waiting on it.

    Requests are written by one writer task, so a caller cancelled or timed out mid-write
    never cancels the call under the other callers (grpc.aio cancels a call whose write is
    cancelled) and writes never overlap (one at a time per call)."""

    def __init__(self, call: Any, addr: str, kind: StreamKind) -> None:
        self.addr = addr
        self._call = call
        self._kind = kind
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._abandoned: set[int] = set()
        """Ids given up on (timeout, cancellation) whose answers have not come yet."""
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.broken = False
        self._reader = asyncio.create_task(self._read())
        self._writer = asyncio.create_task(self._write())

    def in_flight(self) -> int:
        """Requests the broker has not answered yet, given up on or not."""
        return len(self._pending) + len(self._abandoned)

    async def call(self, request: Any, timeout_s: float) -> Any:
        kind = self._kind
        if self.in_flight() >= kind.pending_max:
            raise StreamFull(f"{kind.pending_max} {kind.what}s already wait on {self.addr}")
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        envelope = self._kind.request(id=rid)
        # CopyFrom, not request= in the constructor: upb merges a message given there by
        # serializing and re-parsing it (135-150 us for a 128 x 1 KiB batch, against 5-20 us).
        envelope.request.CopyFrom(request)
        self._outbox.put_nowait(envelope)
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            raise from_status(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", None, self.addr
            ) from None
        finally:
            if self._pending.pop(rid, None) is not None and not self.broken:
                self._abandoned.add(rid)  # no answer yet: the broker still has it

    async def _write(self) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            while True:  # a failed write ends the call: the reader then fails what waits
                await self._call.write(await self._outbox.get())

    async def _read(self) -> None:
        addr, what = self.addr, self._kind.what
        # What the requests still waiting get when the stream ends: one error object each.
        unavailable = functools.partial(BrokerUnavailableError, code="UNAVAILABLE", target=addr)
        error: Callable[[], BaseException] = functools.partial(
            unavailable, f"the {what} stream to {addr} failed"
        )
        answered = False
        try:
            async for answer in self._call:
                answered = True
                fut = self._pending.pop(answer.id, None)
                if fut is None or fut.done():
                    self._abandoned.discard(answer.id)
                    continue  # given up on (timeout): its answer comes too late
                if answer.HasField("error"):
                    e = answer.error
                    detail = e.detail if e.HasField("detail") else None
                    code = status_code(e.code)
                    text = detail.message if detail is not None and detail.message else code.name
                    fut.set_exception(from_status(code, text, detail, addr))
                else:
                    fut.set_result(answer.response)
            error = functools.partial(unavailable, f"{addr} ended the {what} stream")
        except grpc.RpcError as err:
            code = err.code()
            # grpc.aio turns a write that races the server's refusal of the call into INTERNAL
            # ("Internal error from Core"), hiding the UNIMPLEMENTED of a broker without the
            # stream (1 open in 15-50 here): a stream that fails so before any answer is not
            # used either, and its requests go unary (a Send among them that the broker stored
            # before the stream failed is then stored twice, as any retried send can be).
            if code == grpc.StatusCode.UNIMPLEMENTED or (
                code == grpc.StatusCode.INTERNAL and not answered
            ):
                error = functools.partial(StreamUnsupported, addr)
            else:
                error = functools.partial(from_rpc_error, err, addr)
        except asyncio.CancelledError:
            error = functools.partial(
                ClientStateError, f"the {self._kind.owner} closed before the broker answered"
            )
            raise
        finally:
            self.broken = True
            self._writer.cancel()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error())
            self._pending.clear()
            self._abandoned.clear()

    async def close(self) -> None:
        self.broken = True
        self._call.cancel()
        for task in (self._reader, self._writer):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def open_streams(
    stub_of: Callable[[str], messaging_pb2_grpc.MessagingAsyncStub],
    kind: StreamKind,
    *,
    enabled: bool,
    security: ClientSecurity | None,
) -> RequestStreams | None:
    """The client's streams of ``kind``, or None when its requests go as unary calls: streams
    turned off in its config, or a signed client (its requests' topic permissions are checked
    per call; a stream needs the admin role). ``security`` None = the process default."""
    if security is None:
        security = default_security()
    if not enabled or security.signs:
        return None
    return RequestStreams(stub_of, kind)


class RequestStreams:
    """The stream of one kind (SEND, PULL) to each broker address this client calls."""

    def __init__(
        self, stub_of: Callable[[str], messaging_pb2_grpc.MessagingAsyncStub], kind: StreamKind
    ) -> None:
        self._stub_of = stub_of
        self._kind = kind
        self._streams: dict[str, _Stream] = {}
        self._unsupported: set[str] = set()
        self._closed = False

    def usable(self, addr: str) -> bool:
        return not self._closed and addr not in self._unsupported

    def in_flight(self, addr: str) -> int:
        """Requests on the stream to ``addr`` the broker has not answered yet."""
        stream = self._streams.get(addr)
        return 0 if stream is None or stream.broken else stream.in_flight()

    def open_addrs(self) -> list[str]:
        """Brokers with a stream open now."""
        return sorted(addr for addr, stream in self._streams.items() if not stream.broken)

    async def call(self, addr: str, request: Any, timeout_s: float) -> Any:
        """The broker's answer to ``request``; raises what the unary call would raise, or
        :class:`StreamUnsupported`."""
        stream = self._streams.get(addr)
        if stream is None or stream.broken:
            kind = self._kind
            stream = self._streams[addr] = _Stream(kind.open(self._stub_of(addr)), addr, kind)
        try:
            return await stream.call(request, timeout_s)
        except StreamUnsupported:
            self._unsupported.add(addr)
            raise

    async def close(self) -> None:
        self._closed = True
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
