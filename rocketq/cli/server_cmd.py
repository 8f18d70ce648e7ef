"""``rocketq nameserver``, ``broker``, ``timer-wheel`` and ``dev up|down``: run RocketQ's servers.

``nameserver``, ``broker`` and ``timer-wheel`` are the same programs as ``python -m
services.nameserver``, ``python -m services.broker`` and ``python -m services.timer_wheel``
(flags passed through unchanged); the server side is imported only inside the commands, so
``import rocketq`` never pulls it in.

``dev up`` is the embedded default for one machine: a nameserver, a broker and a timer-wheel
(delayed messages, consume retries) as child processes, data and logs under one directory::

    DIR/store/        the broker's store (commitlog, consume queues, index, config)
    DIR/store-slave-K/  with --slaves N: slave K's store (K = 1..N, its brokerId)
    DIR/timer-0/      the timer-wheel's data (TimerLog, wheel, message log, checkpoint)
    DIR/logs/         namesrv.log, broker.log, slave-K.log, timer.log
    DIR/run/          ready files ({"addr", "pid"}, written by each process once serving)
    DIR/pids.json     with --detach: what ``dev down`` stops

``--slaves N`` adds N slaves of the broker (brokerName broker-a, brokerId 1..N, brokerRole
SLAVE, each with its own store), started after the master; they find it through the
nameserver and replicate its commitlog (DESIGN.md §6). ``rocketq cluster list`` shows their
replication lag. The broker stays ASYNC_MASTER unless ``--set brokerRole=SYNC_MASTER``; the
``--set`` keys apply to the slaves too, except the ones that make them slaves.

``--ha`` runs the group in controller mode instead (automatic failover, DESIGN.md §6): an etcd
(``DIR/etcd/``, loopback, ``--etcd-port``, any free port by default) and ``--replicas N``
(default 3) replicas of broker-a (brokerId 1..N = their replica ids, brokerRole SYNC_MASTER,
``DIR/store-replica-K/``, log ``replica-K.log``) that elect their master through it; ``dev up``
waits until one leads and is registered as brokerId 0. A replica that dies (kill the master to
watch a failover) does not stop the others; ``rocketq ha status`` shows the new master,
``rocketq ha switchover broker-a`` hands the role over. ``dev down`` stops the timer-wheel, the
replicas, the nameserver and then etcd.

It waits for each ready file in turn, creates a demo topic, sends a few messages and reads them
back (proving the round trip before saying "running"), prints how to use it, and stays in the
foreground until Ctrl-C, stopping the timer-wheel, the broker and then the nameserver cleanly.
The children run in their own session so Ctrl-C reaches only this supervisor, which stops them
in that order. A build without the timer-wheel module (``services.timer_wheel.__main__``)
starts the other two and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rocketq.cli._common import run

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
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


def _module(name: str) -> str:
    """The server module a child named ``name`` runs ("slave-K", "replica-K" run a broker)."""
    if name.startswith((SLAVE_PREFIX, REPLICA_PREFIX)):
        return _MODULES["broker"]
    return _MODULES[name]


def _stop_rank(name: str) -> int:
    for prefix in (SLAVE_PREFIX, REPLICA_PREFIX):
        if name.startswith(prefix):
            return _STOP_ORDER.index(prefix.rstrip("-"))
    return _STOP_ORDER.index(name)


# ---- the servers themselves -----------------------------------------------------------------
@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen", default="0.0.0.0:9876", show_default=True, help="host:port to bind.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scan-interval-ms", type=int, help="How often dead brokers are removed (10000).")
def nameserver(listen: str, ready_file: Path | None, scan_interval_ms: int | None) -> None:
    """Run a nameserver (route registry) in the foreground; Ctrl-C or SIGTERM stops it."""
    from services.nameserver.server import main as nameserver_main

    argv = ["--listen", listen]
    if ready_file is not None:
        argv += ["--ready-file", str(ready_file)]
    if scan_interval_ms is not None:
        argv += ["--scan-interval-ms", str(scan_interval_ms)]
    sys.exit(nameserver_main(argv))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-c",
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="broker.conf: key=value lines with RocketMQ key names.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one key, e.g. --set brokerName=broker-b (repeatable).",
)
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path))
def broker(config: Path | None, overrides: tuple[str, ...], ready_file: Path | None) -> None:
    """Run a broker in the foreground; Ctrl-C or SIGTERM stops it cleanly.

    Configuration, later sources winning: defaults, the -c file, environment variables
    ROCKETQ_<KEY> (ROCKETQ_BROKERNAME or ROCKETQ_BROKER_NAME), then --set.
    """
    from services.broker.server import main as broker_main

    argv: list[str] = []
    if config is not None:
        argv += ["-c", str(config)]
    for item in overrides:
        argv += ["--set", item]
    if ready_file is not None:
        argv += ["--ready-file", str(ready_file)]
    sys.exit(broker_main(argv))


def timer_wheel_available() -> bool:
    """Whether this build has the timer-wheel service (``python -m services.timer_wheel``)."""
    try:
        return importlib.util.find_spec(_MODULES["timer"] + ".__main__") is not None
    except ImportError:
        return False


@click.command("timer-wheel", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-n",
    "--namesrv",
    envvar="ROCKETQ_NAMESRV",
    default="127.0.0.1:9876",
    show_default=True,
    show_envvar=True,
    help="Nameserver addresses, separated by ';'.",
)
@click.option(
    "--data-dir",
    default=".rocketq-timer",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="TimerLog, wheel, message log and checkpoint.",
)
@click.option("--listen", default="0.0.0.0:10931", show_default=True, help="host:port to bind.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one key, e.g. --set timerPrecisionMs=1000 (repeatable).",
)
def timer_wheel(
    namesrv: str,
    data_dir: Path,
    listen: str,
    ready_file: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run a timer-wheel (delayed delivery, consume-retry backoff) in the foreground; Ctrl-C or
    SIGTERM stops it cleanly. Several instances share the brokers' timer queues."""
    import runpy

    if not timer_wheel_available():
        raise click.ClickException("this build has no timer-wheel service (services.timer_wheel)")
    argv = ["--namesrv", namesrv, "--data-dir", str(data_dir), "--listen", listen]
    if ready_file is not None:
        argv += ["--ready-file", str(ready_file)]
    for item in overrides:
        argv += ["--set", item]
    # Run the module's own main, exactly as `python -m services.timer_wheel` would.
    sys.argv = ["rocketq timer-wheel", *argv]
    runpy.run_module(_MODULES["timer"], run_name="__main__", alter_sys=True)


# ---- dev up / down --------------------------------------------------------------------------
@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    addr: str = ""


def _spawn(name: str, args: list[str], base: Path) -> _Child:
    ready = base / "run" / f"{name}.ready"
    ready.unlink(missing_ok=True)
    log_path = base / "logs" / f"{name}.log"
    argv = [sys.executable, "-m", _module(name), *args, "--ready-file", str(ready)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops us in order
        )
    child = _Child(name, proc, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(
                f"{name} exited with code {proc.returncode} while starting; "
                f"last lines of {log_path}:\n{_tail(log_path)}"
            )
        with contextlib.suppress(OSError, ValueError, KeyError):
            child.addr = json.loads(ready.read_text())["addr"]
            return child
        time.sleep(0.05)
    _stop_pid(proc.pid, name)
    raise click.ClickException(
        f"{name} was not ready within {READY_TIMEOUT_S:.0f}s; see {log_path}"
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _is_ours(pid: int, name: str) -> bool:
    """Whether ``pid`` still runs our server module (guards against recycled pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    marker = ETCD_MEMBER if name == "etcd" else _module(name)
    return marker.encode() in cmdline


def _stop_pid(pid: int, name: str, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM, wait for exit, SIGKILL after ``timeout_s``. True if it stopped cleanly."""
    if not _is_ours(pid, name):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
            if done:
                return True
        if not _is_ours(pid, name) or _is_zombie(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _pids_file(base: Path) -> Path:
    return base / "pids.json"


def _running(base: Path) -> dict[str, Any] | None:
    """The detached instance recorded in DIR/pids.json, if any of its processes still runs."""
    try:
        data: dict[str, Any] = json.loads(_pids_file(base).read_text())
    except (OSError, ValueError):
        return None
    alive = any(_is_ours(int(p["pid"]), name) for name, p in data.get("processes", {}).items())
    return data if alive else None


@click.group()
def dev() -> None:
    """A one-machine RocketQ (nameserver + broker + timer-wheel) for development."""


@dev.command("up")
@click.option(
    "--dir",
    "base",
    default=".rocketq-dev",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Data and logs directory.",
)
@click.option("--namesrv-port", type=int, default=9876, show_default=True, help="0 = any free.")
@click.option("--broker-port", type=int, default=10911, show_default=True, help="0 = any free.")
@click.option("--timer-port", type=int, default=10931, show_default=True, help="0 = any free.")
@click.option("--detach", is_flag=True, help="Return once running; stop with `rocketq dev down`.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Broker key.")
@click.option("--timer-set", "timer_overrides", multiple=True, metavar="KEY=VALUE",
              help="Timer-wheel key, e.g. timerPrecisionMs=100.")  # fmt: skip
@click.option("--no-timer", is_flag=True, help="Do not start the timer-wheel.")
@click.option("--no-demo", is_flag=True, help="Skip the demo topic and round trip.")
@click.option(
    "--slaves",
    type=click.IntRange(0, SLAVES_MAX),
    default=0,
    show_default=True,
    help="Slaves of the broker (brokerId 1..N, each with its own store).",
)
@click.option(
    "--slave-port", type=int, default=0, show_default=True,
    help="Port of slave 1 (slave K gets this + K - 1); 0 = any free.",
)  # fmt: skip
@click.option(
    "--ha", is_flag=True, help="Automatic failover: etcd and --replicas N that elect a master."
)
@click.option(
    "--replicas",
    type=click.IntRange(1, REPLICAS_MAX),
    default=3,
    show_default=True,
    help="With --ha: replicas of broker-a (replica ids 1..N; broker port + K - 1 each).",
)
@click.option("--etcd-port", type=int, default=0, show_default=True,
              help="With --ha: etcd client port; 0 = any free.")  # fmt: skip
def dev_up(
    base: Path,
    namesrv_port: int,
    broker_port: int,
    timer_port: int,
    detach: bool,
    overrides: tuple[str, ...],
    timer_overrides: tuple[str, ...],
    no_timer: bool,
    no_demo: bool,
    slaves: int,
    slave_port: int,
    ha: bool,
    replicas: int,
    etcd_port: int,
) -> None:
    """Start a nameserver, a broker (and --slaves N slaves of it, or with --ha an etcd and
    --replicas N replicas that elect their master) and a timer-wheel with data under --dir,
    prove a round trip, and run."""
    base = base.resolve()
    if (running := _running(base)) is not None:
        raise click.ClickException(
            f"RocketQ is already running from {base} (nameserver {running['namesrv']}); "
            f"stop it with: rocketq dev down --dir {base}"
        )
    with_timer = not no_timer and timer_wheel_available()
    if ha:
        if slaves:
            raise click.UsageError("--slaves is for static roles; with --ha use --replicas N")
        _say_no_timer(with_timer, no_timer)
        ports = _HaPorts(namesrv_port, broker_port, etcd_port)
        timer_args = _timer_args(base, timer_port, timer_overrides) if with_timer else None
        _dev_up_ha(base, ports, replicas, overrides, timer_args, detach=detach, demo=not no_demo)
        return
    slave_dirs = [f"store-{SLAVE_PREFIX}{k}" for k in range(1, slaves + 1)]
    for sub in ("logs", "run", "store", *slave_dirs, *([TIMER_DATA_DIR] if with_timer else [])):
        (base / sub).mkdir(parents=True, exist_ok=True)
    broker_args = [
        *("--set", "brokerName=broker-a", "--set", "listenAddress=127.0.0.1"),
        *("--set", f"listenPort={broker_port}", "--set", "brokerIP1=127.0.0.1"),
        *("--set", f"storePathRootDir={base / 'store'}"),
    ]
    for item in overrides:
        broker_args += ["--set", item]
    timer_args = _timer_args(base, timer_port, timer_overrides) if with_timer else None
    slave_args = [_slave_args(base, k, slave_port, overrides) for k in range(1, slaves + 1)]
    children = _start_all(
        base, namesrv_port, broker_args, timer_args, demo=not no_demo, slave_args=slave_args
    )
    ns, br = children[0], children[1]
    addrs = {c.name: c.addr for c in children}
    if detach:
        _pids_file(base).write_text(
            json.dumps(
                {
                    "namesrv": ns.addr,
                    "broker": br.addr,
                    "timer": addrs.get("timer", ""),
                    "processes": {c.name: {"pid": c.proc.pid, "addr": c.addr} for c in children},
                },
                indent=2,
            )
        )
    _say_no_timer(with_timer, no_timer)
    slave_addrs = [c.addr for c in children if c.name.startswith(SLAVE_PREFIX)]
    _summary(base, ns.addr, br.addr, addrs.get("timer", ""), detach, slave_addrs)
    if not detach:
        _supervise(children)


def _say_no_timer(with_timer: bool, no_timer: bool) -> None:
    if not with_timer:
        click.echo(
            "timer-wheel not started (--no-timer)"
            if no_timer
            else "timer-wheel skipped: this build has no services.timer_wheel module; "
            "delayed messages and consume retries stay pending until one runs"
        )


def _slave_args(base: Path, k: int, first_port: int, overrides: tuple[str, ...]) -> list[str]:
    """Broker flags of slave ``k`` (brokerId k): the user's keys, then the ones that make it a
    slave with its own store and port (those win)."""
    args: list[str] = []
    for item in overrides:
        args += ["--set", item]
    port = first_port + k - 1 if first_port else 0
    for item in (
        "brokerName=broker-a",
        f"brokerId={k}",
        "brokerRole=SLAVE",
        "listenAddress=127.0.0.1",
        f"listenPort={port}",
        "brokerIP1=127.0.0.1",
        f"storePathRootDir={base / f'store-{SLAVE_PREFIX}{k}'}",
    ):
        args += ["--set", item]
    return args


def _timer_args(base: Path, port: int, overrides: tuple[str, ...]) -> list[str]:
    args = ["--data-dir", str(base / TIMER_DATA_DIR), "--listen", f"127.0.0.1:{port}"]
    for item in overrides:
        args += ["--set", item]
    return args


def _start_all(
    base: Path,
    namesrv_port: int,
    broker_args: list[str],
    timer_args: list[str] | None,
    *,
    demo: bool,
    slave_args: list[list[str]] | None = None,
) -> list[_Child]:
    """Nameserver, broker, its slaves, then (if ``timer_args``) the timer-wheel, each waited
    for by its ready file; then the demo round trip. On any failure, stop what started and
    re-raise."""
    children: list[_Child] = []
    try:
        ns = _spawn("namesrv", ["--listen", f"127.0.0.1:{namesrv_port}"], base)
        children.append(ns)
        children.append(_spawn("broker", ["--set", f"namesrvAddr={ns.addr}", *broker_args], base))
        for k, args in enumerate(slave_args or [], start=1):
            children.append(
                _spawn(f"{SLAVE_PREFIX}{k}", ["--set", f"namesrvAddr={ns.addr}", *args], base)
            )
        if timer_args is not None:
            children.append(_spawn("timer", ["--namesrv", ns.addr, *timer_args], base))
        if demo:
            from rocketq.cli.io_cmd import demo_round_trip

            click.echo(run(demo_round_trip(ns.addr, DEMO_TOPIC, DEMO_GROUP, DEMO_MESSAGES)))
    except BaseException:
        for child in reversed(children):
            _stop_pid(child.proc.pid, child.name)
        raise
    return children


def _summary(
    base: Path,
    ns_addr: str,
    br_addr: str,
    timer_addr: str,
    detach: bool,
    slave_addrs: list[str] | None = None,
) -> None:
    """What runs where and how to use it; ``timer_addr`` is empty if no timer-wheel runs."""
    stop = f"rocketq dev down --dir {base}" if detach else "press Ctrl-C"
    env = f"ROCKETQ_NAMESRV={ns_addr}"
    timer = "not running"
    delayed = ""
    if timer_addr:
        env += f" ROCKETQ_TIMER={timer_addr}"
        timer = f"{timer_addr}  (data {base / TIMER_DATA_DIR})"
        delayed = "  echo later | rocketq produce Orders --delay-level 2\n  rocketq timer stats\n"
    slaves = "".join(
        f"  slave {k:<5} {addr}  (broker-a id {k}, data {base / f'store-{SLAVE_PREFIX}{k}'})\n"
        for k, addr in enumerate(slave_addrs or [], start=1)
    )
    click.echo(
        f"\nRocketQ is running\n"
        f"  nameserver  {ns_addr}\n"
        f"  broker      {br_addr}  (broker-a, cluster DefaultCluster)\n"
        f"{slaves}"
        f"  timer-wheel {timer}\n"
        f"  data        {base / 'store'}\n"
        f"  logs        {base / 'logs'}\n"
        f"  stop        {stop}\n"
        f"next:\n"
        f"  export {env}\n"
        f"  rocketq cluster list\n"
        f"  rocketq topic create Orders\n"
        f"  echo hello | rocketq produce Orders\n"
        f"  rocketq consume Orders --from first --count 1\n"
        f"{delayed}"
        f"  rocketq bench produce --topic Orders --duration 10\n"
    )


def _supervise(children: list[_Child], expendable: tuple[str, ...] = ()) -> None:
    """Stay in the foreground until Ctrl-C/SIGTERM or a child dies; then stop them all. A child
    whose name starts with one of ``expendable`` (a failover replica) may die: that is reported
    once and the others keep running."""
    stop = {"requested": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    died: _Child | None = None
    reported: set[str] = set()
    while not stop["requested"] and died is None:
        for c in children:
            if c.proc.poll() is None or c.name in reported:
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
        time.sleep(0.2)
    if died is not None:
        click.echo(
            f"{died.name} exited with code {died.proc.returncode}; last lines of "
            f"{died.log_path}:\n{_tail(died.log_path)}",
            err=True,
        )
    click.echo("stopping RocketQ ...")
    # Timer-wheel first (it re-puts to the broker), then the broker, then the nameserver.
    clean = all(_stop_pid(c.proc.pid, c.name) for c in reversed(children))
    click.echo("stopped" if clean else "stopped (some processes had to be killed)")
    sys.exit(1 if died is not None else 0)


# ---- dev up --ha: etcd and a replica group in controller mode --------------------------------
@dataclass(frozen=True)
class _HaPorts:
    namesrv: int
    broker: int
    """Port of replica 1 (replica K gets this + K - 1); 0 = any free."""
    etcd: int


def _dev_up_ha(
    base: Path,
    ports: _HaPorts,
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
    children: list[_Child] = []
    try:
        etcd = _spawn_etcd(base, ports.etcd)
        children.append(etcd)
        ns = _spawn("namesrv", ["--listen", f"127.0.0.1:{ports.namesrv}"], base)
        children.append(ns)
        for k in range(1, replicas + 1):
            args = _replica_args(base, k, ports.broker, etcd.addr, overrides)
            name = f"{REPLICA_PREFIX}{k}"
            children.append(_spawn(name, ["--set", f"namesrvAddr={ns.addr}", *args], base))
        master_id, master_addr, epoch = run(_wait_for_master(ns.addr, READY_TIMEOUT_S))
        if timer_args is not None:
            children.append(_spawn("timer", ["--namesrv", ns.addr, *timer_args], base))
        if demo:
            from rocketq.cli.io_cmd import demo_round_trip

            click.echo(run(demo_round_trip(ns.addr, DEMO_TOPIC, DEMO_GROUP, DEMO_MESSAGES)))
    except BaseException:
        for child in reversed(children):
            _stop_pid(child.proc.pid, child.name)
        raise
    addrs = {c.name: c.addr for c in children}
    if detach:
        _pids_file(base).write_text(
            json.dumps(
                {
                    "namesrv": ns.addr,
                    "broker": master_addr,
                    "timer": addrs.get("timer", ""),
                    "etcd": etcd.addr,
                    "processes": {c.name: {"pid": c.proc.pid, "addr": c.addr} for c in children},
                },
                indent=2,
            )
        )
    replica_rows = "".join(
        f"  replica {k:<3} {addrs[f'{REPLICA_PREFIX}{k}']}  (data {base / store_dirs[k - 1]})"
        + ("  master\n" if k == master_id else "\n")
        for k in range(1, replicas + 1)
    )
    stop = f"rocketq dev down --dir {base}" if detach else "press Ctrl-C"
    timer = addrs.get("timer", "not running")
    master_pid = next(c.proc.pid for c in children if c.addr == master_addr)
    click.echo(
        f"\nRocketQ is running with automatic failover ({HA_BROKER_NAME}, epoch {epoch})\n"
        f"  nameserver  {ns.addr}\n"
        f"  etcd        {etcd.addr}  (data {base / 'etcd'})\n"
        f"{replica_rows}"
        f"  timer-wheel {timer}\n"
        f"  logs        {base / 'logs'}\n"
        f"  stop        {stop}\n"
        f"next:\n"
        f"  export ROCKETQ_NAMESRV={ns.addr}\n"
        f"  rocketq ha status\n"
        f"  rocketq ha switchover {HA_BROKER_NAME}\n"
        f"  kill -9 {master_pid}   # the master; then: rocketq ha status\n"
    )
    if not detach:
        _supervise(children, expendable=(REPLICA_PREFIX,))


def _replica_args(
    base: Path, k: int, first_port: int, etcd_addr: str, overrides: tuple[str, ...]
) -> list[str]:
    """Broker flags of replica ``k``: SYNC_MASTER unless the user says otherwise, the user's
    keys, then the ones that give it its identity, store, port and etcd (those win)."""
    args = ["--set", "brokerRole=SYNC_MASTER"]
    for item in overrides:
        args += ["--set", item]
    port = first_port + k - 1 if first_port else 0
    for item in (
        f"brokerName={HA_BROKER_NAME}",
        f"brokerId={k}",
        f"etcdEndpoints={etcd_addr}",
        "listenAddress=127.0.0.1",
        f"listenPort={port}",
        "brokerIP1=127.0.0.1",
        f"storePathRootDir={base / f'store-{REPLICA_PREFIX}{k}'}",
    ):
        args += ["--set", item]
    return args


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn_etcd(base: Path, client_port: int) -> _Child:
    """A one-member etcd on loopback with its data in DIR/etcd, ready once /health says so."""
    binary = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else "")
    if not binary:
        raise click.ClickException(
            "--ha needs etcd, which is not installed: `make setup` installs Debian's "
            "etcd-server (or: sudo apt-get install etcd-server)"
        )
    client = f"http://127.0.0.1:{client_port or _free_port()}"
    peer = f"http://127.0.0.1:{_free_port()}"
    argv = [binary, "--name", ETCD_MEMBER, "--data-dir", str(base / "etcd" / "data")]
    argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
    argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
    argv += ["--initial-cluster", f"{ETCD_MEMBER}={peer}"]
    log_path = base / "logs" / "etcd.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    child = _Child("etcd", proc, log_path, client.removeprefix("http://"))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(
                f"etcd exited with code {proc.returncode} while starting; last lines of "
                f"{log_path}:\n{_tail(log_path)}"
            )
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(f"{client}/health", timeout=1) as resp,
        ):
            if b"true" in resp.read():
                return child
        time.sleep(0.05)
    _stop_pid(proc.pid, "etcd")
    raise click.ClickException(
        f"etcd was not healthy within {READY_TIMEOUT_S:.0f}s; see {log_path}"
    )


async def _wait_for_master(ns_addr: str, timeout_s: float) -> tuple[int, str, int]:
    """(replica id, address, epoch) of broker-a's master once one leads and the nameserver has
    it as brokerId 0 (what producers need); ClickException after ``timeout_s``."""
    from rocketq.client.admin import Admin
    from rocketq.client.errors import RocketQError

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


@dev.command("down")
@click.option(
    "--dir",
    "base",
    default=".rocketq-dev",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
)
def dev_down(base: Path) -> None:
    """Stop a RocketQ started with `rocketq dev up --detach` (timer-wheel, slaves or replicas,
    broker, nameserver, etcd)."""
    base = base.resolve()
    data = _running(base)
    if data is None:
        _pids_file(base).unlink(missing_ok=True)
        raise click.ClickException(f"no detached RocketQ is running from {base}")
    processes: dict[str, Any] = data["processes"]
    clean = True
    for name in sorted(processes, key=_stop_rank):
        clean = _stop_pid(int(processes[name]["pid"]), name) and clean
    _pids_file(base).unlink(missing_ok=True)
    click.echo("RocketQ stopped" if clean else "RocketQ stopped (some processes were killed)")


SERVER_COMMANDS = (nameserver, broker, timer_wheel, dev)
