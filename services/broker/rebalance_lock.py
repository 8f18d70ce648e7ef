"""Queue locks for orderly consumption (SPEC §6.15): which client may consume which queue.

An orderly consumer must be the only member of its group reading a queue, or two members
would process one queue's messages side by side and order would be lost. So before it pulls a
queue it locks it on the queue's broker (``Messaging.LockBatch``), renews the lock every 20 s,
and releases it (``UnlockBatch``) when a rebalance takes the queue away. This module is the
broker's table of those locks::

    group ──▶ (topic, queue_id) ──▶ _Lock(client_id, last lock time)

| call                   | queue free or expired | held by the caller | held by another live |
|------------------------|-----------------------|--------------------|----------------------|
| :meth:`try_lock_batch` | locked for the caller | renewed            | left out (no error)  |
| :meth:`unlock_batch`   | nothing               | released           | nothing (ignored)    |

A lock expires ``rebalanceLockMaxLiveTime`` (60 s) after it was last taken or renewed; the
config is read at every call so ``UpdateBrokerConfig`` takes effect at once. A client that
disconnects keeps its locks until they expire: it may still be finishing a batch, and handing
its queue to another member at once would let both consume it. Expiry is measured on the
injected clock's monotonic reading (a wall-clock jump must not free or pin every lock), run at
the clock's speed: a :class:`~services.common.clock.ScaledClock` keeps monotonic time real for
deadlines, but a lock's life is one of the long spans a test runs fast, so 60 s of lock life is
60 s / speed of real time there (the real clock has no speed: 1). The wall-clock time is kept
only to show it (``Admin.GetConsumerConnection``).

Bounds: one request names at most :data:`QUEUES_PER_REQUEST_MAX` queues, and the whole table
holds at most ``entries_max`` locks (:data:`LOCK_ENTRIES_MAX`); beyond it new locks are refused
with RESOURCE_EXHAUSTED while renewals still work. Expired entries are dropped by
:meth:`purge_expired`, which the broker runs every :data:`PURGE_INTERVAL_MS`
(:meth:`run_purge_loop`) and which a full table also triggers before refusing.

Everything runs on the broker's one event loop; nothing here blocks or needs a lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from rocketq._api.rocketq.v1 import common_pb2
from services.broker.config import BrokerConfig
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import exhausted, invalid

log = logging.getLogger(__name__)

QUEUES_PER_REQUEST_MAX = 1024
"""Queues one LockBatch / UnlockBatch may name (messaging.proto)."""
LOCK_ENTRIES_MAX = 1_000_000
"""Locks the broker keeps over all groups; a new lock beyond it is refused."""
PURGE_INTERVAL_MS = 60_000
"""How often the broker drops expired locks from the table."""

QueueKey = tuple[str, int]
"""(topic, queue_id): the queues of one broker name."""


@dataclass(frozen=True, slots=True)
class QueueLockInfo:
    """One held lock, as shown to admins."""

    topic: str
    queue_id: int
    client_id: str
    last_lock_ms: int
    """Wall-clock ms of the last lock or renewal."""


@dataclass(slots=True)
class _Lock:
    client_id: str
    last_lock_ms: int
    """Wall-clock ms, for display."""
    last_lock_mono_ms: int
    """Monotonic ms, for expiry."""


class RebalanceLockManager:
    """The broker's queue locks, per consumer group."""

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock = SYSTEM_CLOCK,
        *,
        entries_max: int = LOCK_ENTRIES_MAX,
    ) -> None:
        self.config = config
        self.clock = clock
        self.entries_max = entries_max
        self._groups: dict[str, dict[QueueKey, _Lock]] = {}
        self._count = 0

    # -- time ------------------------------------------------------------------------------
    def _mono_ms(self) -> int:
        speed = float(getattr(self.clock, "speed", 1.0))  # a ScaledClock's, see the module doc
        return round(self.clock.monotonic_s() * 1000 * speed)

    def _expired(self, lock: _Lock, mono_ms: int) -> bool:
        return mono_ms - lock.last_lock_mono_ms > self.config.rebalance_lock_max_live_time_ms

    # -- locking ---------------------------------------------------------------------------
    def try_lock_batch(
        self, group: str, client_id: str, queues: Iterable[QueueKey]
    ) -> list[QueueKey]:
        """Lock ``queues`` of ``group`` for ``client_id`` where possible.

        Returns the queues ``client_id`` now holds (newly locked, renewed, or taken over from
        an expired holder), in request order without duplicates. Queues another live client
        holds are left out. Raises ServiceError: INVALID_ARGUMENT for more than
        :data:`QUEUES_PER_REQUEST_MAX` queues, RESOURCE_EXHAUSTED when the new locks would not
        fit in the table (nothing is locked then).
        """
        wanted = _unique(queues)
        if not wanted:
            return []
        table = self._groups.get(group, {})
        mono_ms = self._mono_ms()
        new = sum(1 for key in wanted if key not in table)
        if new and self._count + new > self.entries_max:
            self.purge_expired()
            table = self._groups.get(group, {})
            new = sum(1 for key in wanted if key not in table)
            if self._count + new > self.entries_max:
                exhausted(
                    common_pb2.FLOW_CONTROL,
                    f"the broker holds {self._count} queue locks, its limit is "
                    f"{self.entries_max}; {new} more do not fit",
                    consumer_group=group,
                )
        table = self._groups.setdefault(group, table)
        now_ms = self.clock.now_ms()
        held: list[QueueKey] = []
        for key in wanted:
            lock = table.get(key)
            if lock is None:
                table[key] = _Lock(client_id, now_ms, mono_ms)
                self._count += 1
            elif lock.client_id == client_id:
                lock.last_lock_ms, lock.last_lock_mono_ms = now_ms, mono_ms
            elif self._expired(lock, mono_ms):
                log.info(
                    "group %s: lock on %s queue %d taken over by %s from %s, whose lock "
                    "expired %d ms ago",
                    group,
                    key[0],
                    key[1],
                    client_id,
                    lock.client_id,
                    mono_ms - lock.last_lock_mono_ms - self.config.rebalance_lock_max_live_time_ms,
                )
                table[key] = _Lock(client_id, now_ms, mono_ms)
            else:
                continue
            held.append(key)
        return held

    def unlock_batch(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> None:
        """Release the locks ``client_id`` holds on ``queues``; others' locks are ignored."""
        wanted = _unique(queues)
        table = self._groups.get(group)
        if table is None:
            return
        for key in wanted:
            lock = table.get(key)
            if lock is None:
                continue
            if lock.client_id != client_id:
                log.debug(
                    "group %s: %s asked to unlock %s queue %d, held by %s; ignored",
                    group,
                    client_id,
                    key[0],
                    key[1],
                    lock.client_id,
                )
                continue
            del table[key]
            self._count -= 1
        if not table:
            del self._groups[group]

    # -- queries ---------------------------------------------------------------------------
    def is_locked_by(self, group: str, topic: str, queue_id: int, client_id: str) -> bool:
        """Whether ``client_id`` holds an unexpired lock on the queue (renews nothing)."""
        lock = self._groups.get(group, {}).get((topic, queue_id))
        return (
            lock is not None
            and lock.client_id == client_id
            and not self._expired(lock, self._mono_ms())
        )

    def locks_of_group(self, group: str) -> list[QueueLockInfo]:
        """The group's unexpired locks, sorted by (topic, queue_id)."""
        mono_ms = self._mono_ms()
        table = self._groups.get(group, {})
        return [
            QueueLockInfo(key[0], key[1], lock.client_id, lock.last_lock_ms)
            for key, lock in sorted(table.items())
            if not self._expired(lock, mono_ms)
        ]

    def __len__(self) -> int:
        """Entries in the table, expired ones not yet purged included."""
        return self._count

    # -- housekeeping ----------------------------------------------------------------------
    def purge_expired(self) -> int:
        """Drop every expired lock; returns how many."""
        mono_ms = self._mono_ms()
        dropped = 0
        for group in list(self._groups):
            table = self._groups[group]
            stale = [key for key, lock in table.items() if self._expired(lock, mono_ms)]
            for key in stale:
                del table[key]
            dropped += len(stale)
            if not table:
                del self._groups[group]
        self._count -= dropped
        if dropped:
            log.debug("dropped %d expired queue locks", dropped)
        return dropped

    async def run_purge_loop(self, interval_ms: int = PURGE_INTERVAL_MS) -> None:
        """Every ``interval_ms``, drop expired locks; cancelled on shutdown."""
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                self.purge_expired()
            except Exception:  # the purge must survive anything and try again next time
                log.exception("queue lock purge failed")


def _unique(queues: Iterable[QueueKey]) -> list[QueueKey]:
    """``queues`` without repeats, in order; INVALID_ARGUMENT beyond the per-request limit."""
    out: dict[QueueKey, None] = {}
    for i, key in enumerate(queues):
        out[key] = None
        if i >= QUEUES_PER_REQUEST_MAX:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                f"a lock request may name at most {QUEUES_PER_REQUEST_MAX} queues",
            )
    return list(out)
