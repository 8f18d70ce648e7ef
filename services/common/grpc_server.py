"""gRPC server bootstrap shared by every RocketQ service (DESIGN.md §1).

Every service runs one ``grpc.aio`` server on one event loop, exposes the standard health
service (``grpc.health.v1``, which Kubernetes' native gRPC probes call) and reflection (so
``grpcurl`` works without proto files). Message limits sit above the 4 MiB message limit so that
RocketQ's own size check, not the transport, answers an oversized send with a clear error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.rpc_guard import DecodeGuard
from services.common.telemetry import state as telemetry_state
from services.common.telemetry.grpc_metrics import MetricsInterceptor

if TYPE_CHECKING:
    from services.common.security.settings import ServiceSecurity

#: Transport limit for requests and responses: a 4 MiB batch plus headroom for its framing.
GRPC_MESSAGE_MAX_BYTES = 16 * 1024 * 1024

PEER_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_MAX_BYTES),
    ("grpc.max_send_message_length", GRPC_MESSAGE_MAX_BYTES),
    # gRPC's own reconnect backoff grows to 120 s by default: a peer that was unreachable for
    # a while (a partition, a restart) would stay unused that long after it came back, whatever
    # our retry loops do. Our loops pace the retries; the channel only must not add to them.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 1_000),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
"""Channels of one service to another (broker to nameserver, slave to master)."""

SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_MAX_BYTES),
    ("grpc.max_send_message_length", GRPC_MESSAGE_MAX_BYTES),
    # Clients keep a ClientStream open for hours; let them ping it to detect dead peers.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.so_reuseport", 0),
]


def create_server(
    security: ServiceSecurity | None = None,
    *,
    acl_guard: grpc.aio.ServerInterceptor | None = None,
) -> grpc.aio.Server:
    """A server with RocketQ's transport options and the :class:`DecodeGuard` (undecodable
    requests answered INVALID_ARGUMENT), call metrics when telemetry is on, then access
    control when ``security`` enables it (after the metrics, so refused calls are counted); add
    servicers, then :func:`finish_setup`. ``acl_guard`` replaces the security's own guard (the
    v2 gateway's answers refusals in its protocol's statuses)."""
    interceptors: list[grpc.aio.ServerInterceptor] = [DecodeGuard()]
    if telemetry_state.METRICS:  # call duration and status per method (services.common.telemetry)
        interceptors.append(MetricsInterceptor())
    if acl_guard is not None:  # gwrpc: the gateway's ACL
        interceptors.append(acl_guard)
    elif security is not None:  # sec: ACL
        interceptors.extend(security.interceptors())
    return grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """The standard health service plus ``List`` (grpcio's raises NotImplementedError, which
    every caller of List turned into a logged traceback)."""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, health_pb2.HealthCheckResponse.ServingStatus.ValueType] = {}

    async def set(
        self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType
    ) -> None:
        self._statuses[service] = status
        await super().set(service, status)

    async def List(  # noqa: N802 - the gRPC method's name
        self, request: health_pb2.HealthListRequest, context: object
    ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in self._statuses.items()
            }
        )


def finish_setup(
    server: grpc.aio.Server,
    service_names: Iterable[str],
    listen: str,
    security: ServiceSecurity | None = None,
) -> tuple[health.aio.HealthServicer, int]:
    """Register health and reflection and bind ``listen`` ("host:port", port 0 = any free),
    with TLS when ``security`` configures it.

    Returns the health servicer (to flip to NOT_SERVING on shutdown) and the bound port.
    """
    names = list(service_names)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    port = security.add_port(server, listen) if security else server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}: the address is taken or not local")
    return health_servicer, port


async def set_serving(health_servicer: health.aio.HealthServicer, names: Iterable[str]) -> None:
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


async def set_not_serving(health_servicer: health.aio.HealthServicer, names: Iterable[str]) -> None:
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
