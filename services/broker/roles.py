"""Runtime role switches in controller mode: the broker side of the etcd election (DESIGN.md §6).

:class:`RoleManager` is the controller's listener (``services.broker.controller``): the
controller elects, this module turns the outcome into what the broker does. Every component
already reads ``config.is_master`` at call time, so a switch is: mutate the config, then start
or stop what is role-specific.

| role      | config                                        | runs                                 |
|-----------|-----------------------------------------------|--------------------------------------|
| candidate | ``broker_id = replica_id``, role ``SLAVE``    | nothing role-specific (no leader     |
|           |                                               | known yet, or just lost the lease)   |
| slave     | same                                          | replication client to the leader,    |
|           |                                               | config sync, slave offset commits    |
| master    | ``broker_id = 0``, role = the configured      | replication service (streams, ISR    |
|           | SYNC_MASTER / ASYNC_MASTER; the lease fence   | publishing, SYNC_MASTER waits)       |

**become_master(epoch)**, in this order: stop replicating (drop a partial tail), append
(epoch, max offset) to the epoch history, rebuild the transaction index, start the master's
replication side (empty in-sync set, the previous ISR retained, see ``ha_tracker``), *then*
flip the config (writes are accepted from here), and re-register with the nameservers as
brokerId 0 (the old identity unregistered first). Clients learn of it from their routes.

**Demotion** (a new leader, or the lease lost while leading: ``lost_leadership``, which is
synchronous so that it runs before any other callback): flip the config first (no write is
accepted from then on), fail SYNC_MASTER waiters with NOT_MASTER, end the slaves' streams,
bound reads at what was confirmed; then, with a leader known, replicate from it: its TruncateTo
cuts a divergent tail off this store (the epoch histories say where).

**The write fence.** ``config.write_fence`` is :meth:`RoleManager.fence`: the controller's
lease fence, and off while a switchover hands over (``switchover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from rocketq._api.rocketq.v1 import admin_pb2
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.controller.keys import LeaderInfo, MemberState
from services.broker.ha_config_sync import ConfigSync, SlaveOffsetCommits
from services.broker.ha_master import ReplicationService
from services.broker.ha_slave import ReplicationClient
from services.broker.transaction_half import TransactionIndex
from services.store.message_store import MessageStore

log = logging.getLogger(__name__)

SLAVE_STOP_TIMEOUT_S = 5.0
"""Bound on waiting for the replication tasks to end on a promotion."""


class Controller(Protocol):
    """What this module uses of ``services.broker.controller``'s EtcdController."""

    epoch: int
    leader: LeaderInfo | None
    is_leader: bool

    def write_fence(self) -> bool: ...
    def lease_remaining_ms(self) -> int: ...
    def isr(self) -> set[int]: ...
    async def publish_isr(self, replica_ids: set[int]) -> bool: ...
    async def handover(self, target_replica_id: int) -> LeaderInfo: ...
    def handover_candidates(self) -> list[MemberState]: ...
    def status(self) -> dict[str, object]: ...


class SlaveRunner(Protocol):
    """The slave-only tasks (:class:`SlaveSide`; a fake in unit tests)."""

    @property
    def running(self) -> bool: ...
    def start(self) -> None: ...
    def repoint(self) -> None: ...
    async def stop(self) -> None: ...
    def promoted(self) -> None: ...


class SlaveSide:
    """Replication client + config sync + slave offset commits, started and stopped as one."""

    def __init__(
        self, client: ReplicationClient, config_sync: ConfigSync, commits: SlaveOffsetCommits
    ) -> None:
        self.client = client
        self.config_sync = config_sync
        self.commits = commits
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def running(self) -> bool:
        return len(self._tasks) == 2 and all(not t.done() for t in self._tasks)

    def start(self) -> None:
        """Replicate from the current leader (the client's ``master_addr`` reads it); a task
        that ended (it should not) is started again."""
        client_task: asyncio.Task[None] | None = None
        sync_task: asyncio.Task[None] | None = None
        if self._tasks:
            client_task, sync_task = self._tasks
        if client_task is None or client_task.done():
            self.client.reopen()
            client_task = asyncio.create_task(_guarded(self.client.run()), name="ha-slave")
        else:
            self.client.repoint()
        self.config_sync.reset()
        if sync_task is None or sync_task.done():
            sync_task = asyncio.create_task(_guarded(self.config_sync.run()), name="ha-sync")
        else:
            self.config_sync.wake()
        self._tasks = [client_task, sync_task]

    def repoint(self) -> None:
        """The leader changed: follow it now."""
        self.client.repoint()
        self.config_sync.reset()
        self.config_sync.wake()

    async def stop(self) -> None:
        """End the stream and the sync loop (bounded wait)."""
        self.client.close()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=SLAVE_STOP_TIMEOUT_S)
            if stuck:
                log.error("%d replication task(s) did not stop in time", len(stuck))
        with contextlib.suppress(Exception):
            await self.config_sync.close()

    def promoted(self) -> None:
        """Offsets committed here while a slave are this master's own now."""
        with contextlib.suppress(OSError):
            self.commits.clear()


async def _guarded(coro: Awaitable[None]) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("replication task failed")


class RoleManager:
    """The controller's listener: switches this broker between candidate, slave and master."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        replication: ReplicationService,
        slave: SlaveRunner,
        addr: str,
        transactions: TransactionIndex,
        offsets: ConsumerOffsetManager,
        reregister: Callable[[int], Awaitable[None]],
    ) -> None:
        """``reregister(old_broker_id)``: unregister that id from the nameservers and register
        under the config's current one."""
        self.config = config
        self.store = store
        self.replication = replication
        self.slave = slave
        self.addr = addr
        self.transactions = transactions
        self.offsets = offsets
        self._reregister = reregister
        self.master_role = config.broker_role
        """How the group replicates while this replica leads (SLAVE = an observer)."""
        self.controller: Controller | None = None
        self.role = "candidate"
        self.epoch = 0
        """The epoch this replica leads in, or its leader's."""
        self.leader: LeaderInfo | None = None
        """The last leader seen (this replica while it leads)."""
        self.handing_over = False
        """A switchover fenced writes (``switchover``)."""
        self.possibly_lost_bytes = 0
        """On the last promotion: the old master's last published max offset minus ours."""
        self.transitions = 0
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        # Controller mode starts as a candidate slave: whoever is elected registers as 0.
        config.broker_id = config.replica_id
        config.broker_role = "SLAVE"

    def attach(self, controller: Controller) -> None:
        """Use ``controller`` (before it starts): its lease fences writes."""
        self.controller = controller
        self.config.write_fence = self.fence

    def fence(self) -> bool:
        """True while writes may be acknowledged: the lease is valid and no handover runs."""
        c = self.controller
        return c is not None and not self.handing_over and c.write_fence()

    @property
    def eligible(self) -> bool:
        return self.master_role != "SLAVE"

    def master_addr(self) -> str:
        """The leader's address for the replication client and config sync ("" = none)."""
        leader = self.leader
        if leader is None or leader.replica_id == self.config.replica_id:
            return ""
        return leader.addr

    # -- ControllerListener ----------------------------------------------------------------
    async def become_master(self, epoch: int) -> None:
        async with self._lock:
            await self._promote(epoch)

    async def _promote(self, epoch: int) -> None:
        cfg, store = self.config, self.store
        if self.role == "master" and self.epoch == epoch:
            return
        if not self.eligible:
            log.error("elected in epoch %d but brokerRole is SLAVE (an observer); ignoring", epoch)
            return
        old = self.leader
        old_leader = old.replica_id if old is not None and old.replica_id != cfg.replica_id else -1
        await self.slave.stop()
        store.replica.drop_partial()
        last = store.epochs.last_epoch
        if last is None or epoch > last:
            store.epochs.append(epoch, store.commitlog.max_offset)
        else:
            log.error("elected in epoch %d but the store's history already has %d", epoch, last)
        await self.transactions.rebuild_async(store, self.offsets)
        controller = self.controller
        if controller is None or not controller.is_leader:
            log.warning("leadership of epoch %d lost while taking over; staying a slave", epoch)
            return
        self.replication.promote(controller.publish_isr, set(controller.isr()), old_leader)
        self.epoch = epoch
        self.leader = LeaderInfo(cfg.replica_id, self.addr, epoch)
        self.handing_over = False
        self.role = "master"
        self.transitions += 1
        cfg.broker_role = self.master_role  # writes are accepted from here (with the fence)
        cfg.broker_id = 0
        self.slave.promoted()
        self._report_loss(controller)
        log.warning(
            "replica %d is the master of %s in epoch %d (commitlog max %d)",
            cfg.replica_id,
            cfg.broker_name,
            epoch,
            store.commitlog.max_offset,
        )
        await self._reregister(cfg.replica_id)

    def _report_loss(self, controller: Controller) -> None:
        old_max = getattr(controller, "old_master_max_offset", None)
        ours = self.store.commitlog.max_offset
        lost = old_max - ours if isinstance(old_max, int) and old_max > ours else 0
        self.possibly_lost_bytes = lost
        if lost and self.master_role == "ASYNC_MASTER":
            log.warning(
                "the old master last published max offset %d, this replica has %d: up to %d "
                "acknowledged bytes possibly lost (ASYNC_MASTER)",
                old_max,
                ours,
                lost,
            )

    async def become_slave(self, leader: LeaderInfo) -> None:
        async with self._lock:
            if leader.replica_id == self.config.replica_id:
                log.error("told to follow myself (leader %s); ignoring", leader)
                return
            old_id = self.config.broker_id
            if self.role == "master":
                self._demote_now(f"replica {leader.replica_id} leads epoch {leader.epoch}")
            self.leader = leader
            self.epoch = leader.epoch
            await self.replication.demote()
            if self.role != "slave":
                self.role = "slave"
                self.transitions += 1
                log.info("following master %d at %s (epoch %d)", *_leader(leader))
            self.slave.start()  # or follow the new leader if already replicating
            if old_id != self.config.broker_id:
                await self._reregister(old_id)

    def lost_leadership(self, reason: str) -> None:
        if self.role != "master":
            return
        old_id = self.config.broker_id
        self._demote_now(reason)
        task = asyncio.get_running_loop().create_task(self._after_lost(old_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _after_lost(self, old_id: int) -> None:
        async with self._lock:
            try:
                await self.replication.demote()
                if old_id != self.config.broker_id:
                    await self._reregister(old_id)
            except Exception:
                log.exception("stepping down after losing the lease failed")

    def _demote_now(self, reason: str) -> None:
        """The synchronous part of stepping down: no write is acknowledged after this."""
        cfg = self.config
        cfg.broker_id = cfg.replica_id
        cfg.broker_role = "SLAVE"
        self.role = "candidate"
        self.handing_over = False
        self.transitions += 1
        visible = self.replication.demote_now()
        self.store.set_confirm_offset(min(visible, self.store.commitlog.max_offset))
        log.warning("replica %d stepped down as master of %s: %s", *_me(cfg), reason)

    def member_state(self) -> MemberState:
        cfg, store = self.config, self.store
        return MemberState(
            replica_id=cfg.replica_id,
            addr=self.addr,
            max_offset=store.replica_dispatched_offset,
            last_epoch=store.epochs.last_epoch or 0,
            priority=cfg.broker_election_priority,
            eligible=self.eligible,
        )

    # -- lifecycle and stats ---------------------------------------------------------------
    async def stop(self) -> None:
        """Shutdown: stop the slave side and any step-down still running."""
        for task in list(self._background):
            task.cancel()
        await self.slave.stop()

    def fill_stats(self, resp: admin_pb2.GetRuntimeStatsResponse) -> None:
        """The controller fields of GetRuntimeStats (admin_service calls this)."""
        resp.replica_id = self.config.replica_id
        resp.controller_mode = True
        c = self.controller
        if c is None:
            return
        resp.in_sync_replica_ids.extend(sorted(c.isr()))
        resp.lease_remaining_ms = max(0, c.lease_remaining_ms())
        resp.leader_addr = c.leader.addr if c.leader is not None else ""
        resp.extra["controller_role"] = self.role
        resp.extra["controller_epoch"] = str(c.epoch)
        resp.extra["possibly_lost_bytes"] = str(self.possibly_lost_bytes)


def _leader(leader: LeaderInfo) -> tuple[int, str, int]:
    return leader.replica_id, leader.addr, leader.epoch


def _me(cfg: BrokerConfig) -> tuple[int, str]:
    return cfg.replica_id, cfg.broker_name
