"""What ``rocketq dev up`` and ``dev up --ha`` share: the child processes under DIR, started
and stopped through the supervisor (services.common.supervisor), and their pids file."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from services.common import etcd, supervisor
from services.common.supervisor import Process, SpawnError, StopTimeout

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SUPERVISE_POLL_S = 0.2
TAIL_LINES = 20
DEMO_TOPIC = "DemoTopic"
DEMO_GROUP = "demo-consumer"
DEMO_MESSAGES = 3
TIMER_DATA_DIR = "timer-0"
_MODULES = {
    "namesrv": "services.nameserver",
    "broker": "services.broker",
    "timer": "services.timer_wheel",
}
#: dev down stops in this order: what depends on the others first (slaves, "slave-K", just
#: before their master; etcd, which the replicas use to give up their leases, last).
_STOP_ORDER = ("timer", "slave", "replica", "broker", "namesrv", "etcd")
SLAVE_PREFIX = "slave-"
SLAVES_MAX = 8
REPLICA_PREFIX = "replica-"
REPLICAS_MAX = 8
HA_BROKER_NAME = "broker-a"
ETCD_MEMBER = "rocketq-dev-etcd"
"""The dev etcd's member name; also how ``dev down`` recognises its process."""


def module_of(name: str) -> str:
    """The server module a child named ``name`` runs ("slave-K", "replica-K" run a broker)."""
    if name.startswith((SLAVE_PREFIX, REPLICA_PREFIX)):
        return _MODULES["broker"]
    return _MODULES[name]


def stop_rank(name: str) -> int:
    for prefix in (SLAVE_PREFIX, REPLICA_PREFIX):
        if name.startswith(prefix):
            return _STOP_ORDER.index(prefix.rstrip("-"))
    return _STOP_ORDER.index(name)


def spawn(name: str, args: list[str], base: Path) -> Process:
    """Start server ``name`` with its log in DIR/logs and ready file in DIR/run; in its own
    session, so Ctrl-C reaches only ``dev up``, which stops the children in order."""
    try:
        return supervisor.spawn(
            name,
            module_of(name),
            args,
            base,
            log_path=base / "logs" / f"{name}.log",
            ready_file=base / "run" / f"{name}.ready",
            new_session=True,
            timeout_s=READY_TIMEOUT_S,
        )
    except SpawnError as exc:
        raise click.ClickException(str(exc)) from None


def spawn_etcd(base: Path, client_port: int) -> Process:
    """A one-member etcd on loopback with its data in DIR/etcd, ready once /health says so."""
    try:
        return etcd.start_etcd(
            base / "etcd",
            "etcd",
            client_port,
            member=ETCD_MEMBER,
            log_path=base / "logs" / "etcd.log",
            new_session=True,
            timeout_s=READY_TIMEOUT_S,
        )
    except etcd.EtcdMissing as exc:
        raise click.ClickException(f"--ha needs etcd, which is not installed: {exc}") from None
    except SpawnError as exc:
        raise click.ClickException(str(exc)) from None


def stop_child(child: Process) -> bool:
    """SIGTERM, SIGKILL after the timeout. True if it stopped cleanly."""
    try:
        child.stop(STOP_TIMEOUT_S)
    except StopTimeout:
        return False
    return True


def stop_all(children: list[Process]) -> bool:
    """Stop in reverse start order (timer-wheel, brokers, nameserver, etcd)."""
    return all([stop_child(c) for c in reversed(children)])


def is_ours(pid: int, name: str, base: Path) -> bool:
    """Whether ``pid`` still runs server ``name`` of the instance in ``base``. Pids are recycled
    (Linux's default pid_max is 32 768), and a recycled pid may well run the same kind of server
    for another instance: only this instance's own argument tells (its ready file; etcd's data
    directory)."""
    marker = str(base / "etcd" / "data") if name == "etcd" else str(base / "run" / f"{name}.ready")
    return supervisor.cmdline_has(pid, marker)


def pids_file(base: Path) -> Path:
    return base / "pids.json"


def write_pids(base: Path, addrs: dict[str, str], children: list[Process]) -> None:
    """DIR/pids.json: what ``dev down`` stops (``addrs``: namesrv, broker, timer[, etcd])."""
    processes = {c.name: {"pid": c.pid, "addr": c.addr} for c in children}
    pids_file(base).write_text(json.dumps({**addrs, "processes": processes}, indent=2))


def running(base: Path) -> dict[str, Any] | None:
    """The detached instance recorded in DIR/pids.json, if any of its processes still runs."""
    try:
        data: dict[str, Any] = json.loads(pids_file(base).read_text())
    except (OSError, ValueError):
        return None
    processes = data.get("processes", {})
    alive = any(is_ours(int(p["pid"]), name, base) for name, p in processes.items())
    return data if alive else None


def stop_recorded(base: Path, processes: dict[str, Any]) -> bool:
    """``dev down``: stop the processes of pids.json (not our children) in dependency order."""
    clean = True
    for name in sorted(processes, key=stop_rank):
        pid = int(processes[name]["pid"])
        clean = supervisor.stop_pid(pid, _ours_check(name, base), STOP_TIMEOUT_S) and clean
    return clean


def _ours_check(name: str, base: Path) -> Callable[[int], bool]:
    return lambda pid: is_ours(pid, name, base)


def supervise(children: list[Process], expendable: tuple[str, ...] = ()) -> None:
    """Stay in the foreground until Ctrl-C/SIGTERM or a child dies; then stop them all. A child
    whose name starts with one of ``expendable`` (a failover replica) may die: that is reported
    once and the others keep running."""
    stop = {"requested": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    died: Process | None = None
    reported: set[str] = set()
    while not stop["requested"] and died is None:
        for c in children:
            if c.alive() or c.name in reported:
                continue
            if not c.name.startswith(expendable) or not expendable:
                died = c
                break
            reported.add(c.name)
            click.echo(
                f"{c.name} exited with code {c.proc.returncode}; the others go on (a new master "
                f"is elected if it led); see {c.log_path}",
                err=True,
            )
        time.sleep(SUPERVISE_POLL_S)
    if died is not None:
        click.echo(
            f"{died.name} exited with code {died.proc.returncode}; last lines of "
            f"{died.log_path}:\n{died.log_tail(TAIL_LINES)}",
            err=True,
        )
    click.echo("stopping RocketQ ...")
    # Timer-wheel first (it re-puts to the broker), then the broker, then the nameserver.
    clean = stop_all(children)
    click.echo("stopped" if clean else "stopped (some processes had to be killed)")
    sys.exit(1 if died is not None else 0)
