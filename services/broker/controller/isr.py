"""Publishing the in-sync replica set P/isr (DESIGN.md §6; the ISR rule in ``election.py``).

Only the leader writes P/isr, in a transaction guarded by the leader key value it wrote when it
won: a replica that lost the key (its lease expired, a handover, a newer leader) cannot
overwrite the set of a later term, even if it has not noticed the loss yet. Writes are
serialized, so sets published one after the other reach etcd in that order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aetcd import transactions as tx

from services.broker.controller.keys import GroupKeys, IsrRecord, encode_isr
from services.broker.controller.session import EtcdSession, EtcdUnavailable, ProblemLog
from services.broker.controller.term import Term

log = logging.getLogger(__name__)


class IsrPublisher:
    """Writes P/isr for the leader of ``term``."""

    def __init__(
        self,
        session: EtcdSession,
        keys: GroupKeys,
        term: Term,
        *,
        name: str,
        problems: ProblemLog,
        write_fence: Callable[[], bool],
        wake: Callable[[], None],
    ) -> None:
        self._session = session
        self._keys = keys
        self._term = term
        self._name = name
        self._problems = problems
        self._write_fence = write_fence
        self._wake = wake
        self._lock = asyncio.Lock()

    async def publish(self, replica_ids: set[int]) -> bool:
        """P/isr = ``replica_ids`` plus this replica; False when not leading, the guard failed
        or etcd did not answer."""
        async with self._lock:
            term = self._term
            held = term.held_raw
            if not self._write_fence() or held is None:
                return False
            record = IsrRecord(term.epoch, frozenset(replica_ids) | {term.replica_id})
            try:
                ok = await self._session.txn(
                    [tx.Value(self._keys.leader) == held],
                    [tx.Put(self._keys.isr, encode_isr(record))],
                    "isr publish",
                )
            except EtcdUnavailable as exc:
                self._problems.report("isr publish", exc.problem, exc.detail)
                return False
            self._problems.resolve("isr publish")
            if not ok:
                self._wake()  # the leader key changed under us: the main loop demotes
                return False
            if set(record.replica_ids) != term.isr:
                log.warning(
                    "%s: in-sync set of epoch %d is now %s",
                    self._name,
                    record.epoch,
                    sorted(record.replica_ids),
                )
            term.isr = set(record.replica_ids)
            return True
