"""Handing leadership over (Admin.Switchover, ``services/broker/switchover.py``).

The leader puts P/handover = {target, epoch} and deletes P/leader in one transaction guarded by
its own leader key, having demoted itself first (no write is acknowledged from then on). The
ranking (``election.plan_campaign``) lets the named target campaign at once and holds everyone
else back ``HANDOVER_WAIT_TTLS`` lease TTLs; the old leader then waits for a leader of a newer
epoch and answers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aetcd import transactions as tx

from rocketq._api.rocketq.v1 import common_pb2
from services.broker.controller import election
from services.broker.controller.keys import (
    GroupKeys,
    HandoverRecord,
    IsrRecord,
    LeaderInfo,
    MemberState,
    encode_handover,
)
from services.broker.controller.session import EtcdSession, EtcdUnavailable
from services.broker.controller.term import Term
from services.common.clock import Clock
from services.common.errors import precondition, unavailable

log = logging.getLogger(__name__)

EXTRA_WAIT_S = 3.0
"""Waited for the new leader beyond the ``HANDOVER_WAIT_TTLS`` lease TTLs."""


class Handover:
    """The leader's side of a switchover; ``active`` while its transaction is out."""

    def __init__(
        self,
        session: EtcdSession,
        keys: GroupKeys,
        term: Term,
        *,
        name: str,
        broker_name: str,
        lease_ttl_s: int,
        clock: Clock,
        write_fence: Callable[[], bool],
        demote: Callable[[str], None],
        wake: Callable[[], None],
    ) -> None:
        self.active = False
        """True from the demotion until etcd answered: the leader key still naming this replica
        is the one being handed over, not an abandoned one to delete."""
        self._session = session
        self._keys = keys
        self._term = term
        self._name = name
        self._broker_name = broker_name
        self._lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._write_fence = write_fence
        self._demote = demote
        self._wake = wake

    def candidates(self) -> list[MemberState]:
        """Eligible live members of P/isr other than this replica, best first."""
        term = self._term
        # the leader's own record, not the last read: that may predate its election txn
        isr = IsrRecord(term.epoch, frozenset(term.isr)) if term.is_leader else term.snapshot.isr
        ranked = election.candidates(term.snapshot.members, isr)
        return [m for m in ranked if m.replica_id != term.replica_id]

    async def hand_over(self, target_replica_id: int) -> LeaderInfo:
        """See :meth:`EtcdController.handover`."""
        held = self._term.held_raw
        if not self._write_fence() or held is None:
            unavailable(common_pb2.NOT_MASTER, "this replica is not the master")
        target = self._pick(target_replica_id)
        epoch = self._term.epoch
        self.active = True
        try:
            self._demote(f"handing over to replica {target}")
            await self._give_up(held, target, epoch)
        finally:
            self.active = False
        self._wake()
        timeout_s = election.HANDOVER_WAIT_TTLS * self._lease_ttl_s + EXTRA_WAIT_S
        return await self._term.wait_for_leader(epoch, timeout_s, self._clock, self._broker_name)

    def _pick(self, wanted: int) -> int:
        targets = [m.replica_id for m in self.candidates()]
        target = wanted or (targets[0] if targets else 0)
        if target not in targets:
            precondition(
                f"replica {wanted} is not an eligible in-sync replica of "
                f"{self._broker_name}; in-sync set {sorted(self._term.isr)}, "
                f"eligible live candidates {targets}"
            )
        return target

    async def _give_up(self, held: bytes, target: int, epoch: int) -> None:
        k = self._keys
        try:
            ok = await self._session.txn(
                [tx.Value(k.leader) == held],
                [
                    tx.Put(k.handover, encode_handover(HandoverRecord(target, epoch))),
                    tx.Delete(k.leader),
                ],
                "handover",
            )
        except EtcdUnavailable as exc:
            unavailable(common_pb2.NOT_MASTER, f"handover not confirmed by etcd: {exc}")
        if not ok:
            unavailable(common_pb2.NOT_MASTER, "leadership was lost before the handover")
        log.warning("%s: handed over epoch %d to replica %d", self._name, epoch, target)
