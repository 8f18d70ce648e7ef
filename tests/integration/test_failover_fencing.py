"""Failover (issue 8): a returning old master and a paused one, with real processes.

Three replicas of ``broker-a`` in controller mode (SYNC_MASTER, lease TTL 2 s), SDK traffic
recorded all along.

* The old master returns: its slaves are SIGSTOPped while it writes ~2 MB no slave can ack
  (replication in flight capped at 128 KiB), so it holds a divergent, unacknowledged tail when
  it is SIGKILLed; the slaves resume and elect one of themselves, which writes its own epoch
  over those offsets. Restarted, the old master becomes a slave, truncates to the point the
  epoch histories agree on, copies the new master's log, and ends up byte-identical to it; no
  SEND_OK message is lost and none of its unacknowledged tail survives anywhere.
* The master SIGSTOPped longer than its lease: another replica is elected; requests sent to the
  sleeping master while it slept are answered, once it wakes, with NOT_MASTER - never SEND_OK
  (the lease fence acts before any timer runs); it rejoins as a slave in the new epoch; no
  replica acknowledged a write requested after another leader's ack had come back; no SEND_OK
  message is lost.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.store.epoch_file import EpochHistory
from services.store.inspect import detect_layout, verify
from tests.integration.failover_support import (
    ELECTION_BOUND_S,
    QUEUES,
    TOPIC,
    Ack,
    Traffic,
    assert_single_writer,
    ha_group,
    prepare,
    raw_sender,
    send_raw,
    stats_of,
    wait_all_readable,
    wait_master,
)
from tests.integration.replication_support import assert_same_commitlogs, wait_replicated
from tests.support.cluster import is_stopped
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TAIL_BYTES_MIN = 1_500_000
"""At least this much of the old master's log must be beyond what its slaves got."""


async def test_old_master_returns_truncates_divergent_tail(tmp_path: Path) -> None:
    keys: dict[str, object] = {
        "haTransferBatchSize": 65536,
        "haMaxInFlightBytes": 131072,
        "syncFlushTimeout": 8000,
    }
    with ha_group(tmp_path, keys=keys) as g:
        m1 = await prepare(g)
        slaves = sorted(set(g.live()) - {m1})
        old_addr = g.addr(m1)
        traffic = Traffic(g.namesrv_addrs, "r3")
        await traffic.start()
        tail: list[Ack] = []
        try:
            await traffic.wait_ok_after(0, 30)
            before = await stats_of(old_addr)
            assert before is not None
            for rid in slaves:
                g.replicas[rid].pause()
            t_pause = time.monotonic()
            stop_tail = asyncio.Event()
            burst = asyncio.create_task(
                raw_sender(old_addr, "tail", stop_tail, tail, 16, 30, 4096, batch=32)
            )

            async def wrote_tail() -> bool:
                st = await stats_of(old_addr)
                grown = st.commitlog_max_offset - before.commitlog_max_offset if st else 0
                return grown > TAIL_BYTES_MIN + 131072

            try:
                await until(wrote_tail, "the old master writing its unacked tail", 15)
            finally:
                stop_tail.set()
                g.replicas[m1].kill()
                for rid in slaves:
                    g.replicas[rid].resume()
                await burst
            m2 = await wait_master(g, ELECTION_BOUND_S + 5, not_rid=m1)
            await traffic.wait_ok_after(time.monotonic(), 30, g.addr(m2))
            old_end = verify(detect_layout(g.store(m1))).commitlog_end
            g.restart(m1)
            assert await wait_master(g, 20) == m2
            await traffic.wait_ok_after(time.monotonic(), 20, g.addr(m2))
        finally:
            await traffic.stop()
        assert not [
            a for a in traffic.ok() + tail if a.store_addr == old_addr and a.t_start > t_pause
        ], "the old master acknowledged a write its paused slaves could not have"
        ok_keys = {a.key for a in traffic.ok()}
        final = await wait_all_readable(g.addr(m2), ok_keys)
        end = await wait_replicated(g.addr(m2), g.addr(m1), [TOPIC], QUEUES)
        for rid in slaves:
            if rid != m2:
                await wait_replicated(g.addr(m2), g.addr(rid), [TOPIC], QUEUES)
        new_master_store = g.store(m2)
        for rid in [r for r in g.live() if r != m2] + [m2]:
            g.replicas[rid].stop()
        starts = {e.epoch: e.start_offset for e in EpochHistory(new_master_store / "epoch").load()}
        new_epoch_start = starts[max(starts)]
        assert old_end - new_epoch_start >= TAIL_BYTES_MIN, (
            f"the old master's log ended at {old_end}, the new epoch starts at "
            f"{new_epoch_start}: no divergent tail to truncate"
        )
        for rid in g.replicas:
            if rid != m2:
                assert_same_commitlogs(new_master_store, g.store(rid), end)
        survivors = {a.key for a in tail} & final
        print(
            f"divergent tail {old_end - new_epoch_start} B truncated; "
            f"{len(survivors)} tail messages had reached a slave before the pause"
        )


async def test_paused_master_fenced_on_waking_rejoins_as_slave(tmp_path: Path) -> None:
    with ha_group(tmp_path) as g:
        m1 = await prepare(g)
        old_addr = g.addr(m1)
        traffic = Traffic(g.namesrv_addrs, "p4")
        raw: list[Ack] = []
        asleep: list[Ack] = []
        stop_raw = asyncio.Event()
        await traffic.start()
        raw_task = asyncio.create_task(raw_sender(old_addr, "raw", stop_raw, raw, 4))
        try:
            await traffic.wait_ok_after(0, 30)
            async with RawClient(old_addr) as rc:
                stub = rc.messaging
                await send_raw(stub, "warm", [])  # the connection exists before the pause
                t_pause = time.monotonic()
                g.replicas[m1].pause()
                await until(lambda: is_stopped(g.replicas[m1]), "the old master stopped")
                # requests the sleeping master can only read once it wakes
                t_asleep = time.monotonic()
                during = [
                    asyncio.create_task(send_raw(stub, f"asleep-{i}", asleep)) for i in range(8)
                ]
                m2 = await wait_master(g, ELECTION_BOUND_S, exclude=frozenset({m1}))
                elected_s = time.monotonic() - t_pause
                await traffic.wait_ok_after(t_pause, 20, g.addr(m2))
                t_resume = time.monotonic()
                g.replicas[m1].resume()
                await asyncio.gather(*during)
            print(
                f"elected {elected_s:.2f}s after the pause; asleep requests: "
                f"{sorted({a.outcome for a in asleep})}"
            )
            assert elected_s < ELECTION_BOUND_S
            assert len(asleep) == 8 and all(a.t_start >= t_asleep for a in asleep)
            woke_ok = [a for a in asleep if a.ok]
            assert not woke_ok, (
                f"the old master acknowledged {len(woke_ok)} write(s) after waking from a "
                f"pause longer than its lease: {woke_ok[:3]}\n{g.logs()}"
            )
            assert {a.outcome for a in asleep} <= {"UNAVAILABLE/NOT_MASTER"}, asleep
            assert await wait_master(g, 20) == m2  # m1 rejoined as m2's slave
            seen: list[object] = []

            async def same_epoch() -> bool:
                st1, st2 = await stats_of(old_addr), await stats_of(g.addr(m2))
                assert st1 is not None and st2 is not None
                seen[:] = [(st1.epoch, st1.leader_addr), (st2.epoch, st2.replica_id)]
                return st1.epoch == st2.epoch > 0 and st1.leader_addr == g.addr(m2)

            try:
                await until(same_epoch, "the old master following the new epoch", 10)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; old, new master: {seen}") from None
            await traffic.wait_ok_after(time.monotonic(), 20, g.addr(m2))
        finally:
            stop_raw.set()
            await raw_task
            await traffic.stop()
        late = [
            a
            for a in raw + traffic.acks
            if a.ok and a.store_addr == old_addr and a.t_end > t_resume
        ]
        print(
            f"{len(late)} SEND_OK from the old master arrived after it woke "
            "(requested before the pause)"
        )
        acks = traffic.acks + raw + asleep
        assert_single_writer(acks, [old_addr, g.addr(m2)])
        ok_keys = {a.key for a in acks if a.ok}
        await wait_all_readable(g.addr(m2), ok_keys)
        await wait_all_readable(old_addr, ok_keys)
