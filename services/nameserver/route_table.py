"""The nameserver's route tables (SPEC §2.2): which broker groups host which topic, who is alive.

Everything lives in memory and nothing is persisted (SPEC §2.1): a restarted nameserver is full
again within one registration period (30 s), because every broker re-registers with it.

| table            | key                      | value                                             |
|------------------|--------------------------|---------------------------------------------------|
| ``_clusters``    | cluster name             | names of the broker groups in it                  |
| ``_groups``      | broker (group) name      | cluster + {broker id: address}, live brokers only |
| ``_live``        | broker address           | last registration, timeout, data version, epoch   |
| ``_topics``      | topic → broker name      | the queue data that group's master registered     |
| ``_group_topics``| broker name              | topics of ``_topics`` the group hosts (an index)  |

Rules, and why:

- A broker is identified by its address: one process, one gRPC endpoint. If an address comes
  back under another name or id (a slave promoted, a pod reused), its old identity is dropped.
- Only the master (broker id 0) says what a group hosts. Its registration *replaces* the group's
  queue data, so a topic deleted on the broker disappears here on the next heartbeat. Slaves
  hold copies of the master's topics; their registration only adds their address.
- The queue data of a group lives as long as the group has any live member. When the master goes
  but slaves remain, routes keep the group with its slaves and without the write bit in ``perm``,
  so consumers keep reading from the slaves (DESIGN.md §6) and producers do not pick queues that
  no master can take. When the last member goes, the group, its queue data and an emptied
  cluster go with it.
- Expiry compares *monotonic* time, so a wall-clock jump cannot expire every broker at once;
  the wall-clock time is kept only to report ``last_update_timestamp_ms``.
- Failover epochs (DESIGN.md §6): a master registration whose epoch is older than the live
  master's at another address is refused; the old master has not noticed it was replaced.
  An equal epoch wins (static roles all have epoch 0, and a restarted master may get a new port).
- Every master registration rebuilds the group's queue data, even when its data version is
  unchanged: the broker masks topic perms with its own ``brokerPermission`` (drained brokers,
  SPEC §2.4) without bumping the version, and a rebuild costs no more than comparing would.
- User topics may register perm 0 (besides 2, 4, 6): a write-only topic on a broker drained to
  read-only masks to 0, and refusing it would refuse the whole heartbeat.

Requests arrive validated by :func:`check_register` (called by :meth:`RouteTable.register`);
errors are :class:`~services.common.errors.ServiceError` with the status the proto documents.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from rocketq._api.rocketq.v1 import common_pb2, nameserver_pb2
from rocketq.validation import (
    PERM_WRITE,
    check_group,
    check_perm,
    check_queue_nums,
    check_topic,
    is_system_topic,
)
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import invalid, precondition

log = logging.getLogger(__name__)

MASTER_ID = 0
DEFAULT_HEARTBEAT_TIMEOUT_MS = 120_000
"""How long a broker stays without a registration when it does not say (SPEC §2.4)."""
HEARTBEAT_TIMEOUT_MAX_MS = 24 * 3600 * 1000
"""Ceiling of a broker's own heartbeat timeout: a day, so a typo cannot make a broker immortal."""
ADDR_MAX_CHARS = 255
PERM_ALL_BITS = 7
"""inherit | read | write: the widest perm a system topic (e.g. TBW102) may carry."""


@dataclass(frozen=True)
class QueueData:
    """What one broker group's master registered for one topic."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    message_type: int = 0
    """common_pb2.TopicMessageType (unset = MIXED), for the v2 gateways' routes."""


@dataclass
class _Group:
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)


@dataclass
class _Live:
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    last_update_ms: int
    last_update_mono_s: float
    heartbeat_timeout_ms: int
    data_version: tuple[int, int]
    ha_server_addr: str
    epoch: int
    gateway_addr: str = ""


@dataclass(frozen=True)
class RemovedBroker:
    """A broker taken out of the tables, and why; the caller logs it."""

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    reason: str
    """"expired", "unregistered" or "replaced" (another process took its id or address)."""
    silent_ms: int = 0
    """How long it had not registered, for "expired"."""


def check_register(request: nameserver_pb2.RegisterBrokerRequest) -> None:
    """Raise INVALID_ARGUMENT (ILLEGAL_ARGUMENT) for anything the proto calls invalid."""
    _check_identity(request.cluster_name, request.broker_name, request.broker_addr)
    if request.broker_id < 0:
        _illegal(f"broker_id is {request.broker_id}; use 0 for a master or >= 1 for a slave")
    if request.ha_server_addr:
        _check_addr(request.ha_server_addr, "ha_server_addr")
    if request.gateway_addr:
        _check_addr(request.gateway_addr, "gateway_addr")
    if request.HasField("heartbeat_timeout_ms") and not (
        1 <= request.heartbeat_timeout_ms <= HEARTBEAT_TIMEOUT_MAX_MS
    ):
        _illegal(
            f"heartbeat_timeout_ms is {request.heartbeat_timeout_ms}; "
            f"it must be between 1 and {HEARTBEAT_TIMEOUT_MAX_MS} (leave it unset for 120000)"
        )
    if request.epoch < 0:
        _illegal(f"epoch is {request.epoch}; it must be >= 0 (0 when roles are static)")
    # RocketMQ treats the cluster's and the broker's own names as system topics too.
    own_names = (request.cluster_name, request.broker_name)
    seen: set[str] = set()
    for cfg in request.topic_configs:
        _check_topic_config(
            cfg, system=is_system_topic(cfg.topic_name) or cfg.topic_name in own_names
        )
        if cfg.topic_name in seen:
            _illegal(
                f"topic {cfg.topic_name!r} appears twice in topic_configs", topic=cfg.topic_name
            )
        seen.add(cfg.topic_name)


def check_unregister(request: nameserver_pb2.UnregisterBrokerRequest) -> None:
    """Raise INVALID_ARGUMENT for an empty or malformed name or address."""
    _check_identity(request.cluster_name, request.broker_name, request.broker_addr)


def check_cluster_filter(cluster_name: str) -> None:
    """An empty filter means all clusters; anything else must be a well-formed name."""
    if cluster_name:
        _checked(check_group, cluster_name, "cluster")


class RouteTable:
    """The nameserver's state; every method runs on the event loop, so no locks."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._clusters: dict[str, set[str]] = {}
        self._groups: dict[str, _Group] = {}
        self._live: dict[str, _Live] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._group_topics: dict[str, set[str]] = {}

    # -- writes ----------------------------------------------------------------------------------
    def register(self, request: nameserver_pb2.RegisterBrokerRequest) -> tuple[str, str]:
        """Record a registration (the heartbeat); return (master_addr, master_ha_addr) for slaves.

        Both are empty for a master, and for a slave whose group has no live master.
        """
        check_register(request)
        name, broker_id, addr = request.broker_name, request.broker_id, request.broker_addr
        if broker_id == MASTER_ID:
            self._check_epoch(request)
        old = self._live.get(addr)
        if old is not None and (old.broker_name, old.broker_id) != (name, broker_id):
            self._log_removed(self._remove(addr, "replaced"))
            old = None
        group = self._join_group(request.cluster_name, name)
        displaced = group.addrs.get(broker_id)
        if displaced is not None and displaced != addr:
            # Another process held this id (a restarted broker on a new port, or a failover);
            # the newest registration wins, the old entry would only mislead clients.
            self._live.pop(displaced, None)
            log.warning("broker %s id %d moved from %s to %s", name, broker_id, displaced, addr)
        group.addrs[broker_id] = addr
        if broker_id == MASTER_ID:
            self._replace_queue_data(name, request.topic_configs)
        self._live[addr] = _Live(
            cluster=request.cluster_name,
            broker_name=name,
            broker_id=broker_id,
            broker_addr=addr,
            last_update_ms=self._clock.now_ms(),
            last_update_mono_s=self._clock.monotonic_s(),
            heartbeat_timeout_ms=(
                request.heartbeat_timeout_ms
                if request.HasField("heartbeat_timeout_ms")
                else DEFAULT_HEARTBEAT_TIMEOUT_MS
            ),
            data_version=(request.data_version.timestamp_ms, request.data_version.counter),
            ha_server_addr=request.ha_server_addr,
            epoch=request.epoch,
            gateway_addr=request.gateway_addr,
        )
        if old is None:
            log.info(
                "broker registered cluster=%s broker=%s id=%d addr=%s topics=%d epoch=%d",
                request.cluster_name, name, broker_id, addr, len(request.topic_configs),
                request.epoch,
            )  # fmt: skip
        if broker_id == MASTER_ID:
            return "", ""
        master_addr = group.addrs.get(MASTER_ID, "")
        master = self._live.get(master_addr)
        return master_addr, master.ha_server_addr if master is not None else ""

    def unregister(self, request: nameserver_pb2.UnregisterBrokerRequest) -> RemovedBroker | None:
        """Remove the broker at once; None (not an error) if it is not registered as that broker."""
        check_unregister(request)
        live = self._live.get(request.broker_addr)
        if live is None or (live.broker_name, live.broker_id) != (
            request.broker_name,
            request.broker_id,
        ):
            return None
        return self._remove(request.broker_addr, "unregistered")

    def scan_expired(self) -> list[RemovedBroker]:
        """Remove every broker silent for longer than its heartbeat timeout (run every 10 s)."""
        now_s = self._clock.monotonic_s()
        removed = []
        for addr, live in list(self._live.items()):
            silent_ms = int((now_s - live.last_update_mono_s) * 1000)
            if silent_ms > live.heartbeat_timeout_ms:
                gone = self._remove(addr, "expired", silent_ms)
                if gone is not None:
                    removed.append(gone)
        return removed

    # -- reads -----------------------------------------------------------------------------------
    def route(self, topic: str) -> nameserver_pb2.TopicRouteData | None:
        """The topic's live broker groups sorted by name, or None if no live broker hosts it."""
        _checked(check_topic, topic)
        route = nameserver_pb2.TopicRouteData()
        for name, qd in sorted(self._topics.get(topic, {}).items()):
            group = self._groups.get(name)
            if group is None or not group.addrs:
                continue  # cannot happen while the invariants hold; never route to nobody
            perm = qd.perm if MASTER_ID in group.addrs else qd.perm & ~PERM_WRITE
            route.queues.append(
                nameserver_pb2.QueueData(
                    broker_name=name,
                    read_queue_nums=qd.read_queue_nums,
                    write_queue_nums=qd.write_queue_nums,
                    perm=perm,
                    topic_sys_flag=qd.topic_sys_flag,
                    message_type=qd.message_type,  # type: ignore[arg-type]
                )
            )
            route.brokers.append(self._broker_data(name, group))
        return route if route.queues else None

    def cluster_info(self) -> nameserver_pb2.GetClusterInfoResponse:
        """Every cluster, group and live broker, as GetClusterInfo returns them."""
        resp = nameserver_pb2.GetClusterInfoResponse()
        for name, group in self._groups.items():
            resp.broker_addr_table[name].CopyFrom(self._broker_data(name, group))
        for cluster, names in self._clusters.items():
            resp.cluster_addr_table[cluster].broker_names.extend(sorted(names))
        for live in sorted(self._live.values(), key=lambda lv: (lv.broker_name, lv.broker_id)):
            resp.live_brokers.append(
                nameserver_pb2.BrokerLiveInfo(
                    broker_addr=live.broker_addr,
                    broker_name=live.broker_name,
                    broker_id=live.broker_id,
                    last_update_timestamp_ms=live.last_update_ms,
                    heartbeat_timeout_ms=live.heartbeat_timeout_ms,
                    data_version=common_pb2.DataVersion(
                        timestamp_ms=live.data_version[0], counter=live.data_version[1]
                    ),
                    ha_server_addr=live.ha_server_addr,
                    epoch=live.epoch,
                )
            )
        return resp

    def all_topics(self, cluster_name: str = "") -> list[str]:
        """Sorted names of topics hosted by live brokers, optionally of one cluster only."""
        check_cluster_filter(cluster_name)
        if not cluster_name:
            return sorted(self._topics)
        names = self._clusters.get(cluster_name, set())
        return sorted(t for t, hosts in self._topics.items() if not names.isdisjoint(hosts))

    # -- internals -------------------------------------------------------------------------------
    def _check_epoch(self, request: nameserver_pb2.RegisterBrokerRequest) -> None:
        group = self._groups.get(request.broker_name)
        master_addr = group.addrs.get(MASTER_ID) if group is not None else None
        if master_addr is None or master_addr == request.broker_addr:
            return
        master = self._live.get(master_addr)
        if master is not None and request.epoch < master.epoch:
            precondition(
                f"broker {request.broker_name} at {request.broker_addr} claims master with "
                f"epoch {request.epoch}, but {master_addr} is master with epoch {master.epoch}; "
                "the group failed over, rejoin as a slave",
                broker_name=request.broker_name,
                master_addr=master_addr,
                master_epoch=master.epoch,
            )

    def _join_group(self, cluster: str, name: str) -> _Group:
        group = self._groups.get(name)
        if group is None:
            group = self._groups[name] = _Group(cluster)
        elif group.cluster != cluster:
            log.warning("broker group %s moved from cluster %s to %s", name, group.cluster, cluster)
            self._leave_cluster(group.cluster, name)
            group.cluster = cluster
        self._clusters.setdefault(cluster, set()).add(name)
        return group

    def _leave_cluster(self, cluster: str, name: str) -> None:
        names = self._clusters.get(cluster)
        if names is not None:
            names.discard(name)
            if not names:
                del self._clusters[cluster]

    def _replace_queue_data(self, name: str, configs: Iterable[common_pb2.TopicConfig]) -> None:
        new = {
            cfg.topic_name: QueueData(
                cfg.read_queue_nums,
                cfg.write_queue_nums,
                cfg.perm,
                cfg.topic_sys_flag,
                cfg.message_type,
            )
            for cfg in configs
        }
        for topic in self._group_topics.get(name, set()) - new.keys():
            self._drop_queue_data(topic, name)
        for topic, qd in new.items():
            self._topics.setdefault(topic, {})[name] = qd
        self._group_topics[name] = set(new)

    def _drop_queue_data(self, topic: str, name: str) -> None:
        hosts = self._topics.get(topic)
        if hosts is not None:
            hosts.pop(name, None)
            if not hosts:
                del self._topics[topic]

    def _remove(self, addr: str, reason: str, silent_ms: int = 0) -> RemovedBroker | None:
        live = self._live.pop(addr, None)
        if live is None:
            return None
        group = self._groups.get(live.broker_name)
        if group is not None:
            if group.addrs.get(live.broker_id) == addr:
                del group.addrs[live.broker_id]
            if not group.addrs:
                del self._groups[live.broker_name]
                self._leave_cluster(group.cluster, live.broker_name)
                for topic in self._group_topics.pop(live.broker_name, set()):
                    self._drop_queue_data(topic, live.broker_name)
        return RemovedBroker(
            live.cluster, live.broker_name, live.broker_id, addr, reason, silent_ms
        )

    def _broker_data(self, name: str, group: _Group) -> nameserver_pb2.BrokerData:
        gateways = {
            bid: live.gateway_addr
            for bid, addr in group.addrs.items()
            if (live := self._live.get(addr)) is not None and live.gateway_addr
        }
        return nameserver_pb2.BrokerData(
            cluster=group.cluster,
            broker_name=name,
            broker_addrs=group.addrs,
            gateway_addrs=gateways,
        )

    @staticmethod
    def _log_removed(removed: RemovedBroker | None) -> None:
        if removed is not None:
            log_removed(removed)


def log_removed(removed: RemovedBroker) -> None:
    """One structured line per removed broker."""
    log.info(
        "broker removed reason=%s cluster=%s broker=%s id=%d addr=%s silent_ms=%d",
        removed.reason, removed.cluster, removed.broker_name, removed.broker_id,
        removed.broker_addr, removed.silent_ms,
    )  # fmt: skip


# -- validation helpers ---------------------------------------------------------------------------
def _illegal(message: str, **metadata: object) -> NoReturn:
    invalid(common_pb2.ILLEGAL_ARGUMENT, message, **metadata)


def _checked(check: Callable[..., None], *args: str) -> None:
    """Run a rocketq.validation check; its ValueError becomes INVALID_ARGUMENT."""
    try:
        check(*args)
    except ValueError as exc:
        _illegal(str(exc))


def _check_identity(cluster_name: str, broker_name: str, broker_addr: str) -> None:
    _checked(check_group, cluster_name, "cluster")
    _checked(check_group, broker_name, "broker")
    _check_addr(broker_addr, "broker_addr")


def _check_addr(addr: str, what: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not addr:
        _illegal(f"{what} is empty; give the broker's gRPC address as host:port")
    if (
        len(addr) > ADDR_MAX_CHARS
        or not sep
        or not host
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
    ):
        _illegal(f"{what} {addr[:ADDR_MAX_CHARS]!r} is not host:port with a port in 1..65535")


def _check_topic_config(cfg: common_pb2.TopicConfig, *, system: bool) -> None:
    try:
        check_topic(cfg.topic_name)
        check_queue_nums(cfg.read_queue_nums, cfg.write_queue_nums)
        if system:
            if not 0 <= cfg.perm <= PERM_ALL_BITS:
                raise ValueError(f"perm is {cfg.perm}; a system topic's perm must be in 0..7")
        elif cfg.perm != 0:  # 0: see the module docstring (a masked, drained topic)
            check_perm(cfg.perm)
    except ValueError as exc:
        _illegal(f"topic config {cfg.topic_name!r}: {exc}", topic=cfg.topic_name)
