"""CPU per small RPC, client and server in one process: plain, signed + ACL, TLS, TLS + ACL.

On a loaded machine throughput swings by a factor of two between identical runs; the CPU time
a call costs (``time.process_time``) moves far less, and is what TLS and ACL add. One grpc.aio
server with the services' interceptors (DecodeGuard, then AclGuard) answers GetMaxOffset; 16
callers on one SDK channel make ``calls`` calls.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc
from rocketq.client.security import ClientSecurity, security_channel
from services.common import grpc_server
from services.common.security.certs import TestCA
from services.common.security.settings import ServiceSecurity

CALLERS = 16


class _Offsets(messaging_pb2_grpc.MessagingServicer):
    async def GetMaxOffset(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        return messaging_pb2.GetMaxOffsetResponse(offset=1)


async def _cpu_us_per_call(base: Path, tls: bool, acl: bool, calls: int) -> float:
    ca = TestCA(base / "pki")
    server_leaf, client_leaf = ca.issue("server"), ca.issue("client")
    acl_file = base / "acl.json"
    users = {"u": {"secretKey": "k", "topics": {"*": "PUB|SUB"}, "groups": {"*": "SUB"}}}
    acl_file.write_text(json.dumps({"users": users}))
    cfg = SimpleNamespace(
        tls_cert_file=str(server_leaf.cert_file) if tls else "",
        tls_key_file=str(server_leaf.key_file) if tls else "",
        tls_ca_file=str(ca.ca_file) if tls else "",
        tls_client_auth="require" if tls else "none",
        acl_enable=acl,
        acl_file=str(acl_file) if acl else "",
    )
    security = ServiceSecurity(cfg, "bench")
    server = grpc_server.create_server(security)
    messaging_pb2_grpc.add_MessagingServicer_to_server(_Offsets(), server)  # type: ignore[abstract]
    _, port = grpc_server.finish_setup(server, ["rocketq.v1.Messaging"], "127.0.0.1:0", security)
    await server.start()
    tls_files = (str(ca.ca_file), str(client_leaf.cert_file), str(client_leaf.key_file))
    client = ClientSecurity(
        *(tls_files if tls else ("", "", "")),
        access_key="u" if acl else "",
        secret_key="k" if acl else "",
    )
    channel = security_channel(f"127.0.0.1:{port}", [], client)
    stub = messaging_pb2_grpc.MessagingStub(channel)
    request = messaging_pb2.GetMaxOffsetRequest(topic="t", queue_id=0)
    await stub.GetMaxOffset(request)  # connect (and handshake) outside the measurement

    async def caller() -> None:
        for _ in range(calls // CALLERS):
            await stub.GetMaxOffset(request)

    start = time.process_time()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    used_s = time.process_time() - start
    await channel.close()
    await server.stop(0)
    return used_s / (calls // CALLERS * CALLERS) * 1e6


def cpu_per_call(base: Path, calls: int, rounds: int) -> dict[str, float]:
    """Best (lowest) µs of CPU per call of each mode over ``rounds`` interleaved rounds."""
    modes = {"plain": (False, False), "acl": (False, True), "tls": (True, False),
             "tls+acl": (True, True)}  # fmt: skip
    best: dict[str, float] = {}
    for r in range(rounds):
        for name, (tls, acl) in modes.items():
            us = asyncio.run(_cpu_us_per_call(base / f"cpu-{name}-{r}", tls, acl, calls))
            best[name] = min(best.get(name, us), us)
    return best
