"""The timer-wheel process: storage recovery, the consumer, the hand and TimerAdmin.

Lifecycle, in the order the process convention expects:

1. load the configuration (``--set key=value``, see config.py) and the clock
   (:func:`clock_from_env`: a scaled clock in tests of long delays);
2. recover the storage to its checkpoint (TimerStore.open) — GetTimerStats answers
   UNAVAILABLE until this is done, though in practice the port opens after it;
3. bind ``--listen``, serve TimerAdmin + health + reflection, write the ready file
   ``{"addr", "pid"}`` atomically;
4. join the consumer group over rmq_sys_wheel_timer and start the hand;
5. on SIGTERM / SIGINT: health NOT_SERVING, stop the hand, stop pulling, checkpoint and commit
   the read offsets, leave the group, exit 0.

Logs are ``key=value`` lines on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from rocketq._api.rocketq.v1 import timer_pb2, timer_pb2_grpc
from services.common import grpc_server
from services.common.clock import Clock, clock_from_env
from services.nameserver.server import advertised_host, configure_logging, write_ready_file
from services.timer_wheel import config as config_mod
from services.timer_wheel.config import TimerConfig
from services.timer_wheel.dequeue import BrokerSender, Dequeuer
from services.timer_wheel.enqueue import TimerConsumer, TimerStore
from services.timer_wheel.service import TimerAdminService

log = logging.getLogger("rocketq.timer_wheel")

SERVICE_NAME = timer_pb2.DESCRIPTOR.services_by_name["TimerAdmin"].full_name
SHUTDOWN_GRACE_S = 2.0


async def serve(cfg: TimerConfig, ready_file: Path | None, clock: Clock) -> None:
    """Run the service until SIGTERM/SIGINT."""
    store = TimerStore(cfg, clock)
    store.open()
    consumer = TimerConsumer(store, cfg)
    server = grpc_server.create_server()
    dequeuer: Dequeuer | None = None
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    hand: asyncio.Task[None] | None = None
    try:
        await consumer.start()
        assert consumer.instance is not None
        dequeuer = Dequeuer(store, BrokerSender(consumer.instance, cfg.request_timeout_ms),
                            clock, cfg)  # fmt: skip
        admin = TimerAdminService(store, consumer, dequeuer)
        timer_pb2_grpc.add_TimerAdminServicer_to_server(admin, server)
        health, port = grpc_server.finish_setup(server, [SERVICE_NAME], cfg.listen)
        await server.start()
        admin.ready = True
        await grpc_server.set_serving(health, [SERVICE_NAME])
        hand = asyncio.create_task(dequeuer.run(), name="timer-hand")
        addr = f"{advertised_host(cfg.listen)}:{port}"
        if ready_file is not None:
            write_ready_file(ready_file, addr)
        log.info("timer-wheel serving addr=%s data_dir=%s hand_ms=%d precision_ms=%d slots=%d "
                 "clock_speed=%s", addr, cfg.data_dir, store.hand_ms, cfg.precision_ms,
                 cfg.wheel_slots, getattr(clock, "speed", 1))  # fmt: skip
        await stopping.wait()
        log.info("timer-wheel stopping addr=%s", addr)
        await grpc_server.set_not_serving(health, [SERVICE_NAME])
    finally:
        if dequeuer is not None:
            dequeuer.stop()
        if hand is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(hand, return_exceptions=True), 5)
        await consumer.close()
        await server.stop(SHUTDOWN_GRACE_S)
        store.close()
        log.info("timer-wheel stopped hand_ms=%d delivered_total=%d", store.hand_ms,
                 store.counters.delivered_total)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.timer_wheel",
        description="RocketQ timer-wheel service (delayed and retried messages)",
    )
    parser.add_argument("--namesrv", help="nameserver addresses, host:port[;host:port]")
    parser.add_argument("--data-dir", type=Path, help="TimerLog, MessageLog, wheel, checkpoint")
    parser.add_argument("--listen", help="host:port for TimerAdmin, port 0 = any free")
    parser.add_argument("--ready-file", type=Path, help='write {"addr", "pid"} here once serving')
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="configuration key (see services/timer_wheel/config.py)")  # fmt: skip
    args = parser.parse_args(argv)
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value
    if args.namesrv:
        overrides["namesrvAddr"] = args.namesrv
    if args.data_dir:
        overrides["dataDir"] = str(args.data_dir)
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        overrides["listenAddress"] = host or "0.0.0.0"
        overrides["listenPort"] = port
    configure_logging()
    try:
        cfg = config_mod.load(overrides)
        clock = clock_from_env()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(serve(cfg, args.ready_file, clock))
    except OSError as exc:
        log.error("timer-wheel cannot start: %s", exc)
        return 1
    return 0
