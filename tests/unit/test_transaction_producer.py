"""The transactional producer's logic without a network (SPEC §9): a fake producer core stands
in for the broker (it records the half sends and EndTransaction calls it gets), so these tests
check what the SDK decides: the half message's markers, the state mapping, exceptions and None
as UNKNOW, no local transaction when the half send fails or is not SEND_OK, delayed messages
refused, EndTransaction failures swallowed, and the bounded check-back pool."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from rocketq import (
    LocalTransactionState,
    ProducerConfig,
    SendResult,
    SyncTransactionProducer,
    TransactionProducer,
    TransactionProducerConfig,
    TransactionSendResult,
)
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.cli.transaction_cmd import CliListener
from rocketq.client._admin_tx import merge
from rocketq.client.errors import (
    BrokerUnavailableError,
    ClientStateError,
    InvalidArgumentError,
    MessageTooLargeError,
)
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer._sender import PreparedMessage
from rocketq.client.producer.transaction import (
    CheckDispatcher,
    check_answer,
    end_request,
    transaction_config,
)
from rocketq.codec import HostAddress, Prop, SysFlag, encode_offset_msg_id
from rocketq.message import Message, MessageQueue, ReceivedMessage, SendStatus

pytestmark = pytest.mark.unit

BROKER_ADDR = "127.0.0.1:10911"
HALF_COMMITLOG_OFFSET = 4242
HALF_QUEUE_OFFSET = 7
State = LocalTransactionState


# ---- doubles --------------------------------------------------------------------------------
class FakeBroker:
    """What the fake core sends to: records half sends and EndTransaction requests."""

    def __init__(self) -> None:
        self.halves: list[tuple[PreparedMessage, int]] = []
        self.ends: list[tuple[str, messaging_pb2.EndTransactionRequest]] = []
        self.send_error: Exception | None = None
        self.send_status = SendStatus.SEND_OK
        self.end_error: Exception | None = None

    # the Messaging stub's one method the producer calls
    async def EndTransaction(  # the RPC's name
        self, req: messaging_pb2.EndTransactionRequest, timeout: float
    ) -> messaging_pb2.EndTransactionResponse:
        assert 0 < timeout <= 3
        self.ends.append((self._addr, req))
        if self.end_error is not None:
            raise self.end_error
        return messaging_pb2.EndTransactionResponse()

    _addr = ""

    def messaging(self, addr: str) -> FakeBroker:
        self._addr = addr
        return self

    def find_broker_addr(
        self, broker_name: str, broker_id: int = 0, *, only_this_broker: bool = False
    ) -> str | None:
        assert broker_name == "broker-a" and broker_id == 0
        return BROKER_ADDR


class FakeCore(ProducerCore):
    """A started producer core whose sends go to a FakeBroker."""

    def __init__(self, config: ProducerConfig, broker: FakeBroker) -> None:
        super().__init__(config)
        self.broker = broker

    @property
    def instance(self) -> Any:
        return self.broker

    async def close(self) -> None:
        pass

    async def send_with_retries(
        self,
        topic: str,
        items: Any,
        *,
        timeout_ms: int,
        retries: int,
        same_queue: bool = False,
        sys_flag: int = 0,
    ) -> list[SendResult]:
        [item] = items
        self.broker.halves.append((item, sys_flag))
        if self.broker.send_error is not None:
            raise self.broker.send_error
        offset_id = encode_offset_msg_id(HostAddress(b"\x7f\0\0\1", 10911), HALF_COMMITLOG_OFFSET)
        mq = MessageQueue(topic, "broker-a", 2)
        return [
            SendResult(
                self.broker.send_status, item.msg_id, offset_id, mq, HALF_QUEUE_OFFSET, item.msg_id
            )
        ]


class Listener:
    """Answers with fixed states (or raises); records what it was asked and on which thread."""

    def __init__(self, execute: object = State.COMMIT_MESSAGE, check: object = None) -> None:
        self.execute = execute
        self.check = check
        self.executed: list[tuple[Message, object, int]] = []
        self.checked: list[ReceivedMessage] = []

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        self.executed.append((message, arg, threading.get_ident()))
        if isinstance(self.execute, Exception):
            raise self.execute
        return self.execute  # type: ignore[return-value]

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        self.checked.append(message)
        if isinstance(self.check, Exception):
            raise self.check
        return self.check  # type: ignore[return-value]


def _producer(listener: Listener, **config: Any) -> tuple[TransactionProducer, FakeBroker]:
    broker = FakeBroker()
    producer = TransactionProducer(
        TransactionProducerConfig("tx-group", "ns:9876", **config), listener
    )
    core = FakeCore(producer.config, broker)
    core.check_handler = producer.checks.submit
    producer._core = core
    return producer, broker


async def _send(
    listener: Listener, msg: Message | None = None, **kw: Any
) -> tuple[Any, FakeBroker]:
    producer, broker = _producer(listener)
    for name, value in kw.items():
        setattr(broker, name, value)

    try:
        return await producer.send_message_in_transaction(
            msg or Message("orders", b"x"), "ARG"
        ), broker
    except Exception as exc:
        return exc, broker


# ---- the send flow --------------------------------------------------------------------------
async def test_commit_sends_a_marked_half_runs_the_local_transaction_and_commits() -> None:
    listener = Listener(State.COMMIT_MESSAGE)
    result, broker = await _send(listener, Message("orders", b"paid", tags="T", keys="k1"))
    [(half, sys_flag)] = broker.halves
    assert sys_flag == SysFlag.TRANSACTION_PREPARED
    props = dict(half.pb.properties)
    assert props[Prop.TRANSACTION_PREPARED] == "true" and props[Prop.PRODUCER_GROUP] == "tx-group"
    assert props[Prop.TAGS] == "T" and props[Prop.UNIQ_KEY] == half.msg_id
    [(message, arg, _)] = listener.executed
    assert message.body == b"paid" and arg == "ARG"
    [(addr, end)] = broker.ends
    assert addr == BROKER_ADDR
    assert end.resolution == messaging_pb2.TRANSACTION_COMMIT
    assert end.producer_group == "tx-group" and not end.from_transaction_check
    assert (end.commitlog_offset, end.queue_offset) == (HALF_COMMITLOG_OFFSET, HALF_QUEUE_OFFSET)
    assert end.msg_id == end.transaction_id == half.msg_id
    assert isinstance(result, TransactionSendResult) and isinstance(result, SendResult)
    assert result.local_state is State.COMMIT_MESSAGE
    assert result.transaction_id == half.msg_id and result.status is SendStatus.SEND_OK
    assert result.message_queue == MessageQueue("orders", "broker-a", 2)


@pytest.mark.parametrize(
    ("answer", "state", "resolution"),
    [
        (State.ROLLBACK_MESSAGE, State.ROLLBACK_MESSAGE, messaging_pb2.TRANSACTION_ROLLBACK),
        (State.UNKNOW, State.UNKNOW, messaging_pb2.TRANSACTION_UNKNOWN),
        (RuntimeError("db down"), State.UNKNOW, messaging_pb2.TRANSACTION_UNKNOWN),
        (None, State.UNKNOW, messaging_pb2.TRANSACTION_UNKNOWN),
        ("COMMIT_MESSAGE", State.UNKNOW, messaging_pb2.TRANSACTION_UNKNOWN),
    ],
)
async def test_local_states_map_to_resolutions_and_failures_are_unknow(
    answer: object, state: LocalTransactionState, resolution: int
) -> None:
    result, broker = await _send(Listener(answer))
    assert isinstance(result, TransactionSendResult), result
    assert result.local_state is state
    [(_, end)] = broker.ends
    assert end.resolution == resolution


async def test_a_failed_half_send_raises_and_runs_no_local_transaction() -> None:
    listener = Listener()
    error = BrokerUnavailableError("broker gone")
    result, broker = await _send(listener, send_error=error)
    assert result is error
    assert listener.executed == [] and broker.ends == []


async def test_a_half_stored_without_send_ok_is_rolled_back_without_the_local_transaction() -> None:
    listener = Listener(State.COMMIT_MESSAGE)
    result, broker = await _send(listener, send_status=SendStatus.FLUSH_DISK_TIMEOUT)
    assert listener.executed == []
    assert result.local_state is State.ROLLBACK_MESSAGE
    assert result.status is SendStatus.FLUSH_DISK_TIMEOUT
    [(_, end)] = broker.ends
    assert end.resolution == messaging_pb2.TRANSACTION_ROLLBACK


@pytest.mark.parametrize(
    "msg",
    [
        Message("orders", b"x", delay_level=3),
        Message("orders", b"x", deliver_time_ms=1_900_000_000_000),
        Message("orders", b"x", delay_ms=5000),
    ],
)
async def test_delayed_messages_are_refused_before_anything_is_sent(msg: Message) -> None:
    listener = Listener()
    result, broker = await _send(listener, msg)
    assert isinstance(result, ValueError) and isinstance(result, InvalidArgumentError)
    assert "cannot be delayed" in str(result)
    assert broker.halves == [] and listener.executed == []


async def test_bad_messages_and_reserved_properties_are_refused_before_sending() -> None:
    listener = Listener()
    for msg in (Message("orders", b""), Message("orders", b"x", properties={"PGROUP": "g"})):
        result, broker = await _send(listener, msg)
        assert isinstance(result, InvalidArgumentError), result
        assert broker.halves == []
    producer, broker = _producer(listener, max_message_size_bytes=200)
    big = Message("orders", b"x" * 120)  # fits alone, not with TRAN_MSG and PGROUP
    with pytest.raises(MessageTooLargeError, match="transaction properties"):
        await producer.send_message_in_transaction(big)
    assert broker.halves == []


async def test_a_failed_end_transaction_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="gone"
    )
    result, broker = await _send(Listener(State.COMMIT_MESSAGE), end_error=error)
    assert isinstance(result, TransactionSendResult)
    assert result.local_state is State.COMMIT_MESSAGE
    assert len(broker.ends) == 1
    assert "the broker's check will ask again" in caplog.text


async def test_sending_needs_a_started_producer() -> None:
    producer = TransactionProducer(ProducerConfig("tx-group", "ns:9876"), Listener())
    with pytest.raises(ClientStateError):
        await producer.send_message_in_transaction(Message("orders", b"x"))


def test_sync_producer_runs_the_local_transaction_in_the_calling_thread() -> None:
    listener = Listener(State.ROLLBACK_MESSAGE)
    sync = SyncTransactionProducer(ProducerConfig("tx-group", "ns:9876"), listener)
    broker = FakeBroker()
    core = FakeCore(sync.config, broker)
    sync._producer._core = core
    try:
        result = sync.send_message_in_transaction(Message("orders", b"x"), 42)
    finally:
        sync.close()
    [(_, arg, thread_id)] = listener.executed
    assert arg == 42 and thread_id == threading.get_ident()
    assert result.local_state is State.ROLLBACK_MESSAGE
    assert broker.ends[0][1].resolution == messaging_pb2.TRANSACTION_ROLLBACK


# ---- configuration ----------------------------------------------------------------------------
def test_config_defaults_and_bounds() -> None:
    plain = ProducerConfig("tx-group", "a:9876;b:9876", send_msg_timeout_ms=1234)
    cfg = transaction_config(plain)
    assert cfg.namesrv_addrs == ("a:9876", "b:9876") and cfg.send_msg_timeout_ms == 1234
    assert (cfg.check_thread_pool_max, cfg.check_request_hold_max) == (1, 2000)
    assert transaction_config(cfg) is cfg
    for threads in (0, 65):
        with pytest.raises(ValueError, match="check_thread_pool_max"):
            TransactionProducerConfig("g", "ns:1", check_thread_pool_max=threads)
    with pytest.raises(ValueError, match="check_request_hold_max"):
        TransactionProducerConfig("g", "ns:1", check_request_hold_max=0)
    with pytest.raises(TypeError, match="listener has no"):
        TransactionProducer(plain, object())  # type: ignore[arg-type]


# ---- check-backs ------------------------------------------------------------------------------
def _check(i: int, topic: str = "orders") -> messaging_pb2.CheckTransactionState:
    msg_id = f"{i:032X}"
    stored = common_pb2.StoredMessage(
        message=common_pb2.Message(topic=topic, body=b"b%d" % i, properties={"UNIQ_KEY": msg_id}),
        msg_id=msg_id,
        queue_id=1,
        commitlog_offset=1000 + i,
        queue_offset=i,
    )
    return messaging_pb2.CheckTransactionState(
        producer_group="tx-group",
        msg_id=msg_id,
        transaction_id=msg_id,
        commitlog_offset=5000 + i,
        queue_offset=50 + i,
        message=stored,
    )


async def test_the_stream_hands_checks_to_the_transaction_producer() -> None:
    listener = Listener(check=State.COMMIT_MESSAGE)
    producer, broker = _producer(listener)

    producer._core.on_check_transaction("127.0.0.1:20911", _check(3))
    await producer.checks.drain()

    [message] = listener.checked
    assert message.topic == "orders" and message.body == b"b3" and message.msg_id == f"{3:032X}"
    [(addr, end)] = broker.ends
    assert addr == "127.0.0.1:20911"  # answered to the broker that asked
    assert end.from_transaction_check and end.resolution == messaging_pb2.TRANSACTION_COMMIT
    assert (end.commitlog_offset, end.queue_offset) == (5003, 53)  # the copy the broker named
    assert end.transaction_id == end.msg_id == f"{3:032X}" and end.producer_group == "tx-group"


def test_a_plain_producer_only_logs_a_check(caplog: pytest.LogCaptureFixture) -> None:
    core = ProducerCore(ProducerConfig("g", "ns:1"))
    core.on_check_transaction("127.0.0.1:1", _check(1))
    assert "has no transaction listener" in caplog.text


@pytest.mark.parametrize(
    ("answer", "resolution"),
    [
        (State.ROLLBACK_MESSAGE, messaging_pb2.TRANSACTION_ROLLBACK),
        (RuntimeError("no idea"), messaging_pb2.TRANSACTION_UNKNOWN),
        (None, messaging_pb2.TRANSACTION_UNKNOWN),
    ],
)
async def test_check_answers_map_states_and_exceptions(answer: object, resolution: int) -> None:
    listener = Listener(check=answer)
    answers: list[messaging_pb2.EndTransactionRequest] = []

    async def answer_fn(
        addr: str, check: messaging_pb2.CheckTransactionState, state: LocalTransactionState
    ) -> None:
        answers.append(check_answer("tx-group", check, state))

    checks = CheckDispatcher(listener.check_local_transaction, answer_fn, pool_max=1, hold_max=10)
    assert checks.submit("b:1", _check(1))
    await checks.drain()
    await checks.close()

    [end] = answers
    assert end.resolution == resolution and end.from_transaction_check


async def test_check_queue_is_bounded_and_the_pool_runs_at_most_pool_max_at_once() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    lock = threading.Lock()
    running = [0, 0]  # now, highest
    answered: list[str] = []

    def check(message: ReceivedMessage) -> LocalTransactionState:
        with lock:
            running[0] += 1
            running[1] = max(running)
        started.release()
        release.wait(10)
        with lock:
            running[0] -= 1
        return State.COMMIT_MESSAGE

    async def answer(addr: str, c: messaging_pb2.CheckTransactionState, s: State) -> None:
        answered.append(c.transaction_id)

    checks = CheckDispatcher(check, answer, pool_max=2, hold_max=5)
    accepted = [checks.submit("b:1", _check(i)) for i in range(8)]
    assert accepted == [True] * 5 + [False] * 3
    assert checks.held == 5 and checks.dropped == 3
    for _ in range(2):  # both pool threads are busy and blocked ...
        assert await asyncio.to_thread(started.acquire, timeout=10)
    assert running[0] == 2  # ... and no third check runs beside them
    release.set()
    await checks.drain()
    await checks.close()
    assert not checks.submit("b:1", _check(99))  # closed
    assert sorted(answered) == [f"{i:032X}" for i in range(5)]
    assert checks.answered == 5 and checks.held == 0
    assert running[1] <= 2


def test_end_request_carries_the_half_coordinates() -> None:
    offset_id = encode_offset_msg_id(HostAddress(b"\x7f\0\0\1", 10911), 99)
    half = SendResult(SendStatus.SEND_OK, "ID", offset_id, MessageQueue("t", "b", 0), 5, "")
    req = end_request("g", half, State.ROLLBACK_MESSAGE)
    assert (req.commitlog_offset, req.queue_offset, req.msg_id) == (99, 5, "ID")
    assert req.transaction_id == "ID"  # falls back to the message id
    bad = SendResult(SendStatus.SEND_OK, "ID", "zz", MessageQueue("t", "b", 0), 5, "ID")
    with pytest.raises(ValueError):
        end_request("g", bad, State.COMMIT_MESSAGE)


# ---- admin rows and the CLI's listener --------------------------------------------------------
def _half_pb(i: int, born_ms: int) -> admin_pb2.HalfMessage:
    return admin_pb2.HalfMessage(
        message=common_pb2.StoredMessage(
            message=common_pb2.Message(topic="orders", body=b"b"), msg_id=f"{i:032X}"
        ),
        producer_group="tx-group",
        transaction_id=f"{i:032X}",
        check_times=i,
        born_timestamp_ms=born_ms,
        queue_offset=i,
    )


def test_half_messages_of_several_brokers_merge_oldest_first_and_cut_at_max_num() -> None:
    answers = {
        "broker-b": admin_pb2.ListHalfMessagesResponse(
            messages=[_half_pb(1, 100), _half_pb(2, 300)], total=5
        ),
        "broker-a": admin_pb2.ListHalfMessagesResponse(messages=[_half_pb(3, 200)], total=1),
    }
    rows, totals = merge(answers, max_num=2)
    assert [(h.broker_name, h.born_timestamp_ms) for h in rows] == [
        ("broker-b", 100),
        ("broker-a", 200),
    ]
    assert rows[0].topic == "orders" and rows[0].check_times == 1
    assert rows[0].message.broker_name == "broker-b"
    assert totals == {"broker-a": 1, "broker-b": 5}


async def test_half_messages_refuses_bad_arguments_before_asking() -> None:
    from rocketq.client.admin import Admin

    async with Admin("127.0.0.1:1") as admin:
        for kw in ({"max_num": 0}, {"max_num": 1001}, {"topic": "bad topic!"}):
            with pytest.raises(InvalidArgumentError):
                await admin.half_messages(**kw)


def test_cli_listener_tracks_what_this_run_left_unknown() -> None:
    listener = CliListener("unknown", "commit")
    msg = Message("orders", b"x")
    assert listener.execute_local_transaction(msg, None) is State.UNKNOW
    listener.left_unknown("A")
    listener.left_unknown("B")
    checked = ReceivedMessage("orders", b"x", {}, 0, 0, 0, "A", "", 0, 0, "", "")
    assert listener.check_local_transaction(checked) is State.COMMIT_MESSAGE
    assert listener.unresolved == 1
    stays = CliListener("unknown", "unknown")
    stays.left_unknown("A")
    assert stays.check_local_transaction(checked) is State.UNKNOW and stays.unresolved == 1
