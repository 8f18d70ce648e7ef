"""Admin.Switchover: hand the master role to an in-sync slave, for maintenance (admin.proto).

On the master, in controller mode::

    pick the target (given, or the in-sync slave with the highest ack) ── not eligible:
                                                                          FAILED_PRECONDITION
    fence writes (RoleManager.handing_over: is_master turns False)
    wait until the target acked the master's max offset               ── timeout: unfence,
                                                                          DEADLINE_EXCEEDED
    controller.handover(target): put P/handover, delete P/leader,
    wait for the new leader key                                        ── answer its id/addr/epoch

Fencing first makes the max offset final (an append and its is_master check run in one event
loop step), so "the target has every byte" is a fixed goal. The old master becomes the new
one's slave through the controller's ``become_slave``. Sends still waiting for replication
when the fence goes up are answered NOT_MASTER (they may or may not be stored: resend).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from services.broker.roles import RoleManager
from services.common.errors import ServiceError, invalid, precondition

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 10_000
TIMEOUT_MAX_MS = 120_000
CATCHUP_POLL_S = 0.01
"""How often the target's ack is looked at while waiting (acks arrive ~every ms under load)."""


def _not_master(roles: RoleManager) -> ServiceError:
    cfg = roles.config
    leader = roles.leader
    where = f"; the master is at {leader.addr}" if leader is not None else ""
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        common_pb2.NOT_MASTER,
        f"replica {cfg.replica_id} of {cfg.broker_name} is not the master{where}",
    )


def pick_target(roles: RoleManager, wanted: int) -> int:
    """The replica to hand over to: ``wanted`` (0 = the in-sync slave with the highest ack) if
    it is an eligible live member of the ISR in etcd (the controller's handover candidates)
    with an in-sync stream to this master; else FAILED_PRECONDITION."""
    assert roles.controller is not None
    cfg = roles.config
    isr = roles.controller.isr()
    links = roles.replication.tracker.links
    eligible = {m.replica_id for m in roles.controller.handover_candidates()}
    ready = {
        rid: link.acked_offset
        for rid, link in links.items()
        if link.in_sync and rid in isr and rid in eligible and rid != cfg.replica_id
    }
    if wanted == 0 and ready:
        return min(ready, key=lambda rid: (-ready[rid], rid))
    if wanted in ready:
        return wanted
    precondition(
        f"replica {wanted or '(any)'} is not an eligible in-sync replica of {cfg.broker_name}: "
        f"the in-sync set in etcd is {sorted(isr)}, in sync with this master now: "
        f"{sorted(ready) or 'none'}",
        broker_name=cfg.broker_name,
    )


async def switchover(
    request: admin_pb2.SwitchoverRequest, roles: RoleManager
) -> admin_pb2.SwitchoverResponse:
    """Admin.Switchover on this broker (see the module doc); raises ServiceError."""
    cfg = roles.config
    if not cfg.controller_mode or roles.controller is None:
        precondition("switchover needs controller mode (etcdEndpoints set on every replica)")
    if request.target_replica_id < 0:
        invalid(common_pb2.ILLEGAL_ARGUMENT, "target_replica_id must be >= 0")
    timeout_ms = request.timeout_ms if request.HasField("timeout_ms") else DEFAULT_TIMEOUT_MS
    if not 1 <= timeout_ms <= TIMEOUT_MAX_MS:
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"timeout_ms must be 1..{TIMEOUT_MAX_MS}")
    if not cfg.is_master or roles.handing_over:
        raise _not_master(roles)
    target = pick_target(roles, request.target_replica_id)
    deadline = time.monotonic() + timeout_ms / 1000
    roles.handing_over = True  # the fence: no write is acknowledged from here
    goal = roles.store.commitlog.max_offset
    log.warning("switchover to replica %d: writes fenced at offset %d", target, goal)
    try:
        await _wait_caught_up(roles, target, goal, deadline)
        remaining_s = max(0.001, deadline - time.monotonic())
        leader = await asyncio.wait_for(roles.controller.handover(target), remaining_s)
    except BaseException as exc:
        if roles.role == "master":
            roles.handing_over = False
        if isinstance(exc, TimeoutError):
            raise ServiceError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"replica {target} was not elected within {timeout_ms} ms; nothing changed, "
                "this master acknowledges writes again",
            ) from None
        raise
    log.warning("switchover done: replica %d leads epoch %d", leader.replica_id, leader.epoch)
    return admin_pb2.SwitchoverResponse(
        new_master_replica_id=leader.replica_id,
        new_master_addr=leader.addr,
        epoch=leader.epoch,
    )


async def _wait_caught_up(roles: RoleManager, target: int, goal: int, deadline: float) -> None:
    """Until ``target``'s stream acked ``goal``; TimeoutError at ``deadline``."""
    tracker = roles.replication.tracker
    while True:
        link = tracker.links.get(target)
        if link is not None and link.acked_offset >= goal:
            return
        if time.monotonic() >= deadline:
            acked = link.acked_offset if link is not None else "nothing (not connected)"
            raise ServiceError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"replica {target} acked {acked} of {goal} bytes in time; nothing changed, "
                "this master acknowledges writes again",
            )
        await asyncio.sleep(CATCHUP_POLL_S)
