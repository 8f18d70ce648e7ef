"""SQL92 pulls against a real broker (SPEC §6.17): raw gRPC Pull with FLAG_SUBSCRIPTION.

One nameserver and two brokers for the module: broker-a with ``enablePropertyFilter=true`` (and
a long periodic hold check, so only arrivals wake held pulls during the long-polling test),
broker-b with the property filter off. Each test uses its own topic.

- every operator through a real pull, against expected message sets written by hand;
- a backlog of 5 000 messages with 1 % matching: pulls walk it window by window, return only
  matches, and answer NO_MATCHED_MSG with the next offset for a window without any;
- long polling: a held SQL pull ignores non-matching arrivals and returns at once on a match;
- errors: a syntax error is INVALID_ARGUMENT with its position, so is SQL92 on broker-b;
- a Hypothesis fuzz of expressions and property values: every answer is OK or
  INVALID_ARGUMENT, an OK answer holds exactly the messages the local compiler selects, and
  the broker stays alive and serving.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from rocketq.sql92 import Sql92Error, compile_sql92
from tests.integration.cluster import ServiceProcess, start_broker, start_nameserver
from tests.support.until import until_sync

pytestmark = pytest.mark.integration

FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x2, 0x4
SQL = common_pb2.SQL92


@dataclass
class Broker:
    proc: ServiceProcess
    channel: grpc.Channel
    stub: messaging_pb2_grpc.MessagingStub
    admin: admin_pb2_grpc.AdminStub

    def hold_stats(self) -> tuple[int, int]:
        """Pulls held now, and arrivals checked against held pulls so far (GetRuntimeStats)."""
        stats = self.admin.GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest(), timeout=5)
        extra = stats.extra
        return stats.held_pull_requests, int(extra["held_pull_arrivals_checked"])

    def send(self, topic: str, props: list[dict[str, str]], queue_id: int = 0) -> list[int]:
        """Send one message per property map (body = its index); their queue offsets."""
        resp = self.stub.Send(
            messaging_pb2.SendRequest(
                producer_group="pg",
                queue_id=queue_id,
                default_topic="TBW102",
                messages=[
                    common_pb2.Message(topic=topic, body=str(i).encode(), properties=p)
                    for i, p in enumerate(props)
                ],
            ),
            timeout=30,
        )
        return [r.queue_offset for r in resp.results]

    def pull_request(
        self, topic: str, expression: str, offset: int = 0, **fields: object
    ) -> messaging_pb2.PullRequest:
        req = messaging_pb2.PullRequest(
            consumer_group="sqlg",
            topic=topic,
            queue_id=0,
            queue_offset=offset,
            sys_flag=FLAG_SUBSCRIPTION,
            subscription=expression,
            expression_type=SQL,
            decoded=True,
            max_msg_nums=1024,
        )
        for name, value in fields.items():
            setattr(req, name, value)
        return req

    def pull(
        self, topic: str, expression: str, offset: int = 0, **fields: object
    ) -> messaging_pb2.PullResponse:
        resp: messaging_pb2.PullResponse = self.stub.Pull(
            self.pull_request(topic, expression, offset, **fields), timeout=30
        )
        return resp


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Broker]]:
    root: Path = tmp_path_factory.mktemp("sql92")
    procs: list[ServiceProcess] = []
    channels: list[grpc.Channel] = []
    try:
        ns = start_nameserver(root)
        procs.append(ns)
        on = start_broker(
            root, [ns.addr], "broker-a", enablePropertyFilter=True, pullHoldCheckIntervalMs=600_000
        )
        procs.append(on)
        off = start_broker(root, [ns.addr], "broker-b")
        procs.append(off)
        made = []
        for p in (on, off):
            channel = grpc.insecure_channel(p.addr)
            channels.append(channel)
            stubs = messaging_pb2_grpc.MessagingStub(channel), admin_pb2_grpc.AdminStub(channel)
            made.append(Broker(p, channel, *stubs))
        yield made[0], made[1]
        for p in procs[1:]:
            assert p.alive(), f"{p.name} died:\n{p.log_tail()}"
            log = p.log_path.read_text(errors="replace")
            assert "Traceback" not in log, f"{p.name} logged an exception:\n{p.log_tail()}"
    finally:
        for c in channels:
            c.close()
        for p in reversed(procs):
            p.stop()


def refusal(
    call: object, *args: object, **kwargs: object
) -> tuple[grpc.StatusCode, int, dict[str, str], str]:
    """Make the call, which must fail: its code, ErrorDetail reason and metadata, message."""
    assert callable(call)
    try:
        call(*args, **kwargs)
    except grpc.RpcError as err:
        status = rpc_status.from_call(err)
        detail = common_pb2.ErrorDetail()
        if status is not None and status.details:
            status.details[0].Unpack(detail)
        return err.code(), detail.reason, dict(detail.metadata), err.details() or ""
    raise AssertionError("the call succeeded but was expected to fail")


def bodies(resp: messaging_pb2.PullResponse) -> list[int]:
    return [int(m.message.body) for m in resp.messages]


# -- every operator ------------------------------------------------------------------------------
MESSAGES: list[dict[str, str]] = [
    {"a": "1", "s": "x", "b": "true", "TAGS": "T1"},  # 0
    {"a": "3", "s": "y"},  # 1
    {"a": "5", "s": "xyz", "n": ""},  # 2
    {"a": "abc"},  # 3: not a number
    {"s": "x"},  # 4: no a
    {"a": "3.5", "f": "2.5"},  # 5: a decimal
    {"a": "-2", "s": "it's"},  # 6
]
ALL = list(range(len(MESSAGES)))

OPERATOR_CASES: list[tuple[str, list[int]]] = [
    ("a > 2", [1, 2]),  # 'abc' and '3.5' do not read as integers: no match
    ("a >= 3", [1, 2]),
    ("a < 3", [0, 6]),
    ("a <= -2", [6]),
    ("a = 3", [1]),
    ("a <> 3", [0, 2, 6]),
    ("a > 2.5", [1, 2, 5]),  # a decimal constant reads '3.5' as a double
    ("a BETWEEN 0 AND 3", [0, 1]),
    ("a NOT BETWEEN 0 AND 3", [2, 6]),
    ("a BETWEEN -5 AND 1.5", [0, 6]),
    ("s = 'x'", [0, 4]),
    ("s <> 'x'", [1, 2, 6]),
    ("s = 'it''s'", [6]),
    ("s IN ('x', 'y')", [0, 1, 4]),
    ("s NOT IN ('x', 'y')", [2, 6]),
    ("a IS NULL", [4]),
    ("a IS NOT NULL", [0, 1, 2, 3, 5, 6]),
    ("n IS NOT NULL AND n = ''", [2]),
    ("b = TRUE", [0]),
    ("b = FALSE", []),
    ("s CONTAINS 'y'", [1, 2]),
    ("s NOT CONTAINS 'x'", [1, 6]),  # NULL is FALSE for text operators, even under NOT
    ("s STARTSWITH 'x'", [0, 2, 4]),
    ("s ENDSWITH 'z'", [2]),
    ("s NOT ENDSWITH 'z'", [0, 1, 4, 6]),
    ("a > 2 AND s = 'xyz'", [2]),
    ("a = 1 OR s = 'y'", [0, 1]),
    ("NOT a = 1", [1, 2, 6]),  # unknown (missing) and unconvertible stay unmatched
    ("NOT (s = 'x') AND a IS NOT NULL", [1, 2, 6]),
    ("a = 1 or a = 3 OR A = 5", [0, 1]),  # property names are case-sensitive
    ("TAGS = 'T1'", [0]),  # system properties are visible too
    ("f > 2.0", [5]),
    ("f > 2", []),  # an integer constant does not read '2.5'
    ("a > b", []),
    ("TRUE", ALL),
    ("FALSE", []),
    ("a = 1 /* comment */ OR -- to the end of the line\n a = 5", [0, 2]),
]


def test_every_operator_through_a_real_pull(brokers: tuple[Broker, Broker]) -> None:
    on, _ = brokers
    assert on.send("SqlOps", MESSAGES) == ALL
    for expression, expected in OPERATOR_CASES:
        resp = on.pull("SqlOps", expression)
        if expected:
            assert resp.status == messaging_pb2.FOUND, expression
        else:
            assert resp.status == messaging_pb2.NO_MATCHED_MSG, expression
        assert bodies(resp) == expected, expression
        assert resp.next_begin_offset == len(MESSAGES), expression
        local = compile_sql92(expression)
        assert [i for i, p in enumerate(MESSAGES) if local.matches(p)] == expected, expression
    raw = on.pull("SqlOps", "a BETWEEN 0 AND 3", decoded=False)  # the stored bytes path
    assert raw.status == messaging_pb2.FOUND and raw.records and not raw.messages


# -- backlog ------------------------------------------------------------------------------------
def _backlog_match(offset: int) -> bool:
    # 50 of 5 000 (1 %): ten spread over the first 2 000, forty at the very end, so the
    # windows in between have none.
    return (offset < 2000 and offset % 200 == 0) or offset >= 4960


def test_filtering_walks_a_backlog_and_returns_only_matches(
    brokers: tuple[Broker, Broker],
) -> None:
    on, _ = brokers
    total = 5000
    for start in range(0, total, 500):
        props = [
            {"k": "hit" if _backlog_match(o) else "miss", "i": str(o)}
            for o in range(start, start + 500)
        ]
        on.send("SqlBacklog", props)
    offset, found, statuses, pulls = 0, [], [], 0
    started = time.perf_counter()
    while offset < total and pulls < 100:
        resp = on.pull("SqlBacklog", "k = 'hit'", offset, max_msg_nums=32)
        pulls += 1
        statuses.append(resp.status)
        assert resp.status in (messaging_pb2.FOUND, messaging_pb2.NO_MATCHED_MSG)
        assert resp.next_begin_offset > offset
        if resp.status == messaging_pb2.NO_MATCHED_MSG:
            assert not resp.messages
        found += [m.queue_offset for m in resp.messages]
        assert all(m.message.properties["k"] == "hit" for m in resp.messages)
        offset = resp.next_begin_offset
    took_s = time.perf_counter() - started
    assert found == [o for o in range(total) if _backlog_match(o)]
    assert messaging_pb2.NO_MATCHED_MSG in statuses  # the empty middle windows
    assert offset == total
    end = on.pull("SqlBacklog", "k = 'hit'", offset)
    assert (end.status, end.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, total)
    print(f"backlog: {total} messages scanned in {pulls} pulls, {took_s * 1000:.0f} ms")


# -- long polling -------------------------------------------------------------------------------
def test_a_held_sql_pull_wakes_only_for_a_match(brokers: tuple[Broker, Broker]) -> None:
    on, _ = brokers
    on.send("SqlHold", [{"v": "0"}])  # creates the topic; the pull waits from offset 1
    req = on.pull_request("SqlHold", "v > 5", 1)
    req.sys_flag |= FLAG_SUSPEND
    req.suspend_timeout_ms = 20_000
    future = on.stub.Pull.future(req, timeout=30)
    until_sync(lambda: on.hold_stats()[0] == 1, "the SQL pull held by the broker")
    checked_before = on.hold_stats()[1]
    on.send("SqlHold", [{"v": "1"}, {"w": "9"}, {"v": "x"}])
    until_sync(
        lambda: on.hold_stats()[1] >= checked_before + 3,
        "the three arrivals checked against the held pull",
    )
    # The broker decides a wake as it checks an arrival: still held means none matched.
    assert on.hold_stats()[0] == 1, "a non-matching arrival woke the held SQL pull"
    assert not future.done(), "a non-matching arrival woke the held SQL pull"
    sent_at = time.perf_counter()
    on.send("SqlHold", [{"v": "6"}])
    resp = future.result(timeout=10)
    woke_s = time.perf_counter() - sent_at
    assert resp.status == messaging_pb2.FOUND
    assert [m.message.properties["v"] for m in resp.messages] == ["6"]
    assert [m.queue_offset for m in resp.messages] == [4]
    assert woke_s < 0.5, f"the matching arrival took {woke_s:.3f} s to wake the pull"


# -- errors -------------------------------------------------------------------------------------
def test_a_syntax_error_is_invalid_argument_with_the_position(
    brokers: tuple[Broker, Broker],
) -> None:
    on, _ = brokers
    on.send("SqlErr", [{"a": "1"}])
    for expression, position in (("a >> 5", 3), ("a = 'x", 4), ("a BETWEEN 9 AND 1", 10)):
        code, reason, meta, message = refusal(on.pull, "SqlErr", expression)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert reason == common_pb2.ILLEGAL_EXPRESSION
        assert meta["position"] == str(position)
        assert f"at position {position}" in message


def test_sql92_without_the_property_filter_is_invalid_argument(
    brokers: tuple[Broker, Broker],
) -> None:
    _, off = brokers
    off.send("SqlOff", [{"a": "1"}])
    code, reason, _meta, message = refusal(off.pull, "SqlOff", "a > 0")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert reason == common_pb2.ILLEGAL_EXPRESSION
    assert "enablePropertyFilter=true" in message
    assert off.pull("SqlOff", "*", expression_type=common_pb2.TAG).status == messaging_pb2.FOUND


# -- fuzz against the live broker ---------------------------------------------------------------
NAMES = ["a", "b", "s", "TAGS"]
VALUES = st.one_of(
    st.sampled_from(["", "0", "3", "-3", "3.5", "1e3", "NaN", "true", "x", "it's", " 4 "]),
    # No surrogates (category Cs): protobuf strings are UTF-8 and cannot carry them.
    st.text(
        alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
        max_size=8,
    ),
)
FUZZ_TOKENS = st.sampled_from(
    ["a", "b", "s", "1", "-2", "2.5", "'x'", "''", "'", "(", ")", "=", "<>", "<", ">=", "AND",
     "OR", "NOT", "IN ('x', '3')", "BETWEEN 1 AND 4", "IS NULL", "IS NOT NULL", "TRUE", "NULL",
     "CONTAINS 'x'", "STARTSWITH '3'", ",", "--", "/*", "é", '"']
)  # fmt: skip
EXPRESSIONS = st.one_of(
    st.lists(FUZZ_TOKENS, min_size=1, max_size=12).map(" ".join),
    st.builds(
        "{} {} {}".format,
        st.sampled_from(NAMES),
        st.sampled_from(["=", "<>", "<", "<=", ">", ">="]),
        st.sampled_from(["1", "3", "-3", "2.5", "'x'", "''", "b", "TRUE"]),
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression=EXPRESSIONS, props=st.dictionaries(st.sampled_from(NAMES[:3]), VALUES))
def test_fuzz_expressions_and_values_against_the_live_broker(
    brokers: tuple[Broker, Broker], expression: str, props: dict[str, str]
) -> None:
    on, _ = brokers
    (offset,) = on.send("SqlFuzz", [props])
    start = max(0, offset - 4)  # this message and a few earlier ones
    try:
        local = compile_sql92(expression)
    except Sql92Error as exc:
        code, reason, meta, _message = refusal(on.pull, "SqlFuzz", expression, start)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, expression
        assert reason == common_pb2.ILLEGAL_EXPRESSION
        assert meta.get("position") == str(exc.position)
        return
    resp = on.pull("SqlFuzz", expression, start)
    assert resp.status in (messaging_pb2.FOUND, messaging_pb2.NO_MATCHED_MSG), expression
    window = on.pull("SqlFuzz", "TRUE", start)  # every message of the window, to check against
    expected = [
        m.queue_offset for m in window.messages if local.matches(dict(m.message.properties))
    ]
    assert [m.queue_offset for m in resp.messages] == expected, expression
    assert on.proc.alive()
