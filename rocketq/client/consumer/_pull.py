"""Pulling: one pull call (:class:`Puller`) and the push consumer's pull loops (SPEC §6.4–§6.8).

RocketMQ runs one PullMessageService thread that takes PullRequests off a queue and fires async
pulls. In asyncio the natural shape is one task per owned queue that pulls, hands the result
on and pulls again; a semaphore (``pull_inflight_max``) caps the pull calls open at once, so a
consumer that owns thousands of queues does not open thousands of held calls.

One pass of a push consumer's loop (``PullService._pull_once``), with the delay before the next:

| condition                                                   | next pull                 |
|-------------------------------------------------------------|---------------------------|
| queue dropped (rebalance, illegal offset) or consumer closed| never: the task ends      |
| consumer paused                                             | 1 s                       |
| flow control: > 1000 cached messages, > 100 MiB cached, or  | 50 ms (logged every 1000th|
| cached offsets span > 2000 (SPEC §6.6)                      | time)                     |
| no subscription for the topic                               | 3 s                       |
| orderly, clustering: the queue's broker lock is not held or | 3 s                       |
| not renewed within rebalance_lock_max_live_ms               |                           |
| orderly: start offset not readable at the first locked pull | 3 s                       |
| pull failed (every replica of the group unreachable, ...)   | 3 s                       |
| refused: the group's subscriptions disagree (SPEC §6.17)    | 3 s, ERROR logged at most |
|                                                             | every 30 s per topic      |
| FOUND                                                       | pull_interval_ms (0)      |
| FOUND but every message filtered out by tag string          | at once                   |
| NO_NEW_MSG / NO_MATCHED_MSG (after a 15 s broker hold)      | at once                   |
| OFFSET_ILLEGAL                                              | never: queue dropped, its |
|                                                             | offset corrected, and the |
|                                                             | next rebalance restarts it|

Pull request (SPEC §6.6 step 4): FLAG_SUSPEND always (long polling, 15 s hold, gRPC deadline
30 s); FLAG_COMMIT_OFFSET in clustering mode when the in-memory offset is > 0, carrying it, so
the broker stores progress with every pull (cleared when pulling from a slave while its master
is reachable: such a slave ignores it; kept while the master is down, since a slave without its
master stores commits and hands them to the master when it returns); FLAG_SUBSCRIPTION
always, so a pull made before the broker has seen this consumer's first heartbeat is still
filtered right instead of being refused.

Which broker (SPEC §6.7, §6.8): each pull goes to the broker id the previous response of the
queue suggested (``PullRequest.broker_id``, RocketMQ's pullFromWhichNodeTable entry), the
master when that id is not in the route; when that broker cannot be reached, to the group's
next replica at once (``Puller._pull_with_failover``): a consumer keeps reading from a slave
while the master is down.

Orderly consumers (SPEC §6.15) skip the span flow control (their queue is consumed strictly
in order, so the span cannot come from one stuck message), and the first pull a PullRequest
makes while holding the lock reads the start offset from the broker again: the previous owner
persisted it just before unlocking. Their pulls carry the commit offset like every clustering
pull: a pull sent just before the running call commits carries the offset before that call and
may reach the broker just after the release's persist (two RPCs a millisecond apart are not
ordered), so brokers store a pull's commit offset only when it moves forward.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.consumer._api import BrokerApi, is_unreachable
from rocketq.client.consumer._common import is_subscription_inconsistent
from rocketq.client.consumer._rebalance import PullRequest
from rocketq.client.consumer._subscription import Subscription, filter_by_tags
from rocketq.client.consumer.offset_store import OffsetStore, ReadOffsetType
from rocketq.client.consumer.process_queue import ProcessQueue, wall_clock_ms
from rocketq.client.errors import FailedPreconditionError, RocketQError
from rocketq.codec import Prop
from rocketq.message import MessageQueue, ReceivedMessage, decode_records

log = logging.getLogger(__name__)

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8
"""PullSysFlag bits (SPEC §11.6). Class filters are not supported by RocketQ brokers."""

PULL_DELAY_WHEN_EXCEPTION_S = 3.0
PULL_DELAY_WHEN_SUSPENDED_S = 1.0
PULL_DELAY_WHEN_FLOW_CONTROL_S = 0.05
PULL_DELAY_WHEN_NO_SUBSCRIPTION_S = 3.0
FLOW_CONTROL_LOG_EVERY = 1000
MIB = 1024 * 1024

FOUND = messaging_pb2.FOUND
NO_NEW_MSG = messaging_pb2.NO_NEW_MSG
NO_MATCHED_MSG = messaging_pb2.NO_MATCHED_MSG
OFFSET_ILLEGAL = messaging_pb2.OFFSET_ILLEGAL


def build_sys_flag(*, commit_offset: bool, suspend: bool, subscription: bool) -> int:
    """PullSysFlag bits for a pull request."""
    flag = 0
    if commit_offset:
        flag |= FLAG_COMMIT_OFFSET
    if suspend:
        flag |= FLAG_SUSPEND
    if subscription:
        flag |= FLAG_SUBSCRIPTION
    return flag


def flow_control_reason(
    *,
    msg_count: int,
    size_bytes: int,
    span: int,
    threshold_count: int,
    threshold_size_mib: int,
    max_span: int | None,
) -> str | None:
    """Why a queue must not be pulled now (SPEC §6.6 step 2), or None; ``max_span`` None skips
    the span check (orderly and lite-pull consumers)."""
    if msg_count > threshold_count:
        return f"cached message count {msg_count} > pull_threshold_for_queue {threshold_count}"
    if size_bytes > threshold_size_mib * MIB:
        return (
            f"cached size {size_bytes // MIB} MiB > pull_threshold_size_for_queue_mib "
            f"{threshold_size_mib}"
        )
    if max_span is not None and span > max_span:
        return f"cached offset span {span} > consume_concurrently_max_span {max_span}"
    return None


@dataclass
class PullResult:
    """A pull's outcome with the messages decoded and re-filtered by tag string (SPEC §6.8)."""

    status: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[ReceivedMessage]
    """Messages the subscription wants (tag strings checked again on the client)."""
    first_offset: int
    """Queue offset of the first message the broker returned before client filtering; -1 none."""


class Puller:
    """Makes one pull call: addressing, sys flags, decoding, tag re-filter, suggested broker."""

    def __init__(self, api: BrokerApi, group: str, inflight_max: int) -> None:
        self._api = api
        self._group = group
        self._slots = asyncio.Semaphore(inflight_max)

    async def pull(
        self,
        req: PullRequest,
        sub: Subscription,
        *,
        max_nums: int,
        commit_offset: int,
        suspend_ms: int,
        timeout_ms: int,
    ) -> PullResult:
        """Pull ``req.message_queue`` from ``req.next_offset``; updates ``req.broker_id``.

        ``commit_offset`` > 0 is stored by a master with the pull; ``suspend_ms`` > 0 lets the
        broker hold the call that long when nothing is there (then ``timeout_ms`` must exceed it).
        """
        mq = req.message_queue
        addr, commit_ignored = await self._api.pull_addr(mq, req.broker_id)
        request = messaging_pb2.PullRequest(
            consumer_group=self._group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=req.next_offset,
            max_msg_nums=max_nums,
            suspend_timeout_ms=suspend_ms,
            subscription=sub.expression,
            expression_type=sub.expression_type_pb,
            sub_version=sub.sub_version,
        )
        _set_commit(request, commit_offset, suspend_ms, commit_ignored)
        async with self._slots:
            resp = await self._pull_with_failover(req, request, addr, commit_offset, timeout_ms)
        # RocketMQ's pullFromWhichNodeTable: the queue's next pull goes where this one's
        # broker suggested (a slave while the backlog is beyond the master's memory).
        req.broker_id = int(resp.suggest_which_broker_id)
        msgs: list[ReceivedMessage] = []
        first_offset = -1
        # Read once: each read of a protobuf bytes field copies it (256 KiB per full pull).
        records = resp.records if resp.status == FOUND else b""
        if records:
            # RocketMQ stamps the queue bounds on each message (lag, ProcessQueue stats); one
            # dict for the pull, merged when a message's properties are first read.
            bounds = {Prop.MIN_OFFSET: str(resp.min_offset), Prop.MAX_OFFSET: str(resp.max_offset)}
            decoded = decode_records(records, mq.broker_name, bounds)
            if decoded:
                first_offset = decoded[0].queue_offset
            msgs = filter_by_tags(decoded, sub)
        return PullResult(
            int(resp.status),
            int(resp.next_begin_offset),
            int(resp.min_offset),
            int(resp.max_offset),
            msgs,
            first_offset,
        )

    async def _pull_with_failover(
        self,
        req: PullRequest,
        request: messaging_pb2.PullRequest,
        addr: str,
        commit_offset: int,
        timeout_ms: int,
    ) -> messaging_pb2.PullResponse:
        """Pull at ``addr``; when it cannot be reached, at the group's next replica that can.

        The first failure also refreshes the route: the broker may have moved (restarted on
        another port) or left it. ``BrokerApi.pull`` marks the failed address, which is then
        tried last for a while (BrokerHealth), so a master that died keeps its consumers on a
        slave until it answers again.
        """
        tried: set[str] = set()
        refreshed = False
        while True:
            try:
                resp = await self._api.pull(addr, request, timeout_ms)
            except RocketQError as exc:
                if not is_unreachable(exc):
                    raise
                tried.add(addr)
                if not refreshed:
                    refreshed = True
                    await self._api.refresh_route(request.topic)
                nxt, commit_ignored = await self._api.pull_addr(req.message_queue, req.broker_id)
                if nxt in tried:
                    raise
                log.info(
                    "group %s: %s unreachable for %s (%s); pulling from %s",
                    self._group,
                    addr,
                    req.message_queue,
                    exc,
                    nxt,
                )
                addr = nxt
                _set_commit(request, commit_offset, request.suspend_timeout_ms, commit_ignored)
                continue
            return resp


def _set_commit(
    request: messaging_pb2.PullRequest, commit_offset: int, suspend_ms: int, ignored: bool
) -> None:
    """Sys flags, and the commit offset unless there is none or the broker would ignore it."""
    commit = commit_offset > 0 and not ignored
    request.sys_flag = build_sys_flag(
        commit_offset=commit, suspend=suspend_ms > 0, subscription=True
    )
    request.commit_offset = commit_offset if commit else 0


Submit = Callable[[list[ReceivedMessage], ProcessQueue, MessageQueue, bool], None]
"""Hands pulled messages to the consume service (SPEC §6.11 submitConsumeRequest)."""


@dataclass(frozen=True)
class PullSettings:
    """The push-consumer settings a pull loop reads."""

    clustering: bool
    pull_batch_size: int
    pull_interval_ms: int
    pull_threshold_for_queue: int
    pull_threshold_size_for_queue_mib: int
    consume_concurrently_max_span: int | None
    broker_suspend_max_time_ms: int
    consumer_timeout_when_suspend_ms: int
    orderly: bool = False
    rebalance_lock_max_live_ms: int = 30_000
    """Orderly, clustering: pull only while the broker lock is this fresh."""


class PullService:
    """The pull loops of one push consumer: a task per owned queue."""

    def __init__(
        self,
        *,
        group: str,
        puller: Puller,
        settings: PullSettings,
        offset_store: OffsetStore,
        subscription_of: Callable[[str], Subscription | None],
        submit: Submit,
        remove_queue: Callable[[MessageQueue], Awaitable[None]],
        on_offset_illegal: Callable[[], None],
        heartbeat: Callable[[], Awaitable[object]],
        is_paused: Callable[[], bool] = lambda: False,
        compute_offset: Callable[[MessageQueue], Awaitable[int]] | None = None,
        on_refused: Callable[[str, Exception], None] | None = None,
    ) -> None:
        self._group = group
        self._puller = puller
        self._s = settings
        self._offsets = offset_store
        self._subscription_of = subscription_of
        self._submit = submit
        self._remove_queue = remove_queue
        self._on_offset_illegal = on_offset_illegal
        self._heartbeat = heartbeat
        self._is_paused = is_paused
        self._compute_offset = compute_offset
        """Orderly: re-reads a queue's start offset at its first locked pull."""
        self._on_refused = on_refused
        """Logs a pull refused for a subscription conflict (throttled by the consumer)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.flow_control_times = 0

    def execute(self, requests: list[PullRequest]) -> None:
        """Start pulling each request's queue (RocketMQ's executePullRequestImmediately)."""
        for req in requests:
            if self._closed:
                return
            task = asyncio.create_task(self._loop(req), name=f"pull-{req.message_queue}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop every loop, cancelling held pulls."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, req: PullRequest) -> None:
        delay_s: float | None = 0.0
        while delay_s is not None:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if self._closed or req.process_queue.dropped:
                return
            try:
                delay_s = await self._pull_once(req)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not end pulling of the queue for good
                log.exception("group %s: pull of %s failed", self._group, req.message_queue)
                delay_s = PULL_DELAY_WHEN_EXCEPTION_S

    async def _pull_once(self, req: PullRequest) -> float | None:
        """One pull of ``req``; returns the delay before the next one, None to stop."""
        mq, pq = req.message_queue, req.process_queue
        pq.last_pull_timestamp_ms = wall_clock_ms()
        if self._is_paused():
            return PULL_DELAY_WHEN_SUSPENDED_S
        if self._flow_controlled(mq, pq):
            return PULL_DELAY_WHEN_FLOW_CONTROL_S
        s = self._s
        sub = self._subscription_of(mq.topic)
        if sub is None:
            log.warning("group %s: no subscription for %s; pulling later", self._group, mq)
            return PULL_DELAY_WHEN_NO_SUBSCRIPTION_S
        if s.orderly and s.clustering and not await self._orderly_ready(req):
            return PULL_DELAY_WHEN_EXCEPTION_S
        commit_offset = 0
        if s.clustering:
            commit_offset = await self._offsets.read_offset(mq, ReadOffsetType.READ_FROM_MEMORY)
        try:
            result = await self._puller.pull(
                req,
                sub,
                max_nums=s.pull_batch_size,
                commit_offset=commit_offset,
                suspend_ms=s.broker_suspend_max_time_ms,
                timeout_ms=s.consumer_timeout_when_suspend_ms,
            )
        except RocketQError as exc:
            return await self._pull_failed(mq, exc)
        if pq.dropped:
            return None
        return await self._on_result(req, result)

    def _flow_controlled(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Whether ``pq`` holds too much to pull more now (logged every so often)."""
        s = self._s
        reason = flow_control_reason(
            msg_count=pq.msg_count,
            size_bytes=pq.msg_size_bytes,
            span=pq.max_span(),
            threshold_count=s.pull_threshold_for_queue,
            threshold_size_mib=s.pull_threshold_size_for_queue_mib,
            max_span=s.consume_concurrently_max_span,
        )
        if reason is None:
            return False
        if self.flow_control_times % FLOW_CONTROL_LOG_EVERY == 0:
            log.warning(
                "group %s: flow control on %s: %s (offsets %d..%d, flow control times %d)",
                self._group,
                mq,
                reason,
                pq.first_offset(),
                pq.last_offset(),
                self.flow_control_times,
            )
        self.flow_control_times += 1
        return True

    async def _pull_failed(self, mq: MessageQueue, exc: RocketQError) -> float:
        """What a refused or failed pull does before the next one; the delay."""
        if isinstance(exc, FailedPreconditionError):
            if is_subscription_inconsistent(exc):
                # Members disagree: a heartbeat cannot help, and each one would make the broker
                # recompute the group. Wait; the conflict notice says when it is resolved.
                if self._on_refused is not None:
                    self._on_refused(mq.topic, exc)
                return PULL_DELAY_WHEN_EXCEPTION_S
            # The broker has not seen (or has an older) subscription of ours: heartbeat first.
            log.info("group %s: pull of %s refused (%s); heartbeating", self._group, mq, exc)
            await self._heartbeat_quietly()
            return PULL_DELAY_WHEN_EXCEPTION_S
        if not self._closed:
            log.warning("group %s: pull of %s failed: %s", self._group, mq, exc)
        return PULL_DELAY_WHEN_EXCEPTION_S

    async def _orderly_ready(self, req: PullRequest) -> bool:
        """Orderly, clustering: True if ``req`` may be pulled now (lock held and fresh, start
        offset re-read at the first locked pull)."""
        mq, pq = req.message_queue, req.process_queue
        if not pq.holds_lock(wall_clock_ms(), self._s.rebalance_lock_max_live_ms):
            log.info(
                "group %s: not pulling %s: its broker lock is not held (locked=%s, last lock "
                "%d ms ago); trying again in 3 s",
                self._group,
                mq,
                pq.locked,
                wall_clock_ms() - pq.last_lock_timestamp_ms,
            )
            return False
        if req.locked_first or self._compute_offset is None:
            return True
        offset = await self._compute_offset(mq)
        if offset < 0:
            log.warning("group %s: start offset of %s unreadable; pulling later", self._group, mq)
            return False
        if offset != req.next_offset:
            log.info(
                "group %s: first locked pull of %s starts at the broker's offset %d, not %d",
                self._group,
                mq,
                offset,
                req.next_offset,
            )
        req.next_offset = offset
        req.locked_first = True
        return True

    async def _heartbeat_quietly(self) -> None:
        try:
            await self._heartbeat()
        except Exception as exc:  # the next periodic heartbeat retries
            log.warning("group %s: heartbeat failed: %s", self._group, exc)

    async def _on_result(self, req: PullRequest, result: PullResult) -> float | None:
        mq, pq = req.message_queue, req.process_queue
        previous = req.next_offset
        if result.status == FOUND:
            req.next_offset = result.next_begin_offset
            if result.next_begin_offset < previous or 0 <= result.first_offset < previous:
                log.warning(
                    "[BUG] group %s: %s pulled from %d, got first offset %d, next %d",
                    self._group,
                    mq,
                    previous,
                    result.first_offset,
                    result.next_begin_offset,
                )
            if not result.messages:
                if pq.msg_count == 0:
                    # Every message was dropped by the tag-string check (a hash collision): with
                    # nothing in flight they are done, so move the offset now rather than after
                    # the next pull's 15 s hold (RocketMQ waits; the lag view would lie meanwhile).
                    self._offsets.update_offset(mq, req.next_offset, increase_only=True)
                return 0.0
            dispatch = pq.put_messages(result.messages)
            self._submit(result.messages, pq, mq, dispatch)
            return self._s.pull_interval_ms / 1000
        if result.status in (NO_NEW_MSG, NO_MATCHED_MSG):
            req.next_offset = result.next_begin_offset
            if pq.msg_count == 0:
                # correctTagsOffset: nothing in flight, so skipped (filtered) offsets are done.
                self._offsets.update_offset(mq, req.next_offset, increase_only=True)
            return 0.0
        if result.status == OFFSET_ILLEGAL:
            log.warning(
                "group %s: offset %d of %s is illegal (queue holds %d..%d); moving to %d",
                self._group,
                previous,
                mq,
                result.min_offset,
                result.max_offset,
                result.next_begin_offset,
            )
            req.next_offset = result.next_begin_offset
            pq.dropped = True
            self._offsets.update_offset(mq, result.next_begin_offset, increase_only=False)
            await self._offsets.persist(mq)
            await self._remove_queue(mq)
            self._on_offset_illegal()
            return None
        log.error("group %s: pull of %s: unknown status %d", self._group, mq, result.status)
        return PULL_DELAY_WHEN_EXCEPTION_S
