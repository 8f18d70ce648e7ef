"""The cluster under test: every process of a chaos run, by name, and what the driver asks them.

A :class:`ChaosCluster` starts (through :mod:`tests.integration.cluster`) an etcd cluster of
``etcd_members`` members, nameservers on fixed ports (so a restarted one is found again at its
address), broker group ``broker-a`` in controller mode - replicas ``1..N`` (``brokerId`` =
replica id, ``SYNC_MASTER``, the lease TTL of the run, ``etcdEndpoints`` listing every member)
- optionally a static single-master group ``broker-b``, and a timer-wheel. Each is a
:class:`Node` named ``etcd0``..``etcd2`` (``etcd`` when there is one member, as before),
``namesrv0``, ``broker-a-r1``, ``broker-b``, ``timer``.

etcd members keep their ports across restarts (etcd cannot take port 0, and its peers and the
brokers know it by address): loopback members get two free ports each once; in namespaces every
member listens on 2379/2380 of its own address. A restarted member rejoins with its data dir
(etcd then ignores the ``--initial-cluster*`` flags).

With ``netns=True`` every node runs in a network namespace of its own
(:class:`~tests.robustness.chaos.netns.NetLab` ``chaos``; node ``broker-a-r1`` is lab node
``broker_a_r1``), the traffic processes in node ``clients``, and the driver reaches the lab
through a :class:`~tests.robustness.chaos.gateway.Gateway` dialing from node ``driver``
(:meth:`ChaosCluster.dial` maps a lab address to the loopback one to use). Partitions then
cut nodes apart; without namespaces everything is on loopback and partitions are skipped.

The driver learns roles with GetRuntimeStats (sync gRPC, short deadlines): a replica is the
master when it says brokerId 0 and a master role. :meth:`ChaosCluster.wait_healthy` waits until
the group has exactly one master, every replica runs, and (controller mode) the in-sync set
holds every replica - the state each fault of a schedule starts from.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, admin_pb2_grpc
from tests.integration.cluster import (
    READY_TIMEOUT_S,
    ServiceProcess,
    etcd_binary,
    free_port,
    restart,
    spawn,
    start_broker,
    start_broker_in,
    start_etcd,
    start_etcd_cluster,
    start_nameserver,
    start_timer_wheel,
)
from tests.robustness.chaos.disk import DiskFiller
from tests.robustness.chaos.gateway import Gateway
from tests.robustness.chaos.netns import NetLab

log = logging.getLogger("chaos.nodes")

GROUP = "broker-a"
"""The controller-mode group faults aim at."""
STATIC_GROUP = "broker-b"
COMMITLOG_FILE_BYTES = 1 << 20
"""Small commitlog files: a run rolls several and the prefix check reads few bytes."""
PROBE_TIMEOUT_S = 1.5
LAB_NAME = "chaos"
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
NAMESRV_PORT = 9876


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 3
    lease_ttl_s: int = 2
    nameservers: int = 2
    static_group: bool = True
    timer: bool = True
    broker_keys: dict[str, object] = field(default_factory=dict)
    """Extra broker keys for every replica of the controller group (they win)."""
    netns: bool = False
    """Every node in a network namespace of its own (needs root), so partitions can run."""
    etcd_members: int = 3
    """Members of the etcd cluster (1 = the single ``etcd`` node of older runs)."""
    disk_slave_bytes: int = 0
    """When > 0, the last replica's store is a volume of this size that the ``disk`` fault
    fills (:class:`~tests.robustness.chaos.disk.DiskFiller`, needs root)."""


@dataclass
class Node:
    name: str
    kind: str
    """etcd | namesrv | broker | timer"""
    sp: ServiceProcess
    group: str = ""
    replica_id: int = 0
    paused: bool = False

    @property
    def addr(self) -> str:
        return self.sp.addr

    @property
    def store(self) -> Path:
        return self.sp.workdir / "store"

    def alive(self) -> bool:
        return self.sp.alive()

    @property
    def lab_name(self) -> str:
        return lab_name(self.name)


def lab_name(name: str) -> str:
    """A node's name in the lab (namespace names take no '-')."""
    return name.replace("-", "_")


def etcd_names(members: int) -> list[str]:
    """Node names of the etcd members: ``etcd`` alone, else ``etcd0``, ``etcd1``, ..."""
    return ["etcd"] if members == 1 else [f"etcd{i}" for i in range(members)]


def replica_keys(cfg: ClusterConfig, etcd_endpoints: str, rid: int) -> dict[str, object]:
    keys: dict[str, object] = {
        "brokerName": GROUP,
        "brokerId": rid,
        "brokerRole": "SYNC_MASTER",
        "etcdEndpoints": etcd_endpoints,
        "controllerLeaseTtlSec": cfg.lease_ttl_s,
        "haMaxTimeSlaveNotCatchup": 5000,
        "haSendHeartbeatInterval": 1000,
        "slaveSyncConfigInterval": 1000,
        "syncFlushTimeout": 3000,
        "mappedFileSizeCommitLog": COMMITLOG_FILE_BYTES,
    }
    keys.update(cfg.broker_keys)
    return keys


class ChaosCluster:
    """Every process of a run; :meth:`close` stops (or kills) them all."""

    def __init__(self, run_dir: Path, cfg: ClusterConfig) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.nodes: dict[str, Node] = {}
        self.lab: NetLab | None = None
        self.gateway: Gateway | None = None
        self.disks: dict[str, DiskFiller] = {}
        """Node name -> the volume its store lives on."""
        self._own: list[ServiceProcess] = []
        """Processes started outside tests.integration.cluster (etcd in a namespace)."""

    # ---- start / stop ----------------------------------------------------------------------

    def start(self) -> None:
        d = self.run_dir / "nodes"
        if self.cfg.netns:
            self.lab = NetLab(LAB_NAME).__enter__()
            self.lab.add_node("driver")
            self.lab.add_node("clients")
            self.gateway = Gateway(self.lab.namespace("driver"))
        members = self._start_etcd(d)
        for sp in members:
            self.nodes[sp.name] = Node(sp.name, "etcd", sp)
        endpoints = ",".join(sp.addr for sp in members)
        for i in range(self.cfg.nameservers):
            name = f"namesrv{i}"
            host, prefix = self._place(name)
            port = NAMESRV_PORT if self.lab is not None else free_port()
            ns = start_nameserver(d, "--listen", f"{host}:{port}", name=name, prefix=prefix)
            self.nodes[name] = Node(name, "namesrv", ns)
        for rid in range(1, self.cfg.replicas + 1):
            name = f"{GROUP}-r{rid}"
            keys = replica_keys(self.cfg, endpoints, rid)
            if rid == self.cfg.replicas and self.cfg.disk_slave_bytes:
                self.disks[name] = DiskFiller(d / name / "store", self.cfg.disk_slave_bytes)
            self.nodes[name] = Node(name, "broker", self._broker(d, name, keys), GROUP, rid)
        if self.cfg.static_group:
            keys = {"mappedFileSizeCommitLog": COMMITLOG_FILE_BYTES}
            sp = self._broker(d, STATIC_GROUP, keys)
            self.nodes[STATIC_GROUP] = Node(STATIC_GROUP, "broker", sp, STATIC_GROUP)
        if self.cfg.timer:
            self.nodes["timer"] = Node("timer", "timer", self._timer(d))

    def _place(self, name: str) -> tuple[str, list[str] | None]:
        """(address to listen on, argv prefix) of a new node."""
        if self.lab is None:
            return "127.0.0.1", None
        ip = self.lab.add_node(lab_name(name))
        return ip, self.lab.prefix(lab_name(name))

    def _broker(self, d: Path, name: str, keys: dict[str, object]) -> ServiceProcess:
        if self.lab is None:
            return start_broker(d, self.namesrv_addrs, name, None, **keys)
        host, prefix = self._place(name)
        assert prefix is not None
        return start_broker_in(prefix, host, d, self.namesrv_addrs, name, None, **keys)

    def _timer(self, d: Path) -> ServiceProcess:
        if self.lab is None:
            return start_timer_wheel(d, self.namesrv_addrs, name="timer")
        host, prefix = self._place("timer")
        workdir = d / "timer"
        args = ["--namesrv", ";".join(self.namesrv_addrs), "--data-dir", str(workdir / "data")]
        return spawn("timer", "services.timer_wheel", [*args, "--listen", f"{host}:0"], workdir,
                     None, prefix)  # fmt: skip

    def _start_etcd(self, d: Path) -> list[ServiceProcess]:
        """Every etcd member, started before any is waited for (a lone member of a larger
        cluster has no quorum and never says healthy)."""
        names = etcd_names(self.cfg.etcd_members)
        if self.lab is None:
            if len(names) == 1:
                return [start_etcd(d, name="etcd")]
            return start_etcd_cluster(d, len(names), name_prefix="etcd")
        hosts = {n: self._place(n)[0] for n in names}
        peer = {n: f"http://{hosts[n]}:{ETCD_PEER_PORT}" for n in names}
        initial = ",".join(f"{n}={peer[n]}" for n in names)
        started = []
        for n in names:
            workdir = d / n
            workdir.mkdir(parents=True, exist_ok=True)
            client = f"http://{hosts[n]}:{ETCD_CLIENT_PORT}"
            argv = [etcd_binary(), "--name", n, "--data-dir", str(workdir / "data"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer[n], "--initial-advertise-peer-urls", peer[n],
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"{LAB_NAME}-etcd"]  # fmt: skip
            addr = f"{hosts[n]}:{ETCD_CLIENT_PORT}"
            started.append(self._spawn_etcd(n, argv, self._prefix(n), workdir, addr, wait=False))
        for sp in started:
            self._wait_etcd(sp)
        return started

    def _prefix(self, name: str) -> list[str]:
        assert self.lab is not None
        return self.lab.prefix(lab_name(name))

    def _spawn_etcd(
        self,
        name: str,
        argv: list[str],
        prefix: list[str],
        workdir: Path,
        addr: str,
        wait: bool = True,
    ) -> ServiceProcess:
        log_path = workdir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [*prefix, *argv], stdout=out, stderr=subprocess.STDOUT, cwd=str(workdir)
            )
        sp = ServiceProcess(name, proc, addr, workdir, log_path, argv, None, prefix)
        self._own.append(sp)
        if wait:
            self._wait_etcd(sp)
        return sp

    def _wait_etcd(self, sp: ServiceProcess) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        health = f"http://{self.dial(sp.addr)}/health"
        while time.monotonic() < deadline:
            if sp.proc.poll() is not None:
                raise RuntimeError(f"{sp.name} exited with {sp.proc.returncode}\n{sp.log_tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=1) as resp:
                if b"true" in resp.read():
                    return
            time.sleep(0.1)
        sp.proc.kill()
        raise RuntimeError(f"{sp.name} not healthy within {READY_TIMEOUT_S}s\n{sp.log_tail()}")

    def dial(self, addr: str) -> str:
        """The address the driver connects to for a node's ``addr``."""
        return addr if self.gateway is None else self.gateway.local(addr)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [n.addr for n in self.nodes.values() if n.kind == "namesrv"]

    @property
    def groups(self) -> list[str]:
        return [GROUP] + ([STATIC_GROUP] if self.cfg.static_group else [])

    def etcd_members(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "etcd"]

    def replicas(self, group: str = GROUP) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "broker" and n.group == group]

    def restart(self, node: Node) -> None:
        """Start a stopped node again on its data (SIGCONT first if paused)."""
        self.resume(node)
        if node.alive():
            node.sp.kill()
        if node.kind == "etcd" and node.sp.prefix:
            sp = node.sp
            node.sp = self._spawn_etcd(sp.name, sp.argv, sp.prefix, sp.workdir, sp.addr)
        else:
            node.sp = restart(node.sp)

    def pause(self, node: Node) -> None:
        node.sp.pause()
        node.paused = True

    def resume(self, node: Node) -> None:
        if node.paused and node.alive():
            node.sp.resume()
        node.paused = False

    def heal_processes(self) -> list[str]:
        """Resume paused nodes, restart dead ones; the names of those touched."""
        touched = []
        for node in self.nodes.values():
            if node.paused:
                self.resume(node)
                touched.append(node.name)
            if not node.alive():
                self.restart(node)
                touched.append(node.name)
        return touched

    def stop(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            self.resume(node)
            if node.alive():
                with contextlib.suppress(AssertionError):
                    node.sp.stop(timeout_s=20)

    def close(self) -> None:
        order = ["timer", "broker", "namesrv", "etcd"]
        try:
            for kind in order:
                self.stop([n for n in self.nodes.values() if n.kind == kind])
        finally:
            for sp in self._own:
                if sp.alive():
                    sp.kill()
            for filler in self.disks.values():
                # the volume's files vanish at unmount: keep a copy for the report
                with contextlib.suppress(OSError):
                    filler.free()
                    shutil.copytree(filler.path, filler.path.with_name("store-copy"))
                filler.close()
            if self.gateway is not None:
                self.gateway.close()
            if self.lab is not None:
                self.lab.close()

    # ---- roles -----------------------------------------------------------------------------

    def stats(self, node: Node) -> admin_pb2.GetRuntimeStatsResponse | None:
        if not node.alive() or node.paused:
            return None
        try:
            with grpc.insecure_channel(self.dial(node.addr)) as ch:
                resp: admin_pb2.GetRuntimeStatsResponse = admin_pb2_grpc.AdminStub(
                    ch
                ).GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest(), timeout=PROBE_TIMEOUT_S)
                return resp
        except grpc.RpcError:
            return None

    def group_stats(self, group: str = GROUP) -> dict[str, admin_pb2.GetRuntimeStatsResponse]:
        out = {}
        for node in self.replicas(group):
            st = self.stats(node)
            if st is not None:
                out[node.name] = st
        return out

    def master_of(self, group: str = GROUP) -> Node | None:
        """The one replica that says it is master, or None (none, or more than one)."""
        stats = self.group_stats(group)
        masters = [name for name, st in stats.items() if is_master(st)]
        return self.nodes[masters[0]] if len(masters) == 1 else None

    def slaves_of(self, group: str = GROUP) -> list[Node]:
        master = self.master_of(group)
        return [n for n in self.replicas(group) if n is not master]

    def health(self) -> str:
        """ "" when the cluster is whole and settled, else what is missing."""
        dead = [n.name for n in self.nodes.values() if not n.alive() or n.paused]
        if dead:
            return f"not running: {dead}"
        problems = []
        for group in self.groups:
            stats = self.group_stats(group)
            masters = [name for name, st in stats.items() if is_master(st)]
            if len(masters) != 1:
                problems.append(f"{group} masters {masters}")
                continue
            st = stats[masters[0]]
            want = len(self.replicas(group))
            if st.controller_mode and len(st.in_sync_replica_ids) < want:
                problems.append(f"{group} in-sync {list(st.in_sync_replica_ids)} of {want}")
        return "; ".join(problems)

    def wait_healthy(self, timeout_s: float) -> str:
        """Wait until :meth:`health` is ""; returns the last problem ("" = healthy)."""
        deadline = time.monotonic() + timeout_s
        problem = self.health()
        while problem and time.monotonic() < deadline:
            time.sleep(0.5)
            problem = self.health()
        if problem:
            log.warning("cluster not healthy after %.0f s: %s", timeout_s, problem)
        return problem


def is_master(st: admin_pb2.GetRuntimeStatsResponse) -> bool:
    return st.broker_id == 0 and st.role != admin_pb2.SLAVE
