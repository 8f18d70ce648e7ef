"""Admin's runtime side: applying UpdateBrokerConfig changes in place and GetRuntimeStats.

Split out of ``admin_service`` (which routes the RPCs) because both read across the whole
broker: the store's copied settings, replication, controller roles and transaction counters.

| piece             | what it does                                                           |
|-------------------|------------------------------------------------------------------------|
| ``apply_config``  | validates every change (``RANGES`` beyond ``BrokerConfig.validate``),  |
|                   | persists it (broker.properties), applies it in place, pushes the store |
|                   | fields into the running store; nothing applies if one change is bad    |
| ``runtime_stats`` | role, epoch, offsets (confirm offset from replication), throughput,    |
|                   | disk use, slaves, controller fields and every extra-stats provider     |
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from rocketq import __version__
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from services.broker.config import KEYS, BrokerConfig
from services.broker.config_overrides import load_persisted_overrides, save_persisted_overrides
from services.common.errors import ServiceError
from services.store.message_store import MessageStore

if TYPE_CHECKING:
    from services.broker.admin_service import AdminService

log = logging.getLogger(__name__)

ROLES = {
    "SYNC_MASTER": admin_pb2.SYNC_MASTER,
    "ASYNC_MASTER": admin_pb2.ASYNC_MASTER,
    "SLAVE": admin_pb2.SLAVE,
}

#: Runtime keys with bounds beyond BrokerConfig.validate(): key -> (min, max) inclusive.
RANGES: dict[str, tuple[float, float]] = {
    "shortPollingTimeMills": (0, 3_600_000),
    "pullHoldCheckIntervalMs": (1, 3_600_000),
    "flushConsumerOffsetInterval": (1, 3_600_000),
    "registerNameServerPeriod": (1, 3_600_000),
    "brokerHeartbeatTimeoutMs": (1, 86_400_000),
    "channelExpiredTimeout": (1, 86_400_000),
    "clientScanIntervalMs": (1, 3_600_000),
    "fileReservedTime": (0, 24 * 365 * 10),
    "diskMaxUsedSpaceRatio": (10, 95),
    "syncFlushTimeout": (1, 3_600_000),
    "flushIntervalCommitLog": (1, 3_600_000),
}

#: BrokerConfig fields that the store copied at startup; an update is pushed into the store.
STORE_FIELDS = (
    "file_reserved_time_hours",
    "delete_when",
    "disk_max_used_space_ratio",
    "sync_flush_timeout_ms",
    "flush_interval_commitlog_ms",
    "access_message_in_memory_max_ratio",
)


def apply_config(
    config: BrokerConfig, store: MessageStore, config_dir: Path, changes: dict[str, str]
) -> None:
    """Check every change, persist, then apply in place; nothing applies if one is bad."""
    try:
        new = config.updated(changes)
        for key, text in changes.items():
            low, high = RANGES.get(key, (float("-inf"), float("inf")))
            value = getattr(new, KEYS[key][0])
            if isinstance(value, int | float) and not low <= value <= high:
                raise ValueError(f"{key}={text!r}: must be in [{low:g}, {high:g}]")
        new_store_config = dataclasses.replace(
            store.config,
            file_reserved_time_hours=new.file_reserved_time_hours,
            delete_when=new.delete_when,
            disk_max_used_space_ratio=new.disk_max_used_space_ratio,
            disk_space_clean_forcibly_ratio=max(85, new.disk_max_used_space_ratio),
            disk_space_warning_level_ratio=max(90, new.disk_max_used_space_ratio),
            sync_flush_timeout_ms=new.sync_flush_timeout_ms,
            flush_interval_commitlog_ms=new.flush_interval_commitlog_ms,
            access_message_in_memory_max_ratio=new.access_message_in_memory_max_ratio,
        )
    except ValueError as exc:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT, common_pb2.ILLEGAL_ARGUMENT, str(exc)
        ) from None
    effective = new.as_properties()
    persisted = load_persisted_overrides(config_dir)
    persisted.update({key: effective[key] for key in changes})
    save_persisted_overrides(config_dir, persisted)
    for key in changes:
        name = KEYS[key][0]
        setattr(config, name, getattr(new, name))
    if any(KEYS[key][0] in STORE_FIELDS for key in changes):
        store.config = new_store_config
        store.retention.config = new_store_config
        store.flusher.sync_flush_timeout_ms = new.sync_flush_timeout_ms
        store.flusher.flush_interval_commitlog_ms = new.flush_interval_commitlog_ms
    log.info("broker config updated: %s", {k: effective[k] for k in changes})


def runtime_stats(svc: AdminService) -> admin_pb2.GetRuntimeStatsResponse:
    """The receiving broker's GetRuntimeStats answer."""
    cfg = svc.config
    commitlog = svc.store.commitlog
    max_offset = commitlog.max_offset
    flushed = svc.store.flusher.flushed_offset if svc.store.flusher.running else max_offset
    role = admin_pb2.SLAVE if not cfg.is_master else ROLES[cfg.broker_role]
    ha = svc.replication if cfg.is_master else None
    bound = svc.store.confirm_offset
    confirm = (
        ha.confirm_offset()
        if ha is not None
        else min(max_offset, bound if bound is not None else max_offset)
    )
    try:
        disk_ratio = svc.store.retention.disk_usage(cfg.store_dir)
    except OSError:
        disk_ratio = 0.0
    resp = admin_pb2.GetRuntimeStatsResponse(
        cluster_name=cfg.cluster_name,
        broker_name=cfg.broker_name,
        broker_id=cfg.broker_id,
        role=role,
        epoch=svc.store.epochs.last_epoch or 0,
        version=__version__,
        start_timestamp_ms=svc.started_ms,
        commitlog_min_offset=commitlog.min_offset,
        commitlog_max_offset=max_offset,
        commitlog_flushed_offset=min(flushed, max_offset),
        confirm_offset=confirm,
        slaves=ha.slave_stats() if ha is not None else [],
        dispatch_behind_bytes=max(0, max_offset - svc.store.dispatcher.dispatched_offset),
        put_messages_per_second=svc.put_rate() if svc.put_rate else 0.0,
        get_messages_per_second=svc.get_rate() if svc.get_rate else 0.0,
        held_pull_requests=svc.hold.held_count(),
        disk_used_ratio=disk_ratio,
        commitlog_disk_bytes=sum(mf.file_size_bytes for mf in commitlog.files),
        connected_clients=svc.clients.connected_count(),
        extra={
            "topics": str(len(svc.topics.all())),
            "subscription_groups": str(len(svc.groups.all())),
            "consume_queues": str(len(svc.store.queues.queues)),
            "uptime_ms": str(max(0, svc.clock.now_ms() - svc.started_ms)),
            "advertised_addr": svc.advertised_addr,
            **svc.hold.stats(),
        },
    )
    for provider in svc.extra_stats:
        resp.extra.update(provider())
    resp.replica_id = cfg.replica_id
    if svc.roles is not None:
        svc.roles.fill_stats(resp)
    return resp
