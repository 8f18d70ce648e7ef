"""How every SDK gRPC channel is opened: message limits, keepalive and reconnect pacing.

- Message limits are 16 MiB both ways, above the 4 MiB message/batch limit, so an oversized
  send is refused by RocketQ's own size check with a clear error rather than by the transport
  (the servers use the same figure, services/common/grpc_server.py).
- Keepalive pings every 30 s on idle connections, so a ClientStream to a broker whose host
  vanished without closing TCP (SPEC §2.5 "pseudo-death") fails within ~40 s instead of hanging.
  The servers allow pings without calls and at most one per 5 s.
- Reconnect backoff is capped at 5 s (gRPC's default cap is 120 s): a restarted broker or
  nameserver should be usable again within seconds, which is what a message queue user expects.
"""

from __future__ import annotations

import grpc

from rocketq.client.security import ClientSecurity, security_channel

#: Transport limit for one request or response.
CHANNEL_MESSAGE_MAX_BYTES = 16 * 1024 * 1024

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", CHANNEL_MESSAGE_MAX_BYTES),
    ("grpc.max_receive_message_length", CHANNEL_MESSAGE_MAX_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


def open_channel(addr: str, security: ClientSecurity | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``addr`` ("host:port") with :data:`CHANNEL_OPTIONS`: TLS and
    signed requests as ``security`` (default: the process's :func:`default_security`) says."""
    return security_channel(addr, CHANNEL_OPTIONS, security)  # sec: rocketq/client/security.py
