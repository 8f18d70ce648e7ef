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

Design (issue 16: bookkeeping per pulled batch, not per message): each pulled batch stays one
:class:`_Run` — its messages and offsets in lists as pulled, a ``bytearray`` of waiting flags,
consume start times and a running sum of body sizes — and the runs are kept in offset order
without overlapping. A listener batch is almost always a consecutive slice of one run, so
removing it or marking it started is a handful of slice operations whatever its length, and the
commit offset is the first waiting flag of the first run (runs with nothing waiting are
dropped at once). The concurrent consume service goes further: it asks for the run of the pull
it was handed (:meth:`ProcessQueue.run_of`) and marks and releases batches by their index in it
(:meth:`ProcessQueue.start_slice`, :meth:`ProcessQueue.release_slice`), falling back to the
offset-based methods when that run has gone (merged by a rebuild, cleared).
Anything else (a message put twice, offsets below what is cached, orderly
messages put back after their run went) takes a per-message path, and an insert that does not
fit after the last run rebuilds the runs as one — rare, and bounded by the flow-control limit
of a few thousand messages. Every method takes one ``threading.Lock``: pulls run on the event
loop while synchronous listeners finish on a thread pool.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import operator
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from rocketq.codec import Prop
from rocketq.message import ReceivedMessage

_QUEUE_OFFSET = operator.attrgetter("queue_offset")
_BODY = operator.attrgetter("body")
"""Field getters for per-message loops run in C (map) rather than in comprehensions."""

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


class _Run:
    """One pulled batch as cached: offsets ascending, ``waiting[i]`` 1 until message i is
    removed (or, orderly, taken), ``started_ms[i]`` 0 until its listener call starts,
    ``size_before[i]`` the body bytes of messages 0..i-1. ``head`` is the first waiting index
    and ``left`` how many wait (a run with none left is dropped)."""

    __slots__ = ("head", "left", "live", "msgs", "offsets", "size_before", "started_ms", "waiting")

    def __init__(self, msgs: list[ReceivedMessage], offsets: list[int]) -> None:
        self.live = True
        """False once the run left the queue (all removed, merged by a rebuild, cleared): a
        consume service holding it then falls back to the per-message methods."""
        self.msgs = msgs
        self.offsets = offsets
        self.waiting = bytearray(b"\x01") * len(msgs)
        self.started_ms = [0] * len(msgs)
        self.size_before = [0, *itertools.accumulate(map(len, map(_BODY, msgs)))]
        self.head = 0
        self.left = len(msgs)

    def index(self, offset: int) -> int:
        """Index of ``offset`` here, or -1."""
        offsets = self.offsets
        i = offset - offsets[0]  # exact when the run has no gaps (nothing filtered out)
        if not (0 <= i < len(offsets) and offsets[i] == offset):
            i = bisect.bisect_left(offsets, offset)
            if i == len(offsets) or offsets[i] != offset:
                return -1
        return i

    def slice_of(self, msgs: Sequence[ReceivedMessage]) -> int:
        """Start index when ``msgs`` are consecutive messages of this run, else -1."""
        start = self.index(msgs[0].queue_offset)
        if start < 0 or len(msgs) == 1:
            return start
        end = start + len(msgs)
        if self.offsets[start:end] != [m.queue_offset for m in msgs]:
            return -1
        return start


class ProcessQueue:
    """Messages pulled from one queue and not yet consumed, in queue-offset order.

    ``clock`` returns milliseconds; tests pass a fake one. Attributes read and written without
    the lock (``dropped``, ``locked``, timestamps) are single assignments, atomic in CPython.
    """

    def __init__(self, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: list[_Run] = []  # in offset order, none overlapping, each with left > 0
        self._run_starts: list[int] = []  # first offset of each run (for bisect)
        self._waiting = 0  # messages waiting in _runs
        self._count = 0  # messages waiting and in _consuming
        self._size_bytes = 0  # their body bytes
        # Orderly mode: messages handed to the listener and not yet committed.
        self._consuming: dict[int, ReceivedMessage] = {}
        self._dispatching = False
        self._last_put: _Run | None = None  # the run the last put_messages appended as given

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
            return self._first_locked()

    def last_offset(self) -> int:
        """Largest queue offset waiting here, or -1 if none."""
        with self._lock:
            return self._last_locked()

    def max_span(self) -> int:
        """Largest minus smallest waiting offset (0 when fewer than two are waiting)."""
        with self._lock:
            return self._last_locked() - self._first_locked() if self._runs else 0

    def _first_locked(self) -> int:
        if not self._runs:
            return -1
        run = self._runs[0]
        return run.offsets[run.head]

    def _last_locked(self) -> int:
        if not self._runs:
            return -1
        run = self._runs[-1]
        return run.offsets[run.waiting.rfind(1)]

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
        batch = msgs if isinstance(msgs, list) else list(msgs)
        with self._lock:
            if batch:
                offsets = list(map(_QUEUE_OFFSET, batch))
                if offsets[0] > self.queue_offset_max and _strictly_increasing(offsets):
                    # A pull past everything cached: nothing here can repeat one of these.
                    self._last_put = _Run(batch, offsets)
                    self._append_run(self._last_put)
                else:
                    self._insert_slow(batch)
                last = batch[-1]
                top = max(offsets)
                self.queue_offset_max = max(self.queue_offset_max, top)
                self._update_acc_count(last)
            dispatch = self._waiting > 0 and not self._dispatching
            if dispatch:
                self._dispatching = True
            return dispatch

    def _append_run(self, run: _Run) -> None:
        self._runs.append(run)
        self._run_starts.append(run.offsets[0])
        self._waiting += run.left
        self._count += run.left
        self._size_bytes += run.size_before[-1]

    def _insert_slow(self, batch: list[ReceivedMessage]) -> None:
        """Add the messages of ``batch`` not cached yet, keeping the runs ordered."""
        fresh: dict[int, ReceivedMessage] = {}
        for msg in batch:
            offset = msg.queue_offset
            if offset not in fresh and offset not in self._consuming and not self._has(offset):
                fresh[offset] = msg
        if not fresh:
            return
        offsets = sorted(fresh)
        if not self._runs or offsets[0] > self._runs[-1].offsets[-1]:
            self._append_run(_Run([fresh[o] for o in offsets], offsets))
            return
        self._rebuild(fresh)

    def _rebuild(self, fresh: dict[int, ReceivedMessage]) -> None:
        """Merge every waiting message and ``fresh`` into one run (the rare out-of-order path)."""
        entries = dict(fresh)
        started: dict[int, int] = {}
        for run in self._runs:
            for i, flag in enumerate(run.waiting):
                if flag:
                    entries[run.offsets[i]] = run.msgs[i]
                    started[run.offsets[i]] = run.started_ms[i]
        self._count -= self._waiting
        self._size_bytes -= sum(len(m.body) for o, m in entries.items() if o not in fresh)
        self._waiting = 0
        for old in self._runs:
            old.live = False
        self._runs.clear()
        self._run_starts.clear()
        offsets = sorted(entries)
        run = _Run([entries[o] for o in offsets], offsets)
        run.started_ms = [started.get(o, 0) for o in offsets]
        self._append_run(run)

    def _find(self, offset: int) -> tuple[int, int]:
        """(run index, index in the run) of a cached ``offset`` (waiting or not), or (-1, -1)."""
        r = bisect.bisect_right(self._run_starts, offset) - 1
        if r < 0:
            return -1, -1
        i = self._runs[r].index(offset)
        return (r, i) if i >= 0 else (-1, -1)

    def _has(self, offset: int) -> bool:
        r, i = self._find(offset)
        return r >= 0 and self._runs[r].waiting[i] == 1

    def _locate_slice(self, msgs: list[ReceivedMessage]) -> tuple[int, int]:
        """(run index, start) when ``msgs`` are consecutive in one run, else (-1, -1)."""
        r = bisect.bisect_right(self._run_starts, msgs[0].queue_offset) - 1
        if r < 0:
            return -1, -1
        start = self._runs[r].slice_of(msgs)
        return (r, start) if start >= 0 else (-1, -1)

    def _unwait(self, r: int, i: int, n: int) -> int:
        """Clear waiting flags i..i+n-1 of run ``r`` (all set); returns their body bytes."""
        run = self._runs[r]
        run.waiting[i : i + n] = bytes(n)
        run.left -= n
        self._waiting -= n
        size = run.size_before[i + n] - run.size_before[i]
        if run.left == 0:
            run.live = False
            del self._runs[r]
            del self._run_starts[r]
        elif run.head >= i:
            run.head = run.waiting.find(1, run.head)
        return size

    def _update_acc_count(self, last: ReceivedMessage) -> None:
        max_offset = last.get_property(Prop.MAX_OFFSET) or ""  # the pull's, not decoding the rest
        if max_offset.isdigit():
            self.msg_acc_count = max(0, int(max_offset) - last.queue_offset)

    def remove_messages(self, msgs: Iterable[ReceivedMessage]) -> int:
        """Forget consumed messages and return the offset to commit.

        That is the smallest offset still waiting; ``queue_offset_max + 1`` when none is left;
        -1 when nothing was cached at all (nothing to commit).
        """
        batch = msgs if isinstance(msgs, list) else list(msgs)
        with self._lock:
            self.last_consume_timestamp_ms = self._clock()
            if not self._waiting:
                return -1
            if batch:
                r, start = self._locate_slice(batch)
                n = len(batch)
                if r >= 0 and self._runs[r].waiting.count(1, start, start + n) == n:
                    removed_bytes = self._unwait(r, start, n)  # the usual case: one slice
                    removed = n
                else:
                    removed, removed_bytes = self._remove_each(batch)
                self._count -= removed
                self._size_bytes -= removed_bytes
            first = self._first_locked()
            return first if first >= 0 else self.queue_offset_max + 1

    def _remove_each(self, batch: list[ReceivedMessage]) -> tuple[int, int]:
        removed = removed_bytes = 0
        for msg in batch:
            r, i = self._find(msg.queue_offset)
            if r >= 0 and self._runs[r].waiting[i]:
                removed_bytes += self._unwait(r, i, 1)
                removed += 1
        return removed, removed_bytes

    # ---- slices of a pulled batch (the concurrent consume service's fast path) ----------------

    def run_of(self, msgs: list[ReceivedMessage]) -> _Run | None:
        """The run the last :meth:`put_messages` made of exactly this list (the same object),
        or None (the put took the per-message path, or the run has gone since). With it,
        :meth:`start_slice` and :meth:`release_slice` address messages by their index in
        ``msgs``: no offset lookups per listener call."""
        with self._lock:
            run = self._last_put
            return run if run is not None and run.msgs is msgs and run.live else None

    def now_ms(self) -> int:
        """This queue's clock (ms): what its consume start and consume times are read from."""
        return self._clock()

    def start_slice(self, run: _Run, i: int, n: int) -> int:
        """:meth:`mark_consume_start` for messages ``i .. i+n-1`` of ``run``; returns the time
        it recorded (ms), which the matching :meth:`release_slice` takes."""
        now_ms = self._clock()
        with self._lock:
            if run.live:
                if n == 1:
                    run.started_ms[i] = now_ms
                else:
                    run.started_ms[i : i + n] = [now_ms] * n
        return now_ms

    def release_slice(self, run: _Run, i: int, n: int, now_ms: int) -> int | None:
        """:meth:`remove_messages` for messages ``i .. i+n-1`` of ``run``, all still waiting;
        ``now_ms`` (from :meth:`start_slice`) becomes :attr:`last_consume_timestamp_ms`.
        Returns the offset to commit, or None when the slice is not in the queue as it was
        (then call :meth:`remove_messages`)."""
        with self._lock:
            waiting = run.waiting
            if not run.live or (waiting[i] != 1 if n == 1 else waiting.count(1, i, i + n) != n):
                return None
            self.last_consume_timestamp_ms = now_ms
            # _unwait, written out: this runs once per listener call.
            if n == 1:
                waiting[i] = 0
            else:
                waiting[i : i + n] = bytes(n)
            run.left -= n
            self._waiting -= n
            self._count -= n
            self._size_bytes -= run.size_before[i + n] - run.size_before[i]
            runs = self._runs
            if run.left == 0:
                run.live = False
                r = 0 if runs[0] is run else bisect.bisect_left(self._run_starts, run.offsets[0])
                del runs[r]
                del self._run_starts[r]
            elif run.head == i:
                run.head = waiting.find(1, i + n)
            if not runs:
                return self.queue_offset_max + 1
            first = runs[0]
            return first.offsets[first.head]

    # ---- consume timeout (SPEC §6.13) -------------------------------------------------------

    def mark_consume_start(
        self, msgs: Sequence[ReceivedMessage], now_ms: int | None = None
    ) -> None:
        """Record that the listener is starting on ``msgs`` (call just before invoking it)."""
        if not msgs:
            return
        start_ms = self._clock() if now_ms is None else now_ms
        batch = msgs if isinstance(msgs, list) else list(msgs)
        with self._lock:
            r, start = self._locate_slice(batch)
            if r >= 0:
                self._runs[r].started_ms[start : start + len(batch)] = [start_ms] * len(batch)
                return
            for msg in batch:
                r, i = self._find(msg.queue_offset)
                if r >= 0:
                    self._runs[r].started_ms[i] = start_ms

    def _waiting_entries(self) -> Iterable[tuple[_Run, int]]:
        """(run, index) of every waiting message, in offset order (call under the lock)."""
        for run in self._runs:
            i = run.head
            while i >= 0:
                yield run, i
                i = run.waiting.find(1, i + 1)

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
            for run, i in itertools.islice(self._waiting_entries(), scan_max):
                start_ms = run.started_ms[i]
                if start_ms == 0 or now_ms - start_ms <= consume_timeout_ms:
                    break
                expired.append(run.msgs[i])
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
            batch: list[ReceivedMessage] = []
            while self._runs and len(batch) < batch_size:
                run = self._runs[0]
                # Orderly runs wait as one block from the head (taken from the front, put back
                # at the front), so this is usually a single slice.
                n = min(batch_size - len(batch), run.left)
                end = run.head + n
                if run.waiting.count(1, run.head, end) != n:
                    end = run.head + 1
                    n = 1
                batch.extend(run.msgs[run.head : end])
                self._unwait(0, run.head, n)
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
            again: dict[int, ReceivedMessage] = {}
            for msg in msgs:
                if self._consuming.pop(msg.queue_offset, None) is not None:
                    again[msg.queue_offset] = msg
            if not again:
                return
            # Counted while consuming; _append_run / _rebuild count them again as waiting.
            self._count -= len(again)
            self._size_bytes -= sum(len(m.body) for m in again.values())
            offsets = sorted(again)
            if not self._runs or offsets[-1] < self._runs[0].offsets[0]:
                run = _Run([again[o] for o in offsets], offsets)
                self._runs.insert(0, run)
                self._run_starts.insert(0, offsets[0])
                self._waiting += run.left
                self._count += run.left
                self._size_bytes += run.size_before[-1]
            else:
                self._rebuild(again)

    def clear(self) -> None:
        """Forget every message (the queue was dropped and will be rebuilt from its offset)."""
        with self._lock:
            for run in self._runs:
                run.live = False
            self._runs.clear()
            self._run_starts.clear()
            self._waiting = 0
            self._consuming.clear()
            self._count = 0
            self._size_bytes = 0
            self._dispatching = False

    def __repr__(self) -> str:
        return (
            f"ProcessQueue(count={self._count}, size_bytes={self._size_bytes}, "
            f"offset_max={self.queue_offset_max}, dropped={self.dropped}, locked={self.locked})"
        )


def _strictly_increasing(offsets: list[int]) -> bool:
    """True when ``offsets`` ascend without repeats (a pull's always do; checked in C)."""
    return all(map(operator.lt, offsets, itertools.islice(offsets, 1, None)))
