"""The timer-wheel process: storage recovery, the consumer, the hand and TimerAdmin.

Lifecycle (services.common.bootstrap runs it):

1. load the configuration (``-c``, ``ROCKETQ_TIMER_WHEEL_<KEY>``, ``--set key=value``, the
   flags below; see config.py) and the clock (:func:`clock_from_env`: a scaled clock in tests
   of long delays);
2. recover the storage to its checkpoint (TimerStore.open) — GetTimerStats answers
   UNAVAILABLE until this is done, though in practice the port opens after it;
3. bind ``--listen``, serve TimerAdmin + health + reflection, write the ready file
   ``{"addr", "pid"}`` atomically;
4. join the consumer group over rmq_sys_wheel_timer and start the hand;
5. on SIGTERM / SIGINT: health NOT_SERVING, stop the hand, stop pulling, checkpoint and commit
   the read offsets, leave the group, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

from grpc_health.v1 import health

from rocketq._api.rocketq.v1 import timer_pb2, timer_pb2_grpc
from services.common import grpc_server
from services.common.bootstrap import ServiceSpec, advertised_host, run_service, split_listen
from services.common.clock import Clock, clock_from_env
from services.common.security.settings import ServiceSecurity
from services.timer_wheel import config as config_mod
from services.timer_wheel import metrics as timer_metrics
from services.timer_wheel.config import TimerConfig
from services.timer_wheel.dequeue import BrokerSender, Dequeuer
from services.timer_wheel.enqueue import TimerConsumer, TimerStore
from services.timer_wheel.service import TimerAdminService

log = logging.getLogger("rocketq.timer_wheel")

SERVICE_NAME = timer_pb2.DESCRIPTOR.services_by_name["TimerAdmin"].full_name
SHUTDOWN_GRACE_S = 2.0
HAND_STOP_TIMEOUT_S = 5.0


class TimerWheel:
    """The running timer-wheel service (a bootstrap App)."""

    def __init__(self, cfg: TimerConfig, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.clock = clock_from_env() if clock is None else clock
        self.store = TimerStore(cfg, self.clock)
        self.consumer = TimerConsumer(self.store, cfg)
        self.security = ServiceSecurity(cfg, "timer-wheel")  # sec: TLS and ACL
        self.security.install_client_default()  # its consumer and producer sign and use TLS
        self.server = grpc_server.create_server(self.security)
        self.dequeuer: Dequeuer | None = None
        self.hand: asyncio.Task[None] | None = None
        self.health: health.aio.HealthServicer | None = None

    async def start(self) -> str:
        self.store.open()  # recovery; nothing to undo if it fails
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> str:
        cfg, store = self.cfg, self.store
        await self.consumer.start()
        assert self.consumer.instance is not None
        sender = BrokerSender(self.consumer.instance, cfg.request_timeout_ms)
        self.dequeuer = Dequeuer(store, sender, self.clock, cfg)
        admin = TimerAdminService(store, self.consumer, self.dequeuer)
        timer_pb2_grpc.add_TimerAdminServicer_to_server(admin, self.server)
        timer_metrics.install(admin.stats)
        self.health, port = grpc_server.finish_setup(
            self.server, [SERVICE_NAME], cfg.listen, self.security
        )
        await self.server.start()
        admin.ready = True
        await grpc_server.set_serving(self.health, [SERVICE_NAME])
        self.hand = asyncio.create_task(self.dequeuer.run(), name="timer-hand")
        addr = f"{advertised_host(cfg.listen_host)}:{port}"
        log.info("timer-wheel serving addr=%s data_dir=%s hand_ms=%d precision_ms=%d slots=%d "
                 "clock_speed=%s", addr, cfg.data_dir, store.hand_ms, cfg.precision_ms,
                 cfg.wheel_slots, getattr(self.clock, "speed", 1))  # fmt: skip
        return addr

    async def stop(self) -> None:
        if self.health is not None:
            with contextlib.suppress(Exception):
                await grpc_server.set_not_serving(self.health, [SERVICE_NAME])
        if self.dequeuer is not None:
            self.dequeuer.stop()
        if self.hand is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(self.hand, return_exceptions=True), HAND_STOP_TIMEOUT_S
                )
        await self.consumer.close()
        await self.server.stop(SHUTDOWN_GRACE_S)
        self.store.close()
        log.info("timer-wheel stopped hand_ms=%d delivered_total=%d", self.store.hand_ms,
                 self.store.counters.delivered_total)  # fmt: skip


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namesrv", help="nameserver addresses, host:port[;host:port]")
    parser.add_argument("--data-dir", type=Path, help="TimerLog, MessageLog, wheel, checkpoint")
    parser.add_argument("--listen", help="host:port for TimerAdmin, port 0 = any free")


def _flag_overrides(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    if args.namesrv:
        out["namesrvAddr"] = args.namesrv
    if args.data_dir:
        out["dataDir"] = str(args.data_dir)
    if args.listen:
        out.update(split_listen(args.listen))
    return out


def _load(config_file: Path | None, overrides: Mapping[str, str]) -> TimerConfig:
    return config_mod.load(overrides, config_file=config_file)


def spec(prog: str = "python -m services.timer_wheel") -> ServiceSpec[TimerConfig]:
    return ServiceSpec(
        service="timer-wheel",
        prog=prog,
        description="RocketQ timer-wheel service (delayed and retried messages)",
        load=_load,
        app=TimerWheel,
        add_flags=_add_flags,
        flag_overrides=_flag_overrides,
        table=config_mod.TABLE,
    )


def main(argv: list[str] | None = None, prog: str = "python -m services.timer_wheel") -> int:
    return run_service(spec(prog), argv)
