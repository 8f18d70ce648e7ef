"""The timer-wheel service's client: its statistics and cancelling a pending timer.

The timer-wheel (``rocketq timer-wheel``, DESIGN.md §8) is its own process with its own gRPC
service, ``TimerAdmin`` (proto/rocketq/v1/timer.proto, default port 10931). It does not
register with the nameservers, so :class:`TimerClient` is given its address directly; with
several instances sharing the timer topic's queues, ask each one.

A timer's handle is the delayed message's unique id (``SendResult.msg_id``): the producer gets
it back from the send and can cancel the timer with it until the message is delivered::

    async with TimerClient("127.0.0.1:10931") as timers:
        stats = await timers.stats()
        await timers.cancel("Orders", result.msg_id)

Answers are plain frozen dataclasses (no protobuf types), so ``rocketq timer stats --json`` is
``dataclasses.asdict`` of :class:`TimerStats`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from rocketq._api.rocketq.v1 import timer_pb2, timer_pb2_grpc
from rocketq.client._channels import open_channel
from rocketq.client.errors import InvalidArgumentError, from_rpc_error
from rocketq.client.security import ClientSecurity
from rocketq.validation import check_topic

__all__ = ["CancelledTimer", "TimerClient", "TimerQueueProgress", "TimerStats"]

#: The timer-wheel's default port (timer.proto).
DEFAULT_TIMER_PORT = 10931
#: Longest handle accepted before asking the service (unique ids are 32 hex characters).
HANDLE_MAX_CHARS = 128

_T = TypeVar("_T")


@dataclass(frozen=True)
class TimerQueueProgress:
    """The timer-wheel's progress on one queue of the timer topic (rmq_sys_wheel_timer)."""

    broker_name: str
    queue_id: int
    read_offset: int
    """Queue offset of the next timer message to read."""
    committed_offset: int
    """Offset committed to the broker: everything before it is durable in the TimerLog."""
    max_offset: int
    """One past the newest timer message on the broker."""

    @property
    def lag(self) -> int:
        """Timer messages stored on the broker and not yet read."""
        return max(0, self.max_offset - self.read_offset)


@dataclass(frozen=True)
class TimerStats:
    """One timer-wheel instance's backlog, progress and delivery lateness."""

    pending_timers: int
    """Scheduled and neither delivered nor cancelled."""
    scheduled_total: int
    """Timers read from the brokers and made durable since the service started."""
    delivered_total: int
    """Messages re-put to their real topics since the service started."""
    cancelled_total: int
    overdue_on_arrival_total: int
    """Timers already due when read (a backlog, or the service was down)."""
    due_per_second: float
    """Timers that fell due per second over the last 10 s."""
    lateness_p50_ms: int
    """Delivery lateness (re-put acknowledged minus delivery time) over the last 10 000."""
    lateness_p99_ms: int
    lateness_max_ms: int
    wheel_current_time_ms: int
    """The wheel's hand: every slot before it has been delivered."""
    next_delivery_timestamp_ms: int
    """Delivery time of the earliest pending timer; 0 if none."""
    dequeue_behind_ms: int
    """How far the hand lags the clock (0 when keeping up)."""
    enqueue_behind_ms: int
    """Store age of the oldest timer message not yet read (0 when keeping up)."""
    slot_precision_ms: int
    wheel_slots_total: int
    timer_log_bytes: int
    queues: tuple[TimerQueueProgress, ...]
    """By broker name, then queue id."""

    @classmethod
    def _from_pb(cls, pb: timer_pb2.GetTimerStatsResponse) -> TimerStats:
        return cls(
            pending_timers=pb.pending_timers,
            scheduled_total=pb.scheduled_total,
            delivered_total=pb.delivered_total,
            cancelled_total=pb.cancelled_total,
            overdue_on_arrival_total=pb.overdue_on_arrival_total,
            due_per_second=pb.due_per_second,
            lateness_p50_ms=pb.lateness_p50_ms,
            lateness_p99_ms=pb.lateness_p99_ms,
            lateness_max_ms=pb.lateness_max_ms,
            wheel_current_time_ms=pb.wheel_current_time_ms,
            next_delivery_timestamp_ms=pb.next_delivery_timestamp_ms,
            dequeue_behind_ms=pb.dequeue_behind_ms,
            enqueue_behind_ms=pb.enqueue_behind_ms,
            slot_precision_ms=pb.slot_precision_ms,
            wheel_slots_total=pb.wheel_slots_total,
            timer_log_bytes=pb.timer_log_bytes,
            queues=tuple(
                TimerQueueProgress(
                    q.broker_name, q.queue_id, q.read_offset, q.committed_offset, q.max_offset
                )
                for q in pb.queues
            ),
        )


@dataclass(frozen=True)
class CancelledTimer:
    """A cancelled timer: its message will never be delivered."""

    topic: str
    handle: str
    delivery_timestamp_ms: int
    """When it would have been delivered."""


class TimerClient:
    """Asynchronous client of one timer-wheel instance's ``TimerAdmin`` service.

    ``addr`` is "host:port" (the port defaults to 10931 when only a host is given). Use as
    ``async with TimerClient(addr) as timers: ...`` or call :meth:`close`. Every call waits at
    most ``timeout_ms``.
    """

    def __init__(
        self, addr: str, timeout_ms: int = 5000, security: ClientSecurity | None = None
    ) -> None:
        self._security = security
        addr = addr.strip()
        if not addr:
            raise InvalidArgumentError("no timer-wheel address given; pass host:port")
        self._addr = addr if ":" in addr else f"{addr}:{DEFAULT_TIMER_PORT}"
        self._timeout_s = timeout_ms / 1000
        self._channel: grpc.aio.Channel | None = None

    @property
    def addr(self) -> str:
        return self._addr

    async def __aenter__(self) -> TimerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel, if one was opened."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    def _stub(self) -> Any:
        if self._channel is None:
            self._channel = open_channel(self._addr, self._security)
        return timer_pb2_grpc.TimerAdminStub(self._channel)

    async def _guard(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, self._addr) from None

    async def stats(self) -> TimerStats:
        """The instance's backlog, progress and lateness (BrokerUnavailableError while it is
        recovering its TimerLog and wheel)."""
        request = timer_pb2.GetTimerStatsRequest()
        pb = await self._guard(self._stub().GetTimerStats(request, timeout=self._timeout_s))
        return TimerStats._from_pb(pb)

    async def cancel(self, topic: str, handle: str) -> CancelledTimer:
        """Cancel the pending timer ``handle`` (the delayed message's ``SendResult.msg_id``) of
        ``topic`` (the real topic it would be delivered to).

        NotFoundError if no such timer is pending (never scheduled, delivered or cancelled);
        BrokerUnavailableError if this instance is recovering or does not own its queue.
        """
        try:
            check_topic(topic)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc), code="INVALID_ARGUMENT") from None
        handle = handle.strip()
        if not handle or len(handle) > HANDLE_MAX_CHARS:
            raise InvalidArgumentError(
                f"timer handle {handle!r} is not a message id; give the delayed message's "
                "SendResult.msg_id",
                code="INVALID_ARGUMENT",
            )
        request = timer_pb2.CancelTimerRequest(topic=topic, handle=handle)
        pb = await self._guard(self._stub().CancelTimer(request, timeout=self._timeout_s))
        return CancelledTimer(topic, handle, pb.delivery_timestamp_ms)
