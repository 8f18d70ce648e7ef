"""The nameserver process: one grpc.aio server, one RouteTable, one expiry scan (SPEC §2).

Lifecycle, in the order the process convention expects (tests and Kubernetes rely on it):

1. bind ``--listen`` (port 0 picks a free port), start serving, mark health SERVING;
2. write ``{"addr": "host:port", "pid": N}`` to ``--ready-file`` atomically (tmp + rename);
3. every ``--scan-interval-ms`` (10 s) drop brokers silent past their heartbeat timeout and
   log each one removed;
4. on SIGTERM or SIGINT: health NOT_SERVING, stop the scan, let in-flight calls finish for a
   short grace period, exit 0.

Logs are ``key=value`` lines on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc
from services.common import grpc_server
from services.common.clock import SYSTEM_CLOCK, Clock
from services.nameserver.route_table import RouteTable, log_removed
from services.nameserver.service import NameServerService

log = logging.getLogger("rocketq.nameserver")

DEFAULT_LISTEN = "0.0.0.0:9876"
DEFAULT_SCAN_INTERVAL_MS = 10_000
SHUTDOWN_GRACE_S = 2.0
"""How long in-flight calls may finish after SIGTERM before they are cancelled."""
SERVICE_NAME = nameserver_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name
_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")


async def serve(
    listen: str,
    ready_file: Path | None,
    scan_interval_ms: int = DEFAULT_SCAN_INTERVAL_MS,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Run the nameserver until SIGTERM/SIGINT."""
    table = RouteTable(clock)
    server = grpc_server.create_server()
    nameserver_pb2_grpc.add_NameServerServicer_to_server(NameServerService(table), server)
    health, port = grpc_server.finish_setup(server, [SERVICE_NAME], listen)
    await server.start()
    await grpc_server.set_serving(health, [SERVICE_NAME])
    addr = f"{advertised_host(listen)}:{port}"
    if ready_file is not None:
        write_ready_file(ready_file, addr)
    log.info("nameserver serving addr=%s listen=%s scan_interval_ms=%d", addr, listen,
             scan_interval_ms)  # fmt: skip

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    scan = asyncio.create_task(_scan_loop(table, scan_interval_ms), name="expiry-scan")
    try:
        await stopping.wait()
    finally:
        log.info("nameserver stopping addr=%s", addr)
        await grpc_server.set_not_serving(health, [SERVICE_NAME])
        scan.cancel()
        await asyncio.gather(scan, return_exceptions=True)
        await server.stop(SHUTDOWN_GRACE_S)
        log.info("nameserver stopped addr=%s", addr)


async def _scan_loop(table: RouteTable, interval_ms: int) -> None:
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            for removed in table.scan_expired():
                log_removed(removed)
        except Exception:  # a bug here must not stop expiry for the life of the process
            log.exception("expiry scan failed")


def advertised_host(listen: str) -> str:
    """The host to write in the ready file: a wildcard listen is reached on 127.0.0.1."""
    host = listen.rpartition(":")[0]
    return "127.0.0.1" if host in _WILDCARD_HOSTS else host


def write_ready_file(path: Path, addr: str) -> None:
    """Write the ready file atomically, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"addr": addr, "pid": os.getpid()}))
    tmp.replace(path)


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.nameserver", description="RocketQ nameserver (route registry)"
    )
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port, port 0 = any free")
    parser.add_argument("--ready-file", type=Path, help='write {"addr", "pid"} here once serving')
    parser.add_argument(
        "--scan-interval-ms",
        type=int,
        default=DEFAULT_SCAN_INTERVAL_MS,
        help="how often expired brokers are removed (default 10000)",
    )
    args = parser.parse_args(argv)
    if args.scan_interval_ms < 1:
        parser.error("--scan-interval-ms must be at least 1")
    configure_logging()
    try:
        asyncio.run(serve(args.listen, args.ready_file, args.scan_interval_ms))
    except OSError as exc:
        log.error("nameserver cannot start: %s", exc)
        return 1
    return 0
