"""Master-side replication bookkeeping: connected slaves, their acks, the in-sync set, the
confirm offset, SYNC_MASTER waiters and lag statistics (DESIGN.md §6, SPEC §4.14).

Everything here runs on the event loop with an injected :class:`Clock` and does no I/O; the
gRPC stream that feeds it lives in ``ha_master``. Durations use the clock's monotonic reading
(it stays real under a scaled test clock); only ``last_ack_timestamp_ms`` is wall-clock.

**The in-sync set.** A connected slave is *in sync* while

| condition                                          | why                                  |
|----------------------------------------------------|--------------------------------------|
| it acked within ``haHousekeepingInterval``         | a silent slave may be cut off        |
| master max - its ack <= ``haSlaveFallbehindMax``   | one far behind cannot promise much   |
| to *join*: its ack >= what consumers may see now   | the confirm offset never moves back  |

The join rule is what keeps the confirm offset monotonic: with no in-sync slave the store is
unbounded (consumers may have read up to the master's max offset), so a slave joins only once
it has acked everything the master had at that moment; with a bound, once it has acked the
bound. Leaving only removes an ack from the minimum, so the bound never decreases.

A member also leaves after ``haMaxTimeSlaveNotCatchup`` ms without having caught up: each
ack that reaches the master's max offset as of the slave's previous ack counts as caught up
(a slave keeping pace under steady load qualifies on every ack; one that never closes the gap
drops out even while within ``haSlaveFallbehindMax``).

**The published ISR (controller mode).** With ``publish_isr`` set (``enable_isr_publishing``)
the in-sync set is also recorded in etcd, and only its members may be elected; the ordering
keeps every published member holding every SEND_OK message (Kafka's ISR rule):

| change  | order                                                                       |
|---------|-----------------------------------------------------------------------------|
| shrink  | publish the smaller set first; until that succeeds the member is *retained*: |
|         | its last ack still bounds the confirm offset, so sends wait (or time out)   |
| expand  | join locally first (sends wait for it from now on), then publish            |

After a promotion the previous ISR's members (but the old leader) are retained for a short
grace (``PROMOTION_GRACE_S``): a live one reconnects and rejoins instead of being dropped.
The publishing itself is a task in ``ha_master``; this module only says what to publish
(:meth:`ReplicaTracker.wanted_isr`) and applies the outcome (:meth:`isr_published`).

**Confirm offset** = min(master max, acks of the in-sync slaves and retained members); with
no in-sync slave (nor retained member) it is the master's max and the store gets no bound at
all (``apply_bound(None)``), so a master whose slaves are all gone or catching up behaves
exactly like a single broker.

**SYNC_MASTER waiters** (:class:`HaWaiter`): a heap by end offset, resolved from the ack
and confirm handlers (never polled), plus a deadline queue expired by a loop timer per waiter.
Every waiter has the same timeout, so arrival order is deadline order and the deadline queue
is a plain deque. A send is answered SEND_OK once an in-sync slave has acked its bytes *and*
has been sent a ConfirmOffset covering them: a slave serves reads only below the confirm
offset it was told, so without the second condition a master killed right after SEND_OK
would leave the message stored on the slave but unreadable there. (With several in-sync
slaves the confirm offset is their minimum, so SEND_OK then waits for all of them.)

**Lag in seconds** is the age of the oldest byte a slave has not acked. :class:`AppendSamples`
keeps a bounded ring of (end offset, time) per ~10 ms of appends; a byte older than the ring
falls back to the store timestamp of the record at that offset (``record_time_ms``).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from services.broker.config import BrokerConfig
from services.common.clock import Clock
from services.common.errors import ServiceError
from services.store.types import PhysicalOffset

log = logging.getLogger(__name__)

SendStatus: TypeAlias = "messaging_pb2.SendStatus.ValueType"

APPEND_SAMPLES_MAX = 4096
"""(end offset, time) samples kept for lag_seconds: at one per 10 ms, about 41 s of appends."""
APPEND_SAMPLE_SPACING_S = 0.010
"""Appends closer together than this share one sample (lag_seconds is at most this low)."""
HA_WAITERS_MAX = 100_000
"""SYNC_MASTER sends waiting at once; beyond it a send is answered FLUSH_SLAVE_TIMEOUT at once
(stored, but not promised replicated) instead of growing the heap without bound."""
PROMOTION_GRACE_S = 5.0
"""After a promotion, how long the previous ISR's members stay published without having
reconnected (bounded by ``haMaxTimeSlaveNotCatchup``)."""

_START = PhysicalOffset(0)
_NOTHING_REPLICATED = PhysicalOffset(-1)
"""replicated_offset() without an in-sync slave: below every end offset a write waits for."""
PublishIsr: TypeAlias = "Callable[[set[int]], Awaitable[bool]]"
"""Record the in-sync replica ids (the master's own included) in etcd; False when refused."""


def leadership_lost_error() -> ServiceError:
    """UNAVAILABLE NOT_MASTER for a write whose wait outlived this broker's leadership."""
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        common_pb2.NOT_MASTER,
        "leadership lost before the write was confirmed; it may or may not be stored, resend",
    )


async def sync_master_wait(
    waiter: HaWaiter | None, config: BrokerConfig, end_offset: int
) -> SendStatus | None:
    """The wait every acknowledged write makes on a SYNC_MASTER (Send, EndTransaction,
    ConsumerSendBack): until an in-sync slave holds the bytes before ``end_offset``, and the
    :meth:`HaWaiter.wait_replicated` status. None when there is nothing to wait for (no
    waiter, i.e. not a replicating master; or not SYNC_MASTER). The caller re-checks
    ``config.is_master`` afterwards: leadership can be lost during the wait."""
    if waiter is None or config.broker_role != "SYNC_MASTER":
        return None
    return await waiter.wait_replicated(PhysicalOffset(end_offset))


@dataclass(slots=True)
class Retained:
    """A published ISR member no longer in the local in-sync set, until a smaller set is
    published without it."""

    acked_offset: PhysicalOffset
    """Its last ack (what it is known to hold): bounds the confirm offset meanwhile."""
    shrink_after_s: float
    """Monotonic time from which it is left out of the wanted set (now, or a grace)."""


class AppendSamples:
    """When commitlog bytes were appended, coarsely: a bounded ring of (end offset, time).

    A sample (end, t) says every byte below ``end`` was written by time ``t``. Appends within
    :data:`APPEND_SAMPLE_SPACING_S` of a sample's first append move that sample's end and time
    forward, so the ring holds one entry per ~10 ms however fast the master writes.
    """

    def __init__(
        self,
        start_offset: PhysicalOffset,
        *,
        samples_max: int = APPEND_SAMPLES_MAX,
        spacing_s: float = APPEND_SAMPLE_SPACING_S,
    ) -> None:
        self.samples_max = samples_max
        self.spacing_s = spacing_s
        self.covered_from = start_offset
        """Bytes below this were written before the oldest sample (age unknown here)."""
        self._ends: list[PhysicalOffset] = []
        self._times_s: list[float] = []
        self._bucket_start_s = float("-inf")

    def record(self, end_offset: PhysicalOffset, now_s: float) -> None:
        """Bytes up to ``end_offset`` have been appended by ``now_s``."""
        ends = self._ends
        if ends and end_offset <= ends[-1]:
            return
        if ends and now_s - self._bucket_start_s < self.spacing_s:
            ends[-1] = end_offset
            self._times_s[-1] = now_s
            return
        self._bucket_start_s = now_s
        ends.append(end_offset)
        self._times_s.append(now_s)
        if len(ends) > 2 * self.samples_max:  # trim in bulk: amortised O(1) per sample
            drop = len(ends) - self.samples_max
            self.covered_from = ends[drop - 1]
            del ends[:drop]
            del self._times_s[:drop]

    def written_at(self, offset: PhysicalOffset) -> float | None:
        """Latest time by which the byte at ``offset`` was written (a lower bound on its age);
        None when it is older than the ring or beyond the last sample."""
        if offset < self.covered_from:
            return None
        i = bisect.bisect_right(self._ends, offset)
        if i == len(self._ends):
            return None
        return self._times_s[i]

    def __len__(self) -> int:
        return len(self._ends)


@dataclass(eq=False, slots=True)
class SlaveLink:
    """One slave's replication stream as the master sees it."""

    broker_id: int
    broker_addr: str
    start_offset: PhysicalOffset
    """Where its commitlog ended after the TruncateTo; chunks start here."""
    connected_s: float
    sent_offset: PhysicalOffset = _START
    """Commitlog offset one past the last byte sent on this stream."""
    acked_offset: PhysicalOffset = _START
    """Its last ack (``start_offset`` until the first one)."""
    flushed_offset: PhysicalOffset = _START
    has_acked: bool = False
    last_ack_ms: int = 0
    last_ack_s: float = 0.0
    last_heard_s: float = 0.0
    """Last hello or ack, for dropping silent slaves."""
    in_sync: bool = False
    confirm_sent: PhysicalOffset = _NOTHING_REPLICATED
    """The last ConfirmOffset handed to this stream."""
    caught_up_s: float = 0.0
    """Last time an ack reached ``catchup_target`` (the haMaxTimeSlaveNotCatchup rule)."""
    catchup_target: PhysicalOffset = _START
    """The master's max offset as of the previous ack."""
    closed: bool = False
    close_reason: str = ""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on appends, acks, confirm changes and close: the sender loop has something to do."""
    chunk_confirm: bool = False
    """Its hello set accepts_chunk_confirm: a confirm may travel inside a chunk."""
    chunk_ends: deque[PhysicalOffset] = field(default_factory=deque)
    """End offsets of the chunks sent and not yet acked, oldest first."""
    on_close: list[Callable[[], None]] = field(default_factory=list)
    """Called once when the link closes: a data socket's sender may be blocked writing to a
    slave that stopped reading, where no wake reaches it; closing the socket does."""

    def __post_init__(self) -> None:
        self.sent_offset = self.start_offset
        self.acked_offset = self.start_offset
        self.last_heard_s = self.connected_s
        self.caught_up_s = self.connected_s

    def in_flight_bytes(self) -> int:
        return self.sent_offset - self.acked_offset

    def chunk_bytes(self, batch_bytes: int, in_flight_max_bytes: int) -> int:
        """How many bytes the next chunk may carry: at most a batch, and never more than
        ``in_flight_max_bytes`` beyond the last ack (0 = wait for an ack)."""
        return max(0, min(batch_bytes, in_flight_max_bytes - self.in_flight_bytes()))


TIMER_SLACK_S = 0.001
"""Shortest re-arm of the waiters' timer (a deadline already due fires on the next tick)."""


class HaWaiter:
    """The send path's hook under SYNC_MASTER: waits for an in-sync slave's ack."""

    def __init__(
        self,
        tracker: ReplicaTracker,
        clock: Clock,
        timeout_ms: Callable[[], int],
        *,
        waiters_max: int = HA_WAITERS_MAX,
    ) -> None:
        self._tracker = tracker
        self._clock = clock
        self._timeout_ms = timeout_ms
        self.waiters_max = waiters_max
        self._seq = itertools.count()
        # (end offset, seq, future) and (deadline, future); a future resolved through one is
        # dropped lazily from the other.
        self._by_offset: list[tuple[int, int, asyncio.Future[SendStatus]]] = []
        self._by_deadline: deque[tuple[float, asyncio.Future[SendStatus]]] = deque()
        self.pending = 0
        """Waiters not yet resolved."""
        self._timer: asyncio.TimerHandle | None = None
        """One timer for all waiters, due at the oldest deadline (a timer per waiter cost
        a scheduled handle and its cancel on every SYNC_MASTER send)."""

    async def wait_replicated(self, end_offset: PhysicalOffset) -> SendStatus:
        """SEND_OK once an in-sync slave acked ``end_offset``; SLAVE_NOT_AVAILABLE at once
        without an in-sync slave; FLUSH_SLAVE_TIMEOUT after ``syncFlushTimeout``."""
        tracker = self._tracker
        if not tracker.has_in_sync():
            return messaging_pb2.SLAVE_NOT_AVAILABLE
        if tracker.replicated_offset() >= end_offset:
            return messaging_pb2.SEND_OK
        if self.pending >= self.waiters_max:
            return messaging_pb2.FLUSH_SLAVE_TIMEOUT
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SendStatus] = loop.create_future()
        timeout_s = max(self._timeout_ms(), 1) / 1000
        heapq.heappush(self._by_offset, (end_offset, next(self._seq), future))
        self._by_deadline.append((self._clock.monotonic_s() + timeout_s, future))
        self.pending += 1
        if self._timer is None:
            self._timer = loop.call_later(timeout_s, self._on_timer)
        try:
            return await future
        finally:
            self.pending -= 1
            self._compact()

    def _on_timer(self) -> None:
        """Expire what is due, then re-arm at the next live deadline (deadlines are queued in
        the order they were set)."""
        self._timer = None
        self.expire_due()
        queue = self._by_deadline
        while queue and queue[0][1].done():
            queue.popleft()
        if queue:
            delay_s = max(queue[0][0] - self._clock.monotonic_s(), TIMER_SLACK_S)
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def resolve(self, replicated_offset: PhysicalOffset) -> int:
        """Answer SEND_OK to every waiter at or below ``replicated_offset``; how many."""
        heap = self._by_offset
        done = 0
        while heap and heap[0][0] <= replicated_offset:
            _, _, future = heapq.heappop(heap)
            if not future.done():
                future.set_result(messaging_pb2.SEND_OK)
                done += 1
        return done

    def expire_due(self) -> int:
        """Answer FLUSH_SLAVE_TIMEOUT to every waiter past its deadline; how many."""
        now_s = self._clock.monotonic_s()
        queue = self._by_deadline
        done = 0
        while queue and queue[0][0] <= now_s:
            _, future = queue.popleft()
            if not future.done():
                future.set_result(messaging_pb2.FLUSH_SLAVE_TIMEOUT)
                done += 1
        return done

    def fail_all(self, error: Exception) -> int:
        """Fail every pending waiter with ``error`` (demotion: NOT_MASTER); how many."""
        done = 0
        for _, _, future in self._by_offset:
            if not future.done():
                future.set_exception(error)
                done += 1
        self._by_offset.clear()
        self._by_deadline.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return done

    def _compact(self) -> None:
        """Drop resolved entries once they outnumber the live ones (each structure keeps the
        entries the other resolved until they reach its head)."""
        slack = 2 * self.pending + 1024
        if len(self._by_offset) > slack:
            self._by_offset = [e for e in self._by_offset if not e[2].done()]
            heapq.heapify(self._by_offset)
        if len(self._by_deadline) > slack:
            self._by_deadline = deque(e for e in self._by_deadline if not e[1].done())


class ReplicaTracker:
    """Slaves connected to this master, the in-sync set and the confirm offset."""

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        *,
        max_offset: Callable[[], PhysicalOffset],
        apply_bound: Callable[[PhysicalOffset | None], None],
        record_time_ms: Callable[[PhysicalOffset], int | None] | None = None,
    ) -> None:
        """``max_offset``: the master's commitlog max offset. ``apply_bound``: set (or, with
        None, lift) the store's confirm offset. ``record_time_ms``: store timestamp of the record
        at a physical offset (lag of bytes older than the sample ring)."""
        self.config = config
        self.clock = clock
        self._max_offset = max_offset
        self._apply_bound = apply_bound
        self._record_time_ms = record_time_ms
        self.links: dict[int, SlaveLink] = {}
        """Live streams by slave broker id (a reconnect replaces its older stream)."""
        self.samples = AppendSamples(max_offset())
        self.bound: PhysicalOffset | None = None
        """The confirm offset applied to the store; None = unbounded (no in-sync slave)."""
        self.waiter = HaWaiter(self, clock, lambda: self.config.sync_flush_timeout_ms)
        self.publish_isr: PublishIsr | None = None
        """Controller mode, while leading: records the ISR in etcd (None = static roles)."""
        self.published: set[int] | None = None
        """Slave replica ids in the last ISR published (None while not publishing)."""
        self.retained: dict[int, Retained] = {}
        """Published members not in the local in-sync set (see the module doc)."""
        self.isr_wake = asyncio.Event()
        """Set when the wanted ISR may differ from the published one (the publisher waits)."""

    # -- the published ISR (controller mode) -----------------------------------------------
    def enable_isr_publishing(
        self,
        publish: PublishIsr,
        previous: set[int],
        floor_offset: PhysicalOffset,
        old_leader: int = -1,
    ) -> None:
        """This broker was just promoted: start from an empty local set with ``previous`` (the
        ISR in etcd) published; its members but ``old_leader`` are retained for a grace at
        ``floor_offset`` (what they are known to hold: everything acknowledged so far)."""
        own = self.config.replica_id
        self.publish_isr = publish
        self.published = set(previous) - {own}
        grace_s = min(PROMOTION_GRACE_S, self.config.ha_max_time_slave_not_catchup_ms / 1000)
        now_s = self.clock.monotonic_s()
        self.retained = {
            rid: Retained(floor_offset, now_s + (0.0 if rid == old_leader else grace_s))
            for rid in self.published
        }
        self.bound = None
        self._apply_bound(None)  # the slave-era bound goes; _refresh sets the retained floor
        self._refresh()
        self.isr_wake.set()

    def disable_isr_publishing(self) -> None:
        """Demoted: nothing is published from here any more."""
        self.publish_isr = None
        self.published = None
        self.retained.clear()

    def wanted_isr(self) -> set[int]:
        """The ISR to publish now: this replica, the local in-sync set, and retained members
        whose grace has not run out."""
        now_s = self.clock.monotonic_s()
        wanted = {self.config.replica_id}
        wanted.update(rid for rid, lk in self.links.items() if lk.in_sync)
        wanted.update(rid for rid, r in self.retained.items() if r.shrink_after_s > now_s)
        return wanted

    def isr_published(self, replica_ids: set[int]) -> None:
        """``replica_ids`` is now the ISR in etcd: retained members left out of it stop
        bounding the confirm offset; members in it but no longer in sync become retained."""
        published = set(replica_ids) - {self.config.replica_id}
        self.published = published
        now_s = self.clock.monotonic_s()
        for rid in list(self.retained):
            if rid not in published:
                del self.retained[rid]
        for rid in published:
            link = self.links.get(rid)
            if (link is None or not link.in_sync) and rid not in self.retained:
                floor = link.acked_offset if link is not None else self.confirm_offset()
                self.retained[rid] = Retained(floor, now_s)
        log.info("in-sync replica set published: %s", sorted(replica_ids))
        self._refresh()
        if self.wanted_isr() != published | {self.config.replica_id}:
            self.isr_wake.set()

    def _left(self, link: SlaveLink) -> None:
        """``link`` left the local in-sync set: a published member is retained until the
        smaller set is published."""
        if self.published is not None and link.broker_id in self.published:
            self.retained[link.broker_id] = Retained(link.acked_offset, self.clock.monotonic_s())
            self.isr_wake.set()

    def _joined(self, link: SlaveLink) -> None:
        if self.published is not None:
            self.retained.pop(link.broker_id, None)
            self.isr_wake.set()

    def reset(self) -> None:
        """Forget every stream and bound (demotion): the next promotion starts afresh."""
        self.close_all("this broker is no longer the master")
        self.disable_isr_publishing()
        self.bound = None
        self.samples = AppendSamples(self._max_offset())

    # -- connections -----------------------------------------------------------------------
    def connect(self, broker_id: int, broker_addr: str, start_offset: PhysicalOffset) -> SlaveLink:
        """A slave's stream passed its hello; it will be sent bytes from ``start_offset``."""
        old = self.links.get(broker_id)
        if old is not None:
            self.close(old, f"slave {broker_id} opened a newer stream")
        link = SlaveLink(broker_id, broker_addr, start_offset, self.clock.monotonic_s())
        self.links[broker_id] = link
        log.info(
            "slave %d (%s) connected; streaming from offset %d",
            broker_id,
            broker_addr,
            start_offset,
        )
        return link

    def close(self, link: SlaveLink, reason: str) -> None:
        """End ``link`` (its sender loop sees ``closed`` and ends the stream with ``reason``)."""
        if not link.closed:
            link.closed = True
            link.close_reason = reason
            link.wake.set()
            for callback in link.on_close:
                callback()
        if self.links.get(link.broker_id) is link:
            del self.links[link.broker_id]
            log.info("slave %d (%s) disconnected: %s", link.broker_id, link.broker_addr, reason)
        if link.in_sync:
            link.in_sync = False
            self._left(link)
            self._refresh()

    def close_all(self, reason: str) -> None:
        for link in list(self.links.values()):
            self.close(link, reason)

    # -- events ----------------------------------------------------------------------------
    def on_ack(
        self, link: SlaveLink, max_offset: PhysicalOffset, flushed_offset: PhysicalOffset
    ) -> None:
        """A SlaveAck. Raises ValueError when it breaks the protocol (decreasing, or beyond
        what was sent)."""
        if max_offset < link.acked_offset:
            raise ValueError(
                f"ack {max_offset} is below the previous ack {link.acked_offset} on this stream"
            )
        if max_offset > link.sent_offset:
            raise ValueError(
                f"ack {max_offset} is beyond the {link.sent_offset} bytes sent on this stream"
            )
        now_s = self.clock.monotonic_s()
        link.acked_offset = max_offset
        ends = link.chunk_ends
        while ends and ends[0] <= max_offset:
            ends.popleft()
        link.flushed_offset = max(link.flushed_offset, min(flushed_offset, max_offset))
        link.has_acked = True
        link.last_ack_s = link.last_heard_s = now_s
        link.last_ack_ms = self.clock.now_ms()
        link.wake.set()  # the in-flight window may have opened
        master_max = self._max_offset()
        if max_offset >= link.catchup_target:
            link.caught_up_s = now_s
            link.catchup_target = master_max
        was = link.in_sync
        link.in_sync = self._qualifies(link, now_s, master_max)
        if was != link.in_sync:
            self._log_membership(link)
            (self._joined if link.in_sync else self._left)(link)
        if link.in_sync or was:
            self._refresh()

    def on_confirm_sent(self, link: SlaveLink, confirm_offset: PhysicalOffset) -> None:
        """The sender handed ``confirm_offset`` to ``link``'s stream: sends it covers may
        now be answered."""
        link.confirm_sent = max(link.confirm_sent, confirm_offset)
        if link.in_sync:
            self.waiter.resolve(self.replicated_offset())

    def on_append(self) -> None:
        """New commitlog bytes (a store arrival listener): note when, wake every sender that
        would ship them now.

        A sender that may not (its window is full, or haSmallChunksInFlightMax holds the small
        tail until an ack) is left asleep: its ack wakes it. Under the replication benchmark's
        batch load that was every second append, each a sender loop turn that sent nothing."""
        master_max = self._max_offset()
        self.samples.record(master_max, self.clock.monotonic_s())
        cfg = self.config
        held_max = cfg.ha_small_chunks_in_flight_max
        for link in self.links.values():
            want = link.chunk_bytes(cfg.ha_transfer_batch_size, cfg.ha_max_in_flight_bytes)
            if want == 0 or (
                held_max > 0
                and len(link.chunk_ends) >= held_max
                and master_max - link.sent_offset < want
            ):
                continue
            link.wake.set()

    def housekeep(self) -> None:
        """Time-driven changes: close streams silent for ``haHousekeepingInterval`` and
        re-check membership (a slave falls out by going quiet or falling behind)."""
        now_s = self.clock.monotonic_s()
        silent_s = self.config.ha_housekeeping_interval_ms / 1000
        master_max = self._max_offset()
        changed = False
        for link in list(self.links.values()):
            if now_s - link.last_heard_s > silent_s:
                self.close(
                    link, f"no ack for more than {self.config.ha_housekeeping_interval_ms} ms"
                )
                continue
            if link.in_sync and not self._qualifies(link, now_s, master_max):
                link.in_sync = False
                self._log_membership(link)
                self._left(link)
                changed = True
        if any(r.shrink_after_s <= now_s for r in self.retained.values()):
            self.isr_wake.set()  # a grace ran out (the publisher retries failed shrinks too)
        if changed:
            self._refresh()

    # -- queries ---------------------------------------------------------------------------
    def has_in_sync(self) -> bool:
        return any(link.in_sync for link in self.links.values())

    def replicated_offset(self) -> PhysicalOffset:
        """What SYNC_MASTER may promise: the highest offset an in-sync slave has both acked and
        been told is confirmed; -1 without an in-sync slave."""
        return max(
            (min(lk.acked_offset, lk.confirm_sent) for lk in self.links.values() if lk.in_sync),
            default=_NOTHING_REPLICATED,
        )

    def confirm_offset(self) -> PhysicalOffset:
        """What the in-sync set has acknowledged; the master's max without an in-sync slave."""
        return self.bound if self.bound is not None else self._max_offset()

    def slave_stats(self) -> list[admin_pb2.SlaveStats]:
        """Each connected slave for GetRuntimeStats, by broker id."""
        master_max = self._max_offset()
        now_s = self.clock.monotonic_s()
        return [
            admin_pb2.SlaveStats(
                broker_id=link.broker_id,
                broker_addr=link.broker_addr,
                acked_offset=link.acked_offset,
                in_sync=link.in_sync,
                last_ack_timestamp_ms=link.last_ack_ms,
                lag_bytes=max(0, master_max - link.acked_offset),
                lag_seconds=self.lag_seconds(link.acked_offset, master_max, now_s),
            )
            for link in sorted(self.links.values(), key=lambda lk: lk.broker_id)
        ]

    def lag_seconds(
        self, acked_offset: PhysicalOffset, master_max: PhysicalOffset, now_s: float
    ) -> float:
        """Age of the oldest byte not acked (0 when the slave has everything)."""
        if acked_offset >= master_max:
            return 0.0
        written_s = self.samples.written_at(acked_offset)
        if written_s is not None:
            return max(0.0, now_s - written_s)
        stored_ms = self._record_time_ms(acked_offset) if self._record_time_ms else None
        if stored_ms is not None:
            return max(0.0, (self.clock.now_ms() - stored_ms) / 1000)
        return 0.0

    # -- internals -------------------------------------------------------------------------
    def _qualifies(self, link: SlaveLink, now_s: float, master_max: PhysicalOffset) -> bool:
        cfg = self.config
        if not link.has_acked or now_s - link.last_ack_s > cfg.ha_housekeeping_interval_ms / 1000:
            return False
        if master_max - link.acked_offset > cfg.ha_slave_fallbehind_max:
            return False
        if link.in_sync:
            return now_s - link.caught_up_s <= cfg.ha_max_time_slave_not_catchup_ms / 1000
        visible = self.bound if self.bound is not None else master_max
        return link.acked_offset >= visible

    def _refresh(self) -> None:
        """Recompute the bound from the in-sync acks; apply it and wake what depends on it."""
        acks = [lk.acked_offset for lk in self.links.values() if lk.in_sync]
        for rid, kept in self.retained.items():
            link = self.links.get(rid)
            acks.append(max(kept.acked_offset, link.acked_offset) if link else kept.acked_offset)
        if acks:
            bound = min(*acks, self._max_offset())
            if self.bound is not None:
                bound = max(bound, self.bound)  # never backwards (see the join rule)
        else:
            bound = None
        if bound != self.bound:
            self.bound = bound
            self._apply_bound(bound)
            for link in self.links.values():
                link.wake.set()  # each sender passes the new confirm offset on
        if acks:
            self.waiter.resolve(self.replicated_offset())

    def _log_membership(self, link: SlaveLink) -> None:
        log.info(
            "slave %d (%s) %s the in-sync set at ack %d (master max %d)",
            link.broker_id,
            link.broker_addr,
            "joined" if link.in_sync else "left",
            link.acked_offset,
            self._max_offset(),
        )
