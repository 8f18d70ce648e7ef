"""Fault injection ("failpoint" in etcd's layout): each fault is journaled with its start and end.

A fault is a function ``(cluster, rng) -> FaultResult`` run by the driver's thread: it breaks
something, waits, and repairs it (restart, SIGCONT, heal), so every fault of a schedule ends
with every process running again; the cluster then settles (``wait_healthy``) before the next.

| name              | what                                                                  |
|-------------------|-----------------------------------------------------------------------|
| ``kill``          | SIGKILL the master of ``broker-a``; restart it after a few seconds      |
|                   | (it returns as a slave and truncates a divergent tail)                |
| ``pause``         | SIGSTOP the master longer than two lease TTLs, then SIGCONT (a fenced |
|                   | old master wakes up to a newer epoch)                                  |
| ``kill-slave``    | SIGKILL a slave of ``broker-a``, restart it                            |
| ``namesrv``       | SIGKILL a nameserver, restart it on its port                          |
| ``timer``         | SIGKILL the timer-wheel, restart it                                   |
| ``etcd``          | SIGKILL one etcd member (a random one of several), restart it; with   |
|                   | one member every lease stalls meanwhile, with three the rest go on    |
| ``etcd-quorum``   | SIGKILL a majority of the etcd members (2 of 3) for a few seconds,   |
|                   | then restart them: no lease can be renewed, the master fences itself  |
|                   | (skipped with a single member: that is ``etcd``)                      |
| ``partition``     | cut the master from one slave (network namespaces only)               |
| ``etcd-partition``| cut the master from every etcd member (network namespaces only)       |
| ``disk``          | fill a slave's store volume, then free it (disk_slave_bytes > 0)   |

The journal kinds (``fault`` events, see :mod:`~tests.robustness.chaos.model`):
``kill-master``, ``pause-master``, ``kill-slave``, ``kill-namesrv``, ``kill-timer``,
``kill-etcd``, ``kill-etcd-quorum``, ``partition-master-slave``, ``partition-master-etcd``,
``disk-full-slave``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.robustness.chaos.nodes import GROUP, Node

if TYPE_CHECKING:
    from tests.robustness.chaos.scenario import Run

log = logging.getLogger("chaos.faults")


@dataclass(frozen=True)
class FaultResult:
    kind: str
    target: str
    group: str
    t0: int
    t1: int
    note: str = ""


Fault = Callable[["Run", random.Random], FaultResult]


class FaultSkipped(Exception):
    """The fault cannot run in this setup (no namespaces, no master to aim at, ...)."""


def _master(run: Run) -> Node:
    node = run.cluster.master_of(GROUP)
    if node is None:
        raise FaultSkipped(f"{GROUP} has no single master to aim at")
    return node


def _down_then_up(run: Run, node: Node, kind: str, down_s: float, group: str) -> FaultResult:
    t0 = time.monotonic_ns()
    node.sp.kill()
    time.sleep(down_s)
    run.cluster.restart(node)
    return FaultResult(kind, node.name, group, t0, time.monotonic_ns(), f"down {down_s:.1f}s")


def kill_master(run: Run, rng: random.Random) -> FaultResult:
    node = _master(run)
    return _down_then_up(run, node, "kill-master", rng.uniform(3, 6), GROUP)


def pause_master(run: Run, rng: random.Random) -> FaultResult:
    node = _master(run)
    pause_s = 2 * run.cluster.cfg.lease_ttl_s + rng.uniform(1, 3)
    t0 = time.monotonic_ns()
    run.cluster.pause(node)
    time.sleep(pause_s)
    run.cluster.resume(node)
    return FaultResult("pause-master", node.name, GROUP, t0, time.monotonic_ns(), f"{pause_s:.1f}s")


def kill_slave(run: Run, rng: random.Random) -> FaultResult:
    slaves = run.cluster.slaves_of(GROUP)
    if not slaves:
        raise FaultSkipped("no slave")
    node = rng.choice(slaves)
    return _down_then_up(run, node, "kill-slave", rng.uniform(2, 5), GROUP)


def kill_namesrv(run: Run, rng: random.Random) -> FaultResult:
    nodes = [n for n in run.cluster.nodes.values() if n.kind == "namesrv"]
    return _down_then_up(run, rng.choice(nodes), "kill-namesrv", rng.uniform(1, 3), "")


def kill_timer(run: Run, rng: random.Random) -> FaultResult:
    node = run.cluster.nodes.get("timer")
    if node is None:
        raise FaultSkipped("no timer-wheel in this run")
    return _down_then_up(run, node, "kill-timer", rng.uniform(1, 3), "")


def kill_etcd(run: Run, rng: random.Random) -> FaultResult:
    node = rng.choice(run.cluster.etcd_members())
    return _down_then_up(run, node, "kill-etcd", rng.uniform(2, 4), GROUP)


def kill_etcd_quorum(run: Run, rng: random.Random) -> FaultResult:
    members = run.cluster.etcd_members()
    if len(members) < 3:
        raise FaultSkipped("losing the etcd quorum but not etcd needs 3 or more members")
    victims = rng.sample(members, len(members) // 2 + 1)
    down_s = rng.uniform(3, 6)
    t0 = time.monotonic_ns()
    for node in victims:
        node.sp.kill()
    time.sleep(down_s)
    for node in victims:  # the first one back restores the quorum (restart waits for health)
        run.cluster.restart(node)
    target = ",".join(n.name for n in victims)
    return FaultResult(
        "kill-etcd-quorum", target, GROUP, t0, time.monotonic_ns(), f"down {down_s:.1f}s"
    )


def _partition(run: Run, kind: str, a: Node, others: list[Node], hold_s: float) -> FaultResult:
    """Cut ``a`` from every node of ``others`` for ``hold_s``, then heal."""
    lab = run.lab
    if lab is None:
        raise FaultSkipped("network partitions need network namespaces (root)")
    t0 = time.monotonic_ns()
    for b in others:
        lab.partition(a.lab_name, b.lab_name)
    time.sleep(hold_s)
    lab.heal()
    target = f"{a.name}|{','.join(b.name for b in others)}"
    return FaultResult(kind, target, GROUP, t0, time.monotonic_ns(), f"{hold_s:.1f}s")


def partition_master_slave(run: Run, rng: random.Random) -> FaultResult:
    master = _master(run)
    slaves = run.cluster.slaves_of(GROUP)
    if not slaves:
        raise FaultSkipped("no slave")
    slave = rng.choice(slaves)
    return _partition(run, "partition-master-slave", master, [slave], rng.uniform(4, 8))


def partition_master_etcd(run: Run, rng: random.Random) -> FaultResult:
    master = _master(run)
    hold_s = 2 * run.cluster.cfg.lease_ttl_s + rng.uniform(1, 3)
    members = run.cluster.etcd_members()
    return _partition(run, "partition-master-etcd", master, members, hold_s)


def disk_full_slave(run: Run, rng: random.Random) -> FaultResult:
    disks = run.cluster.disks
    slaves = [n for n in run.cluster.slaves_of(GROUP) if n.name in disks]
    if not slaves:
        raise FaultSkipped("no slave runs on a fillable volume (ClusterConfig.disk_slave_bytes)")
    node = slaves[0]
    t0 = time.monotonic_ns()
    left = disks[node.name].fill()
    time.sleep(rng.uniform(3, 6))
    disks[node.name].free()
    return FaultResult(
        "disk-full-slave", node.name, GROUP, t0, time.monotonic_ns(), f"{left} bytes left"
    )


FAULTS: dict[str, Fault] = {
    "kill": kill_master,
    "pause": pause_master,
    "kill-slave": kill_slave,
    "namesrv": kill_namesrv,
    "timer": kill_timer,
    "etcd": kill_etcd,
    "etcd-quorum": kill_etcd_quorum,
    "partition": partition_master_slave,
    "etcd-partition": partition_master_etcd,
    "disk": disk_full_slave,
}
"""Every fault by its command-line name."""
