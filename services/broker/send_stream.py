"""Messaging.SendStream: Send over one long-lived stream (issue 16).

A unary call costs grpc.aio on the broker ~300-380 µs of CPU before and after the handler, a
message on an open stream ~150 (a bare grpc.aio measurement with 132 KB requests, 8 in flight),
and a producer's batch of 128 is one such call. So a producer keeps one SendStream per broker
and sends its batches down it:

    client                                              broker
      │ SendStreamRequest(id, SendRequest) ──▶ a task per request: the Send handler, as is
      │ ◀── SendStreamResponse(id, response | error)    (in completion order)
      ╵ half-close ──▶ the requests in flight are answered, then the stream ends

Each request is handled exactly as ``Messaging.Send`` handles it (``telemetry.send`` around
``SendProcessor.send``): same checks, store, durability wait and answers. Tasks start in the
order requests arrive and a Send appends before its first await, so requests are stored in
stream order; their waits for flush or slaves overlap, as concurrent unary Sends do. A refused
request is answered with the status Send would have ended with (code + ErrorDetail) and the
stream goes on. With metrics on, each request is counted and timed in the gRPC call metrics
as a Send (``rpc_method="Send"``), the stream itself as SendStream. At most
:data:`SEND_STREAM_IN_FLIGHT_MAX` requests of a stream are handled at once; the stream's reads
wait for a free slot (flow control back to the client).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from services.common.errors import ServiceError
from services.common.telemetry import state as telemetry_state
from services.common.telemetry.grpc_metrics import record_call

log = logging.getLogger(__name__)

SEND_STREAM_IN_FLIGHT_MAX = 512
"""Requests of one stream handled at once: enough that many concurrent lone sends still share a
SYNC_FLUSH group commit as their unary calls did; the reads of the stream wait beyond it."""

SEND_METHOD = "/rocketq.v1.Messaging/Send"

SendFn = Callable[[messaging_pb2.SendRequest, str], Awaitable[messaging_pb2.SendResponse]]


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


async def serve_send_stream(
    send: SendFn,
    requests: AsyncIterator[messaging_pb2.SendStreamRequest],
    write: Callable[[messaging_pb2.SendStreamResponse], Awaitable[None]],
    peer: str,
) -> None:
    """Handle one SendStream: each request through ``send``, each answer through ``write``
    (one write at a time). Returns once the client has half-closed and every request is
    answered; an error of the stream itself (an undecodable frame) propagates."""
    answers: asyncio.Queue[messaging_pb2.SendStreamResponse | None] = asyncio.Queue()
    slots = asyncio.Semaphore(SEND_STREAM_IN_FLIGHT_MAX)
    tasks: set[asyncio.Task[None]] = set()

    async def one(item: messaging_pb2.SendStreamRequest) -> None:
        answer = messaging_pb2.SendStreamResponse(id=item.id)
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            answer.response.CopyFrom(await send(item.request, peer))
        except ServiceError as exc:
            answer.error.CopyFrom(_error(exc))
            code = exc.code
        except Exception as exc:  # a bug: logged, answered INTERNAL, the stream goes on
            log.exception("unexpected error in SendStream's Send")
            answer.error.CopyFrom(_internal(exc))
            code = grpc.StatusCode.INTERNAL
        finally:
            slots.release()
        if telemetry_state.METRICS:  # counted and timed as the Send it stands for
            record_call(SEND_METHOD, code, start)
        answers.put_nowait(answer)

    async def writer() -> None:
        try:
            while (answer := await answers.get()) is not None:
                await write(answer)
        except Exception as exc:  # the call ended under us (client gone): nobody to answer
            log.debug("SendStream from %s ended while answering: %r", peer, exc)

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
