"""Storage-engine benchmark: prints figures, asserts nothing (``make bench``).

    python -m tools.bench.store_bench [--dir DIR] [--messages N] [--quick]

Measures, in-process on this machine, with RocketMQ's default file sizes:

* raw disk rate of the volume (``dd … conv=fdatasync``), so store MB/s reads as a ratio of it;
* the cost of one fdatasync after a 128 KiB write into a fallocated file and into a file whose
  blocks were written before (why SYNC_FLUSH writes zeros ahead: services/store/mapped_file.py);
* append + dispatch of 1 KiB messages (each with a unique key that is indexed) in batches of
  1, 32 and 256 under ASYNC_FLUSH;
* SYNC_FLUSH group commit with 1 and 64 concurrent writers (single-message and 32-message puts);
* consume-queue read rate (get_messages, 32 per call);
* a broker pull's read: CPU µs per message of get_messages with the broker's pull limits
  (256 messages / 256 KiB per call) over batches of 128 per queue and over single sends, with
  and without a tags filter (``--only-reads`` runs just these);
* index query latency (query_by_key for random unique keys);
* a slave's apply of replicated chunks, CPU µs per record (``--only-replica`` runs just these):
  chunks of one send of 1 and of 32 records, and 512 KiB chunks of sends of 128 with 1 KiB
  bodies and with mixed ones (512-1536 B).

Where the time goes: ``--profile`` runs the batch-256 case under cProfile and prints the top.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocketq import codec
from services.broker.config import BrokerConfig
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.flush import FlushDiskType
from services.store.message_store import MessageStore
from services.store.types import PhysicalOffset

BODY = os.urandom(1024)
MIXED_BODY_BYTES = (512, 1536)
"""Body sizes of the replica case with mixed bodies (1 KiB on average): records of a batch
that differ in size take the decode's gathers instead of its strided views."""
REPLICA_CHUNK_BYTES = BrokerConfig.ha_transfer_batch_size
"""What a busy master ships: haTransferBatchSize's default."""
TOPIC = "BenchTopic"
QUEUES = 8


def make_messages(
    n: int, queue_id: int = 0, tag: str = "TagA", rng: random.Random | None = None
) -> list[MessageToStore]:
    """``n`` messages of 1 KiB bodies, or (with ``rng``) of MIXED_BODY_BYTES bodies."""
    out = []
    now = int(time.time() * 1000)
    props_base = {codec.Prop.TAGS: tag, codec.Prop.WAIT_STORE_MSG_OK: "true"}
    tags_code = codec.tags_hash(tag)
    for _ in range(n):
        uniq = uuid.uuid4().hex.upper()
        props = {**props_base, codec.Prop.UNIQ_KEY: uniq}
        out.append(
            MessageToStore(
                topic=TOPIC,
                queue_id=queue_id,
                body=BODY if rng is None else (BODY * 2)[: rng.randint(*MIXED_BODY_BYTES)],
                properties=codec.encode_properties(props),
                tags_code=tags_code,
                uniq_key=uniq,
                born_timestamp_ms=now,
            )
        )
    return out


def disk_rate(directory: Path) -> str:
    target = directory / "dd.bin"
    try:
        proc = subprocess.run(
            ["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=512", "conv=fdatasync"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"dd failed: {exc}"
    finally:
        target.unlink(missing_ok=True)
    m = re.search(r"copied, ([\d.]+) s, ([\d.]+ [GMk]B/s)", proc.stderr)
    return m.group(2) if m else proc.stderr.strip().splitlines()[-1]


FSYNC_PROBE_BYTES = 128 * 1024
FSYNC_PROBE_WRITES = 200


def fdatasync_cost(directory: Path, reserve: str) -> str:
    """p50 wall time and mean CPU of one fdatasync after a 128 KiB write, in a file reserved
    by ``fallocate`` (unwritten extents) or by writing ``zeros`` first (and syncing them)."""
    size = FSYNC_PROBE_BYTES * FSYNC_PROBE_WRITES
    path = directory / f"fsync-{reserve}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if reserve == "fallocate":
            os.posix_fallocate(fd, 0, size)
        else:
            os.pwrite(fd, bytes(size), 0)
        os.fsync(fd)
        data = os.urandom(FSYNC_PROBE_BYTES)
        walls: list[float] = []
        cpu0 = time.process_time()
        for i in range(FSYNC_PROBE_WRITES):
            os.pwrite(fd, data, i * FSYNC_PROBE_BYTES)
            t = time.perf_counter()
            os.fdatasync(fd)
            walls.append(time.perf_counter() - t)
        cpu_us = (time.process_time() - cpu0) * 1e6 / FSYNC_PROBE_WRITES
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return f"p50 {statistics.median(walls) * 1e6:.0f} us, {cpu_us:.0f} us CPU (write + sync)"


def fresh_store(
    root: Path, name: str, flush: FlushDiskType, warm: bool | None = None
) -> MessageStore:
    d = root / name
    shutil.rmtree(d, ignore_errors=True)
    return MessageStore(StoreConfig(store_dir=d, flush_disk_type=flush, warm_mapped_files=warm))


def report(label: str, n: int, seconds: float, nbytes: int) -> None:
    print(
        f"  {label:<46} {n / seconds:>11,.0f} msgs/s  {nbytes / seconds / 1e6:>8.1f} MB/s"
        f"  ({n:,} msgs in {seconds:.2f} s)"
    )


async def bench_async_append(root: Path, total: int, batch: int, profile: bool = False) -> None:
    store = fresh_store(root, f"async-{batch}", FlushDiskType.ASYNC_FLUSH)
    await store.start()
    n = (total // batch) * batch
    batches = [make_messages(batch, q % QUEUES) for q in range(n // batch)]
    size = sum(len(m.body) for b in batches for m in b)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    for b in batches:
        await store.put(b)
    if prof:
        prof.disable()
    dt = time.perf_counter() - t0
    report(f"ASYNC_FLUSH append+dispatch, batch {batch}", n, dt, size)
    await store.shutdown()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


async def bench_sync_writers(
    root: Path, total: int, writers: int, batch: int, warm: bool | None = None
) -> None:
    store = fresh_store(root, f"sync-{writers}-{batch}", FlushDiskType.SYNC_FLUSH, warm)
    await store.start()
    per_writer = max(1, total // writers // batch)
    work = [[make_messages(batch, w % QUEUES) for _ in range(per_writer)] for w in range(writers)]
    latencies: list[float] = []

    async def writer(batches: list[list[MessageToStore]]) -> None:
        for b in batches:
            t = time.perf_counter()
            result = await store.put(b)
            latencies.append(time.perf_counter() - t)
            assert result.status.value == "PUT_OK", result.status

    fsyncs0 = store.flusher.fsync_count
    t0 = time.perf_counter()
    cpu0 = time.process_time()  # this process: the writers' loop and the flush threads
    await asyncio.gather(*(writer(w) for w in work))
    dt = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    n = writers * per_writer * batch
    fsyncs = store.flusher.fsync_count - fsyncs0
    report(f"SYNC_FLUSH {writers} writers x batch {batch}", n, dt, n * len(BODY))
    lat = sorted(latencies)
    print(
        f"  {'':<46} put p50 {lat[len(lat) // 2] * 1e3:.2f} ms, p99 "
        f"{lat[int(len(lat) * 0.99)] * 1e3:.2f} ms, {fsyncs} fsyncs "
        f"({n / max(fsyncs, 1):.1f} msgs per fsync), {cpu_s * 1e6 / n:.1f} us CPU per msg"
    )
    await store.shutdown()


async def bench_reads(root: Path, total: int) -> None:
    store = fresh_store(root, "reads", FlushDiskType.ASYNC_FLUSH)
    await store.start()
    msgs = make_messages(total)
    keys = [m.uniq_key for m in msgs]
    for i in range(0, total, 256):
        store.append(msgs[i : i + 256])
    t0 = time.perf_counter()
    offset, read = 0, 0
    while True:
        r = store.get_messages(TOPIC, 0, offset, 32)
        if not r.records:
            break
        read += len(r.records)
        offset = r.next_begin_offset
    dt = time.perf_counter() - t0
    report("consume-queue read (get_messages, 32/call)", read, dt, read * len(BODY))
    now = int(time.time() * 1000)
    samples = random.sample(keys, min(2000, len(keys)))
    lat = []
    for k in samples:
        t = time.perf_counter()
        found = store.query_by_key(TOPIC, k, 32, 0, now + 60_000)
        lat.append(time.perf_counter() - t)
        assert len(found) == 1
    lat.sort()
    print(
        f"  {'index query_by_key (unique key)':<46} p50 {statistics.median(lat) * 1e6:.0f} us, "
        f"p99 {lat[int(len(lat) * 0.99)] * 1e6:.0f} us over {len(lat)} queries"
    )
    await store.shutdown()


async def bench_replica_apply(
    root: Path,
    total: int,
    batch: int,
    profile: bool = False,
    chunk_bytes: int = 0,
    mixed: bool = False,
) -> None:
    """A slave's write path: a master's commitlog of sends of ``batch`` messages read back in
    chunks of one send each (what a replication stream carries when every send is shipped at
    once), or of ``chunk_bytes`` (what a busy master ships: chunks end inside records), and
    appended to a second store, which checks and dispatches (consume queues, index) every
    record. ``mixed``: bodies of MIXED_BODY_BYTES, not all 1 KiB."""
    label = f"{chunk_bytes // 1024} KiB chunks of sends of {batch}" if chunk_bytes else ""
    if mixed:
        label += ", mixed bodies"
    name = f"{batch}-{chunk_bytes}{'-mixed' if mixed else ''}"
    master = fresh_store(root, f"master-{name}", FlushDiskType.ASYNC_FLUSH)
    await master.start()
    n = (total // batch) * batch
    rng = random.Random(n) if mixed else None
    for q in range(n // batch):
        await master.put(make_messages(batch, q % QUEUES, rng=rng))
    if not chunk_bytes:
        chunk_bytes = (master.commitlog.max_offset - master.commitlog.min_offset) * batch // n
        label = f"chunks of {batch} records"
    chunks: list[bytes] = []
    offset = master.commitlog.min_offset
    while data := master.read_replica(offset, chunk_bytes):
        chunks.append(data)
        offset = PhysicalOffset(offset + len(data))
    await master.shutdown()
    slave = fresh_store(root, f"slave-{name}", FlushDiskType.ASYNC_FLUSH)
    await slave.start()
    prof = cProfile.Profile() if profile else None
    at = slave.commitlog.max_offset
    t0, cpu0 = time.perf_counter(), time.thread_time()
    if prof:
        prof.enable()
    for data in chunks:
        at = slave.append_replica(at, data)
    if prof:
        prof.disable()
    dt, cpu_s = time.perf_counter() - t0, time.thread_time() - cpu0
    report(f"slave apply, {label}", n, dt, sum(map(len, chunks)))
    print(f"    {cpu_s * 1e6 / n:.1f} us CPU per record (this thread; wall {dt * 1e6 / n:.1f} us)")
    await slave.shutdown()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


PULL_MAX_MSGS = 256
"""The broker's maxTransferCountOnMessageInMemory (services/broker/config.py)."""
PULL_SEND_BATCH = 128
"""Messages per stored batch, one queue each (tools/bench/drain_bench.py's producer)."""


def _pull_store(root: Path, name: str) -> MessageStore:
    d = root / name
    shutil.rmtree(d, ignore_errors=True)
    return MessageStore(
        StoreConfig(
            store_dir=d,
            flush_disk_type=FlushDiskType.ASYNC_FLUSH,
            max_transfer_count_in_memory=PULL_MAX_MSGS,
        )
    )


def _pull_all(store: MessageStore, filters: dict[str, Any]) -> tuple[int, int, int]:
    """Read every queue from 0 as pulls do; (messages, units scanned, calls)."""
    taken = scanned = calls = 0
    for qid in range(QUEUES):
        offset, end = 0, int(store.max_offset(TOPIC, qid))
        while offset < end:
            r = store.get_messages(TOPIC, qid, offset, PULL_MAX_MSGS, **filters)
            taken += len(r.queue_offsets)
            scanned += r.next_begin_offset - offset
            calls += 1
            offset = r.next_begin_offset
    return taken, scanned, calls


async def bench_pull_reads(root: Path, total: int, reps: int = 5) -> None:
    """CPU per message of the store's side of a pull: get_messages as the broker calls it,
    over batches of 128 per queue (runs of contiguous records) and over single sends spread
    over the queues (every record alone), with and without a tags filter."""
    batched = _pull_store(root, "pull-batched")
    await batched.start()
    for i in range(total // PULL_SEND_BATCH):
        batched.append(make_messages(PULL_SEND_BATCH, i % QUEUES))
    single = _pull_store(root, "pull-single")
    await single.start()
    for i in range(total // 4):
        single.append(make_messages(1, i % QUEUES, tag="TagA" if i % 16 < 8 else "TagB"))
    tag_a, tag_b = codec.tags_hash("TagA"), codec.tags_hash("TagB")
    cases: list[tuple[str, MessageStore, dict[str, Any]]] = [
        ("batches, no filter", batched, {}),
        ("batches, tags filter, all match", batched, {"tags_filter": tag_a.__eq__}),
        ("batches, tags filter, none match", batched, {"tags_filter": tag_b.__eq__}),
        ("single sends, no filter", single, {}),
        ("single sends, tags filter, half match", single, {"tags_filter": tag_a.__eq__}),
    ]
    for label, store, filters in cases:
        best = float("inf")
        for _ in range(reps):
            cpu0 = time.thread_time()
            taken, scanned, calls = _pull_all(store, filters)
            best = min(best, time.thread_time() - cpu0)
        per = f"{best * 1e6 / taken:6.2f} us CPU per msg" if taken else " " * 22
        print(
            f"  {'pull read: ' + label:<44} {per}, {best * 1e6 / scanned:5.2f} per unit"
            f"  (best of {reps}; {taken:,} msgs, {scanned:,} units, {calls:,} calls)"
        )
    await batched.shutdown()
    await single.shutdown()


def run(label: str, fn: Callable[[], object]) -> None:
    print(label)
    fn()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="where to put bench stores")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true", help="a tenth of the messages")
    ap.add_argument("--profile", action="store_true", help="cProfile the batch-256 append")
    ap.add_argument(
        "--only-replica", action="store_true", help="only the slave apply cases (1, 32, 256 KiB)"
    )
    ap.add_argument(
        "--only-reads", action="store_true", help="only the pull read case (µs per message)"
    )
    ap.add_argument(
        "--only-sync", action="store_true", help="only the fdatasync probe and SYNC_FLUSH cases"
    )
    ap.add_argument(
        "--warm",
        choices=("auto", "on", "off"),
        default="auto",
        help="SYNC_FLUSH cases: commitlog space reserved by zeros (on), fallocate (off), "
        "or the store's default (auto: zeros under SYNC_FLUSH)",
    )
    args = ap.parse_args()
    total = args.messages // 10 if args.quick else args.messages
    root = Path(tempfile.mkdtemp(prefix="rocketq-bench-", dir=args.dir))
    try:
        print(f"store benchmark in {root}: {os.cpu_count()} cpus, 1 KiB bodies, default file sizes")
        if args.only_replica:
            for batch in (1, 32):
                asyncio.run(bench_replica_apply(root, total // 4, batch, args.profile))
            for mixed in (False, True):
                asyncio.run(
                    bench_replica_apply(
                        root, total // 2, 128, args.profile, REPLICA_CHUNK_BYTES, mixed
                    )
                )
            return
        if args.only_reads:
            asyncio.run(bench_pull_reads(root, total))
            return
        warm = {"auto": None, "on": True, "off": False}[args.warm]
        for reserve in ("fallocate", "zeros"):
            print(f"  fdatasync of 128 KiB, {reserve:<9} file: {fdatasync_cost(root, reserve)}")
        if not args.only_sync:
            print(f"  raw disk (dd 512 MiB, fdatasync): {disk_rate(root)}")
            for batch in (1, 32, 256):
                n = total if batch > 1 else total // 4
                profile = args.profile and batch == 256
                asyncio.run(bench_async_append(root, n, batch, profile=profile))
        for writers, batch in ((1, 1), (64, 1), (64, 32)):
            n = total // 10 if (writers, batch) == (1, 1) else total // 2
            asyncio.run(bench_sync_writers(root, n, writers, batch, warm))
        if args.only_sync:
            return
        asyncio.run(bench_reads(root, total // 2))
        asyncio.run(bench_pull_reads(root, total // 2))
        for batch in (1, 32):
            asyncio.run(bench_replica_apply(root, total // 4, batch))
        for mixed in (False, True):
            asyncio.run(
                bench_replica_apply(
                    root, total // 2, 128, chunk_bytes=REPLICA_CHUNK_BYTES, mixed=mixed
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
