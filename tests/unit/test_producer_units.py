"""Producer pieces that need no network: the accumulator's bounds, the latency fault tables,
queue choice, selectors, size accounting and request building, route queue lists and the
nameserver choice order."""

from __future__ import annotations

import asyncio
import random
import zlib

import pytest

from rocketq._api.rocketq.v1 import nameserver_pb2
from rocketq.client._nameserver import NameServerChooser, parse_addrs
from rocketq.client._route import QueueData, TopicRoute
from rocketq.client._sync import LoopThread
from rocketq.client.errors import InvalidArgumentError, MessageTooLargeError
from rocketq.client.producer import (
    AccumulatingProducerConfig,
    ProducerConfig,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
)
from rocketq.client.producer._accumulator import RecordAccumulator
from rocketq.client.producer._fault import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_DURATION_MS,
    LatencyFaultTolerance,
    QueueChooser,
    not_available_duration_ms,
)
from rocketq.client.producer._sender import (
    LOG_OVERHEAD_BYTES,
    PreparedMessage,
    build_send_request,
    check_batch,
    message_size_bytes,
    prepare_message,
)
from rocketq.client.producer.selectors import java_hash_code
from rocketq.codec import Prop, SysFlag, encode_properties
from rocketq.message import Message, MessageQueue, SendResult, SendStatus
from services.common.clock import ManualClock

pytestmark = pytest.mark.unit

MiB = 1024 * 1024


def _mqs(brokers: dict[str, int], topic: str = "T") -> list[MessageQueue]:
    return sorted(MessageQueue(topic, b, q) for b, n in brokers.items() for q in range(n))


def _prepared(n: int = 1, body: bytes = b"x", topic: str = "T") -> list[PreparedMessage]:
    return [
        prepare_message(Message(topic, body), create_topic_key="TBW102", max_size_bytes=4 * MiB)
        for _ in range(n)
    ]


# ---- accumulator ------------------------------------------------------------------------


def _acc(clock: ManualClock, **kw: int) -> RecordAccumulator[str]:
    args = dict(linger_ms=5, batch_max_bytes=100, batch_max_messages=3, buffer_max_bytes=1000)
    args.update(kw)
    return RecordAccumulator(now_ms=clock.now_ms, **args)


async def test_accumulator_linger_holds_a_batch_until_it_is_old_enough() -> None:
    clock = ManualClock()
    acc = _acc(clock)
    await acc.append(("T", None), "a", 10)
    assert acc.drain_ready() == []
    assert acc.next_deadline_ms() == clock.now_ms() + 5
    clock.advance_ms(4)
    await acc.append(("T", None), "b", 10)
    assert acc.drain_ready() == []
    clock.advance_ms(1)
    [batch] = acc.drain_ready()
    assert batch.items == ["a", "b"] and batch.size_bytes == 20
    assert acc.next_deadline_ms() is None


async def test_accumulator_closes_a_batch_at_the_count_bound() -> None:
    acc = _acc(ManualClock(), batch_max_messages=3)
    for item in "abcde":
        await acc.append(("T", None), item, 1)
    [full] = acc.drain_ready()
    assert full.items == ["a", "b", "c"] and full.closed
    assert acc.drain_ready() == []  # "d", "e" still lingering


async def test_accumulator_closes_a_batch_at_the_size_bound() -> None:
    acc = _acc(ManualClock(), batch_max_bytes=100, batch_max_messages=1000)
    await acc.append(("T", None), "a", 60)
    await acc.append(("T", None), "b", 60)  # would pass 100: "a" leaves alone
    [first] = acc.drain_ready()
    assert first.items == ["a"]
    await acc.append(("T", None), "c", 40)  # 60 + 40 = 100 exactly: full
    [second] = acc.drain_ready()
    assert second.items == ["b", "c"]
    await acc.append(("T", None), "huge", 500)  # bigger than a batch: travels alone
    [alone] = acc.drain_ready()
    assert alone.items == ["huge"]


async def test_accumulator_keeps_keys_apart_and_sends_solo_items_alone() -> None:
    clock = ManualClock()
    acc = _acc(clock)
    q1 = MessageQueue("T", "b", 1)
    await acc.append(("T", None), "any", 1)
    await acc.append(("T", q1), "fixed", 1)
    await acc.append(("T", None), "delayed", 1, solo=True)
    [solo] = acc.drain_ready()
    assert solo.items == ["delayed"]
    clock.advance_ms(5)
    batches = acc.drain_ready()
    assert sorted(b.items[0] for b in batches) == ["any", "fixed"]
    assert {b.queue for b in batches} == {None, q1}


async def test_accumulator_backpressure_waits_for_released_bytes() -> None:
    acc = _acc(ManualClock(), batch_max_bytes=100, buffer_max_bytes=100)
    await acc.append(("T", None), "a", 60)
    blocked = asyncio.ensure_future(acc.append(("T", None), "b", 60))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not blocked.done() and acc.buffered_bytes == 60
    acc.close_all()
    [batch] = acc.drain_ready()
    batch.complete([_result(0)])
    acc.release(batch)
    fut = await asyncio.wait_for(blocked, 1)
    assert acc.buffered_bytes == 60 and not fut.done()
    assert (await batch.futures[0]).queue_offset == 0


async def test_accumulator_close_all_makes_everything_ready_and_reports_release() -> None:
    acc = _acc(ManualClock())
    f1 = await acc.append(("T", None), "a", 1)
    waits = acc.close_all()
    [batch] = acc.drain_ready()
    assert len(waits) == 1 and not waits[0].done()
    batch.fail(RuntimeError("boom"))
    acc.release(batch)
    assert waits[0].done() and acc.buffered_bytes == 0
    with pytest.raises(RuntimeError):
        await f1


def test_accumulator_rejects_buffer_smaller_than_a_batch() -> None:
    with pytest.raises(ValueError):
        RecordAccumulator(linger_ms=1, batch_max_bytes=10, batch_max_messages=1, buffer_max_bytes=5)


def _result(offset: int) -> SendResult:
    return SendResult(SendStatus.SEND_OK, "id", "oid", MessageQueue("T", "b", 0), offset)


# ---- latency fault tolerance ------------------------------------------------------------


def test_fault_tables_are_rocketmqs() -> None:
    assert LATENCY_MAX_MS == (50, 100, 550, 1000, 2000, 3000, 15000)
    assert NOT_AVAILABLE_DURATION_MS == (0, 0, 30000, 60000, 120000, 180000, 600000)
    cases = {0: 0, 49: 0, 50: 0, 549: 0, 550: 30000, 999: 30000, 1000: 60000, 2500: 120000}
    cases |= {3000: 180000, 14999: 180000, 15000: 600000, 30000: 600000}
    for latency, duration in cases.items():
        assert not_available_duration_ms(latency) == duration, latency


def test_fault_item_expires_with_the_clock() -> None:
    clock = ManualClock()
    fault = LatencyFaultTolerance(clock.now_ms)
    fault.update("a", 600, isolation=False)
    fault.update("b", 40, isolation=False)
    assert not fault.is_available("a") and fault.is_available("b") and fault.is_available("new")
    clock.advance_ms(29_999)
    assert not fault.is_available("a")
    clock.advance_ms(1)
    assert fault.is_available("a")
    fault.update("a", 1, isolation=True)  # a failure counts as 30 s latency: 10 minutes out
    clock.advance_ms(599_999)
    assert not fault.is_available("a")
    clock.advance_ms(1)
    assert fault.is_available("a")


def test_chooser_skips_unavailable_brokers() -> None:
    clock = ManualClock()
    fault = LatencyFaultTolerance(clock.now_ms)
    fault.update("a", 2000, isolation=False)  # out for 120 s
    chooser = QueueChooser(fault)
    queues = _mqs({"a": 2, "b": 2})
    picked = {chooser.choose(queues, None).broker_name for _ in range(20)}
    assert picked == {"b"}
    clock.advance_ms(120_000)
    picked = {chooser.choose(queues, None).broker_name for _ in range(20)}
    assert picked == {"a", "b"}


def test_chooser_uses_the_better_half_when_no_broker_is_available() -> None:
    clock = ManualClock()
    fault = LatencyFaultTolerance(clock.now_ms)
    for name, latency in (("a", 1000), ("b", 3000), ("c", 15000), ("d", 2000)):
        fault.update(name, latency, isolation=False)
    chooser = QueueChooser(fault)
    queues = _mqs({"a": 2, "b": 2, "c": 2, "d": 2})
    picked = {chooser.choose(queues, None).broker_name for _ in range(20)}
    assert picked == {"a", "d"}  # the two lowest latencies of four


def test_chooser_round_robin_and_retry_avoidance() -> None:
    chooser = QueueChooser(None, start=0)
    queues = _mqs({"a": 3, "b": 3})
    assert [chooser.choose(queues, None).queue_id for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    for _ in range(10):
        assert chooser.choose(queues, "a").broker_name == "b"
    only_a = _mqs({"a": 3})
    first = chooser.choose(only_a, None)
    second = chooser.choose(only_a, "a")  # one broker: another queue of it
    assert second.broker_name == "a" and second != first


# ---- selectors --------------------------------------------------------------------------


def _java_select_index(h: int, n: int) -> int:
    # RocketMQ's SelectMessageQueueByHash literally: value = hashCode % n (Java truncates);
    # if (value < 0) value = Math.abs(value).
    rem = abs(h) % n
    value = -rem if h < 0 else rem
    return abs(value)


def test_hash_selector_matches_javas_choice() -> None:
    known = {"hello": 99162322, "Hello World": -862545276, "polygenelubricants": -(2**31)}
    for text, java_hash in known.items():
        assert java_hash_code(text) == java_hash
    selector = SelectMessageQueueByHash()
    for n in (1, 3, 4, 7, 16):
        queues = _mqs({"a": n})
        for text, java_hash in known.items():
            mq = selector.select(queues, Message("T", b"x"), text)
            assert mq.queue_id == _java_select_index(java_hash, n), (text, n)
    queues = _mqs({"a": 4})
    assert selector.select(queues, Message("T", b"x"), "hello").queue_id == 2
    assert selector.select(queues, Message("T", b"x"), -5).queue_id == 1  # Integer.hashCode
    assert java_hash_code(1 << 32) == 1  # Long.hashCode
    assert java_hash_code(True) == 1231


def test_random_selector_stays_in_range() -> None:
    selector = SelectMessageQueueByRandom(random.Random(7))
    queues = _mqs({"a": 2, "b": 2})
    picked = {selector.select(queues, Message("T", b"x"), None) for _ in range(200)}
    assert picked == set(queues)


# ---- message checks, size accounting, requests ------------------------------------------


def test_size_accounting_is_topic_body_overhead_properties() -> None:
    assert LOG_OVERHEAD_BYTES == 20
    assert message_size_bytes("Topic", 100, 30) == 5 + 100 + 20 + 30
    msg = Message("Topic", b"x" * 100, tags="TagA", keys=["k1", "k2"])
    item = prepare_message(msg, create_topic_key="TBW102", max_size_bytes=4 * MiB)
    props = dict(item.pb.properties)
    assert props[Prop.TAGS] == "TagA" and props[Prop.KEYS] == "k1 k2"
    assert len(props[Prop.UNIQ_KEY]) == 32 and props[Prop.UNIQ_KEY] == item.msg_id
    assert item.size_bytes == 5 + 100 + 20 + len(encode_properties(props))


def test_oversized_message_and_batch_are_refused_before_sending() -> None:
    limit = 1000
    with pytest.raises(MessageTooLargeError, match="limit is 1000"):
        prepare_message(Message("T", b"x" * 1000), create_topic_key="TBW102", max_size_bytes=limit)
    items = [
        prepare_message(Message("T", b"x" * 300), create_topic_key="TBW102", max_size_bytes=limit)
        for _ in range(3)
    ]
    check_batch(items[:2], limit)
    with pytest.raises(MessageTooLargeError, match="batch of 3"):
        check_batch(items, limit)


@pytest.mark.parametrize(
    ("msg", "text"),
    [
        (Message("", b"x"), "empty"),
        (Message("bad topic!", b"x"), "characters"),
        (Message("T" * 128, b"x"), "limit is 127"),
        (Message("TBW102", b"x"), "reserved"),
        (Message("rmq_sys_wheel_timer", b"x"), "reserved"),
        (Message("T", b""), "empty body"),
        (Message("T", b"x", properties={"UNIQ_KEY": "1"}), "reserved"),
        (Message("T", b"x", properties={"a": "b\x01"}), "U\\+0001"),
        (Message("T", b"x", delay_level=65), "delay_level"),  # brokers allow up to 64 levels
    ],
)
def test_bad_messages_are_refused_with_clear_errors(msg: Message, text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=text):
        prepare_message(msg, create_topic_key="TBW102", max_size_bytes=4 * MiB)


def test_batches_hold_one_topic_and_no_delayed_message() -> None:
    def p(m: Message) -> PreparedMessage:
        return prepare_message(m, create_topic_key="TBW102", max_size_bytes=4 * MiB)

    with pytest.raises(InvalidArgumentError, match="one topic"):
        check_batch([p(Message("A", b"x")), p(Message("B", b"x"))], 4 * MiB)
    with pytest.raises(InvalidArgumentError, match="delayed"):
        check_batch([p(Message("A", b"x")), p(Message("A", b"x", delay_level=2))], 4 * MiB)
    with pytest.raises(InvalidArgumentError, match="at least one"):
        check_batch([], 4 * MiB)


def test_send_request_compresses_large_single_bodies_and_names_the_template() -> None:
    mq = MessageQueue("T", "b", 3)
    [big] = _prepared(1, b"a" * 10_000)
    req = build_send_request("g", mq, [big], default_topic="TBW102", default_topic_queue_nums=4)
    assert req.sys_flag == SysFlag.COMPRESSED and req.queue_id == 3
    assert zlib.decompress(req.messages[0].body) == b"a" * 10_000
    assert req.default_topic == "TBW102" and req.default_topic_queue_nums == 4
    assert req.born_timestamp_ms > 0 and req.producer_group == "g"
    batch = _prepared(2, b"a" * 10_000)
    req = build_send_request("g", mq, batch)
    assert req.sys_flag == 0 and req.messages[0].body == b"a" * 10_000
    assert not req.default_topic and not req.HasField("default_topic_queue_nums")


# ---- routes -----------------------------------------------------------------------------


def _route_pb() -> nameserver_pb2.TopicRouteData:
    pb = nameserver_pb2.TopicRouteData()
    pb.queues.add(broker_name="b", read_queue_nums=4, write_queue_nums=8, perm=6)
    pb.queues.add(broker_name="a", read_queue_nums=2, write_queue_nums=2, perm=4)
    pb.queues.add(broker_name="c", read_queue_nums=1, write_queue_nums=1, perm=6)
    pb.brokers.add(cluster="x", broker_name="a", broker_addrs={0: "h:1"})
    pb.brokers.add(cluster="x", broker_name="b", broker_addrs={0: "h:2", 1: "h:3"})
    pb.brokers.add(cluster="x", broker_name="c", broker_addrs={1: "h:5"})  # master down
    return pb


def test_route_write_8_read_4() -> None:
    route = TopicRoute.from_pb("T", _route_pb())
    writes = route.write_queues()
    assert [(q.broker_name, q.queue_id) for q in writes] == [("b", i) for i in range(8)]
    reads = route.read_queues()
    assert [(q.broker_name, q.queue_id) for q in reads] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("b", 3), ("c", 0)
    ]  # fmt: skip
    assert route.master_addr("b") == "h:2" and route.master_addr("c") is None
    assert route.broker_addr("b", 1) == "h:3"
    assert route.broker_addr("b", 7) == "h:2"  # falls back to the master
    assert route.broker_addr("c", 0) == "h:5"  # then to any slave
    assert route.all_broker_addrs() == {"h:1", "h:2", "h:3", "h:5"}


def test_borrowed_route_caps_queue_counts_and_names_the_template() -> None:
    template = TopicRoute(
        "TBW102",
        (QueueData("a", 8, 8, 6), QueueData("b", 2, 2, 6)),
        {"a": {0: "h:1"}, "b": {0: "h:2"}},
    )
    borrowed = template.borrowed_for("New", 4)
    assert borrowed.topic == "New" and borrowed.default_topic == "TBW102"
    assert [(q.broker_name, q.queue_id) for q in borrowed.write_queues()] == [
        ("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1)
    ]  # fmt: skip


# ---- nameserver choice ------------------------------------------------------------------


def test_nameserver_first_pick_is_random_then_round_robin_on_failure() -> None:
    addrs = ["n0:9876", "n1:9876", "n2:9876"]
    firsts = {NameServerChooser(addrs, random.Random(seed)).current for seed in range(30)}
    assert firsts == set(addrs)  # random % n reaches every nameserver
    chooser = NameServerChooser(addrs, random.Random(1))
    start = addrs.index(chooser.current)
    order = [chooser.current]
    for _ in range(4):
        order.append(chooser.failed(chooser.current))
    assert order == [addrs[(start + i) % 3] for i in range(5)]
    assert chooser.attempt_order() == [addrs[(start + 4 + i) % 3] for i in range(3)]
    before = chooser.current
    chooser.failed("not-the-current-one")  # a stale failure report does not move it
    assert chooser.current == before


def test_parse_addrs_accepts_lists_and_semicolons() -> None:
    assert parse_addrs("a:1;b:2") == ["a:1", "b:2"]
    assert parse_addrs(["a:1", "b:2;c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError):
        parse_addrs(" ; ")


# ---- configs and the loop thread --------------------------------------------------------


def test_configs_check_their_values() -> None:
    cfg = ProducerConfig("g", "127.0.0.1:9876;127.0.0.2:9876")
    assert cfg.namesrv_addrs == ("127.0.0.1:9876", "127.0.0.2:9876")
    assert cfg.send_msg_timeout_ms == 3000 and cfg.retry_times_when_send_failed == 2
    assert cfg.max_message_size_bytes == 4 * MiB and not cfg.send_latency_fault_enable
    assert cfg.client_config().client_id.endswith("@" + str(__import__("os").getpid()))
    with pytest.raises(ValueError):
        ProducerConfig("bad group!", ["a:1"])
    with pytest.raises(ValueError):
        AccumulatingProducerConfig("g", ["a:1"], batch_max_bytes=5 * MiB)
    acc = AccumulatingProducerConfig("g", ["a:1"])
    assert (acc.linger_ms, acc.batch_max_bytes, acc.buffer_max_bytes) == (5, 256 * 1024, 64 * MiB)


def test_loop_thread_runs_and_submits_coroutines() -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    with LoopThread() as lt:
        assert lt.run(double(21)) == 42
        assert lt.submit(double(2)).result(5) == 4
    with pytest.raises(RuntimeError):
        lt.submit(double(1))
