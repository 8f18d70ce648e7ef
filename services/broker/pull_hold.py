"""Long polling: pulls that found nothing wait here until a message arrives (SPEC §6.9).

A pull with FLAG_SUSPEND that finds no new message is *held*: :meth:`PullHoldService.hold`
parks it under its ``(topic, queue_id)`` with the offset it wants, its tag filter, a deadline
and a future. Three things resolve the future:

1. **Arrival** (the instant path). The service is a listener of the store's dispatcher, which
   runs in the same loop step as the append (DESIGN.md §4). For each dispatched record of a
   queue that has held pulls, a pull whose offset the record reaches and whose filters accept
   the record is woken (``True``). A record that does not match leaves the pull waiting, so a
   consumer of tag A is not woken by a stream of tag B, nor an SQL92 consumer of ``a > 5`` by
   messages with ``a = 1``:

   | held pull's filter | checked against                                                    |
   |--------------------|--------------------------------------------------------------------|
   | tags_filter        | the record's tags code (from the dispatch request, no I/O)         |
   | record_filter      | the record's bytes, read once per arrival by commitlog offset and  |
   |                    | size (just written, so in the page cache), only for queues whose   |
   |                    | held pulls have such a filter                                      |
2. **Deadline**. A loop timer per held pull wakes it with ``False`` when its time is up, so a
   300 ms suspend answers after about 300 ms, not at the next periodic check.
3. **Periodic check**, every ``pull_hold_check_interval_ms`` (5 s, RocketMQ's
   PullRequestHoldService), or every ``short_polling_time_ms`` when long polling is off: reads
   each held queue's max offset and wakes pulls that now have something to read (without a tag
   or property check: the re-run pull decides, and answers NO_MATCHED_MSG with the offset to
   go on from if nothing matched), and expires pulls whose deadline passed by the injected
   clock. It is the safety net for arrivals that bypass dispatch listeners and the only path
   in unit tests that drive time with a ManualClock.

When long polling is off (``longPollingEnable=false``) a pull is held for
``short_polling_time_ms`` and arrivals do not wake it — RocketMQ's short polling.

The woken pull re-runs once without suspending (the pull processor does that); ``hold``'s
result only says why it woke. At most ``held_pulls_max`` pulls are held at once; beyond that
``hold`` raises RESOURCE_EXHAUSTED (FLOW_CONTROL) so a flood of idle consumers cannot grow the
broker without bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rocketq._api.rocketq.v1 import common_pb2
from services.broker.config import BrokerConfig
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import exhausted
from services.store.message_store import MessageStore, RecordFilter, TagsFilter
from services.store.types import DispatchRequest

log = logging.getLogger(__name__)

HELD_PULLS_MAX = 50_000
"""Pulls held at once (each costs a future and a timer, about 1 KiB)."""
HOLD_TIMEOUT_MAX_MS = 120_000
"""A longer suspend request is shortened to this (push consumers ask 15 s, pull 20 s)."""


@dataclass(eq=False, slots=True)
class HeldPull:
    """One waiting pull."""

    offset: int
    """Queue offset the pull wants; a record at or past it may wake it."""
    tags_filter: TagsFilter | None
    deadline_ms: int
    """On the injected clock's monotonic reading, in ms (the periodic check); the loop timer
    uses real time."""
    future: asyncio.Future[bool]
    timer: asyncio.TimerHandle | None = None
    wake_on_arrival: bool = True
    record_filter: RecordFilter | None = None
    """Property-level check (SQL92) of an arriving record's bytes; None = no such check."""

    def wake(self, arrived: bool) -> None:
        if not self.future.done():
            self.future.set_result(arrived)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class PullHoldService:
    """Held pulls by queue, woken by arrivals, deadlines and a periodic check."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        clock: Clock = SYSTEM_CLOCK,
        *,
        held_pulls_max: int = HELD_PULLS_MAX,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.held_pulls_max = held_pulls_max
        self._held: dict[tuple[str, int], list[HeldPull]] = {}
        self._count = 0
        self._arrivals_checked = 0
        store.dispatcher.listeners.append(self._on_arrival)

    def held_count(self) -> int:
        return self._count

    def stats(self) -> dict[str, str]:
        """For GetRuntimeStats ``extra``: the held pulls now, and how many arrivals were checked
        against held pulls so far (a test sees "the broker looked at this message and the pull
        stayed held" without sleeping)."""
        return {
            "held_pulls": str(self._count),
            "held_pull_arrivals_checked": str(self._arrivals_checked),
        }

    def hold_time_ms(self, requested_ms: int) -> int:
        """How long a pull asking ``requested_ms`` is held under the current config."""
        if not self.config.long_polling_enable:
            return self.config.short_polling_time_ms
        return max(0, min(requested_ms, HOLD_TIMEOUT_MAX_MS))

    async def hold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        tags_filter: TagsFilter | None,
        timeout_ms: int,
        *,
        record_filter: RecordFilter | None = None,
    ) -> bool:
        """Wait until a matching message at or past ``offset`` arrives (True) or time is up.

        ``timeout_ms`` is the hold time already decided by the caller (see
        :meth:`hold_time_ms`); ``record_filter`` (SQL92) is applied to arrivals after
        ``tags_filter``. Raises ServiceError RESOURCE_EXHAUSTED beyond ``held_pulls_max``.
        """
        if self._count >= self.held_pulls_max:
            exhausted(
                common_pb2.FLOW_CONTROL,
                f"{self._count} pulls are already held on this broker (limit "
                f"{self.held_pulls_max}); retry after a short delay",
                topic=topic,
            )
        loop = asyncio.get_running_loop()
        pull = HeldPull(
            offset,
            tags_filter,
            int(self.clock.monotonic_s() * 1000) + timeout_ms,
            loop.create_future(),
            wake_on_arrival=self.config.long_polling_enable,
            record_filter=record_filter,
        )
        pull.timer = loop.call_later(timeout_ms / 1000, pull.wake, False)
        key = (topic, queue_id)
        self._held.setdefault(key, []).append(pull)
        self._count += 1
        try:
            return await pull.future
        finally:
            # Woken pulls were already removed; a cancelled call (client gone) is removed here,
            # and its timer cancelled (wake is idempotent).
            pull.wake(False)
            self._discard(key, pull)

    def _discard(self, key: tuple[str, int], pull: HeldPull) -> None:
        pulls = self._held.get(key)
        if not pulls:
            return
        try:
            pulls.remove(pull)
        except ValueError:
            return
        self._count -= 1
        if not pulls:
            del self._held[key]

    # -- wake paths ------------------------------------------------------------------------
    def _on_arrival(self, requests: Sequence[DispatchRequest]) -> None:
        """Dispatcher listener: wake held pulls that a dispatched record satisfies."""
        held = self._held
        if not held:
            return  # the common case under load: nobody waits, nothing to do per record
        for req in requests:
            pulls = held.get((req.topic, req.queue_id))
            if not pulls:
                continue
            self._arrivals_checked += 1
            record: memoryview | None = None
            woken: list[HeldPull] = []
            for p in pulls:
                if not (
                    p.wake_on_arrival
                    and req.queue_offset >= p.offset
                    and (p.tags_filter is None or p.tags_filter(req.tags_code))
                ):
                    continue
                if p.record_filter is not None:
                    if record is None:
                        record = self.store.commitlog.read(req.commitlog_offset, req.msg_size)
                    # An unreadable record wakes the pull: its re-run decides.
                    if record is not None and not p.record_filter(record):
                        continue
                woken.append(p)
            if woken:
                self._wake(req.topic, req.queue_id, woken, True)
                if not held:
                    return

    def _wake(self, topic: str, queue_id: int, pulls: list[HeldPull], arrived: bool) -> None:
        key = (topic, queue_id)
        for p in pulls:
            self._discard(key, p)
            p.wake(arrived)

    def check_once(self) -> int:
        """Wake pulls whose queue has grown past their offset, expire overdue ones; how many."""
        now = int(self.clock.monotonic_s() * 1000)  # hold times are real durations
        woken = 0
        for (topic, queue_id), pulls in list(self._held.items()):
            max_offset = int(self.store.max_offset(topic, queue_id))
            ready: list[HeldPull] = []
            overdue: list[HeldPull] = []
            for p in pulls:
                if p.wake_on_arrival and max_offset > p.offset:
                    ready.append(p)
                elif p.deadline_ms <= now:
                    overdue.append(p)
            if ready:
                self._wake(topic, queue_id, ready, True)
            if overdue:
                self._wake(topic, queue_id, overdue, False)
            woken += len(ready) + len(overdue)
        return woken

    async def run(self) -> None:
        """The periodic check; cancelled on shutdown, when every held pull is released."""
        try:
            while True:
                interval_ms = (
                    self.config.pull_hold_check_interval_ms
                    if self.config.long_polling_enable
                    else self.config.short_polling_time_ms
                )
                await asyncio.sleep(max(interval_ms, 10) / 1000)
                started = self.clock.monotonic_s()
                try:
                    self.check_once()
                except Exception:  # the loop must outlive any one bad check
                    log.exception("checking held pulls failed")
                took_s = self.clock.monotonic_s() - started
                if took_s > 5:
                    log.warning("checking %d held pulls took %.1f s", self._count, took_s)
        finally:
            self.release_all()

    def release_all(self) -> None:
        """Wake every held pull with ``False`` (shutdown: they answer NO_NEW_MSG now)."""
        for (topic, queue_id), pulls in list(self._held.items()):
            self._wake(topic, queue_id, list(pulls), False)
