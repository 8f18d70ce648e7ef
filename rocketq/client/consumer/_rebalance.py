"""Rebalance: which queues this consumer owns, and where each new one starts (SPEC §6.10, §6.12).

Every member of a group runs the same computation with no coordinator: per subscribed topic,
take the readable queues of the route and the group's consumer ids (asked of one broker, which
knows them from heartbeats), sort both, and let the allocation strategy pick this member's
share. Broadcasting skips the allocation: every member owns every readable queue.

``update_process_queue_table`` then reconciles the owned set with the ``ProcessQueue`` table:

* a queue no longer owned is marked ``dropped`` (in-flight results are then ignored, SPEC
  §6.11), its offset persisted and forgotten, and it is removed: the new owner reads the offset
  from the broker;
* a push consumer's queue whose pull loop has been silent for 120 s is rebuilt the same way
  (its loop died; "[BUG]" in RocketMQ's log);
* a newly owned queue gets a fresh ``ProcessQueue`` and a :class:`PullRequest` starting at
  :func:`compute_pull_from_where`; a queue whose start cannot be computed now (broker down) is
  skipped and retried at the next rebalance.

Duplicates around a rebalance are expected and allowed: the old owner's last persisted offset
may lag what it had consumed (SPEC §6.10). Loss is not: an owner never commits past the
smallest offset still in flight.

Rebalances run one at a time (an asyncio lock), every ``rebalance_interval_ms`` (20 s) and at
once when a broker pushes ConsumerIdsChanged (:meth:`RebalanceService.wakeup`).

Orderly consumption in clustering mode (SPEC §6.15; a ``locker`` is given) adds broker locks,
so that two members never consume one queue at once, even while they disagree about the
allocation for a moment:

* a newly allocated queue is locked on its broker (one LockBatch per broker) before its
  ProcessQueue exists; a queue another member still holds (it is still finishing its last
  call) is skipped, and the rebalance is *unbalanced*: the next one comes after
  ``REBALANCE_MIN_INTERVAL_MS`` (1 s) instead of 20 s, as RocketMQ 5's minInterval;
* a queue leaving this member is released in this order: take its consume lock (waiting at
  most 1 s for a running listener call, else keep the queue, count ``try_unlock_times`` and
  try again at the next rebalance), mark it dropped, persist its offset, UnlockBatch it,
  forget it — so the next owner, which can lock it only now, reads an offset that includes
  everything consumed here;
* :meth:`RebalanceImpl.lock_all` renews every owned queue's lock (every 20 s). A queue left
  out of the answer is held by another member — this client's lock lapsed on the broker (not
  renewed for 60 s) and the queue was taken — so it is dropped at once, *without* persisting
  its offset (the holder's progress counts, ours is stale) and without unlocking; if it is
  still allocated here, a later rebalance locks it again and starts from the broker's offset
  rather than from a stale cache. A lock that merely aged on this side (renewals failing for
  ``rebalance_lock_max_live_ms``) only stops pulls and calls until a renewal succeeds.

Lock calls run under the rebalance's asyncio lock too, so a renewal can never re-lock a queue
that a concurrent release has just unlocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from rocketq.aio import wait_event
from rocketq.client.consumer.allocate import AllocateStrategy
from rocketq.client.consumer.config import ConsumeFromWhere, MessageModel
from rocketq.client.consumer.process_queue import ProcessQueue, wall_clock_ms
from rocketq.message import MessageQueue
from rocketq.validation import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

NO_OFFSET = -1
"""An offset source's answer when nothing is stored (first start)."""
REBALANCE_MIN_INTERVAL_MS = 1000
"""Wait before the next rebalance when the last one could not lock every allocated queue."""
CONSUME_LOCK_WAIT_S = 1.0
"""Orderly: how long a release waits for a running listener call of the queue (RocketMQ's
tryLock(1000 ms) in removeUnnecessaryMessageQueue)."""


@dataclass(eq=False)
class PullRequest:
    """One owned queue's pull state (SPEC §6.4): where to pull next, and from which broker."""

    message_queue: MessageQueue
    process_queue: ProcessQueue
    next_offset: int
    broker_id: int = 0
    """Broker id the last pull response suggested (0 master, else a slave; SPEC §6.7 step 5)."""
    locked_first: bool = False
    """Orderly: set by the first pull made while holding the lock, which re-reads the start
    offset from the broker (RocketMQ's previouslyLocked)."""


class QueueLocker(Protocol):
    """The broker lock calls of an orderly consumer (:class:`BrokerApi` implements them)."""

    async def lock_batch(
        self, broker_name: str, queues: Iterable[MessageQueue]
    ) -> set[MessageQueue]: ...

    async def unlock_batch(self, broker_name: str, queues: Iterable[MessageQueue]) -> None: ...


def by_broker(queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    """Queues grouped by broker name, each list sorted (one lock call per broker)."""
    groups: dict[str, list[MessageQueue]] = {}
    for mq in sorted(queues):
        groups.setdefault(mq.broker_name, []).append(mq)
    return groups


class OffsetSource(Protocol):
    """What :func:`compute_pull_from_where` asks: the stored offset and the queue's bounds."""

    async def read_stored(self, mq: MessageQueue) -> int:
        """The group's stored offset; -1 none, < -1 could not be read."""
        ...

    async def max_offset(self, mq: MessageQueue) -> int: ...

    async def min_offset(self, mq: MessageQueue) -> int: ...

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int: ...


async def compute_pull_from_where(
    mq: MessageQueue, where: ConsumeFromWhere, timestamp_ms: int, source: OffsetSource
) -> int:
    """Where a newly owned queue starts; -1 means "not now" (SPEC §6.12 computePullFromWhere).

    A stored offset always wins. With none stored (a first start), the group's retry topic
    starts at 0 whatever the setting — every message there is an earlier failure of this group
    that must not be skipped — and other topics start at the queue's max offset (LAST), min
    offset (FIRST) or the first message stored at or after ``timestamp_ms`` (TIMESTAMP). A
    failed read of the stored offset (-2), or of the bound, gives -1 so the queue is retried
    at the next rebalance rather than started at a guessed position.
    """
    last = await source.read_stored(mq)
    if last >= 0:
        return last
    if last != NO_OFFSET:
        return -1
    if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return 0
    try:
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return await source.min_offset(mq)
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            return await source.search_offset(mq, timestamp_ms)
        return await source.max_offset(mq)
    except Exception as exc:  # broker down or topic gone: try again at the next rebalance
        log.warning("cannot compute the start offset of %s (%s): %s", mq, where.name, exc)
        return -1


ComputeOffset = Callable[[MessageQueue], Awaitable[int]]
RemoveQueue = Callable[[MessageQueue, ProcessQueue], Awaitable[bool]]
Dispatch = Callable[[list[PullRequest]], None]
QueuesChanged = Callable[[str, set[MessageQueue], set[MessageQueue]], None]
ConsumerIds = Callable[[str], Awaitable[list[str]]]
QueuesOf = Callable[[str], Awaitable[list[MessageQueue]]]
"""The readable queues of a topic from its route; empty when it has no route (yet)."""


class RebalanceImpl:
    """The owned-queue table of one consumer and the rebalance that keeps it right."""

    def __init__(
        self,
        *,
        group: str,
        client_id: str,
        message_model: MessageModel,
        strategy: AllocateStrategy,
        queues_of: QueuesOf,
        consumer_ids: ConsumerIds,
        compute_offset: ComputeOffset,
        remove_queue: RemoveQueue,
        dispatch: Dispatch,
        queues_changed: QueuesChanged | None = None,
        check_pull_expired: bool = True,
        clock: Callable[[], int] = wall_clock_ms,
        locker: QueueLocker | None = None,
        consume_lock_wait_s: float = CONSUME_LOCK_WAIT_S,
        forget_offset: Callable[[MessageQueue], None] = lambda mq: None,
    ) -> None:
        self.group = group
        self.client_id = client_id
        self.message_model = message_model
        self.strategy = strategy
        self._queues_of = queues_of
        self._consumer_ids = consumer_ids
        self._compute_offset = compute_offset
        self._remove_queue = remove_queue
        self._dispatch = dispatch
        self._queues_changed = queues_changed
        self._check_pull_expired = check_pull_expired
        self._clock = clock
        self._locker = locker
        """Set for orderly clustering consumers: broker queue locks (see the module docs)."""
        self._consume_lock_wait_s = consume_lock_wait_s
        self._forget_offset = forget_offset
        """Drops a queue's in-memory offset without persisting it (a lock lost to another)."""
        self._lock = asyncio.Lock()
        self._balanced = True
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        """The queues this consumer owns now."""
        self.topics: set[str] = set()
        """Topics to rebalance (subscriptions, including the retry topic)."""

    def owned(self, topic: str | None = None) -> list[MessageQueue]:
        return sorted(mq for mq in self.process_queue_table if topic is None or mq.topic == topic)

    async def persist_owned(
        self, persist_all: Callable[[list[MessageQueue]], Awaitable[None]]
    ) -> None:
        """Run a periodic persist of the owned queues' offsets between rebalances, never
        during one: a push of an offset read before a release could otherwise reach the
        broker after the release's own persist and move the next owner's start back."""
        async with self._lock:
            await persist_all(self.owned())

    async def do_rebalance(self) -> bool:
        """Rebalance every subscribed topic, then drop queues of topics no longer subscribed.

        Returns False when an allocated queue could not be locked (orderly), so the caller
        rebalances again soon."""
        async with self._lock:
            self._balanced = True
            for topic in sorted(self.topics):
                try:
                    await self._rebalance_by_topic(topic)
                except Exception as exc:  # one topic failing must not stop the others
                    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                        log.warning("group %s: rebalance of %s failed: %s", self.group, topic, exc)
            await self._truncate_not_my_topics()
            return self._balanced

    async def _rebalance_by_topic(self, topic: str) -> None:
        mq_all = sorted(await self._queues_of(topic))
        if not mq_all:
            if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                log.warning(
                    "group %s: no readable queue of %s known yet; skipped", self.group, topic
                )
            return
        if self.message_model is MessageModel.BROADCASTING:
            allocated = set(mq_all)
        else:
            cid_all = sorted(set(await self._consumer_ids(topic)))
            if not cid_all:
                log.warning("group %s: no consumer id for %s from the brokers", self.group, topic)
                return
            try:
                share = self.strategy.allocate(self.group, self.client_id, list(mq_all), cid_all)
            except Exception as exc:  # a broken custom strategy must not kill the loop
                log.error(
                    "group %s: allocation strategy %s failed: %s",
                    self.group,
                    self.strategy.name,
                    exc,
                )
                return
            allocated = set(share)
        if await self.update_process_queue_table(topic, allocated) and self._queues_changed:
            self._queues_changed(topic, set(mq_all), allocated)

    async def update_process_queue_table(self, topic: str, allocated: set[MessageQueue]) -> bool:
        """Reconcile the owned queues of ``topic`` with ``allocated``; True if anything changed."""
        changed = False
        now_ms = self._clock()
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic != topic:
                continue
            if mq not in allocated:
                reason = "no longer allocated to this consumer"
            elif self._check_pull_expired and pq.is_pull_expired(now_ms):
                reason = "[BUG] its pull loop stopped; rebuilding it"
            elif pq.dropped:
                reason = "dropped earlier; releasing it now"
            else:
                continue
            if await self._release(mq, pq, reason):
                changed = True
        fresh = sorted(mq for mq in allocated if mq not in self.process_queue_table)
        if self._locker is not None and fresh:
            fresh = await self._lock_fresh(fresh)
        starts = await asyncio.gather(*(self._compute_offset(mq) for mq in fresh))
        requests: list[PullRequest] = []
        for mq, next_offset in zip(fresh, starts, strict=True):
            if next_offset < 0:
                log.warning(
                    "group %s: %s not started now; retried at next rebalance", self.group, mq
                )
                continue
            if mq in self.process_queue_table:
                continue
            pq = ProcessQueue(self._clock)
            if self._locker is not None:
                pq.locked = True  # _lock_fresh just locked it
            self.process_queue_table[mq] = pq
            requests.append(PullRequest(mq, pq, next_offset))
            changed = True
            log.info("group %s: now owns %s from offset %d", self.group, mq, next_offset)
        if requests:
            self._dispatch(requests)
        return changed

    async def _release(self, mq: MessageQueue, pq: ProcessQueue, reason: str) -> bool:
        """Give ``mq`` up (see the module docs for the orderly order); False if kept for now."""
        if self._locker is not None:
            if not await pq.consume_lock.acquire_async(self._consume_lock_wait_s):
                pq.try_unlock_times += 1
                log.warning(
                    "group %s: %s is being consumed; not released now (%s), tried again at the "
                    "next rebalance (attempt %d)",
                    self.group,
                    mq,
                    reason,
                    pq.try_unlock_times,
                )
                return False
            try:
                pq.dropped = True  # no listener call starts after this
            finally:
                pq.consume_lock.release()
        pq.dropped = True
        if not await self._remove_queue(mq, pq):
            return False
        if self._locker is not None:
            await self._unlock(mq.broker_name, [mq])
        self.process_queue_table.pop(mq, None)
        log.info("group %s: dropped %s: %s", self.group, mq, reason)
        return True

    # ---- broker locks (orderly, clustering) -------------------------------------------------

    async def _lock_fresh(self, fresh: list[MessageQueue]) -> list[MessageQueue]:
        """Lock newly allocated queues; returns those now held, in order."""
        assert self._locker is not None
        held: set[MessageQueue] = set()
        for broker_name, mqs in sorted(by_broker(fresh).items()):
            try:
                held |= await self._locker.lock_batch(broker_name, mqs)
            except Exception as exc:  # broker down: retried at the next rebalance
                log.warning("group %s: cannot lock queues on %s: %s", self.group, broker_name, exc)
        for mq in fresh:
            if mq not in held:
                self._balanced = False
                log.warning(
                    "group %s: %s not taken now: another member still holds its lock; retried "
                    "in a moment",
                    self.group,
                    mq,
                )
        return [mq for mq in fresh if mq in held]

    async def _unlock(self, broker_name: str, mqs: list[MessageQueue]) -> None:
        assert self._locker is not None
        try:
            await self._locker.unlock_batch(broker_name, mqs)
        except Exception as exc:  # the lock then lapses on the broker (rebalanceLockMaxLiveTime)
            log.warning(
                "group %s: cannot unlock %d queue(s) on %s: %s",
                self.group,
                len(mqs),
                broker_name,
                exc,
            )

    async def lock_all(self) -> None:
        """Renew the lock of every owned queue, one LockBatch per broker (every 20 s)."""
        if self._locker is None:
            return
        async with self._lock:
            owned = [mq for mq, pq in self.process_queue_table.items() if not pq.dropped]
            for broker_name, mqs in sorted(by_broker(owned).items()):
                try:
                    held = await self._locker.lock_batch(broker_name, mqs)
                except Exception as exc:  # keep the old state; it expires if this persists
                    log.warning(
                        "group %s: cannot renew locks on %s: %s", self.group, broker_name, exc
                    )
                    continue
                self._apply_lock_answer(mqs, held)

    async def lock_one(self, mq: MessageQueue) -> bool:
        """Lock one owned queue now (its consumer found the lock lost or expired)."""
        if self._locker is None:
            return False
        async with self._lock:
            pq = self.process_queue_table.get(mq)
            if pq is None or pq.dropped:
                return False
            try:
                held = await self._locker.lock_batch(mq.broker_name, [mq])
            except Exception as exc:
                log.warning("group %s: cannot lock %s: %s", self.group, mq, exc)
                return False
            self._apply_lock_answer([mq], held)
            return mq in held

    def _apply_lock_answer(self, asked: list[MessageQueue], held: set[MessageQueue]) -> None:
        now_ms = self._clock()
        for mq in asked:
            pq = self.process_queue_table.get(mq)
            if pq is None:
                continue
            if mq in held:
                pq.locked = True
                pq.last_lock_timestamp_ms = now_ms
                continue
            pq.locked = False
            pq.dropped = True  # no pull, no call; a running call's result is ignored
            self.process_queue_table.pop(mq, None)
            self._forget_offset(mq)
            log.warning(
                "group %s: %s is locked by another member (this client's lock lapsed on the "
                "broker); dropped without persisting its offset, taken again from the broker's "
                "offset if it is still allocated here and can be locked",
                self.group,
                mq,
            )

    async def unlock_all(self) -> None:
        """Release every owned queue's lock (close, after offsets are persisted). A queue whose
        listener call is still running (a thread that outlived await_termination_ms) stays
        locked until the broker lets the lock lapse, so no other member starts it meanwhile."""
        if self._locker is None:
            return
        async with self._lock:
            busy = [mq for mq, pq in self.process_queue_table.items() if pq.consume_lock.locked()]
            for mq in busy:
                log.warning(
                    "group %s: a listener call on %s is still running; its lock is left to "
                    "lapse on the broker instead of being released",
                    self.group,
                    mq,
                )
            idle = [mq for mq in self.process_queue_table if mq not in busy]
            for broker_name, mqs in sorted(by_broker(idle).items()):
                await self._unlock(broker_name, mqs)
            for pq in self.process_queue_table.values():
                pq.locked = False

    # ---- removal ----------------------------------------------------------------------------

    async def _truncate_not_my_topics(self) -> None:
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic not in self.topics:
                await self._release(mq, pq, "its topic is no longer subscribed")

    async def remove_process_queue(self, mq: MessageQueue) -> None:
        """Drop one queue now (an illegal offset); the next rebalance starts it again."""
        async with self._lock:
            pq = self.process_queue_table.get(mq)
            if pq is not None:
                await self._release(mq, pq, "removed (offset reset or illegal)")

    async def drop_all(self) -> None:
        """Mark every owned queue dropped and empty the table (shutdown)."""
        async with self._lock:
            for pq in self.process_queue_table.values():
                pq.dropped = True
            self.process_queue_table.clear()


class RebalanceService:
    """Runs a rebalance at start, every interval, and whenever :meth:`wakeup` is called; after
    an unbalanced one (the rebalance returned False) the next comes after ``min_interval_ms``."""

    def __init__(
        self,
        rebalance: Callable[[], Awaitable[bool | None]],
        interval_ms: int,
        name: str = "",
        min_interval_ms: int = REBALANCE_MIN_INTERVAL_MS,
    ) -> None:
        self._rebalance = rebalance
        self._interval_s = interval_ms / 1000
        self._min_interval_s = min(min_interval_ms, interval_ms) / 1000
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._name = name

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"rebalance-{self._name}")

    def wakeup(self) -> None:
        """Rebalance as soon as the current one (if any) is over."""
        self._event.set()

    async def _run(self) -> None:
        while True:
            self._event.clear()
            balanced: bool | None = None
            try:
                balanced = await self._rebalance()
            except Exception:  # keep the loop alive; the next tick retries
                log.exception("rebalance of %s failed", self._name)
            await wait_event(self._event, self.next_wait_s(balanced))

    def next_wait_s(self, balanced: bool | None) -> float:
        """The pause after a rebalance that answered ``balanced`` (None: it had no answer)."""
        return self._min_interval_s if balanced is False else self._interval_s

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
