"""The cluster under test: every process of a chaos run, by name, and what the driver asks them.

A :class:`ChaosCluster` starts (through :mod:`tests.integration.cluster`) one etcd, nameservers
on fixed ports (so a restarted one is found again at its address), broker group ``broker-a`` in
controller mode - replicas ``1..N`` (``brokerId`` = replica id, ``SYNC_MASTER``, the lease TTL
of the run) - optionally a static single-master group ``broker-b``, and a timer-wheel. Each is
a :class:`Node` named ``etcd``, ``namesrv0``, ``broker-a-r1``, ``broker-b``, ``timer``.

The driver learns roles with GetRuntimeStats (sync gRPC, short deadlines): a replica is the
master when it says brokerId 0 and a master role. :meth:`ChaosCluster.wait_healthy` waits until
the group has exactly one master, every replica runs, and (controller mode) the in-sync set
holds every replica - the state each fault of a schedule starts from.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, admin_pb2_grpc
from tests.integration.cluster import (
    ServiceProcess,
    free_port,
    restart,
    start_broker,
    start_etcd,
    start_nameserver,
    start_timer_wheel,
)

log = logging.getLogger("chaos.nodes")

GROUP = "broker-a"
"""The controller-mode group faults aim at."""
STATIC_GROUP = "broker-b"
COMMITLOG_FILE_BYTES = 1 << 20
"""Small commitlog files: a run rolls several and the prefix check reads few bytes."""
PROBE_TIMEOUT_S = 1.5


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 3
    lease_ttl_s: int = 2
    nameservers: int = 2
    static_group: bool = True
    timer: bool = True
    broker_keys: dict[str, object] = field(default_factory=dict)
    """Extra broker keys for every replica of the controller group (they win)."""


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


def replica_keys(cfg: ClusterConfig, etcd_addr: str, rid: int) -> dict[str, object]:
    keys: dict[str, object] = {
        "brokerName": GROUP,
        "brokerId": rid,
        "brokerRole": "SYNC_MASTER",
        "etcdEndpoints": etcd_addr,
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

    # ---- start / stop ----------------------------------------------------------------------

    def start(self) -> None:
        d = self.run_dir / "nodes"
        etcd = start_etcd(d, name="etcd")
        self.nodes["etcd"] = Node("etcd", "etcd", etcd)
        for i in range(self.cfg.nameservers):
            port = free_port()
            ns = start_nameserver(d, "--listen", f"127.0.0.1:{port}", name=f"namesrv{i}")
            self.nodes[ns.name] = Node(ns.name, "namesrv", ns)
        addrs = self.namesrv_addrs
        for rid in range(1, self.cfg.replicas + 1):
            name = f"{GROUP}-r{rid}"
            keys = replica_keys(self.cfg, etcd.addr, rid)
            sp = start_broker(d, addrs, name, None, **keys)
            self.nodes[name] = Node(name, "broker", sp, GROUP, rid)
        if self.cfg.static_group:
            sp = start_broker(
                d, addrs, STATIC_GROUP, None, mappedFileSizeCommitLog=COMMITLOG_FILE_BYTES
            )
            self.nodes[STATIC_GROUP] = Node(STATIC_GROUP, "broker", sp, STATIC_GROUP)
        if self.cfg.timer:
            sp = start_timer_wheel(d, addrs, name="timer")
            self.nodes["timer"] = Node("timer", "timer", sp)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [n.addr for n in self.nodes.values() if n.kind == "namesrv"]

    @property
    def groups(self) -> list[str]:
        return [GROUP] + ([STATIC_GROUP] if self.cfg.static_group else [])

    def replicas(self, group: str = GROUP) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "broker" and n.group == group]

    def restart(self, node: Node) -> None:
        """Start a stopped node again on its data (SIGCONT first if paused)."""
        self.resume(node)
        if node.alive():
            node.sp.kill()
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
        for kind in order:
            self.stop([n for n in self.nodes.values() if n.kind == kind])

    # ---- roles -----------------------------------------------------------------------------

    def stats(self, node: Node) -> admin_pb2.GetRuntimeStatsResponse | None:
        if not node.alive() or node.paused:
            return None
        try:
            with grpc.insecure_channel(node.addr) as ch:
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
