"""Brokers in controller mode (issue 8): real etcd, nameserver and three replicas of broker-a.

* A fresh group elects replica 1 (the lowest eligible id); it registers as brokerId 0, serves
  SYNC_MASTER sends once a slave is in sync, and the others follow it and refuse writes.
* The master is SIGKILLed right after appending messages its slaves never got (they were
  SIGSTOPped): replica 2 is elected in the next epoch, the route's brokerId 0 moves to it and
  sends succeed there. The old master restarted rejoins as a slave: its divergent tail is cut
  (TruncateTo from the epoch histories) and its commitlog becomes a copy of the new master's.
* Switchover to a chosen replica: it leads the next epoch and takes sends; the old master
  follows it.
* Static mode (no etcdEndpoints) is untouched: no controller fields, Switchover refused.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
)
from services.store.inspect import detect_layout, verify
from tests.integration.cluster import ServiceProcess
from tests.integration.replication_support import (
    HA_KEYS,
    create_topics,
    queue_ends,
    runtime_stats,
    send_batch,
)
from tests.support.cluster import Group, cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "CtlTopic"
GROUP = "broker-a"


REPLICA_KEYS: dict[str, object] = {
    **HA_KEYS,
    "brokerRole": "SYNC_MASTER",
    "controllerLeaseTtlSec": 2,
    "syncFlushTimeout": 2000,
}


async def stats_or_none(sp: ServiceProcess) -> admin_pb2.GetRuntimeStatsResponse | None:
    try:
        return await runtime_stats(sp.addr)
    except grpc.aio.AioRpcError:
        return None


async def wait_master(
    replicas: dict[int, ServiceProcess], after_epoch: int, timeout_s: float = 20
) -> tuple[int, admin_pb2.GetRuntimeStatsResponse]:
    """Until exactly one live replica reports brokerId 0 in an epoch above ``after_epoch``."""
    found: list[tuple[int, admin_pb2.GetRuntimeStatsResponse]] = []

    async def one() -> bool:
        found.clear()
        for rid, sp in replicas.items():
            if not sp.alive():
                continue
            s = await stats_or_none(sp)
            if s is not None and s.broker_id == 0 and s.epoch > after_epoch:
                found.append((rid, s))
        return len(found) == 1

    await until(one, f"one master in an epoch above {after_epoch}", timeout_s, 0.1)
    return found[0]


async def wait_in_sync(addr: str, slaves: int, timeout_s: float = 20) -> None:
    async def ok() -> bool:
        s = await runtime_stats(addr)
        return sum(1 for x in s.slaves if x.in_sync) >= slaves

    await until(ok, f"{slaves} in-sync slave(s) on {addr}", timeout_s)


async def send(addr: str, tag: str, n: int, timeout_s: float = 15) -> list[int]:
    """``n`` single sends to queue 0; their statuses."""
    async with RawClient(addr) as rc:
        stub = rc.messaging
        out = []
        for i in range(n):
            sent = await asyncio.wait_for(
                send_batch(stub, TOPIC, 0, [f"{tag}-{i}".encode()]), timeout_s
            )
            out.append(sent[0].status)
        return out


async def master_in_route(namesrv: str) -> str:
    async with RawClient(namesrv) as rc:
        try:
            resp = await rc.route(TOPIC)
        except grpc.aio.AioRpcError:  # not registered yet
            return ""
    for b in resp.route.brokers:
        if b.broker_name == GROUP:
            return str(b.broker_addrs.get(0, ""))
    return ""


def commitlog_bytes(store: Path, end: int) -> bytes:
    files = sorted((store / "commitlog").glob("[0-9]" * 20))
    data = b"".join(f.read_bytes() for f in files)
    assert int(files[0].name) == 0 and len(data) >= end
    return data[:end]


async def test_election_failover_truncation_and_switchover(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=0, replicas=3, group_name=GROUP, group_keys=REPLICA_KEYS) as c:
        assert c.group is not None
        await _failover(c.group)


async def _failover(group: Group) -> None:
    ns = group.nameserver
    replicas = group.replicas
    stores = {rid: group.store(rid) for rid in replicas}

    # -- a fresh group elects replica 1 -----------------------------------------------------
    rid, st = await wait_master(replicas, 0)
    assert rid == 1 and st.controller_mode and st.replica_id == 1
    assert st.role == admin_pb2.SYNC_MASTER
    first_epoch = st.epoch
    master = replicas[1]
    await create_topics(master.addr, GROUP, [TOPIC], 1)
    await wait_in_sync(master.addr, 2)
    for sp in (replicas[2], replicas[3]):  # config sync copied the topic (slaveSyncConfigInterval)
        await until(partial(_has_topic, sp.addr), f"{TOPIC} on {sp.name}", 10)
    assert await send(master.addr, "e1", 20) == [messaging_pb2.SEND_OK] * 20
    st = await runtime_stats(master.addr)
    assert sorted(st.in_sync_replica_ids) == [1, 2, 3] and st.lease_remaining_ms > 0
    slave_stats = await runtime_stats(replicas[2].addr)
    assert slave_stats.broker_id == 2 and slave_stats.role == admin_pb2.SLAVE
    assert slave_stats.leader_addr == master.addr
    code, reason, _ = await refused(send(replicas[2].addr, "no", 1))
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)
    await until(
        lambda: _eq(master_in_route(ns.addr), master.addr), "route lists replica 1 as 0", 10
    )

    # -- a tail only the master has, then SIGKILL ---------------------------------------------
    before = st.commitlog_max_offset
    for sp in (replicas[2], replicas[3]):
        sp.pause()
    try:
        async with RawClient(master.addr) as rc:
            stub = rc.messaging
            pending = [
                asyncio.create_task(send_batch(stub, TOPIC, 0, [b"lost-%d-" % i + b"x" * 2000]))
                for i in range(10)
            ]
            await until(
                lambda: _gt(runtime_stats(master.addr), before + 10 * 2000),
                "the unreplicated tail",
                5,
            )
            master.kill()
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for sp in (replicas[2], replicas[3]):
            sp.resume()
    master.wait_exit()

    # -- an in-sync slave is elected; sends succeed there -----------------------------------------
    # Replicas 2 and 3 hold the same data, so the ranking prefers 2; but on a loaded machine the
    # pause can outlast the 2 s lease, and then whichever slave re-grants its lease first is the
    # only live candidate. Either is a correct election; the switchover then targets the other.
    rid, st = await wait_master(replicas, first_epoch)
    assert rid in (2, 3), rid
    other = 5 - rid
    second_epoch = st.epoch
    new_master = replicas[rid]
    await until(
        lambda: _eq(master_in_route(ns.addr), new_master.addr), f"route moved to replica {rid}", 15
    )
    await wait_in_sync(new_master.addr, 1)
    assert await send(new_master.addr, "e2", 20) == [messaging_pb2.SEND_OK] * 20

    # -- the old master rejoins as a slave, its tail truncated -------------------------------------
    old = group.restart(1)
    await wait_in_sync(new_master.addr, 2)
    st1 = await runtime_stats(old.addr)
    assert st1.broker_id == 1 and st1.role == admin_pb2.SLAVE and st1.epoch == second_epoch
    assert "truncating the commitlog" in old.log_tail(400)

    # -- switchover to the other slave -------------------------------------------------------------
    async with RawClient(new_master.addr) as rc:
        resp = await rc.admin.Switchover(
            admin_pb2.SwitchoverRequest(target_replica_id=other, timeout_ms=15_000), timeout=20
        )
    assert resp.new_master_replica_id == other and resp.epoch > second_epoch
    assert resp.new_master_addr == replicas[other].addr
    rid, st = await wait_master(replicas, second_epoch)
    assert rid == other
    await wait_in_sync(replicas[other].addr, 2)
    assert await send(replicas[other].addr, "e3", 10) == [messaging_pb2.SEND_OK] * 10
    end = (await runtime_stats(replicas[other].addr)).commitlog_max_offset

    async def all_at_end() -> bool:
        got = [await runtime_stats(sp.addr) for sp in replicas.values()]
        return all(s.commitlog_max_offset == end for s in got)

    await until(all_at_end, "every replica at the master's end", 15)
    for sp in replicas.values():
        assert sp.stop() == 0
    reference = commitlog_bytes(stores[other], end)
    for r, store in stores.items():
        assert commitlog_bytes(store, end) == reference, f"replica {r} differs"
        report = verify(detect_layout(store))
        assert report.ok and report.commitlog_end == end, (r, report.problems[:5])


async def _has_topic(addr: str) -> bool:
    return (await queue_ends(addr, [TOPIC], 1))[(TOPIC, 0)] >= 0


async def _eq(value: object, want: str) -> bool:
    assert asyncio.iscoroutine(value)
    return bool(await value == want)


async def _gt(stats: object, before: int) -> bool:
    assert asyncio.iscoroutine(stats)
    got: admin_pb2.GetRuntimeStatsResponse = await stats
    return bool(got.commitlog_max_offset > before)


async def test_static_mode_has_no_controller(tmp_path: Path) -> None:
    with cluster(tmp_path, brokers=0, slaves=1, slave_keys=HA_KEYS) as c:
        await _static(c.slaves[0])


async def _static(slave: ServiceProcess) -> None:
    st = await runtime_stats(slave.addr)
    assert not st.controller_mode and st.replica_id == 1 and st.broker_id == 1
    assert not st.in_sync_replica_ids and st.leader_addr == ""
    async with RawClient(slave.addr) as rc:
        code, _, msg = await refused(rc.admin.Switchover(admin_pb2.SwitchoverRequest(), timeout=5))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "controller mode" in msg
    assert slave.stop() == 0
