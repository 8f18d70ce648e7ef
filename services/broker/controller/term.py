"""What one replica currently believes about its group: the newest epoch, the leader, whether it
leads itself (and the leader key value it holds then), the in-sync set and the last read.

Shared by the controller's parts (main loop, campaign, ISR publishing, handover), which each
change only what is theirs; one object rather than copies, so none of them acts on stale state.
"""

from __future__ import annotations

import asyncio

import grpc

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.aio import wait_event
from services.broker.controller.keys import LeaderInfo, Snapshot
from services.common.clock import Clock
from services.common.errors import ServiceError


class Term:
    """The group as this replica sees it (mutable; one per controller)."""

    def __init__(self, replica_id: int) -> None:
        self.replica_id = replica_id
        self.epoch = 0
        """The newest epoch seen."""
        self.leader: LeaderInfo | None = None
        self.is_leader = False
        self.held_raw: bytes | None = None
        """The leader key value this replica wrote in its current term (None unless leading):
        every write it makes as leader is guarded by it."""
        self.isr: set[int] = set()
        """The in-sync set last read from or written to P/isr."""
        self.snapshot = Snapshot()
        self._leader_event = asyncio.Event()

    def set_leader(self, leader: LeaderInfo | None) -> None:
        """Record the leader and wake whoever waits for a change."""
        if leader != self.leader:
            self.leader = leader
            event, self._leader_event = self._leader_event, asyncio.Event()
            event.set()

    async def wait_for_leader(
        self, after_epoch: int, timeout_s: float, clock: Clock, broker_name: str
    ) -> LeaderInfo:
        """The first leader seen with an epoch above ``after_epoch``; DEADLINE_EXCEEDED after
        ``timeout_s``."""
        deadline_s = clock.monotonic_s() + timeout_s
        while True:
            leader = self.leader
            if leader is not None and leader.epoch > after_epoch:
                return leader
            remaining_s = deadline_s - clock.monotonic_s()
            if remaining_s <= 0:
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    common_pb2.ERROR_REASON_UNSPECIFIED,
                    f"no new master of {broker_name} within {timeout_s:.1f}s",
                )
            event = self._leader_event
            await wait_event(event, remaining_s)
