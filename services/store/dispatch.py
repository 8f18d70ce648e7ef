"""Dispatch: turn freshly appended records into consume-queue units and index entries.

RocketMQ runs this as a background ReputMessageService that re-reads the commitlog. Here the
commitlog hands dispatch the :class:`DispatchRequest` values it has just written, and dispatch
runs in the same event-loop step as the append (DESIGN.md §4), so a message is pullable the
moment its send is acknowledged and no record is ever read back just to be indexed. Recovery
uses the same entry point with requests decoded from disk.

Arrival listeners run last; the broker registers one to wake long-polled pulls (SPEC §6.9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.common import failpoints
from services.store.commitlog import NOT_QUEUED, TRANSACTION_MASK
from services.store.consume_queue import CQ_UNIT
from services.store.consume_queue_store import ConsumeQueueStore
from services.store.index_service import IndexService
from services.store.types import DispatchRequest, PhysicalOffset

ArrivalListener = Callable[[Sequence[DispatchRequest]], None]
"""Called with every dispatched batch, after its units are readable."""


class Dispatcher:
    """Builds consume queues and the index; notifies arrival listeners."""

    def __init__(self, queues: ConsumeQueueStore, index: IndexService | None) -> None:
        self.queues = queues
        self.index = index
        self.listeners: list[ArrivalListener] = []
        self.dispatched_offset = PhysicalOffset(0)
        """Physical offset just past the last dispatched record."""

    def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        if not requests:
            return
        failpoints.inject("dispatch_before_consume_queue")
        self._write_units(requests)
        if self.index is not None:
            self.index.build_index_batch(list(requests))
        last = requests[-1]
        end = PhysicalOffset(last.commitlog_offset + last.msg_size)
        self.dispatched_offset = max(self.dispatched_offset, end)
        for listener in self.listeners:
            listener(requests)

    def _write_units(self, requests: Sequence[DispatchRequest]) -> None:
        """Write units, one mapped-file write per run of consecutive records of one queue."""
        if any(r.sys_flag & TRANSACTION_MASK in NOT_QUEUED for r in requests):
            requests = [r for r in requests if r.sys_flag & TRANSACTION_MASK not in NOT_QUEUED]
        pack = CQ_UNIT.pack
        i, n = 0, len(requests)
        while i < n:
            first = requests[i]
            key_topic, key_qid = first.topic, first.queue_id
            units = [pack(first.commitlog_offset, first.msg_size, first.tags_code)]
            expect = first.queue_offset + 1
            j = i + 1
            while j < n:
                r = requests[j]
                if r.topic != key_topic or r.queue_id != key_qid or r.queue_offset != expect:
                    break
                units.append(pack(r.commitlog_offset, r.msg_size, r.tags_code))
                expect += 1
                j += 1
            last = requests[j - 1]
            cq = self.queues.find_or_create(key_topic, key_qid)
            end = PhysicalOffset(last.commitlog_offset + last.msg_size)
            cq.put_many(first.queue_offset, b"".join(units), end)
            i = j
