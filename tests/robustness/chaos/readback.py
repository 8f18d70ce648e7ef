"""After the run: what the final masters store, and whether each slave's log is a prefix of its
master's.

* :func:`read_queues` pulls every queue of the given topics from a master, from its min offset
  to its readable end (raw gRPC Pull, records decoded with :mod:`rocketq.codec`), and journals
  one ``stored`` event per message (topic, broker, queue, queue offset, chaos id).
* :func:`replica_prefix_failures` compares the commitlog bytes of stopped stores: every byte a
  slave holds (from the larger of the two min offsets to the slave's end) must equal the
  master's at the same physical offset. Commitlog files are named by their 20-digit start
  offset and are all ``file_bytes`` long, so a physical offset maps to (file, position).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc
from tests.robustness.chaos.recorder import Recorder, event_line
from tests.robustness.chaos.traffic import ID_PROPERTY

PULL_BATCH_MAX = 256
PULL_TIMEOUT_S = 10.0
COMPARE_CHUNK_BYTES = 1 << 20
SUBSCRIPTION_FLAG = 0x4
"""PullSysFlag FLAG_SUBSCRIPTION: the request carries its own subscription ("*")."""


def read_queue(stub: messaging_pb2_grpc.MessagingStub, topic: str, qid: int) -> list[codec.Record]:
    """Every readable record of one queue, oldest first."""
    out: list[codec.Record] = []
    offset = 0
    while True:
        resp = stub.Pull(
            messaging_pb2.PullRequest(
                consumer_group="chaos-readback",
                topic=topic,
                queue_id=qid,
                queue_offset=offset,
                max_msg_nums=PULL_BATCH_MAX,
                sys_flag=SUBSCRIPTION_FLAG,
                subscription="*",
            ),
            timeout=PULL_TIMEOUT_S,
        )
        if resp.status == messaging_pb2.FOUND:
            out += codec.iter_records(resp.records)
        elif not offset < resp.next_begin_offset < resp.max_offset:
            return out  # nothing more (a moved start offset is followed once)
        if resp.next_begin_offset <= offset:
            return out
        offset = resp.next_begin_offset


def read_queues(
    addr: str, broker: str, topics: dict[str, int], rec: Recorder
) -> tuple[int, list[str]]:
    """Journal every stored message of ``topics`` (name -> queue count) on the master at
    ``addr``; returns (messages, problems)."""
    n = 0
    problems: list[str] = []
    with grpc.insecure_channel(addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        for topic, queues in topics.items():
            for qid in range(queues):
                try:
                    records = read_queue(stub, topic, qid)
                except grpc.RpcError as exc:
                    problems.append(f"read-back of {topic}@{broker}#{qid} failed: {exc}")
                    continue
                rec.write_raw(
                    event_line(
                        "stored",
                        rec.proc,
                        topic=topic,
                        broker=broker,
                        queue=qid,
                        offset=r.queue_offset,
                        id=r.properties.get(ID_PROPERTY, "?"),
                    )
                    for r in records
                )
                n += len(records)
    return n, problems


def read_commitlog(store: Path, start: int, end: int, file_bytes: int) -> bytes:
    """Bytes ``[start, end)`` of a stopped store's commitlog (zeros where a file is missing)."""
    out = bytearray()
    pos = start
    while pos < end:
        base = pos - pos % file_bytes
        take = min(end, base + file_bytes) - pos
        path = store / "commitlog" / f"{base:020d}"
        try:
            with open(path, "rb") as f:
                f.seek(pos - base)
                chunk = f.read(take)
        except FileNotFoundError:
            chunk = b""
        out += chunk + b"\0" * (take - len(chunk))
        pos += take
    return bytes(out)


def replica_prefix_failures(
    master: tuple[str, Path, int, int],
    slaves: list[tuple[str, Path, int, int]],
    file_bytes: int,
) -> list[str]:
    """Each entry is (name, store dir, min offset, max offset) of a stopped replica."""
    m_name, m_store, m_min, m_max = master
    failures = []
    for s_name, s_store, s_min, s_max in slaves:
        if s_max > m_max:
            failures.append(
                f"{s_name} ends at {s_max}, past its master {m_name}'s end {m_max}: "
                "a divergent tail was not truncated"
            )
        lo, hi = max(m_min, s_min), min(s_max, m_max)
        pos = lo
        while pos < hi:
            end = min(hi, pos + COMPARE_CHUNK_BYTES)
            a = read_commitlog(m_store, pos, end, file_bytes)
            b = read_commitlog(s_store, pos, end, file_bytes)
            if a != b:
                first = pos + next(i for i in range(len(a)) if a[i] != b[i])
                failures.append(
                    f"{s_name}'s commitlog differs from its master {m_name}'s at physical "
                    f"offset {first} (compared {lo}..{hi})"
                )
                break
            pos = end
    return failures
