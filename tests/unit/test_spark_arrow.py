"""rocketq.spark._arrow, the read path's fast decoder: the record batch it cuts from pulled
record bytes equals the one built message by message (the general path), and records it does
not cover are handed back to the general path."""

from __future__ import annotations

import ipaddress
import zlib
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from rocketq import codec
from rocketq.codec import HostAddress
from rocketq.spark import _arrow, _client, reader
from rocketq.spark.reader import QueueRange, _Batches

pytestmark = pytest.mark.unit

STORE = HostAddress(bytes([10, 0, 0, 1]), 10911)
BORN = [HostAddress(bytes([192, 168, 1, i]), 50000 + i) for i in (7, 8)]
SCHEMA = to_arrow_schema(reader.SCHEMA_TYPE, timezone="UTC")


def test_the_schema_type_is_the_schema_text() -> None:
    fields = (f.split(" ", 1) for f in reader.SCHEMA.split(", "))
    as_text = "struct<" + ",".join(f"{name}:{kind}" for name, kind in fields) + ">"
    assert reader.SCHEMA_TYPE.simpleString() == as_text


def record(i: int, **overrides: object) -> bytes:
    props: dict[str, str] = {"TAGS": f"tag{i % 3}", "KEYS": f"k{i} x", "color": "red"}
    if i % 4 == 0:
        props["UNIQ_KEY"] = f"ID{i:04d}"  # others fall back to the offset message id
    if i % 5 == 0:
        props = {}  # no properties at all: no tags, keys; an empty map
    fields: dict[str, object] = {
        "topic_bytes": b"orders",
        "body": bytes([i % 256]) * (i * 7 % 300),
        "properties": codec.encode_properties(props),
        "queue_id": 3,
        "flag": 0,
        "queue_offset": 100 + i,
        "physical_offset": 5000 + 400 * i,
        "sys_flag": 0,
        "born_timestamp_ms": 1_700_000_000_000 + i,
        "born_host": BORN[i % 2],
        "store_timestamp_ms": 1_700_000_000_500 + i,
        "store_host": STORE,
        "reconsume_times": i % 2,
    }
    fields.update(overrides)
    return codec.encode_record(**fields)  # type: ignore[arg-type]


def part(end: int = 10**9) -> QueueRange:
    return QueueRange(
        "orders", "broker-a", 3, 100, end, "127.0.0.1:1", "g", "*", "TAG", 32, 1000, True
    )


def pulled(records: list[bytes]) -> _client.RawPull:
    return _client.RawPull(0, 0, b"".join(records), 0)


def batches(answers: list[list[bytes]], end: int = 10**9) -> list[pa.RecordBatch]:
    b = _Batches(part(end), SCHEMA)
    out: list[pa.RecordBatch] = []
    for records in answers:
        out.extend(b.add(pulled(records)))
    out.extend(b.flush())
    return out


def general(answers: list[list[bytes]], end: int = 10**9) -> pa.Table:
    b = _Batches(part(end), SCHEMA)
    return pa.Table.from_batches(list(b._general([b"".join(r) for r in answers])), SCHEMA)


def rows(found: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    table: pa.Table = pa.Table.from_batches(found, SCHEMA)
    out: list[dict[str, Any]] = table.to_pylist()
    return out


def test_fast_columns_equal_the_general_decoding() -> None:
    answers = [[record(i) for i in range(j, j + 10)] for j in range(0, 40, 10)]
    found = batches(answers)
    assert len(found) == 1  # four answers gathered into one batch
    assert rows(found) == general(answers).to_pylist()
    with_id, no_props = rows(found)[4], rows(found)[5]
    assert with_id["msgId"] == "ID0004" and with_id["tags"] == "tag1" and with_id["keys"] == "k4 x"
    assert dict(with_id["properties"]) == {"color": "red", "UNIQ_KEY": "ID0004"}
    assert no_props["tags"] is None and no_props["properties"] == []
    assert rows(found)[1]["msgId"] == codec.encode_offset_msg_id(STORE, 5400)
    assert rows(found)[3]["bornHost"] == "192.168.1.8:50008"


def test_records_at_or_past_the_range_end_are_left_out() -> None:
    answers = [[record(i) for i in range(10)]]
    found = rows(batches(answers, end=106))
    assert [r["queueOffset"] for r in found] == [100, 101, 102, 103, 104, 105]


@pytest.mark.parametrize(
    "odd",
    [
        {"born_host": HostAddress(ipaddress.ip_address("2001:db8::7").packed, 4000)},
        {"sys_flag": codec.SysFlag.COMPRESSED, "body": zlib.compress(b"z" * 500)},
        {"topic_bytes": b"other-topic"},
        {"properties": b"bad\x01\xff\xfe\x02"},
    ],
    ids=["ipv6-host", "compressed", "another-topic", "not-utf8"],
)
def test_records_the_fast_path_does_not_cover_decode_the_general_way(
    odd: dict[str, object],
) -> None:
    answers = [[record(i) for i in range(5)], [record(5, **odd)], [record(6), record(7)]]
    found = rows(batches(answers))
    assert [r["queueOffset"] for r in found] == list(range(100, 108))
    assert found == general(answers).to_pylist()


def test_a_corrupt_body_is_refused() -> None:
    bad = record(1, crc=12345)
    with pytest.raises(codec.CorruptRecord, match="CRC"):
        _arrow.walk(_arrow.Walked(), bad, b"orders", 10**9)
