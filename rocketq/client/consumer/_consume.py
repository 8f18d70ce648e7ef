"""Concurrent consumption: listener calls, result processing, offsets (SPEC §6.11, §6.13).

Pulled messages are split into batches of ``consume_message_batch_max_size`` and each batch is
one listener call. A plain function runs on a thread pool of ``consume_thread_max`` threads; a
coroutine function runs on the event loop. Each pull waits in one FIFO as a job and at most
``consume_thread_max`` worker tasks take its batches off it, one listener call at a time each:
that bounds the calls in progress as RocketMQ's pool does, without a task, a future and a
semaphore wait per batch (with the default batch of one message those were most of the
consumer's CPU per message, issue 16). Workers start one at a time, each once the previous one
has run, so a listener that never suspends drains the FIFO in one worker. A batch of a pull is
addressed by its index in the ProcessQueue's run of that pull (``start_slice``,
``release_slice``: no offset lookups per call), and the offset store is updated once per pull or
loop turn rather than per call (``ConsumeService._done``). A coroutine listener's call that
finishes without suspending (most do) let nothing else run meanwhile, so it is neither marked
started nor released on its own: a worker releases such successes as one slice before anything
else can run (``ConsumeService._consume_job``). A worker ends when the FIFO is empty;
:meth:`ConsumeService.submit` starts one again. A worker of a plain listener hands the pool an
even share of the FIFO at a time
(at most ``THREAD_GROUP_MAX`` batches, each still its own call), so a backlog costs one thread
trip per few batches rather than per batch. The number of waiting batches is bounded by the pull
flow control (1000 cached messages per queue), so nothing here grows without limit.

After a call (``process_consume_result``):

* ``ack_index``: CONSUME_SUCCESS acks the batch up to ``ConsumeContext.ack_index`` (all of it
  by default); RECONSUME_LATER, None, or an exception acks nothing.
* Unacked messages: BROADCASTING drops them with a warning (no retry in that model).
  CLUSTERING sends each back to the broker for redelivery through ``%RETRY%{group}``; a message
  whose send-back fails (the broker refuses, is down, or does not implement it yet) gets
  ``reconsume_times + 1`` and is consumed again **locally after 5 s**, staying in the
  ProcessQueue meanwhile so the offset cannot pass it.
* The offset to commit is the smallest offset still in the ProcessQueue (or one past the
  highest pulled when it is empty): never beyond a message in flight, so a crash repeats
  messages but never loses one (SPEC §6.11 "offset rule", §15: d before a, b, c keeps a).
* If the queue was dropped meanwhile (rebalanced away), the result is ignored: the new owner
  will consume those messages again from the last committed offset.

Expiry (SPEC §6.13): every ``consume_timeout_minutes`` the head of each ProcessQueue is checked
for messages whose listener call started more than that long ago; each is sent back (or, if
that fails, consumed again locally) and released, so one stuck call cannot hold the offset. A
coroutine listener's call counts as started when it first suspends (before that no check can
run: the loop is busy with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import sys
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rocketq.client import _tracing
from rocketq.client.consumer.config import (
    ConsumeContext,
    ConsumeResult,
    MessageListener,
    MessageModel,
)
from rocketq.client.consumer.offset_store import OffsetStore
from rocketq.client.consumer.process_queue import ProcessQueue, _Run, wall_clock_ms
from rocketq.codec import Prop
from rocketq.message import MessageQueue, ReceivedMessage
from rocketq.validation import retry_topic

log = logging.getLogger(__name__)

LOCAL_RETRY_DELAY_S = 5.0
"""SPEC §6.11: a message whose send-back failed is consumed again locally after 5 s."""
EXPIRED_SEND_BACK_DELAY_LEVEL = 3
"""RocketMQ sends an expired message back with delay level 3 (10 s)."""

THREAD_GROUP_MAX = 16
"""Most listener batches one trip to the thread pool carries (plain listeners)."""
_COROUTINE = types.CoroutineType
_NOT_CALLED = object()
"""A batch of a thread trip skipped because its queue was dropped first."""


def _lone_refcount() -> int:
    """What ``sys.getrefcount`` says of an object that only a local name refers to (2 on
    CPython 3.11: the name and the call's argument), measured rather than assumed."""
    lone = object()
    return sys.getrefcount(lone)


_LONE_REFCOUNT = _lone_refcount()

SendBack = Callable[[MessageQueue, ReceivedMessage, int], Awaitable[bool]]
"""Returns a failed message to the broker; True if the broker took it."""


def ack_index_for(result: ConsumeResult | None, context: ConsumeContext, size: int) -> int:
    """Index of the last acknowledged message of a batch of ``size``; -1 for none."""
    if result is not ConsumeResult.CONSUME_SUCCESS:
        return -1
    ack = context.ack_index
    if ack is None or ack >= size:
        return size - 1
    return max(ack, -1)


def is_async_listener(listener: object) -> bool:
    """True for a coroutine function or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None)  # noqa: B004 - a coroutine __call__, not callability
    )


async def invoke_listener(
    listener: Callable[..., Any],
    executor: ThreadPoolExecutor | None,
    msgs: list[ReceivedMessage],
    context: object,
) -> Any:
    """Call ``listener(msgs, context)``: on ``executor`` when given (a plain function), else on
    the loop, awaiting what it returns if that is awaitable. Exceptions propagate."""
    if executor is not None:
        loop = asyncio.get_running_loop()
        # run in a copy of this context: the listener sees the process span as current
        call = functools.partial(contextvars.copy_context().run, listener, msgs, context)
        outcome: Any = await loop.run_in_executor(executor, call)
    else:
        outcome = listener(msgs, context)
    if inspect.isawaitable(outcome):
        outcome = await outcome
    return outcome


def reset_retry_topic(msgs: list[ReceivedMessage], group: str) -> None:
    """Show redelivered messages under their original topic, as RocketMQ does before a call."""
    group_retry_topic = retry_topic(group)
    for msg in msgs:
        # The topic first: a string compare per message, the property lookup only on a retry.
        if msg.topic == group_retry_topic and (original := msg.properties.get(Prop.RETRY_TOPIC)):
            msg.topic = original


class _Job:
    """Messages submitted together (usually one pull's), consumed batch by batch: ``next`` is
    the index of the first one no worker has taken yet. ``run`` is the ProcessQueue's run made
    of this very list (:meth:`ProcessQueue.run_of`), or None (a local retry, an expired
    message, a pull that overlapped what was cached): then the per-message methods are used."""

    __slots__ = ("mq", "msgs", "next", "pq", "run")

    def __init__(
        self, msgs: list[ReceivedMessage], pq: ProcessQueue, mq: MessageQueue, run: _Run | None
    ) -> None:
        self.msgs = msgs
        self.pq = pq
        self.mq = mq
        self.run = run
        self.next = 0


class _Resume:
    """Awaits the rest of a coroutine that has already run to its first suspension (it
    yielded ``first``), exactly as ``await`` would have: what the task sends or throws goes to
    the coroutine, and what it yields goes to the task (PEP 380's delegation, written out).
    :meth:`ConsumeService._consume_job` starts a listener's coroutine by hand to learn whether
    it suspends at all."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: object) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        out = self._first
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (a cancel): to the coroutine
                try:
                    out = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class ConsumeService:
    """Runs the listener over pulled batches and turns results into offsets (one consumer)."""

    def __init__(
        self,
        *,
        group: str,
        listener: MessageListener,
        message_model: MessageModel,
        batch_max_size: int,
        thread_max: int,
        offset_store: OffsetStore,
        send_back: SendBack,
        consume_timeout_ms: int,
        local_retry_delay_s: float = LOCAL_RETRY_DELAY_S,
    ) -> None:
        self._group = group
        self._retry_topic = retry_topic(group)
        self._listener = listener
        self._async = is_async_listener(listener)
        self._model = message_model
        self._batch_max = batch_max_size
        self._offsets = offset_store
        self._send_back = send_back
        self.consume_timeout_ms = consume_timeout_ms
        self._local_retry_delay_s = local_retry_delay_s
        self._workers_max = thread_max
        # Submitted messages with batches not yet taken by a worker, in order.
        self._waiting: deque[_Job] = deque()
        self._batches_waiting = 0  # listener batches left in them
        # Offsets to commit not yet handed to the offset store (see _done), by ProcessQueue.
        self._unstored: dict[ProcessQueue, tuple[MessageQueue, int]] = {}
        self._flush_soon = False  # a _flush_offsets_soon is scheduled
        self._workers = 0  # running _work tasks
        self._starting = False  # a worker was spawned and has not run yet (see _add_worker)
        self._executor: ThreadPoolExecutor | None = None
        if not self._async:
            self._executor = ThreadPoolExecutor(
                max_workers=thread_max, thread_name_prefix=f"consume-{group}"
            )
        self._tasks: set[asyncio.Task[None]] = set()  # workers (each runs one call at a time)
        self._delayed: set[asyncio.Task[None]] = set()  # local retries waiting out their delay
        self._closed = False
        self.consumed_ok = 0
        self.consumed_failed = 0

    # ---- submission -------------------------------------------------------------------------

    def submit(
        self, msgs: list[ReceivedMessage], pq: ProcessQueue, mq: MessageQueue, dispatch: bool
    ) -> None:
        """Consume ``msgs`` in batches (``dispatch`` is for orderly consumers; unused here)."""
        if self._closed or not msgs:
            return
        # Before any call of the pull: the listener sees redelivered messages under their topic.
        # A pull's messages are those of its queue's topic: only a retry queue's can need it.
        if mq.topic == self._retry_topic:
            reset_retry_topic(msgs, self._group)
        self._waiting.append(_Job(msgs, pq, mq, pq.run_of(msgs)))
        self._batches_waiting += -(-len(msgs) // self._batch_max)
        self._add_worker()

    def _add_worker(self) -> None:
        """Start one more worker if batches wait, the cap allows and no worker started before
        is still waiting for its first turn on the loop.

        Workers are added one at a time, each when the previous one has run (it calls this
        after taking its first batch): a listener that awaits something lets the next worker
        start, so up to ``consume_thread_max`` calls overlap as before; a listener that never
        suspends drains the FIFO in one worker, and a pull then costs one extra task rather
        than ``consume_thread_max`` tasks that start only to find nothing left (issue 16)."""
        if self._starting or self._workers >= self._workers_max or not self._batches_waiting:
            return
        self._workers += 1
        self._starting = True
        self._spawn(self._work())

    def _take(self) -> tuple[_Job, int, int]:
        """The next listener batch: messages ``i .. j-1`` of the job at the FIFO's head."""
        job = self._waiting[0]
        i = job.next
        j = job.next = min(i + self._batch_max, len(job.msgs))
        if j == len(job.msgs):
            self._waiting.popleft()
        self._batches_waiting -= 1
        return job, i, j

    async def _work(self) -> None:
        """Take batches off the FIFO until it is empty or the service closes."""
        waiting = self._waiting
        self._starting = False
        try:
            while waiting and not self._closed:
                if self._executor is None:
                    if waiting[0].run is not None:
                        await self._consume_job(waiting[0])
                        continue
                    job, i, j = self._take()
                    self._add_worker()
                    await self._consume(job.msgs[i:j], job.pq, job.mq)
                else:
                    group = self._take_group()
                    self._add_worker()
                    await self._consume_on_thread(group)
        finally:
            # Counted down here, not in a done callback: a submit running before that callback
            # would see one worker too many and could leave its batch waiting.
            self._workers -= 1
            self._flush_offsets()

    def _take_group(self) -> list[tuple[_Job, int, int]]:
        """Plain listeners: the next batches for one thread hand-off — an even share of the
        FIFO per worker (at most THREAD_GROUP_MAX), so every thread stays busy while a backlog
        lasts and a lone batch still goes alone. The price: batches sharing a trip with a call
        that hangs wait behind it (at most THREAD_GROUP_MAX - 1 of them, and only under a
        backlog of more than one batch per thread)."""
        share = -(-self._batches_waiting // self._workers_max)
        group = []
        for _ in range(max(1, min(share, THREAD_GROUP_MAX))):
            if not self._waiting:
                break
            group.append(self._take())
        return group

    async def _consume_on_thread(self, group: list[tuple[_Job, int, int]]) -> None:
        """Call a plain listener on each batch of ``group`` in one trip to the thread pool.

        One trip per batch (a future, a thread wake-up and a loop wake-up) cost a plain listener
        more than the call itself. Each batch is still its own listener call with its own
        context, span and consume-start time (set on the thread when its call starts); the
        results are handled here in order, as :meth:`_consume` would.
        """
        items = []
        for job, i, j in group:
            if not job.pq.dropped:  # not consumed: the committed offset stays below them
                items.append((job, i, j, ConsumeContext(job.mq)))
        if not items:
            return
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, self._call_group, items)
        outcomes = await loop.run_in_executor(self._executor, call)
        # Fewer outcomes than items: the group stopped at shutdown.
        for (job, i, j, context), (outcome, error, start_ms) in zip(items, outcomes, strict=False):
            if outcome is _NOT_CALLED:
                continue  # dropped before its call: the committed offset stays below it
            pq, mq = job.pq, job.mq
            result = await self._checked(outcome, error, job.msgs[i:j], mq)
            if pq.dropped:
                self._log_dropped(mq, job.msgs[i:j])
            elif result is ConsumeResult.CONSUME_SUCCESS and context.ack_index is None:
                self._done(job, i, j, start_ms)
            else:
                await self.process_consume_result(result, context, job.msgs[i:j], pq, mq)

    def _call_group(
        self, items: list[tuple[_Job, int, int, ConsumeContext]]
    ) -> list[tuple[object, BaseException | None, int]]:
        """On a pool thread: the listener on each batch; (what it returned, what it raised,
        when it started)."""
        outcomes: list[tuple[object, BaseException | None, int]] = []
        for job, i, j, context in items:
            if self._closed:
                break
            pq = job.pq
            if pq.dropped:  # only this queue's batch: the others of the group still run
                outcomes.append((_NOT_CALLED, None, 0))
                continue
            msgs = job.msgs[i:j]  # the listener's own list
            start_ms = self._start(job, i, j)
            try:
                if _tracing.enabled():
                    with _tracing.process_span(self._group, job.mq, msgs):
                        outcomes.append((self._listener(msgs, context), None, start_ms))
                else:
                    outcomes.append((self._listener(msgs, context), None, start_ms))
            except Exception as exc:
                outcomes.append((None, exc, start_ms))
        return outcomes

    @staticmethod
    def _start(job: _Job, i: int, j: int) -> int:
        """Mark batch ``i .. j-1`` of ``job`` started; the time (ms)."""
        if job.run is not None:
            return job.pq.start_slice(job.run, i, j - i)
        msgs = job.msgs[i:j]
        now_ms = wall_clock_ms()
        job.pq.mark_consume_start(msgs, now_ms)
        return now_ms

    def _done(self, job: _Job, i: int, j: int, start_ms: int) -> None:
        """Batch ``i .. j-1`` of ``job`` succeeded whole: release it, move the offset.

        The offset store learns the new offset when the job's last batch is done, as soon as
        the loop gets a turn (a listener that awaits, a worker out of batches) and at shutdown
        (:meth:`_flush_offsets`), not after every batch: a worker running through a pull without
        suspending updates the store once for it. Until then the stored offset is only lower
        (never past a message in flight), as after any crash."""
        self.consumed_ok += j - i
        pq = job.pq
        offset = None if job.run is None else pq.release_slice(job.run, i, j - i, start_ms)
        if offset is None:
            self._release(job.msgs[i:j], pq, job.mq)
        elif offset >= 0:
            self._unstored[pq] = (job.mq, offset)
            if j == len(job.msgs):
                self._flush_offsets()
            elif not self._flush_soon:
                self._flush_soon = True
                asyncio.get_running_loop().call_soon(self._flush_offsets_soon)

    def _flush_offsets_soon(self) -> None:
        self._flush_soon = False
        self._flush_offsets()

    def _flush_offsets(self) -> None:
        """Hand the offsets :meth:`_done` kept to the offset store."""
        unstored, self._unstored = self._unstored, {}
        for pq, (mq, offset) in unstored.items():
            if not pq.dropped:
                self._offsets.update_offset(mq, offset, increase_only=True)

    async def _checked(
        self,
        outcome: object,
        error: BaseException | None,
        msgs: list[ReceivedMessage],
        mq: MessageQueue,
    ) -> ConsumeResult | None:
        """A plain listener's outcome as a result (awaiting what it returned if awaitable)."""
        if error is None and inspect.isawaitable(outcome):
            try:
                outcome = await outcome
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc
        if error is not None:
            self._listener_raised(len(msgs), mq, error)
            return None
        return self._as_result(outcome)

    def _listener_raised(self, count: int, mq: MessageQueue, error: BaseException) -> None:
        log.error(
            "group %s: listener raised on %d message(s) of %s; they will be retried",
            self._group,
            count,
            mq,
            exc_info=error,
        )

    def _as_result(self, outcome: object) -> ConsumeResult | None:
        """What a listener returned, as a result: anything but a ConsumeResult (or None) is
        RECONSUME_LATER, i.e. None, with a warning."""
        if outcome is None or isinstance(outcome, ConsumeResult):
            return outcome
        log.warning(
            "group %s: listener returned %r, not a ConsumeResult; treated as RECONSUME_LATER",
            self._group,
            outcome,
        )
        return None

    def submit_later(
        self, msgs: list[ReceivedMessage], pq: ProcessQueue, mq: MessageQueue, delay_s: float
    ) -> None:
        """Consume ``msgs`` again after ``delay_s`` (local retry)."""

        async def later() -> None:
            await asyncio.sleep(delay_s)
            if not pq.dropped and not self._closed:
                self.submit(msgs, pq, mq, True)

        self._spawn(later(), self._delayed)

    def _spawn(
        self, coro: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]] | None = None
    ) -> None:
        if self._closed:
            coro.close()
            return
        bucket = self._tasks if tasks is None else tasks
        task = asyncio.create_task(coro)
        bucket.add(task)
        task.add_done_callback(bucket.discard)

    # ---- one listener call ------------------------------------------------------------------

    async def _consume(
        self, msgs: list[ReceivedMessage], pq: ProcessQueue, mq: MessageQueue
    ) -> None:
        if pq.dropped:
            # Not consumed: the committed offset stays below these messages.
            return
        context = ConsumeContext(mq)
        pq.mark_consume_start(msgs)
        result = await self._call_listener(list(msgs), context, mq)
        if pq.dropped:
            self._log_dropped(mq, msgs)
            return
        if result is ConsumeResult.CONSUME_SUCCESS and context.ack_index is None:
            # The common outcome, without a coroutine for process_consume_result.
            self.consumed_ok += len(msgs)
            self._release(msgs, pq, mq)
            return
        await self.process_consume_result(result, context, msgs, pq, mq)

    async def _consume_job(self, job: _Job) -> None:
        """:meth:`_consume` of the batches of ``job``, a pulled job whose run the ProcessQueue
        knows, while it is the FIFO's head: each batch is still one listener call with a
        context as new (inside its process span when tracing is on), released by its index in
        the run.

        This is the path of nearly every listener call (issue 16), so :meth:`_take`,
        :meth:`_add_worker` and :meth:`_done` are written out in one loop over the job rather
        than a coroutine per call (hence its length). Other workers may take batches of the
        same job meanwhile (while this one awaits a listener): ``job.next`` is shared, and
        whoever takes the last batch removes the job from the FIFO.

        A coroutine listener is run by hand until it first suspends (:class:`_Resume` then
        awaits the rest as ``await`` would). A call that finishes without suspending let no
        other code run while it ran, so nothing could see its messages in flight: its start
        is not recorded and consecutive such successes are released together, as one slice,
        before anything else can run (the next suspension, a result that needs more, the end).
        A call that suspends is recorded as started when it suspends (the consume timeout
        counts from then) and released on its own, as before."""
        msgs, pq, mq, run = job.msgs, job.pq, job.mq, job.run
        assert run is not None
        size = len(msgs)
        step = self._batch_max
        listener = self._listener
        waiting = self._waiting
        success = ConsumeResult.CONSUME_SUCCESS
        traced = _tracing.enabled()
        lo = hi = 0  # batches lo .. hi-1 succeeded without suspending and wait to be released
        spare: ConsumeContext | None = None  # a used context as good as new (see below)
        try:
            while job.next < size and not self._closed:
                i = job.next
                j = job.next = i + step if i + step < size else size
                if j == size:
                    waiting.popleft()  # the job is the head: jobs leave the FIFO only from there
                self._batches_waiting -= 1
                if not self._starting and self._batches_waiting:
                    self._add_worker()
                if pq.dropped:
                    continue  # not consumed: the committed offset stays below these messages
                context = spare if spare is not None else ConsumeContext(mq)
                spare = None
                start_ms = -1  # set when the call suspends
                # Entered and left by hand: a `with` would cost every untraced call too. The
                # span stays current while the call is suspended (the task's own context).
                span = _tracing.process_span(self._group, mq, msgs[i:j]) if traced else None
                if span is not None:
                    span.__enter__()
                error: BaseException | None = None
                try:
                    outcome = listener(msgs[i:j], context)
                    rest: Awaitable[Any] | None = None  # the rest of a call that suspends
                    if outcome.__class__ is _COROUTINE:
                        try:
                            rest = _Resume(outcome, outcome.send(None))
                        except StopIteration as stop:
                            outcome = stop.value
                    elif (
                        outcome is not None
                        and outcome.__class__ is not ConsumeResult
                        and inspect.isawaitable(outcome)
                    ):
                        rest = outcome
                    if rest is not None:  # others run now: release what is done first
                        lo = hi = self._release_done(job, lo, hi)
                        start_ms = pq.start_slice(run, i, j - i)
                        outcome = await rest
                except BaseException as exc:  # the span records it, as a `with` would
                    error = exc
                    if not isinstance(exc, Exception):
                        raise  # cancelled: this worker stops
                    outcome = None
                finally:
                    if span is not None:
                        if error is None:
                            span.__exit__(None, None, None)
                        else:
                            span.__exit__(type(error), error, error.__traceback__)
                if error is not None:
                    self._listener_raised(j - i, mq, error)
                if outcome is not success or context.ack_index is not None or pq.dropped:
                    lo = hi = self._release_done(job, lo, hi)
                    outcome = self._as_result(outcome)
                    if pq.dropped:
                        self._log_dropped(mq, msgs[i:j])
                    else:
                        await self.process_consume_result(outcome, context, msgs[i:j], pq, mq)
                    continue
                if start_ms >= 0:
                    self._done(job, i, j, start_ms)
                elif hi == i:
                    hi = j  # one more batch of the slice waiting to be released
                else:
                    self._release_done(job, lo, hi)
                    lo, hi = i, j
                # The call is over; when nothing but this frame refers to its context and it
                # holds what a new one would, no one can tell it from a new one: the next call
                # gets it (a context per call cost a tenth of this loop).
                if (
                    start_ms < 0
                    and sys.getrefcount(context) == _LONE_REFCOUNT
                    and context.delay_level_when_next_consume == 0
                    and context.message_queue is mq
                ):
                    spare = context
        finally:
            self._release_done(job, lo, hi)

    def _release_done(self, job: _Job, lo: int, hi: int) -> int:
        """:meth:`_done` for batches ``lo .. hi-1`` of ``job``, which succeeded without
        suspending (now is their consume time); returns ``hi``."""
        if hi > lo:
            self._done(job, lo, hi, job.pq.now_ms())
        return hi

    def _log_dropped(self, mq: MessageQueue, msgs: list[ReceivedMessage]) -> None:
        log.warning(
            "group %s: %s was dropped while %d message(s) were consumed; their result is "
            "ignored and the new owner may consume them again",
            self._group,
            mq,
            len(msgs),
        )

    def _release(self, done: list[ReceivedMessage], pq: ProcessQueue, mq: MessageQueue) -> None:
        """Forget consumed messages and move the offset to the smallest one still in flight."""
        offset = pq.remove_messages(done)
        if offset >= 0 and not pq.dropped:
            self._offsets.update_offset(mq, offset, increase_only=True)

    async def _call_listener(
        self, msgs: list[ReceivedMessage], context: ConsumeContext, mq: MessageQueue
    ) -> ConsumeResult | None:
        try:
            if _tracing.enabled():
                with _tracing.process_span(self._group, mq, msgs):
                    outcome = await invoke_listener(self._listener, self._executor, msgs, context)
            else:  # without the context manager's generator: a tenth of the cost per call
                outcome = await invoke_listener(self._listener, self._executor, msgs, context)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._listener_raised(len(msgs), mq, exc)
            return None
        return self._as_result(outcome)

    # ---- results ----------------------------------------------------------------------------

    async def process_consume_result(
        self,
        result: ConsumeResult | None,
        context: ConsumeContext,
        msgs: list[ReceivedMessage],
        pq: ProcessQueue,
        mq: MessageQueue,
    ) -> None:
        """Handle the unacked tail of a batch, then commit the smallest offset in flight."""
        ack = ack_index_for(result, context, len(msgs))
        self.consumed_ok += ack + 1
        failed = msgs[ack + 1 :]
        self.consumed_failed += len(failed)
        done = msgs
        if failed and self._model is MessageModel.BROADCASTING:
            for msg in failed:
                log.warning(
                    "group %s: BROADCASTING consumption of %s (offset %d of %s) failed; "
                    "dropped, broadcasting has no retry",
                    self._group,
                    msg.msg_id,
                    msg.queue_offset,
                    mq,
                )
        elif failed:
            retry_here: list[ReceivedMessage] = []
            for msg in failed:
                if not await self._send_back(mq, msg, context.delay_level_when_next_consume):
                    msg.reconsume_times += 1
                    retry_here.append(msg)
            if retry_here:
                kept = {id(m) for m in retry_here}
                done = [m for m in msgs if id(m) not in kept]
                self.submit_later(retry_here, pq, mq, self._local_retry_delay_s)
        self._release(done, pq, mq)

    # ---- expiry (SPEC §6.13) ----------------------------------------------------------------

    async def clean_expired(self, table: Mapping[MessageQueue, ProcessQueue]) -> int:
        """Send back and release messages stuck in a listener call too long; returns how many."""
        now_ms = wall_clock_ms()
        released = 0
        for mq, pq in list(table.items()):
            if pq.dropped:
                continue
            for msg in pq.expired_messages(now_ms, self.consume_timeout_ms):
                log.warning(
                    "group %s: message %s (offset %d of %s) has been consumed for more than "
                    "%d ms; sending it back for retry",
                    self._group,
                    msg.msg_id,
                    msg.queue_offset,
                    mq,
                    self.consume_timeout_ms,
                )
                if await self._send_back(mq, msg, EXPIRED_SEND_BACK_DELAY_LEVEL):
                    self._release([msg], pq, mq)
                    released += 1
                else:
                    # Consume it again here; whichever call finishes first releases it, and
                    # the new call restarts its expiry clock.
                    msg.reconsume_times += 1
                    self.submit([msg], pq, mq, True)
        return released

    # ---- shutdown ---------------------------------------------------------------------------

    async def shutdown(self, await_termination_ms: int) -> None:
        """Stop taking work; wait up to ``await_termination_ms`` for calls in progress."""
        self._closed = True
        self._waiting.clear()
        self._batches_waiting = 0  # not consumed: the committed offsets stay below them
        for task in list(self._delayed):
            task.cancel()
        tasks = list(self._tasks)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=await_termination_ms / 1000)
            for task in pending:
                task.cancel()
            if pending:
                with contextlib.suppress(Exception):
                    await asyncio.wait(pending, timeout=1.0)
        self._flush_offsets()  # before the consumer persists them
        if self._executor is not None:
            # Threads still in a listener cannot be interrupted; do not wait for them.
            self._executor.shutdown(wait=False, cancel_futures=True)
