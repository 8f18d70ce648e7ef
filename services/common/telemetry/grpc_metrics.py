"""gRPC server metrics: one duration histogram per method and status (OpenTelemetry RPC
conventions), installed on every service's server when metrics are on.

``rpc.server.duration`` (ms; Prometheus ``rpc_server_duration_milliseconds``) with
``rpc.system`` = grpc, ``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code`` (the numeric
code, as the conventions say): its count per status code is the gRPC status count, its buckets
the latency of Send, Pull and every other call. A stream's duration is its lifetime. Cost per
call: two clock reads and a :class:`~services.common.telemetry.fast.FastHistogram` update.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from services.common.telemetry.fast import FastHistogram
from services.common.telemetry.setup import LATENCY_BUCKETS_MS

LABELS = ("rpc_system", "rpc_service", "rpc_method", "rpc_grpc_status_code")

_calls: FastHistogram | None = None
"""The duration histogram of this process's call metrics (every MetricsInterceptor's exports
under the same name and labels, so any one of them will do), for :func:`record_call`."""


def record_call(method: str, code: grpc.StatusCode, start: float) -> None:
    """Record a call served inside a stream as the unary call it stands for (SendStream's
    requests as ``/rocketq.v1.Messaging/Send``): so Send's count and latency do not depend on
    how a client sends. ``start``: ``time.perf_counter()`` when it began."""
    if _calls is None:
        return
    service, _, name = method.lstrip("/").rpartition("/")
    _calls.record((time.perf_counter() - start) * 1000, ("grpc", service, name, str(code.value[0])))


class MetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Times every call and records it with its final status code."""

    def __init__(self) -> None:
        self._duration = FastHistogram(
            "rpc_server_duration_milliseconds",
            "Duration of gRPC calls served, by method and status code",
            LABELS,
            LATENCY_BUCKETS_MS,
        )
        self._keys: dict[tuple[str, int], tuple[str, ...]] = {}
        global _calls
        _calls = self._duration

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        method = str(details.method)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(method, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(method, handler.unary_stream))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._streaming(method, handler.stream_stream))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._unary(method, handler.stream_unary))
        return handler

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            start = time.perf_counter()
            try:
                response = await behavior(request, context)
            except BaseException:
                self._record(method, context, start, grpc.StatusCode.UNKNOWN)
                raise
            self._record(method, context, start, grpc.StatusCode.OK)
            return response

        return unary

    def _streaming(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def streaming(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            start = time.perf_counter()
            code = grpc.StatusCode.UNKNOWN
            try:
                result = behavior(request, context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:  # a coroutine that writes through the context
                    await result
                code = grpc.StatusCode.OK
            finally:
                self._record(method, context, start, code)

        return streaming

    def _record(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        start: float,
        default: grpc.StatusCode,
    ) -> None:
        code = _code_of(context) or default
        value = code.value[0]
        key = self._keys.get((method, value))
        if key is None:
            service, _, name = method.lstrip("/").rpartition("/")
            key = self._keys[(method, value)] = ("grpc", service, name, str(value))
        self._duration.record((time.perf_counter() - start) * 1000, key)


def _code_of(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode | None:
    """The status the handler set (abort, set_code), or None if it set none."""
    try:
        code = context.code()
    except Exception:  # older grpcio without ServicerContext.code()
        return None
    if code is None:
        return None
    if isinstance(code, grpc.StatusCode):
        return code
    for status in grpc.StatusCode:  # some versions return the numeric value
        if status.value[0] == code:
            return status
    return None
