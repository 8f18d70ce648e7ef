"""Pure parts of the consumer runtime: subscriptions, start offsets, results, flow control,
pull handling and rebalance decisions, with fakes in place of brokers (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
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
    compute_pull_from_where,
)
from rocketq.client.consumer._subscription import build_subscription, filter_by_tags, parse_tags
from rocketq.client.consumer.allocate import AllocateAveragely
from rocketq.client.consumer.config import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    ExpressionType,
    LitePullConsumerConfig,
    MessageModel,
    PushConsumerConfig,
    format_consume_timestamp,
    parse_consume_timestamp,
)
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.errors import BrokerUnavailableError
from rocketq.message import MessageQueue, ReceivedMessage
from tests.support.until import until
from tests.unit.consumer_doubles import MQ, MemoryOffsets, ids_of, qs

pytestmark = pytest.mark.unit

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
    # pull_batch_size is the one departure (RocketMQ: 32), see its note in config.py
    assert (cfg.pull_batch_size, cfg.consume_message_batch_max_size) == (256, 1)
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


async def start(mq: MessageQueue, where: ConsumeFromWhere, source: FakeOffsets, ts: int = 7) -> int:
    return await compute_pull_from_where(mq, where, ts, source)


@pytest.mark.parametrize("where", list(ConsumeFromWhere))
async def test_a_stored_offset_always_wins(where: ConsumeFromWhere) -> None:
    assert await start(MQ, where, FakeOffsets(42)) == 42
    assert await start(MQ, where, FakeOffsets(0)) == 0


async def test_first_start_follows_consume_from_where() -> None:
    assert await start(MQ, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, FakeOffsets(-1)) == 900
    assert await start(MQ, ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, FakeOffsets(-1)) == 100
    src = FakeOffsets(-1)
    assert await start(MQ, ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, src, ts=1234) == 500
    assert src.asked == [("ts", 1234)]


@pytest.mark.parametrize("where", list(ConsumeFromWhere))
async def test_retry_topic_starts_at_zero(where: ConsumeFromWhere) -> None:
    assert await start(MessageQueue("%RETRY%g", "broker-a", 0), where, FakeOffsets(-1)) == 0


async def test_unreadable_offsets_postpone_the_queue() -> None:
    assert await start(MQ, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, FakeOffsets(-2)) == -1
    src = FakeOffsets(-1, fail=True)
    assert await start(MQ, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, src) == -1


# ---- result processing (SPEC §6.11) ------------------------------------------------------------


def test_ack_index() -> None:
    ctx = ConsumeContext(MQ)
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ctx, 4) == 3
    assert ack_index_for(ConsumeResult.RECONSUME_LATER, ctx, 4) == -1
    assert ack_index_for(None, ctx, 4) == -1
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ, ack_index=1), 4) == 1
    assert ack_index_for(ConsumeResult.CONSUME_SUCCESS, ConsumeContext(MQ, ack_index=9), 4) == 3


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


def submit_pull(
    svc: ConsumeService, count: int, *, one_worker: bool = False
) -> tuple[ProcessQueue, list[ReceivedMessage]]:
    """Submit one pull of ``count`` messages (offsets 0 ..) to ``svc`` (``one_worker``: with a
    single worker); their ProcessQueue and the messages."""
    if one_worker:
        svc._workers_max = 1
    pq = ProcessQueue()
    pulled = [msg(i) for i in range(count)]
    pq.put_messages(pulled)
    svc.submit(pulled, pq, MQ, True)
    return pq, pulled


async def idle(svc: ConsumeService) -> None:
    """Wait for every submitted batch, then shut the service down."""
    while svc._tasks:
        await asyncio.wait(list(svc._tasks), timeout=10)
    await svc.shutdown(0)


async def test_offset_stays_at_smallest_in_flight() -> None:
    """SPEC §15: a, b, c, d consumed with d first keeps the offset at a."""

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


async def test_broadcasting_drops_failures_without_send_back() -> None:
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


async def test_clustering_sent_back_failures_release_the_offset() -> None:
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


async def test_failed_send_back_retries_locally_and_holds_the_offset() -> None:
    offsets = MemoryOffsets()
    calls: list[tuple[int, int]] = []
    done = asyncio.Event()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append((msgs[0].queue_offset, msgs[0].reconsume_times))
        if len(calls) == 2:
            loop.call_soon_threadsafe(done.set)
        return ConsumeResult.RECONSUME_LATER if len(calls) == 1 else ConsumeResult.CONSUME_SUCCESS

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


async def test_results_of_a_dropped_queue_are_ignored() -> None:
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


async def test_batches_split_by_consume_message_batch_max_size() -> None:
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


async def test_workers_bound_the_calls_in_progress_and_drain_every_batch() -> None:
    """Listener batches wait in one FIFO; at most thread_max (4) workers call the listener."""
    offsets = MemoryOffsets()
    running, most = [0], [0]
    gate = asyncio.Event()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await gate.wait()
        running[0] -= 1
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq = ProcessQueue()
    pulled = [msg(i) for i in range(10)]
    pq.put_messages(pulled)
    svc.submit(pulled, pq, MQ, True)  # ten listener batches of one
    await until(lambda: running[0] == 4, "four listener calls running")
    assert MQ not in offsets.table  # nothing consumed yet: nothing committed
    gate.set()
    await until(lambda: offsets.table.get(MQ) == 10, "offset 10 committed")
    assert most[0] == 4 and svc.consumed_ok == 10 and pq.msg_count == 0
    # Workers that ran dry ended; a later pull starts them again.
    later = [msg(i) for i in range(10, 12)]
    pq.put_messages(later)
    svc.submit(later, pq, MQ, True)
    await until(lambda: offsets.table.get(MQ) == 12, "offset 12 committed")
    await svc.shutdown(0)


async def test_plain_listener_batches_share_thread_trips_and_keep_their_own_results() -> None:
    """A backlog of 40 batches goes to the pool a few at a time; each is still one call."""
    offsets = MemoryOffsets()
    calls: list[int] = []
    threads: set[str] = set()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append(msgs[0].queue_offset)
        threads.add(threading.current_thread().name)
        if msgs[0].queue_offset == 7:
            raise RuntimeError("offset 7 fails")
        return (
            ConsumeResult.RECONSUME_LATER
            if msgs[0].queue_offset == 9
            else ConsumeResult.CONSUME_SUCCESS
        )

    svc, sent = service(MessageModel.CLUSTERING, offsets, send_back_ok=True, listener=listener)
    submit_pull(svc, 40)
    await until(lambda: offsets.table.get(MQ) == 40, "offset 40 committed")
    assert sorted(calls) == list(range(40)) and sent == [7, 9]
    assert (svc.consumed_ok, svc.consumed_failed) == (38, 2)
    assert all(name.startswith("consume-g") for name in threads)
    await svc.shutdown(0)


async def test_a_queue_dropped_mid_trip_skips_only_its_own_batches() -> None:
    offsets = MemoryOffsets()
    mq_a, mq_b = MessageQueue("T", "b", 1), MessageQueue("T", "b", 2)
    pq_a, pq_b = ProcessQueue(), ProcessQueue()
    called: list[tuple[int, int]] = []

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        called.append((ctx.message_queue.queue_id, msgs[0].queue_offset))
        if ctx.message_queue == mq_a:
            pq_a.dropped = True  # rebalanced away during its first call
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    for i in range(8):  # interleaved, so each thread trip carries batches of both queues
        for mq, pq in ((mq_a, pq_a), (mq_b, pq_b)):
            one = [msg(i)]
            pq.put_messages(one)
            svc.submit(one, pq, mq, True)
    await until(lambda: offsets.table.get(mq_b) == 8, "queue b consumed to offset 8")
    assert sorted(o for q, o in called if q == 2) == list(range(8))
    assert len([o for q, o in called if q == 1]) < 8  # batches of a after the drop never ran
    assert mq_a not in offsets.table
    await svc.shutdown(0)


async def test_batches_still_waiting_at_shutdown_are_not_consumed() -> None:
    offsets = MemoryOffsets()
    gate = asyncio.Event()
    seen: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.append(msgs[0].queue_offset)
        await gate.wait()
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    submit_pull(svc, 8)
    await until(lambda: len(seen) == 4, "four listener calls started")
    closing = asyncio.create_task(svc.shutdown(5000))
    gate.set()
    await closing
    assert seen == [0, 1, 2, 3]  # the four in progress finished; the rest never started
    assert offsets.table[MQ] == 4  # the committed offset stays below what was not consumed


async def test_listener_exception_and_bad_return_mean_reconsume_later() -> None:
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


async def run_pull(api: FakeApi, expr: str, commit_offset: int) -> tuple[PullResult, PullRequest]:
    puller = Puller(api, "g", 4)  # type: ignore[arg-type]
    req = PullRequest(MQ, ProcessQueue(), 10)
    sub = build_subscription("T", expr)
    result = await puller.pull(
        req, sub, max_nums=32, commit_offset=commit_offset, suspend_ms=15000, timeout_ms=30000
    )
    return result, req


async def test_puller_builds_the_request_and_refilters_by_tag_string() -> None:
    resp = messaging_pb2.PullResponse(
        status=messaging_pb2.FOUND,
        next_begin_offset=13,
        min_offset=0,
        max_offset=20,
        suggest_which_broker_id=1,
        records=record(10, "A") + record(11, "Z") + record(12, "B"),
    )
    api = FakeApi(resp)
    result, req = await run_pull(api, "A || B", commit_offset=7)
    sent = api.requests[0]
    assert sent.sys_flag == FLAG_COMMIT_OFFSET | FLAG_SUSPEND | FLAG_SUBSCRIPTION
    assert (sent.commit_offset, sent.queue_offset, sent.suspend_timeout_ms) == (7, 10, 15000)
    assert sent.subscription == "A || B" and sent.max_msg_nums == 32
    assert [m.queue_offset for m in result.messages] == [10, 12]
    assert result.first_offset == 10 and result.next_begin_offset == 13
    assert result.messages[0].broker_name == "broker-a"
    assert result.messages[0].properties[codec.Prop.MAX_OFFSET] == "20"
    assert req.broker_id == 1  # the next pull goes where the broker suggested


async def test_puller_drops_commit_offset_for_slaves_and_for_no_offset() -> None:
    resp = messaging_pb2.PullResponse(status=messaging_pb2.NO_NEW_MSG, next_begin_offset=10)
    api = FakeApi(resp, slave=True)
    await run_pull(api, "*", commit_offset=7)
    assert api.requests[0].sys_flag & FLAG_COMMIT_OFFSET == 0
    api = FakeApi(resp)
    await run_pull(api, "*", commit_offset=-1)
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


async def test_pull_results_move_offsets_and_feed_the_consumer() -> None:
    offsets, submitted, removed = MemoryOffsets(), [], []  # type: ignore[var-annotated]
    svc = pull_service(offsets, submitted, removed)
    req = PullRequest(MQ, ProcessQueue(), 10)

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


async def test_no_new_message_on_an_empty_queue_corrects_the_offset() -> None:
    offsets, submitted, removed = MemoryOffsets(), [], []  # type: ignore[var-annotated]
    svc = pull_service(offsets, submitted, removed)
    req = PullRequest(MQ, ProcessQueue(), 10)
    result = PullResult(messaging_pb2.NO_NEW_MSG, 10, 0, 10, [], -1)
    assert await svc._on_result(req, result) == 0.0
    assert offsets.table[MQ] == 10


async def test_offset_illegal_drops_the_queue_with_the_corrected_offset() -> None:
    offsets, submitted, removed = MemoryOffsets(), [], []  # type: ignore[var-annotated]
    svc = pull_service(offsets, submitted, removed)
    req = PullRequest(MQ, ProcessQueue(), 999)
    offsets.table[MQ] = 999
    result = PullResult(messaging_pb2.OFFSET_ILLEGAL, 40, 0, 40, [], -1)
    assert await svc._on_result(req, result) is None
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


async def test_clustering_takes_its_share_and_releases_the_rest() -> None:
    rb, dispatched, removed = rebalancer(MessageModel.CLUSTERING, {"T": qs(8)}, ["c1"], "c1")
    await rb.do_rebalance()
    assert rb.owned() == qs(8) and len(dispatched) == 8
    assert all(r.next_offset == 5 for r in dispatched)
    old = rb.process_queue_table[qs(8)[7]]
    # a second member joins: c1 keeps queues 0-3
    rb._consumer_ids = ids_of(["c1", "c2"])
    await rb.do_rebalance()
    assert rb.owned() == qs(4)
    assert removed == qs(8)[4:] and old.dropped
    assert len(dispatched) == 8  # nothing new to pull


async def test_queue_without_start_offset_is_retried_later() -> None:
    bad = {qs(2)[1]: -1}
    rb, dispatched, _ = rebalancer(MessageModel.CLUSTERING, {"T": qs(2)}, ["c1"], "c1", bad)
    await rb.do_rebalance()
    assert rb.owned() == qs(2)[:1]
    assert [r.message_queue for r in dispatched] == qs(2)[:1]


async def test_broadcasting_owns_every_queue_and_unsubscribe_truncates() -> None:
    queues = {"T": qs(3), "U": qs(2, "U")}
    rb, _, removed = rebalancer(MessageModel.BROADCASTING, queues, ["c1", "c2"], "c2")
    await rb.do_rebalance()
    assert len(rb.owned()) == 5
    rb.topics = {"T"}
    await rb.do_rebalance()
    assert rb.owned() == qs(3) and removed == qs(2, "U")


async def test_pull_expired_queue_is_rebuilt() -> None:
    rb, dispatched, removed = rebalancer(MessageModel.CLUSTERING, {"T": qs(1)}, ["c1"], "c1")
    await rb.do_rebalance()
    rb.process_queue_table[qs(1)[0]].last_pull_timestamp_ms = 0  # silent for far too long
    await rb.do_rebalance()
    assert removed == qs(1) and len(dispatched) == 2


async def test_member_not_yet_known_to_the_broker_takes_nothing() -> None:
    rb, dispatched, _ = rebalancer(MessageModel.CLUSTERING, {"T": qs(4)}, ["c1", "c2"], "c3")
    await rb.do_rebalance()
    assert rb.owned() == [] and dispatched == []


# ---- issue 16: batches addressed by index in the pulled run; offsets stored per pull ----------


async def test_a_stuck_call_does_not_hold_back_the_stored_offset_of_the_calls_before_it() -> None:
    """One worker (consume_thread_max 1) runs a pull of five; the call on offset 3 hangs. The
    offset store already holds 3 (the calls on 0..2 are done), not the offset before the pull:
    the kept offset is handed over as soon as the loop gets a turn, not only at the pull's end."""
    offsets = MemoryOffsets()
    gate = asyncio.Event()
    calls: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls.append(msgs[0].queue_offset)
        if msgs[0].queue_offset == 3:
            await gate.wait()
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq, _ = submit_pull(svc, 5, one_worker=True)
    await until(lambda: offsets.table.get(MQ) == 3, "offset 3 stored while 3 is in a call")
    assert calls == [0, 1, 2, 3] and pq.msg_count == 2
    gate.set()
    await until(lambda: offsets.table.get(MQ) == 5, "offset 5 stored")
    await svc.shutdown(0)


async def test_a_pull_that_overlaps_the_cache_is_consumed_message_by_message() -> None:
    """A pull repeating an offset still cached takes the ProcessQueue's per-message path (no
    run of its own): each message is consumed once, the offset ends past the last."""
    offsets = MemoryOffsets()
    seen: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.extend(m.queue_offset for m in msgs)
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener, batch=2)
    pq = ProcessQueue()
    first = [msg(i) for i in range(3)]
    pq.put_messages(first)
    again = [msg(i) for i in range(2, 6)]  # offset 2 again, then 3..5
    pq.put_messages(again)
    assert pq.run_of(first) is not None and pq.run_of(again) is None  # 3..5 cached apart
    svc.submit(first, pq, MQ, True)
    svc.submit(again[1:], pq, MQ, True)
    await until(lambda: offsets.table.get(MQ) == 6, "offset 6 committed")
    assert sorted(seen) == list(range(6)) and pq.msg_count == 0
    await svc.shutdown(0)


async def test_offsets_kept_for_the_store_are_handed_over_at_shutdown() -> None:
    offsets = MemoryOffsets()
    svc, _ = service(MessageModel.CLUSTERING, offsets)
    pq = ProcessQueue()
    pulled = [msg(i) for i in range(4)]
    pq.put_messages(pulled)
    svc._unstored[pq] = (MQ, 2)  # as _done leaves it between two loop turns
    await svc.shutdown(0)
    assert offsets.table[MQ] == 2


async def test_a_call_is_in_flight_only_while_it_is_suspended() -> None:
    """A coroutine listener's calls that finish without suspending are released before
    anything else runs; the call that suspends is the only one the queue holds as started (the
    consume timeout sees it), and what it awaits reaches it: here a RECONSUME_LATER, so its
    message is sent back and the offset still moves past it."""
    offsets = MemoryOffsets()
    answer: asyncio.Future[ConsumeResult] = asyncio.get_running_loop().create_future()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if msgs[0].queue_offset == 2:
            return await answer
        return ConsumeResult.CONSUME_SUCCESS

    svc, sent = service(MessageModel.CLUSTERING, offsets, True, listener=listener)
    pq, pulled = submit_pull(svc, 5, one_worker=True)
    await until(lambda: offsets.table.get(MQ) == 2, "offset 2 stored while 2 is in a call")
    # 0 and 1 are gone; 2 is started; 3 and 4 wait, not started.
    assert pq.msg_count == 3
    assert pq.expired_messages(time.time_ns() // 1_000_000 + 10, 0) == [pulled[2]]
    answer.set_result(ConsumeResult.RECONSUME_LATER)
    await until(lambda: offsets.table.get(MQ) == 5, "offset 5 stored")
    assert sent == [2] and svc.consumed_ok == 4 and svc.consumed_failed == 1
    await svc.shutdown(0)


async def test_calls_that_fail_between_successes_are_retried_and_the_rest_released() -> None:
    """Results that need more than a release (an exception, RECONSUME_LATER, an ack_index
    short of the batch) come between successes of the same pull without suspending: each
    failed message is sent back once, every other one consumed once, the offset ends past
    the pull."""
    offsets = MemoryOffsets()
    seen: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        first = msgs[0].queue_offset
        seen.extend(m.queue_offset for m in msgs)
        if first == 2:
            raise RuntimeError("listener bug")
        if first == 4:
            return ConsumeResult.RECONSUME_LATER
        if first == 6:
            ctx.ack_index = 0  # 6 done, 7 not
        return ConsumeResult.CONSUME_SUCCESS

    svc, sent = service(MessageModel.CLUSTERING, offsets, True, listener=listener, batch=2)
    pq, _ = submit_pull(svc, 10)
    await until(lambda: offsets.table.get(MQ) == 10, "offset 10 stored")
    assert seen == list(range(10)) and sorted(sent) == [2, 3, 4, 5, 7]
    assert pq.msg_count == 0 and svc.consumed_ok == 5
    await svc.shutdown(0)


async def test_shutdown_cancels_a_suspended_call_inside_the_listener() -> None:
    """A call suspended in the listener is cancelled at shutdown like any awaited coroutine:
    the listener sees the CancelledError where it waits, and its message is not consumed (the
    offset stays on it)."""
    offsets = MemoryOffsets()
    cancelled: list[int] = []
    entered = asyncio.Event()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if msgs[0].queue_offset == 1:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(msgs[0].queue_offset)
                raise
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    pq, _ = submit_pull(svc, 3, one_worker=True)
    await asyncio.wait_for(entered.wait(), 5)
    await svc.shutdown(0)
    assert cancelled == [1] and offsets.table.get(MQ) == 1 and pq.msg_count == 2


async def test_each_call_gets_a_context_as_new_and_a_kept_one_is_never_handed_on() -> None:
    """A context the listener changed, or still holds after its call, never reaches another
    call: each call sees a context as new, and the kept ones stay as the listener left them."""
    offsets = MemoryOffsets()
    seen: list[tuple[int, int | None]] = []
    kept: list[ConsumeContext] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.append((ctx.delay_level_when_next_consume, ctx.ack_index))
        if msgs[0].queue_offset % 2:
            kept.append(ctx)
        else:
            ctx.delay_level_when_next_consume = 5
        return ConsumeResult.CONSUME_SUCCESS

    svc, _ = service(MessageModel.CLUSTERING, offsets, listener=listener)
    submit_pull(svc, 6)
    await until(lambda: offsets.table.get(MQ) == 6, "offset 6 stored")
    assert seen == [(0, None)] * 6 and len({id(c) for c in kept}) == 3
    assert all(c.delay_level_when_next_consume == 0 and c.message_queue == MQ for c in kept)
    await svc.shutdown(0)


async def test_a_timeout_inside_a_suspended_call_stays_the_listener_s_own() -> None:
    """A listener's own timeout (a cancel the task takes back) works through a call resumed by
    hand: the listener catches its TimeoutError and the call succeeds; nothing is retried."""
    offsets = MemoryOffsets()
    timed_out: list[int] = []

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        await asyncio.sleep(0)  # a bare yield first, then a wait that times out
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            timed_out.append(msgs[0].queue_offset)
        return ConsumeResult.CONSUME_SUCCESS

    svc, sent = service(MessageModel.CLUSTERING, offsets, listener=listener)
    submit_pull(svc, 3)
    await until(lambda: offsets.table.get(MQ) == 3, "offset 3 stored")
    assert sorted(timed_out) == [0, 1, 2] and sent == [] and svc.consumed_ok == 3
    await svc.shutdown(0)
