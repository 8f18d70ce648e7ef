"""Pure parts of the consumer runtime: subscriptions, start offsets, results, flow control,
pull handling and rebalance decisions, with fakes in place of brokers (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.consumer import LitePullConsumer, PushConsumer
from rocketq.client.consumer._common import SubscriptionConflicts, conflict_from_pb
from rocketq.client.consumer._consume import ConsumeService, ack_index_for, reset_retry_topic
from rocketq.client.consumer._pull import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    Puller,
    PullResult,
    PullService,
    PullSettings,
    build_sys_flag,
    flow_control_reason,
)
from rocketq.client.consumer._rebalance import (
    PullRequest,
    RebalanceImpl,
    RebalanceService,
    compute_pull_from_where,
)
from rocketq.client.consumer._subscription import build_subscription, filter_by_tags, parse_tags
from rocketq.client.consumer.allocate import AllocateAveragely
from rocketq.client.consumer.config import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeResult,
    ExpressionType,
    LitePullConsumerConfig,
    MessageModel,
    PushConsumerConfig,
    SubscriptionConflict,
    clamp_suspend_ms,
    format_consume_timestamp,
    parse_consume_timestamp,
)
from rocketq.client.consumer.offset_store import ReadOffsetType
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.errors import BrokerUnavailableError, FailedPreconditionError
from rocketq.message import MessageQueue, ReceivedMessage

pytestmark = pytest.mark.unit

MQ = MessageQueue("T", "broker-a", 0)
MIB = 1024 * 1024


def msg(offset: int, tags: str = "", topic: str = "T", body: bytes = b"x") -> ReceivedMessage:
    props = {codec.Prop.TAGS: tags} if tags else {}
    return ReceivedMessage(
        topic=topic,
        body=body,
        properties=props,
        queue_id=0,
        queue_offset=offset,
        commitlog_offset=1000 + offset,
        msg_id=f"id{offset}",
        offset_msg_id="",
        born_timestamp_ms=0,
        store_timestamp_ms=0,
        born_host="",
        store_host="",
        broker_name="broker-a",
    )


# ---- subscriptions (SPEC §6.17) ----------------------------------------------------------------


@pytest.mark.parametrize("expr", ["*", "", "  *  ", None])
def test_star_and_empty_mean_everything(expr: str | None) -> None:
    sub = build_subscription("T", expr)
    assert sub.expression == "*"
    assert sub.is_all
    assert sub.matches("") and sub.matches("anything")


def test_tag_expression_is_split_trimmed_and_hashed() -> None:
    sub = build_subscription("T", " TagA ||TagB||  TagA || ")
    assert sub.tags == {"TagA", "TagB"}
    assert sub.expression == "TagA || TagB"
    assert sub.tag_hashes == {codec.tags_hash("TagA"), codec.tags_hash("TagB")}
    assert sub.matches("TagA") and sub.matches("TagB")
    assert not sub.matches("TagC")
    assert not sub.matches("")  # an untagged message only passes "*"
    assert not sub.matches("taga")  # tags are case-sensitive


def test_blank_tag_list_and_bad_topic_are_refused() -> None:
    with pytest.raises(ValueError, match="names no tag"):
        parse_tags(" || ")
    with pytest.raises(ValueError):
        build_subscription("bad topic!", "*")


def test_sql92_is_passed_through_and_not_refiltered() -> None:
    sub = build_subscription("T", "a > 5", ExpressionType.SQL92)
    assert sub.expression == "a > 5" and not sub.tags
    assert sub.to_pb().expression_type == sub.expression_type_pb
    assert sub.matches("whatever")
    with pytest.raises(ValueError):
        build_subscription("T", "  ", ExpressionType.SQL92)


def test_client_refilter_drops_hash_collisions_and_untagged() -> None:
    sub = build_subscription("T", "A || B")
    msgs = [msg(0, "A"), msg(1, "C"), msg(2, ""), msg(3, "B")]
    assert [m.queue_offset for m in filter_by_tags(msgs, sub)] == [0, 3]
    assert len(filter_by_tags(msgs, build_subscription("T", "*"))) == 4


def test_retry_messages_show_their_original_topic() -> None:
    m = msg(0, topic="%RETRY%g")
    m.properties[codec.Prop.RETRY_TOPIC] = "Orders"
    other = msg(1, topic="%RETRY%other")
    other.properties[codec.Prop.RETRY_TOPIC] = "X"
    reset_retry_topic([m, other], "g")
    assert m.topic == "Orders"
    assert other.topic == "%RETRY%other"


# ---- configuration (SPEC §6.2) -----------------------------------------------------------------


def test_push_defaults_are_rocketmqs() -> None:
    cfg = PushConsumerConfig("g", ("127.0.0.1:9876",))
    assert cfg.message_model is MessageModel.CLUSTERING
    assert cfg.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    assert (cfg.pull_batch_size, cfg.consume_message_batch_max_size) == (32, 1)
    assert (cfg.consume_thread_max, cfg.pull_threshold_for_queue) == (20, 1000)
    assert cfg.pull_threshold_size_for_queue_mib == 100
    assert cfg.consume_concurrently_max_span == 2000
    assert (cfg.pull_interval_ms, cfg.rebalance_interval_ms) == (0, 20_000)
    assert cfg.persist_consumer_offset_interval_ms == 5_000
    assert (cfg.consume_timeout_minutes, cfg.broker_suspend_max_time_ms) == (15, 15_000)
    ago_s = time.time() - parse_consume_timestamp(cfg.consume_timestamp) / 1000
    assert 29 * 60 <= ago_s <= 31 * 60


def test_config_parses_namesrv_string_and_refuses_bad_values() -> None:
    cfg = LitePullConsumerConfig("g", "a:1;b:2")  # type: ignore[arg-type]
    assert cfg.namesrv_addrs == ("a:1", "b:2")
    assert cfg.pull_batch_size == 10 and cfg.broker_suspend_max_time_ms == 20_000
    with pytest.raises(ValueError):
        PushConsumerConfig("g", ("a:1",), consume_message_batch_max_size=0)
    with pytest.raises(ValueError, match="exceed"):
        PushConsumerConfig("g", ("a:1",), consumer_timeout_when_suspend_ms=15_000)
    with pytest.raises(ValueError, match="yyyyMMddHHmmss"):
        PushConsumerConfig("g", ("a:1",), consume_timestamp="2021-07-01")
    with pytest.raises(ValueError):
        PushConsumerConfig("bad group!", ("a:1",))
    with pytest.raises(ValueError):
        PushConsumerConfig("g", ())


def test_consume_timestamp_round_trips_in_local_time() -> None:
    assert format_consume_timestamp(parse_consume_timestamp("20210701080000")) == "20210701080000"


# ---- computePullFromWhere (SPEC §6.12) ---------------------------------------------------------


class FakeOffsets:
    def __init__(self, stored: int, fail: bool = False) -> None:
        self.stored = stored
        self.fail = fail
        self.asked: list[tuple[str, int]] = []

    async def read_stored(self, mq: MessageQueue) -> int:
        return self.stored

    async def max_offset(self, mq: MessageQueue) -> int:
        if self.fail:
            raise BrokerUnavailableError("down")
        return 900

    async def min_offset(self, mq: MessageQueue) -> int:
        return 100

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        self.asked.append(("ts", timestamp_ms))
        return 500


def start(mq: MessageQueue, where: ConsumeFromWhere, source: FakeOffsets, ts: int = 7) -> int:
    return asyncio.run(compute_pull_from_where(mq, where, ts, source))


@pytest.mark.parametrize("where", list(ConsumeFromWhere))
def test_a_stored_offset_always_wins(where: ConsumeFromWhere) -> None:
    assert start(MQ, where, FakeOffsets(42)) == 42
    assert start(MQ, where, FakeOffsets(0)) == 0


def test_first_start_follows_consume_from_where() -> None:
    assert start(MQ, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, FakeOffsets(-1)) == 900
    assert start(MQ, ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, FakeOffsets(-1)) == 100
    src = FakeOffsets(-1)
    assert start(MQ, ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, src, ts=1234) == 500
    assert src.asked == [("ts", 1234)]


@pytest.mark.parametrize("where", list(ConsumeFromWhere))
def test_retry_topic_starts_at_zero(where: ConsumeFromWhere) -> None:
    assert start(MessageQueue("%RETRY%g", "broker-a", 0), where, FakeOffsets(-1)) == 0


def test_unreadable_offsets_postpone_the_queue() -> None:
    assert start(MQ, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, FakeOffsets(-2)) == -1
    src = FakeOffsets(-1, fail=True)
    assert start(MQ, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, src) == -1


# ---- result processing (SPEC §6.11) ------------------------------------------------------------


def test_ack_index() -> None:
    ctx = ConsumeContext(MQ)
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ctx, 4) == 3
    assert ack_index_for(ConsumeResult.RECONSUME_LATER, ctx, 4) == -1
    assert ack_index_for(None, ctx, 4) == -1
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ, ack_index=1), 4) == 1
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ, ack_index=9), 4) == 3


class MemoryOffsets:
    """A minimal in-memory OffsetStore."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}
        self.persisted: list[MessageQueue] = []

    async def load(self) -> None:
        pass

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        old = self.table.get(mq)
        if increase_only and old is not None and offset < old:
            return
        self.table[mq] = offset

    async def read_offset(self, mq: MessageQueue, type_: ReadOffsetType) -> int:
        return self.table.get(mq, -1)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        self.persisted += list(mqs)

    async def persist(self, mq: MessageQueue) -> None:
        self.persisted.append(mq)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return dict(self.table)


def service(
    model: MessageModel,
    offsets: MemoryOffsets,
    send_back_ok: bool = False,
    listener: Any = None,
    batch: int = 1,
) -> tuple[ConsumeService, list[int]]:
    sent: list[int] = []

    async def send_back(mq: MessageQueue, m: ReceivedMessage, delay_level: int) -> bool:
        sent.append(m.queue_offset)
        return send_back_ok

    svc = ConsumeService(
        group="g",
        listener=listener or (lambda msgs, ctx: ConsumeResult.CONSUME_SUCCESS),
        message_model=model,
        batch_max_size=batch,
        thread_max=4,
        offset_store=offsets,
        send_back=send_back,
        consume_timeout_ms=1000,
        local_retry_delay_s=0.0,
    )
    return svc, sent


async def idle(svc: ConsumeService) -> None:
    """Wait for every submitted batch, then shut the service down."""
    while svc._tasks:
        await asyncio.wait(list(svc._tasks), timeout=10)
    await svc.shutdown(0)


def test_offset_stays_at_smallest_in_flight() -> None:
    """SPEC §15: a, b, c, d consumed with d first keeps the offset at a."""

    async def main() -> None:
        offsets = MemoryOffsets()
        svc, _ = service(MessageModel.CLUSTERING, offsets)
        pq = ProcessQueue()
        a, b, c, d = (msg(i) for i in range(10, 14))
        pq.put_messages([a, b, c, d])
        ok = ConsumeResult.CONSUME_SUCCESS
        await svc.process_consume_result(ok, ConsumeContext(MQ), [d], pq, MQ)
        assert offsets.table[MQ] == 10
        await svc.process_consume_result(ok, ConsumeContext(MQ), [b, c], pq, MQ)
        assert offsets.table[MQ] == 10
        await svc.process_consume_result(ok, ConsumeContext(MQ), [a], pq, MQ)
        assert offsets.table[MQ] == 14
        await svc.shutdown(0)

    asyncio.run(main())


def test_broadcasting_drops_failures_without_send_back() -> None:
    async def main() -> None:
        offsets = MemoryOffsets()
        svc, sent = service(MessageModel.BROADCASTING, offsets)
        pq = ProcessQueue()
        batch = [msg(0), msg(1)]
        pq.put_messages(batch)
        await svc.process_consume_result(
            ConsumeResult.RECONSUME_LATER, ConsumeContext(MQ), batch, pq, MQ
        )
        assert sent == []
        assert pq.msg_count == 0 and offsets.table[MQ] == 2
        assert svc.consumed_failed == 2
        await svc.shutdown(0)

    asyncio.run(main())


def test_clustering_sent_back_failures_release_the_offset() -> None:
    async def main() -> None:
        offsets = MemoryOffsets()
        svc, sent = service(MessageModel.CLUSTERING, offsets, send_back_ok=True)
        pq = ProcessQueue()
        batch = [msg(0), msg(1), msg(2)]
        pq.put_messages(batch)
        ctx = ConsumeContext(MQ, ack_index=0)
        await svc.process_consume_result(ConsumeResult.CONSUME_SUCCESS, ctx, batch, pq, MQ)
        assert sent == [1, 2]
        assert offsets.table[MQ] == 3 and pq.msg_count == 0
        await svc.shutdown(0)

    asyncio.run(main())


def test_failed_send_back_retries_locally_and_holds_the_offset() -> None:
    async def main() -> None:
        offsets = MemoryOffsets()
        calls: list[tuple[int, int]] = []
        done = asyncio.Event()

        def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            calls.append((msgs[0].queue_offset, msgs[0].reconsume_times))
            if len(calls) == 2:
                loop.call_soon_threadsafe(done.set)
            return (
                ConsumeResult.RECONSUME_LATER if len(calls) == 1 else ConsumeResult.CONSUME_SUCCESS
            )

        loop = asyncio.get_running_loop()
        svc, sent = service(MessageModel.CLUSTERING, offsets, listener=listener)
        pq = ProcessQueue()
        m0, m1 = msg(0), msg(1)
        pq.put_messages([m0, m1])
        await svc.process_consume_result(
            ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ), [m1], pq, MQ
        )
        assert offsets.table[MQ] == 0
        svc.submit([m0], pq, MQ, True)
        await asyncio.wait_for(done.wait(), 10)
        await svc.shutdown(5000)
        assert sent == [0]
        assert calls == [(0, 0), (0, 1)]  # redelivered locally with reconsume_times + 1
        assert offsets.table[MQ] == 2

    asyncio.run(main())


def test_results_of_a_dropped_queue_are_ignored() -> None:
    async def main() -> None:
        offsets = MemoryOffsets()
        finished = asyncio.Event()

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            pq.dropped = True  # rebalanced away while consuming
            finished.set()
            return ConsumeResult.CONSUME_SUCCESS

        svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
        pq = ProcessQueue()
        pq.put_messages([msg(0)])
        svc.submit([msg(0)], pq, MQ, True)
        await asyncio.wait_for(finished.wait(), 10)
        await svc.shutdown(5000)
        assert MQ not in offsets.table

    asyncio.run(main())


def test_batches_split_by_consume_message_batch_max_size() -> None:
    async def main() -> None:
        offsets = MemoryOffsets()
        sizes: list[int] = []

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            sizes.append(len(msgs))
            assert ctx.message_queue == MQ
            return ConsumeResult.CONSUME_SUCCESS

        svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener, batch=3)
        pq = ProcessQueue()
        batch = [msg(i) for i in range(7)]
        pq.put_messages(batch)
        svc.submit(batch, pq, MQ, True)
        await idle(svc)
        assert sorted(sizes) == [1, 3, 3]
        assert offsets.table[MQ] == 7

    asyncio.run(main())


def test_listener_exception_and_bad_return_mean_reconsume_later() -> None:
    async def main() -> None:
        offsets = MemoryOffsets()

        def boom(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            raise RuntimeError("business failure")

        svc, sent = service(MessageModel.CLUSTERING, offsets, send_back_ok=True, listener=boom)
        pq = ProcessQueue()
        pq.put_messages([msg(0)])
        svc.submit([msg(0)], pq, MQ, True)
        await idle(svc)
        assert sent == [0] and offsets.table[MQ] == 1

        svc2, sent2 = service(
            MessageModel.CLUSTERING, offsets, send_back_ok=True, listener=lambda m, c: "ok"
        )
        pq2 = ProcessQueue()
        pq2.put_messages([msg(5)])
        svc2.submit([msg(5)], pq2, MQ, True)
        await idle(svc2)
        assert sent2 == [5]

    asyncio.run(main())


# ---- flow control and sys flags (SPEC §6.6) ----------------------------------------------------


def limits(**kw: int | None) -> str | None:
    args: dict[str, Any] = {
        "msg_count": 0,
        "size_bytes": 0,
        "span": 0,
        "threshold_count": 1000,
        "threshold_size_mib": 100,
        "max_span": 2000,
    }
    args.update(kw)
    return flow_control_reason(**args)


def test_flow_control_thresholds() -> None:
    assert limits() is None
    assert limits(msg_count=1000, size_bytes=100 * MIB, span=2000) is None
    reason = limits(msg_count=1001)
    assert reason is not None and "count" in reason
    reason = limits(size_bytes=100 * MIB + 1)
    assert reason is not None and "MiB" in reason
    reason = limits(span=2001)
    assert reason is not None and "span" in reason
    assert limits(span=5000, max_span=None) is None


def test_sys_flags() -> None:
    assert build_sys_flag(commit_offset=True, suspend=True, subscription=True) == 0x7
    assert build_sys_flag(commit_offset=False, suspend=True, subscription=True) == (
        FLAG_SUSPEND | FLAG_SUBSCRIPTION
    )
    assert FLAG_COMMIT_OFFSET == 0x1


# ---- pulling -----------------------------------------------------------------------------------


def record(offset: int, tags: str) -> bytes:
    props = codec.encode_properties({codec.Prop.TAGS: tags} if tags else {})
    return codec.encode_record(
        topic_bytes=b"T",
        body=b"body",
        properties=props,
        queue_id=0,
        flag=0,
        queue_offset=offset,
        physical_offset=offset * 100,
        sys_flag=0,
        born_timestamp_ms=1,
        born_host=codec.LOCALHOST,
        store_timestamp_ms=2,
        store_host=codec.LOCALHOST,
    )


class FakeApi:
    def __init__(self, resp: messaging_pb2.PullResponse, slave: bool = False) -> None:
        self.resp = resp
        self.slave = slave
        self.requests: list[messaging_pb2.PullRequest] = []

    async def pull_addr(self, mq: MessageQueue, broker_id: int) -> tuple[str, bool]:
        return "addr", self.slave

    async def pull(
        self, addr: str, request: messaging_pb2.PullRequest, timeout_ms: int
    ) -> messaging_pb2.PullResponse:
        self.requests.append(request)
        return self.resp


def run_pull(api: FakeApi, expr: str, commit_offset: int) -> tuple[PullResult, PullRequest]:
    puller = Puller(api, "g", 4)  # type: ignore[arg-type]
    req = PullRequest(MQ, ProcessQueue(), 10)
    sub = build_subscription("T", expr)

    async def main() -> PullResult:
        return await puller.pull(
            req, sub, max_nums=32, commit_offset=commit_offset, suspend_ms=15000, timeout_ms=30000
        )

    return asyncio.run(main()), req


def test_puller_builds_the_request_and_refilters_by_tag_string() -> None:
    resp = messaging_pb2.PullResponse(
        status=messaging_pb2.FOUND,
        next_begin_offset=13,
        min_offset=0,
        max_offset=20,
        suggest_which_broker_id=1,
        records=record(10, "A") + record(11, "Z") + record(12, "B"),
    )
    api = FakeApi(resp)
    result, req = run_pull(api, "A || B", commit_offset=7)
    sent = api.requests[0]
    assert sent.sys_flag == FLAG_COMMIT_OFFSET | FLAG_SUSPEND | FLAG_SUBSCRIPTION
    assert (sent.commit_offset, sent.queue_offset, sent.suspend_timeout_ms) == (7, 10, 15000)
    assert sent.subscription == "A || B" and sent.max_msg_nums == 32
    assert [m.queue_offset for m in result.messages] == [10, 12]
    assert result.first_offset == 10 and result.next_begin_offset == 13
    assert result.messages[0].broker_name == "broker-a"
    assert result.messages[0].properties[codec.Prop.MAX_OFFSET] == "20"
    assert req.broker_id == 1  # the next pull goes where the broker suggested


def test_puller_drops_commit_offset_for_slaves_and_for_no_offset() -> None:
    resp = messaging_pb2.PullResponse(status=messaging_pb2.NO_NEW_MSG, next_begin_offset=10)
    api = FakeApi(resp, slave=True)
    run_pull(api, "*", commit_offset=7)
    assert api.requests[0].sys_flag & FLAG_COMMIT_OFFSET == 0
    api = FakeApi(resp)
    run_pull(api, "*", commit_offset=-1)
    assert api.requests[0].sys_flag & FLAG_COMMIT_OFFSET == 0


def pull_service(offsets: MemoryOffsets, submitted: list[Any], removed: list[Any]) -> PullService:
    async def remove(mq: MessageQueue) -> None:
        removed.append(mq)

    async def heartbeat() -> None:
        pass

    settings = PullSettings(
        clustering=True,
        pull_batch_size=32,
        pull_interval_ms=0,
        pull_threshold_for_queue=2,
        pull_threshold_size_for_queue_mib=100,
        consume_concurrently_max_span=2000,
        broker_suspend_max_time_ms=15000,
        consumer_timeout_when_suspend_ms=30000,
    )
    return PullService(
        group="g",
        puller=None,  # type: ignore[arg-type]
        settings=settings,
        offset_store=offsets,
        subscription_of=lambda t: build_subscription(t, "*"),
        submit=lambda msgs, pq, mq, dispatch: submitted.append([m.queue_offset for m in msgs]),
        remove_queue=remove,
        on_offset_illegal=lambda: None,
        heartbeat=heartbeat,
    )


def test_pull_results_move_offsets_and_feed_the_consumer() -> None:
    offsets, submitted, removed = MemoryOffsets(), [], []  # type: ignore[var-annotated]
    svc = pull_service(offsets, submitted, removed)
    req = PullRequest(MQ, ProcessQueue(), 10)

    async def main() -> None:
        found = PullResult(messaging_pb2.FOUND, 12, 0, 20, [msg(10), msg(11)], 10)
        assert await svc._on_result(req, found) == 0.0
        assert req.next_offset == 12 and submitted == [[10, 11]]
        assert req.process_queue.msg_count == 2
        # nothing matched while messages are in flight: the offset is not moved
        assert (
            await svc._on_result(req, PullResult(messaging_pb2.NO_MATCHED_MSG, 15, 0, 20, [], -1))
            == 0.0
        )
        assert req.next_offset == 15 and MQ not in offsets.table
        # flow control: 2 cached messages is the threshold; a third stops the pulls
        req.process_queue.put_messages([msg(12)])
        assert await svc._pull_once(req) == 0.05
        assert svc.flow_control_times == 1

    asyncio.run(main())


def test_no_new_message_on_an_empty_queue_corrects_the_offset() -> None:
    offsets, submitted, removed = MemoryOffsets(), [], []  # type: ignore[var-annotated]
    svc = pull_service(offsets, submitted, removed)
    req = PullRequest(MQ, ProcessQueue(), 10)
    result = PullResult(messaging_pb2.NO_NEW_MSG, 10, 0, 10, [], -1)
    assert asyncio.run(svc._on_result(req, result)) == 0.0
    assert offsets.table[MQ] == 10


def test_offset_illegal_drops_the_queue_with_the_corrected_offset() -> None:
    offsets, submitted, removed = MemoryOffsets(), [], []  # type: ignore[var-annotated]
    svc = pull_service(offsets, submitted, removed)
    req = PullRequest(MQ, ProcessQueue(), 999)
    offsets.table[MQ] = 999
    result = PullResult(messaging_pb2.OFFSET_ILLEGAL, 40, 0, 40, [], -1)
    assert asyncio.run(svc._on_result(req, result)) is None
    assert req.process_queue.dropped
    assert offsets.table[MQ] == 40 and offsets.persisted == [MQ]
    assert removed == [MQ]


# ---- rebalance (SPEC §6.10) --------------------------------------------------------------------


def rebalancer(
    model: MessageModel,
    queues: dict[str, list[MessageQueue]],
    cids: list[str],
    me: str,
    start_offsets: dict[MessageQueue, int] | None = None,
) -> tuple[RebalanceImpl, list[PullRequest], list[MessageQueue]]:
    dispatched: list[PullRequest] = []
    removed: list[MessageQueue] = []

    async def queues_of(topic: str) -> list[MessageQueue]:
        return list(queues.get(topic, []))

    async def consumer_ids(topic: str) -> list[str]:
        return list(reversed(cids))  # unsorted on purpose: the rebalance sorts

    async def compute(mq: MessageQueue) -> int:
        return (start_offsets or {}).get(mq, 5)

    async def remove(mq: MessageQueue, pq: ProcessQueue) -> bool:
        removed.append(mq)
        return True

    rb = RebalanceImpl(
        group="g",
        client_id=me,
        message_model=model,
        strategy=AllocateAveragely(),
        queues_of=queues_of,
        consumer_ids=consumer_ids,
        compute_offset=compute,
        remove_queue=remove,
        dispatch=dispatched.extend,
        clock=lambda: 1_000_000,
    )
    rb.topics = set(queues)
    return rb, dispatched, removed


def qs(n: int, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, "broker-a", i) for i in range(n)]


def test_clustering_takes_its_share_and_releases_the_rest() -> None:
    rb, dispatched, removed = rebalancer(MessageModel.CLUSTERING, {"T": qs(8)}, ["c1"], "c1")
    asyncio.run(rb.do_rebalance())
    assert rb.owned() == qs(8) and len(dispatched) == 8
    assert all(r.next_offset == 5 for r in dispatched)
    old = rb.process_queue_table[qs(8)[7]]
    # a second member joins: c1 keeps queues 0-3
    rb._consumer_ids = _ids(["c1", "c2"])
    asyncio.run(rb.do_rebalance())
    assert rb.owned() == qs(4)
    assert removed == qs(8)[4:] and old.dropped
    assert len(dispatched) == 8  # nothing new to pull


def _ids(cids: list[str]) -> Any:
    async def f(topic: str) -> list[str]:
        return cids

    return f


def test_queue_without_start_offset_is_retried_later() -> None:
    bad = {qs(2)[1]: -1}
    rb, dispatched, _ = rebalancer(MessageModel.CLUSTERING, {"T": qs(2)}, ["c1"], "c1", bad)
    asyncio.run(rb.do_rebalance())
    assert rb.owned() == qs(2)[:1]
    assert [r.message_queue for r in dispatched] == qs(2)[:1]


def test_broadcasting_owns_every_queue_and_unsubscribe_truncates() -> None:
    queues = {"T": qs(3), "U": qs(2, "U")}
    rb, _, removed = rebalancer(MessageModel.BROADCASTING, queues, ["c1", "c2"], "c2")
    asyncio.run(rb.do_rebalance())
    assert len(rb.owned()) == 5
    rb.topics = {"T"}
    asyncio.run(rb.do_rebalance())
    assert rb.owned() == qs(3) and removed == qs(2, "U")


def test_pull_expired_queue_is_rebuilt() -> None:
    rb, dispatched, removed = rebalancer(MessageModel.CLUSTERING, {"T": qs(1)}, ["c1"], "c1")
    asyncio.run(rb.do_rebalance())
    rb.process_queue_table[qs(1)[0]].last_pull_timestamp_ms = 0  # silent for far too long
    asyncio.run(rb.do_rebalance())
    assert removed == qs(1) and len(dispatched) == 2


def test_member_not_yet_known_to_the_broker_takes_nothing() -> None:
    rb, dispatched, _ = rebalancer(MessageModel.CLUSTERING, {"T": qs(4)}, ["c1", "c2"], "c3")
    asyncio.run(rb.do_rebalance())
    assert rb.owned() == [] and dispatched == []


# ---- orderly: configuration, locks in the rebalance, locked pulls (SPEC §6.15, §6.18) --------


def test_consume_batch_must_fit_in_a_pull() -> None:
    cfg = PushConsumerConfig("g", ("a:1",), consume_message_batch_max_size=32)
    assert cfg.pull_batch_size == 32
    with pytest.raises(ValueError, match=r"consume_message_batch_max_size.*pull_batch_size"):
        PushConsumerConfig("g", ("a:1",), consume_message_batch_max_size=8, pull_batch_size=4)


def test_orderly_settings_are_validated() -> None:
    cfg = PushConsumerConfig("g", ("a:1",))
    assert cfg.suspend_current_queue_time_ms == 1000
    assert (cfg.rebalance_lock_interval_ms, cfg.rebalance_lock_max_live_ms) == (20_000, 30_000)
    for bad in (9, 30_001):
        with pytest.raises(ValueError, match="suspend_current_queue_time_ms"):
            PushConsumerConfig("g", ("a:1",), suspend_current_queue_time_ms=bad)
    with pytest.raises(ValueError, match="rebalance_lock_max_live_ms"):
        PushConsumerConfig(
            "g", ("a:1",), rebalance_lock_interval_ms=5000, rebalance_lock_max_live_ms=5000
        )
    with pytest.raises(ValueError, match="rebalance_lock_interval_ms"):
        PushConsumerConfig("g", ("a:1",), rebalance_lock_interval_ms=0)


def test_clamp_suspend_ms() -> None:
    assert clamp_suspend_ms(-1, 1000) == 1000
    assert (clamp_suspend_ms(0, 1000), clamp_suspend_ms(40_000, 1000)) == (10, 30_000)


def test_heartbeat_says_orderly() -> None:
    cfg = PushConsumerConfig("g", ("a:1",))
    listener = lambda msgs, ctx: ConsumeOrderlyStatus.SUCCESS  # noqa: E731
    assert PushConsumer(cfg, listener, orderly=True)._consumer_data().consume_orderly
    assert not PushConsumer(cfg, listener)._consumer_data().consume_orderly


class FakeLocker:
    """Broker locks of one group: queue -> holder; ``me`` asks."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.holders: dict[MessageQueue, str] = {}
        self.calls: list[tuple[str, list[int]]] = []
        self.down = False

    async def lock_batch(
        self, broker_name: str, queues: Iterable[MessageQueue]
    ) -> set[MessageQueue]:
        mqs = list(queues)
        self.calls.append(("lock", [mq.queue_id for mq in mqs]))
        if self.down:
            raise BrokerUnavailableError("down")
        held = set()
        for mq in mqs:
            if self.holders.setdefault(mq, self.me) == self.me:
                held.add(mq)
        return held

    async def unlock_batch(self, broker_name: str, queues: Iterable[MessageQueue]) -> None:
        mqs = list(queues)
        self.calls.append(("unlock", [mq.queue_id for mq in mqs]))
        for mq in mqs:
            if self.holders.get(mq) == self.me:
                del self.holders[mq]


def orderly_rebalancer(
    cids: list[str], me: str, locker: FakeLocker, events: list[str], now: list[int]
) -> tuple[RebalanceImpl, list[PullRequest]]:
    dispatched: list[PullRequest] = []

    async def queues_of(topic: str) -> list[MessageQueue]:
        return qs(4)

    async def compute(mq: MessageQueue) -> int:
        events.append(f"compute {mq.queue_id}")
        return 0

    async def remove(mq: MessageQueue, pq: ProcessQueue) -> bool:
        events.append(f"persist {mq.queue_id} dropped={pq.dropped}")
        return True

    async def unlock(broker_name: str, queues: Iterable[MessageQueue]) -> None:
        mqs = list(queues)
        events.append(f"unlock {[mq.queue_id for mq in mqs]}")
        await FakeLocker.unlock_batch(locker, broker_name, mqs)

    locker.unlock_batch = unlock  # type: ignore[method-assign]
    rb = RebalanceImpl(
        group="g",
        client_id=me,
        message_model=MessageModel.CLUSTERING,
        strategy=AllocateAveragely(),
        queues_of=queues_of,
        consumer_ids=_ids(cids),
        compute_offset=compute,
        remove_queue=remove,
        dispatch=dispatched.extend,
        clock=lambda: now[0],
        locker=locker,
        consume_lock_wait_s=0.0,
    )
    rb.topics = {"T"}
    return rb, dispatched


def test_orderly_rebalance_locks_before_owning_and_skips_queues_held_elsewhere() -> None:
    locker, events, now = FakeLocker("c1"), [], [1_000_000]  # type: ignore[var-annotated]
    locker.holders[qs(4)[2]] = "c2"  # the previous owner has not released it yet
    rb, dispatched = orderly_rebalancer(["c1"], "c1", locker, events, now)
    assert asyncio.run(rb.do_rebalance()) is False  # unbalanced: the next one comes soon
    assert locker.calls[0] == ("lock", [0, 1, 2, 3])  # one LockBatch for the broker
    assert rb.owned() == [qs(4)[i] for i in (0, 1, 3)]
    assert "compute 2" not in events  # never started: not ours on the broker
    assert all(r.process_queue.locked for r in dispatched)
    assert all(r.process_queue.last_lock_timestamp_ms == now[0] for r in dispatched)
    del locker.holders[qs(4)[2]]  # released: the next rebalance takes it
    assert asyncio.run(rb.do_rebalance()) is True
    assert rb.owned() == qs(4) and locker.calls[-1] == ("lock", [2])


def test_rebalance_service_retries_an_unbalanced_rebalance_sooner() -> None:
    async def rebalance() -> bool:
        return True

    svc = RebalanceService(rebalance, 20_000, "g", min_interval_ms=1000)
    assert (svc.next_wait_s(False), svc.next_wait_s(True), svc.next_wait_s(None)) == (1, 20, 20)
    assert RebalanceService(rebalance, 500, "g").next_wait_s(False) == 0.5  # never longer


def test_orderly_release_waits_for_the_running_call_then_persists_then_unlocks() -> None:
    locker, events, now = FakeLocker("c1"), [], [1_000_000]  # type: ignore[var-annotated]
    rb, _ = orderly_rebalancer(["c1"], "c1", locker, events, now)

    async def main() -> None:
        await rb.do_rebalance()
        pq3 = rb.process_queue_table[qs(4)[3]]
        assert pq3.consume_lock.acquire()  # a listener call is running on queue 3
        rb._consumer_ids = _ids(["c1", "c2"])  # c2 joins: c1 keeps 0-1
        events.clear()
        await rb.do_rebalance()
        assert rb.owned() == [qs(4)[0], qs(4)[1], qs(4)[3]]  # 3 kept for now
        assert pq3.try_unlock_times == 1 and not pq3.dropped
        assert events == ["persist 2 dropped=True", "unlock [2]"]
        pq3.consume_lock.release()  # the call ended
        events.clear()
        await rb.do_rebalance()
        assert rb.owned() == qs(2)
        assert events == ["persist 3 dropped=True", "unlock [3]"] and pq3.dropped
        assert qs(4)[3] not in locker.holders

    asyncio.run(main())


def test_lock_renewal_refreshes_held_queues_and_drops_lost_ones_unpersisted() -> None:
    locker, events, now = FakeLocker("c1"), [], [1_000_000]  # type: ignore[var-annotated]
    forgotten: list[MessageQueue] = []
    rb, dispatched = orderly_rebalancer(["c1"], "c1", locker, events, now)
    rb._forget_offset = forgotten.append

    async def main() -> None:
        await rb.do_rebalance()
        pqs = dict(rb.process_queue_table)
        now[0] += 20_000
        # our lock of queue 1 lapsed on the broker and c2 took it
        locker.holders[qs(4)[1]] = "c2"
        events.clear()
        await rb.lock_all()
        assert locker.calls[-1] == ("lock", [0, 1, 2, 3])
        assert pqs[qs(4)[0]].locked and pqs[qs(4)[0]].last_lock_timestamp_ms == now[0]
        assert pqs[qs(4)[1]].dropped and qs(4)[1] not in rb.process_queue_table
        assert forgotten == [qs(4)[1]] and events == []  # not persisted, not unlocked
        locker.down = True  # a failed renewal changes nothing (the lock then ages out)
        await rb.lock_all()
        assert pqs[qs(4)[0]].locked
        assert not await rb.lock_one(qs(4)[1])  # not ours any more
        locker.down = False
        await rb.do_rebalance()  # still allocated here, but c2 holds it: not taken
        assert qs(4)[1] not in rb.process_queue_table
        del locker.holders[qs(4)[1]]
        await rb.do_rebalance()  # released: a fresh queue from the broker's offset
        fresh = rb.process_queue_table[qs(4)[1]]
        assert fresh is not pqs[qs(4)[1]] and fresh.locked and "compute 1" in events
        assert dispatched[-1].process_queue is fresh
        pqs[qs(4)[0]].locked = False
        assert await rb.lock_one(qs(4)[0]) and pqs[qs(4)[0]].locked
        busy = rb.process_queue_table[qs(4)[3]]
        assert busy.consume_lock.acquire()  # a call outlived the close's wait
        await rb.unlock_all()
        assert set(locker.holders) == {qs(4)[3]}  # left to lapse on the broker
        assert not any(pq.locked for pq in rb.process_queue_table.values())

    asyncio.run(main())


def orderly_pull_service(
    offsets: MemoryOffsets, broker_offset: int, refused: list[str], beats: list[int]
) -> PullService:
    async def heartbeat() -> None:
        beats.append(1)

    async def compute(mq: MessageQueue) -> int:
        return broker_offset

    settings = PullSettings(
        clustering=True,
        pull_batch_size=32,
        pull_interval_ms=0,
        pull_threshold_for_queue=1000,
        pull_threshold_size_for_queue_mib=100,
        consume_concurrently_max_span=None,
        broker_suspend_max_time_ms=15000,
        consumer_timeout_when_suspend_ms=30000,
        orderly=True,
        rebalance_lock_max_live_ms=30_000,
    )

    async def remove(mq: MessageQueue) -> None:
        pass

    return PullService(
        group="g",
        puller=None,  # type: ignore[arg-type]
        settings=settings,
        offset_store=offsets,
        subscription_of=lambda t: build_subscription(t, "*"),
        submit=lambda msgs, pq, mq, dispatch: None,
        remove_queue=remove,
        on_offset_illegal=lambda: None,
        heartbeat=heartbeat,
        compute_offset=compute,
        on_refused=lambda topic, exc: refused.append(topic),
    )


class OnePull:
    """A Puller returning one canned result, or raising."""

    def __init__(self, result: PullResult | Exception) -> None:
        self.result = result
        self.offsets: list[int] = []
        self.commits: list[int] = []

    async def pull(self, req: PullRequest, sub: Any, **kw: Any) -> PullResult:
        self.offsets.append(req.next_offset)
        self.commits.append(kw["commit_offset"])
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_orderly_pulls_only_a_locked_queue_and_rereads_its_offset_first() -> None:
    refused: list[str] = []
    beats: list[int] = []
    offsets = MemoryOffsets()
    offsets.table[MQ] = 40
    svc = orderly_pull_service(offsets, 42, refused, beats)
    puller = OnePull(PullResult(messaging_pb2.NO_NEW_MSG, 42, 0, 42, [], -1))
    svc._puller = puller  # type: ignore[assignment]
    req = PullRequest(MQ, ProcessQueue(), 7)

    async def main() -> None:
        assert await svc._pull_once(req) == 3.0 and puller.offsets == []  # not locked
        req.process_queue.locked = True
        req.process_queue.last_lock_timestamp_ms = 0  # locked, but long ago: expired
        assert await svc._pull_once(req) == 3.0 and puller.offsets == []
        req.process_queue.last_lock_timestamp_ms = int(time.time() * 1000)
        assert await svc._pull_once(req) == 0.0
        assert puller.offsets == [42] and req.locked_first  # the broker's offset, not 7
        req.next_offset = 50
        await svc._pull_once(req)
        assert puller.offsets == [42, 50]  # only the first locked pull re-reads
        # orderly pulls carry the in-memory offset like concurrent ones (brokers only let a
        # pull's commit offset move forward, so a stale one cannot undo a release's persist)
        assert puller.commits == [40, 42]

    asyncio.run(main())


def test_a_pull_refused_for_inconsistent_subscriptions_waits_without_heartbeats() -> None:
    refused: list[str] = []
    beats: list[int] = []
    svc = orderly_pull_service(MemoryOffsets(), 0, refused, beats)
    err = FailedPreconditionError("members disagree", reason="SUBSCRIPTION_INCONSISTENT")
    svc._puller = OnePull(err)  # type: ignore[assignment]
    req = PullRequest(MQ, ProcessQueue(), 0, locked_first=True)
    req.process_queue.locked = True
    assert asyncio.run(svc._pull_once(req)) == 3.0
    assert refused == ["T"] and beats == []
    svc._puller = OnePull(FailedPreconditionError("subscribe first"))  # type: ignore[assignment]
    assert asyncio.run(svc._pull_once(req)) == 3.0
    assert refused == ["T"] and beats == [1]  # an unknown subscription: heartbeat first


def conflict_pb(
    topic: str, members: list[tuple[str, str | None]]
) -> common_pb2.SubscriptionConflict:
    return common_pb2.SubscriptionConflict(
        consumer_group="g",
        topic=topic,
        members=[
            common_pb2.MemberSubscription(
                client_id=cid, subscribed=expr is not None, expression=expr or ""
            )
            for cid, expr in members
        ],
        pulls_refused=True,
    )


def test_subscription_conflicts_are_kept_per_topic_until_resolved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = SubscriptionConflicts("g", logging.getLogger("test-conflicts"))
    c.on_notice(conflict_pb("U", [("c2", "B"), ("c1", "A")]))
    c.on_notice(conflict_pb("T", [("c1", "A"), ("c2", None)]))
    c.on_notice(conflict_pb("T", [("c1", "A"), ("c2", "B")]))  # the latest wins
    got = c.current()
    assert [x.topic for x in got] == ["T", "U"]
    assert got[0] == SubscriptionConflict("g", "T", (("c1", "A"), ("c2", "B")), True)
    assert got[1].members == (("c1", "A"), ("c2", "B"))  # sorted by client id
    assert conflict_from_pb(conflict_pb("V", [("c1", None)])).members == (("c1", None),)
    c.on_notice(common_pb2.SubscriptionConflict(consumer_group="g", topic="U"))  # resolved
    assert [x.topic for x in c.current()] == ["T"]
    other = conflict_pb("W", [("c1", "A")])
    other.consumer_group = "another-group"
    c.on_notice(other)  # not this consumer's group
    assert [x.topic for x in c.current()] == ["T"]
    with caplog.at_level(logging.ERROR, logger="test-conflicts"):
        for _ in range(5):
            c.log_refused_pull("T", RuntimeError("refused"))
    assert len(caplog.records) == 1  # at most one ERROR per topic per 30 s


def test_push_consumer_stores_conflict_notices() -> None:
    consumer = PushConsumer(PushConsumerConfig("g", ("a:1",)), lambda msgs, ctx: None)
    consumer._handle.on_subscription_conflict(conflict_pb("T", [("c1", "A"), ("c2", "B")]))
    assert [x.topic for x in consumer.subscription_conflicts()] == ["T"]
    lite = LitePullConsumer(LitePullConsumerConfig("g", ("a:1",)))
    lite._handle.on_subscription_conflict(conflict_pb("T", [("c1", "A"), ("c2", "B")]))
    assert lite.subscription_conflicts()[0].pulls_refused
