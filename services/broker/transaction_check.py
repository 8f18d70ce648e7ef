"""The transaction check service: asks producers about half messages nobody ended (SPEC §9).

A background task on the master. Every ``transactionCheckInterval`` (read at each round, so a
runtime config update applies at the next one) it walks the half queue from its progress to
the max offset it saw when the round began, deciding for each copy:

| copy                                                       | action                         |
|------------------------------------------------------------|--------------------------------|
| its transaction is resolved (index, by transaction id)     | skip                           |
| a newer copy of the transaction exists further on          | skip (the newer one is checked)|
| age (now - born time) < min(immunity, transactionTimeout)  | STOP the round: later copies   |
|                                                            | are younger (or re-put, and    |
|                                                            | wait at most one timeout)      |
| age < immunity (CHECK_IMMUNITY_TIME_IN_SECONDS beyond the  | re-put to the end unchanged:   |
| timeout, not yet due)                                      | it must not hold up the queue  |
| TRANSACTION_CHECK_TIMES >= transactionCheckMax             | discard: op TRAN_STATE=DISCARD,|
|                                                            | ERROR log, counted             |
| otherwise                                                  | re-put a copy with CHECK_TIMES |
|                                                            | + 1, push CheckTransactionState|
|                                                            | for the copy to one live       |
|                                                            | producer of its group          |

``immunity`` = CHECK_IMMUNITY_TIME_IN_SECONDS × 1000 when set and a positive integer, else
``transactionTimeout``. Re-puts keep UNIQ_KEY, born time and host, so the age and the id survive
any number of checks; copies a round makes lie beyond the max it walks to, so each transaction
is asked at most once per round.

A check goes to one live client of the half message's producer group (round-robin over
``ClientManager.producer_client_ids``); if the push fails (stream gone or backed up) the next
client is tried. With none alive the check still counts: after ``transactionCheckMax`` of them
the message is discarded, as RocketMQ does.

Progress (the consume offset of ``CID_RMQ_SYS_TRANS`` on the half queue) moves past every copy
handled, and is committed every slice and at the end of the round; under SYNC_FLUSH only once
the re-puts it skips are on disk, so a power loss never leaves progress past a lost copy. A
round yields to the event loop every :data:`SCAN_SLICE_MAX` copies or :data:`SLICE_TIME_MAX_S`
of work, so a backlog never stalls the broker. After each commit the op progress moves past the
ops whose transactions are entirely below the half progress (their index entries forgotten).
"""

from __future__ import annotations

import asyncio
import enum
import logging

from rocketq import codec
from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.validation import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from services.broker.client_manager import ClientManager
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_half import (
    CHECK_GROUP,
    DISCARD,
    SCAN_SLICE_MAX,
    TransactionIndex,
    check_times,
    ensure_topic,
    op_message,
    producer_view,
    progress,
    real_queue,
    walk,
)
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.telemetry import messaging as telemetry
from services.store.commitlog import AppendResult, MessageToStore
from services.store.flush import FlushDiskType
from services.store.message_store import MessageStore

log = logging.getLogger(__name__)

SLICE_TIME_MAX_S = 0.2
"""Loop time a round spends before yielding to the event loop."""
ROUND_ROBIN_GROUPS_MAX = 10_000
"""Producer groups whose round-robin position is remembered (cleared when exceeded)."""


class _Verdict(enum.Enum):
    NEXT = 1
    STOP = 2


class TransactionCheckService:
    """Checks back half messages older than their immunity (one per broker)."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        clients: ClientManager,
        index: TransactionIndex,
        clock: Clock = SYSTEM_CLOCK,
        slice_records_max: int = SCAN_SLICE_MAX,
        slice_time_max_s: float = SLICE_TIME_MAX_S,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.index = index
        self.clock = clock
        self.slice_records_max = slice_records_max
        self.slice_time_max_s = slice_time_max_s
        self.rounds = 0
        self._next_client: dict[str, int] = {}

    async def run(self) -> None:
        """Check every ``transactionCheckInterval`` until cancelled; idle while a slave (the
        index is rebuilt from the store when this broker becomes master)."""
        was_master = self.config.is_master
        while True:
            await asyncio.sleep(self.config.transaction_check_interval_ms / 1000)
            if not self.config.is_master:
                was_master = False
                continue
            try:
                if not was_master:
                    await self.index.rebuild_async(self.store, self.offsets)
                    was_master = True
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end the service
                log.exception("transaction check round failed; retrying next interval")

    async def check_once(self) -> None:
        """One round over the half queue (see the module docstring)."""
        if self.topics.get(TRANS_HALF_TOPIC) is None:
            return  # no transactional message was ever sent here
        self.rounds += 1
        store = self.store
        start = progress(self.offsets, store, TRANS_HALF_TOPIC)
        end = int(store.max_offset(TRANS_HALF_TOPIC, 0))
        now_ms = self.clock.now_ms()
        position = start
        reput_end = 0
        in_slice = 0
        slice_start_s = self.clock.monotonic_s()
        stopped = False
        try:
            for q, raw in walk(store, TRANS_HALF_TOPIC, start, end):
                verdict, stored_end = self._handle(codec.decode_record(raw), q, now_ms)
                if verdict is _Verdict.STOP:
                    stopped = True
                    break
                position = q + 1
                reput_end = max(reput_end, stored_end)
                in_slice += 1
                if (
                    in_slice >= self.slice_records_max
                    or self.clock.monotonic_s() - slice_start_s >= self.slice_time_max_s
                ):
                    await self._commit(position, reput_end)
                    await asyncio.sleep(0)
                    in_slice = 0
                    slice_start_s = self.clock.monotonic_s()
            if not stopped:
                position = max(position, end)  # past what retention removed, too
        finally:
            await self._commit(position, reput_end)

    # -- one copy --------------------------------------------------------------------------
    def _handle(self, rec: codec.Record, q: int, now_ms: int) -> tuple[_Verdict, int]:
        """What to do with the half copy ``rec`` at queue offset ``q``; the commitlog end of
        anything stored for it (0 if nothing)."""
        txid = rec.uniq_key
        if not txid:
            log.warning("half record at queue offset %d has no UNIQ_KEY; skipped", q)
            return _Verdict.NEXT, 0
        index = self.index
        entry = index.entries.get(txid)
        if entry is None:  # cannot happen while the index is complete; treat it as pending
            index.note_half(txid, q)
            entry = index.entries[txid]
        if entry.decision is not None or entry.latest_offset > q:
            return _Verdict.NEXT, 0
        cfg = self.config
        timeout_ms = cfg.transaction_timeout_ms
        immunity_ms = _immunity_ms(rec) or timeout_ms
        age_ms = now_ms - rec.born_timestamp_ms
        if age_ms < min(immunity_ms, timeout_ms):
            return _Verdict.STOP, 0
        times = check_times(rec)
        if age_ms < immunity_ms:
            deferred = self._reput(rec, txid, times)
            return _Verdict.NEXT, deferred.physical_offset + deferred.size_bytes
        if times >= cfg.transaction_check_max:
            return _Verdict.NEXT, self._discard(rec, txid, q, times)
        copy = self._reput(rec, txid, times + 1)
        index.checks += 1
        telemetry.mark(
            f"check {real_queue(rec)[0]}", rec.properties, attrs={"rocketq.check": times + 1}
        )
        self._ask(rec, txid, copy)
        return _Verdict.NEXT, copy.physical_offset + copy.size_bytes

    def _reput(self, rec: codec.Record, txid: str, times: int) -> AppendResult:
        """A copy of ``rec`` at the end of the half queue with TRANSACTION_CHECK_TIMES=times."""
        props = dict(rec.properties)
        props[Prop.TRANSACTION_CHECK_TIMES] = str(times)
        copy = MessageToStore(
            topic=TRANS_HALF_TOPIC,
            queue_id=0,
            body=rec.body,
            properties=codec.encode_properties(props),
            tags_code=codec.tags_hash(props.get(Prop.TAGS, "")),
            keys=props.get(Prop.KEYS, ""),
            uniq_key=txid,
            flag=rec.flag,
            sys_flag=rec.sys_flag & SysFlag.COMPRESSED,
            born_timestamp_ms=rec.born_timestamp_ms,
            born_host=rec.born_host,
            reconsume_times=rec.reconsume_times,
        )
        result = self.store.append([copy])[0]
        self.index.note_half(txid, result.queue_offset)
        return result

    def _discard(self, rec: codec.Record, txid: str, q: int, times: int) -> int:
        topic, _ = real_queue(rec)
        group = rec.properties.get(Prop.PRODUCER_GROUP, "")
        log.error(
            "transaction %s (topic %s, producer group %s) discarded: no decision after %d "
            "checks (transactionCheckMax %d)",
            txid,
            topic,
            group,
            times,
            self.config.transaction_check_max,
        )
        ensure_topic(self.topics, TRANS_OP_HALF_TOPIC)
        result = self.store.append([op_message(txid, q, DISCARD, self.clock.now_ms())])[0]
        self.index.resolve(txid, DISCARD, q, result.queue_offset)
        self.index.discarded += 1
        telemetry.mark(f"discard {topic}", rec.properties, attrs={"rocketq.checks": times})
        return result.physical_offset + result.size_bytes

    def _ask(self, rec: codec.Record, txid: str, copy: AppendResult) -> bool:
        """Push CheckTransactionState for ``copy`` to one live producer of the group."""
        group = rec.properties.get(Prop.PRODUCER_GROUP, "")
        check = messaging_pb2.CheckTransactionState(
            producer_group=group,
            msg_id=txid,
            transaction_id=txid,
            commitlog_offset=copy.physical_offset,
            queue_offset=copy.queue_offset,
            message=producer_view(
                rec, commitlog_offset=copy.physical_offset, queue_offset=copy.queue_offset
            ),
        )
        push = messaging_pb2.ClientStreamResponse(check_transaction_state=check)
        ids = self.clients.producer_client_ids(group)
        if ids:
            if len(self._next_client) >= ROUND_ROBIN_GROUPS_MAX:
                self._next_client.clear()
            first = self._next_client.get(group, 0) % len(ids)
            self._next_client[group] = first + 1
            for i in range(len(ids)):
                client_id = ids[(first + i) % len(ids)]
                if self.clients.send_to_client(client_id, push):
                    log.debug("transaction %s: check sent to %s", txid, client_id)
                    return True
        log.info(
            "transaction %s: no live producer of group %s took the check; asking again in "
            "the next round",
            txid,
            group,
        )
        return False

    # -- progress --------------------------------------------------------------------------
    async def _commit(self, position: int, stored_end: int) -> None:
        if (
            stored_end
            and self.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
            and not await self.store.flusher.wait_flushed(stored_end)
        ):
            log.warning("transaction check: re-puts not flushed in time; progress not moved")
            return
        if position > self.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0):
            self.offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, position)
        op_position = self.index.advance_ops(position)
        if op_position is not None:
            self.offsets.commit(CHECK_GROUP, TRANS_OP_HALF_TOPIC, 0, op_position)


def _immunity_ms(rec: codec.Record) -> int:
    """CHECK_IMMUNITY_TIME_IN_SECONDS × 1000 when a positive integer, else 0."""
    text = rec.properties.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS, "")
    try:
        seconds = int(text)
    except ValueError:
        return 0
    return seconds * 1000 if seconds > 0 else 0
