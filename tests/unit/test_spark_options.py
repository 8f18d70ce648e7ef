"""rocketq.spark's pure parts: option checking (errors name the option) and how a trigger's
limit is spread over queues by backlog."""

from __future__ import annotations

import itertools

import pytest

from rocketq.message import MessageQueue
from rocketq.spark.offsets import TriggerGate, from_json_dict, split, spread, to_json_dict
from rocketq.spark.options import OptionError, sink_options, source_options

pytestmark = pytest.mark.unit

BASE = {"nameserver": "127.0.0.1:9876", "topic": "orders"}


def q(i: int) -> MessageQueue:
    return MessageQueue("t", "broker-a", i)


def test_a_limit_is_spread_by_backlog_and_used_in_full() -> None:
    backlogs = {q(0): 90, q(1): 10, q(2): 0}
    take = spread(backlogs, 20)
    assert sum(take.values()) == 20
    assert take == {q(0): 18, q(1): 2, q(2): 0}
    assert spread(backlogs, 1000) == backlogs
    tiny = spread({q(0): 1, q(1): 1, q(2): 1}, 2)
    assert sum(tiny.values()) == 2 and all(v <= 1 for v in tiny.values())


def test_offsets_json_is_canonical_whatever_the_insertion_order() -> None:
    a = to_json_dict({q(10): 5, q(2): 7, MessageQueue("s", "broker-b", 0): 1})
    b = to_json_dict({MessageQueue("s", "broker-b", 0): 1, q(2): 7, q(10): 5})
    assert list(a) == ["s", "t"] and a == b and str(a) == str(b)
    assert from_json_dict(a)[q(10)] == 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"topik": "x"}, "unknown option 'topik'"),
        ({"nameserver": ""}, "option nameserver is required"),
        ({"nameserver": "localhost"}, "option nameserver: 'localhost' is not host:port"),
        ({"topicPattern": "o.*"}, "exactly one of the options topic"),
        ({"startingOffsets": "{oops"}, "option startingOffsets is not valid JSON"),
        ({"startingOffsets": '{"orders": {"broker-a": {"x": 1}}}'}, "option startingOffsets"),
        ({"startingOffsets": '{"other": {"broker-a": {"0": 1}}}'}, "names topic 'other'"),
        ({"endingOffsets": "earliest"}, "endingOffsets cannot be earliest"),
        ({"maxOffsetsPerTrigger": "0"}, "option maxOffsetsPerTrigger must be 1.."),
        ({"failOnDataLoss": "maybe"}, "option failOnDataLoss must be true or false"),
        ({"filter": "a >", "filterType": "SQL92"}, "option filter \\(SQL92\\)"),
        ({"startingTimestamp": "1", "startingOffsets": "earliest"}, "only one of the options"),
        (
            {"startingOffsetsByTimestamp": '{"orders": {"broker-a": {"0": -1}}}'},
            "option startingOffsetsByTimestamp must look like.*timestamp in ms",
        ),
        ({"startingOffsetsByTimestamp": "[1]"}, "option startingOffsetsByTimestamp must look"),
        (
            {"startingOffsetsByTimestamp": "{}", "startingOffsets": "earliest"},
            "startingOffsets and startingOffsetsByTimestamp",
        ),
        ({"endingOffsetsByTimestamp": "{x"}, "option endingOffsetsByTimestamp is not valid"),
        ({"endingTimestamp": "1", "endingOffsetsByTimestamp": "{}"}, "only one of the options"),
        ({"minOffsetsPerTrigger": "-3"}, "option minOffsetsPerTrigger must be 1.."),
        (
            {"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"},
            "option minOffsetsPerTrigger \\(50\\) must not exceed maxOffsetsPerTrigger \\(10\\)",
        ),
        (
            {"maxTriggerDelay": "5m"},
            "option maxTriggerDelay only applies with minOffsetsPerTrigger",
        ),
        (
            {"minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"},
            "option maxTriggerDelay must be a duration like",
        ),
        ({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "9w"}, "option maxTriggerDelay must be"),
        ({"maxRecordsPerPartition": "0"}, "option maxRecordsPerPartition must be 1.."),
        ({"maxRecordsPerPartition": "many"}, "option maxRecordsPerPartition must be an integer"),
    ],
)
def test_bad_source_options_name_the_option(extra: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        source_options({**BASE, **extra})


def test_good_source_options() -> None:
    opts = source_options(
        {**BASE, "topic": "a, b", "filter": "TagA || TagB", "startingOffsets": "earliest"}
    )
    assert opts.topics == ("a", "b") and opts.filter_type == "TAG"
    assert opts.group.startswith("spark-rocketq-")
    assert source_options({**BASE, "filter": "price > 5"}).filter_type == "SQL92"
    assert source_options({**BASE, "Group": "g1"}).group == "g1"


def test_trigger_and_partition_options() -> None:
    opts = source_options(
        {
            **BASE,
            "minOffsetsPerTrigger": "500",
            "maxTriggerDelay": "30s",
            "maxOffsetsPerTrigger": "900",
        }
    )
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_ms) == (500, 30_000)
    assert source_options({**BASE, "minOffsetsPerTrigger": "5"}).max_trigger_delay_ms == 900_000
    delays = {"250": 250, "250ms": 250, "2m": 120_000, "1h": 3_600_000, "0s": 0}
    for text, ms in delays.items():
        got = source_options({**BASE, "minOffsetsPerTrigger": "5", "maxTriggerDelay": text})
        assert got.max_trigger_delay_ms == ms, text
    assert (
        source_options({**BASE, "maxRecordsPerPartition": "1000"}).max_records_per_partition == 1000
    )
    by_ts = source_options(
        {**BASE, "startingOffsetsByTimestamp": '{"orders": {"broker-b": {"3": 1700000000000}}}'}
    )
    assert by_ts.starting == "timestamps"
    assert by_ts.starting_offsets == {"orders": {"broker-b": {"3": 1700000000000}}}
    ending = source_options(
        {**BASE, "endingOffsetsByTimestamp": '{"orders": {"broker-a": {"0": 5}}}'}
    )
    assert (ending.ending, ending.ending_offsets) == (
        "timestamps",
        {"orders": {"broker-a": {"0": 5}}},
    )


def test_the_default_group_of_a_query_without_the_newer_options_did_not_change() -> None:
    # Queries started before startingOffsetsByTimestamp existed keep their progress group.
    assert source_options(BASE).group == "spark-rocketq-db200b07e9e3abc0"
    with_ts = {**BASE, "startingOffsetsByTimestamp": '{"orders": {"broker-a": {"0": 5}}}'}
    assert source_options(with_ts).group != source_options(BASE).group


def test_a_range_splits_into_even_pieces_of_at_most_the_limit() -> None:
    assert split(10, 20, 0) == [(10, 20)]
    assert split(10, 20, 10) == [(10, 20)]
    assert split(0, 1000, 300) == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    pieces = split(7, 1008, 100)
    assert pieces[0][0] == 7 and pieces[-1][1] == 1008 and len(pieces) == 11
    assert all(b - a <= 100 for a, b in pieces)
    assert all(p[1] == n[0] for p, n in itertools.pairwise(pieces))


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000.0

    def __call__(self) -> float:
        return self.now_ms


def test_a_trigger_waits_for_min_offsets_or_the_max_delay() -> None:
    clock = FakeClock()
    gate = TriggerGate(min_offsets=100, max_delay_ms=60_000, clock_ms=clock)
    assert gate.admit(3)  # the first trigger of a reader runs, as Kafka's does
    clock.now_ms += 1000
    assert not gate.admit(99)
    assert not gate.admit(0)
    assert gate.admit(100)  # enough offsets: runs, and the delay counts from now
    clock.now_ms += 59_999
    assert not gate.admit(5)
    clock.now_ms += 1
    assert not gate.admit(0)  # overdue, but nothing to read: no batch
    assert gate.admit(1)  # overdue and something to read
    clock.now_ms += 10
    assert not gate.admit(1)


def test_bad_sink_options_name_the_option() -> None:
    with pytest.raises(OptionError, match="unknown option 'delayms'"):
        sink_options({**BASE, "delayMs": "5"})
    with pytest.raises(OptionError, match="option producerGroup"):
        sink_options({**BASE, "producerGroup": "bad group!"})
