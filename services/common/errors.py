"""Turning failures into gRPC statuses a person can act on (DESIGN.md §3 "Errors").

Handlers raise :class:`ServiceError` with a gRPC code, a stable :class:`ErrorReason` and a
message; :func:`rpc` (a decorator for servicer methods) turns it into an aborted call whose
status details carry one ``rocketq.v1.ErrorDetail`` packed in ``google.rpc.Status`` — the
standard rich-error channel every gRPC language can read. Anything else a handler raises is a
bug: it is logged with its traceback and answered with INTERNAL, and the server keeps serving
("no request can crash a server").

| raise                                   | caller sees                                   |
|-----------------------------------------|-----------------------------------------------|
| ``invalid(reason, msg, **meta)``        | INVALID_ARGUMENT + ErrorDetail(reason, msg)   |
| ``not_found(reason, msg, **meta)``      | NOT_FOUND + ErrorDetail                       |
| ``ServiceError(code, reason, msg)``     | that code + ErrorDetail                       |
| any other exception                     | INTERNAL "internal error: <type>: <text>"     |
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias, TypeVar, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from rocketq._api.rocketq.v1 import common_pb2

log = logging.getLogger(__name__)

# Bounds in UTF-8 bytes, because the trailers are: grpc-message percent-encodes every
# non-ASCII byte (x3) and grpc-status-details-bin repeats the message and the metadata in
# base64 (x4/3). With these, the worst case stays near 4 KiB, under the 8 KiB soft limit past
# which a client may already refuse the trailers.
MESSAGE_MAX_BYTES = 512
METADATA_VALUE_MAX_BYTES = 128
METADATA_ENTRIES_MAX = 8


def _clip_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most about ``max_bytes`` of UTF-8, saying so."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    kept = data[: max_bytes - 24].decode(errors="ignore")  # never half a character
    return f"{kept}… (cut, {len(data)} bytes)"


Reason: TypeAlias = "common_pb2.ErrorReason.ValueType"


class ServiceError(Exception):
    """A request the service refuses, with the status code and reason the caller gets."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: Reason,
        message: str,
        **metadata: object,
    ) -> None:
        # Bounded whatever the caller composed: the status travels in trailers a standard
        # client caps at 16 KiB, and an input echoed whole would turn this answer into
        # RESOURCE_EXHAUSTED on the caller's side (messages quote inputs with quote()).
        message = _clip_utf8(message, MESSAGE_MAX_BYTES)
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = {
            _clip_utf8(k, METADATA_VALUE_MAX_BYTES): _clip_utf8(str(v), METADATA_VALUE_MAX_BYTES)
            for k, v in list(metadata.items())[:METADATA_ENTRIES_MAX]
        }

    def to_status(self) -> grpc.Status:
        detail = common_pb2.ErrorDetail(
            reason=self.reason, message=self.message, metadata=self.metadata
        )
        packed = any_pb2.Any()
        packed.Pack(detail)
        status = status_pb2.Status(code=self.code.value[0], message=self.message, details=[packed])
        return rpc_status.to_status(status)


def invalid(reason: Reason, message: str, **metadata: object) -> NoReturn:
    raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, reason, message, **metadata)


def not_found(reason: Reason, message: str, **metadata: object) -> NoReturn:
    raise ServiceError(grpc.StatusCode.NOT_FOUND, reason, message, **metadata)


def denied(message: str, **metadata: object) -> NoReturn:
    raise ServiceError(
        grpc.StatusCode.PERMISSION_DENIED, common_pb2.NO_PERMISSION, message, **metadata
    )


def unavailable(reason: Reason, message: str, **metadata: object) -> NoReturn:
    raise ServiceError(grpc.StatusCode.UNAVAILABLE, reason, message, **metadata)


def exhausted(reason: Reason, message: str, **metadata: object) -> NoReturn:
    raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, reason, message, **metadata)


def precondition(message: str, **metadata: object) -> NoReturn:
    raise ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        common_pb2.ERROR_REASON_UNSPECIFIED,
        message,
        **metadata,
    )


def _internal(exc: BaseException) -> grpc.Status:
    return ServiceError(
        grpc.StatusCode.INTERNAL,
        common_pb2.ERROR_REASON_UNSPECIFIED,
        f"internal error: {type(exc).__name__}: {exc}",
    ).to_status()


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self_ = TypeVar("Self_")

UnaryHandler = Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]


def rpc(
    fn: Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]],
) -> Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]:
    """Wrap a unary servicer method: ServiceError → its status; anything else → INTERNAL."""

    @functools.wraps(fn)
    async def wrapper(
        self: Self_, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Resp:
        try:
            return await fn(self, request, context)
        except ServiceError as exc:
            await context.abort_with_status(exc.to_status())
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("unexpected error in %s", fn.__qualname__)
            await context.abort_with_status(_internal(exc))
        raise AssertionError("unreachable: abort_with_status raises")

    return wrapper


def rpc_stream(
    fn: Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]],
) -> Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]]:
    """Like :func:`rpc`, for a method that is an async generator of responses."""

    @functools.wraps(fn)
    async def wrapper(
        self: Self_, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except ServiceError as exc:
            await context.abort_with_status(exc.to_status())
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("unexpected error in %s", fn.__qualname__)
            await context.abort_with_status(_internal(exc))

    return cast(
        "Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]]", wrapper
    )
