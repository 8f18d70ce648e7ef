"""How the Spark sink turns rows into batch half messages (rocketq.spark._sink_halves): the
properties of a row, the queue it goes to, where one half ends, and the order halves end in."""

from __future__ import annotations

import datetime as dt

import pytest

from rocketq import codec
from rocketq.client.producer.selectors import java_hash_code
from rocketq.codec import Prop
from rocketq.message import MessageQueue
from rocketq.spark._sink_halves import (
    HALF_BYTES_MAX,
    HALF_ROWS_MAX,
    HalfRef,
    Packer,
    RowError,
    lanes,
    record,
    row_properties,
)

QUEUES = [MessageQueue("t", b, q) for b in ("broker-a", "broker-b") for q in (0, 1)]


def props_of(**cols: object) -> dict[str, str]:
    return row_properties({k: [v] for k, v in cols.items()}, 0, {})


def test_a_row_carries_its_columns_as_the_sdk_would_store_them() -> None:
    p = props_of(
        tags="paid",
        keys="o-1 o-2",
        properties={"region": "eu"},
        delayms=1500,
        shardingkey="alice",
    )
    assert p[Prop.TAGS] == "paid" and p[Prop.KEYS] == "o-1 o-2" and p["region"] == "eu"
    assert p[Prop.TIMER_DELAY_MS] == "1500" and p[Prop.SHARDING_KEY] == "alice"
    assert len(p[Prop.UNIQ_KEY]) == 32
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert props_of(delivertimems=when)[Prop.TIMER_DELIVER_MS] == str(1_893_456_000_000)
    assert Prop.TIMER_DELAY_MS not in props_of(delayms=0)
    assert Prop.TIMER_DELAY_MS not in props_of(delayms=None)


@pytest.mark.parametrize(
    ("cols", "words"),
    [
        ({"delayms": 5, "delivertimems": 9}, "both delayMs and deliverTimeMs"),
        ({"delayms": -1}, "must be >= 0"),
        ({"delivertimems": "soon"}, "milliseconds as an integer"),
        ({"properties": {Prop.UNIQ_KEY: "x"}}, "reserved"),
    ],
)
def test_bad_rows_are_refused_naming_the_column(cols: dict[str, object], words: str) -> None:
    with pytest.raises(RowError, match=words):
        props_of(**cols)


def test_a_record_needs_a_body() -> None:
    for body in (None, b"", ""):
        with pytest.raises(RowError, match="body"):
            record(b"t", body, {Prop.UNIQ_KEY: "u"})
    assert codec.count_records(record(b"t", "text", {Prop.UNIQ_KEY: "u"})) == 1


def test_a_sharding_key_picks_the_queue_the_sdk_hash_selector_picks() -> None:
    packer = Packer(lambda topic: QUEUES, seed=7)
    for key in ("alice", "bob", 42, 2**40):
        assert packer.target("t", key) == QUEUES[abs(java_hash_code(key)) % 4]


def test_halves_close_at_their_row_limit_and_unpinned_rows_move_on() -> None:
    packer = Packer(lambda topic: QUEUES, seed=1)
    rec = b"r" * 10
    shipped = []
    for _ in range(HALF_ROWS_MAX * 2 + 1):
        shipped += packer.add("t", None, rec)
    shipped += packer.rest()
    assert [len(records) for _, records in shipped] == [HALF_ROWS_MAX, HALF_ROWS_MAX, 1]
    assert [mq for mq, _ in shipped] == [QUEUES[1], QUEUES[2], QUEUES[3]]


def test_a_half_closes_before_passing_its_byte_limit() -> None:
    packer = Packer(lambda topic: QUEUES, seed=0)
    big = b"r" * (HALF_BYTES_MAX // 2 + 1)
    mq = packer.target("t", "k")
    assert packer.add("t", "k", big) == []
    shipped = packer.add("t", "k", big)
    assert [(q, len(r)) for q, r in shipped] == [(mq, 1)]
    assert [len(r) for _, r in packer.rest()] == [1]


def test_lanes_keep_write_order_per_queue() -> None:
    def half(q: int, n: int) -> HalfRef:
        return HalfRef("broker-a", n, n, f"tx{n}", "t", q, 1)

    got = lanes([half(0, 1), half(1, 2), half(0, 3), half(1, 4), half(0, 5)])
    assert [[h.txid for h in items] for items in got.values()] == [
        ["tx1", "tx3", "tx5"],
        ["tx2", "tx4"],
    ]
    assert HalfRef.of(half(0, 9).as_list()) == half(0, 9)


def test_the_sink_schema_check_names_what_it_writes() -> None:
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from rocketq.spark.options import OptionError, sink_options
    from rocketq.spark.sink import check_schema

    opts = sink_options({"nameserver": "127.0.0.1:9876", "topic": "t"})

    def schema(*names: str) -> StructType:
        kinds = {"body": BinaryType(), "delayMs": LongType(), "shardingKey": StringType()}
        return StructType([StructField(n, kinds.get(n, StringType())) for n in names])

    check_schema(schema("body", "delayMs", "shardingKey", "tags"), opts)
    with pytest.raises(OptionError, match=r"column\(s\) priority; it writes .*deliverTimeMs"):
        check_schema(schema("body", "priority"), opts)
    with pytest.raises(OptionError, match="column named body"):
        check_schema(schema("value"), opts)
    no_topic = sink_options({"nameserver": "127.0.0.1:9876"})
    with pytest.raises(OptionError, match="option topic or a column named topic"):
        check_schema(schema("body"), no_topic)
