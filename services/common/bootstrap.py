"""The one way a RocketQ server process starts, serves and stops (every ``services/*/server.py``).

:func:`run_service` does, in order:

1. parse the command line: the flags every service has (``-c/--config FILE``, repeated ``--set
   KEY=VALUE``, ``--ready-file FILE``) plus the service's own (``--listen`` …), which it maps to
   keys of its table (:class:`ServiceSpec`);
2. load the configuration (services.common.config: defaults ← file ← ``ROCKETQ_<SERVICE>_<KEY>``
   environment ← ``--set`` ← the service's own flags); a bad key or value exits 2 with a
   message naming it;
3. set up logging (services.common.logs) at the configured ``logLevel`` and telemetry
   (services.common.telemetry: tracer and meter providers from ``traceExporter``,
   ``metricsPort`` ...; the /metrics endpoint is bound before the app starts);
4. run the service's :class:`App` on one event loop: ``start()`` returns the advertised
   address, which goes into the ready file (``{"addr", "pid"}``, written atomically: tests and
   supervisors poll it); SIGTERM or SIGINT then runs ``stop()`` and the process exits 0;
   an ``OSError`` while starting (a port taken) is logged and exits 1.

Nothing here imports grpc: a service builds its own server with services.common.grpc_server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from services.common import logs
from services.common.clock import clock_from_env
from services.common.config import ConfigError, KeyTable, parse_set_flags
from services.common.telemetry import setup as telemetry_setup

log = logging.getLogger(__name__)

C = TypeVar("C")
_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")
EXIT_CONFIG_ERROR = 2
EXIT_START_FAILED = 1


class App(Protocol):
    """A service's running part: started once, stopped once."""

    async def start(self) -> str:
        """Start serving; return the advertised ``host:port``."""
        ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class ServiceSpec(Generic[C]):
    """What :func:`run_service` needs to know about one service."""

    service: str
    """Its name in logs and environment variables: "nameserver", "broker", "timer-wheel"."""
    prog: str
    description: str
    load: Callable[[Path | None, Mapping[str, str]], C]
    """(config file, key overrides) → config; raises ConfigError (a ValueError)."""
    app: Callable[[C], App]
    add_flags: Callable[[argparse.ArgumentParser], None] = lambda _parser: None
    """Adds the service's own flags to its parser."""
    flag_overrides: Callable[[argparse.Namespace], dict[str, str]] = lambda _args: {}
    """The keys the service's own flags set (they win over ``--set``)."""
    log_context: Callable[[C], dict[str, Any]] = field(default=lambda _cfg: {})
    """Bound on every log line besides service and pid (a broker: its name)."""
    table: KeyTable | None = None
    """Its config keys, listed in ``--help``."""


def build_parser(spec: ServiceSpec[Any]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=spec.prog, description=spec.description, epilog=_epilog(spec.table)
    )
    parser.add_argument(
        "-c", "--config", type=Path, help="config file: key=value lines (RocketMQ key names)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set logLevel=DEBUG (repeatable)",
    )
    parser.add_argument("--ready-file", type=Path, help="write {addr, pid} JSON here when serving")
    spec.add_flags(parser)
    return parser


def _epilog(table: KeyTable | None) -> str | None:
    if table is None:
        return None
    return (
        f"Configuration, later sources winning: defaults, the -c file, environment variables "
        f"{table.env_prefix}<KEY> (e.g. {table.env_prefix}LOGLEVEL=DEBUG), --set, then the "
        f"flags above. Keys: {', '.join(sorted(table.keys))}."
    )


def load_config(spec: ServiceSpec[C], args: argparse.Namespace) -> C:
    overrides = parse_set_flags(args.set)
    overrides.update(spec.flag_overrides(args))
    return spec.load(args.config, overrides)


def run_service(spec: ServiceSpec[C], argv: list[str] | None = None) -> int:
    """Parse ``argv``, load the config, set up logging, serve until a signal; the exit code."""
    parser = build_parser(spec)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(spec, args)
        clock_from_env()  # a bad ROCKETQ_CLOCK_SPEED is a configuration error too
    except (ConfigError, ValueError, OSError) as exc:
        print(f"{spec.prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    logs.configure(spec.service, getattr(cfg, "log_level", "INFO"), **spec.log_context(cfg))
    try:
        context = {f"rocketq.{k}": str(v) for k, v in spec.log_context(cfg).items()}
        tel = telemetry_setup.setup(spec.service, cfg, **context)
    except (ValueError, OSError) as exc:
        print(f"{spec.prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        asyncio.run(serve(lambda: spec.app(cfg), args.ready_file, spec.service, tel))
    except ConfigError as exc:  # found while starting: a TLS or ACL file that cannot be used
        print(f"{spec.prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except OSError as exc:
        log.error("%s cannot start: %s", spec.service, exc)
        return EXIT_START_FAILED
    return 0


async def serve(
    make_app: Callable[[], App],
    ready_file: Path | None,
    name: str = "service",
    telemetry: telemetry_setup.Telemetry | None = None,
) -> None:
    """Make the app (on the running loop: grpc.aio servers bind to it), start it, write the
    ready file, wait for SIGTERM/SIGINT, stop the app. ``telemetry``'s /metrics endpoint
    serves from before the start to after the stop."""
    app = make_app()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        if telemetry is not None:
            await telemetry.start_http()
        addr = await app.start()
        try:
            if ready_file is not None:
                write_ready_file(ready_file, addr)
            await stopping.wait()
            log.info("%s stopping addr=%s", name, addr)
        finally:
            await app.stop()
    finally:
        if telemetry is not None:
            await telemetry.stop()  # exports the spans still queued


def split_listen(listen: str) -> dict[str, str]:
    """``host:port`` as the listenAddress and listenPort keys (an empty host is 0.0.0.0)."""
    host, _, port = listen.rpartition(":")
    return {"listenAddress": host or "0.0.0.0", "listenPort": port}


def advertised_host(listen_host: str) -> str:
    """The host to advertise for a bind address: a wildcard is reached on 127.0.0.1."""
    return "127.0.0.1" if listen_host in _WILDCARD_HOSTS else listen_host


def write_ready_file(path: Path, addr: str) -> None:
    """Write ``{"addr", "pid"}`` atomically (tmp + rename), so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"addr": addr, "pid": os.getpid()}))
    tmp.replace(path)
