"""ProcessQueue: a push consumer's client-side snapshot of one queue (SPEC §6.5).

Pulled messages wait here, keyed by queue offset, from the moment a pull returns them until the
listener has handled them. The structure serves four jobs:

* **Offset progress (SPEC §6.11).** After a batch is consumed, :meth:`ProcessQueue.remove_messages`
  answers the smallest offset still in flight — the offset to commit. Committing anything higher
  could lose a message still being consumed on another thread after a crash; committing the
  smallest gives at-least-once delivery (duplicates, never loss). Example: a, b, c, d pulled,
  d finishes first → the commit offset stays at a.
* **Flow control (SPEC §6.6).** :attr:`msg_count`, :attr:`msg_size_bytes` and :meth:`max_span`
  let the puller stop pulling when a queue caches too much or one stuck message holds the span
  open. Those thresholds (pullThresholdForQueue 1000, 100 MiB, span 2000) are the bound on this
  structure, so it needs no limit of its own.
* **Liveness.** :meth:`is_pull_expired` (no pull for 120 s) lets the rebalance drop a queue whose
  pull loop died; :meth:`expired_messages` finds messages stuck in a listener longer than the
  consume timeout (15 min, SPEC §6.13) so they can be sent back for retry.
* **Orderly consumption (SPEC §6.15).** :meth:`take_messages` / :meth:`commit` /
  :meth:`make_messages_to_consume_again`, the ``locked`` fields (the broker lock as this client
  last saw it) and :attr:`ProcessQueue.consume_lock`, held around every listener call so the
  rebalance can wait for a running call before it gives the queue away.

Design: offsets are kept in a plain sorted list (``bisect``) beside a dict of messages. Offsets
arrive almost always in increasing order, so inserts are appends, and removals are a memmove of
at most a few thousand pointers (the flow-control bound) — cheaper in CPython than any balanced
tree written in Python. Every method takes one ``threading.Lock``: pulls run on the event loop
while synchronous listeners finish on a thread pool.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
from collections.abc import Callable, Iterable

from rocketq.codec import Prop
from rocketq.message import ReceivedMessage

#: A queue not pulled for this long is considered stuck and rebuilt by the rebalance.
PULL_MAX_IDLE_MS = 120_000
#: Default consume timeout (consumeTimeout, 15 minutes) after which a message is sent back.
CONSUME_TIMEOUT_MS = 15 * 60 * 1000
#: How many leading messages one expiry scan looks at (the rest wait for the next scan).
EXPIRED_SCAN_MAX = 16


#: Longest pause between two tries of :meth:`ConsumeLock.acquire_async` (it polls).
CONSUME_LOCK_POLL_MAX_S = 0.02


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class ConsumeLock:
    """Orderly: held around each listener call of one queue (RocketMQ's ``consumeLock``).

    Usable from threads (:meth:`acquire`, :meth:`release`, ``with``) and from asyncio
    (:meth:`acquire_async`, which polls, so the event loop never blocks on it). Fairness: an
    async waiter registers itself, and a holder taking the lock again for its next batch with
    ``yield_to_waiters`` lets registered waiters go first — so the rebalance, which waits up to
    1 s to release a queue, gets the lock as soon as the running call ends instead of losing
    the race to the next batch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._waiters = 0

    def acquire(self, timeout_s: float = -1) -> bool:
        """Blocking acquire for threads; ``timeout_s`` < 0 waits for ever."""
        return self._lock.acquire(timeout=timeout_s)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    @property
    def waiters(self) -> int:
        """Async acquirers waiting now."""
        return self._waiters

    def __enter__(self) -> ConsumeLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _add_waiter(self, delta: int) -> None:
        with self._count_lock:
            self._waiters += delta

    async def acquire_async(
        self, timeout_s: float | None = None, *, yield_to_waiters: bool = False
    ) -> bool:
        """Acquire without blocking the loop; False if ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        delay_s = 0.001
        if yield_to_waiters:
            while self._waiters > 0 and (deadline is None or loop.time() < deadline):
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, CONSUME_LOCK_POLL_MAX_S)
        self._add_waiter(1)
        try:
            while not self._lock.acquire(blocking=False):
                if deadline is not None and loop.time() >= deadline:
                    return False
                pause_s = delay_s if deadline is None else min(delay_s, deadline - loop.time())
                await asyncio.sleep(max(pause_s, 0.0))
                delay_s = min(delay_s * 2, CONSUME_LOCK_POLL_MAX_S)
            return True
        finally:
            self._add_waiter(-1)


class ProcessQueue:
    """Messages pulled from one queue and not yet consumed, in queue-offset order.

    ``clock`` returns milliseconds; tests pass a fake one. Attributes read and written without
    the lock (``dropped``, ``locked``, timestamps) are single assignments, atomic in CPython.
    """

    def __init__(self, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._msgs: dict[int, ReceivedMessage] = {}
        self._offsets: list[int] = []  # the keys of _msgs, sorted
        self._count = 0  # messages in _msgs and _consuming
        self._size_bytes = 0  # their body bytes
        self._consume_start_ms: dict[int, int] = {}
        # Orderly mode: messages handed to the listener and not yet committed.
        self._consuming: dict[int, ReceivedMessage] = {}
        self._dispatching = False

        self.queue_offset_max = -1
        """Highest queue offset ever put here (-1 before the first message)."""
        self.msg_acc_count = 0
        """Messages in the broker queue beyond the last one pulled (from MAX_OFFSET), for lag."""
        self.dropped = False
        """Set when the queue is taken away (rebalance, illegal offset); results are ignored."""
        now_ms = clock()
        self.last_pull_timestamp_ms = now_ms
        """When a pull for this queue last started."""
        self.last_consume_timestamp_ms = now_ms
        """When consumed messages were last removed."""
        self.locked = False
        """Orderly mode: whether this client holds the broker lock on the queue."""
        self.last_lock_timestamp_ms = now_ms
        """Orderly mode: when the broker lock was last taken or renewed."""
        self.try_unlock_times = 0
        """Orderly mode: failed attempts to unlock while a batch was being consumed."""
        self.consume_lock = ConsumeLock()
        """Orderly mode: held around each listener call (and its result) of this queue."""

    # ---- counters ---------------------------------------------------------------------------

    @property
    def msg_count(self) -> int:
        """Messages cached and not yet removed or committed."""
        return self._count

    @property
    def msg_size_bytes(self) -> int:
        """Total body bytes of those messages."""
        return self._size_bytes

    def first_offset(self) -> int:
        """Smallest queue offset waiting here, or -1 if none."""
        with self._lock:
            return self._offsets[0] if self._offsets else -1

    def last_offset(self) -> int:
        """Largest queue offset waiting here, or -1 if none."""
        with self._lock:
            return self._offsets[-1] if self._offsets else -1

    def max_span(self) -> int:
        """Largest minus smallest waiting offset (0 when fewer than two are waiting)."""
        with self._lock:
            return self._offsets[-1] - self._offsets[0] if self._offsets else 0

    def is_lock_expired(self, now_ms: int, lock_max_live_ms: int) -> bool:
        """Orderly: True if the broker lock was not taken or renewed within
        ``lock_max_live_ms`` before ``now_ms`` (this client then treats it as lost)."""
        return now_ms - self.last_lock_timestamp_ms > lock_max_live_ms

    def holds_lock(self, now_ms: int, lock_max_live_ms: int) -> bool:
        """Orderly, clustering: locked on the broker and not expired; pull and consume only
        then."""
        return self.locked and not self.is_lock_expired(now_ms, lock_max_live_ms)

    def is_pull_expired(self, now_ms: int, pull_max_idle_ms: int = PULL_MAX_IDLE_MS) -> bool:
        """True if no pull started within ``pull_max_idle_ms`` before ``now_ms``."""
        return now_ms - self.last_pull_timestamp_ms > pull_max_idle_ms

    # ---- put / remove -----------------------------------------------------------------------

    def put_messages(self, msgs: Iterable[ReceivedMessage]) -> bool:
        """Cache freshly pulled messages; offsets already here are ignored.

        Returns ``dispatch_to_consume``: True when messages are waiting and no orderly consume
        task is draining the queue, in which case the caller must start one. (Concurrent
        consumers submit every batch and ignore the flag.)
        """
        with self._lock:
            last: ReceivedMessage | None = None
            for msg in msgs:
                offset = msg.queue_offset
                last = msg
                if offset in self._msgs or offset in self._consuming:
                    continue
                self._msgs[offset] = msg
                if not self._offsets or offset > self._offsets[-1]:
                    self._offsets.append(offset)
                else:
                    bisect.insort(self._offsets, offset)
                self._count += 1
                self._size_bytes += len(msg.body)
            if last is not None:
                self.queue_offset_max = max(self.queue_offset_max, last.queue_offset)
                self._update_acc_count(last)
            dispatch = bool(self._msgs) and not self._dispatching
            if dispatch:
                self._dispatching = True
            return dispatch

    def _update_acc_count(self, last: ReceivedMessage) -> None:
        max_offset = last.properties.get(Prop.MAX_OFFSET, "")
        if max_offset.isdigit():
            self.msg_acc_count = max(0, int(max_offset) - last.queue_offset)

    def remove_messages(self, msgs: Iterable[ReceivedMessage]) -> int:
        """Forget consumed messages and return the offset to commit.

        That is the smallest offset still waiting; ``queue_offset_max + 1`` when none is left;
        -1 when nothing was cached at all (nothing to commit).
        """
        with self._lock:
            self.last_consume_timestamp_ms = self._clock()
            if not self._msgs:
                return -1
            for msg in msgs:
                offset = msg.queue_offset
                removed = self._msgs.pop(offset, None)
                if removed is None:
                    continue
                del self._offsets[bisect.bisect_left(self._offsets, offset)]
                self._consume_start_ms.pop(offset, None)
                self._count -= 1
                self._size_bytes -= len(removed.body)
            return self._offsets[0] if self._offsets else self.queue_offset_max + 1

    # ---- consume timeout (SPEC §6.13) -------------------------------------------------------

    def mark_consume_start(
        self, msgs: Iterable[ReceivedMessage], now_ms: int | None = None
    ) -> None:
        """Record that the listener is starting on ``msgs`` (call just before invoking it)."""
        start_ms = self._clock() if now_ms is None else now_ms
        with self._lock:
            for msg in msgs:
                if msg.queue_offset in self._msgs:
                    self._consume_start_ms[msg.queue_offset] = start_ms

    def expired_messages(
        self,
        now_ms: int,
        consume_timeout_ms: int = CONSUME_TIMEOUT_MS,
        scan_max: int = EXPIRED_SCAN_MAX,
    ) -> list[ReceivedMessage]:
        """Leading messages whose listener started more than ``consume_timeout_ms`` ago.

        Only the head of the queue is examined (at most ``scan_max`` messages, stopping at the
        first one that is not expired): only the head holds the commit offset back. The caller
        sends them back for retry, then :meth:`remove_messages` them. Concurrent mode only;
        messages not yet started are never expired.
        """
        expired: list[ReceivedMessage] = []
        with self._lock:
            for offset in self._offsets[:scan_max]:
                start_ms = self._consume_start_ms.get(offset)
                if start_ms is None or now_ms - start_ms <= consume_timeout_ms:
                    break
                expired.append(self._msgs[offset])
        return expired

    # ---- orderly consumption ----------------------------------------------------------------

    def take_messages(self, batch_size: int) -> list[ReceivedMessage]:
        """Orderly: move up to ``batch_size`` lowest-offset messages to the consuming set.

        An empty result ends the current dispatch, so the next :meth:`put_messages` returns True.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        with self._lock:
            self.last_consume_timestamp_ms = self._clock()
            taken = self._offsets[:batch_size]
            del self._offsets[:batch_size]
            batch = [self._msgs.pop(offset) for offset in taken]
            for msg in batch:
                self._consuming[msg.queue_offset] = msg
            if not batch:
                self._dispatching = False
            return batch

    def commit(self) -> int:
        """Orderly: the consuming set succeeded; return the offset to commit (-1 if none)."""
        with self._lock:
            if not self._consuming:
                return -1
            next_offset = max(self._consuming) + 1
            self._count -= len(self._consuming)
            self._size_bytes -= sum(len(m.body) for m in self._consuming.values())
            self._consuming.clear()
            return next_offset

    def make_messages_to_consume_again(self, msgs: Iterable[ReceivedMessage]) -> None:
        """Orderly: put messages of the consuming set back, to be taken again first."""
        with self._lock:
            for msg in msgs:
                offset = msg.queue_offset
                if self._consuming.pop(offset, None) is None:
                    continue
                self._msgs[offset] = msg
                bisect.insort(self._offsets, offset)

    def clear(self) -> None:
        """Forget every message (the queue was dropped and will be rebuilt from its offset)."""
        with self._lock:
            self._msgs.clear()
            self._offsets.clear()
            self._consuming.clear()
            self._consume_start_ms.clear()
            self._count = 0
            self._size_bytes = 0
            self._dispatching = False

    def __repr__(self) -> str:
        return (
            f"ProcessQueue(count={self._count}, size_bytes={self._size_bytes}, "
            f"offset_max={self.queue_offset_max}, dropped={self.dropped}, locked={self.locked})"
        )
