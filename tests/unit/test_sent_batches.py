"""Producer-encoded batches (DESIGN.md §12): the broker's checks and the store's in-place stamp.

The broker reads a sent batch with :func:`services.broker.send_records.parse` and the store
appends it with ``CommitLog.append_sent``: the records written must be exactly what
``append_batch`` writes for the same messages (offsets dense, fields stamped), across file
boundaries too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketq import codec
from rocketq.codec import HostAddress
from services.broker.send_records import BadBatch, as_messages, needs_slow_path, parse
from services.common.clock import ManualClock
from services.store.commitlog import CommitLog, MessageToStore, SentBatch, SentRecord

pytestmark = pytest.mark.unit

STORE_HOST = HostAddress(bytes([10, 0, 0, 9]), 10911)
BORN = HostAddress(bytes([10, 0, 0, 7]), 5555)
FILE_BYTES = 4096


def _props(i: int) -> dict[str, str]:
    return {"UNIQ_KEY": f"{i:032X}", "TAGS": "tagA", "KEYS": f"k{i}"}


def _sent(n: int, topic: str = "T") -> bytes:
    return b"".join(
        codec.encode_sent_record(
            topic.encode(), bytes([65 + i]) * (150 + i), codec.encode_properties(_props(i)),
            i, 0, 1000 + i,
        )
        for i in range(n)
    )  # fmt: skip


def _open(path: Path) -> CommitLog:
    cl = CommitLog(path, file_size_bytes=FILE_BYTES, store_host=STORE_HOST, clock=ManualClock())
    cl.files.load()
    return cl


def test_parse_reads_every_record_and_refuses_what_does_not_add_up() -> None:
    raw = _sent(3)
    batch = parse(raw)
    assert batch.topic == "T" and [r.flag for r in batch.records] == [0, 1, 2]
    assert [r.props["KEYS"] for r in batch.records] == ["k0", "k1", "k2"]
    assert not needs_slow_path(batch, frozenset({"DELAY"}))
    last = len(raw) - batch.records[2].size
    with pytest.raises(BadBatch, match=rf"record 2 at byte {last} claims TOTALSIZE \d+, beyond"):
        parse(raw[:-100])
    with pytest.raises(BadBatch, match=rf"record 2 at byte {last} is truncated"):
        parse(raw[: last + 50])
    first = bytearray(raw)
    first[codec.FIXED_BYTES_V4 + 4] ^= 0xFF  # the first body byte
    with pytest.raises(BadBatch, match="record 0: BODYCRC"):
        parse(bytes(first))
    with pytest.raises(BadBatch, match="record 1 has topic 'U'"):
        parse(_sent(1) + _sent(1, "U"))
    messages, sys_flag = as_messages(batch, raw)
    assert sys_flag == 0 and [m.body[:1] for m in messages] == [b"A", b"B", b"C"]
    assert dict(messages[1].properties) == _props(1)


def test_append_sent_writes_what_append_batch_writes_across_files(tmp_path: Path) -> None:
    raw = _sent(40)  # ~12 KiB: several 4 KiB files
    batch = parse(raw)
    entries = [
        SentRecord(r.pos, r.size, r.flag, r.sys_flag, r.born_timestamp_ms, 7, r.props["KEYS"],
                   r.props["UNIQ_KEY"])
        for r in batch.records
    ]  # fmt: skip
    sent = _open(tmp_path / "sent")
    results, requests = sent.append_sent(SentBatch("T", 2, bytearray(raw), entries, BORN, 3))
    plain = _open(tmp_path / "plain")
    expected, _ = plain.append_batch(
        [
            MessageToStore("T", 2, raw[r.body_at : r.body_end], r.properties, 7, r.props["KEYS"],
                           r.props["UNIQ_KEY"], r.flag, 0, r.born_timestamp_ms, BORN, 3)
            for r in batch.records
        ]
    )  # fmt: skip
    assert results == expected
    assert [r.queue_offset for r in results] == list(range(40))
    assert len({r.physical_offset // FILE_BYTES for r in results}) > 2  # rolled files
    assert sent.max_offset == plain.max_offset
    for r in results:
        assert sent.read(r.physical_offset, r.size_bytes) == plain.read(
            r.physical_offset, r.size_bytes
        )
    assert [q.uniq_key for q in requests] == [f"{i:032X}" for i in range(40)]
    assert sent.queue_offsets[("T", 2)] == 40
