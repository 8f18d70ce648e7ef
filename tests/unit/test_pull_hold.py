"""Long polling and pull processing on a real store, without sockets (SPEC §6.7–§6.9).

Time is a ManualClock; the loop timer of a held pull is never reached (holds are long) except
where a test asks for a zero hold. ``asyncio.sleep(0)`` only yields to the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.message import decode_records
from services.broker.model import SubscriptionGroupConfig
from services.broker.pull_processor import pull_status
from services.common.errors import ServiceError
from services.store.commitlog import MessageToStore
from services.store.message_store import GetStatus
from tests.unit._broker_parts import BrokerParts, pull_request

pytestmark = pytest.mark.unit

LONG_MS = 60_000


@pytest.fixture
def b(tmp_path: Path) -> Iterator[BrokerParts]:
    parts = BrokerParts(tmp_path)
    parts.create_topic("T")
    yield parts
    parts.close()


async def _settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


# -- PullHoldService ---------------------------------------------------------------------------
async def test_arrival_wakes_a_held_pull_at_once(b: BrokerParts) -> None:
    task = asyncio.create_task(b.hold.hold("T", 0, 0, None, LONG_MS))
    await _settle()
    assert b.hold.held_count() == 1 and not task.done()
    b.append("T", 0)
    assert await task is True
    assert b.hold.held_count() == 0


async def test_arrival_below_the_wanted_offset_or_on_another_queue_does_not_wake(
    b: BrokerParts,
) -> None:
    b.append("T", 0, count=3)
    task = asyncio.create_task(b.hold.hold("T", 0, 4, None, LONG_MS))
    await _settle()
    b.append("T", 1)  # another queue
    b.append("T", 0)  # offset 3: still below 4
    await _settle()
    assert not task.done()
    b.append("T", 0)  # offset 4
    assert await task is True


async def test_tag_filter_decides_which_arrival_wakes(b: BrokerParts) -> None:
    wanted = codec.tags_hash("A")
    task = asyncio.create_task(b.hold.hold("T", 0, 0, lambda code: code == wanted, LONG_MS))
    await _settle()
    b.append("T", 0, count=2, tags="B")
    await _settle()
    assert not task.done()
    b.append("T", 0, tags="A")
    assert await task is True


async def test_check_once_expires_overdue_pulls_by_the_clock(b: BrokerParts) -> None:
    task = asyncio.create_task(b.hold.hold("T", 0, 0, None, 1000))
    await _settle()
    assert b.hold.check_once() == 0
    b.clock.advance_ms(1000)
    assert b.hold.check_once() == 1
    assert await task is False
    assert b.hold.held_count() == 0


async def test_check_once_wakes_pulls_whose_queue_grew_without_a_listener_call(
    b: BrokerParts,
) -> None:
    task = asyncio.create_task(b.hold.hold("T", 0, 0, None, LONG_MS))
    await _settle()
    listeners = b.store.dispatcher.listeners[:]
    b.store.dispatcher.listeners.clear()
    b.append("T", 0)
    b.store.dispatcher.listeners.extend(listeners)
    await _settle()
    assert not task.done()
    assert b.hold.check_once() == 1
    assert await task is True


async def test_a_zero_hold_times_out_on_the_loop_timer(b: BrokerParts) -> None:
    assert await b.hold.hold("T", 0, 0, None, 0) is False
    assert b.hold.held_count() == 0


async def test_short_polling_ignores_arrivals_and_holds_the_short_time(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, long_polling_enable=False, short_polling_time_ms=1000)
    parts.create_topic("T")

    try:
        assert parts.hold.hold_time_ms(15_000) == 1000
        task = asyncio.create_task(parts.hold.hold("T", 0, 0, None, 1000))
        await _settle()
        parts.append("T", 0)
        await _settle()
        assert not task.done()
        assert parts.hold.check_once() == 0
        parts.clock.advance_ms(1000)
        assert parts.hold.check_once() == 1
        assert await task is False
    finally:
        parts.close()


async def test_cancelled_pull_is_forgotten(b: BrokerParts) -> None:
    task = asyncio.create_task(b.hold.hold("T", 0, 0, None, LONG_MS))
    await _settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.hold.held_count() == 0
    b.append("T", 0)  # nothing left to wake


async def test_held_pulls_are_capped(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, held_pulls_max=2)
    parts.create_topic("T")

    try:
        tasks = [asyncio.create_task(parts.hold.hold("T", 0, 0, None, LONG_MS)) for _ in range(2)]
        await _settle()
        with pytest.raises(ServiceError) as err:
            await parts.hold.hold("T", 0, 0, None, LONG_MS)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.value.reason == common_pb2.FLOW_CONTROL
        parts.hold.release_all()
        assert await asyncio.gather(*tasks) == [False, False]
        assert parts.hold.held_count() == 0
    finally:
        parts.close()


def test_hold_time_is_clamped(b: BrokerParts) -> None:
    assert b.hold.hold_time_ms(15_000) == 15_000
    assert b.hold.hold_time_ms(10**9) == 120_000
    assert b.hold.hold_time_ms(-5) == 0


# -- PullProcessor: status table (SPEC §6.7 step 7, §6.8) ---------------------------------------
@pytest.mark.parametrize(
    ("status", "offset", "expected"),
    [
        (GetStatus.FOUND, 3, messaging_pb2.FOUND),
        (GetStatus.NO_MATCHED_MESSAGE, 3, messaging_pb2.NO_MATCHED_MSG),
        (GetStatus.MESSAGE_WAS_REMOVING, 3, messaging_pb2.NO_MATCHED_MSG),
        (GetStatus.NO_MESSAGE_IN_QUEUE, 0, messaging_pb2.NO_NEW_MSG),
        (GetStatus.NO_MESSAGE_IN_QUEUE, 3, messaging_pb2.OFFSET_ILLEGAL),
        (GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, messaging_pb2.NO_NEW_MSG),
        (GetStatus.NO_MATCHED_LOGIC_QUEUE, 3, messaging_pb2.OFFSET_ILLEGAL),
        (GetStatus.OFFSET_FOUND_NULL, 3, messaging_pb2.NO_NEW_MSG),
        (GetStatus.OFFSET_OVERFLOW_ONE, 3, messaging_pb2.NO_NEW_MSG),
        (GetStatus.OFFSET_OVERFLOW_BADLY, 3, messaging_pb2.OFFSET_ILLEGAL),
        (GetStatus.OFFSET_TOO_SMALL, 3, messaging_pb2.OFFSET_ILLEGAL),
    ],
)
def test_status_table(status: GetStatus, offset: int, expected: int) -> None:
    assert pull_status(status, offset) == expected


async def _pull(b: BrokerParts, req: messaging_pb2.PullRequest) -> messaging_pb2.PullResponse:
    return await b.puller.pull(req, None)


async def test_offset_cases_through_the_processor(b: BrokerParts) -> None:
    empty = await _pull(b, pull_request("T", 0))
    assert (empty.status, empty.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, 0)
    moved = await _pull(b, pull_request("T", 5))
    assert (moved.status, moved.next_begin_offset) == (messaging_pb2.OFFSET_ILLEGAL, 0)
    b.append("T", 0, count=3)
    found = await _pull(b, pull_request("T", 1))
    assert found.status == messaging_pb2.FOUND
    assert (found.next_begin_offset, found.min_offset, found.max_offset) == (3, 0, 3)
    assert [m.queue_offset for m in decode_records(found.records)] == [1, 2]
    one = await _pull(b, pull_request("T", 3))
    assert (one.status, one.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, 3)
    badly = await _pull(b, pull_request("T", 9))
    assert (badly.status, badly.next_begin_offset) == (messaging_pb2.OFFSET_ILLEGAL, 0)


async def test_max_msg_nums_limits_a_pull(b: BrokerParts) -> None:
    b.append("T", 0, count=10)
    resp = await _pull(b, pull_request("T", 0, max_msg_nums=4))
    assert len(decode_records(resp.records)) == 4
    assert resp.next_begin_offset == 4


async def test_tags_filter_gives_no_matched_then_found(b: BrokerParts) -> None:
    b.append("T", 0, count=3, tags="B")
    miss = await _pull(b, pull_request("T", 0, expression="A"))
    assert (miss.status, miss.next_begin_offset) == (messaging_pb2.NO_MATCHED_MSG, 3)
    assert miss.records == b""
    b.append("T", 0, tags="A")
    hit = await _pull(b, pull_request("T", 0, expression="A || C"))
    assert hit.status == messaging_pb2.FOUND
    assert [m.tags for m in decode_records(hit.records)] == ["A"]


async def test_decoded_pull_returns_structured_messages(b: BrokerParts) -> None:
    b.append("T", 0, count=2, tags="X")
    resp = await _pull(b, pull_request("T", 0, decoded=True))
    assert resp.records == b""
    assert [m.message.body for m in resp.messages] == [b"m0", b"m1"]
    assert resp.messages[1].queue_offset == 1
    assert resp.messages[0].message.properties["TAGS"] == "X"


async def test_suspended_pull_returns_on_arrival_with_the_message(b: BrokerParts) -> None:
    task = asyncio.create_task(b.puller.pull(pull_request("T", 0, suspend_ms=LONG_MS), None))
    await _settle()
    assert b.hold.held_count() == 1
    b.append("T", 0)
    resp = await task
    assert resp.status == messaging_pb2.FOUND
    assert resp.next_begin_offset == 1


async def test_suspended_pull_times_out_with_no_new_msg(b: BrokerParts) -> None:
    b.append("T", 0, count=2)
    task = asyncio.create_task(b.puller.pull(pull_request("T", 2, suspend_ms=500), None))
    await _settle()
    b.clock.advance_ms(500)
    b.hold.check_once()
    resp = await task
    assert (resp.status, resp.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, 2)


async def test_out_of_range_offsets_are_never_held(b: BrokerParts) -> None:
    b.append("T", 0, count=2)
    resp = await b.puller.pull(pull_request("T", 7, suspend_ms=LONG_MS), None)
    assert resp.status == messaging_pb2.OFFSET_ILLEGAL
    assert b.hold.held_count() == 0


async def test_commit_offset_flag_stores_the_offset(b: BrokerParts) -> None:
    await _pull(b, pull_request("T", 0, flags=0x4 | 0x1, commit_offset=7))
    assert b.offsets.query("cg", "T", 0) == 7
    await _pull(b, pull_request("T", 0, commit_offset=9))  # no flag: not stored
    assert b.offsets.query("cg", "T", 0) == 7


async def test_slave_keeps_the_offset_and_commits_nothing(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, broker_id=1, broker_role="SLAVE")
    parts.create_topic("T")
    try:
        parts.append("T", 0, count=2)
        resp = await _pull(parts, pull_request("T", 9, flags=0x5, commit_offset=3))
        assert (resp.status, resp.next_begin_offset) == (messaging_pb2.NO_MATCHED_MSG, 9)
        assert resp.suggest_which_broker_id == 0
        assert parts.offsets.query("cg", "T", 0) == -1
    finally:
        parts.close()


async def test_subscription_from_heartbeat_and_version_check(b: BrokerParts) -> None:
    req = pull_request("T", 0, flags=0)
    with pytest.raises(ServiceError) as err:
        await _pull(b, req)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    channel = b.clients.open_channel("c1")
    b.clients.heartbeat(
        channel,
        messaging_pb2.Heartbeat(
            client_id="c1",
            consumers=[
                messaging_pb2.ConsumerData(
                    consumer_group="cg",
                    subscriptions=[
                        messaging_pb2.SubscriptionData(topic="T", expression="A", sub_version=5)
                    ],
                )
            ],
        ),
    )
    b.append("T", 0, tags="B")
    b.append("T", 0, tags="A")
    resp = await _pull(b, pull_request("T", 0, flags=0, sub_version=5))
    assert [m.tags for m in decode_records(resp.records)] == ["A"]
    with pytest.raises(ServiceError) as err:
        await _pull(b, pull_request("T", 0, flags=0, sub_version=6))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("req", "code"),
    [
        (pull_request("bad topic"), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", group=""), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", -1), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", queue_id=4), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", queue_id=-1), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", max_msg_nums=0), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", max_msg_nums=1025), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", flags=0x4 | 0x8), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("T", expression="||"), grpc.StatusCode.INVALID_ARGUMENT),
        (pull_request("Nope"), grpc.StatusCode.NOT_FOUND),
    ],
)
async def test_bad_pulls(
    b: BrokerParts, req: messaging_pb2.PullRequest, code: grpc.StatusCode
) -> None:
    with pytest.raises(ServiceError) as err:
        await _pull(b, req)
    assert err.value.code == code


async def test_unknown_group_without_auto_create(tmp_path: Path) -> None:
    parts = BrokerParts(tmp_path, auto_create_subscription_group=False)
    parts.create_topic("T")
    try:
        with pytest.raises(ServiceError) as err:
            await _pull(parts, pull_request("T"))
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        assert err.value.reason == common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST
    finally:
        parts.close()


async def test_consume_disabled_group_and_unreadable_topic_are_denied(b: BrokerParts) -> None:
    b.groups.put(SubscriptionGroupConfig("off", consume_enable=False))
    with pytest.raises(ServiceError) as err:
        await _pull(b, pull_request("T", group="off"))
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    b.create_topic("W", perm=2)
    with pytest.raises(ServiceError) as err:
        await _pull(b, pull_request("W"))
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED


async def test_read_queue_nums_bound_the_queue_id(b: BrokerParts) -> None:
    b.create_topic("R", queues=8, read=4)
    await _pull(b, pull_request("R", queue_id=3))
    with pytest.raises(ServiceError):
        await _pull(b, pull_request("R", queue_id=4))


async def test_broadcasting_needs_consume_broadcast_enable(b: BrokerParts) -> None:
    b.groups.put(SubscriptionGroupConfig("bc", consume_broadcast_enable=False))
    channel = b.clients.open_channel("c1")
    b.clients.heartbeat(
        channel,
        messaging_pb2.Heartbeat(
            client_id="c1",
            consumers=[
                messaging_pb2.ConsumerData(
                    consumer_group="bc", message_model=messaging_pb2.BROADCASTING
                )
            ],
        ),
    )
    with pytest.raises(ServiceError) as err:
        await _pull(b, pull_request("T", group="bc"))
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED


# -- SQL92 subscriptions (enablePropertyFilter) ---------------------------------------------------
SQL = common_pb2.SQL92


@pytest.fixture
def sq(tmp_path: Path) -> Iterator[BrokerParts]:
    parts = BrokerParts(tmp_path, enable_property_filter=True)
    parts.create_topic("T")
    yield parts
    parts.close()


def _append_props(parts: BrokerParts, props: list[dict[str, str]], queue_id: int = 0) -> None:
    parts.store.append(
        [
            MessageToStore(
                topic="T",
                queue_id=queue_id,
                body=f"p{i}".encode(),
                properties=codec.encode_properties(p),
                tags_code=codec.tags_hash(p.get("TAGS", "")),
            )
            for i, p in enumerate(props)
        ]
    )


def _sql_request(
    expression: str, offset: int = 0, *, suspend_ms: int = 0, decoded: bool = False
) -> messaging_pb2.PullRequest:
    req = pull_request("T", offset, expression=expression, suspend_ms=suspend_ms)
    req.expression_type = SQL
    req.decoded = decoded
    return req


async def test_sql92_pull_returns_only_matching_messages(sq: BrokerParts) -> None:
    _append_props(sq, [{"a": str(i % 10), "TAGS": "X"} for i in range(40)])
    resp = await _pull(sq, _sql_request("a BETWEEN 0 AND 3 AND TAGS = 'X'"))
    assert resp.status == messaging_pb2.FOUND
    got = decode_records(resp.records)
    assert [m.properties["a"] for m in got] == ["0", "1", "2", "3"] * 4
    assert resp.next_begin_offset == 40
    decoded = await _pull(sq, _sql_request("a = 9", decoded=True))
    assert [m.queue_offset for m in decoded.messages] == [9, 19, 29, 39]


async def test_sql92_pull_walks_a_backlog_window_by_window(sq: BrokerParts) -> None:
    props = [{"a": "0"} for _ in range(2000)]
    props[1500] = {"a": "1"}
    _append_props(sq, props)
    first = await _pull(sq, _sql_request("a = 1"))
    assert first.status == messaging_pb2.NO_MATCHED_MSG
    assert 0 < first.next_begin_offset <= 1500
    offset, found = first.next_begin_offset, None
    for _ in range(10):
        resp = await _pull(sq, _sql_request("a = 1", offset))
        if resp.status == messaging_pb2.FOUND:
            found = resp
            break
        assert resp.status == messaging_pb2.NO_MATCHED_MSG
        offset = resp.next_begin_offset
    assert found is not None
    assert [m.queue_offset for m in _decoded(found)] == [1500]
    end = await _pull(sq, _sql_request("a = 1", found.next_begin_offset))
    assert end.status in (messaging_pb2.NO_MATCHED_MSG, messaging_pb2.NO_NEW_MSG)


def _decoded(resp: messaging_pb2.PullResponse) -> list[codec.Record]:
    return list(codec.iter_records(resp.records))


async def test_a_held_sql92_pull_wakes_only_for_a_matching_arrival(sq: BrokerParts) -> None:
    req = _sql_request("a > 5", suspend_ms=LONG_MS)
    task = asyncio.create_task(sq.puller.pull(req, None))
    await _settle()
    assert sq.hold.held_count() == 1
    _append_props(sq, [{"a": "1"}, {"b": "9"}, {"a": "x"}])
    await _settle()
    assert not task.done()  # three arrivals, none matching: still held
    _append_props(sq, [{"a": "6"}])
    resp = await task
    assert resp.status == messaging_pb2.FOUND
    assert [m.properties["a"] for m in decode_records(resp.records)] == ["6"]
    assert resp.next_begin_offset == 4


async def test_hold_service_applies_the_record_filter_after_the_tag_filter(sq: BrokerParts) -> None:
    seen: list[int] = []

    def record_filter(record: memoryview) -> bool:
        seen.append(len(record))
        props = codec.decode_properties(codec.record_properties_bytes(record))
        return props.get("a") == "yes"

    task = asyncio.create_task(
        sq.hold.hold("T", 0, 0, lambda code: code != 0, LONG_MS, record_filter=record_filter)
    )
    await _settle()
    _append_props(sq, [{"a": "yes"}])  # no tag: the tag filter says no, no record read
    _append_props(sq, [{"a": "no", "TAGS": "t"}])
    await _settle()
    assert not task.done() and len(seen) == 1
    _append_props(sq, [{"a": "yes", "TAGS": "t"}])
    assert await task is True
    assert len(seen) == 2


async def test_sql92_needs_the_property_filter(b: BrokerParts) -> None:
    b.append("T", 0)
    with pytest.raises(ServiceError) as err:
        await _pull(b, _sql_request("a > 1"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION
    assert "enablePropertyFilter=true" in err.value.message


async def test_sql92_syntax_error_in_a_pull_names_the_position(sq: BrokerParts) -> None:
    with pytest.raises(ServiceError) as err:
        await _pull(sq, _sql_request("a >> 5"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION
    assert err.value.metadata["position"] == "3"


def test_a_heartbeat_with_a_bad_sql92_subscription_is_refused(sq: BrokerParts) -> None:
    channel = sq.clients.open_channel("c1")
    hb = messaging_pb2.Heartbeat(
        client_id="c1",
        consumers=[
            messaging_pb2.ConsumerData(
                consumer_group="cg",
                subscriptions=[
                    messaging_pb2.SubscriptionData(
                        topic="T", expression="a BETWEEN 3 AND 1", expression_type=SQL
                    )
                ],
            )
        ],
    )
    with pytest.raises(ServiceError) as err:
        sq.clients.heartbeat(channel, hb)
    assert err.value.reason == common_pb2.ILLEGAL_EXPRESSION
    assert err.value.metadata["position"] == "10"
    assert sq.clients.subscription("cg", "T") is None


async def test_sql92_subscription_from_a_heartbeat_filters_pulls(sq: BrokerParts) -> None:
    channel = sq.clients.open_channel("c1")
    sq.clients.heartbeat(
        channel,
        messaging_pb2.Heartbeat(
            client_id="c1",
            consumers=[
                messaging_pb2.ConsumerData(
                    consumer_group="cg",
                    subscriptions=[
                        messaging_pb2.SubscriptionData(
                            topic="T", expression="k IN ('x')", expression_type=SQL
                        )
                    ],
                )
            ],
        ),
    )
    _append_props(sq, [{"k": "x"}, {"k": "y"}, {"k": "x"}])
    resp = await _pull(sq, pull_request("T", 0, flags=0))
    assert [m.queue_offset for m in _decoded(resp)] == [0, 2]


async def test_pulls_of_a_topic_the_group_disagrees_about_are_refused(b: BrokerParts) -> None:
    for client_id, expression in (("c1", "A"), ("c2", "B")):
        b.clients.heartbeat(
            b.clients.open_channel(client_id),
            messaging_pb2.Heartbeat(
                client_id=client_id,
                consumers=[
                    messaging_pb2.ConsumerData(
                        consumer_group="cg",
                        subscriptions=[
                            messaging_pb2.SubscriptionData(topic="T", expression=expression)
                        ],
                    )
                ],
            ),
        )
    with pytest.raises(ServiceError) as err:
        await _pull(b, pull_request("T", expression="A"))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.reason == common_pb2.SUBSCRIPTION_INCONSISTENT
