"""``rocketq dev up --ha``: an etcd, a nameserver and a replica group of broker-a in controller
mode (automatic failover, DESIGN.md §6) that elects its master through etcd; then the
timer-wheel and the demo, as for ``dev up``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import click

from rocketq.cli._common import run
from rocketq.cli.io_cmd import demo_round_trip
from rocketq.client.admin import Admin
from rocketq.client.errors import RocketQError
from services.cli._children import (
    DEMO_GROUP,
    DEMO_MESSAGES,
    DEMO_TOPIC,
    HA_BROKER_NAME,
    READY_TIMEOUT_S,
    REPLICA_PREFIX,
    TIMER_DATA_DIR,
    spawn,
    spawn_etcd,
    stop_all,
    supervise,
    write_pids,
)
from services.common.supervisor import Process


@dataclass(frozen=True)
class HaPorts:
    namesrv: int
    broker: int
    """Port of replica 1 (replica K gets this + K - 1); 0 = any free."""
    etcd: int
    gateway: int = 0
    """RocketMQ 5 gateway port of replica 1 (replica K gets this + K - 1); 0 = off."""


def dev_up_ha(
    base: Path,
    ports: HaPorts,
    replicas: int,
    overrides: tuple[str, ...],
    timer_args: list[str] | None,
    *,
    detach: bool,
    demo: bool,
) -> None:
    """``dev up --ha``: etcd, nameserver, ``replicas`` replicas, a master elected, timer-wheel,
    demo; then detach or supervise (a dying replica does not stop the others)."""
    store_dirs = [f"store-{REPLICA_PREFIX}{k}" for k in range(1, replicas + 1)]
    for sub in ("logs", "run", "etcd", *store_dirs, *([TIMER_DATA_DIR] if timer_args else [])):
        (base / sub).mkdir(parents=True, exist_ok=True)
    children: list[Process] = []
    try:
        etcd = spawn_etcd(base, ports.etcd)
        children.append(etcd)
        ns = spawn("namesrv", ["--listen", f"127.0.0.1:{ports.namesrv}"], base)
        children.append(ns)
        for k in range(1, replicas + 1):
            args = _replica_args(base, k, ports, etcd.addr, overrides)
            name = f"{REPLICA_PREFIX}{k}"
            children.append(spawn(name, ["--set", f"namesrvAddr={ns.addr}", *args], base))
        master_id, master_addr, epoch = run(_wait_for_master(ns.addr, READY_TIMEOUT_S))
        if timer_args is not None:
            children.append(spawn("timer", ["--namesrv", ns.addr, *timer_args], base))
        if demo:
            click.echo(run(demo_round_trip(ns.addr, DEMO_TOPIC, DEMO_GROUP, DEMO_MESSAGES)))
    except BaseException:
        stop_all(children)
        raise
    addrs = {c.name: c.addr for c in children}
    if detach:
        known = {"namesrv": ns.addr, "broker": master_addr, "etcd": etcd.addr}
        write_pids(base, {**known, "timer": addrs.get("timer", "")}, children)
    master_pid = next(c.pid for c in children if c.addr == master_addr)
    _summary_ha(base, addrs, replicas, (master_id, master_pid, epoch), detach)
    if ports.gateway:
        last = ports.gateway + replicas - 1
        click.echo(f"RocketMQ 5 gateway (official SDKs' endpoint): 127.0.0.1:{ports.gateway}"
                   f" (replica K: {ports.gateway} + K - 1, up to {last})")  # fmt: skip
    if not detach:
        supervise(children, expendable=(REPLICA_PREFIX,))


def _summary_ha(
    base: Path, addrs: dict[str, str], replicas: int, master: tuple[int, int, int], detach: bool
) -> None:
    """What runs where; ``master`` is (replica id, pid, epoch)."""
    master_id, master_pid, epoch = master
    ns_addr = addrs["namesrv"]
    store_dirs = [f"store-{REPLICA_PREFIX}{k}" for k in range(1, replicas + 1)]
    replica_rows = "".join(
        f"  replica {k:<3} {addrs[f'{REPLICA_PREFIX}{k}']}  (data {base / store_dirs[k - 1]})"
        + ("  master\n" if k == master_id else "\n")
        for k in range(1, replicas + 1)
    )
    stop = f"rocketq dev down --dir {base}" if detach else "press Ctrl-C"
    timer = addrs.get("timer", "not running")
    click.echo(
        f"\nRocketQ is running with automatic failover ({HA_BROKER_NAME}, epoch {epoch})\n"
        f"  nameserver  {ns_addr}\n"
        f"  etcd        {addrs['etcd']}  (data {base / 'etcd'})\n"
        f"{replica_rows}"
        f"  timer-wheel {timer}\n"
        f"  logs        {base / 'logs'}\n"
        f"  stop        {stop}\n"
        f"next:\n"
        f"  export ROCKETQ_NAMESRV={ns_addr}\n"
        f"  rocketq ha status\n"
        f"  rocketq ha switchover {HA_BROKER_NAME}\n"
        f"  kill -9 {master_pid}   # the master; then: rocketq ha status\n"
    )


def _replica_args(
    base: Path, k: int, ports: HaPorts, etcd_addr: str, overrides: tuple[str, ...]
) -> list[str]:
    """Broker flags of replica ``k``: SYNC_MASTER unless the user says otherwise, the user's
    keys, then the ones that give it its identity, store, ports and etcd (those win: replicas
    share a host, so each needs its own ports)."""
    gateway = ports.gateway + k - 1 if ports.gateway else 0
    args = ["--set", "brokerRole=SYNC_MASTER"]
    for item in overrides:
        args += ["--set", item]
    port = ports.broker + k - 1 if ports.broker else 0
    for item in (
        f"brokerName={HA_BROKER_NAME}",
        f"brokerId={k}",
        f"etcdEndpoints={etcd_addr}",
        "listenAddress=127.0.0.1",
        f"listenPort={port}",
        f"gatewayPort={gateway}",
        "brokerIP1=127.0.0.1",
        f"storePathRootDir={base / f'store-{REPLICA_PREFIX}{k}'}",
    ):
        args += ["--set", item]
    return args


async def _wait_for_master(ns_addr: str, timeout_s: float) -> tuple[int, str, int]:
    """(replica id, address, epoch) of broker-a's master once one leads and the nameserver has
    it as brokerId 0 (what producers need); ClickException after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    async with Admin([ns_addr]) as admin:
        while time.monotonic() < deadline:
            try:
                [group] = await admin.ha_status(HA_BROKER_NAME)
                registered = (await admin.cluster_info()).brokers[HA_BROKER_NAME].master_addr
                if group.master_replica_id is not None and registered == group.master_addr:
                    return group.master_replica_id, group.master_addr, group.epoch
                last = "; ".join(group.warnings) or "no master registered yet"
            except (RocketQError, KeyError) as exc:
                last = str(exc)
            await asyncio.sleep(0.2)
    raise click.ClickException(
        f"{HA_BROKER_NAME} elected no master within {timeout_s:.0f}s ({last}); see the "
        "replica-K.log files"
    )
