"""Automatic failover through etcd (issue 8): masters SIGKILLed under SYNC_MASTER traffic.

Real processes: a nameserver, an etcd and three replicas of ``broker-a`` in controller mode
(brokerId 1..3, SYNC_MASTER, lease TTL 2 s). SDK producers send all along and every send is
recorded (key, times, outcome, the replica that stored it).

* One kill: another replica is master within :data:`ELECTION_BOUND_S`, the producer's sends
  succeed on it (the first one measured from the kill), every SEND_OK message is readable from
  the new master and consumed by an SDK consumer, and no two replicas acked at once.
* Two kills in a row: the third replica is elected after the second kill too; the first one
  returns as its slave (truncating whatever it had beyond the agreed log), sends succeed again,
  and still no SEND_OK message is missing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rocketq.client.consumer import (
    ConsumeFromWhere,
    LitePullConsumer,
    LitePullConsumerConfig,
)
from tests.integration.failover_support import (
    ELECTION_BOUND_S,
    TOPIC,
    Traffic,
    assert_single_writer,
    ha_group,
    prepare,
    stats_of,
    wait_all_readable,
    wait_master,
)
from tests.integration.replication_support import wait_in_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def consume_all(namesrv_addrs: list[str], keys: set[str], timeout_s: float = 30) -> None:
    """An SDK consumer group reading the topic from its start sees every key of ``keys``."""
    lite = LitePullConsumer(
        LitePullConsumerConfig(
            "failover-lite",
            tuple(namesrv_addrs),
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
    )
    lite.subscribe(TOPIC, "*")
    await lite.start()
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while not keys <= seen:
            assert time.monotonic() < deadline, (
                f"the consumer missed {len(keys - seen)} SEND_OK messages: "
                f"{sorted(keys - seen)[:10]}"
            )
            seen |= {m.body.decode() for m in await lite.poll(500)}
    finally:
        await lite.close()


async def test_master_killed_new_master_within_bound_no_loss(tmp_path: Path) -> None:
    with ha_group(tmp_path) as g:
        m1 = await prepare(g)
        traffic = Traffic(g.namesrv_addrs, "k1")
        await traffic.start()
        try:
            await traffic.wait_ok_after(0, 40)
            t_kill = time.monotonic()
            g.replicas[m1].kill()
            m2 = await wait_master(g, ELECTION_BOUND_S, not_rid=m1, converged=False)
            elected_s = time.monotonic() - t_kill
            await traffic.wait_ok_after(t_kill, 30, g.addr(m2), timeout_s=20)
            first_ok = min(a.t_end for a in traffic.ok_after(t_kill, g.addr(m2)))
            print(f"elected after {elected_s:.2f}s, first send OK after {first_ok - t_kill:.2f}s")
            assert first_ok - t_kill < ELECTION_BOUND_S, (
                f"first SEND_OK on the new master {first_ok - t_kill:.1f}s after the kill"
            )
        finally:
            await traffic.stop()
        stats = await stats_of(g.addr(m2))
        assert stats is not None and stats.epoch > 0 and stats.replica_id == m2
        ok_keys = {a.key for a in traffic.ok()}
        await wait_all_readable(g.addr(m2), ok_keys)
        await consume_all(g.namesrv_addrs, ok_keys)
        assert_single_writer(traffic.acks, [g.addr(m1), g.addr(m2)])


async def test_two_failovers_in_a_row_no_loss(tmp_path: Path) -> None:
    with ha_group(tmp_path) as g:
        m1 = await prepare(g)
        first_addrs = {rid: sp.addr for rid, sp in g.replicas.items()}
        traffic = Traffic(g.namesrv_addrs, "k2")
        await traffic.start()
        try:
            await traffic.wait_ok_after(0, 30)
            t1 = time.monotonic()
            g.replicas[m1].kill()
            m2 = await wait_master(g, ELECTION_BOUND_S, not_rid=m1)
            await traffic.wait_ok_after(t1, 30, g.addr(m2))
            # the third replica must be in sync with m2 (it is the only one electable next)
            await wait_in_sync(g.addr(m2), slaves=1)
            (m3,) = set(g.live()) - {m2}
            stats = await stats_of(g.addr(m2))
            assert stats is not None and m3 in stats.in_sync_replica_ids, stats

            t2 = time.monotonic()
            g.replicas[m2].kill()
            assert await wait_master(g, ELECTION_BOUND_S, not_rid=m2) == m3
            print(f"second election after {time.monotonic() - t2:.2f}s")
            # the first master comes back as the slave of the third
            g.restart(m1)
            assert await wait_master(g, 20) == m3
            await wait_in_sync(g.addr(m3), slaves=1)
            await traffic.wait_ok_after(time.monotonic(), 20, g.addr(m3))
        finally:
            await traffic.stop()
        ok_keys = {a.key for a in traffic.ok()}
        await wait_all_readable(g.addr(m3), ok_keys)
        # m1 now serves the same messages as a slave
        await wait_all_readable(g.addr(m1), ok_keys)
        assert_single_writer(traffic.acks, [first_addrs[m] for m in (m1, m2, m3)])
