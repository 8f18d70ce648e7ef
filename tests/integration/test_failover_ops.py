"""Failover operations (issue 8): a manual switchover under traffic, and etcd going away, with
real processes (three replicas of ``broker-a`` in controller mode, SYNC_MASTER, lease 2 s).

* Switchover to a chosen replica while SDK producers send: refused for a replica that does not
  exist (FAILED_PRECONDITION) and on a slave (UNAVAILABLE NOT_MASTER); granted for the chosen
  one, which answers as the new master in a higher epoch; the old master becomes its slave; no
  SEND_OK message is lost, no two replicas acked at once, and the brief unavailability (the
  longest gap between two SEND_OK replies around it) is measured and bounded.
* etcd SIGKILLed: the master can no longer renew its lease and fences itself within the lease
  (raw sends refused with UNAVAILABLE NOT_MASTER), while reads keep working on every replica;
  etcd restarted on the same ports and data: a master again, sends succeed, nothing acked lost.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2
from tests.integration.cluster import restart
from tests.integration.failover_support import (
    ELECTION_BOUND_S,
    LEASE_TTL_S,
    Ack,
    Traffic,
    assert_single_writer,
    gaps,
    ha_group,
    prepare,
    readable_keys,
    send_raw,
    stats_of,
    wait_all_readable,
    wait_master,
)
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SWITCHOVER_GAP_MAX_S = 8.0
"""Longest pause between SEND_OK replies a switchover may cause (the SDK's send timeout is 3 s;
the new master is serving well before a lease would have expired)."""


async def switchover(
    addr: str, target: int, timeout_ms: int = 10000
) -> admin_pb2.SwitchoverResponse:
    async with RawClient(addr) as rc:
        resp: admin_pb2.SwitchoverResponse = await rc.admin.Switchover(
            admin_pb2.SwitchoverRequest(target_replica_id=target, timeout_ms=timeout_ms),
            timeout=timeout_ms / 1000 + 5,
        )
        return resp


async def test_switchover_to_chosen_replica_under_traffic(tmp_path: Path) -> None:
    with ha_group(tmp_path) as g:
        m1 = await prepare(g)
        target = max(set(g.live()) - {m1})
        other = min(set(g.live()) - {m1})
        old_addr = g.addr(m1)
        async with RawClient(old_addr) as rc:
            code, _, msg = await refused(
                rc.admin.Switchover(admin_pb2.SwitchoverRequest(target_replica_id=99), timeout=10)
            )
            assert code == grpc.StatusCode.FAILED_PRECONDITION, msg
        async with RawClient(g.addr(other)) as rc:
            code, _, msg = await refused(
                rc.admin.Switchover(
                    admin_pb2.SwitchoverRequest(target_replica_id=target), timeout=10
                )
            )
            assert code == grpc.StatusCode.UNAVAILABLE, msg
        before = await stats_of(old_addr)
        assert before is not None

        traffic = Traffic(g.namesrv_addrs, "s7")
        await traffic.start()
        try:
            await traffic.wait_ok_after(0, 40)
            t0 = time.monotonic()
            resp = await switchover(old_addr, target)
            took_s = time.monotonic() - t0
            assert resp.new_master_replica_id == target
            assert resp.new_master_addr == g.addr(target)
            assert resp.epoch > before.epoch
            assert await wait_master(g, 15) == target
            await traffic.wait_ok_after(t0, 30, g.addr(target))
            await traffic.wait_ok_after(time.monotonic(), 20)
        finally:
            await traffic.stop()
        gap_s = gaps(traffic.acks, since=t0 - 1)
        print(f"switchover answered in {took_s:.2f}s; longest SEND_OK gap {gap_s:.2f}s")
        assert gap_s < SWITCHOVER_GAP_MAX_S
        st = await stats_of(old_addr)
        assert st is not None and st.role == admin_pb2.SLAVE and st.epoch == resp.epoch
        assert_single_writer(traffic.acks, [old_addr, g.addr(target)])
        ok_keys = {a.key for a in traffic.ok()}
        await wait_all_readable(g.addr(target), ok_keys)
        await wait_all_readable(old_addr, ok_keys)


async def test_etcd_down_master_fences_reads_work_then_recovers(tmp_path: Path) -> None:
    with ha_group(tmp_path) as g:
        m1 = await prepare(g)
        traffic = Traffic(g.namesrv_addrs, "e8")
        await traffic.start()
        probes: list[Ack] = []
        try:
            await traffic.wait_ok_after(0, 40)
            t_down = time.monotonic()
            g.etcd.kill()
            async with RawClient(g.addr(m1)) as rc:

                async def fenced() -> bool:
                    await send_raw(rc.messaging, f"probe-{len(probes)}", probes, timeout_s=5)
                    return not probes[-1].ok

                left_s = max(0.0, t_down + LEASE_TTL_S + 3 - time.monotonic())
                try:
                    await until(fenced, "the master fencing itself", left_s)
                except AssertionError:
                    raise AssertionError(
                        f"the master still acknowledges writes {LEASE_TTL_S + 3}s after "
                        f"etcd died\n{g.logs()}"
                    ) from None
            fenced_s = probes[-1].t_end - t_down
            print(f"master fenced {fenced_s:.2f}s after etcd died: {probes[-1].outcome}")
            assert probes[-1].outcome == "UNAVAILABLE/NOT_MASTER"
            late = [a for a in traffic.ok() + probes if a.t_start > t_down + LEASE_TTL_S]
            assert not late, f"SEND_OK past the lease without etcd: {late[:3]}"
            acked = {a.key for a in traffic.ok() + probes if a.ok}
            for rid in g.live():  # reads keep working everywhere
                missing = acked - await readable_keys(g.addr(rid))
                assert not missing, f"replica {rid} cannot serve {len(missing)} acked messages"
            await asyncio.sleep(1)  # a real interval: etcd stays down a little longer
            g.etcd = restart(g.etcd)
            t_back = time.monotonic()
            m = await wait_master(g, 20)
            await traffic.wait_ok_after(t_back, 20, g.addr(m))
            print(f"master {m} serving {time.monotonic() - t_back:.2f}s after etcd came back")
            assert time.monotonic() - t_back < ELECTION_BOUND_S + 10
        finally:
            await traffic.stop()
        ok_keys = {a.key for a in traffic.ok() + probes if a.ok}
        await wait_all_readable(g.addr(m), ok_keys)
