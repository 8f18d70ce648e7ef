"""A slave whose disk fills up (issue 8's "a slave's disk filling up"; chaos/disk.py).

The slave's store directory is a small volume (:class:`DiskFiller`, a loop-mounted ext4
image); it is filled with a ballast file while the master takes writes. What must happen:

* the slave does not crash (a store through a mapped page the full volume has no block for is a
  SIGBUS: the store reserves space with fallocate first, and undoes a write that finds no room;
  recovery no longer writes zeros over the sparse tail of the last file), logs the
  problem clearly (one ERROR from the store, one WARNING from replication, no flood), and keeps
  serving what it has;
* ASYNC_MASTER: the master keeps answering SEND_OK; SYNC_MASTER: sends are answered
  FLUSH_SLAVE_TIMEOUT (the slave cannot ack) and never SEND_OK while the slave is stuck - the
  message is stored on the master but not replicated, which is exactly what the status says;
* once the ballast is deleted the slave catches up by itself: its commitlog is byte-identical
  to the master's and both stores pass the store verifier (no corruption);
* the store alone (the master's path): an append that finds no room is refused with
  StoreFullError and leaves the store as it was; after space is freed appends continue with
  dense queue offsets, and a reopened store holds exactly the acknowledged messages.

Needs root (mount); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import messaging_pb2_grpc
from services.store.commitlog import RESERVE_AHEAD_BYTES as COMMITLOG_RESERVE_AHEAD_BYTES
from tests.integration.cluster import ServiceProcess, start_nameserver
from tests.integration.replication_support import (
    Sent,
    assert_same_commitlogs,
    create_group,
    create_topics,
    runtime_stats,
    send_batch,
    send_load,
    start_ha_slave,
    start_master,
    status_name,
    wait_in_sync,
    wait_readable,
    wait_replicated,
)
from tests.robustness.chaos.disk import DiskFiller
from tests.support.until import until

pytestmark = [
    pytest.mark.robustness,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]

TOPICS = ["DiskFullA", "DiskFullB"]
QUEUES = 2
GROUP = "disk-reader"
DISK_BYTES = 16 * 1024 * 1024
KEYS: dict[str, object] = {
    # One commitlog file holds the whole test: retention never deletes the newest file, so
    # the slave's forced cleanup at 85 % disk use cannot remove data the test compares.
    "mappedFileSizeCommitLog": 4 * 1024 * 1024,
    "haHousekeepingInterval": 3000,
}
CATCH_UP_S = 40.0
"""The slave retries with its 100 ms..5 s backoff, and retention re-checks disk use every
10 s (at >= 90 % it refuses writes until then)."""


def _log(sp: ServiceProcess) -> str:
    return sp.log_path.read_text(errors="replace")


def _stop(procs: list[ServiceProcess]) -> None:
    for sp in reversed(procs):
        if sp.alive():
            sp.stop(timeout_s=15)


async def _prepare(master: ServiceProcess, slave: ServiceProcess) -> list[Sent]:
    await create_topics(master.addr, "broker-a", TOPICS, QUEUES)
    await create_group(master.addr, "broker-a", GROUP)
    await wait_in_sync(master.addr)
    sent = await send_load(master.addr, TOPICS, QUEUES, batches_per_queue=3, body_bytes=1000)
    await wait_replicated(master.addr, slave.addr, TOPICS, QUEUES)
    return sent


async def _after_free(
    master: ServiceProcess, slave: ServiceProcess, disk: DiskFiller, sent: list[Sent]
) -> int:
    """Free the disk; the slave catches up and reads as its master; more sends replicate."""
    disk.free()
    await wait_replicated(master.addr, slave.addr, TOPICS, QUEUES, timeout_s=CATCH_UP_S)
    sent += await send_load(master.addr, TOPICS, QUEUES, batches_per_queue=2, tag="after")
    end = await wait_replicated(master.addr, slave.addr, TOPICS, QUEUES)
    await wait_readable(master.addr, slave.addr, GROUP, TOPICS, QUEUES)
    return end


def _assert_logged_clearly(slave: ServiceProcess) -> None:
    text = _log(slave)
    store_errors = [
        line
        for line in text.splitlines()
        if '"level": "ERROR"' in line and '"logger": "services.store.message_store"' in line
    ]
    assert any("the store's volume is full" in line for line in store_errors), text[-3000:]
    assert "this slave's store is full, replication paused" in text
    assert "replication resumed: the store has room again" in text
    # Retries back off and stay quiet: a handful of lines, not one per 100 ms.
    assert text.count("replication paused") <= 5, text.count("replication paused")


async def test_async_master_keeps_serving_and_the_slave_recovers(tmp_path: Path) -> None:
    procs: list[ServiceProcess] = []
    with DiskFiller(tmp_path / "slave-store", DISK_BYTES) as disk:
        try:
            procs.append(ns := start_nameserver(tmp_path))
            procs.append(master := start_master(tmp_path, [ns.addr], "broker-a", **KEYS))
            procs.append(
                slave := start_ha_slave(
                    tmp_path, [ns.addr], "broker-a", storePathRootDir=disk.path, **KEYS
                )
            )

            sent = await _prepare(master, slave)
            assert disk.fill() == 0
            before = (await runtime_stats(slave.addr)).commitlog_max_offset
            full = await send_load(
                master.addr, TOPICS, QUEUES, batches_per_queue=20, body_bytes=1000, tag="full"
            )
            assert {status_name(s.status) for s in full} == {"SEND_OK"}
            sent += full
            # the slave meets the full volume and keeps retrying; it must stay up
            paused = "this slave's store is full, replication paused"
            await until(lambda: paused in _log(slave), "the slave to pause replication", 30)
            assert slave.alive(), slave.log_tail()
            m, s = await asyncio.gather(runtime_stats(master.addr), runtime_stats(slave.addr))
            assert before <= s.commitlog_max_offset < m.commitlog_max_offset
            end = await _after_free(master, slave, disk, sent)
            _stop(procs)
            _assert_logged_clearly(slave)
            assert_same_commitlogs(master.workdir / "store", disk.path, end)
        finally:
            _stop(procs)


async def _single_sends(addr: str, count: int, tag: str) -> list[Sent]:
    out: list[Sent] = []
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        for i in range(count):
            out += await send_batch(stub, TOPICS[0], i % QUEUES, [f"{tag}-{i}".encode()])
    return out


async def test_sync_master_answers_slave_timeout_while_the_slave_disk_is_full(
    tmp_path: Path,
) -> None:
    procs: list[ServiceProcess] = []
    keys = {**KEYS, "brokerRole": "SYNC_MASTER", "syncFlushTimeout": 1000}
    with DiskFiller(tmp_path / "slave-store", DISK_BYTES) as disk:
        try:
            procs.append(ns := start_nameserver(tmp_path))
            procs.append(master := start_master(tmp_path, [ns.addr], "broker-a", **keys))
            procs.append(
                slave := start_ha_slave(
                    tmp_path, [ns.addr], "broker-a", storePathRootDir=disk.path, **KEYS
                )
            )

            sent = await _prepare(master, slave)
            assert {status_name(s.status) for s in sent} == {"SEND_OK"}
            # Fill, then one large batch the slave cannot store (more than the room its
            # commitlog had reserved ahead before the fill), then single sends.
            assert disk.fill() == 0
            stuck = await send_load(
                master.addr, TOPICS[:1], 1, batches_per_queue=1, batch_size=64,
                body_bytes=COMMITLOG_RESERVE_AHEAD_BYTES // 64 + 4000, tag="big",
            )  # fmt: skip
            stuck += await _single_sends(master.addr, 3, "while-full")
            statuses = [status_name(s.status) for s in stuck]
            # Stored on the master, never confirmed by the slave: never SEND_OK.
            assert set(statuses) <= {"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}, statuses
            assert all(s.queue_offset >= 0 and s.msg_id for s in stuck)
            assert slave.alive(), slave.log_tail()
            sent += stuck
            await _after_free(master, slave, disk, sent)
            again = await _single_sends(master.addr, 3, "after-free")
            assert {status_name(s.status) for s in again} == {"SEND_OK"}
            end = await wait_replicated(master.addr, slave.addr, TOPICS, QUEUES)
            _stop(procs)
            _assert_logged_clearly(slave)
            assert_same_commitlogs(master.workdir / "store", disk.path, end)
        finally:
            _stop(procs)


@pytest.mark.parametrize("reserve", ["fallocate", "zeros"])
async def test_store_refuses_a_write_without_room_and_stays_consistent(
    tmp_path: Path, reserve: str
) -> None:
    """The master's path, in-process: appends until the volume is full, each refused one
    undone (queue offsets too); after freeing, appends continue densely; reopened, the store
    holds exactly the acknowledged messages and passes the verifier. Commitlog space reserved
    either way: fallocate (ASYNC_FLUSH's default) or zeros written ahead (SYNC_FLUSH's)."""
    from rocketq import codec
    from services.common.clock import ManualClock
    from services.store.commitlog import MessageToStore
    from services.store.config import StoreConfig
    from services.store.inspect import detect_layout, verify
    from services.store.message_store import MessageStore, StoreFullError
    from tests.integration.replication_support import stored_uniq_keys

    def msg(n: int) -> MessageToStore:
        uniq = f"m{n:06d}"
        props = codec.encode_properties({codec.Prop.UNIQ_KEY: uniq, codec.Prop.KEYS: f"k{n}"})
        return MessageToStore(
            topic="Full", queue_id=n % 2, body=b"x" * 3000, properties=props,
            tags_code=0, keys=f"k{n}", uniq_key=uniq,
        )  # fmt: skip

    with DiskFiller(tmp_path / "store", 4 * 1024 * 1024) as disk:  # zeros: 1 MiB ahead
        config = StoreConfig(
            store_dir=disk.path, commitlog_file_bytes=4 * 1024 * 1024,
            consume_queue_units_per_file=1000, index_slot_num=2048, index_num=8192,
            warm_mapped_files=reserve == "zeros",
        )  # fmt: skip
        clock = ManualClock(1_700_000_000_000)
        store = MessageStore(config, clock=clock, disk_usage=lambda _p: 0.1)
        store.open()
        acked: list[str] = []

        def append(first: int) -> bool:
            batch = [msg(first + i) for i in range(3)]
            try:
                store.append(batch)
            except StoreFullError:
                queued = store.max_offset("Full", 0) + store.max_offset("Full", 1)
                assert queued == len(acked), "a refused append left queue offsets behind"
                return False
            acked.extend(m.uniq_key for m in batch)
            return True

        n = 0
        for _ in range(10):
            assert append(n)
            n += 3
        disk.fill(leave_bytes=256 * 1024)
        while n < 3000 and append(n):  # 256 KiB left: full after ~80 messages
            n += 3
        assert 30 < len(acked) < 3000, "the volume never filled up"
        assert not append(n)  # still full: refused again, still undone
        disk.free()
        for _ in range(20):
            assert append(n)
            n += 3
        await store.shutdown()
        reopened = MessageStore(config, clock=clock, disk_usage=lambda _p: 0.1)
        reopened.open()
        assert reopened.max_offset("Full", 0) + reopened.max_offset("Full", 1) == len(acked)
        await reopened.shutdown()
        report = verify(detect_layout(disk.path))
        assert report.ok, report.problems[:10]
        assert stored_uniq_keys(disk.path) == set(acked)


async def test_a_new_queue_on_a_full_volume_is_refused_and_undone(tmp_path: Path) -> None:
    """The first message of a queue creates its consume-queue directory and file; on a full
    volume that creation fails. The append is refused like any other without room (the
    commitlog bytes and the queue offset given back), and succeeds once there is room."""
    from rocketq import codec
    from services.common.clock import ManualClock
    from services.store.commitlog import MessageToStore
    from services.store.config import StoreConfig
    from services.store.inspect import detect_layout, verify
    from services.store.message_store import MessageStore, StoreFullError

    def msg(topic: str) -> MessageToStore:
        props = codec.encode_properties({codec.Prop.UNIQ_KEY: f"u-{topic}"})
        return MessageToStore(topic=topic, queue_id=0, body=b"x" * 100, properties=props)

    with DiskFiller(tmp_path / "store", 4 * 1024 * 1024) as disk:  # ext4: a directory needs a block
        config = StoreConfig(
            store_dir=disk.path, commitlog_file_bytes=1024 * 1024,
            consume_queue_units_per_file=1000, index_slot_num=2048, index_num=8192,
        )  # fmt: skip
        clock = ManualClock(1_700_000_000_000)
        store = MessageStore(config, clock=clock, disk_usage=lambda _p: 0.1)
        store.open()
        store.append([msg("Old")])  # reserves commitlog room ahead: the next append fits
        end = store.commitlog.max_offset
        disk.fill()
        with pytest.raises(StoreFullError, match="no space left"):
            store.append([msg("New")])
        assert store.commitlog.max_offset == end
        assert store.max_offset("New", 0) == 0
        disk.free()
        (result,) = store.append([msg("New")])
        assert result.queue_offset == 0
        await store.shutdown()
        report = verify(detect_layout(disk.path))
        assert report.ok, report.problems[:10]
