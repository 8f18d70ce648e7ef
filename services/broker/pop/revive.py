"""The revive loop: messages popped and not acked within their invisible time come back.

RocketMQ's PopReviveService in one loop. Every ``REVIVE_INTERVAL_MS`` it applies the revive
log (on a slave too, so a promoted slave has the state at hand), and on a master, for each
checkpoint past its invisible time, copies each unacked message with one more reconsume time to

| condition                                          | goes to                           |
|----------------------------------------------------|-----------------------------------|
| reconsume times exceed the group's retryMaxTimes   | ``%DLQ%{group}`` (as send-back)   |
| otherwise                                          | ``%RETRY%{group}_{topic}``, read  |
|                                                    | by the group's next Pops at once  |

and then appends an ack for that offset, so a crash between the two gives a duplicate delivery,
never a lost one. The next Pop that reads the copy reports delivery attempt = reconsume times
+ 1 (the invisible time was the wait; no further backoff is added).
"""

from __future__ import annotations

import asyncio
import logging

from rocketq import codec
from services.broker.model import SubscriptionGroupConfig
from services.broker.pop.dead_letter import copy_message
from services.broker.pop.processor import PopProcessor
from services.broker.pop.state import Checkpoint
from services.broker.send_back import goes_to_dlq
from services.common.errors import ServiceError

log = logging.getLogger(__name__)

REVIVE_INTERVAL_MS = 200
REVIVE_CHECKPOINTS_PER_ROUND = 256
"""Bounds how long one round holds the pop lock."""


class ReviveService:
    """Redelivers what was not acked in time (see the module docstring)."""

    def __init__(self, pops: PopProcessor) -> None:
        self.pops = pops
        self.revived = 0
        self.dead_lettered = 0

    def stats(self) -> dict[str, str]:
        """For GetRuntimeStats ``extra``."""
        return {
            "pop_in_flight_checkpoints": str(len(self.pops.state.cks)),
            # FIFO groups: messages in flight, and acked ahead of an earlier unacked one
            "pop_fifo_in_flight": str(sum(len(q.owner) for q in self.pops.state.fifo.values())),
            "pop_fifo_acked_ahead": str(sum(len(q.done) for q in self.pops.state.fifo.values())),
            "pop_revived": str(self.revived),
            "pop_dead_lettered": str(self.dead_lettered),
        }

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REVIVE_INTERVAL_MS / 1000)
            try:
                await self.revive_once()
            except ServiceError as exc:  # store full or closing: try again next round
                log.warning("pop revive round failed: %s", exc.message)
            except Exception:  # the loop must outlive any one bad round
                log.exception("pop revive round failed")

    async def revive_once(self) -> int:
        """One round; how many messages were copied for redelivery."""
        pops = self.pops
        pops.catch_up()
        if not pops.config.is_master:
            return 0
        copied = 0
        async with pops.lock:
            pops.catch_up()
            due = pops.state.due(pops.clock.now_ms())[:REVIVE_CHECKPOINTS_PER_ROUND]
            for ck in due:
                for offset in ck.unacked():
                    copied += await self._revive(ck, offset)
        return copied

    async def _revive(self, ck: Checkpoint, offset: int) -> int:
        pops = self.pops
        record = pops.read(ck.read_topic, ck.queue_id, offset)
        copied = 0
        if record is None:
            log.warning(
                "pop revive: %s#%d offset %d was removed by retention before its redelivery",
                ck.read_topic, ck.queue_id, offset,
            )  # fmt: skip
        else:
            copied = await self._copy(ck, record)
        await pops.append([{"t": "ack", "id": ck.ck_id, "o": offset}])
        return copied

    async def _copy(self, ck: Checkpoint, record: codec.Record) -> int:
        pops = self.pops
        group_cfg = pops.groups.get(ck.group) or SubscriptionGroupConfig(ck.group)
        times = record.reconsume_times + 1
        to_dlq = goes_to_dlq(0, times, group_cfg.retry_max_times)
        copied = await copy_message(
            pops, ck.group, ck.asked_topic, record,
            reconsume_times=times, to_dlq=to_dlq, retry_queue_nums=group_cfg.retry_queue_nums,
        )  # fmt: skip
        if not copied:
            return 0
        if to_dlq:
            self.dead_lettered += 1
        else:
            self.revived += 1
        return 1
