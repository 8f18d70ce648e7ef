"""Failover state for the administration client: :meth:`Admin.ha_status` and
:meth:`Admin.switchover` (DESIGN.md §6, controller mode).

**Status.** The nameserver knows which replicas of a group are registered (the master as
brokerId 0, the others under their replica ids); each replica knows its own role, epoch, offsets
and lease, and what etcd says of the group (in-sync set, leader address), all in
``GetRuntimeStats``. So ``ha_status`` asks every registered replica of every group (or of one)
at once and folds the answers into one :class:`HaGroup` per group:

- the master is the replica that says it leads (brokerId 0, a master role); should two say so
  (an old master that has not yet learned of the new epoch), the higher epoch wins and the
  group carries a warning;
- the epoch is the highest any replica reports; the in-sync set is the master's (else that of
  the replica with the highest epoch); with static roles (no etcd) it is the master plus the
  slaves its replication tracker counts as in sync;
- an in-sync replica that is not registered or did not answer is listed (role "DOWN") with a
  warning: the group may elect only among in-sync replicas, so a down one matters.

**Switchover.** ``Admin.Switchover`` goes to the master found that way (not the nameserver's
brokerId 0, which lags an election by up to a registration interval). The broker does the
work: it stops acknowledging, waits until the target has every byte, gives up the leader key
and answers once the target leads. A master that lost the role meanwhile answers NOT_MASTER;
the status is then read again and the new master asked, once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocketq._api.rocketq.v1 import admin_pb2
from rocketq.client._admin_types import RuntimeStats, runtime_stats
from rocketq.client.errors import InvalidArgumentError, NotFoundError, RocketQError

if TYPE_CHECKING:
    from rocketq.client.admin import Admin

SWITCHOVER_TIMEOUT_MS_DEFAULT = 10_000
SWITCHOVER_TIMEOUT_MS_MAX = 120_000
"""admin.proto SwitchoverRequest.timeout_ms accepts 1..120000."""
SWITCHOVER_RPC_MARGIN_S = 5.0
"""The call's deadline is the switchover timeout plus this (the election after the catch-up)."""
DOWN = "DOWN"
"""Role shown for an in-sync replica that is not registered or did not answer."""


@dataclass(frozen=True)
class HaReplica:
    """One replica of a broker group as it reports itself."""

    replica_id: int
    addr: str
    """"host:port"; empty for an in-sync replica that is not registered."""
    role: str
    """"SYNC_MASTER", "ASYNC_MASTER", "SLAVE", or "DOWN" (did not answer)."""
    broker_id: int
    """The id it registers under: 0 while it is the master, else its replica id."""
    epoch: int
    max_offset: int
    """Commitlog offset one past its last byte."""
    confirm_offset: int
    in_isr: bool
    """Whether it is in the group's in-sync set (only those may be elected)."""
    lease_remaining_ms: int
    """Controller mode: how long its etcd lease stays valid without renewal."""
    lag_bytes: int = 0
    """The master's max offset minus this replica's (0 for the master, or with no master)."""
    error: str = ""
    """Why it could not be asked (role "DOWN")."""


@dataclass(frozen=True)
class HaGroup:
    """A broker group's failover state."""

    cluster: str
    broker_name: str
    controller_mode: bool
    """Roles come from elections through etcd (etcdEndpoints set)."""
    master_replica_id: int | None
    """None while no replica leads (an election is under way, or no in-sync replica is up)."""
    master_addr: str
    epoch: int
    in_sync_replica_ids: tuple[int, ...]
    replicas: tuple[HaReplica, ...]
    """Every registered replica and every in-sync one, by replica id."""
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class SwitchoverResult:
    """A group's master after a switchover."""

    broker_name: str
    old_master_replica_id: int
    old_master_addr: str
    new_master_replica_id: int
    new_master_addr: str
    epoch: int


def _claims_master(s: RuntimeStats) -> bool:
    return s.broker_id == 0 and s.role != "SLAVE"


def _isr(master: RuntimeStats | None, answers: list[RuntimeStats]) -> tuple[int, ...]:
    """The in-sync set: etcd's as the master (else the newest replica) reports it; with static
    roles the master and the slaves its tracker counts as in sync."""
    best = master or max(answers, key=lambda s: s.epoch, default=None)
    if best is None:
        return ()
    if best.controller_mode:
        return tuple(sorted(best.in_sync_replica_ids))
    if master is None:
        return ()
    slaves = {sl.broker_id for sl in master.slaves if sl.in_sync}
    return tuple(sorted({master.replica_id, *slaves}))


def summarize_group(
    cluster: str,
    broker_name: str,
    registered: dict[int, str],
    answers: dict[str, RuntimeStats | str],
) -> HaGroup:
    """One group's :class:`HaGroup` from its registered addresses (broker id -> addr) and what
    each address answered (its stats, or an error message). Pure, for the unit tests."""
    stats = [a for a in answers.values() if isinstance(a, RuntimeStats)]
    claimants = sorted((s for s in stats if _claims_master(s)), key=lambda s: -s.epoch)
    master = claimants[0] if claimants else None
    warnings: list[str] = []
    if len(claimants) > 1:
        others = ", ".join(f"{s.replica_id} (epoch {s.epoch})" for s in claimants[1:])
        warnings.append(
            f"replicas {others} also report being master; replica {claimants[0].replica_id} "
            f"has the newest epoch {claimants[0].epoch}"
        )
    isr = _isr(master, stats)
    master_max = master.commitlog_max_offset if master is not None else None
    addr_of = {s.replica_id: a for a, s in answers.items() if isinstance(s, RuntimeStats)}
    replicas: dict[int, HaReplica] = {}
    for addr, answer in answers.items():
        if isinstance(answer, RuntimeStats):
            replicas[answer.replica_id] = HaReplica(
                replica_id=answer.replica_id,
                addr=addr_of.get(answer.replica_id, addr),
                role=answer.role,
                broker_id=answer.broker_id,
                epoch=answer.epoch,
                max_offset=answer.commitlog_max_offset,
                confirm_offset=answer.confirm_offset,
                in_isr=answer.replica_id in isr,
                lease_remaining_ms=answer.lease_remaining_ms,
                lag_bytes=max(0, master_max - answer.commitlog_max_offset)
                if master_max is not None
                else 0,
            )
    for broker_id, addr in registered.items():
        failure = answers.get(addr)
        if isinstance(failure, str) and broker_id not in replicas:
            down_id = broker_id if broker_id else -1  # the master's replica id is unknown
            replicas[down_id] = _down(down_id, addr, broker_id, down_id in isr, failure)
            warnings.append(f"replica at {addr} (registered as id {broker_id}) did not answer")
    for rid in isr:
        if rid not in replicas:
            replicas[rid] = _down(rid, "", rid, True, "no registered replica answered as it")
            warnings.append(f"in-sync replica {rid} did not answer (down or not registered)")
    if master is None and stats:
        warnings.append("no replica is master: writes are refused until one is elected")
    return HaGroup(
        cluster=cluster,
        broker_name=broker_name,
        controller_mode=any(s.controller_mode for s in stats),
        master_replica_id=master.replica_id if master is not None else None,
        master_addr=addr_of.get(master.replica_id, "") if master is not None else "",
        epoch=max((s.epoch for s in stats), default=0),
        in_sync_replica_ids=isr,
        replicas=tuple(replicas[k] for k in sorted(replicas)),
        warnings=tuple(warnings),
    )


def _down(replica_id: int, addr: str, broker_id: int, in_isr: bool, error: str) -> HaReplica:
    return HaReplica(replica_id, addr, DOWN, broker_id, 0, 0, 0, in_isr, 0, error=error)


async def _stats_or_error(admin: Admin, addr: str) -> RuntimeStats | str:
    request = admin_pb2.GetRuntimeStatsRequest()
    try:
        pb = await admin._guard(addr, admin._admin(addr).GetRuntimeStats(request, **admin._kw))
    except RocketQError as exc:
        return exc.message
    return runtime_stats(pb)


async def ha_status(admin: Admin, broker_name: str | None = None) -> list[HaGroup]:
    """See :meth:`Admin.ha_status`."""
    info = await admin.cluster_info()
    if broker_name is not None and broker_name not in info.brokers:
        known = ", ".join(sorted(info.brokers)) or "none"
        raise NotFoundError(f"no broker group named {broker_name!r} is registered (known: {known})")
    names = [broker_name] if broker_name is not None else sorted(info.brokers)
    addrs = sorted({a for n in names for a in info.brokers[n].addrs.values()})
    answers = await asyncio.gather(*(_stats_or_error(admin, a) for a in addrs))
    by_addr = dict(zip(addrs, answers, strict=True))
    groups = []
    for name in names:
        group = info.brokers[name]
        mine = {a: by_addr[a] for a in group.addrs.values()}
        groups.append(summarize_group(group.cluster, name, dict(group.addrs), mine))
    return groups


def check_switchover_args(target_replica_id: int, timeout_ms: int) -> None:
    if target_replica_id < 0:
        raise InvalidArgumentError(
            f"target replica id is {target_replica_id}; use a replica id >= 1, or 0 for the "
            "best-ranked in-sync slave"
        )
    if not 1 <= timeout_ms <= SWITCHOVER_TIMEOUT_MS_MAX:
        raise InvalidArgumentError(
            f"timeout is {timeout_ms} ms; use 1..{SWITCHOVER_TIMEOUT_MS_MAX}"
        )


async def _master_of(admin: Admin, broker_name: str) -> HaGroup:
    [group] = await ha_status(admin, broker_name)
    if group.master_replica_id is None or not group.master_addr:
        raise NotFoundError(
            f"broker group {broker_name!r} has no master right now (an election may be under "
            "way); try again in a few seconds"
        )
    return group


async def switchover(
    admin: Admin,
    broker_name: str,
    target_replica_id: int = 0,
    timeout_ms: int = SWITCHOVER_TIMEOUT_MS_DEFAULT,
) -> SwitchoverResult:
    """See :meth:`Admin.switchover`."""
    check_switchover_args(target_replica_id, timeout_ms)
    request = admin_pb2.SwitchoverRequest(
        target_replica_id=target_replica_id, timeout_ms=timeout_ms
    )
    deadline_s = timeout_ms / 1000 + SWITCHOVER_RPC_MARGIN_S
    for attempt in range(2):
        group = await _master_of(admin, broker_name)
        assert group.master_replica_id is not None
        addr = group.master_addr
        try:
            pb = await admin._guard(
                addr, admin._admin(addr).Switchover(request, timeout=deadline_s)
            )
        except RocketQError as exc:
            if exc.reason == "NOT_MASTER" and attempt == 0:
                continue  # it lost the role since the status was read: ask the new master
            raise
        return SwitchoverResult(
            broker_name=broker_name,
            old_master_replica_id=group.master_replica_id,
            old_master_addr=addr,
            new_master_replica_id=pb.new_master_replica_id,
            new_master_addr=pb.new_master_addr,
            epoch=pb.epoch,
        )
    raise AssertionError("unreachable")  # the loop returns or raises


__all__ = ["DOWN", "HaGroup", "HaReplica", "SwitchoverResult", "ha_status", "switchover"]
