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
from services.broker.send_records import (
    BadBatch,
    as_messages,
    needs_slow_path,
    parse,
    parse_columns,
)
from services.common.clock import ManualClock
from services.store.commitlog import CommitLog, MessageToStore, SentBatch
from services.store.config import StoreConfig
from services.store.message_store import MessageStore

pytestmark = pytest.mark.unit

STORE_HOST = HostAddress(bytes([10, 0, 0, 9]), 10911)
BORN = HostAddress(bytes([10, 0, 0, 7]), 5555)
FILE_BYTES = 4096


def _props(i: int) -> dict[str, str]:
    return {"UNIQ_KEY": f"{i:032X}", "TAGS": "tagA", "KEYS": f"k{i}"}


def _sent(n: int, topic: str = "T", *, keys: bool = True) -> bytes:
    return b"".join(
        codec.encode_sent_record(
            topic.encode(), bytes([65 + i]) * (150 + i),
            codec.encode_properties(_props(i) if keys else {"UNIQ_KEY": f"{i:032X}"}),
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
    recs = batch.records
    sent_batch = SentBatch(
        "T", 2, bytearray(raw), [r.pos for r in recs], [r.size for r in recs],
        [r.flag for r in recs], [r.sys_flag for r in recs], [r.born_timestamp_ms for r in recs],
        [7] * len(recs), [r.props["KEYS"] for r in recs], [r.props["UNIQ_KEY"] for r in recs],
        BORN, 3,
    )  # fmt: skip
    sent = _open(tmp_path / "sent")
    appended = sent.append_sent(sent_batch)
    results = appended.results(sent_batch, STORE_HOST)
    requests = appended.run(sent_batch).requests()
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


def _sent_batch(raw: bytes, queue_id: int, born: HostAddress = BORN) -> SentBatch:
    cols = parse_columns(raw)
    props = cols.props
    return SentBatch(
        cols.topic, queue_id, bytearray(raw), cols.pos, cols.size, cols.flag, cols.sys_flag,
        cols.born_timestamp_ms, [codec.tags_hash(p.get("TAGS", "")) for p in props],
        [p.get("KEYS", "") for p in props], [p["UNIQ_KEY"] for p in props], born, 0,
    )  # fmt: skip


def _plain_messages(raw: bytes, queue_id: int) -> list[MessageToStore]:
    return [
        MessageToStore("T", queue_id, raw[r.body_at : r.body_end], r.properties,
                       codec.tags_hash(r.props.get("TAGS", "")), r.props.get("KEYS", ""),
                       r.props["UNIQ_KEY"], r.flag, 0, r.born_timestamp_ms, BORN, 0)
        for r in parse(raw).records
    ]  # fmt: skip


def _store(root: Path) -> MessageStore:
    config = StoreConfig(
        store_dir=root, commitlog_file_bytes=16384, consume_queue_units_per_file=32,
        index_slot_num=64, index_num=512, store_host=STORE_HOST,
    )  # fmt: skip
    store = MessageStore(config, clock=ManualClock(), disk_usage=lambda _p: 0.1)
    store.open()
    return store


@pytest.mark.parametrize(
    ("count", "keys"), [(3, True), (40, True), (40, False)]
)  # the per-record and the batch (numpy) paths; with KEYS and with unique ids alone
def test_append_sent_dispatches_what_append_dispatches(
    tmp_path: Path, count: int, keys: bool
) -> None:
    """Consume-queue units, index entries and what arrival listeners see are those of the
    same records appended one object each, across commitlog files and a second batch."""
    raw = _sent(count, keys=keys)
    sent, plain = _store(tmp_path / "sent"), _store(tmp_path / "plain")
    seen: dict[str, list[object]] = {"sent": [], "plain": []}
    sent.dispatcher.listeners.append(seen["sent"].extend)
    plain.dispatcher.listeners.append(seen["plain"].extend)
    try:
        for _ in range(2):
            appended = sent.append_sent(_sent_batch(raw, 1))
            results = plain.append(_plain_messages(raw, 1))
            assert appended.physical_offsets == [r.physical_offset for r in results]
            assert appended.first_queue_offset == results[0].queue_offset
            assert appended.end_offset == results[-1].physical_offset + results[-1].size_bytes
        assert seen["sent"] == seen["plain"] and len(seen["sent"]) == 2 * count
        assert sent.max_offset("T", 1) == plain.max_offset("T", 1) == 2 * count
        cq_sent, cq_plain = sent.queues.find_or_create("T", 1), plain.queues.find_or_create("T", 1)
        assert [cq_sent.unit(q) for q in range(2 * count)] == [
            cq_plain.unit(q) for q in range(2 * count)
        ]
        assert sent.dispatcher.dispatched_offset == plain.dispatcher.dispatched_offset
        for key in (f"{count - 1:032X}", "00000000000000000000000000000000") + (
            (f"k{count - 1}", "k0") if keys else ()
        ):
            found = [r.physical_offset for r in sent.query_by_key("T", key, 10, 0, 1 << 62)]
            expected = [r.physical_offset for r in plain.query_by_key("T", key, 10, 0, 1 << 62)]
            assert found == expected and len(found) == 2
    finally:
        sent.close_files()
        plain.close_files()


def test_parse_columns_holds_what_parse_holds() -> None:
    raw = _sent(5)
    cols, batch = parse_columns(raw), parse(raw)
    assert (cols.topic, cols.topic_bytes) == (batch.topic, batch.topic_bytes)
    for i, r in enumerate(batch.records):
        assert (r.pos, r.size, r.flag, r.sys_flag, r.born_timestamp_ms, r.body_at, r.body_end) == (
            cols.pos[i], cols.size[i], cols.flag[i], cols.sys_flag[i], cols.born_timestamp_ms[i],
            cols.body_at[i], cols.body_end[i],
        )  # fmt: skip
        assert r.properties == raw[cols.props_at[i] : r.pos + r.size] and r.props == cols.props[i]


def _with_properties(raw_properties: bytes) -> bytes:
    """A good record 0, then record 1 with ``raw_properties`` as its PROPERTIES bytes."""
    good = codec.encode_properties(_props(0))
    return b"".join(
        codec.encode_sent_record(b"T", b"body", props, 0, 0, 1) for props in (good, raw_properties)
    )


@pytest.mark.parametrize(
    ("raw", "refusal"),
    [
        (b"TAGS\x01\xff\xfe\x02", "record 1: its properties are not UTF-8"),
        (b"TAGS\x01a\x02UNIQ_KEY\x01b", "record 1: its properties do not end with \\\\x02"),
        (b"TAGS\x01a\x02NOSEP\x02", "record 1: property 'NOSEP' is not name\\\\x01value"),
        (b"TAGS\x01a\x01b\x02", "record 1: property 'TAGS\\\\x01a\\\\x01b' is not name"),
        (b"\x01a\x02", "record 1: property '\\\\x01a' is not name\\\\x01value"),
    ],
    ids=["not utf-8", "no end", "no separator", "two separators", "empty name"],
)
def test_properties_a_record_may_not_have_are_refused_naming_the_record(
    raw: bytes, refusal: str
) -> None:
    with pytest.raises(BadBatch, match=refusal):
        parse_columns(_with_properties(raw))


def test_properties_are_read_as_the_codec_reads_them() -> None:
    """Empty values, a repeated name (the last one counts), non-ASCII text, no properties."""
    for raw in (
        b"KEYS\x01\x02UNIQ_KEY\x01u\x02",
        b"TAGS\x01a\x02TAGS\x01b\x02",
        "TAGS\x01\u00e9t\u00e9\x02k\u00f6\x01\u4e2d\x02".encode(),
        b"",
    ):
        cols = parse_columns(_with_properties(raw))
        assert cols.props[1] == codec.decode_properties(raw), raw
