"""The robustness writer: appends deterministic messages until killed, printing every ACK.

    python -m tests.robustness.writer DIR --seed S [--count N] [--writers 8] [--batch-max 16]

Run from the repository root. It opens a :class:`MessageStore` on ``DIR`` with SYNC_FLUSH and
tiny files (64 KiB commitlog files, 16-unit consume-queue files, 1 024-entry index files) so
every roll-over path runs within a second, then ``--writers`` asyncio tasks put batches of
1..``--batch-max`` messages each. Sequence numbers are taken and the batch appended in one
event-loop step (``put`` appends before its first ``await``), so sequence order *is* commitlog
order — the checker relies on that.

Every message is a pure function of ``(seed, seq)`` (:func:`plan`): topic, queue, tags, keys,
unique key and a 1..3000-byte body. The checker recomputes the body from the unique key alone,
so the ACK line only needs to say where the message landed.

stdout, one line each, flushed after every put:

| line                                                   | meaning                          |
|--------------------------------------------------------|----------------------------------|
| ``READY <commitlog end> <truncated bytes>``            | the store is open and recovered  |
| ``ACK <topic> <qid> <qoff> <phys> <uniq> <crc>``       | PUT_OK: this message is on disk  |
| ``TIMEOUT <uniq>``                                     | FLUSH_DISK_TIMEOUT: no promise   |
| ``DONE <messages>``                                    | ``--count`` reached, clean stop  |

A line is written only after the store returned, so an ACK line on disk means the writer was
told "durable"; a cut-off last line (the kill landed mid-write) is no ACK.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rocketq import codec
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.flush import FlushDiskType
from services.store.message_store import MessageStore, PutStatus

TOPICS = ("RobustOrders", "RobustPay", "RobustAudit", "RobustLog")
QUEUES_PER_TOPIC = 4
TAGS = ("created", "paid", "", "shipped", "refunded")
BODY_BYTES_MAX = 3000
WRITERS_DEFAULT = 8
BATCH_MAX_DEFAULT = 16
SHARED_KEYS = 7
"""Messages also carry ``cust-{seq % 7}``: long shared chains in every index file."""

COMMITLOG_FILE_BYTES = 64 * 1024
CQ_UNITS_PER_FILE = 16
INDEX_SLOT_NUM = 256
INDEX_NUM = 4 * INDEX_SLOT_NUM  # RocketMQ's 1 : 4, so `store verify` infers the geometry
LOGICS_FLUSH_INTERVAL_MS = 50
"""Consume queues, index and checkpoint are flushed this often (1 000 ms in production) so a
run of a second or two crosses many checkpoint writes."""
_STORE_HOST = codec.HostAddress.parse("127.0.0.1:10911")
_BORN_HOST = codec.HostAddress.parse("127.0.0.2:40000")


def store_config(store_dir: Path) -> StoreConfig:
    """The one configuration the writer and the checker both use."""
    return StoreConfig(
        store_dir=store_dir,
        commitlog_file_bytes=COMMITLOG_FILE_BYTES,
        consume_queue_units_per_file=CQ_UNITS_PER_FILE,
        index_slot_num=INDEX_SLOT_NUM,
        index_num=INDEX_NUM,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        flush_interval_consume_queue_ms=LOGICS_FLUSH_INTERVAL_MS,
        # Retention is not under test and must not delete acknowledged messages: the writer
        # also reports 0 % disk use, so a nearly full CI disk cannot trigger forced deletion.
        clean_resource_interval_ms=3_600_000,
        store_host=_STORE_HOST,
    )


# -- deterministic content -----------------------------------------------------------------------
def uniq_key(seed: int, seq: int) -> str:
    """The UNIQ_KEY of message ``seq`` of run ``seed``; :func:`parse_uniq_key` inverts it."""
    return f"RQ{seed:08X}{seq:012X}"


def parse_uniq_key(key: str) -> tuple[int, int] | None:
    """``(seed, seq)`` of a key made by :func:`uniq_key`, or None for anything else."""
    if len(key) != 22 or not key.startswith("RQ"):
        return None
    try:
        return int(key[2:10], 16), int(key[10:], 16)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Planned:
    """Everything about one message that follows from ``(seed, seq)``."""

    seed: int
    seq: int
    topic: str
    queue_id: int
    tags: str
    keys: str
    uniq_key: str
    body: bytes


def plan(seed: int, seq: int) -> Planned:
    digest = hashlib.blake2b(f"{seed}/{seq}".encode(), digest_size=16).digest()
    h = int.from_bytes(digest[:8], "big")
    body_len = 1 + int.from_bytes(digest[8:12], "big") % BODY_BYTES_MAX
    # Random bytes, not text: a body byte flipped by a torn write must change the CRC.
    body = random.Random(digest).randbytes(body_len)
    return Planned(
        seed=seed,
        seq=seq,
        topic=TOPICS[h % len(TOPICS)],
        queue_id=(h >> 8) % QUEUES_PER_TOPIC,
        tags=TAGS[(h >> 16) % len(TAGS)],
        keys=f"order-{seed}-{seq} cust-{seq % SHARED_KEYS}",
        uniq_key=uniq_key(seed, seq),
        body=body,
    )


def to_store(p: Planned, born_ms: int) -> MessageToStore:
    props = {codec.Prop.UNIQ_KEY: p.uniq_key, codec.Prop.KEYS: p.keys}
    if p.tags:
        props[codec.Prop.TAGS] = p.tags
    return MessageToStore(
        topic=p.topic,
        queue_id=p.queue_id,
        body=p.body,
        properties=codec.encode_properties(props),
        tags_code=codec.tags_hash(p.tags),
        keys=p.keys,
        uniq_key=p.uniq_key,
        born_timestamp_ms=born_ms,
        born_host=_BORN_HOST,
    )


# -- the ACK line ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledged message, as the writer saw it."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    uniq_key: str
    body_crc: int

    def line(self) -> str:
        return (
            f"ACK {self.topic} {self.queue_id} {self.queue_offset} {self.physical_offset} "
            f"{self.uniq_key} {self.body_crc}\n"
        )

    @classmethod
    def parse(cls, line: str) -> Ack | None:
        parts = line.split()
        if len(parts) != 7 or parts[0] != "ACK":
            return None
        return cls(parts[1], int(parts[2]), int(parts[3]), int(parts[4]), parts[5], int(parts[6]))


def read_acks(path: Path) -> list[Ack]:
    """Every complete ACK line of a writer's stdout file (a cut-off last line is not one)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.split("\n")[:-1]  # the piece after the last newline is unfinished
    return [a for a in map(Ack.parse, lines) if a is not None]


# -- the writer --------------------------------------------------------------------------------
class Writer:
    def __init__(self, store: MessageStore, seed: int, start_seq: int, count: int | None) -> None:
        self.store = store
        self.seed = seed
        self.next_seq = start_seq
        self.end_seq = None if count is None else start_seq + count
        self.out = sys.stdout

    def _take(self, n: int) -> range:
        first = self.next_seq
        last = first + n if self.end_seq is None else min(first + n, self.end_seq)
        self.next_seq = last
        return range(first, last)

    async def run_one(self, writer_id: int, batch_max: int) -> None:
        rng = random.Random(self.seed * 1000 + writer_id)
        while True:
            seqs = self._take(rng.randint(1, batch_max))
            if not seqs:
                return
            planned = [plan(self.seed, s) for s in seqs]
            born = time.time_ns() // 1_000_000
            # No await between taking the numbers and put()'s synchronous append.
            result = await self.store.put([to_store(p, born) for p in planned])
            if result.status is PutStatus.PUT_OK:
                lines = [
                    Ack(
                        p.topic,
                        p.queue_id,
                        r.queue_offset,
                        r.physical_offset,
                        p.uniq_key,
                        codec.body_crc(p.body),
                    ).line()
                    for p, r in zip(planned, result.results, strict=True)
                ]
            else:
                lines = [f"{result.status.value} {p.uniq_key}\n" for p in planned]
            self.out.write("".join(lines))
            self.out.flush()


async def main_async(args: argparse.Namespace) -> int:
    store = MessageStore(store_config(Path(args.directory)), disk_usage=lambda _path: 0.0)
    report = store.open()
    await store.start()
    print(f"READY {report.commitlog_end} {report.truncated_bytes}", flush=True)
    writer = Writer(store, args.seed, args.start_seq, args.count)
    await asyncio.gather(*(writer.run_one(i, args.batch_max) for i in range(args.writers)))
    await store.shutdown()
    print(f"DONE {writer.next_seq - args.start_seq}", flush=True)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.robustness.writer")
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--start-seq", type=int, default=0)
    parser.add_argument("--count", type=int, default=None, help="stop cleanly after N messages")
    parser.add_argument("--writers", type=int, default=WRITERS_DEFAULT)
    parser.add_argument("--batch-max", type=int, default=BATCH_MAX_DEFAULT)
    args = parser.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        parser.error("--seed must fit in 32 bits (it is part of the unique key)")
    return args


if __name__ == "__main__":
    # The writer is its own process (harness.WriterProcess starts and SIGKILLs it), so it owns
    # its event loop; it is not a test body.
    sys.exit(asyncio.run(main_async(parse_args())))
