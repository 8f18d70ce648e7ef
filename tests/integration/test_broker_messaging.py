"""The broker's Messaging service over real processes and raw gRPC stubs (issue 3).

One nameserver and two brokers for the whole module: broker-a with RocketMQ's defaults
(auto-create on), broker-b with auto-create of topics and groups off and a 1 s client expiry.
Each test uses its own topic names, so tests do not see each other's messages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.message import decode_records
from tests.support.cluster import cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import at_least, until

pytestmark = pytest.mark.integration

FLAG_COMMIT, FLAG_SUSPEND, FLAG_SUB = 0x1, 0x2, 0x4
T = TypeVar("T")


@dataclass
class Brokers:
    a: str
    b: str


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with cluster(tmp_path_factory.mktemp("messaging")) as c:
        b = c.start_broker(
            "broker-b",
            autoCreateTopicEnable=False,
            autoCreateSubscriptionGroup=False,
            channelExpiredTimeout=1000,
            clientScanIntervalMs=200,
        )
        yield Brokers(c.broker.addr, b.addr)
        c.check_logs()


class Client(RawClient):
    """Request shorthands on the raw stubs."""

    async def send(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        queue_id: int = 0,
        props: dict[str, str] | None = None,
        auto_create: bool = True,
    ) -> messaging_pb2.SendResponse:
        resp: messaging_pb2.SendResponse = await self.messaging.Send(
            messaging_pb2.SendRequest(
                producer_group="pg",
                queue_id=queue_id,
                default_topic="TBW102" if auto_create else "",
                messages=[
                    common_pb2.Message(topic=topic, body=b, properties=props or {}) for b in bodies
                ],
            )
        )
        return resp

    async def pull(
        self,
        topic: str,
        offset: int,
        *,
        queue_id: int = 0,
        expression: str = "*",
        flags: int = FLAG_SUB,
        suspend_ms: int = 0,
        group: str = "cg",
        **fields: Any,
    ) -> messaging_pb2.PullResponse:
        resp: messaging_pb2.PullResponse = await self.messaging.Pull(
            messaging_pb2.PullRequest(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset,
                sys_flag=flags | (FLAG_SUSPEND if suspend_ms else 0),
                subscription=expression,
                suspend_timeout_ms=suspend_ms,
                **fields,
            ),
            timeout=30,
        )
        return resp


async def _empty(items: Awaitable[list[str]]) -> bool:
    return not await items


# -- send and pull ---------------------------------------------------------------------------
async def test_send_single_and_batch_then_pull_and_decode(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        one = await c.send("SendPull", [b"first"], props={"TAGS": "A", "KEYS": "k1 k2"})
        assert one.results[0].status == messaging_pb2.SEND_OK
        assert one.results[0].queue_offset == 0
        batch = await c.send("SendPull", [b"b1", b"b2", b"b3"], props={"TAGS": "B"})
        assert [r.queue_offset for r in batch.results] == [1, 2, 3]
        resp = await c.pull("SendPull", 0)
        assert resp.status == messaging_pb2.FOUND
        assert (resp.next_begin_offset, resp.min_offset, resp.max_offset) == (4, 0, 4)
        assert resp.suggest_which_broker_id == 0
        msgs = decode_records(resp.records)
        assert [m.body for m in msgs] == [b"first", b"b1", b"b2", b"b3"]
        assert [m.msg_id for m in msgs] == [r.msg_id for r in [*one.results, *batch.results]]
        assert msgs[0].keys == ["k1", "k2"] and msgs[0].tags == "A"
        assert msgs[0].born_host.startswith("127.0.0.1:")
        assert msgs[0].store_host == brokers.a
        decoded = await c.pull("SendPull", 1, decoded=True, max_msg_nums=2)
        assert [m.message.body for m in decoded.messages] == [b"b1", b"b2"]
        assert decoded.next_begin_offset == 3 and decoded.records == b""


async def test_offset_correction_cases(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        await c.send("Offsets", [b"x"], queue_id=1)  # creates the topic; queue 0 stays empty
        empty = await c.pull("Offsets", 0)
        assert (empty.status, empty.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, 0)
        moved = await c.pull("Offsets", 3)  # NO_MESSAGE_IN_QUEUE with offset != 0
        assert (moved.status, moved.next_begin_offset) == (messaging_pb2.OFFSET_ILLEGAL, 0)
        await c.send("Offsets", [b"a", b"b", b"c"], props={"TAGS": "T1"})
        found = await c.pull("Offsets", 1)
        assert found.status == messaging_pb2.FOUND and found.next_begin_offset == 3
        one = await c.pull("Offsets", 3)  # OFFSET_OVERFLOW_ONE
        assert (one.status, one.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, 3)
        badly = await c.pull("Offsets", 10)  # OFFSET_OVERFLOW_BADLY, min offset 0
        assert (badly.status, badly.next_begin_offset) == (messaging_pb2.OFFSET_ILLEGAL, 0)
        miss = await c.pull("Offsets", 0, expression="Other || T2")
        assert (miss.status, miss.next_begin_offset) == (messaging_pb2.NO_MATCHED_MSG, 3)
        assert miss.records == b""
        await c.send("Offsets", [b"d"], props={"TAGS": "T2"})
        hit = await c.pull("Offsets", 0, expression="Other || T2")
        assert [m.body for m in decode_records(hit.records)] == [b"d"]


async def test_long_polling_wakes_within_milliseconds_and_times_out(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        await c.send("LongPoll", [b"seed"])
        base = await c.held_pulls()
        held = asyncio.create_task(c.pull("LongPoll", 1, suspend_ms=15_000))
        await until(lambda: at_least(c.held_pulls(), base + 1), "the pull to be held")
        assert not held.done(), "the pull should be held until a message arrives"
        sent_at = time.monotonic()
        await c.send("LongPoll", [b"wake"])
        resp = await held
        woke_after_s = time.monotonic() - sent_at
        assert resp.status == messaging_pb2.FOUND
        assert [m.body for m in decode_records(resp.records)] == [b"wake"]
        assert woke_after_s < 1.0, f"long poll woke {woke_after_s:.3f} s after the send"

        # a message with a tag the pull does not want leaves it held
        held = asyncio.create_task(c.pull("LongPoll", 2, expression="Want", suspend_ms=15_000))
        await until(lambda: at_least(c.held_pulls(), base + 1), "the tagged pull to be held")
        checked = await c.arrivals_checked()
        await c.send("LongPoll", [b"other"], props={"TAGS": "Nope"})
        await until(
            lambda: at_least(c.arrivals_checked(), checked + 1), "the broker to check 'other'"
        )
        assert await c.held_pulls() > base  # looked at and left held
        assert not held.done()
        await c.send("LongPoll", [b"wanted"], props={"TAGS": "Want"})
        resp = await held
        assert [m.body for m in decode_records(resp.records)] == [b"wanted"]

        started = time.monotonic()
        resp = await c.pull("LongPoll", 4, suspend_ms=300)
        held_s = time.monotonic() - started
        assert (resp.status, resp.next_begin_offset) == (messaging_pb2.NO_NEW_MSG, 4)
        assert 0.25 <= held_s < 2.0, f"a 300 ms suspend held {held_s:.3f} s"


async def test_commit_offset_on_pull_and_offset_rpcs(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        before_ms = int(time.time() * 1000) - 1
        await c.send("OffsetRpc", [b"a", b"b", b"c"], queue_id=2)
        code, _, _ = await refused(
            c.messaging.QueryConsumerOffset(
                messaging_pb2.QueryConsumerOffsetRequest(
                    consumer_group="cg", topic="OffsetRpc", queue_id=2
                )
            )
        )
        assert code == grpc.StatusCode.NOT_FOUND
        await c.pull("OffsetRpc", 0, queue_id=2, flags=FLAG_SUB | FLAG_COMMIT, commit_offset=2)
        q = messaging_pb2.QueryConsumerOffsetRequest(
            consumer_group="cg", topic="OffsetRpc", queue_id=2
        )
        assert (await c.messaging.QueryConsumerOffset(q)).offset == 2
        await c.messaging.UpdateConsumerOffset(
            messaging_pb2.UpdateConsumerOffsetRequest(
                consumer_group="cg", topic="OffsetRpc", queue_id=2, commit_offset=1
            )
        )
        assert (await c.messaging.QueryConsumerOffset(q)).offset == 1  # overwritten, even if less
        mx = await c.messaging.GetMaxOffset(
            messaging_pb2.GetMaxOffsetRequest(topic="OffsetRpc", queue_id=2)
        )
        mn = await c.messaging.GetMinOffset(
            messaging_pb2.GetMinOffsetRequest(topic="OffsetRpc", queue_id=2)
        )
        assert (mn.offset, mx.offset) == (0, 3)
        search = messaging_pb2.SearchOffsetByTimestampRequest
        early = await c.messaging.SearchOffsetByTimestamp(search(topic="OffsetRpc", queue_id=2))
        late = await c.messaging.SearchOffsetByTimestamp(
            search(topic="OffsetRpc", queue_id=2, timestamp_ms=before_ms + 3_600_000)
        )
        assert (early.offset, late.offset) == (0, 3)
        for call in (
            c.messaging.GetMaxOffset(messaging_pb2.GetMaxOffsetRequest(topic="NoSuch", queue_id=0)),
            c.messaging.UpdateConsumerOffset(
                messaging_pb2.UpdateConsumerOffsetRequest(
                    consumer_group="cg", topic="NoSuch", queue_id=0, commit_offset=1
                )
            ),
        ):
            assert (await refused(call))[0] == grpc.StatusCode.NOT_FOUND
        for call in (
            c.messaging.GetMinOffset(
                messaging_pb2.GetMinOffsetRequest(topic="OffsetRpc", queue_id=9)
            ),
            c.messaging.SearchOffsetByTimestamp(
                search(topic="OffsetRpc", queue_id=0, timestamp_ms=-1)
            ),
            c.messaging.UpdateConsumerOffset(
                messaging_pb2.UpdateConsumerOffsetRequest(
                    consumer_group="cg", topic="OffsetRpc", queue_id=0, commit_offset=-5
                )
            ),
        ):
            assert (await refused(call))[0] == grpc.StatusCode.INVALID_ARGUMENT


# -- queries ---------------------------------------------------------------------------------
async def test_query_by_key_id_and_offset_id(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        first = await c.send("Query", [b"v1"], props={"KEYS": "order-7 other"})
        second = await c.send("Query", [b"v2"], props={"KEYS": "order-7"})
        await c.send("Query", [b"v3"], props={"KEYS": "order-8"})
        by_key = await c.messaging.QueryMessageByKey(
            messaging_pb2.QueryMessageByKeyRequest(topic="Query", key="order-7")
        )
        assert [m.message.body for m in by_key.messages] == [b"v2", b"v1"]  # newest first
        limited = await c.messaging.QueryMessageByKey(
            messaging_pb2.QueryMessageByKeyRequest(topic="Query", key="order-7", max_num=1)
        )
        assert len(limited.messages) == 1
        none = await c.messaging.QueryMessageByKey(
            messaging_pb2.QueryMessageByKeyRequest(topic="Query", key="missing")
        )
        assert list(none.messages) == []
        msg_id = first.results[0].msg_id
        by_id = await c.messaging.QueryMessageById(
            messaging_pb2.QueryMessageByIdRequest(topic="Query", msg_id=msg_id)
        )
        assert [m.msg_id for m in by_id.messages] == [msg_id]
        view = await c.messaging.ViewMessage(
            messaging_pb2.ViewMessageRequest(offset_msg_id=second.results[0].offset_msg_id)
        )
        assert view.message.message.body == b"v2"
        assert view.message.offset_msg_id == second.results[0].offset_msg_id
        host, offset = codec.decode_offset_msg_id(second.results[0].offset_msg_id)
        missing = codec.encode_offset_msg_id(host, offset + 10**9)
        code, reason, _ = await refused(
            c.messaging.ViewMessage(messaging_pb2.ViewMessageRequest(offset_msg_id=missing))
        )
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, common_pb2.MESSAGE_NOT_FOUND)
        inside = codec.encode_offset_msg_id(host, offset + 3)  # not a record start
        code, _, _ = await refused(
            c.messaging.ViewMessage(messaging_pb2.ViewMessageRequest(offset_msg_id=inside))
        )
        assert code == grpc.StatusCode.NOT_FOUND
        code, reason, _ = await refused(
            c.messaging.QueryMessageById(
                messaging_pb2.QueryMessageByIdRequest(topic="Query", msg_id="0" * 32)
            )
        )
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, common_pb2.MESSAGE_NOT_FOUND)
        for call in (
            c.messaging.ViewMessage(messaging_pb2.ViewMessageRequest(offset_msg_id="zz")),
            c.messaging.QueryMessageById(
                messaging_pb2.QueryMessageByIdRequest(topic="Query", msg_id="123")
            ),
            c.messaging.QueryMessageByKey(
                messaging_pb2.QueryMessageByKeyRequest(topic="Query", key="k", max_num=65)
            ),
            c.messaging.QueryMessageByKey(messaging_pb2.QueryMessageByKeyRequest(topic="Query")),
        ):
            assert (await refused(call))[0] == grpc.StatusCode.INVALID_ARGUMENT


# -- client stream ---------------------------------------------------------------------------
def _heartbeat(client_id: str, group: str = "stream-group") -> messaging_pb2.ClientStreamRequest:
    return messaging_pb2.ClientStreamRequest(
        heartbeat=messaging_pb2.Heartbeat(
            client_id=client_id,
            consumers=[
                messaging_pb2.ConsumerData(
                    consumer_group=group,
                    subscriptions=[
                        messaging_pb2.SubscriptionData(topic="StreamTopic", expression="A")
                    ],
                )
            ],
        )
    )


async def _read(call: Any, timeout_s: float = 5.0) -> messaging_pb2.ClientStreamResponse:
    msg = await asyncio.wait_for(call.read(), timeout_s)
    assert msg is not grpc.aio.EOF, "the broker ended the stream"
    assert isinstance(msg, messaging_pb2.ClientStreamResponse)
    return msg


async def _end_code(call: Any) -> grpc.StatusCode:
    """Read until the stream ends; its status code."""
    try:
        while await asyncio.wait_for(call.read(), 5) is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as err:
        return err.code()
    code = await call.code()
    assert isinstance(code, grpc.StatusCode)
    return code


async def _next_ids(call: Any) -> list[str]:
    """Skip heartbeat acks; the ids of the next ConsumerIdsChanged."""
    while True:
        msg = await _read(call)
        if msg.HasField("consumer_ids_changed"):
            return list(msg.consumer_ids_changed.consumer_ids)


async def test_client_stream_heartbeats_and_membership_notices(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        first = c.messaging.ClientStream()
        await first.write(_heartbeat("client-1"))
        ack = await _read(first)
        assert ack.heartbeat_ack.expire_timestamp_ms > time.time() * 1000
        assert await _next_ids(first) == ["client-1"]

        ids = await c.messaging.GetConsumerIdList(
            messaging_pb2.GetConsumerIdListRequest(consumer_group="stream-group")
        )
        assert list(ids.consumer_ids) == ["client-1"]

        second = c.messaging.ClientStream()
        await second.write(_heartbeat("client-0"))
        assert await _next_ids(first) == ["client-0", "client-1"]  # sorted
        assert await _next_ids(second) == ["client-0", "client-1"]

        # the heartbeat carried the subscription: a pull without FLAG_SUBSCRIPTION uses it
        await c.send("StreamTopic", [b"no"], props={"TAGS": "B"})
        await c.send("StreamTopic", [b"yes"], props={"TAGS": "A"})
        resp = await c.pull("StreamTopic", 0, flags=0, group="stream-group")
        assert [m.body for m in decode_records(resp.records)] == [b"yes"]

        await second.done_writing()  # the second client leaves
        assert await _next_ids(first) == ["client-1"]
        assert await asyncio.wait_for(second.read(), 5) is grpc.aio.EOF

        await first.write(
            messaging_pb2.ClientStreamRequest(
                unregister=messaging_pb2.UnregisterClient(client_id="client-1")
            )
        )

        async def consumer_ids() -> list[str]:
            ids = await c.messaging.GetConsumerIdList(
                messaging_pb2.GetConsumerIdListRequest(consumer_group="stream-group")
            )
            return list(ids.consumer_ids)

        await until(lambda: _empty(consumer_ids()), "client-1 to leave stream-group", 2.5)
        assert await consumer_ids() == []
        first.cancel()


async def test_client_stream_must_start_with_a_heartbeat(brokers: Brokers) -> None:
    async with Client(brokers.a) as c:
        call = c.messaging.ClientStream()
        await call.write(
            messaging_pb2.ClientStreamRequest(
                unregister=messaging_pb2.UnregisterClient(client_id="x")
            )
        )
        assert await _end_code(call) == grpc.StatusCode.INVALID_ARGUMENT
        bad = c.messaging.ClientStream()
        await bad.write(_heartbeat("c", group="bad group!"))
        assert await _end_code(bad) == grpc.StatusCode.INVALID_ARGUMENT
        empty_id = c.messaging.ClientStream()
        await empty_id.write(_heartbeat(""))
        assert await _end_code(empty_id) == grpc.StatusCode.INVALID_ARGUMENT
        await c.send("StillServing", [b"x"])


async def test_silent_client_expires(brokers: Brokers) -> None:
    async with Client(brokers.b) as c:
        call = c.messaging.ClientStream()
        await call.write(_heartbeat("quiet", group="quiet-group"))
        await _read(call)
        started = time.monotonic()
        while True:  # the broker ends the stream ~1 s after the last heartbeat
            msg = await asyncio.wait_for(call.read(), 10)
            if msg is grpc.aio.EOF:
                break
        assert time.monotonic() - started < 5
        ids = await c.messaging.GetConsumerIdList(
            messaging_pb2.GetConsumerIdListRequest(consumer_group="quiet-group")
        )
        assert list(ids.consumer_ids) == []


# -- bad input -------------------------------------------------------------------------------
async def test_bad_sends_are_refused_and_the_broker_keeps_serving(brokers: Brokers) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    async with Client(brokers.a) as c:
        await c.send("Good", [b"ok"])
        cases: list[tuple[Awaitable[Any], grpc.StatusCode, int]] = [
            (c.send("bad topic!", [b"x"]), invalid, common_pb2.ILLEGAL_ARGUMENT),
            (c.send("t" * 128, [b"x"]), invalid, common_pb2.ILLEGAL_ARGUMENT),
            (c.send("Good", [b""]), invalid, common_pb2.ILLEGAL_ARGUMENT),
            (
                c.send("Good", [b"x" * (4 * 1024 * 1024 + 1)]),
                invalid,
                common_pb2.MESSAGE_TOO_LARGE,
            ),
            (c.send("Good", [b"x" * (1024 * 1024)] * 5), invalid, common_pb2.MESSAGE_TOO_LARGE),
            (c.send("Good", [b"x"], queue_id=4), invalid, common_pb2.ILLEGAL_ARGUMENT),
            (c.send("Good", [b"x"], queue_id=-1), invalid, common_pb2.ILLEGAL_ARGUMENT),
            (
                c.send("Good", [b"x"], props={"DELAY": "40"}),
                invalid,
                common_pb2.ILLEGAL_ARGUMENT,
            ),
            (
                c.send("Good", [b"x"], props={"TIMER_DELAY_MS": str(4 * 86_400_000)}),
                invalid,  # beyond timerMaxDelaySec (3 days)
                common_pb2.ILLEGAL_ARGUMENT,
            ),
            (
                c.send("Good", [b"x", b"y"], props={"DELAY": "2"}),
                invalid,  # a batch may not be delayed
                common_pb2.ILLEGAL_ARGUMENT,
            ),
            (
                c.send("Unknown", [b"x"], auto_create=False),
                grpc.StatusCode.NOT_FOUND,
                common_pb2.TOPIC_NOT_EXIST,
            ),
            (
                c.messaging.Send(messaging_pb2.SendRequest(queue_id=0)),
                invalid,
                common_pb2.ILLEGAL_ARGUMENT,
            ),
        ]
        mixed = messaging_pb2.SendRequest(
            queue_id=0,
            messages=[
                common_pb2.Message(topic="Good", body=b"a"),
                common_pb2.Message(topic="Other", body=b"b"),
            ],
        )
        cases.append((c.messaging.Send(mixed), invalid, common_pb2.ILLEGAL_ARGUMENT))
        for call, code, reason in cases:
            got = await refused(call)
            assert got[:2] == (code, reason), got
        delayed = await c.send("Good", [b"later"], props={"DELAY": "2"})
        assert delayed.results[0].status == messaging_pb2.SEND_OK  # waits in the timer topic
        after = await c.send("Good", [b"still here"])
        assert after.results[0].queue_offset == 1  # nothing refused (or delayed) is in Good


async def test_bad_pulls_and_unsupported_rpcs(brokers: Brokers) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    async with Client(brokers.a) as c:
        await c.send("PullBad", [b"x"])
        cases: list[tuple[Awaitable[Any], grpc.StatusCode]] = [
            (c.pull("bad topic!", 0), invalid),
            (c.pull("PullBad", 0, group="bad group!"), invalid),
            (c.pull("PullBad", -1), invalid),
            (c.pull("PullBad", 0, queue_id=4), invalid),
            (c.pull("PullBad", 0, max_msg_nums=0), invalid),
            (c.pull("PullBad", 0, flags=FLAG_SUB | 0x8), invalid),
            (c.pull("PullBad", 0, expression="||"), invalid),
            (
                c.pull("PullBad", 0, expression="a > 1", expression_type=common_pb2.SQL92),
                invalid,
            ),
            (
                c.pull("PullBad", 0, flags=0, group="nobody-heartbeats"),
                grpc.StatusCode.FAILED_PRECONDITION,
            ),
            (c.pull("NoSuchTopic", 0), grpc.StatusCode.NOT_FOUND),
            (
                c.messaging.LockBatch(messaging_pb2.LockBatchRequest(consumer_group="g")),
                invalid,
            ),
            (
                c.messaging.UnlockBatch(messaging_pb2.UnlockBatchRequest(consumer_group="g")),
                invalid,
            ),
            (
                c.messaging.ConsumerSendBack(messaging_pb2.ConsumerSendBackRequest()),
                invalid,
            ),
            (
                c.messaging.EndTransaction(messaging_pb2.EndTransactionRequest()),
                invalid,
            ),
            (
                c.messaging.GetConsumerIdList(
                    messaging_pb2.GetConsumerIdListRequest(consumer_group="")
                ),
                invalid,
            ),
        ]
        for call, code in cases:
            got = await refused(call)
            assert got[0] == code, got
        resp = await c.pull("PullBad", 0)
        assert resp.status == messaging_pb2.FOUND


async def test_auto_create_off_refuses_unknown_topics_and_groups(brokers: Brokers) -> None:
    async with Client(brokers.b) as c:
        code, reason, message = await refused(c.send("NotThere", [b"x"]))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, common_pb2.TOPIC_NOT_EXIST)
        assert "autoCreateTopicEnable" in message
        # SELF_TEST_TOPIC exists on every broker; the group does not
        await c.send("SELF_TEST_TOPIC", [b"x"], auto_create=False)
        code, reason, _ = await refused(c.pull("SELF_TEST_TOPIC", 0, group="no-such-group"))
        assert (code, reason) == (
            grpc.StatusCode.NOT_FOUND,
            common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
        )
