"""The controller of one replica in controller mode: its etcd lease, the group's election, the
ISR record and the write fence (DESIGN.md §6; layout in ``keys.py``, ranking in ``election.py``).

Invariant: at most one replica of a group acknowledges writes for any epoch, and none after its
lease may have expired in etcd. Three mechanisms hold it together:

- The leader key P/leader is created by one etcd transaction that also bumps P/epoch (guarded by
  "no leader key" and "epoch unchanged since my read") and lives under the winner's lease, so it
  vanishes when the winner stops refreshing (``campaign.py``).
- The write fence: ``write_lease_until`` is the monotonic time (on the injected clock) at which
  the last SUCCESSFUL keepalive was SENT, plus the TTL, minus ``lease.FENCE_MARGIN_S``. etcd
  cannot expire the lease before that moment (the refresh reached it after we sent it), so
  ``write_fence()`` turns False before anybody else can be elected — even for a process that
  wakes from a SIGSTOP: the check reads the clock, no timer needs to have run (``lease.py``).
- A term once abandoned is never resumed: when the fence passes, the lease is dropped (revoked
  once etcd answers, a new one granted) and a leader key still naming this replica is deleted,
  so leadership comes back only through a new election in a new epoch.

The parts, one job each: :class:`~.lease.Lease` (grant, refresh every TTL/3, the fence, loss),
:class:`~.watch.GroupWatch` (any change under P wakes the main loop),
:class:`~.campaign.Campaign` (the election while there is no leader key),
:class:`~.isr.IsrPublisher` (P/isr), :class:`~.handover.Handover` (switchover) and
:class:`~.term.Term` (what they all believe about the group). This class wires them and runs
the main loop, which re-reads the whole group (on wake-up and at least every second),
publishes this replica's member key and decides: follow the leader, campaign, or clean up.
Reading the whole group every time, rather than folding watch events into local state, keeps
the decision a pure function of one consistent read; the watch only makes it prompt. etcd
calls are bounded by timeouts; while etcd is down the controller retries with backoff and the
broker keeps serving what its role allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable
from typing import Protocol

from aetcd import transactions as tx

from rocketq.aio import wait_event
from rocketq.backoff import Backoff
from services.broker.config import BrokerConfig
from services.broker.controller import election
from services.broker.controller.campaign import Campaign, Won
from services.broker.controller.election import LeaderView
from services.broker.controller.handover import Handover
from services.broker.controller.isr import IsrPublisher
from services.broker.controller.keys import (
    GroupKeys,
    LeaderInfo,
    MemberState,
    Snapshot,
    encode_member,
    parse_snapshot,
)
from services.broker.controller.lease import Lease
from services.broker.controller.session import EtcdSession, EtcdUnavailable, ProblemLog
from services.broker.controller.term import Term
from services.broker.controller.watch import GroupWatch
from services.common.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

MEMBER_PUBLISH_INTERVAL_S = 1.0
RESYNC_INTERVAL_S = 1.0
"""The main loop re-reads the group at least this often (the watch's safety net)."""
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
START_WAIT_S = 2.0
"""``start`` returns after the first pass over etcd or this long, whichever comes first."""
TASK_STOP_TIMEOUT_S = 2.0


class ControllerListener(Protocol):
    """What the broker does when its role changes (H8b implements it)."""

    async def become_master(self, epoch: int) -> None:
        """This replica won the election for ``epoch`` (the leader key is held)."""

    async def become_slave(self, leader: LeaderInfo) -> None:
        """A leader exists and it is not this replica (also at startup)."""

    def lost_leadership(self, reason: str) -> None:
        """The lease was lost (or handed over) while leading: stop acknowledging at once."""

    def member_state(self) -> MemberState:
        """Fresh numbers to publish and rank by."""


class EtcdController:
    """One replica's view of, and part in, its group's election."""

    def __init__(
        self,
        config: BrokerConfig,
        listener: ControllerListener,
        addr: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.addr = addr
        self.clock = clock
        self.replica_id = config.replica_id
        self.keys = GroupKeys(config.controller_key_prefix, config.cluster_name, config.broker_name)
        self.lease_ttl_s = config.controller_lease_ttl_sec
        self.term = Term(self.replica_id)
        self.old_master_replica_id: int | None = None
        self.old_master_max_offset: int | None = None
        """On the winner: the previous master's last published max offset (None if unknown),
        for the ASYNC loss report (old master's max offset minus this store's)."""
        self._listener = listener
        self._session = EtcdSession(config.etcd_endpoints)
        self._name = f"controller {self.keys.root} replica {self.replica_id}"
        self._problems = ProblemLog(log, self._name)
        self._wake = asyncio.Event()
        self._first_pass = asyncio.Event()
        self._followed: LeaderInfo | None = None
        self._last_member_publish = 0.0
        self._last_leader_member: MemberState | None = None
        self._connected = False
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._wire_parts()

    def _wire_parts(self) -> None:
        session, keys, term, name = self._session, self.keys, self.term, self._name
        self.lease = Lease(
            session,
            self.lease_ttl_s,
            self.clock,
            name=name,
            problems=self._problems,
            on_granted=self._lease_granted,
            on_lost=self._lease_lost,
        )
        self._watch = GroupWatch(session, keys.prefix, self._problems, self._wake.set)
        self._campaign = Campaign(
            session,
            keys,
            self.lease,
            self.clock,
            name=name,
            replica_id=self.replica_id,
            addr=self.addr,
            member_state=self._member_state,
            publish_member=self._publish_member,
            wake=self._wake.set,
        )
        self._isr_publisher = IsrPublisher(
            session,
            keys,
            term,
            name=name,
            problems=self._problems,
            write_fence=self.write_fence,
            wake=self._wake.set,
        )
        self._handover = Handover(
            session,
            keys,
            term,
            name=name,
            broker_name=self.config.broker_name,
            lease_ttl_s=self.lease_ttl_s,
            clock=self.clock,
            write_fence=self.write_fence,
            demote=self._demote,
            wake=self._wake.set,
        )

    # -- the term, as attributes (roles.py and the tests read them) -------------------------

    @property
    def epoch(self) -> int:
        """The newest epoch seen."""
        return self.term.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.term.epoch = value

    @property
    def leader(self) -> LeaderInfo | None:
        return self.term.leader

    @leader.setter
    def leader(self, value: LeaderInfo | None) -> None:
        self.term.set_leader(value)

    @property
    def is_leader(self) -> bool:
        return self.term.is_leader

    @is_leader.setter
    def is_leader(self, value: bool) -> None:
        self.term.is_leader = value

    @property
    def write_lease_until(self) -> float:
        """Monotonic time (``clock.monotonic_s()``) until which the lease is surely valid."""
        return self.lease.write_lease_until

    @property
    def _fence_timer(self) -> asyncio.TimerHandle | None:
        """The lease's fence timer (a test that simulates a crash cancels it)."""
        return self.lease.fence_timer

    # -- public API ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the lease, watch and election tasks; returns after the first read of the
        group (roles applied) or ``START_WAIT_S``, so a broker whose etcd is down still starts
        (it serves what its role allows and the controller keeps retrying)."""
        self._stopping = False
        stopping = self._is_stopping
        # looked up at each keepalive, so a test that swaps ``_refresh`` on a running
        # controller cuts its link to etcd
        lease_loop = self.lease.run(stopping, lambda: self._refresh())  # noqa: PLW0108
        self._tasks = [
            asyncio.create_task(lease_loop, name="controller-lease"),
            asyncio.create_task(self._watch.run(stopping), name="controller-watch"),
            asyncio.create_task(self._main_loop(), name="controller-main"),
        ]
        try:
            await asyncio.wait_for(self._first_pass.wait(), START_WAIT_S)
        except TimeoutError:
            log.warning("%s: etcd not reachable yet; starting anyway", self._name)

    async def stop(self) -> None:
        """Stop acknowledging, stop the tasks and revoke the lease: a clean shutdown frees the
        leader key at once, so the group elects without waiting for a TTL."""
        self._stopping = True
        self.term.is_leader = False
        self.term.held_raw = None
        self.lease.cancel_timer()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=TASK_STOP_TIMEOUT_S)
        self._tasks = []
        await self.lease.revoke()
        await self._session.close()

    def write_fence(self) -> bool:
        """True while this replica leads and its lease is surely valid."""
        return self.term.is_leader and self.lease.fence_open()

    def isr(self) -> set[int]:
        """The in-sync set last read from or written to P/isr."""
        return set(self.term.isr)

    async def publish_isr(self, replica_ids: set[int]) -> bool:
        """Write P/isr = ``replica_ids`` (plus this replica) in a txn guarded by this replica's
        leader key; False when not leading, the guard failed or etcd did not answer."""
        return await self._isr_publisher.publish(replica_ids)

    def handover_candidates(self) -> list[MemberState]:
        """Eligible live members of P/isr other than this replica, best first (switchover
        targets; the first is the one ``handover(0)`` picks)."""
        return self._handover.candidates()

    async def handover(self, target_replica_id: int) -> LeaderInfo:
        """Give up leadership to ``target_replica_id`` (0 = the best-ranked candidate): put
        P/handover and delete P/leader in one txn guarded by our leader key, then wait for the
        new leader key and return it. The caller has fenced writes and made sure the target
        holds every acknowledged byte. Raises ServiceError (UNAVAILABLE NOT_MASTER when not
        leading, FAILED_PRECONDITION for a bad target, DEADLINE_EXCEEDED when nobody won)."""
        return await self._handover.hand_over(target_replica_id)

    async def wait_for_leader(self, after_epoch: int, timeout_s: float) -> LeaderInfo:
        """The first leader seen with an epoch above ``after_epoch``; DEADLINE_EXCEEDED after
        ``timeout_s``."""
        return await self.term.wait_for_leader(
            after_epoch, timeout_s, self.clock, self.config.broker_name
        )

    def lease_remaining_ms(self) -> int:
        """How long the write fence stays open (0 without a lease)."""
        return int(self.lease.remaining_s() * 1000)

    def status(self) -> dict[str, object]:
        """For admin and runtime stats."""
        leader = self.term.leader
        members = self.term.snapshot.members
        return {
            "replica_id": self.replica_id,
            "is_leader": self.term.is_leader,
            "write_fence": self.write_fence(),
            "epoch": self.term.epoch,
            "leader": dataclasses.asdict(leader) if leader else None,
            "leader_addr": leader.addr if leader else "",
            "isr": sorted(self.term.isr),
            "lease_remaining_ms": self.lease_remaining_ms(),
            "members": [dataclasses.asdict(m) for _, m in sorted(members.items())],
            "etcd_connected": self._connected,
            "etcd_endpoint": self._session.endpoint,
            "problems": self._problems.active(),
            "old_master_replica_id": self.old_master_replica_id,
            "old_master_max_offset": self.old_master_max_offset,
        }

    # -- the lease's callbacks -------------------------------------------------------------

    def _is_stopping(self) -> bool:
        return self._stopping

    async def _refresh(self) -> None:
        """One keepalive. A seam: the fencing test replaces it to cut the link to etcd."""
        await self.lease.keepalive()

    def _lease_granted(self) -> None:
        self._last_member_publish = 0.0  # the member key goes under the new lease at once
        self._wake.set()

    def _lease_lost(self, reason: str) -> None:
        """The lease is gone: if leading, demote at once."""
        self._demote(reason)
        self._wake.set()

    def _demote(self, reason: str) -> None:
        term = self.term
        if not term.is_leader:
            return
        term.is_leader = False
        term.held_raw = None
        self._followed = None
        log.warning("%s: LOST leadership of epoch %d: %s", self._name, term.epoch, reason)
        try:
            self._listener.lost_leadership(reason)
        except Exception:
            log.exception("%s: lost_leadership failed", self._name)

    # -- the main loop ---------------------------------------------------------------------

    async def _main_loop(self) -> None:
        backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        while not self._stopping:
            self._wake.clear()
            try:
                wait_s = await self._pass()
                self._problems.resolve("etcd")
                backoff.reset()
            except EtcdUnavailable as exc:
                self._connected = False
                self._problems.report("etcd", exc.problem, exc.detail)
                wait_s = backoff.next_delay_s()
            except Exception:
                # a bug here must not take the broker down; the next pass starts afresh
                log.exception("%s: pass failed", self._name)
                wait_s = RESYNC_INTERVAL_S
            self._first_pass.set()
            await wait_event(self._wake, wait_s)

    async def _pass(self) -> float:
        """Read the group, publish this replica's member key when due, act; the next wait."""
        snap = await self._read()
        since_publish_s = self.clock.monotonic_s() - self._last_member_publish
        if self.lease.lease_id is not None and since_publish_s >= MEMBER_PUBLISH_INTERVAL_S:
            await self._publish_member()
        await self._apply(snap)
        return self._campaign.wait_s(RESYNC_INTERVAL_S)

    async def _read(self) -> Snapshot:
        revision, kvs = await self._session.read_prefix(self.keys.prefix)
        snap = parse_snapshot(self.keys, revision, kvs)
        self._connected = True
        if snap.problems:
            self._problems.report("keys", "undecodable", "; ".join(snap.problems))
        else:
            self._problems.resolve("keys")
        term = self.term
        term.snapshot = snap
        term.epoch = max(term.epoch, snap.epoch, snap.leader.epoch if snap.leader else 0)
        if snap.isr is not None and not term.is_leader:
            term.isr = set(snap.isr.replica_ids)
        return snap

    def _member_state(self) -> MemberState:
        state = self._listener.member_state()
        return dataclasses.replace(state, replica_id=self.replica_id)

    async def _publish_member(self) -> None:
        lease_id = self.lease.lease_id
        if lease_id is None:
            return
        raw = encode_member(self._member_state())
        key = self.keys.member(self.replica_id)
        try:
            await self._session.call(lambda c: c.put(key, raw, lease=lease_id), "member publish")
        except EtcdUnavailable as exc:
            if "lease not found" in exc.detail and lease_id == self.lease.lease_id:
                self.lease.lost("etcd no longer knows the lease")
                return
            raise
        self._last_member_publish = self.clock.monotonic_s()

    async def _apply(self, snap: Snapshot) -> None:
        held = self.term.held_raw if self.term.is_leader else None
        view = election.classify_leader(
            self.replica_id, snap.leader_present, snap.leader, snap.leader_raw, held
        )
        if view is not LeaderView.MINE:
            self._demote(f"the leader key is no longer this replica's ({view.value})")
        if view is not LeaderView.NONE:
            self._campaign.leader_seen()
        if view in (LeaderView.MINE, LeaderView.OTHER):
            self.term.set_leader(snap.leader)
            self._remember_leader_member(snap)
        else:
            self.term.set_leader(None)
        if view is LeaderView.OTHER and snap.leader is not None and self._followed != snap.leader:
            await self._follow(snap.leader)
        elif view is LeaderView.STALE_MINE and not self._handover.active:
            await self._delete_stale(snap)
        elif view is LeaderView.NONE:
            won = await self._campaign.step(snap)
            if won is not None:
                self._win(won)
                await self._become_master(won.leader.epoch)

    async def _follow(self, leader: LeaderInfo) -> None:
        log.info(
            "%s: follows master %d at %s (epoch %d)",
            self._name,
            leader.replica_id,
            leader.addr,
            leader.epoch,
        )
        if await self._notify(self._listener.become_slave(leader), "become_slave"):
            self._followed = leader

    async def _notify(self, call: Awaitable[None], what: str) -> bool:
        try:
            await call
            return True
        except Exception:
            log.exception("%s: %s failed", self._name, what)
            return False

    def _remember_leader_member(self, snap: Snapshot) -> None:
        if snap.leader is not None and snap.leader.replica_id in snap.members:
            self._last_leader_member = snap.members[snap.leader.replica_id]

    async def _delete_stale(self, snap: Snapshot) -> None:
        """A leader key naming this replica that it does not hold (an abandoned term, or one
        left by this replica's previous process): delete it, so the group elects anew."""
        log.warning(
            "%s: deleting this replica's abandoned leader key (epoch %s)",
            self._name,
            snap.leader.epoch if snap.leader else "?",
        )
        await self._session.txn(
            [tx.Mod(self.keys.leader) == snap.leader_mod_revision],
            [tx.Delete(self.keys.leader)],
            "stale leader delete",
        )
        self._wake.set()

    def _win(self, won: Won) -> None:
        term, leader = self.term, won.leader
        term.is_leader = True
        term.held_raw = won.raw
        term.epoch = leader.epoch
        term.isr = set(won.isr.replica_ids)
        self._followed = None
        self._campaign.leader_seen()
        previous = self._last_leader_member
        self.old_master_replica_id = previous.replica_id if previous else None
        self.old_master_max_offset = previous.max_offset if previous else None
        term.set_leader(leader)
        log.warning(
            "%s: ELECTED master in epoch %d (%s of ranking %s; previous "
            "master %s last published max offset %s)",
            self._name,
            leader.epoch,
            won.plan.reason,
            won.plan.describe_ranking(),
            self.old_master_replica_id,
            self.old_master_max_offset,
        )

    async def _become_master(self, epoch: int) -> None:
        if not await self._notify(self._listener.become_master(epoch), "become_master"):
            # a master that could not switch must not hold the key: give it up
            self._demote("become_master failed")
            self._wake.set()
