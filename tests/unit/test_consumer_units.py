"""Pure parts of the consumer runtime: subscriptions, start offsets, flow control, pull handling
and rebalance decisions, with fakes in place of brokers (no sockets, no sleeps). The
ConsumeService (results, workers, issue 16's path) is in test_consume_service."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.consumer._consume import reset_retry_topic
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
    ConsumeFromWhere,
    ExpressionType,
    LitePullConsumerConfig,
    MessageModel,
    PushConsumerConfig,
    format_consume_timestamp,
    parse_consume_timestamp,
)
from rocketq.client.consumer.process_queue import ProcessQueue
from rocketq.client.errors import BrokerUnavailableError
from rocketq.message import MessageQueue
from tests.unit.consumer_doubles import MQ, MemoryOffsets, ids_of, msg, qs

pytestmark = pytest.mark.unit

MIB = 1024 * 1024


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
