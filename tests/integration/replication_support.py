"""Helpers of the replication system tests (issue 7): load, progress, reads and store checks.

Everything talks to real processes over gRPC (raw stubs, so a test sees statuses exactly as
the broker sends them) or reads store directories after the brokers have stopped:

* :func:`send_load` - batches and single sends over several topics and queues, concurrently,
  every result kept (status, offsets, msg id) so a test can check each acknowledged message;
* :func:`wait_replicated` - until the slave's commitlog ends where the master's does and every
  queue reads to the same end on both (the slave's readable end follows the confirm offset);
* :func:`read_queue` / :func:`read_all` - raw records of whole queues, as a consumer gets them;
* :func:`assert_same_commitlogs` - the two stores' commitlog files byte for byte, plus
  :func:`services.store.inspect.verify` on both (records whole, consume queues and index
  consistent with the commitlog), and :func:`stored_uniq_keys` to read what a store holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from services.store.inspect import detect_layout, iter_commitlog, verify
from tests.integration.cluster import ServiceProcess, start_broker, start_slave
from tests.support import until as support_until
from tests.support.raw_client import RawClient, refused

# Re-exported (the replication tests import it from here); __all__ only declares that export.
__all__ = ["refused"]

COMMITLOG_FILE_BYTES = 256 * 1024
"""Small commitlog files, so a few thousand messages roll several of them."""

HA_KEYS: dict[str, object] = {
    "mappedFileSizeCommitLog": COMMITLOG_FILE_BYTES,
    "slaveSyncConfigInterval": 1000,
    "haSendHeartbeatInterval": 1000,
}
"""Broker keys every replication test uses, masters and slaves alike (same file size)."""

PULL_BATCH_MAX = 256


def start_master(
    tmp_path: Path, namesrv_addrs: list[str], name: str = "broker-a", **keys: object
) -> ServiceProcess:
    """A master with :data:`HA_KEYS` (``keys`` win), e.g. ``brokerRole="SYNC_MASTER"``."""
    merged: dict[str, Any] = {**HA_KEYS, **keys}
    return start_broker(tmp_path, namesrv_addrs, name, None, **merged)


def start_ha_slave(
    tmp_path: Path, namesrv_addrs: list[str], broker_name: str = "broker-a", **keys: object
) -> ServiceProcess:
    """Slave 1 of ``broker_name`` with :data:`HA_KEYS` (``keys`` win)."""
    merged: dict[str, Any] = {**HA_KEYS, **keys}
    return start_slave(tmp_path, namesrv_addrs, broker_name, 1, None, **merged)


@dataclass(frozen=True)
class Sent:
    """One acknowledged message of a load."""

    topic: str
    queue_id: int
    body: bytes
    status: int
    queue_offset: int
    msg_id: str


def status_name(status: int) -> str:
    return str(messaging_pb2.SendStatus.Name(status))  # type: ignore[arg-type]


# ---- setup -----------------------------------------------------------------------------------


async def create_topics(addr: str, broker_name: str, topics: Iterable[str], queues: int) -> None:
    """Create each topic on the broker at ``addr`` (broker mode)."""
    async with RawClient(addr) as c:
        for topic in topics:
            await c.admin.CreateTopic(
                admin_pb2.CreateTopicRequest(
                    target=admin_pb2.ApplyTarget(broker_name=broker_name),
                    config=common_pb2.TopicConfig(
                        topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
                    ),
                ),
                timeout=10,
            )


async def create_group(addr: str, broker_name: str, group: str) -> None:
    async with RawClient(addr) as c:
        await c.admin.CreateSubscriptionGroup(
            admin_pb2.CreateSubscriptionGroupRequest(
                target=admin_pb2.ApplyTarget(broker_name=broker_name),
                config=common_pb2.SubscriptionGroupConfig(group_name=group),
            ),
            timeout=10,
        )


async def wait_route(namesrv: str, topic: str, brokers: set[str], timeout_s: float = 15) -> None:
    """Until the nameserver routes ``topic`` to every broker group in ``brokers``."""
    async with RawClient(namesrv) as c:

        async def routed() -> bool:
            try:
                resp = await c.route(topic)
            except grpc.aio.AioRpcError:
                return False
            return brokers <= {q.broker_name for q in resp.route.queues}

        await support_until.until(routed, f"route of {topic} to {sorted(brokers)}", timeout_s, 0.1)


async def until(
    pred: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.1
) -> None:
    """Thin alias of :func:`tests.support.until.until` in this module's old argument order,
    kept for the replication tests that still import it; new code uses the support one."""
    await support_until.until(pred, what, timeout_s, interval_s)


# ---- load ------------------------------------------------------------------------------------


def body_of(tag: str, topic: str, queue_id: int, n: int, size_bytes: int) -> bytes:
    head = f"{tag}:{topic}:{queue_id}:{n}:".encode()
    return head + b"x" * max(0, size_bytes - len(head))


async def send_batch(
    stub: messaging_pb2_grpc.MessagingStub, topic: str, queue_id: int, bodies: list[bytes]
) -> list[Sent]:
    resp = await stub.Send(
        messaging_pb2.SendRequest(
            producer_group="ha-load",
            queue_id=queue_id,
            messages=[common_pb2.Message(topic=topic, body=b) for b in bodies],
            born_timestamp_ms=int(time.time() * 1000),
        ),
        timeout=15,
    )
    assert len(resp.results) == len(bodies)
    return [
        Sent(topic, queue_id, b, r.status, r.queue_offset, r.msg_id)
        for b, r in zip(bodies, resp.results, strict=True)
    ]


async def send_load(
    addr: str,
    topics: list[str],
    queues: int,
    *,
    batches_per_queue: int,
    batch_size: int = 32,
    singles_per_queue: int = 0,
    body_bytes: int = 200,
    tag: str = "load",
    on_progress: Callable[[int], Awaitable[None]] | None = None,
) -> list[Sent]:
    """Send ``batches_per_queue`` batches and ``singles_per_queue`` single messages to every
    queue of every topic, one sender per (topic, queue) running concurrently. Returns every
    result; raises on the first failed call. ``on_progress(sent_so_far)`` runs after every
    call (a hook for killing something mid-load; it holds up only the sender that called)."""
    sent: list[Sent] = []
    async with RawClient(addr) as c:
        stub = c.messaging

        async def one_queue(topic: str, qid: int) -> None:
            n = 0
            for b in range(batches_per_queue + singles_per_queue):
                size = batch_size if b < batches_per_queue else 1
                bodies = [body_of(tag, topic, qid, n + i, body_bytes) for i in range(size)]
                n += size
                sent.extend(await send_batch(stub, topic, qid, bodies))
                if on_progress is not None:
                    await on_progress(len(sent))

        await asyncio.gather(*(one_queue(t, q) for t in topics for q in range(queues)))
    return sent


# ---- progress --------------------------------------------------------------------------------


async def runtime_stats(addr: str) -> admin_pb2.GetRuntimeStatsResponse:
    async with RawClient(addr) as c:
        return await c.runtime_stats()


async def wait_in_sync(master_addr: str, slaves: int = 1, timeout_s: float = 20) -> None:
    """Until the master reports ``slaves`` slaves, all in its in-sync set."""

    async def ok() -> bool:
        stats = await runtime_stats(master_addr)
        return len(stats.slaves) >= slaves and all(s.in_sync for s in stats.slaves)

    await support_until.until(ok, f"{slaves} in-sync slave(s) on {master_addr}", timeout_s, 0.1)


async def queue_ends(addr: str, topics: list[str], queues: int) -> dict[tuple[str, int], int]:
    """GetMaxOffset of every queue: where a consumer of this broker can read up to."""
    out: dict[tuple[str, int], int] = {}
    async with RawClient(addr) as c:
        stub = c.messaging
        for t in topics:
            for q in range(queues):
                try:
                    resp = await stub.GetMaxOffset(
                        messaging_pb2.GetMaxOffsetRequest(topic=t, queue_id=q), timeout=5
                    )
                    out[(t, q)] = resp.offset
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.NOT_FOUND:  # topic not synced yet
                        raise
                    out[(t, q)] = -1
    return out


async def wait_replicated(
    master_addr: str,
    slave_addr: str,
    topics: list[str],
    queues: int,
    timeout_s: float = 30,
) -> int:
    """Until the slave's commitlog ends at the master's max offset and every queue's readable
    end on the slave equals the master's. Returns that commitlog offset."""
    master_end = 0

    async def caught_up() -> bool:
        nonlocal master_end
        m, s = await asyncio.gather(runtime_stats(master_addr), runtime_stats(slave_addr))
        master_end = m.commitlog_max_offset
        if s.commitlog_max_offset != master_end:
            return False
        me, se = await asyncio.gather(
            queue_ends(master_addr, topics, queues), queue_ends(slave_addr, topics, queues)
        )
        return me == se

    await support_until.until(
        caught_up, f"slave {slave_addr} caught up with {master_addr}", timeout_s, 0.2
    )
    return master_end


# ---- reads -----------------------------------------------------------------------------------


async def read_queue(
    stub: messaging_pb2_grpc.MessagingStub, group: str, topic: str, qid: int, start: int = 0
) -> bytes:
    """Raw records of one queue from ``start`` to its readable end (no long polling)."""
    out = bytearray()
    offset = start
    while True:
        resp = await stub.Pull(
            messaging_pb2.PullRequest(
                consumer_group=group,
                topic=topic,
                queue_id=qid,
                queue_offset=offset,
                max_msg_nums=PULL_BATCH_MAX,
                sys_flag=0x4,
                subscription="*",
            ),
            timeout=10,
        )
        if resp.status != messaging_pb2.FOUND:
            return bytes(out)
        out += resp.records
        assert resp.next_begin_offset > offset
        offset = resp.next_begin_offset


async def read_all(
    addr: str, group: str, topics: list[str], queues: int
) -> dict[tuple[str, int], bytes]:
    async with RawClient(addr) as c:
        stub = c.messaging
        return {(t, q): await read_queue(stub, group, t, q) for t in topics for q in range(queues)}


async def wait_readable(
    master_addr: str,
    slave_addr: str,
    group: str,
    topics: list[str],
    queues: int,
    timeout_s: float = 15,
) -> dict[tuple[str, int], bytes]:
    """Until every queue reads the same raw records from the slave as from the master (the
    slave serves only up to the confirm offset, which follows its acks by a round trip).
    Returns the reads."""
    reads: dict[tuple[str, int], bytes] = {}

    async def same() -> bool:
        nonlocal reads
        on_master, on_slave = await asyncio.gather(
            read_all(master_addr, group, topics, queues),
            read_all(slave_addr, group, topics, queues),
        )
        reads = on_master
        return on_master == on_slave

    await support_until.until(same, f"the slave {slave_addr} reading as its master", timeout_s, 0.3)
    return reads


async def wait_master_view(master_addr: str, end: int, timeout_s: float = 10) -> None:
    """Until the master's stats show its one slave acknowledged ``end`` with no lag, in sync,
    and the confirm offset at ``end``."""
    last: list[admin_pb2.GetRuntimeStatsResponse] = []

    async def ok() -> bool:
        stats = await runtime_stats(master_addr)
        last[:] = [stats]
        return (
            [s.acked_offset for s in stats.slaves] == [end]
            and stats.slaves[0].lag_bytes == 0
            and stats.slaves[0].lag_seconds == 0
            and stats.slaves[0].in_sync
            and stats.confirm_offset == end
        )

    try:
        await support_until.until(
            ok, f"the master's stats showing its slave at {end}", timeout_s, 0.1
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last stats: {last[0] if last else None}") from None


def bodies_of(records: bytes) -> list[bytes]:
    return [r.body for r in codec.iter_records(records)]


# ---- stores ----------------------------------------------------------------------------------


def _digests(store_dir: Path) -> dict[str, tuple[int, str, bool]]:
    out: dict[str, tuple[int, str, bool]] = {}
    for path in sorted((store_dir / "commitlog").glob("[0-9]" * 20)):
        data = path.read_bytes()
        out[path.name] = (len(data), hashlib.sha256(data).hexdigest(), not data.strip(b"\0"))
    return out


def assert_same_commitlogs(master_store: Path, slave_store: Path, end_offset: int) -> None:
    """Every commitlog file present on both stores is byte-identical; a file only one side has
    must be empty (all zeros: the next file a store creates ahead of need); the files cover
    ``end_offset``. Both stores pass :func:`services.store.inspect.verify`."""
    m, s = _digests(master_store), _digests(slave_store)
    assert m, f"no commitlog files in {master_store}"
    for name in sorted(set(m) | set(s)):
        if name in m and name in s:
            assert m[name][:2] == s[name][:2], f"commitlog file {name} differs"
        else:
            only = m.get(name) or s[name]
            side = "master" if name in m else "slave"
            assert only[2], f"commitlog file {name} with data only on the {side}"
    covered = max(int(n) + m[n][0] for n in m if n in s)
    assert covered >= end_offset, f"common files end at {covered} < {end_offset}"
    for store in (master_store, slave_store):
        report = verify(detect_layout(store))
        assert report.ok, f"{store}: {report.problems[:10]}"
        assert report.commitlog_end == end_offset, (store, report.commitlog_end, end_offset)


def stored_uniq_keys(store_dir: Path) -> set[str]:
    """The unique message ids of every record in a (stopped) store's commitlog."""
    problems: list[str] = []
    keys = {
        str(item["uniq_key"])
        for item in iter_commitlog(detect_layout(store_dir), problems)
        if not item.get("blank")
    }
    return keys
