"""Failover modes (issue 8): ASYNC_MASTER's bounded, reported loss, and static roles without
etcd, with real processes.

* ASYNC_MASTER (three replicas, lease TTL 5 s so paused slaves keep their leases): the slaves
  are SIGSTOPped while the master acknowledges 1.5 MiB at once (replication in flight capped at
  128 KiB); sends stop, the master publishes its max offset (every ~1 s), then it is SIGKILLed
  and the slaves resume. A slave is elected and reports "acknowledged bytes possibly lost"
  (admin stats and its log). Asserted: the report exists, the bytes actually lost (the old
  master's log end minus where the new epoch starts) are at most the reported figure, every
  lost SEND_OK message lies in that window, and every SEND_OK message before it is readable.
* No etcdEndpoints: a SYNC_MASTER and its slave keep their configured roles (brokerId, role,
  epoch 0, not controller mode), sends succeed; the master SIGKILLed, the slave stays a slave
  (NOT_MASTER to writes, reads served), and Switchover is refused (FAILED_PRECONDITION).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import aetcd
import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, SendStatus
from services.store.epoch_file import EpochHistory
from services.store.inspect import detect_layout, verify
from tests.integration.cluster import ServiceProcess
from tests.integration.failover_support import (
    ELECTION_BOUND_S,
    QUEUES,
    TOPIC,
    Ack,
    Group,
    ha_group,
    prepare,
    readable_keys,
    send_raw,
    stats_of,
    wait_all_readable,
    wait_master,
)
from tests.integration.replication_support import (
    HA_KEYS,
    create_topics,
    wait_in_sync,
    wait_route,
)
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import at_least, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WINDOW_BYTES = 131072
BURST_BATCHES = 12
LOST_RE = re.compile(r"up to (\d+) acknowledged bytes possibly lost")


async def published_max_offset(g: Group, rid: int) -> int:
    """The max offset replica ``rid`` last published in its etcd member key (-1 if none)."""
    host, port = g.etcd.addr.rsplit(":", 1)
    async with aetcd.Client(host, int(port), timeout=2) as client:
        kv = await client.get(f"/rocketq/DefaultCluster/{g.broker_name}/members/{rid}".encode())
    return -1 if kv is None else int(json.loads(kv.value)["max_offset"])


def reported_loss(
    stats: admin_pb2.GetRuntimeStatsResponse, log: str
) -> tuple[int | None, int | None]:
    """The "acknowledged bytes possibly lost" figure from the stats' extra values (a key
    naming "lost") and from the log, each None when absent."""
    from_stats = None
    for key, value in stats.extra.items():
        if "lost" in key.lower() and value.strip().lstrip("-").isdigit():
            from_stats = int(value)
    found = LOST_RE.findall(log)
    from_log = int(found[-1]) if found else None
    return from_stats, from_log


async def async_failover(g: Group) -> None:
    m1 = await prepare(g)
    old_addr = g.addr(m1)
    slaves = sorted(set(g.live()) - {m1})
    acks: list[Ack] = []
    async with RawClient(old_addr) as rc:
        stub = rc.messaging
        for i in range(40):
            await send_raw(stub, f"pre-{i}", acks)
        for rid in slaves:
            g.replicas[rid].pause()
        try:
            # 12 x 32 x 4 KiB = 1.5 MiB acknowledged at once; the slaves can hold 128 KiB of it
            for i in range(BURST_BATCHES):
                await send_raw(stub, f"burst-{i}", acks, 10, 4096, 32)
            # the master publishes its max offset about every second: wait until etcd has all
            # of the burst, so the election knows how far the old master got
            st = await stats_of(old_addr)
            assert st is not None
            await until(
                lambda: at_least(published_max_offset(g, m1), st.commitlog_max_offset),
                "the master's max offset published in etcd",
            )
            g.replicas[m1].kill()
        finally:
            for rid in slaves:
                g.replicas[rid].resume()
    t_kill = time.monotonic()
    m2 = await wait_master(g, ELECTION_BOUND_S + 5, not_rid=m1)
    print(f"ASYNC_MASTER: new master after {time.monotonic() - t_kill:.2f}s")
    assert all(a.ok for a in acks), {a.outcome for a in acks}

    old_end = verify(detect_layout(g.store(m1))).commitlog_end
    starts = {e.epoch: e.start_offset for e in EpochHistory(g.store(m2) / "epoch").load()}
    new_start = starts[max(starts)]
    lost_bytes = old_end - new_start
    stats = await stats_of(g.addr(m2))
    assert stats is not None
    from_stats, from_log = reported_loss(stats, g.replicas[m2].log_path.read_text())
    print(f"lost {lost_bytes} B; reported: stats {from_stats}, log {from_log}")
    assert from_stats is not None, f"no 'possibly lost' figure in the stats: {dict(stats.extra)}"
    assert from_log is not None, "no 'possibly lost' line in the new master's log"
    assert lost_bytes > WINDOW_BYTES, "the test did not make the ASYNC_MASTER lose anything"
    assert lost_bytes <= from_stats and lost_bytes <= from_log, (lost_bytes, from_stats, from_log)

    have = await readable_keys(g.addr(m2))
    lost = [a for a in acks if a.key not in have]
    assert lost, "SEND_OK messages beyond the slaves' window were all kept?"
    assert all(a.physical_offset >= new_start for a in lost), (
        f"a SEND_OK message before the new epoch's start {new_start} is missing: "
        f"{min(lost, key=lambda a: a.physical_offset)}"
    )
    kept = {a.key for a in acks if a.physical_offset < new_start}
    await wait_all_readable(g.addr(m2), kept, what="SEND_OK messages before the cut")


async def test_async_master_failover_loss_bounded_and_reported(tmp_path: Path) -> None:
    keys: dict[str, object] = {
        "brokerRole": "ASYNC_MASTER",
        "controllerLeaseTtlSec": 5,
        "haTransferBatchSize": 65536,
        "haMaxInFlightBytes": WINDOW_BYTES,
        "haMaxTimeSlaveNotCatchup": 15000,
    }
    with ha_group(tmp_path, keys=keys) as g:
        await async_failover(g)


async def test_no_etcd_static_roles_as_before(tmp_path: Path) -> None:
    master_keys = {**HA_KEYS, "brokerRole": "SYNC_MASTER"}
    with cluster(tmp_path, broker_keys=master_keys, slaves=1, slave_keys=HA_KEYS) as c:
        await static_roles(c.nameserver, c.broker, c.slaves[0])


async def static_roles(ns: ServiceProcess, master: ServiceProcess, slave: ServiceProcess) -> None:
    await create_topics(master.addr, "broker-a", [TOPIC], QUEUES)
    await wait_route(ns.addr, TOPIC, {"broker-a"})
    await wait_in_sync(master.addr)
    ms, ss = await stats_of(master.addr), await stats_of(slave.addr)
    assert ms is not None and ss is not None
    assert (ms.broker_id, ms.role, ms.epoch, ms.controller_mode) == (
        0,
        admin_pb2.SYNC_MASTER,
        0,
        False,
    )
    assert (ss.broker_id, ss.role, ss.replica_id, ss.controller_mode) == (
        1,
        admin_pb2.SLAVE,
        1,
        False,
    )
    async with Producer(ProducerConfig("failover-static", [ns.addr])) as p:
        for i in range(20):
            res = await p.send(Message(TOPIC, f"static-{i}".encode()))
            assert res.status == SendStatus.SEND_OK
    await wait_all_readable(slave.addr, {f"static-{i}" for i in range(20)})
    async with RawClient(master.addr) as rc:
        code, _, _ = await refused(rc.admin.Switchover(admin_pb2.SwitchoverRequest(), timeout=5))
        assert code == grpc.StatusCode.FAILED_PRECONDITION

    master.kill()
    await asyncio.sleep(4)  # a real interval, twice a controller lease: nothing may take over
    ss = await stats_of(slave.addr)
    assert ss is not None and (ss.broker_id, ss.role) == (1, admin_pb2.SLAVE)
    out: list[Ack] = []
    async with RawClient(slave.addr) as rc:
        await send_raw(rc.messaging, "to-slave", out)
    assert [a.outcome for a in out] == ["UNAVAILABLE/NOT_MASTER"]
    assert {f"static-{i}" for i in range(20)} <= await readable_keys(slave.addr)
