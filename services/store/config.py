"""Store configuration: every size and interval, with RocketMQ's defaults (SPEC §4.12, §12)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocketq import codec
from rocketq.codec import HostAddress
from services.store.commitlog import DEFAULT_COMMITLOG_FILE_BYTES
from services.store.consume_queue import DEFAULT_UNITS_PER_FILE
from services.store.flush import FlushDiskType


@dataclass(frozen=True)
class StoreConfig:
    """Configuration of one message store. Tests shrink the sizes; defaults are RocketMQ's."""

    store_dir: Path
    """Root of the store: ``commitlog/``, ``consumequeue/``, ``index/``, ``config/``, …"""
    commitlog_file_bytes: int = DEFAULT_COMMITLOG_FILE_BYTES
    """Size of each commitlog file (``mappedFileSizeCommitLog``, 1 GiB)."""
    consume_queue_units_per_file: int = DEFAULT_UNITS_PER_FILE
    """Units per consume-queue file (300 000 × 20 B = 6 000 000 B)."""
    index_slot_num: int = 5_000_000
    """Hash slots per index file (``maxHashSlotNum``)."""
    index_num: int = 20_000_000
    """Entries per index file (``maxIndexNum``)."""
    message_index_enable: bool = True
    """Build the key / unique-id index (``messageIndexEnable``)."""
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    """ASYNC_FLUSH acks after the page-cache write; SYNC_FLUSH after fsync."""
    flush_interval_commitlog_ms: int = 500
    """ASYNC_FLUSH: how often the commitlog is fsynced (``flushIntervalCommitLog``)."""
    flush_interval_consume_queue_ms: int = 1000
    """How often consume queues, index and checkpoint are flushed."""
    sync_flush_timeout_ms: int = 5000
    """SYNC_FLUSH: a writer not covered by an fsync in this time gets FLUSH_DISK_TIMEOUT."""
    warm_mapped_files: bool | None = None
    """Reserve commitlog space by writing zeros ahead of the writer instead of fallocate
    (``warmMapedFileEnable``; see mapped_file.py); None: exactly under SYNC_FLUSH."""
    file_reserved_time_hours: float = 72
    """Commitlog files untouched for this long are expired (``fileReservedTime``)."""
    delete_when: str = "04"
    """Hours of the day (``;``-separated, 2 digits) when expired files are deleted."""
    disk_max_used_space_ratio: int = 75
    """Above this disk use (%), expired files are deleted at any hour."""
    disk_space_clean_forcibly_ratio: int = 85
    """Above this disk use (%), the oldest files are deleted even if not expired."""
    disk_space_warning_level_ratio: int = 90
    """At or above this disk use (%), appends are refused until space is freed."""
    delete_files_per_run: int = 10
    """At most this many commitlog files are deleted per retention run (spreads the IO)."""
    clean_resource_interval_ms: int = 10_000
    """How often retention runs."""
    max_transfer_count_in_memory: int = 32
    """A pull returns at most this many messages when they are in the page cache
    (``maxTransferCountOnMessageInMemory``)."""
    max_transfer_bytes_in_memory: int = 256 * 1024
    """…and at most this many bytes (``maxTransferBytesOnMessageInMemory``)."""
    max_transfer_count_on_disk: int = 8
    """Limits when the messages are likely on disk (``maxTransferCountOnMessageInDisk``)."""
    max_transfer_bytes_on_disk: int = 64 * 1024
    """(``maxTransferBytesOnMessageInDisk``)."""
    access_message_in_memory_max_ratio: int = 40
    """Percent of physical memory a pull's distance from the commitlog end may span before its
    messages count as "on disk": smaller transfer limits, and the broker may suggest a slave
    (``accessMessageInMemoryMaxRatio``, SPEC §6.7)."""
    physical_memory_bytes: int | None = None
    """Physical memory the ratio applies to; None = this machine's (tests set a tiny value).
    The environment variable ROCKETQ_PHYSICAL_MEMORY_BYTES overrides the machine's too."""
    store_host: HostAddress = codec.LOCALHOST
    """The broker address written into every record (STOREHOSTADDRESS, offset message ids)."""
    slave: bool = False
    """A slave's store: its epoch history is its master's, never started at open."""

    @property
    def zero_ahead_commitlog(self) -> bool:
        """Whether the commitlog reserves space by writing zeros (``warm_mapped_files``)."""
        if self.warm_mapped_files is None:
            return self.flush_disk_type is FlushDiskType.SYNC_FLUSH
        return self.warm_mapped_files

    def __post_init__(self) -> None:
        if self.commitlog_file_bytes < 4096:
            raise ValueError("commitlog_file_bytes must be at least 4096")
        if self.consume_queue_units_per_file < 1:
            raise ValueError("consume_queue_units_per_file must be at least 1")
        if not 0 < self.disk_max_used_space_ratio <= self.disk_space_clean_forcibly_ratio:
            raise ValueError(
                "need 0 < disk_max_used_space_ratio <= disk_space_clean_forcibly_ratio"
            )
        if not self.disk_space_clean_forcibly_ratio <= self.disk_space_warning_level_ratio <= 100:
            raise ValueError("need forcibly ratio <= warning level ratio <= 100")
        if not 1 <= self.access_message_in_memory_max_ratio <= 100:
            raise ValueError("access_message_in_memory_max_ratio must be 1..100")
        if self.physical_memory_bytes is not None and self.physical_memory_bytes < 1:
            raise ValueError("physical_memory_bytes must be positive")
        for hour in self.delete_when.split(";"):
            if not (hour.strip().isdigit() and 0 <= int(hour) <= 23):
                raise ValueError(f"delete_when {self.delete_when!r}: hours 00-23 separated by ;")

    # -- paths -----------------------------------------------------------------------------
    @property
    def commitlog_dir(self) -> Path:
        return self.store_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_dir / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.store_dir / "index"

    @property
    def config_dir(self) -> Path:
        return self.store_dir / "config"

    @property
    def checkpoint_path(self) -> Path:
        return self.store_dir / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.store_dir / "abort"

    @property
    def lock_path(self) -> Path:
        return self.store_dir / "lock"
