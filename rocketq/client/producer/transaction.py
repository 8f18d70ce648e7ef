"""Transactional producers (SPEC §9): a message that becomes visible only if a local transaction
commits, with the broker asking back when the outcome never arrived.

The flow of :meth:`TransactionProducer.send_message_in_transaction`::

    producer                                   broker
    1. half message (SYSFLAG 0x4, TRAN_MSG,  ->  stored in RMQ_SYS_TRANS_HALF_TOPIC, invisible
       PGROUP), a sync send with retries          to consumers
    2. listener.execute_local_transaction          (only when step 1 answered SEND_OK)
    3. EndTransaction(COMMIT | ROLLBACK |    ->  COMMIT: the message goes to its real topic
       UNKNOWN) to the broker that stored it      ROLLBACK: never delivered; UNKNOWN: no-op
    ...                                          after transactionTimeout without a decision:
    4. listener.check_local_transaction      <-  CheckTransactionState down the ClientStream
       -> EndTransaction(from_transaction_check)  of one live producer of the group

Decisions, as RocketMQ's ``TransactionMQProducer`` makes them:

- a half send that raises raises here, and no local transaction runs;
- a half stored but not SEND_OK (flush or slave timeout) is rolled back without running the
  local transaction, and the result says ROLLBACK_MESSAGE;
- a listener that raises or returns anything but a :class:`LocalTransactionState` means UNKNOW
  (logged): the broker asks again later;
- a failed EndTransaction is logged, never raised: the check-back resolves the transaction.

Delayed messages are refused (the broker refuses them too) and there is no batch API.

**Where the listener runs.** :class:`SyncTransactionProducer` runs
``execute_local_transaction`` in the caller's thread (its database connection, its thread
locals), like RocketMQ. The asyncio :class:`TransactionProducer` runs it on the event loop, in
the caller's task: keep it short, or offload blocking work yourself. ``check_local_transaction``
always runs on a private thread pool of ``check_thread_pool_max`` threads (1 by default,
RocketMQ's checkThreadPoolMinSize) with at most ``check_request_hold_max`` checks waiting or
running; beyond that a check is dropped with a warning (the broker asks again next round).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client import _tracing
from rocketq.client._admin_types import received_message
from rocketq.client._instance import ClientInstance
from rocketq.client._sync import BlockingLifecycle, LoopThread
from rocketq.client.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    RocketQError,
    from_rpc_error,
)
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer._sender import PreparedMessage
from rocketq.client.producer.config import ProducerConfig
from rocketq.codec import Prop, SysFlag
from rocketq.message import Message, ReceivedMessage, SendResult, SendStatus

log = logging.getLogger(__name__)

#: Bounds of the check-back pool (threads) and of the checks held waiting or running.
CHECK_THREAD_POOL_MAX = 64
CHECK_REQUEST_HOLD_MAX = 100_000


class LocalTransactionState(enum.Enum):
    """The outcome of a local transaction (RocketMQ's spelling, UNKNOW included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


_RESOLUTION = {
    LocalTransactionState.COMMIT_MESSAGE: messaging_pb2.TRANSACTION_COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: messaging_pb2.TRANSACTION_ROLLBACK,
    LocalTransactionState.UNKNOW: messaging_pb2.TRANSACTION_UNKNOWN,
}


class TransactionListener(Protocol):
    """What a transactional producer asks about its local transactions."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        """Run the local transaction of ``message`` (its half message is stored); ``arg`` is
        what was passed to ``send_message_in_transaction``."""
        ...

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        """The broker asks how the transaction of ``message`` ended (its ``msg_id`` is the
        transaction id); runs on the producer's check thread pool."""
        ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """Where the half message was stored and what was decided for it."""

    local_state: LocalTransactionState = LocalTransactionState.UNKNOW
    """The decision sent with EndTransaction (ROLLBACK_MESSAGE when the half was not SEND_OK)."""


@dataclass(frozen=True)
class TransactionProducerConfig(ProducerConfig):
    """A :class:`ProducerConfig` plus how check-backs are answered. A plain ProducerConfig
    given to :class:`TransactionProducer` gets these defaults."""

    check_thread_pool_max: int = 1
    """Threads running ``check_local_transaction`` (1..64; RocketMQ's checkThreadPoolMinSize)."""
    check_request_hold_max: int = 2000
    """Checks waiting or running; a check beyond this is dropped with a warning (the broker asks
    again at its next round; RocketMQ's checkRequestHoldMax)."""
    end_transaction_timeout_ms: int = 3000
    """Deadline of one EndTransaction call; a failed one is logged, not raised."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.check_thread_pool_max <= CHECK_THREAD_POOL_MAX:
            raise ValueError(f"check_thread_pool_max must be 1..{CHECK_THREAD_POOL_MAX}")
        if not 1 <= self.check_request_hold_max <= CHECK_REQUEST_HOLD_MAX:
            raise ValueError(f"check_request_hold_max must be 1..{CHECK_REQUEST_HOLD_MAX}")
        if self.end_transaction_timeout_ms <= 0:
            raise ValueError("end_transaction_timeout_ms must be positive")


def transaction_config(config: ProducerConfig) -> TransactionProducerConfig:
    """``config`` as a TransactionProducerConfig (defaults for the check-back settings)."""
    if isinstance(config, TransactionProducerConfig):
        return config
    if not isinstance(config, ProducerConfig):
        raise TypeError(f"config must be a ProducerConfig, got {type(config).__name__}")
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ProducerConfig)}
    return TransactionProducerConfig(**fields)


# ---- pure steps (no network) ----------------------------------------------------------------
def check_not_delayed(msg: Message) -> None:
    """InvalidArgumentError (a ValueError) for a delayed message: a half message waits for its
    transaction's decision, and a delay on top has no meaning (SPEC §9 limits)."""
    if msg.delay_level or msg.deliver_time_ms or msg.delay_ms:
        raise InvalidArgumentError(
            f"a transactional message to {msg.topic!r} cannot be delayed (delay_level, "
            "deliver_time_ms and delay_ms must be 0); send it without a delay"
        )


def half_message(item: PreparedMessage, group: str, max_size_bytes: int) -> PreparedMessage:
    """The half message of a checked message: TRAN_MSG=true and PGROUP=group added (the
    request's SYSFLAG 0x4 is set when it is sent)."""
    extra = {Prop.TRANSACTION_PREPARED: "true", Prop.PRODUCER_GROUP: group}
    size = item.size_bytes + len(codec.encode_properties(extra))
    if size > max_size_bytes:
        raise MessageTooLargeError(
            f"message to {item.topic!r} is {size} bytes with its transaction properties; the "
            f"limit is {max_size_bytes} (max_message_size_bytes)"
        )
    props = {**item.props, **extra}
    return PreparedMessage(
        item.topic,
        item.flag,
        item.body,
        props,
        codec.encode_properties(props),
        item.msg_id,
        size,
        item.delayed,
    )


def run_listener(what: str, call: Callable[[], object]) -> LocalTransactionState:
    """Call a listener method; an exception, None or a wrong type is UNKNOW (logged)."""
    try:
        state = call()
    except Exception:
        log.exception("%s raised; the transaction stays UNKNOW until the next check", what)
        return LocalTransactionState.UNKNOW
    if not isinstance(state, LocalTransactionState):
        log.warning("%s returned %r, not a LocalTransactionState; treated as UNKNOW", what, state)
        return LocalTransactionState.UNKNOW
    return state


def decide(half: SendResult, execute: Callable[[], object]) -> LocalTransactionState:
    """The decision for a stored half: the local transaction's when it is SEND_OK, else
    ROLLBACK_MESSAGE without running it (RocketMQ does the same)."""
    if half.status is SendStatus.SEND_OK:
        return run_listener(f"execute_local_transaction({half.msg_id})", execute)
    log.warning(
        "half message %s was stored with status %s; rolled back without running the local "
        "transaction",
        half.msg_id,
        half.status.value,
    )
    return LocalTransactionState.ROLLBACK_MESSAGE


def end_request(
    group: str, half: SendResult, state: LocalTransactionState
) -> messaging_pb2.EndTransactionRequest:
    """EndTransaction for a half message this producer just stored (ValueError when its
    offset message id is malformed)."""
    _, commitlog_offset = codec.decode_offset_msg_id(half.offset_msg_id)
    return messaging_pb2.EndTransactionRequest(
        producer_group=group,
        commitlog_offset=commitlog_offset,
        queue_offset=half.queue_offset,
        msg_id=half.msg_id,
        transaction_id=half.transaction_id or half.msg_id,
        resolution=_RESOLUTION[state],
        from_transaction_check=False,
    )


def check_answer(
    group: str, check: messaging_pb2.CheckTransactionState, state: LocalTransactionState
) -> messaging_pb2.EndTransactionRequest:
    """EndTransaction answering a broker's CheckTransactionState."""
    return messaging_pb2.EndTransactionRequest(
        producer_group=check.producer_group or group,
        commitlog_offset=check.commitlog_offset,
        queue_offset=check.queue_offset,
        msg_id=check.msg_id,
        transaction_id=check.transaction_id or check.msg_id,
        resolution=_RESOLUTION[state],
        from_transaction_check=True,
    )


def checked_message(check: messaging_pb2.CheckTransactionState) -> ReceivedMessage:
    """The message a check-back is about, as the listener sees it (its real topic)."""
    msg = received_message(check.message)
    if not msg.msg_id:
        msg.msg_id = check.msg_id or check.transaction_id
    return msg


# ---- check-backs ----------------------------------------------------------------------------
class CheckDispatcher:
    """Runs ``check`` on a bounded thread pool for each check-back and hands the decision to
    ``answer``; at most ``hold_max`` checks are held (waiting or running), the rest dropped.

    ``submit`` is called on the event loop (by the broker stream) and never blocks it.
    """

    def __init__(
        self,
        check: Callable[[ReceivedMessage], LocalTransactionState],
        answer: Callable[
            [str, messaging_pb2.CheckTransactionState, LocalTransactionState], Awaitable[None]
        ],
        *,
        pool_max: int,
        hold_max: int,
    ) -> None:
        self._check = check
        self._answer = answer
        self._hold_max = hold_max
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=pool_max, thread_name_prefix="rocketq-tx-check"
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.dropped = 0
        """Checks refused because ``hold_max`` were already held."""
        self.answered = 0
        """Checks whose answer was handed to ``answer``."""

    @property
    def held(self) -> int:
        """Checks waiting for a thread, running, or being answered."""
        return len(self._tasks)

    def submit(self, broker_addr: str, check: messaging_pb2.CheckTransactionState) -> bool:
        """Queue one check-back; False (and a warning) when closed or too many are held."""
        if self._closed:
            return False
        if len(self._tasks) >= self._hold_max:
            self.dropped += 1
            log.warning(
                "dropped the check of transaction %s from %s: %d checks are already held "
                "(check_request_hold_max); the broker will ask again",
                check.transaction_id,
                broker_addr,
                len(self._tasks),
            )
            return False
        task = asyncio.get_running_loop().create_task(self._run(broker_addr, check))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run(self, broker_addr: str, check: messaging_pb2.CheckTransactionState) -> None:
        message = checked_message(check)
        what = f"check_local_transaction({check.transaction_id})"
        loop = asyncio.get_running_loop()
        tid = check.transaction_id
        with _tracing.check_span(check.producer_group, message.topic, tid, message.properties):
            state = await loop.run_in_executor(
                self._pool, run_listener, what, lambda: self._check(message)
            )
            self.answered += 1
            try:
                await self._answer(broker_addr, check, state)
            except Exception:
                log.exception("answering the check of transaction %s failed", tid)

    async def drain(self) -> None:
        """Wait until every held check has been answered (tests, close)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def close(self, grace_s: float = 5.0) -> None:
        """Refuse new checks, give held ones ``grace_s`` to finish, then stop the pool."""
        self._closed = True
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---- the producers --------------------------------------------------------------------------
class TransactionProducer:
    """Sends messages in transactions (RocketMQ's ``TransactionMQProducer``), asyncio first.

    ``listener`` decides each transaction (:class:`TransactionListener`). Use as
    ``async with TransactionProducer(config, listener) as p:`` or call start() / close().
    Give a producer group used only by transactional producers: the broker asks any live
    member of the group about a transaction. From start() on, every master of the cluster
    knows this producer, so a standby that has sent nothing yet is asked about the
    transactions of a crashed member of its group. ``topics`` declares the topics it will
    send to, as the RocketMQ 5 SDKs do: their routes are fetched at start.
    """

    def __init__(
        self,
        config: ProducerConfig,
        listener: TransactionListener,
        topics: Sequence[str] = (),
    ) -> None:
        if isinstance(topics, str):
            raise TypeError("topics is a sequence of topic names, not one string")
        for name in ("execute_local_transaction", "check_local_transaction"):
            if not callable(getattr(listener, name, None)):
                raise TypeError(f"the transaction listener has no {name}() method")
        self.config = transaction_config(config)
        self.listener = listener
        self._core = ProducerCore(self.config)
        self._checks = CheckDispatcher(
            listener.check_local_transaction,
            self._answer_check,
            pool_max=self.config.check_thread_pool_max,
            hold_max=self.config.check_request_hold_max,
        )
        self._core.check_handler = self._checks.submit
        self.topics = tuple(topics)

    @property
    def client_id(self) -> str:
        return self._core.instance.client_id

    @property
    def instance(self) -> ClientInstance:
        """The shared client instance (routes, channels); available once started."""
        return self._core.instance

    @property
    def checks(self) -> CheckDispatcher:
        """The check-back pool: ``held``, ``answered`` and ``dropped`` counts."""
        return self._checks

    async def start(self) -> None:
        """Register the group with every master and fetch the declared topics' routes; call
        once before sending."""
        await self._core.start()
        if self.topics:
            await self._core.declare_topics(self.topics)

    async def close(self) -> None:
        """Stop answering check-backs (held ones get a few seconds) and leave the instance."""
        await self._checks.close()
        self._core.check_handler = None
        await self._core.close()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send_message_in_transaction(
        self, message: Message, arg: object = None
    ) -> TransactionSendResult:
        """Store ``message`` as a half message, run the listener's local transaction and end
        the transaction with its decision (see the module docstring for every case)."""
        half, addr = await self.send_half(message)
        state = decide(half, lambda: self.listener.execute_local_transaction(message, arg))
        await self.end_transaction(addr, half, state)
        return result_of(half, state)

    async def send_half(self, message: Message) -> tuple[SendResult, str | None]:
        """Step 1: store the half message (sync send, retried on another broker like
        :meth:`Producer.send`); returns its result and the address of the broker storing it."""
        core = self._core
        core.instance  # noqa: B018 - raises ClientStateError unless started
        check_not_delayed(message)
        cfg = self.config
        item = half_message(core.prepare(message), cfg.group, cfg.max_message_size_bytes)
        [half] = await core.send_with_retries(
            message.topic,
            [item],
            timeout_ms=cfg.send_msg_timeout_ms,
            retries=cfg.retry_times_when_send_failed,
            sys_flag=SysFlag.TRANSACTION_PREPARED,
        )
        return half, self._broker_addr(half)

    def _broker_addr(self, half: SendResult) -> str | None:
        addr = self._core.instance.find_broker_addr(
            half.message_queue.broker_name, only_this_broker=True
        )
        if addr is not None:
            return addr
        try:  # the route changed under us: the store host the offset message id encodes
            return str(codec.decode_offset_msg_id(half.offset_msg_id)[0])
        except ValueError:
            return None

    async def end_transaction(
        self, addr: str | None, half: SendResult, state: LocalTransactionState
    ) -> bool:
        """Step 3: EndTransaction to the broker that stored ``half``; False (logged) when it
        failed, which the broker's check-back repairs."""
        if addr is None:
            log.warning(
                "no address for broker %s: transaction %s is left to the broker's check",
                half.message_queue.broker_name,
                half.msg_id,
            )
            return False
        try:
            req = end_request(self.config.group, half, state)
        except ValueError as exc:
            log.warning("cannot end transaction %s: %s", half.msg_id, exc)
            return False
        return await self._end(addr, req)

    async def _answer_check(
        self,
        broker_addr: str,
        check: messaging_pb2.CheckTransactionState,
        state: LocalTransactionState,
    ) -> None:
        await self._end(broker_addr, check_answer(self.config.group, check, state))

    async def _end(self, addr: str, req: messaging_pb2.EndTransactionRequest) -> bool:
        timeout_s = self.config.end_transaction_timeout_ms / 1000
        try:
            stub = self._core.instance.messaging(addr)
            await stub.EndTransaction(req, timeout=timeout_s)
        except grpc.RpcError as err:
            exc: RocketQError = from_rpc_error(err, addr)
            log.warning(
                "EndTransaction(%s, %s) to %s failed: %s; the broker's check will ask again",
                req.transaction_id,
                messaging_pb2.TransactionResolution.Name(req.resolution),
                addr,
                exc.message,
            )
            return False
        except RocketQError as exc:  # closed meanwhile
            log.warning("EndTransaction(%s) not sent: %s", req.transaction_id, exc.message)
            return False
        return True


def result_of(half: SendResult, state: LocalTransactionState) -> TransactionSendResult:
    return TransactionSendResult(
        half.status,
        half.msg_id,
        half.offset_msg_id,
        half.message_queue,
        half.queue_offset,
        half.transaction_id or half.msg_id,
        state,
    )


class SyncTransactionProducer(BlockingLifecycle):
    """:class:`TransactionProducer` with blocking methods; ``execute_local_transaction`` runs
    in the thread that calls :meth:`send_message_in_transaction`."""

    _producer: TransactionProducer

    def __init__(
        self,
        config: ProducerConfig,
        listener: TransactionListener,
        topics: Sequence[str] = (),
    ) -> None:
        self._producer = TransactionProducer(config, listener, topics)
        self.config = self._producer.config
        self.listener = listener
        self._loop = LoopThread("rocketq-transaction-producer")

    @property
    def checks(self) -> CheckDispatcher:
        return self._producer.checks

    def send_message_in_transaction(
        self, message: Message, arg: object = None
    ) -> TransactionSendResult:
        """:meth:`TransactionProducer.send_message_in_transaction`, blocking; the local
        transaction runs here, in the calling thread."""
        producer = self._producer
        half, addr = self._loop.run(producer.send_half(message))
        state = decide(half, lambda: self.listener.execute_local_transaction(message, arg))
        self._loop.run(producer.end_transaction(addr, half, state))
        return result_of(half, state)
