"""The nameserver process: one grpc.aio server, one RouteTable, one expiry scan (SPEC §2).

Lifecycle (services.common.bootstrap runs it; tests and Kubernetes rely on the order):

1. bind ``--listen`` (port 0 picks a free port), start serving, mark health SERVING;
2. write ``{"addr": "host:port", "pid": N}`` to ``--ready-file`` atomically (tmp + rename);
3. every ``scanNotActiveBrokerInterval`` ms (10 s; ``--scan-interval-ms``) drop brokers silent
   past their heartbeat timeout and log each one removed;
4. on SIGTERM or SIGINT: health NOT_SERVING, stop the scan, let in-flight calls finish for a
   short grace period, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc
from services.common import grpc_server
from services.common.bootstrap import ServiceSpec, advertised_host, run_service, split_listen
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.security.settings import ServiceSecurity
from services.nameserver import config
from services.nameserver.config import NameServerConfig
from services.nameserver.route_table import RouteTable, log_removed
from services.nameserver.service import NameServerService

log = logging.getLogger("rocketq.nameserver")

SHUTDOWN_GRACE_S = 2.0
"""How long in-flight calls may finish after SIGTERM before they are cancelled."""
SERVICE_NAME = nameserver_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name


class NameServer:
    """The running nameserver (a bootstrap App)."""

    def __init__(self, cfg: NameServerConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cfg = cfg
        self.table = RouteTable(clock)
        self.security = ServiceSecurity(cfg, "nameserver")  # sec: TLS and ACL
        self.server = grpc_server.create_server(self.security)
        self.addr = ""
        self._scan: asyncio.Task[None] | None = None

    async def start(self) -> str:
        cfg = self.cfg
        service = NameServerService(self.table)
        nameserver_pb2_grpc.add_NameServerServicer_to_server(service, self.server)
        self.health, port = grpc_server.finish_setup(
            self.server, [SERVICE_NAME], cfg.listen, self.security
        )
        await self.server.start()
        await grpc_server.set_serving(self.health, [SERVICE_NAME])
        self.addr = f"{advertised_host(cfg.listen_host)}:{port}"
        self._scan = asyncio.create_task(self._scan_loop(), name="expiry-scan")
        log.info("nameserver serving addr=%s listen=%s scan_interval_ms=%d", self.addr,
                 cfg.listen, cfg.scan_interval_ms)  # fmt: skip
        return self.addr

    async def stop(self) -> None:
        await grpc_server.set_not_serving(self.health, [SERVICE_NAME])
        if self._scan is not None:
            self._scan.cancel()
            await asyncio.gather(self._scan, return_exceptions=True)
        await self.server.stop(SHUTDOWN_GRACE_S)
        log.info("nameserver stopped addr=%s", self.addr)

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.scan_interval_ms / 1000)
            try:
                for removed in self.table.scan_expired():
                    log_removed(removed)
            except Exception:  # a bug here must not stop expiry for the life of the process
                log.exception("expiry scan failed")


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", help="host:port, port 0 = any free (default 0.0.0.0:9876)")
    parser.add_argument("--scan-interval-ms", help="how often expired brokers are removed (10000)")


def _flag_overrides(args: argparse.Namespace) -> dict[str, str]:
    out = split_listen(args.listen) if args.listen else {}
    if args.scan_interval_ms is not None:
        out["scanNotActiveBrokerInterval"] = args.scan_interval_ms
    return out


def spec(prog: str = "python -m services.nameserver") -> ServiceSpec[NameServerConfig]:
    return ServiceSpec(
        service="nameserver",
        prog=prog,
        description="RocketQ nameserver (route registry)",
        load=config.load,
        app=NameServer,
        add_flags=_add_flags,
        flag_overrides=_flag_overrides,
        table=config.TABLE,
    )


def main(argv: list[str] | None = None, prog: str = "python -m services.nameserver") -> int:
    return run_service(spec(prog), argv)
