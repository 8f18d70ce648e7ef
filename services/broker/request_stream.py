"""Messaging.SendStream and Messaging.PullStream: Send and Pull over one long-lived stream
(issue 16).

A unary call costs grpc.aio on the broker ~300-400 µs of CPU before and after the handler, a
message on an open stream ~150 (a bare grpc.aio measurement), and a producer's batch of 128 or a
consumer's pull of ~230 messages is one such call. So a producer keeps one SendStream and a
consumer one PullStream per broker, and sends its requests down it:

    client                                              broker
      │ XStreamRequest(id, XRequest) ──▶    a task per request: the X handler, as is
      │ ◀── XStreamResponse(id, response | error)       (in completion order)
      ╵ half-close ──▶ the requests in flight are answered, then the stream ends

Each request is handled exactly as the unary call handles it (``telemetry.send`` around
``SendProcessor.send``, ``telemetry.pull`` around ``PullProcessor.pull``): same checks, store,
waits and answers. Tasks start in the order requests arrive and a Send appends before its first
await, so sends are stored in stream order; their waits for flush or slaves overlap, as
concurrent unary Sends do, and a pull held for new messages (long-polling) holds up nobody else.
A refused request is answered with the status the unary call would have ended with (code +
ErrorDetail) and the stream goes on. With metrics on, each request is counted and timed in the
gRPC call metrics as the unary call it stands for (``rpc_method="Send"``/``"Pull"``), the
stream itself under its own name. At most :data:`STREAM_IN_FLIGHT_MAX` requests of a stream are
handled at once; the stream's reads wait for a free slot (flow control back to the client).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from services.common.errors import ServiceError
from services.common.telemetry import state as telemetry_state
from services.common.telemetry.grpc_metrics import record_call

log = logging.getLogger(__name__)

STREAM_IN_FLIGHT_MAX = 512
"""Requests of one stream handled at once: enough that many concurrent lone sends still share a
SYNC_FLUSH group commit as their unary calls did, and more than a consumer's queues on one broker
(one pull each); the reads of the stream wait beyond it."""

Answer = messaging_pb2.SendStreamResponse | messaging_pb2.PullStreamResponse
Handle = Callable[[Any], Awaitable[Any]]
"""Handles one request of the stream (a SendRequest, a PullRequest) as its unary call does."""


@dataclass(frozen=True)
class StreamKind:
    answer: type[Answer]
    """The stream's answer message (id=, response= or error=)."""
    method: str
    """The unary call each request stands for (metrics, logs)."""


SEND = StreamKind(messaging_pb2.SendStreamResponse, "/rocketq.v1.Messaging/Send")
PULL = StreamKind(messaging_pb2.PullStreamResponse, "/rocketq.v1.Messaging/Pull")


class RequestContext:
    """What a handler reads of its gRPC context, for a request that came down a stream: the
    stream's peer, and no deadline of its own (the client gives up on an answer itself)."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None


def _error(exc: ServiceError) -> messaging_pb2.SendStreamError:
    detail = common_pb2.ErrorDetail(reason=exc.reason, message=exc.message, metadata=exc.metadata)
    return messaging_pb2.SendStreamError(code=exc.code.value[0], detail=detail)


def _internal(exc: Exception) -> messaging_pb2.SendStreamError:
    """What ``errors.rpc`` answers for a bug in a unary Send: INTERNAL, naming the exception."""
    return _error(
        ServiceError(
            grpc.StatusCode.INTERNAL,
            common_pb2.ERROR_REASON_UNSPECIFIED,
            f"internal error: {type(exc).__name__}: {exc}",
        )
    )


async def serve_request_stream(
    kind: StreamKind,
    handle: Handle,
    requests: AsyncIterator[Any],
    context: grpc.aio.ServicerContext[Any, Any],
) -> None:
    """Handle one request stream of ``kind``: each request through ``handle``, each answer
    (with the request's id) through ``context.write``, one write at a time. Returns once the
    client has half-closed and every request is answered; an error of the stream itself (an
    undecodable frame) propagates."""
    answer_type, method = kind.answer, kind.method
    write, peer = context.write, context.peer()
    answers: asyncio.Queue[Answer | None] = asyncio.Queue()
    slots = asyncio.Semaphore(STREAM_IN_FLIGHT_MAX)
    tasks: set[asyncio.Task[None]] = set()

    async def one(item: Any) -> None:
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            response = await handle(item.request)
            answer = answer_type(id=item.id)
            # CopyFrom, not response= in the constructor: upb merges a message given there
            # by serializing and re-parsing it, a cost that grows with a pull's records.
            answer.response.CopyFrom(response)
        except ServiceError as exc:
            answer = answer_type(id=item.id, error=_error(exc))
            code = exc.code
        except Exception as exc:  # a bug: logged, answered INTERNAL, the stream goes on
            log.exception("unexpected error in a request stream's %s", method)
            answer = answer_type(id=item.id, error=_internal(exc))
            code = grpc.StatusCode.INTERNAL
        finally:
            slots.release()
        if telemetry_state.METRICS:  # counted and timed as the unary call it stands for
            record_call(method, code, start)
        answers.put_nowait(answer)

    async def writer() -> None:
        try:
            while (answer := await answers.get()) is not None:
                await write(answer)
        except Exception as exc:  # the call ended under us (client gone): nobody to answer
            log.debug("%s stream from %s ended while answering: %r", method, peer, exc)

    writing = asyncio.create_task(writer())
    ended: ServiceError | None = None
    try:
        try:
            async for item in requests:
                await slots.acquire()
                if writing.done():  # the client went away: what it sent cannot be answered
                    break
                task = asyncio.create_task(one(item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except ServiceError as exc:  # a bad frame ends the stream, after the good ones' answers
            ended = exc
        if tasks:
            await asyncio.wait(list(tasks))
        answers.put_nowait(None)
        await writing
        if ended is not None:
            raise ended
    finally:
        writing.cancel()
        for task in list(tasks):
            task.cancel()
