"""``rocketq dev up|down``: a whole RocketQ on one machine, as child processes.

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
in that order. Every child is started and stopped through services.common.supervisor.
"""

from __future__ import annotations

from pathlib import Path

import click

from rocketq.cli._common import run
from rocketq.cli.io_cmd import demo_round_trip
from services.cli._children import (
    DEMO_GROUP,
    DEMO_MESSAGES,
    DEMO_TOPIC,
    REPLICAS_MAX,
    SLAVE_PREFIX,
    SLAVES_MAX,
    TIMER_DATA_DIR,
    pids_file,
    running,
    spawn,
    stop_all,
    stop_recorded,
    supervise,
    write_pids,
)
from services.cli.dev_ha import HaPorts, dev_up_ha
from services.cli.dev_tls import dev_tls, tls_client_env
from services.common.supervisor import Process


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
@click.option(
    "--gateway-port", type=click.IntRange(0, 65535), default=8081, show_default=True,
    help="RocketMQ 5 gateway (official SDKs) of the broker; with --ha replica K gets this + K - 1;"
    " slaves serve none; 0 = off.",
)  # fmt: skip
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
@click.option("--tls", is_flag=True,
              help="Make a throwaway CA under DIR/tls; every port serves mutual TLS.")  # fmt: skip
def dev_up(
    base: Path,
    namesrv_port: int,
    broker_port: int,
    timer_port: int,
    gateway_port: int,
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
    tls: bool,
) -> None:
    """Start a nameserver, a broker (and --slaves N slaves of it, or with --ha an etcd and
    --replicas N replicas that elect their master) and a timer-wheel with data under --dir,
    prove a round trip, and run."""
    base = base.resolve()
    if (found := running(base)) is not None:
        raise click.ClickException(
            f"RocketQ is already running from {base} (nameserver {found['namesrv']}); "
            f"stop it with: rocketq dev down --dir {base}"
        )
    with_timer = not no_timer
    tls_sets: list[str] = []
    if tls:  # sec: a throwaway CA, mutual TLS on every port
        if ha:
            raise click.UsageError("--tls is not available with --ha yet")
        tls_sets = dev_tls(base)
        overrides = (*overrides, *tls_sets)
        timer_overrides = (*timer_overrides, *tls_sets)
    if ha:
        if slaves:
            raise click.UsageError("--slaves is for static roles; with --ha use --replicas N")
        _say_no_timer(with_timer)
        ports = HaPorts(namesrv_port, broker_port, etcd_port, gateway_port)
        timer_args = _timer_args(base, timer_port, timer_overrides) if with_timer else None
        dev_up_ha(base, ports, replicas, overrides, timer_args, detach=detach, demo=not no_demo)
        return
    slave_dirs = [f"store-{SLAVE_PREFIX}{k}" for k in range(1, slaves + 1)]
    for sub in ("logs", "run", "store", *slave_dirs, *([TIMER_DATA_DIR] if with_timer else [])):
        (base / sub).mkdir(parents=True, exist_ok=True)
    broker_args = [
        *("--set", "brokerName=broker-a", "--set", "listenAddress=127.0.0.1"),
        *("--set", f"listenPort={broker_port}", "--set", "brokerIP1=127.0.0.1"),
        *("--set", f"storePathRootDir={base / 'store'}"),
        *("--set", f"gatewayPort={gateway_port}"),  # before the user's keys: a --set wins
    ]
    for item in overrides:
        broker_args += ["--set", item]
    timer_args = _timer_args(base, timer_port, timer_overrides) if with_timer else None
    slave_args = [_slave_args(base, k, slave_port, overrides) for k in range(1, slaves + 1)]
    children = _start_all(
        base, namesrv_port, broker_args, timer_args, demo=not no_demo, slave_args=slave_args,
        namesrv_sets=tls_sets,
    )  # fmt: skip
    ns, br = children[0], children[1]
    addrs = {c.name: c.addr for c in children}
    if detach:
        write_pids(base, {"namesrv": ns.addr, "broker": br.addr, "timer": addrs.get("timer", "")},
                   children)  # fmt: skip
    _say_no_timer(with_timer)
    slave_addrs = [c.addr for c in children if c.name.startswith(SLAVE_PREFIX)]
    _summary(base, ns.addr, br.addr, addrs.get("timer", ""), detach, slave_addrs)
    gateway = _effective_gateway_port(gateway_port, overrides)
    if gateway:
        click.echo(f"RocketMQ 5 gateway (official SDKs' endpoint): 127.0.0.1:{gateway}")
    if tls:
        click.echo(f"TLS: every port requires a client certificate; clients use\n"
                   f"  export {tls_client_env(base)}")  # fmt: skip
    if not detach:
        supervise(children)


def _effective_gateway_port(option: int, overrides: tuple[str, ...]) -> int:
    """The broker's gateway port: ``--gateway-port`` unless a ``--set gatewayPort=N`` wins."""
    port = str(option)
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() == "gatewayPort":
            port = value.strip()
    return int(port) if port.isdigit() else 0


def _say_no_timer(with_timer: bool) -> None:
    if not with_timer:
        click.echo("timer-wheel not started (--no-timer)")


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
        "gatewayPort=0",  # a slave takes no sends; its master's gateway serves the group
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
    namesrv_sets: list[str] | None = None,
) -> list[Process]:
    """Nameserver, broker, its slaves, then (if ``timer_args``) the timer-wheel, each waited
    for by its ready file; then the demo round trip. On any failure, stop what started and
    re-raise."""
    children: list[Process] = []
    try:
        ns_args = ["--listen", f"127.0.0.1:{namesrv_port}"]
        for item in namesrv_sets or []:
            ns_args += ["--set", item]
        ns = spawn("namesrv", ns_args, base)
        children.append(ns)
        children.append(spawn("broker", ["--set", f"namesrvAddr={ns.addr}", *broker_args], base))
        for k, args in enumerate(slave_args or [], start=1):
            children.append(
                spawn(f"{SLAVE_PREFIX}{k}", ["--set", f"namesrvAddr={ns.addr}", *args], base)
            )
        if timer_args is not None:
            children.append(spawn("timer", ["--namesrv", ns.addr, *timer_args], base))
        if demo:
            click.echo(run(demo_round_trip(ns.addr, DEMO_TOPIC, DEMO_GROUP, DEMO_MESSAGES)))
    except BaseException:
        stop_all(children)
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
    data = running(base)
    if data is None:
        pids_file(base).unlink(missing_ok=True)
        raise click.ClickException(f"no detached RocketQ is running from {base}")
    clean = stop_recorded(base, data["processes"])
    pids_file(base).unlink(missing_ok=True)
    click.echo("RocketQ stopped" if clean else "RocketQ stopped (some processes were killed)")
