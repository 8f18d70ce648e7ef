"""One raw gRPC client for tests that talk to a service below the SDK.

``RawClient(addr)`` opens one insecure channel and puts every generated stub on it, so a test
reaches Messaging, Admin, NameServer, Replication or Timer on one address without building
channels itself. Use it as ``async with RawClient(addr) as c:`` (the channel closes after).
Tests that want request shorthands subclass it and add their own methods.

``refused(call)`` awaits a call that must fail and returns its status code, the ErrorDetail
reason and the message — the way the broker reports a refusal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
from grpc_status import rpc_status

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
    nameserver_pb2,
    nameserver_pb2_grpc,
    replication_pb2_grpc,
    timer_pb2_grpc,
)

# Large enough for the batch tests that send megabytes in one request.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_TOPIC = "TBW102"


class RawClient:
    """Every generated stub on one channel to ``addr`` (a broker, nameserver or timer wheel)."""

    def __init__(self, addr: str, options: Sequence[tuple[str, Any]] = ()) -> None:
        self.addr = addr
        self.channel = grpc.aio.insecure_channel(
            addr,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                *options,
            ],
        )
        self.messaging = messaging_pb2_grpc.MessagingStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.nameserver = nameserver_pb2_grpc.NameServerStub(self.channel)
        self.replication = replication_pb2_grpc.ReplicationStub(self.channel)
        self.timer = timer_pb2_grpc.TimerAdminStub(self.channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    # ---- conveniences the tests share ----------------------------------------------------

    async def make_topic(self, topic: str, queues: int = 4) -> None:
        """Create ``topic`` the way a producer does: one send through the default topic."""
        await self.messaging.Send(
            messaging_pb2.SendRequest(
                producer_group="pg",
                default_topic=DEFAULT_TOPIC,
                default_topic_queue_nums=queues,
                messages=[common_pb2.Message(topic=topic, body=b"x")],
            )
        )

    async def set_config(self, key: str, value: str) -> None:
        """UpdateBrokerConfig of one key on this broker."""
        await self.admin.UpdateBrokerConfig(
            admin_pb2.UpdateBrokerConfigRequest(updates={key: value})
        )

    async def runtime_stats(self, timeout_s: float = 5.0) -> admin_pb2.GetRuntimeStatsResponse:
        resp: admin_pb2.GetRuntimeStatsResponse = await self.admin.GetRuntimeStats(
            admin_pb2.GetRuntimeStatsRequest(), timeout=timeout_s
        )
        return resp

    async def held_pulls(self) -> int:
        """Pulls the broker holds now (long polling), from GetRuntimeStats."""
        return (await self.runtime_stats()).held_pull_requests

    async def arrivals_checked(self) -> int:
        """Arrived messages the broker has checked against held pulls so far."""
        return int((await self.runtime_stats()).extra["held_pull_arrivals_checked"])

    async def route(
        self, topic: str, timeout_s: float = 5.0
    ) -> nameserver_pb2.GetRouteInfoByTopicResponse:
        """GetRouteInfoByTopic on this nameserver."""
        resp: nameserver_pb2.GetRouteInfoByTopicResponse = (
            await self.nameserver.GetRouteInfoByTopic(
                nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=timeout_s
            )
        )
        return resp


async def refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, int, str]:
    """Await ``call``, which must fail; its code, ErrorDetail reason and message."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        status = rpc_status.from_call(err)
        reason = common_pb2.ERROR_REASON_UNSPECIFIED
        if status is not None and status.details:
            detail = common_pb2.ErrorDetail()
            status.details[0].Unpack(detail)
            reason = detail.reason
        return err.code(), reason, err.details() or ""
    raise AssertionError("the call succeeded but was expected to fail")
