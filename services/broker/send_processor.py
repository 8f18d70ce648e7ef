"""Send: validate a batch, auto-create its topic if allowed, store it, say where it went.

The checks, in order (each failure leaves nothing stored; proto ``Messaging.Send`` lists the
codes):

| check                                                        | refusal                          |
|--------------------------------------------------------------|----------------------------------|
| this broker is a master                                      | UNAVAILABLE NOT_MASTER           |
| broker perm has WRITE                                        | PERMISSION_DENIED                |
| at least one message; all of one topic; topic name valid     | INVALID_ARGUMENT                 |
| topic not a send-forbidden system topic (TBW102, rmq_sys_…)  | PERMISSION_DENIED                |
| topic known, or auto-created from ``default_topic``          | NOT_FOUND TOPIC_NOT_EXIST        |
| topic perm has WRITE; 0 <= queue_id < write_queue_nums       | PERMISSION_DENIED / INVALID      |
| bodies non-empty (RocketMQ refuses empty bodies)             | INVALID_ARGUMENT                 |
| no reserved property (UNIQ_KEY excepted), no separator chars | INVALID_ARGUMENT                 |
| topic + bodies + properties <= max_message_size_bytes        | INVALID MESSAGE_TOO_LARGE        |
| batch > 1: no delayed or transactional message (SPEC §5.5)   | INVALID_ARGUMENT                 |
| one delay property, a level of messageDelayLevel, TIMER_*    | INVALID_ARGUMENT                 |
| integers >= 0, delay <= timerMaxDelaySec; not transactional  |                                  |
| transactional: a producer group is named                     | INVALID_ARGUMENT                 |

Then each message gets UNIQ_KEY (if the producer sent none), its tags hash for the consume
queue, its keys for the index, and the caller's address as born host; the batch goes to the
store in one append. A delayed message (or a timer cancel marker) is stored in the timer topic
instead of its own (services.broker.timer_put); a timer-wheel re-put (TIMER_SOURCE) may carry
the reserved properties the broker put on the timer record, is never delayed again, and is
stored once: a repeat is answered with the first store's position. A transactional message
(sys_flag 0x4 or TRAN_MSG=true) is stored as a half message in RMQ_SYS_TRANS_HALF_TOPIC
(services.broker.transaction_half): the result names the queue the producer asked for, the half
queue offset, and transaction_id = its UNIQ_KEY.

**No group commit here, on measurement.** Coalescing concurrent single-message Sends into one
store append (a queue drained by a ``call_soon`` callback) was tried: in-process it cut the
store's cost of 50 concurrent lone messages from ~32 to ~19 µs each, but behind the gRPC server
it did nothing useful — grpc.aio hands each RPC to the loop in its own iteration, so with
3 × 64 concurrent senders 33 004 Sends still made 31 352 appends, while a unary RPC costs the
broker ~180 µs of framework CPU before any handler runs. Durability already has its group
commit: under SYNC_FLUSH one fsync releases every waiting writer (``FlushService``). Batches
are the way to throughput (a 256-message batch: ~100 000 msgs/s, ~11 µs of broker CPU each).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, NoReturn

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.codec import HostAddress, Prop, SysFlag
from rocketq.message import RESERVED_PROPERTIES
from rocketq.validation import (
    AUTO_CREATE_TOPIC_KEY,
    QUEUE_NUMS_MAX,
    RETRY_GROUP_TOPIC_PREFIX,
    TIMER_TOPIC,
    check_group,
    check_topic,
    is_writeable,
)
from services.broker.config import BrokerConfig
from services.broker.ha_tracker import HaWaiter, leadership_lost_error, sync_master_wait
from services.broker.model import TopicConfig
from services.broker.send_errors import store_call
from services.broker.send_ids import UniqueIds, offset_msg_id_prefix, parse_peer
from services.broker.send_records import (
    BadBatch,
    ParsedBatch,
    as_messages,
    as_parsed,
    as_sent_batch,
    parse_columns,
    too_large_at,
)
from services.broker.timer_put import (
    DELAY_PROPERTIES,
    DelayError,
    RePutDedup,
    StoredRePut,
    delivery_ms,
    ensure_timer_topic,
    mono_ms,
    timer_properties,
    timer_queue_id,
)
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_batch import check_batch_half
from services.broker.transaction_half import TransactionIndex, half_message
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, denied, invalid, not_found
from services.store.commitlog import AppendResult, MessageToStore, SentAppend, SentBatch
from services.store.flush import FlushDiskType
from services.store.message_store import MessageStore

log = logging.getLogger(__name__)

PEER_CACHE_MAX = 10_000
"""Parsed peer addresses kept; the cache is cleared when it fills up."""

SEND_OK = messaging_pb2.SEND_OK
FLUSH_DISK_TIMEOUT = messaging_pb2.FLUSH_DISK_TIMEOUT
_PRODUCER_SYS_FLAGS = SysFlag.COMPRESSED | SysFlag.TRANSACTION_PREPARED
#: Reserved names a producer may not set; UNIQ_KEY is the producer's to set, and the
#: transaction markers make the message a transactional half message.
_FORBIDDEN_PROPERTIES = RESERVED_PROPERTIES - {
    Prop.UNIQ_KEY,
    Prop.TRANSACTION_PREPARED,
    Prop.PRODUCER_GROUP,
}
#: Properties that send a message down the slow path (delays, re-puts, cancel markers, ...).
_CHECKED_PROPERTIES = _FORBIDDEN_PROPERTIES.union(
    DELAY_PROPERTIES, (Prop.TRANSACTION_PREPARED, Prop.TIMER_SOURCE, Prop.TIMER_DEL_UNIQKEY)
)


def _encode_properties(props: dict[str, str], index: int, topic: str) -> bytes:
    """``name\\x01value\\x02`` per property, as the codec writes them, checked by counting:
    exactly one of each separator per property means no name or value contains one."""
    text = "".join([f"{k}\x01{v}\x02" for k, v in props.items()])
    n = len(props)
    if text.count("\x01") != n or text.count("\x02") != n:
        try:
            codec.encode_properties(props)  # for its message naming the property
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"message {index}: {exc}", topic=topic)
    encoded = text.encode()
    if len(encoded) > codec.PROPERTIES_MAX_BYTES:
        invalid(
            common_pb2.MESSAGE_TOO_LARGE,
            f"message {index}'s properties take {len(encoded)} bytes; the limit is "
            f"{codec.PROPERTIES_MAX_BYTES}",
            topic=topic,
        )
    return encoded


class _Hop(NamedTuple):
    """What a message's special properties mean for it."""

    transactional: bool
    out_ms: int | None
    """Delivery time of a message going to the timer topic; None = stored in its topic."""
    source: str | None
    """TIMER_SOURCE of a timer-wheel re-put."""


@dataclass(slots=True)
class SendPlan:
    """What one Send stores and how it is answered."""

    to_store: list[MessageToStore]
    uniq_keys: list[str]
    """UNIQ_KEY of each message in ``to_store``."""
    wait: bool
    sources: dict[str, int] = field(default_factory=dict)
    """TIMER_SOURCE of each re-put to store -> its index in ``to_store``."""
    repeats: list[tuple[int, StoredRePut | int]] = field(default_factory=list)
    """Re-puts stored already: (position in the request, the first store, or the index in
    ``to_store`` of an earlier message of this request with the same source)."""
    repeats_end_offset: int = 0
    """Commitlog end of the repeats' first stores: the answer waits for their flush too."""
    half: bool = False
    """The one message is a transactional half message (stored in the half topic)."""
    sent: SentBatch | None = None
    """The request's records, checked, to store as they came (instead of ``to_store``)."""

    def repeat_of(self, position: int, source: str, dedup: RePutDedup) -> bool:
        """Whether ``source`` was stored before (or earlier in this request); if so the
        repeat is noted for the answer."""
        stored = dedup.get(source)
        if stored is not None:
            self.repeats_end_offset = max(self.repeats_end_offset, stored.end_offset)
            self.repeats.append((position, stored))
            return True
        index = self.sources.get(source)
        if index is None:
            return False
        self.repeats.append((position, index))
        return True


class SendProcessor:
    """Validates and stores Send requests (one per broker)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        clock: Clock = SYSTEM_CLOCK,
        transactions: TransactionIndex | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.clock = clock
        self.transactions = transactions if transactions is not None else TransactionIndex()
        """Told of every half message stored (services.broker.transaction_half)."""
        self._peers: dict[str, HostAddress] = {}
        self._id_prefix = offset_msg_id_prefix(store.config.store_host)
        self._unique_ids = UniqueIds(store.config.store_host)
        self._levels_ms = config.delay_levels_ms()
        self.dedup = RePutDedup(clock)
        """TIMER_SOURCE values stored recently (timer-wheel re-puts)."""
        self.ha_waiter: HaWaiter | None = None
        """Set on masters (server.py); waited on only while brokerRole is SYNC_MASTER."""

    # -- entry point -----------------------------------------------------------------------
    async def send(
        self, request: messaging_pb2.SendRequest, peer: str
    ) -> messaging_pb2.SendResponse:
        """Validate, store and answer one Send; raises ServiceError for a refused request."""
        plan = self.build(request, peer)
        to_store, sent = plan.to_store, plan.sent
        if sent is not None:
            appended = store_call(lambda: self.store.append_sent(sent), sent.topic)
            return await self._answer_sent(
                plan, appended, request.queue_id, request.compact_response
            )
        if to_store:
            results = store_call(lambda: self.store.append(to_store), to_store[0].topic)
        else:
            results = []
        if plan.sources:
            self._remember_sources(plan, results, request.queue_id)
        if plan.half and results:  # same loop step as the append: the check service sees it
            self.transactions.note_half(plan.uniq_keys[0], results[0].queue_offset)
        end = plan.repeats_end_offset
        if results:
            end = max(end, results[-1].physical_offset + results[-1].size_bytes)
        status = await self._wait_durable(plan, end)
        prefix = self._id_prefix
        qid = request.queue_id
        response = messaging_pb2.SendResponse()
        add = response.results.add  # ~2x cheaper per result than building SendResult objects
        if plan.repeats:
            _answer_with_repeats(add, plan, results, status, prefix, qid)
            return response
        for r, uniq in zip(results, plan.uniq_keys, strict=True):
            add(
                status=status,
                msg_id=uniq,
                offset_msg_id=f"{prefix}{r.physical_offset:016X}",
                queue_id=qid,
                queue_offset=r.queue_offset,
            )
        if plan.half and results:
            response.results[0].transaction_id = plan.uniq_keys[0]
        return response

    async def _answer_sent(
        self, plan: SendPlan, appended: SentAppend, qid: int, compact: bool
    ) -> messaging_pb2.SendResponse:
        """The answer to a batch stored by ``append_sent``, once durable as the policy asks:
        one SendBatchResult when the sender asked for it (``compact``; it knows its ids), else
        a SendResult per message."""
        status = await self._wait_durable(plan, appended.end_offset)
        prefix = self._id_prefix
        response = messaging_pb2.SendResponse()
        if compact:
            # The whole answer in five fields: building 128 results and their offset ids cost
            # the broker ~0.8 µs per message, and the client as much again to read them.
            batch = response.batch
            batch.status = status
            batch.queue_id = qid
            batch.first_queue_offset = appended.first_queue_offset
            batch.offset_msg_id_prefix = prefix
            batch.physical_offsets.extend(appended.physical_offsets)
            return response
        add = response.results.add
        for phys, uniq, qoff in zip(
            appended.physical_offsets,
            plan.uniq_keys,
            range(appended.first_queue_offset, appended.first_queue_offset + len(plan.uniq_keys)),
            strict=True,
        ):
            add(
                status=status,
                msg_id=uniq,
                offset_msg_id=f"{prefix}{phys:016X}",
                queue_id=qid,
                queue_offset=qoff,
            )
        return response

    async def _wait_durable(self, plan: SendPlan, end: int) -> messaging_pb2.SendStatus.ValueType:
        """SEND_OK once the bytes below ``end`` are as durable as the policy asks: flushed under
        SYNC_FLUSH (one group-committed fsync for every writer waiting), on an in-sync slave
        under SYNC_MASTER; FLUSH_DISK_TIMEOUT or the replication status otherwise."""
        status = SEND_OK
        if not (end and plan.wait):
            return status
        waited = False
        if self.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            waited = True
            if not await self.store.flusher.wait_flushed(end):
                status = FLUSH_DISK_TIMEOUT
        if status == SEND_OK:
            # SYNC_MASTER (DESIGN.md §6): SEND_OK only once an in-sync slave has the bytes.
            replicated = await sync_master_wait(self.ha_waiter, self.config, end)
            if replicated is not None:
                waited = True
                status = replicated
        if waited and not self.config.is_master:
            raise leadership_lost_error()  # the lease fence dropped during the wait
        return status

    def _remember_sources(self, plan: SendPlan, results: list[AppendResult], qid: int) -> None:
        """Record where each re-put went, so a repeat of its TIMER_SOURCE stores nothing."""
        prefix = self._id_prefix
        now_ms = mono_ms(self.clock)
        for source, index in plan.sources.items():
            r = results[index]
            self.dedup.add(
                source,
                StoredRePut(
                    stored_ms=now_ms,
                    msg_id=plan.uniq_keys[index],
                    offset_msg_id=f"{prefix}{r.physical_offset:016X}",
                    queue_id=qid,
                    queue_offset=r.queue_offset,
                    end_offset=r.physical_offset + r.size_bytes,
                ),
            )

    # -- validation ------------------------------------------------------------------------
    def build(self, request: messaging_pb2.SendRequest, peer: str) -> SendPlan:
        """Check ``request`` and turn it into a plan: store messages, their unique ids, whether
        SEND_OK must wait for the flush policy, and re-puts already stored. Raises
        ServiceError."""
        cfg = self.config
        if not cfg.is_master:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.NOT_MASTER,
                f"broker {cfg.broker_name} id {cfg.broker_id} is a slave; send to its master",
            )
        if not is_writeable(cfg.broker_permission):
            denied(
                f"broker {cfg.broker_name} is not writable (brokerPermission "
                f"{cfg.broker_permission})"
            )
        messages = request.messages
        if not messages:
            records = request.records  # read once: upb copies a bytes field at every read
            if records:
                return self._build_sent(request, records, peer)
        elif request.records:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "set messages or records, not both")
        count = len(messages)
        if count == 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "the request holds no message; send at least one")
        topic = messages[0].topic
        self._check_target(request, topic)
        sys_flag = request.sys_flag
        if sys_flag & ~_PRODUCER_SYS_FLAGS & 0xFF or sys_flag & SysFlag.TRANSACTION_MASK not in (
            0,
            SysFlag.TRANSACTION_PREPARED,
        ):
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"sys_flag 0x{sys_flag:x}: a producer may set only 0x1 (compressed) and 0x4 "
                "(transactional half message)",
            )
        transactional = bool(sys_flag & SysFlag.TRANSACTION_PREPARED)
        return self._build_messages(request, topic, peer, transactional)

    def _check_target(self, request: messaging_pb2.SendRequest, topic: str) -> None:
        """The topic (auto-created if allowed), its permission and queue, the group's name."""
        topic_cfg = self._topic_config(topic, request)
        if not is_writeable(topic_cfg.perm):
            denied(f"topic {topic} is not writable (perm {topic_cfg.perm})", topic=topic)
        qid = request.queue_id
        if not 0 <= qid < topic_cfg.write_queue_nums:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"queue id {qid} is outside [0, {topic_cfg.write_queue_nums}) for topic {topic}",
                topic=topic,
            )
        if request.producer_group:
            _check(check_group, request.producer_group, "producer group")
        if request.reconsume_times < 0:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "reconsume_times must not be negative")

    def _build_sent(self, request: messaging_pb2.SendRequest, buf: bytes, peer: str) -> SendPlan:
        """The plan of a batch sent as records (send_records.py): checked whole, then stored
        as it came, or, when a record needs the per-message rules, turned into messages.
        The loop over the records runs per message: columns, no object per record."""
        try:
            cols = parse_columns(buf)
        except BadBatch as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"records: {exc}")
        topic = cols.topic
        self._check_target(request, topic)
        host = self._born_host(peer)
        if (
            host.is_v6
            or self.store.config.store_host.is_v6
            or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        ):
            return self._build_sent_as_messages(request, as_parsed(cols, buf), peer)
        limit = self.config.max_message_size_bytes
        over_at = too_large_at(cols, limit)
        if over_at is not None:
            _too_large(limit, len(cols.pos), over_at, topic)
        fast = as_sent_batch(
            cols, buf, request.queue_id, host, request.reconsume_times, _CHECKED_PROPERTIES
        )
        if fast is None:
            return self._build_sent_as_messages(request, as_parsed(cols, buf), peer)
        sent, wait = fast
        return SendPlan([], sent.uniq_keys, wait, sent=sent)

    def _build_sent_as_messages(
        self, request: messaging_pb2.SendRequest, batch: ParsedBatch, peer: str
    ) -> SendPlan:
        """The ordinary per-message path for records that need it (delays, transactions,
        re-puts, retries, reserved properties, a missing UNIQ_KEY, IPv6 hosts)."""
        try:
            messages, sys_flag = as_messages(batch, request.records)
        except BadBatch as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"records: {exc}")
        slow = messaging_pb2.SendRequest()
        slow.CopyFrom(request)
        slow.ClearField("records")
        slow.messages.extend(messages)
        slow.sys_flag = sys_flag
        slow.born_timestamp_ms = batch.records[0].born_timestamp_ms
        return self.build(slow, peer)

    def _build_messages(
        self, request: messaging_pb2.SendRequest, topic: str, peer: str, transactional: bool
    ) -> SendPlan:
        """Check each message and turn it into what the store appends. The loop runs per message:
        it keeps its constants in locals and calls out only for the checks of rare cases (special
        properties, a delay, an oversized batch); a call per step would cost more than the step."""
        messages = request.messages
        count = len(messages)
        is_retry = topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        qid = request.queue_id
        now_ms = self.clock.now_ms()
        born_ms, host, sys_flag, reconsume = self._request_fields(request, peer, now_ms)
        max_reconsume = _max_reconsume(request, is_retry)
        limit = self.config.max_message_size_bytes
        tags_hash = codec.tags_hash
        new_id = self._unique_ids.factory(now_ms)
        total = 0
        wait = False
        plan = SendPlan([], [], False)
        out = plan.to_store
        for i, m in enumerate(messages):
            props = self._message_properties(m, i, topic)
            to_topic, to_qid, out_ms, source = topic, qid, None, None
            if not _CHECKED_PROPERTIES.isdisjoint(props):
                hop = self._special_properties(props, i, count, topic, is_retry, now_ms)
                transactional = transactional or hop.transactional
                out_ms, source = hop.out_ms, hop.source
                if source is not None and plan.repeat_of(i, source, self.dedup):
                    continue  # stored once already: answered with that store's position
            if max_reconsume is not None:
                props[Prop.MAX_RECONSUME_TIMES] = max_reconsume
            uniq = props.get(Prop.UNIQ_KEY)
            if not uniq:
                uniq = props[Prop.UNIQ_KEY] = new_id()
            if out_ms is not None:
                props, to_topic, to_qid = self._to_timer(props, topic, qid, out_ms, uniq)
            encoded = _encode_properties(props, i, topic)
            total += len(to_topic) + len(m.body) + len(encoded)
            if total > limit:
                _too_large(limit, count, i, topic)
            if props.get(Prop.WAIT_STORE_MSG_OK) != "false":
                wait = True
            out.append(
                MessageToStore(
                    to_topic,
                    to_qid,
                    m.body,
                    encoded,
                    tags_hash(props.get(Prop.TAGS, "")),
                    props.get(Prop.KEYS, ""),
                    uniq,
                    m.flag,
                    sys_flag,
                    born_ms,
                    host,
                    reconsume,
                )
            )
            plan.uniq_keys.append(uniq)
            if source is not None:
                plan.sources[source] = len(out) - 1
        if transactional:
            self._make_half(plan, request, topic)
        plan.wait = wait
        return plan

    def _request_fields(
        self, request: messaging_pb2.SendRequest, peer: str, now_ms: int
    ) -> tuple[int, HostAddress, int, int]:
        """What every message of one request shares: born time, born host, the sys flag the
        producer may set per request (compressed), reconsume times."""
        born_ms = request.born_timestamp_ms or now_ms
        sys_flag = request.sys_flag & SysFlag.COMPRESSED
        return born_ms, self._born_host(peer), sys_flag, request.reconsume_times

    def _make_half(self, plan: SendPlan, request: messaging_pb2.SendRequest, topic: str) -> None:
        """Turn the planned message into a transactional half message (SPEC §8), after
        refusing what a transaction cannot be (a batch, a delay)."""
        out = plan.to_store
        # Only a lone message reaches here delayed (a batch with a delay is refused per message),
        # and only a delayed one is planned into the timer topic (producers may not send to it).
        delayed = bool(out) and out[0].topic == TIMER_TOPIC
        self._refuse_transactional(len(request.messages), delayed, topic)
        if out:
            # -- batch half messages (sink2; services/broker/transaction_batch.py) --
            pb_props = request.messages[0].properties
            if Prop.TRANSACTION_BATCH in pb_props:
                check_batch_half(
                    dict(pb_props), out[0].body, request.sys_flag, topic,
                    now_ms=self.clock.now_ms(), config=self.config,
                )  # fmt: skip
            out[0] = half_message(out[0], producer_group=request.producer_group, topics=self.topics)
            plan.half = True

    @staticmethod
    def _message_properties(m: common_pb2.Message, index: int, topic: str) -> dict[str, str]:
        """Topic and body checks of one message of a batch; its properties as a dict."""
        if m.topic != topic:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"message {index} has topic {m.topic!r} but message 0 has {topic!r}; a batch "
                "must hold one topic",
            )
        if not m.body:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"message {index} has an empty body", topic=topic)
        pb_props = m.properties
        # A comprehension over the upb map is 2-3x cheaper than dict(map).
        return {k: pb_props[k] for k in pb_props} if pb_props else {}

    @staticmethod
    def _refuse_transactional(count: int, delayed: bool, topic: str) -> None:
        if delayed:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                "a transactional message cannot be delayed; send it without DELAY / TIMER_* "
                "properties",
                topic=topic,
            )
        if count > 1:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                "a batch of more than one message may not hold a transactional message (SPEC §5.5)",
                topic=topic,
            )

    def _special_properties(
        self,
        props: dict[str, str],
        index: int,
        count: int,
        topic: str,
        is_retry: bool,
        now_ms: int,
    ) -> _Hop:
        """Reserved names, delays, re-puts and transaction markers of one message; removes
        the delay properties of a message not (or no longer) delayed. Raises ServiceError."""
        source = props.get(Prop.TIMER_SOURCE)
        if source is not None:
            # The timer-wheel's re-put: it carries what the broker put on the timer record
            # (REAL_TOPIC, RETRY_TOPIC, ...) and is never delayed again.
            if not source:
                invalid(common_pb2.ILLEGAL_ARGUMENT, f"message {index}: TIMER_SOURCE is empty")
            for name in DELAY_PROPERTIES:
                props.pop(name, None)
            return _Hop(False, None, source)
        if not is_retry:
            # A consumer's local resubmission to %RETRY%{group} legitimately carries the retry
            # properties (RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME, ...).
            _refuse_reserved(props, index, topic)
        transactional = props.get(Prop.TRANSACTION_PREPARED, "").lower() == "true"
        try:
            out_ms = delivery_ms(
                props,
                now_ms=now_ms,
                levels_ms=self._levels_ms,
                max_delay_ms=self.config.timer_max_delay_sec * 1000,
            )
        except DelayError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, f"message {index}: {exc}", topic=topic)
        cancel = Prop.TIMER_DEL_UNIQKEY in props
        if cancel and (out_ms is None or not props[Prop.TIMER_DEL_UNIQKEY]):
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"message {index}: a cancel marker needs a timer handle in TIMER_DEL_UNIQKEY and "
                "the timer's delivery time in TIMER_DELIVER_MS",
                topic=topic,
            )
        if out_ms is not None and count > 1:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                "a batch of more than one message may not hold a delayed message (SPEC §5.5)",
                topic=topic,
            )
        if out_ms is not None and out_ms <= now_ms and not cancel:
            # Already due: stored in its topic now. A cancel marker always goes to the timer
            # topic (the timer-wheel decides whether it came too late).
            for name in DELAY_PROPERTIES:
                props.pop(name, None)
            out_ms = None
        return _Hop(transactional, out_ms, None)

    def _to_timer(
        self, props: dict[str, str], topic: str, qid: int, out_ms: int, uniq: str
    ) -> tuple[dict[str, str], str, int]:
        """A delayed message's properties, topic and queue in the timer topic."""
        timer_cfg = ensure_timer_topic(self.topics, self.config)
        if not is_writeable(timer_cfg.perm) or timer_cfg.write_queue_nums < 1:
            denied(
                f"timer topic {TIMER_TOPIC} is not writable (perm {timer_cfg.perm}); delayed "
                "messages are refused",
                topic=topic,
            )
        # A cancel marker goes where the timer it cancels went.
        handle = props.get(Prop.TIMER_DEL_UNIQKEY) or uniq
        to_qid = timer_queue_id(handle, timer_cfg.write_queue_nums)
        timer_props = timer_properties(props, real_topic=topic, real_qid=qid, out_ms=out_ms)
        return timer_props, TIMER_TOPIC, to_qid

    def _topic_config(self, topic: str, request: messaging_pb2.SendRequest) -> TopicConfig:
        cfg = self.topics.get(topic)
        if cfg is not None:
            if _send_forbidden(topic):
                denied(f"sending to system topic {topic} is forbidden", topic=topic)
            return cfg
        _check(check_topic, topic)
        if _send_forbidden(topic):
            denied(f"sending to system topic {topic} is forbidden", topic=topic)
        if request.default_topic:
            queue_nums = (
                request.default_topic_queue_nums
                if request.HasField("default_topic_queue_nums")
                else self.config.default_topic_queue_nums
            )
            if not 1 <= queue_nums <= QUEUE_NUMS_MAX:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"default_topic_queue_nums {queue_nums} is outside 1..{QUEUE_NUMS_MAX}",
                )
            created = self.topics.create_in_send(topic, request.default_topic, queue_nums)
            if created is not None:
                return created
        not_found(
            common_pb2.TOPIC_NOT_EXIST,
            f"topic {topic} does not exist on broker {self.config.broker_name}"
            + (
                ""
                if self.config.auto_create_topic_enable
                else " and autoCreateTopicEnable is false; create it with the admin tool"
            ),
            topic=topic,
            broker_name=self.config.broker_name,
        )

    def _born_host(self, peer: str) -> HostAddress:
        host = self._peers.get(peer)
        if host is None:
            if len(self._peers) >= PEER_CACHE_MAX:
                self._peers.clear()
            host = self._peers[peer] = parse_peer(peer)
        return host


def _answer_with_repeats(
    add: Callable[..., object],
    plan: SendPlan,
    results: list[AppendResult],
    status: messaging_pb2.SendStatus.ValueType,
    prefix: str,
    qid: int,
) -> None:
    """Answers in request order when some re-puts were stored before (their first store's
    position is the answer)."""
    repeats = dict(plan.repeats)
    stored = 0
    for position in range(len(results) + len(repeats)):
        first = repeats.get(position)
        if isinstance(first, StoredRePut):
            add(
                status=status,
                msg_id=first.msg_id,
                offset_msg_id=first.offset_msg_id,
                queue_id=first.queue_id,
                queue_offset=first.queue_offset,
            )
            continue
        index = first if first is not None else stored
        if first is None:
            stored += 1
        r = results[index]
        add(
            status=status,
            msg_id=plan.uniq_keys[index],
            offset_msg_id=f"{prefix}{r.physical_offset:016X}",
            queue_id=qid,
            queue_offset=r.queue_offset,
        )


def _max_reconsume(request: messaging_pb2.SendRequest, is_retry: bool) -> str | None:
    """MAX_RECONSUME_TIMES to set on every message of a consumer's resubmission to
    %RETRY%{group}, or None (not a retry topic, or the consumer named no limit)."""
    if is_retry and request.HasField("max_reconsume_times"):
        return str(request.max_reconsume_times)
    return None


def _refuse_reserved(props: dict[str, str], index: int, topic: str) -> None:
    """Refuse a message that sets a property name RocketQ reserves for itself."""
    forbidden = sorted(_FORBIDDEN_PROPERTIES.intersection(props))
    if forbidden:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"message {index} sets reserved propert{'ies' if len(forbidden) > 1 else 'y'}"
            f" {', '.join(forbidden)}; RocketQ sets those itself",
            topic=topic,
        )


def _too_large(limit: int, count: int, index: int, topic: str) -> NoReturn:
    invalid(
        common_pb2.MESSAGE_TOO_LARGE,
        f"the {'batch' if count > 1 else 'message'} exceeds maxMessageSize "
        f"({limit} bytes, counting topic, bodies and properties) at message {index}; "
        "split it or raise maxMessageSize on producer and broker",
        topic=topic,
    )


def _send_forbidden(topic: str) -> bool:
    """Topics producers may not write: the auto-create template and broker-internal system
    topics (timer, transaction half/op topics), which only the broker itself appends to."""
    return topic == AUTO_CREATE_TOPIC_KEY or topic.startswith(("rmq_sys_", "RMQ_SYS_"))


def _check(check: Callable[..., None], name: str, *args: str) -> None:
    try:
        check(name, *args)
    except ValueError as exc:
        invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
