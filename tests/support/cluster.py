"""One cluster fixture family for the integration tier.

``cluster(root, ...)`` starts real service processes and stops them (killed if stuck) after::

    with cluster(tmp_path, brokers=2, broker_keys={"autoCreateTopicEnable": False}) as c:
        c.brokers[0].addr, c.namesrv_addrs, ...

Options, all composable:

* ``nameservers`` / ``brokers``: nameservers and broker masters ``broker-a``, ``broker-b``, …;
* ``slaves``: slaves 1..N of ``broker-a`` (they find their master through the nameservers)
  with ``slave_keys``;
* ``timer_wheel``: one timer-wheel (``timer-0``) with ``timer_keys``;
* ``clock_speed``: every process on one :class:`ScaledClock` running that many times fast
  (``c.clock`` reads the same time in the test);
* ``etcd`` / ``replicas``: an etcd (``etcd_members`` > 1: an etcd cluster) and an HA
  :class:`Group` of ``replicas`` replicas of ``group_name`` in controller mode (``c.group``),
  with ``group_keys``; every replica's etcdEndpoints lists every member;
* ``gateway``: every broker (master, slave, replica) serves the RocketMQ 5 gateway on a free
  loopback port of its own (``c.gateway_addr(sp)``); off otherwise (``gatewayPort=0``: the
  default 8081 would clash between brokers on one host).

The old wrappers (``tests.integration.cluster.cluster``, ``timer_support.timer_cluster``,
``failover_support.ha_group``) are thin calls of this one. The process-spawning functions stay
in :mod:`tests.integration.cluster`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from services.common.clock import CLOCK_ORIGIN_ENV, CLOCK_SPEED_ENV, ScaledClock
from services.common.supervisor import pid_state
from tests.integration import cluster as spawning
from tests.integration.cluster import ServiceProcess
from tests.support.until import until

LOG_ALARMS = ("Traceback", "CRITICAL")
"""Log lines that mean a service hit a bug, even when every result looks right."""
CHANNEL_EXPIRED_TIMEOUT_MS = 120_000
"""The broker expires a silent client after this on its own clock; on a scaled clock it is
scaled up by the speed so it stays 120 s of real time."""


def broker_name(i: int) -> str:
    """broker-a, broker-b, … for master ``i``."""
    return f"broker-{chr(ord('a') + i)}"


@dataclass
class Group:
    """Replicas of one broker group in controller mode (etcd), by replica id."""

    tmp_path: Path
    nameserver: ServiceProcess
    etcd: ServiceProcess
    broker_name: str
    keys: dict[str, object]
    replicas: dict[int, ServiceProcess] = field(default_factory=dict)
    endpoints: str = ""
    """etcdEndpoints of every replica (all members of an etcd cluster); ``etcd`` alone if empty."""
    gateway_ports: dict[str, int] | None = None
    """The cluster's map of gateway ports by process name when it serves the gateway."""

    @property
    def namesrv_addrs(self) -> list[str]:
        return [self.nameserver.addr]

    def start_replica(self, rid: int, **extra: object) -> ServiceProcess:
        name = f"{self.broker_name}-r{rid}"
        workdir = self.tmp_path / name
        endpoints = self.endpoints or self.etcd.addr
        keys = {**self.keys, "brokerId": rid, "etcdEndpoints": endpoints, **extra}
        if self.gateway_ports is not None and "gatewayPort" not in keys:
            keys["gatewayPort"] = self.gateway_ports.setdefault(name, spawning.free_port())
        args = spawning.broker_args(workdir / "store", self.namesrv_addrs, self.broker_name, keys)
        sp = spawning.spawn(name, "services.broker", args, workdir)
        self.replicas[rid] = sp
        return sp

    def store(self, rid: int) -> Path:
        return self.tmp_path / f"{self.broker_name}-r{rid}" / "store"

    def addr(self, rid: int) -> str:
        return self.replicas[rid].addr

    def rid_of(self, addr: str) -> int:
        for rid, sp in self.replicas.items():
            if sp.addr == addr:
                return rid
        raise KeyError(f"no replica at {addr}")

    def live(self) -> dict[int, ServiceProcess]:
        return {rid: sp for rid, sp in self.replicas.items() if sp.alive()}

    def restart(self, rid: int) -> ServiceProcess:
        sp = spawning.restart(self.replicas[rid])
        self.replicas[rid] = sp
        return sp

    def logs(self, lines: int = 40) -> str:
        """The tail of every replica's log, for assertion messages."""
        return "\n".join(
            f"--- {sp.name} ({sp.addr}) ---\n{sp.log_tail(lines)}" for sp in self.replicas.values()
        )

    def stop_all(self) -> None:
        stop_all([*self.replicas.values(), self.etcd, self.nameserver])


def is_stopped(sp: ServiceProcess) -> bool:
    """Whether the kernel shows ``sp`` stopped (SIGSTOP taken)."""
    return pid_state(sp.proc.pid) in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def stop_all(processes: list[ServiceProcess]) -> None:
    """Stop each live process (resumed first: a paused one cannot take SIGTERM); one that does
    not stop in time is killed, and the others are still stopped."""
    for sp in processes:
        if sp.alive():
            with contextlib.suppress(OSError):
                sp.resume()
            with contextlib.suppress(AssertionError):
                sp.stop(timeout_s=15)


@dataclass
class Cluster(spawning.Cluster):
    """What :func:`cluster` started: ``nameservers`` and ``brokers`` (masters) as in the base,
    plus slaves, the timer-wheel, etcd and HA group when asked for, and the clock."""

    root: Path = Path()
    slaves: list[ServiceProcess] = field(default_factory=list)
    timer_proc: ServiceProcess | None = None
    etcd: ServiceProcess | None = None
    etcd_members: list[ServiceProcess] = field(default_factory=list)
    """Every member when the cluster runs an etcd cluster (``etcd`` is the first)."""
    group: Group | None = None
    speed: float = 1.0
    clock: ScaledClock = field(default_factory=lambda: clock_env(1.0)[1])
    """The services' clock (real time unless ``clock_speed`` was given)."""
    env: dict[str, str] = field(default_factory=dict)
    replaced: list[ServiceProcess] = field(default_factory=list)
    """Processes restarted by the test (stopped with the rest)."""
    gateway_ports: dict[str, int] | None = None
    """With ``gateway=True``: each broker's gateway port by process name (kept on restart)."""

    def gateway_keys(self, name: str) -> dict[str, object]:
        """``gatewayPort`` for broker process ``name``: a free port of its own with ``gateway``."""
        if self.gateway_ports is None:
            return {}
        return {"gatewayPort": self.gateway_ports.setdefault(name, spawning.free_port())}

    def gateway_addr(self, sp: ServiceProcess) -> str:
        """``127.0.0.1:port`` of broker ``sp``'s RocketMQ 5 gateway (with ``gateway=True``)."""
        assert self.gateway_ports is not None, "the cluster was started without gateway=True"
        return f"127.0.0.1:{self.gateway_ports[sp.name]}"

    @property
    def nameserver(self) -> ServiceProcess:
        return self.nameservers[0]

    @property
    def broker(self) -> ServiceProcess:
        """The first master, broker-a."""
        return self.brokers[0]

    @property
    def timer(self) -> ServiceProcess:
        assert self.timer_proc is not None, "the cluster was started without timer_wheel=True"
        return self.timer_proc

    @property
    def restarted_timers(self) -> list[ServiceProcess]:
        return [sp for sp in self.replaced if sp.name.startswith("timer")]

    def now_ms(self) -> int:
        """Scaled "now", the same reading the services take."""
        return self.clock.now_ms()

    def scaled(self, real_ms: float) -> int:
        """A real-time span expressed on the scaled clock."""
        return int(real_ms * self.speed)

    def restart_timer(self) -> ServiceProcess:
        """Start the timer-wheel again with the same command (same data dir, same clock)."""
        self.timer_proc = spawning.restart(self.timer)
        self.replaced.append(self.timer_proc)
        return self.timer_proc

    def restart(self, sp: ServiceProcess) -> ServiceProcess:
        """Start ``sp`` again (same command, same data dir) and put it in its old place."""
        new = spawning.restart(sp)
        for procs in (self.nameservers, self.brokers, self.slaves):
            if sp in procs:
                procs[procs.index(sp)] = new
        self.replaced.append(new)
        return new

    def start_broker(self, name: str, **keys: object) -> ServiceProcess:
        """One more master (e.g. with its own keys), stopped with the rest."""
        keys = {**self.gateway_keys(name), **keys}
        sp = spawning.start_broker(self.root, self.namesrv_addrs, name, self.env or None, **keys)
        self.brokers.append(sp)
        return sp

    def processes(self) -> list[ServiceProcess]:
        """The current services (not replaced ones), nameservers first."""
        timer = [self.timer_proc] if self.timer_proc is not None else []
        return [*self.nameservers, *self.brokers, *self.slaves, *timer]

    def check_logs(self) -> None:
        """Fail if a service died or logged a traceback (a bug even when results look right)."""
        for sp in self.processes():
            assert sp.alive(), f"{sp.name} died (exit {sp.proc.returncode}):\n{sp.log_tail()}"
            text = sp.log_path.read_text(errors="replace")
            for alarm in LOG_ALARMS:
                assert alarm not in text, f"{sp.name} logged {alarm!r}:\n{sp.log_tail(80)}"


@contextlib.contextmanager
def cluster(
    root: Path,
    *,
    brokers: int = 1,
    nameservers: int = 1,
    slaves: int = 0,
    timer_wheel: bool = False,
    clock_speed: float | None = None,
    etcd: bool = False,
    etcd_members: int = 1,
    replicas: int = 0,
    broker_keys: dict[str, object] | None = None,
    slave_keys: dict[str, object] | None = None,
    timer_keys: dict[str, object] | None = None,
    group_name: str = "broker-a",
    group_keys: dict[str, object] | None = None,
    gateway: bool = False,
) -> Iterator[Cluster]:
    """Start the asked-for services in dependency order; stop them all after (see module)."""
    c = Cluster([], [], root=root, gateway_ports={} if gateway else None)
    if clock_speed is not None:
        c.env, c.clock = clock_env(clock_speed)
        c.speed = clock_speed
    try:
        _start(c, brokers, nameservers, slaves, timer_wheel, broker_keys, slave_keys, timer_keys)
        if etcd_members > 1:
            c.etcd_members = spawning.start_etcd_cluster(root, etcd_members)
            c.etcd = c.etcd_members[0]
        elif etcd or replicas:
            c.etcd = spawning.start_etcd(root)
            c.etcd_members = [c.etcd]
        if replicas:
            assert c.etcd is not None
            c.group = Group(root, c.nameserver, c.etcd, group_name, dict(group_keys or {}))
            c.group.gateway_ports = c.gateway_ports
            c.group.endpoints = ",".join(m.addr for m in c.etcd_members)
            for rid in range(1, replicas + 1):  # a fresh group elects the lowest live id
                c.group.start_replica(rid)
        yield c
    finally:
        # the group's etcd may have been restarted by the test (a new process)
        group = [*c.group.replicas.values(), c.group.etcd] if c.group is not None else []
        stop_all([*group, *reversed(c.replaced), *reversed(c.processes()), *c.etcd_members])


async def wait_routed(
    namesrv_addrs: list[str], topic: str, queues: int, timeout_s: float = 15
) -> None:
    """Until the nameservers route ``topic`` with ``queues`` write queues (SDK Admin)."""
    from rocketq.client.admin import Admin  # only the async tests that use it need the SDK
    from rocketq.client.errors import RocketQError

    async with Admin(namesrv_addrs) as admin:

        async def routed() -> bool:
            try:
                route = await admin.route(topic)
            except RocketQError:  # not routed yet (or a transient lookup error)
                return False
            return bool(route.queues) and route.queues[0].write_queue_nums == queues

        await until(routed, f"a route for {topic} with {queues} queues", timeout_s)


def _start(
    c: Cluster,
    brokers: int,
    nameservers: int,
    slaves: int,
    timer_wheel: bool,
    broker_keys: dict[str, object] | None,
    slave_keys: dict[str, object] | None,
    timer_keys: dict[str, object] | None,
) -> None:
    env = c.env or None
    for i in range(nameservers):
        name = f"namesrv{i}"
        if env is None:
            c.nameservers.append(spawning.start_nameserver(c.root, name=name))
        else:  # start_nameserver takes no environment; the scaled clock needs one
            args = ["--listen", "127.0.0.1:0"]
            ns = spawning.spawn(name, "services.nameserver", args, c.root / name, env)
            c.nameservers.append(ns)
    keys: dict[str, object] = {}
    if c.env:
        keys["channelExpiredTimeout"] = int(CHANNEL_EXPIRED_TIMEOUT_MS * c.speed)
    keys.update(broker_keys or {})
    for i in range(brokers):
        bkeys = {**c.gateway_keys(broker_name(i)), **keys}
        b = spawning.start_broker(c.root, c.namesrv_addrs, broker_name(i), env, **bkeys)
        c.brokers.append(b)
    for sid in range(1, slaves + 1):
        skeys = {**c.gateway_keys(f"broker-a-s{sid}"), **(slave_keys or {})}
        c.slaves.append(
            spawning.start_slave(c.root, c.namesrv_addrs, "broker-a", sid, env, **skeys)
        )
    if timer_wheel:
        tkeys = timer_keys or {}
        c.timer_proc = spawning.start_timer_wheel(c.root, c.namesrv_addrs, "timer-0", env, **tkeys)


def clock_env(speed: float, origin_ms: int | None = None) -> tuple[dict[str, str], ScaledClock]:
    """The environment every process of a scaled-clock cluster gets, and the matching clock."""
    origin = time.time_ns() // 1_000_000 if origin_ms is None else origin_ms
    env = {CLOCK_SPEED_ENV: repr(float(speed)), CLOCK_ORIGIN_ENV: str(origin)}
    return env, ScaledClock(speed, origin)
