"""Retention: delete whole commitlog files by age and by disk pressure (SPEC §4.11).

| trigger                                        | what is deleted                         |
|------------------------------------------------|-----------------------------------------|
| file older than fileReservedTime, at deleteWhen | expired files                           |
| disk use ≥ diskMaxUsedSpaceRatio (75 %)         | expired files, at any hour               |
| disk use ≥ diskSpaceCleanForciblyRatio (85 %)   | oldest files, expired or not            |
| disk use ≥ diskSpaceWarningLevelRatio (90 %)    | nothing more — appends are refused      |

The newest commitlog file is never deleted. Consume queues and index files are cleaned after
the commitlog, down to its new minimum offset, so no unit ever points at a deleted file.
Consumed or not makes no difference: RocketMQ keeps messages by time, not by acknowledgement.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.common import failpoints
from services.common.clock import Clock
from services.store.commitlog import CommitLog
from services.store.config import StoreConfig
from services.store.consume_queue_store import ConsumeQueueStore
from services.store.index_service import IndexService

log = logging.getLogger(__name__)

DiskUsage = Callable[[Path], float]
"""Returns the used fraction of the volume holding a path, 0.0–1.0."""


def disk_used_ratio(path: Path) -> float:
    # A store that has not written its first commitlog file yet has no directory: measure the
    # nearest existing parent (the same volume) instead of failing every check.
    while not path.exists() and path.parent != path:
        path = path.parent
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


@dataclass
class RetentionResult:
    """What one run did."""

    commitlog_files_deleted: int = 0
    consume_queue_files_deleted: int = 0
    index_files_deleted: int = 0
    disk_used_ratio: float = 0.0
    writable: bool = True


class RetentionService:
    """One ``run_once`` per ``clean_resource_interval_ms``; the store schedules it."""

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        queues: ConsumeQueueStore,
        index: IndexService | None,
        clock: Clock,
        disk_usage: DiskUsage = disk_used_ratio,
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.clock = clock
        self.disk_usage = disk_usage
        self.writable = True
        """False while disk use is at or above the warning level: the store refuses appends."""

    def _is_delete_hour(self, now_ms: int) -> bool:
        hour = time.localtime(now_ms / 1000).tm_hour
        return any(int(h) == hour for h in self.config.delete_when.split(";"))

    def run_once(self) -> RetentionResult:
        cfg = self.config
        now = self.clock.now_ms()
        ratio = self.disk_usage(cfg.commitlog_dir)
        result = RetentionResult(disk_used_ratio=ratio)
        percent = ratio * 100
        self.writable = percent < cfg.disk_space_warning_level_ratio
        if not self.writable:
            log.error(
                "disk %.1f%% used (limit %d%%): refusing writes until space is freed",
                percent,
                cfg.disk_space_warning_level_ratio,
            )
        forcibly = percent >= cfg.disk_space_clean_forcibly_ratio
        any_hour = percent >= cfg.disk_max_used_space_ratio
        reserved_ms = int(cfg.file_reserved_time_hours * 3600 * 1000)
        files = self.commitlog.files.files
        # Never the newest file: that is the one being written, not files[-1], which may be
        # the empty file the queue pre-creates for the next roll.
        newest = self.commitlog.files.last_written()
        older = files[: files.index(newest)] if newest is not None else []
        doomed = 0
        for mf in older:
            if doomed >= cfg.delete_files_per_run:
                break
            expired = mf.last_modified_ms() + reserved_ms <= now
            if (expired and (any_hour or self._is_delete_hour(now))) or forcibly:
                doomed += 1
            else:
                break  # files expire oldest first; stop at the first one that stays
        if doomed:
            failpoints.inject("retention_before_delete")
            gone = self.commitlog.files.delete_first(doomed)
            result.commitlog_files_deleted = len(gone)
            log.info("retention deleted %d commitlog files", len(gone))
        cl_min = self.commitlog.min_offset
        for cq in self.queues:
            result.consume_queue_files_deleted += cq.delete_files_before(cl_min)
        if self.index is not None:
            result.index_files_deleted = self.index.delete_files_before(cl_min)
        if doomed and not self.writable:
            self.writable = (
                self.disk_usage(cfg.commitlog_dir) * 100 < cfg.disk_space_warning_level_ratio
            )
        result.writable = self.writable
        return result
