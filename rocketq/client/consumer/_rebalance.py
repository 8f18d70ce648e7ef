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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from rocketq.client.consumer.allocate import AllocateStrategy
from rocketq.client.consumer.config import ConsumeFromWhere, MessageModel
from rocketq.client.consumer.process_queue import ProcessQueue, wall_clock_ms
from rocketq.message import MessageQueue
from rocketq.validation import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

NO_OFFSET = -1
"""An offset source's answer when nothing is stored (first start)."""


@dataclass(eq=False)
class PullRequest:
    """One owned queue's pull state (SPEC §6.4): where to pull next, and from which broker."""

    message_queue: MessageQueue
    process_queue: ProcessQueue
    next_offset: int
    broker_id: int = 0
    """Broker id the last pull response suggested (0 master, else a slave; SPEC §6.7 step 5)."""


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
        self._lock = asyncio.Lock()
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        """The queues this consumer owns now."""
        self.topics: set[str] = set()
        """Topics to rebalance (subscriptions, including the retry topic)."""

    def owned(self, topic: str | None = None) -> list[MessageQueue]:
        return sorted(mq for mq in self.process_queue_table if topic is None or mq.topic == topic)

    async def do_rebalance(self) -> None:
        """Rebalance every subscribed topic, then drop queues of topics no longer subscribed."""
        async with self._lock:
            for topic in sorted(self.topics):
                try:
                    await self._rebalance_by_topic(topic)
                except Exception as exc:  # one topic failing must not stop the others
                    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                        log.warning("group %s: rebalance of %s failed: %s", self.group, topic, exc)
            await self._truncate_not_my_topics()

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
            else:
                continue
            pq.dropped = True
            if await self._remove_queue(mq, pq):
                self.process_queue_table.pop(mq, None)
                changed = True
                log.info("group %s: dropped %s: %s", self.group, mq, reason)
        fresh = sorted(mq for mq in allocated if mq not in self.process_queue_table)
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
            self.process_queue_table[mq] = pq
            requests.append(PullRequest(mq, pq, next_offset))
            changed = True
            log.info("group %s: now owns %s from offset %d", self.group, mq, next_offset)
        if requests:
            self._dispatch(requests)
        return changed

    async def _truncate_not_my_topics(self) -> None:
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic not in self.topics:
                pq.dropped = True
                await self._remove_queue(mq, pq)
                self.process_queue_table.pop(mq, None)
                log.info("group %s: dropped %s, its topic is no longer subscribed", self.group, mq)

    async def remove_process_queue(self, mq: MessageQueue) -> None:
        """Drop one queue now (an illegal offset); the next rebalance starts it again."""
        async with self._lock:
            pq = self.process_queue_table.pop(mq, None)
            if pq is not None:
                pq.dropped = True
                await self._remove_queue(mq, pq)

    async def drop_all(self) -> None:
        """Mark every owned queue dropped and empty the table (shutdown)."""
        async with self._lock:
            for pq in self.process_queue_table.values():
                pq.dropped = True
            self.process_queue_table.clear()


class RebalanceService:
    """Runs a rebalance at start, every interval, and whenever :meth:`wakeup` is called."""

    def __init__(
        self, rebalance: Callable[[], Awaitable[None]], interval_ms: int, name: str = ""
    ) -> None:
        self._rebalance = rebalance
        self._interval_s = interval_ms / 1000
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
            try:
                await self._rebalance()
            except Exception:  # keep the loop alive; the next tick retries
                log.exception("rebalance of %s failed", self._name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), self._interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
