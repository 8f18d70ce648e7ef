"""Automatic failover through etcd (controller mode, DESIGN.md §6): each replica's lease, the
group's election, the in-sync replica record and the write fence. The broker wires an
:class:`EtcdController` with a :class:`ControllerListener` that switches its role."""

from services.broker.controller.etcd_controller import ControllerListener, EtcdController
from services.broker.controller.keys import LeaderInfo, MemberState

__all__ = ["ControllerListener", "EtcdController", "LeaderInfo", "MemberState"]
