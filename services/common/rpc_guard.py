"""Requests whose bytes are not the message they claim to be (DESIGN.md §3 "Errors").

grpcio parses a request with the method's protobuf class before any handler runs. Bytes that do
not parse would be answered UNKNOWN, each with an ERROR traceback that grpcio logs itself, and on
a streaming RPC the parse error would surface inside the handler as a bug (INTERNAL): any client
could flood the logs or fake a server fault. :class:`DecodeGuard`, a server interceptor every
service installs, swaps each method's deserializer for one that returns a marker instead of
raising; the marker becomes INVALID_ARGUMENT - at once for a unary request, at the bad frame for
a stream (which the handler then ends as it ends any protocol error) - and one warning line,
logged at most once per peer host per :data:`WARN_INTERVAL_S`.

Alternatives weighed: deserializing inside every handler (each servicer method would take raw
bytes, and the generated stubs' types would be lost) and a try/except around the server's
iterator (grpcio has already logged the traceback by then).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.validation import quote
from services.common.errors import ServiceError

log = logging.getLogger(__name__)

WARN_INTERVAL_S = 60.0
"""A peer that keeps sending undecodable requests is logged once per this interval."""
PEERS_TRACKED_MAX = 10_000
"""Bound on the rate limiter's memory: past it, the table starts over."""


class _Undecodable:
    """What the guarded deserializer returns for bytes that do not parse."""

    __slots__ = ("error", "size_bytes")

    def __init__(self, error: Exception, size_bytes: int) -> None:
        self.error = error
        self.size_bytes = size_bytes


def _guarded(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any parse failure is the caller's, never the server's
            return _Undecodable(exc, len(data))

    return parse


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Answers undecodable requests INVALID_ARGUMENT on every method of the server."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._warned_at: dict[str, float] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method: grpcio answers UNIMPLEMENTED quietly
        method = str(details.method)
        guarded = handler._replace(request_deserializer=_guarded(handler.request_deserializer))
        if handler.unary_unary is not None:
            return guarded._replace(unary_unary=self._unary(method, handler.unary_unary))
        if handler.unary_stream is not None:
            return guarded._replace(unary_stream=self._unary_stream(method, handler.unary_stream))
        if handler.stream_unary is not None:
            return guarded._replace(stream_unary=self._stream_unary(method, handler.stream_unary))
        if handler.stream_stream is not None:
            wrapped = self._stream_stream(method, handler.stream_stream)
            return guarded._replace(stream_stream=wrapped)
        return handler

    # ---- the four shapes ----------------------------------------------------------------------

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Undecodable):
                await context.abort_with_status(self._refuse(method, request, context).to_status())
            return await behavior(request, context)

        return unary

    def _unary_stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await context.abort_with_status(self._refuse(method, request, context).to_status())
            async for item in _responses(behavior(request, context)):
                yield item

        return unary_stream

    def _stream_unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def stream_unary(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> Any:
            return await behavior(self._checked(method, requests, context), context)

        return stream_unary

    def _stream_stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def stream_stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            checked = self._checked(method, requests, context)
            async for item in _responses(behavior(checked, context)):
                yield item

        return stream_stream

    async def _checked(
        self, method: str, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        """The request frames; an undecodable one raises the ServiceError the handler turns
        into the stream's INVALID_ARGUMENT end, as it does any protocol error."""
        async for request in requests:
            if isinstance(request, _Undecodable):
                raise self._refuse(method, request, context)
            yield request

    # ---- refusing -----------------------------------------------------------------------------

    def _refuse(
        self, method: str, bad: _Undecodable, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ServiceError:
        what = f"{type(bad.error).__name__}: {bad.error}"
        message = (
            f"the request to {method} is not a valid protobuf message of its type "
            f"({bad.size_bytes} bytes; {quote(what, 120)}); send the message the method's "
            "proto declares"
        )
        self._warn(context.peer(), method, bad.size_bytes)
        return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, common_pb2.ILLEGAL_ARGUMENT, message)

    def _warn(self, peer: str, method: str, size_bytes: int) -> None:
        # keyed by the peer's host: a client reconnecting for each request gets a new port
        host = peer.rsplit(":", 1)[0]
        now = self._clock()
        last = self._warned_at.get(host)
        if last is not None and now - last < WARN_INTERVAL_S:
            return
        if len(self._warned_at) >= PEERS_TRACKED_MAX:
            self._warned_at.clear()
        self._warned_at[host] = now
        log.warning(
            "refused an undecodable %d-byte request to %s from %s (INVALID_ARGUMENT); more from "
            "this host are not logged for %.0f s",
            size_bytes,
            method,
            peer,
            WARN_INTERVAL_S,
        )


async def _responses(result: Any) -> AsyncIterator[Any]:
    """A streaming behaviour's responses, whether it is an async generator or a coroutine that
    writes through the context (then there is nothing to yield)."""
    if inspect.isawaitable(result):
        await result
        return
    async for item in result:
        yield item
