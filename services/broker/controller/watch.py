"""The watch on one group's keys: any change wakes the controller's main loop.

The watch carries no state of its own: the main loop re-reads the whole group on every wake-up
(and at least every second without one), so a lost or late event costs promptness, never
correctness. A broken stream is reopened with backoff, and a wake-up is given on every reopen
for changes made while no watch was open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rocketq.backoff import Backoff
from services.broker.controller.session import EtcdSession, EtcdUnavailable, ProblemLog

RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0


class GroupWatch:
    """Watches the keys under ``prefix`` and calls ``wake()`` on each change."""

    def __init__(
        self, session: EtcdSession, prefix: bytes, problems: ProblemLog, wake: Callable[[], None]
    ) -> None:
        self._session = session
        self._prefix = prefix
        self._problems = problems
        self._wake = wake

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Until ``stopping()`` (or cancelled); never raises otherwise."""
        backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        while not stopping():
            try:
                watch = await self._session.call(lambda c: c.watch_prefix(self._prefix), "watch")
                self._problems.resolve("watch")
                backoff.reset()
                self._wake()  # changes made while no watch was open
                async for _event in watch:
                    self._wake()
            except EtcdUnavailable as exc:
                self._problems.report("watch", exc.problem, exc.detail)
            except Exception as exc:  # the stream broke (aetcd raises its own errors here)
                self._problems.report("watch", type(exc).__name__, str(exc))
            await asyncio.sleep(backoff.next_delay_s())
