"""rocketq.spark's pure parts: option checking (errors name the option) and how a trigger's
limit is spread over queues by backlog."""

from __future__ import annotations

import pytest

from rocketq.message import MessageQueue
from rocketq.spark.offsets import from_json_dict, spread, to_json_dict
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
        ({"startingTimestamp": "1", "startingOffsets": "earliest"}, "not both"),
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


def test_bad_sink_options_name_the_option() -> None:
    with pytest.raises(OptionError, match="unknown option 'delayms'"):
        sink_options({**BASE, "delayMs": "5"})
    with pytest.raises(OptionError, match="option producerGroup"):
        sink_options({**BASE, "producerGroup": "bad group!"})
