"""The controller of one replica in controller mode: its etcd lease, the group's election, the
ISR record and the write fence (DESIGN.md §6; layout in ``keys.py``, ranking in ``election.py``).

Invariant: at most one replica of a group acknowledges writes for any epoch, and none after its
lease may have expired in etcd. Three mechanisms hold it together:

- The leader key P/leader is created by one etcd transaction that also bumps P/epoch (guarded by
  "no leader key" and "epoch unchanged since my read") and lives under the winner's lease, so it
  vanishes when the winner stops refreshing.
- The write fence: ``write_lease_until`` is the monotonic time at which the last SUCCESSFUL
  keepalive was SENT, plus the TTL, minus ``FENCE_MARGIN_S``. etcd cannot expire the lease before
  that moment (the refresh reached it after we sent it), so ``write_fence()`` turns False before
  anybody else can be elected — even for a process that wakes from a SIGSTOP: the check reads
  the clock, no timer needs to have run.
- A term once abandoned is never resumed: when the fence passes, the lease is dropped (revoked
  once etcd answers, a new one granted) and a leader key still naming this replica is deleted,
  so leadership comes back only through a new election in a new epoch.

Everything runs as three tasks: the lease loop (grant, refresh every TTL/3, revoke old leases),
the watch (any change under P wakes the main loop) and the main loop, which re-reads the whole
group (on wake-up and at least every second), publishes this replica's member key and decides:
follow the leader, campaign, or clean up. Reading the whole group every time, rather than
folding watch events into local state, keeps the decision a pure function of one consistent
read; the watch only makes it prompt. etcd calls are bounded by timeouts; while etcd is down the
controller retries with backoff and the broker keeps serving what its role allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable
from typing import Any, Protocol

import grpc
from aetcd import transactions as tx

from rocketq._api.rocketq.v1 import common_pb2
from services.broker.config import BrokerConfig
from services.broker.controller import election
from services.broker.controller.election import LeaderView, Verdict
from services.broker.controller.keys import (
    GroupKeys,
    HandoverRecord,
    IsrRecord,
    LeaderInfo,
    MemberState,
    Snapshot,
    encode_epoch,
    encode_handover,
    encode_isr,
    encode_leader,
    encode_member,
    parse_snapshot,
)
from services.broker.controller.session import EtcdSession, EtcdUnavailable, ProblemLog
from services.common.errors import ServiceError, precondition, unavailable

log = logging.getLogger(__name__)

FENCE_MARGIN_S = 0.5
"""The write fence closes this long before etcd could expire the lease."""
MEMBER_PUBLISH_INTERVAL_S = 1.0
RESYNC_INTERVAL_S = 1.0
"""The main loop re-reads the group at least this often (the watch's safety net)."""
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 2.0
NO_CANDIDATE_LOG_INTERVAL_S = 10.0
OLD_LEASES_MAX = 8
"""Abandoned leases waiting to be revoked (each holds keys until revoked or expired)."""
START_WAIT_S = 2.0
"""``start`` returns after the first pass over etcd or this long, whichever comes first."""
TASK_STOP_TIMEOUT_S = 2.0
REVOKE_TIMEOUT_S = 1.0
HANDOVER_EXTRA_WAIT_S = 3.0


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

    def __init__(self, config: BrokerConfig, listener: ControllerListener, addr: str) -> None:
        self.config = config
        self.addr = addr
        self.replica_id = config.replica_id
        self.keys = GroupKeys(config.controller_key_prefix, config.cluster_name, config.broker_name)
        self.lease_ttl_s = config.controller_lease_ttl_sec
        self.write_lease_until = 0.0
        """Monotonic time until which the lease is surely valid (see the module docstring)."""
        self.epoch = 0
        """The newest epoch seen."""
        self.leader: LeaderInfo | None = None
        self.is_leader = False
        self.old_master_replica_id: int | None = None
        self.old_master_max_offset: int | None = None
        """On the winner: the previous master's last published max offset (None if unknown),
        for the ASYNC loss report (old master's max offset minus this store's)."""
        self._listener = listener
        self._session = EtcdSession(config.etcd_endpoints)
        self._name = f"controller {self.keys.root} replica {self.replica_id}"
        self._problems = ProblemLog(log, self._name)
        self._isr: set[int] = set()
        self._snapshot = Snapshot()
        self._held_raw: bytes | None = None
        self._lease_id: int | None = None
        self._old_leases: list[int] = []
        self._fence_timer: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._first_pass = asyncio.Event()
        self._leader_event = asyncio.Event()
        self._followed: LeaderInfo | None = None
        self._no_leader_since: float | None = None
        self._campaign_at: float | None = None
        self._last_member_publish = 0.0
        self._last_leader_member: MemberState | None = None
        self._last_plan_note = ""
        self._last_no_candidate_log = -NO_CANDIDATE_LOG_INTERVAL_S
        self._connected = False
        self._handing_over = False
        self._stopping = False
        self._isr_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # -- public API ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the lease, watch and election tasks; returns after the first read of the
        group (roles applied) or ``START_WAIT_S``, so a broker whose etcd is down still starts
        (it serves what its role allows and the controller keeps retrying)."""
        self._stopping = False
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="controller-lease"),
            asyncio.create_task(self._watch_loop(), name="controller-watch"),
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
        self.is_leader = False
        self._held_raw = None
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=TASK_STOP_TIMEOUT_S)
        self._tasks = []
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is not None:
            try:
                await self._session.call(
                    lambda c: c.revoke_lease(lease_id), "lease revoke", REVOKE_TIMEOUT_S
                )
            except EtcdUnavailable as exc:
                log.info("%s: lease not revoked (%s)", self._name, exc)
        await self._session.close()

    def write_fence(self) -> bool:
        """True while this replica leads and its lease is surely valid."""
        return self.is_leader and time.monotonic() < self.write_lease_until

    def isr(self) -> set[int]:
        """The in-sync set last read from or written to P/isr."""
        return set(self._isr)

    async def publish_isr(self, replica_ids: set[int]) -> bool:
        """Write P/isr = ``replica_ids`` (plus this replica) in a txn guarded by this replica's
        leader key; False when not leading, the guard failed or etcd did not answer."""
        async with self._isr_lock:
            held = self._held_raw
            if not self.write_fence() or held is None:
                return False
            record = IsrRecord(self.epoch, frozenset(replica_ids) | {self.replica_id})
            try:
                ok = await self._session.txn(
                    [tx.Value(self.keys.leader) == held],
                    [tx.Put(self.keys.isr, encode_isr(record))],
                    "isr publish",
                )
            except EtcdUnavailable as exc:
                self._problems.report("isr publish", exc.problem, exc.detail)
                return False
            self._problems.resolve("isr publish")
            if not ok:
                self._wake.set()  # the leader key changed under us: the main loop demotes
                return False
            if set(record.replica_ids) != self._isr:
                log.warning(
                    "%s: in-sync set of epoch %d is now %s",
                    self._name,
                    record.epoch,
                    sorted(record.replica_ids),
                )
            self._isr = set(record.replica_ids)
            return True

    def handover_candidates(self) -> list[MemberState]:
        """Eligible live members of P/isr other than this replica, best first (switchover
        targets; the first is the one ``handover(0)`` picks)."""
        # the leader's own record, not the last read: that may predate its election txn
        isr = IsrRecord(self.epoch, frozenset(self._isr)) if self.is_leader else self._snapshot.isr
        ranked = election.candidates(self._snapshot.members, isr)
        return [m for m in ranked if m.replica_id != self.replica_id]

    async def handover(self, target_replica_id: int) -> LeaderInfo:
        """Give up leadership to ``target_replica_id`` (0 = the best-ranked candidate): put
        P/handover and delete P/leader in one txn guarded by our leader key, then wait for the
        new leader key and return it. The caller has fenced writes and made sure the target
        holds every acknowledged byte. Raises ServiceError (UNAVAILABLE NOT_MASTER when not
        leading, FAILED_PRECONDITION for a bad target, DEADLINE_EXCEEDED when nobody won)."""
        held = self._held_raw
        if not self.write_fence() or held is None:
            unavailable(common_pb2.NOT_MASTER, "this replica is not the master")
        targets = [m.replica_id for m in self.handover_candidates()]
        target = target_replica_id or (targets[0] if targets else 0)
        if target not in targets:
            precondition(
                f"replica {target_replica_id} is not an eligible in-sync replica of "
                f"{self.config.broker_name}; in-sync set {sorted(self._isr)}, "
                f"eligible live candidates {targets}"
            )
        epoch = self.epoch
        self._handing_over = True
        try:
            self._demote(f"handing over to replica {target}")
            try:
                ok = await self._session.txn(
                    [tx.Value(self.keys.leader) == held],
                    [
                        tx.Put(self.keys.handover, encode_handover(HandoverRecord(target, epoch))),
                        tx.Delete(self.keys.leader),
                    ],
                    "handover",
                )
            except EtcdUnavailable as exc:
                unavailable(common_pb2.NOT_MASTER, f"handover not confirmed by etcd: {exc}")
            if not ok:
                unavailable(common_pb2.NOT_MASTER, "leadership was lost before the handover")
            log.warning(
                "%s: handed over epoch %d to replica %d",
                self._name,
                epoch,
                target,
            )
        finally:
            self._handing_over = False
        self._wake.set()
        timeout_s = election.HANDOVER_WAIT_TTLS * self.lease_ttl_s + HANDOVER_EXTRA_WAIT_S
        return await self.wait_for_leader(epoch, timeout_s)

    async def wait_for_leader(self, after_epoch: int, timeout_s: float) -> LeaderInfo:
        """The first leader seen with an epoch above ``after_epoch``; DEADLINE_EXCEEDED after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader
            if leader is not None and leader.epoch > after_epoch:
                return leader
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    common_pb2.ERROR_REASON_UNSPECIFIED,
                    f"no new master of {self.config.broker_name} within {timeout_s:.1f}s",
                )
            event = self._leader_event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    def status(self) -> dict[str, object]:
        """For admin and runtime stats."""
        leader = self.leader
        remaining_s = self.write_lease_until - time.monotonic() if self._lease_id else 0.0
        return {
            "replica_id": self.replica_id,
            "is_leader": self.is_leader,
            "write_fence": self.write_fence(),
            "epoch": self.epoch,
            "leader": dataclasses.asdict(leader) if leader else None,
            "leader_addr": leader.addr if leader else "",
            "isr": sorted(self._isr),
            "lease_remaining_ms": max(0, int(remaining_s * 1000)),
            "members": [dataclasses.asdict(m) for _, m in sorted(self._snapshot.members.items())],
            "etcd_connected": self._connected,
            "etcd_endpoint": self._session.endpoint,
            "problems": self._problems.active(),
            "old_master_replica_id": self.old_master_replica_id,
            "old_master_max_offset": self.old_master_max_offset,
        }

    # -- lease -----------------------------------------------------------------------------

    def _refresh_interval_s(self) -> float:
        return self.lease_ttl_s / 3

    async def _lease_loop(self) -> None:
        backoff_s = BACKOFF_MIN_S
        while not self._stopping:
            try:
                if self._lease_id is None:
                    await self._revoke_old_leases()
                    await self._grant()
                else:
                    await self._refresh()
                self._problems.resolve("lease")
                backoff_s = BACKOFF_MIN_S
                await asyncio.sleep(self._refresh_interval_s())
            except EtcdUnavailable as exc:
                self._problems.report("lease", exc.problem, exc.detail)
                self._check_fence()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, self._refresh_interval_s())

    async def _grant(self) -> None:
        sent = time.monotonic()
        lease = await self._session.call(lambda c: c.lease(self.lease_ttl_s), "lease grant")
        self._lease_id = int(lease.id)
        self._set_lease_until(sent + int(lease.ttl) - FENCE_MARGIN_S)
        self._last_member_publish = 0.0  # the member key goes under the new lease at once
        self._wake.set()
        log.info("%s: lease %x granted (ttl %ss)", self._name, lease.id, lease.ttl)

    async def _refresh(self) -> None:
        lease_id = self._lease_id
        sent = time.monotonic()
        reply = await self._session.call(
            lambda c: c.refresh_lease(lease_id), "lease keepalive", self._refresh_interval_s()
        )
        if lease_id != self._lease_id:
            return  # dropped while the request was out: a late success must not revive it
        ttl_s = int(reply.TTL) if reply is not None else 0
        if ttl_s <= 0:
            self._lease_lost("the lease expired in etcd")
            return
        self._set_lease_until(sent + ttl_s - FENCE_MARGIN_S)

    async def _revoke_old_leases(self) -> None:
        while self._old_leases:
            lease_id = self._old_leases[0]
            revoke = functools.partial(_revoke, lease_id=lease_id)
            try:
                await self._session.call(revoke, "lease revoke")
            except EtcdUnavailable as exc:
                if "not found" not in exc.detail:
                    raise
            self._old_leases.pop(0)

    def _set_lease_until(self, until: float) -> None:
        self.write_lease_until = until
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        delay_s = max(0.0, until - time.monotonic())
        self._fence_timer = asyncio.get_running_loop().call_later(delay_s, self._check_fence)

    def _check_fence(self) -> None:
        if self._lease_id is not None and time.monotonic() >= self.write_lease_until:
            self._lease_lost("the lease was not refreshed in time")

    def _lease_lost(self, reason: str) -> None:
        """Drop the lease (revoked once etcd answers) and, if leading, demote at once."""
        if self._lease_id is not None:
            self._old_leases.append(self._lease_id)
            del self._old_leases[:-OLD_LEASES_MAX]
            log.warning("%s: lease lost: %s", self._name, reason)
        self._lease_id = None
        self._demote(reason)
        self._wake.set()

    def _demote(self, reason: str) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        self._held_raw = None
        self._followed = None
        log.warning(
            "%s: LOST leadership of epoch %d: %s",
            self._name,
            self.epoch,
            reason,
        )
        try:
            self._listener.lost_leadership(reason)
        except Exception:
            log.exception("%s: lost_leadership failed", self._name)

    # -- watch -----------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        backoff_s = BACKOFF_MIN_S
        while not self._stopping:
            try:
                watch = await self._session.call(
                    lambda c: c.watch_prefix(self.keys.prefix), "watch"
                )
                self._problems.resolve("watch")
                backoff_s = BACKOFF_MIN_S
                self._wake.set()  # changes made while no watch was open
                async for _event in watch:
                    self._wake.set()
            except EtcdUnavailable as exc:
                self._problems.report("watch", exc.problem, exc.detail)
            except Exception as exc:  # the stream broke (aetcd raises its own errors here)
                self._problems.report("watch", type(exc).__name__, str(exc))
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)

    # -- the main loop ---------------------------------------------------------------------

    async def _main_loop(self) -> None:
        backoff_s = BACKOFF_MIN_S
        while not self._stopping:
            self._wake.clear()
            try:
                wait_s = await self._pass()
                self._problems.resolve("etcd")
                backoff_s = BACKOFF_MIN_S
            except EtcdUnavailable as exc:
                self._connected = False
                self._problems.report("etcd", exc.problem, exc.detail)
                wait_s = backoff_s
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
            except Exception:
                # a bug here must not take the broker down; the next pass starts afresh
                log.exception("%s: pass failed", self._name)
                wait_s = RESYNC_INTERVAL_S
            self._first_pass.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)

    async def _pass(self) -> float:
        """Read the group, publish this replica's member key when due, act; the next wait."""
        snap = await self._read()
        now = time.monotonic()
        if self._lease_id is not None and now - self._last_member_publish >= (
            MEMBER_PUBLISH_INTERVAL_S
        ):
            await self._publish_member()
        await self._apply(snap)
        wait_s = RESYNC_INTERVAL_S
        if self._campaign_at is not None:
            wait_s = min(wait_s, max(0.0, self._campaign_at - time.monotonic()))
        return wait_s

    async def _read(self) -> Snapshot:
        revision, kvs = await self._session.read_prefix(self.keys.prefix)
        snap = parse_snapshot(self.keys, revision, kvs)
        self._connected = True
        if snap.problems:
            self._problems.report("keys", "undecodable", "; ".join(snap.problems))
        else:
            self._problems.resolve("keys")
        self._snapshot = snap
        self.epoch = max(self.epoch, snap.epoch, snap.leader.epoch if snap.leader else 0)
        if snap.isr is not None and not self.is_leader:
            self._isr = set(snap.isr.replica_ids)
        return snap

    def _member_state(self) -> MemberState:
        state = self._listener.member_state()
        return dataclasses.replace(state, replica_id=self.replica_id)

    async def _publish_member(self) -> None:
        lease_id = self._lease_id
        if lease_id is None:
            return
        raw = encode_member(self._member_state())
        key = self.keys.member(self.replica_id)
        try:
            await self._session.call(lambda c: c.put(key, raw, lease=lease_id), "member publish")
        except EtcdUnavailable as exc:
            if "lease not found" in exc.detail and lease_id == self._lease_id:
                self._lease_lost("etcd no longer knows the lease")
                return
            raise
        self._last_member_publish = time.monotonic()

    async def _apply(self, snap: Snapshot) -> None:
        held = self._held_raw if self.is_leader else None
        view = election.classify_leader(
            self.replica_id, snap.leader_present, snap.leader, snap.leader_raw, held
        )
        if view is not LeaderView.MINE:
            self._demote(f"the leader key is no longer this replica's ({view.value})")
        if view is not LeaderView.NONE:
            self._no_leader_since = None
            self._campaign_at = None
        if view in (LeaderView.MINE, LeaderView.OTHER):
            self._set_leader(snap.leader)
            self._remember_leader_member(snap)
        else:
            self._set_leader(None)
        if view is LeaderView.OTHER and snap.leader is not None and self._followed != snap.leader:
            await self._follow(snap.leader)
        elif view is LeaderView.STALE_MINE and not self._handing_over:
            await self._delete_stale(snap)
        elif view is LeaderView.NONE:
            await self._campaign(snap)

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

    def _set_leader(self, leader: LeaderInfo | None) -> None:
        if leader != self.leader:
            self.leader = leader
            event, self._leader_event = self._leader_event, asyncio.Event()
            event.set()

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

    async def _campaign(self, snap: Snapshot) -> None:
        if self._lease_id is None or time.monotonic() >= self.write_lease_until:
            return  # a leader key needs a live lease to hang on
        now = time.monotonic()
        if self._no_leader_since is None:
            # The leader just vanished (or this is the first look): publish fresh numbers and
            # rank on a new read, so the ranking sees them.
            self._no_leader_since = now
            await self._publish_member()
            self._wake.set()
            return
        me = self._member_state()
        plan = election.plan_campaign(
            me, snap.members, snap.isr, snap.handover, snap.epoch, self.lease_ttl_s
        )
        if plan.verdict is Verdict.NO_CANDIDATE:
            if now - self._last_no_candidate_log >= NO_CANDIDATE_LOG_INTERVAL_S:
                self._last_no_candidate_log = now
                log.warning("%s: no master: %s", self._name, plan.reason)
            return
        if plan.verdict is Verdict.NOT_CANDIDATE:
            self._note(f"not campaigning: {plan.reason}")
            return
        due = self._no_leader_since + plan.delay_ms / 1000
        if now < due:
            self._campaign_at = due
            self._note(f"campaigning in {plan.delay_ms} ms ({plan.reason})")
            return
        self._campaign_at = None
        await self._try_win(snap, plan)

    def _note(self, note: str) -> None:
        if note != self._last_plan_note:
            self._last_plan_note = note
            log.info("%s: %s", self._name, note)

    async def _try_win(self, snap: Snapshot, plan: election.CampaignPlan) -> None:
        lease_id = self._lease_id
        new_epoch = snap.epoch + 1
        leader = LeaderInfo(self.replica_id, self.addr, new_epoch)
        raw = encode_leader(leader)
        isr = IsrRecord(new_epoch, election.isr_after_win(self.replica_id))
        k = self.keys
        won = await self._session.txn(
            [tx.Version(k.leader) == 0, tx.Mod(k.epoch) == snap.epoch_mod_revision],
            [
                tx.Put(k.leader, raw, lease=lease_id),
                tx.Put(k.epoch, encode_epoch(new_epoch)),
                tx.Put(k.isr, encode_isr(isr)),
                tx.Delete(k.handover),
            ],
            "election",
        )
        if not won:
            log.info("%s: lost the race for epoch %d", self._name, new_epoch)
            self._wake.set()
            return
        if lease_id != self._lease_id:
            self._wake.set()  # the lease was dropped meanwhile: the key is stale, delete it
            return
        self._win(leader, raw, isr, plan)
        await self._become_master(new_epoch)

    def _win(
        self, leader: LeaderInfo, raw: bytes, isr: IsrRecord, plan: election.CampaignPlan
    ) -> None:
        self.is_leader = True
        self._held_raw = raw
        self.epoch = leader.epoch
        self._isr = set(isr.replica_ids)
        self._followed = None
        self._no_leader_since = None
        previous = self._last_leader_member
        self.old_master_replica_id = previous.replica_id if previous else None
        self.old_master_max_offset = previous.max_offset if previous else None
        self._set_leader(leader)
        log.warning(
            "%s: ELECTED master in epoch %d (%s of ranking %s; previous "
            "master %s last published max offset %s)",
            self._name,
            leader.epoch,
            plan.reason,
            plan.describe_ranking(),
            self.old_master_replica_id,
            self.old_master_max_offset,
        )

    async def _become_master(self, epoch: int) -> None:
        if not await self._notify(self._listener.become_master(epoch), "become_master"):
            # a master that could not switch must not hold the key: give it up
            self._demote("become_master failed")
            self._wake.set()


async def _revoke(client: Any, lease_id: int) -> None:
    await client.revoke_lease(lease_id)
