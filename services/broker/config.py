"""Broker configuration: RocketMQ's key names and defaults, from a file, environment and flags.

Sources, later ones winning: defaults → a ``broker.conf`` properties file (``key=value`` lines,
RocketMQ's own key names, so an existing broker.conf mostly works) → environment variables
``ROCKETQ_BROKER_<KEY>`` (``ROCKETQ_BROKER_BROKERNAME``) → runtime updates saved by
UpdateBrokerConfig (config_overrides.py) → command-line overrides. The keys are the table
``TABLE`` below (services.common.config). Unknown keys are an error that names the key, so a
typo never silently does nothing.

| key (RocketMQ name)                 | field                               | default          |
|-------------------------------------|-------------------------------------|------------------|
| brokerClusterName                   | cluster_name                        | DefaultCluster   |
| brokerName                          | broker_name                         | broker-a         |
| brokerId                            | broker_id                           | 0                |
| listenAddress / listenPort          | listen_host / listen_port           | 0.0.0.0 / 10911  |
| brokerIP1                           | advertised_host (clients dial it)   | 127.0.0.1        |
| brokerHostName                      | advertised_name (dialed if set)     | (brokerIP1)      |
| learnClusterTopics                  | learn_cluster_topics                | false            |
| namesrvAddr                         | namesrv_addrs (``;``-separated)     | 127.0.0.1:9876   |
| storePathRootDir                    | store_dir                           | ~/store          |
| brokerRole                          | broker_role                         | ASYNC_MASTER     |
| flushDiskType                       | flush_disk_type                     | ASYNC_FLUSH      |
| … every other row of ``KEYS`` below |                                     |                  |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketq import codec
from rocketq.validation import MESSAGE_MAX_BYTES
from services.common import config
from services.common.config import Key, KeyTable, log_level_key, parse_addrs, parse_bool, parse_path
from services.common.security.keys import security_keys
from services.common.telemetry.config import STARTUP_ONLY_KEYS as TELEMETRY_STARTUP_ONLY_KEYS
from services.common.telemetry.config import telemetry_keys
from services.store.config import StoreConfig
from services.store.flush import FlushDiskType

BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")


GATEWAY_RECEIVE_BATCH_MAX = 32
"""Most messages one v2 ReceiveMessage hands out: one pop's most (pop/processor.py)."""
GATEWAY_LONG_POLLING_MIN_MS = 5_000
"""Shortest long-polling wait a v2 ReceiveMessage accepts (Apache's proxy: 5 s)."""

HA_MAX_IN_FLIGHT_BYTES_MAX = 1024**3
"""Upper bound of haMaxInFlightBytes: bytes in flight to one slave beyond its last ack."""


@dataclass
class BrokerConfig:
    """Everything one broker process needs. Field docs give RocketMQ's key in brackets."""

    cluster_name: str = "DefaultCluster"
    """[brokerClusterName] Cluster the broker registers under."""
    broker_name: str = "broker-a"
    """[brokerName] Broker group name shared by a master and its slaves."""
    broker_id: int = 0
    """[brokerId] 0 = master, >= 1 = slave."""
    listen_host: str = "0.0.0.0"
    """[listenAddress] Interface the gRPC server binds."""
    listen_port: int = 10911
    """[listenPort] gRPC port; 0 picks a free one (tests)."""
    advertised_host: str = "127.0.0.1"
    """[brokerIP1] Host clients dial; registered with nameservers and written into records."""
    namesrv_addrs: list[str] = field(default_factory=lambda: ["127.0.0.1:9876"])
    """[namesrvAddr] Every nameserver, ``host:port;host:port``. Empty = do not register."""
    store_dir: Path = field(default_factory=lambda: Path.home() / "store")
    """[storePathRootDir] Root of the message store and config files."""
    broker_role: str = "ASYNC_MASTER"
    """[brokerRole] ASYNC_MASTER, SYNC_MASTER or SLAVE."""
    flush_disk_type: str = "ASYNC_FLUSH"
    """[flushDiskType] ASYNC_FLUSH or SYNC_FLUSH."""
    broker_permission: int = 6
    """[brokerPermission] 2, 4 or 6; turning write off drains producers (SPEC §2.4)."""
    auto_create_topic_enable: bool = True
    """[autoCreateTopicEnable] Create unknown topics on first send, 4 queues (SPEC §4.3)."""
    auto_create_subscription_group: bool = True
    """[autoCreateSubscriptionGroup] Create unknown consumer groups on first use."""
    default_topic_queue_nums: int = 4
    """[defaultTopicQueueNums] Queues of an auto-created topic."""
    max_message_size_bytes: int = MESSAGE_MAX_BYTES
    """[maxMessageSize] Limit of one message or one batch."""
    long_polling_enable: bool = True
    """[longPollingEnable] Hold empty pulls until a message arrives."""
    short_polling_time_ms: int = 1000
    """[shortPollingTimeMills] Hold time when long polling is off."""
    pull_hold_check_interval_ms: int = 5000
    """How often held pulls are re-checked (PullRequestHoldService's 5 s wait)."""
    flush_consumer_offset_interval_ms: int = 5000
    """[flushConsumerOffsetInterval] How often consumerOffset.json is written."""
    register_name_server_period_ms: int = 30_000
    """[registerNameServerPeriod] Registration heartbeat period, 10 000..60 000."""
    broker_heartbeat_timeout_ms: int = 120_000
    """How long nameservers keep this broker without a registration."""
    channel_expired_timeout_ms: int = 120_000
    """[channelExpiredTimeout] Drop a client this long after its last heartbeat."""
    client_scan_interval_ms: int = 10_000
    """How often expired clients are looked for."""
    enable_property_filter: bool = False
    """[enablePropertyFilter] Allow SQL92 subscriptions."""
    rebalance_lock_max_live_time_ms: int = 60_000
    """[rebalanceLockMaxLiveTime] An orderly queue lock not renewed for this long is free
    (RocketMQ's rocketmq.broker.rebalance.lockMaxLiveTime). Clients renew every 20 s and give
    a lock up after 30 s, so keep it above both."""
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    """[messageDelayLevel] Delay of each level, 1-based (SPEC §8.1); units s m h d."""
    timer_max_delay_sec: int = 3 * 86_400
    """[timerMaxDelaySec] Longest delay a message may ask for; beyond it INVALID_ARGUMENT."""
    timer_topic_queue_nums: int = 8
    """[timerTopicQueueNums] Queues of rmq_sys_wheel_timer on this broker: the unit of work
    timer-wheel instances share."""
    strict_subscription_consistency: bool = True
    """[strictSubscriptionConsistency] While the live members of a clustering group subscribe
    to a topic differently, refuse their pulls of it (FAILED_PRECONDITION,
    SUBSCRIPTION_INCONSISTENT) instead of letting each member's filter skip messages another
    member wanted (SPEC §6.17). False only reports the conflict, as RocketMQ does."""
    transaction_timeout_ms: int = 6000
    """[transactionTimeout] A half message younger than this (or than its
    CHECK_IMMUNITY_TIME_IN_SECONDS) is not checked back yet (SPEC §9)."""
    transaction_check_interval_ms: int = 60_000
    """[transactionCheckInterval] How often the check service scans the half topic."""
    transaction_check_max: int = 15
    """[transactionCheckMax] Checks of one half message before it is discarded (error log)."""
    ha_master_address: str = ""
    """[haMasterAddress] For a slave: its master's replication address ``host:port``. Empty =
    the address the nameservers report for brokerId 0 of this brokerName."""
    ha_listen_port: int = 0
    """[haListenPort] The master's replication data socket (services/broker/ha_wire.py): a TCP
    port on listenAddress that carries chunks and acks with no gRPC message each, in TLS when
    the gRPC port has it. 0 = any free port (each stream's TruncateTo names it), -1 = none (the
    data stays on the gRPC stream)."""
    ha_transfer_batch_size: int = 512 * 1024
    """[haTransferBatchSize] Most commitlog bytes in one replication chunk (<= 1 MiB). A slave
    spends ~300 µs on each chunk besides its records (one decode and dispatch of columns), so
    a busy master ships big ones: at 512 KiB a slave spent ~0.5 µs less CPU per 1 KiB
    message than at 256 KiB (replication_bench, SDK load). RocketMQ's default is 32 KiB."""
    ha_max_in_flight_bytes: int = 4 * 1024 * 1024
    """[haMaxInFlightBytes] Bytes a master sends a slave beyond its last ack before waiting."""
    ha_send_heartbeat_interval_ms: int = 5000
    """[haSendHeartbeatInterval] A slave acks at least this often while idle."""
    ha_housekeeping_interval_ms: int = 20_000
    """[haHousekeepingInterval] A master drops a slave connection silent for this long."""
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    """[haSlaveFallbehindMax] A slave acked within this many bytes of the master's max offset
    is in sync (SYNC_MASTER waits only for in-sync slaves)."""
    slave_sync_config_interval_ms: int = 10_000
    """[slaveSyncConfigInterval] How often a slave copies topics, groups and offsets."""
    slave_read_enable: bool = False
    """[slaveReadEnable] Let the master suggest a slave to consumers whose backlog is beyond
    accessMessageInMemoryMaxRatio of memory (SPEC §6.7)."""
    access_message_in_memory_max_ratio: int = 40
    """[accessMessageInMemoryMaxRatio] Percent of physical memory a backlog may span before
    the master suggests reading from a slave."""
    etcd_endpoints: list[str] = field(default_factory=list)
    """[etcdEndpoints] etcd client endpoints ``host:port;host:port`` for automatic failover
    (controller mode, DESIGN.md §6). Empty = static roles from brokerId / brokerRole."""
    controller_lease_ttl_sec: int = 3
    """[controllerLeaseTtlSec] TTL of each replica's etcd lease; a master that cannot renew it
    stops acknowledging writes, and its group elects another after about this long."""
    controller_key_prefix: str = "/rocketq"
    """[controllerKeyPrefix] Root of this cluster's keys in etcd."""
    ha_max_time_slave_not_catchup_ms: int = 15_000
    """[haMaxTimeSlaveNotCatchup] A slave that has not caught up with its master for this long
    leaves the in-sync replica set (it may not be elected) until it catches up again."""
    broker_election_priority: int = 0
    """[brokerElectionPriority] Among equally up-to-date in-sync replicas, the lower wins."""
    commitlog_file_bytes: int = 1024 * 1024 * 1024
    """[mappedFileSizeCommitLog]"""
    consume_queue_units_per_file: int = 300_000
    """[mappedFileSizeConsumeQueue] / 20"""
    message_index_enable: bool = True
    """[messageIndexEnable]"""
    file_reserved_time_hours: float = 72.0
    """[fileReservedTime]"""
    delete_when: str = "04"
    """[deleteWhen]"""
    disk_max_used_space_ratio: int = 75
    """[diskMaxUsedSpaceRatio]"""
    sync_flush_timeout_ms: int = 5000
    """[syncFlushTimeout]"""
    flush_interval_commitlog_ms: int = 500
    """[flushIntervalCommitLog]"""
    max_transfer_count_on_message_in_memory: int = 256
    """[maxTransferCountOnMessageInMemory] Most messages one pull returns from the page cache.
    RocketMQ's default is 32; 256 here (issue 16) because a pull's fixed cost in Python is a few
    hundred µs of broker CPU, and with 1 KiB messages 32 used an eighth of the byte cap below,
    which is what bounds a pull's size: a drain's broker CPU per message halves (15 → 6.5 µs).
    A consumer asking for fewer (RocketMQ's clients: 32) still gets at most what it asks."""
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    """[maxTransferBytesOnMessageInMemory] Most bytes one pull returns from the page cache."""

    log_level: str = "INFO"
    """[logLevel] DEBUG, INFO, WARNING, ERROR or CRITICAL."""

    # --- Kubernetes deployment (issue 19) ---
    advertised_name: str = ""
    """[brokerHostName] Host name registered with the nameservers and given to clients (a
    pod's stable DNS name); empty = brokerIP1. brokerIP1 stays an IP address: it is the store
    host written into every message id."""
    learn_cluster_topics: bool = False
    """[learnClusterTopics] A master joining a cluster creates on itself every topic that all
    other broker groups of its cluster host (services/broker/cluster_topics.py)."""
    # -- telemetry (services.common.telemetry.config) --
    metrics_port: int = 0
    """[metricsPort] Prometheus /metrics on listenAddress:metricsPort; 0 = no endpoint."""
    trace_exporter: str = ""
    """[traceExporter] none, console, otlp or file; empty = OTEL_TRACES_EXPORTER, else none."""
    trace_sample_ratio: float = -1.0
    """[traceSampleRatio] Share of new traces sampled (0..1); negative = OTEL_TRACES_SAMPLER."""
    trace_file: str = ""
    """[traceFile] The file exporter's JSON-lines output (a path)."""
    # -- gateway (apache.rocketmq.v2, services/broker/gateway) --
    gateway_port: int = 8081
    """[gatewayPort] Port of the RocketMQ 5 gRPC gateway for the official SDKs (DESIGN.md §7);
    0 = off. Several brokers on one host need one port each (or 0)."""
    gateway_auto_renew_invisible_ms: int = 60_000
    """[gatewayAutoRenewInvisibleMs] How long a push consumer's message (received with
    auto_renew) is hidden at a time; the gateway renews it at half that until the ack."""
    # -- gateway settings handed to the SDKs (msgtype; names after Apache's proxy config) --
    gateway_validate_message_type: bool = True
    """[gatewayValidateMessageType] Refuse a v2 send whose type is not its topic's message type
    (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE), and tell producers to check too; topics without a
    type (MIXED) accept everything either way. Apache's enableTopicMessageTypeCheck."""
    gateway_producer_max_attempts: int = 3
    """[gatewayProducerMaxAttempts] Attempts of an SDK producer's send (1 = no retry)."""
    gateway_producer_backoff_initial_ms: int = 10
    """[gatewayProducerBackoffInitialMs] First wait before an SDK producer's retry."""
    gateway_producer_backoff_max_ms: int = 1_000
    """[gatewayProducerBackoffMaxMs] Longest wait between an SDK producer's retries."""
    gateway_producer_backoff_multiplier: float = 2.0
    """[gatewayProducerBackoffMultiplier] Each retry waits this many times the previous."""
    gateway_receive_batch_size: int = 32
    """[gatewayReceiveBatchSize] Messages an SDK consumer asks for at a time, and the most one
    ReceiveMessage hands out."""
    gateway_long_polling_timeout_ms: int = 20_000
    """[gatewayLongPollingTimeoutMs] How long an SDK consumer's receive waits for messages, and
    the longest wait ReceiveMessage accepts (the shortest is 5 s)."""
    # -- replication chunking (issue 16, perf3) --
    ha_small_chunks_in_flight_max: int = 1
    """[haSmallChunksInFlightMax] While this many chunks to a slave are not acked, the master
    holds back a chunk smaller than haTransferBatchSize until an ack (Nagle's rule), so a busy
    master ships what many sends appended in one stream message; 0 = ship every append at once."""
    # -- retention schedule (spark2: tests see retention act without a 10 s wait) --
    clean_resource_interval_ms: int = 10_000
    """[cleanResourceInterval] How often retention looks for commitlog files to delete."""

    replica_id: int = -1
    """Not a key: this replica's stable id, the configured brokerId (set at load). In controller
    mode ``broker_id`` changes at runtime (0 while this replica leads), ``replica_id`` never."""
    write_fence: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    # -- security (sec): TLS and ACL keys, services/common/security/settings.py --
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: str = "none"
    acl_enable: bool = False
    acl_file: str = ""
    """Not a key: in controller mode, True only while this replica holds a valid leader lease;
    ``is_master`` is False whenever it is False, so a master that lost its lease (or woke from a
    pause longer than it) refuses writes at once."""

    def __post_init__(self) -> None:
        if self.replica_id < 0:
            self.replica_id = self.broker_id
        self.validate()

    def validate(self) -> None:
        if self.broker_role not in BROKER_ROLES:
            raise ValueError(f"brokerRole {self.broker_role!r}: use one of {BROKER_ROLES}")
        if not 0 <= self.gateway_port <= 65535:
            raise ValueError(f"gatewayPort {self.gateway_port}: 0 (off) or a port number")
        self._validate_gateway_settings()
        if not 100 <= self.clean_resource_interval_ms <= 3_600_000:
            raise ValueError(
                f"cleanResourceInterval {self.clean_resource_interval_ms}: 100..3600000 ms"
            )
        if not 1_000 <= self.gateway_auto_renew_invisible_ms <= 3_600_000:
            raise ValueError(
                f"gatewayAutoRenewInvisibleMs {self.gateway_auto_renew_invisible_ms}: "
                "1000..3600000 (1 s to 1 h)"
            )
        if self.flush_disk_type not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise ValueError(f"flushDiskType {self.flush_disk_type!r}: ASYNC_FLUSH or SYNC_FLUSH")
        if self.broker_id < 0:
            raise ValueError(f"brokerId {self.broker_id}: must be >= 0")
        if self.broker_permission not in (2, 4, 6):
            raise ValueError(f"brokerPermission {self.broker_permission}: use 2, 4 or 6")
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise ValueError("defaultTopicQueueNums must be 1..1024")
        if not 1024 <= self.max_message_size_bytes <= 64 * 1024 * 1024:
            raise ValueError("maxMessageSize must be between 1 KiB and 64 MiB")
        if not 1 <= self.max_transfer_count_on_message_in_memory <= 1024:
            raise ValueError("maxTransferCountOnMessageInMemory must be 1..1024")
        if not 1000 <= self.rebalance_lock_max_live_time_ms <= 3_600_000:
            raise ValueError("rebalanceLockMaxLiveTime must be 1000..3600000 ms")
        self.delay_levels_ms()  # raises ValueError naming a bad level
        if not 1 <= self.timer_max_delay_sec <= 400 * 86_400:
            raise ValueError("timerMaxDelaySec must be 1..34560000 (400 days)")
        if not 1 <= self.timer_topic_queue_nums <= 256:
            raise ValueError("timerTopicQueueNums must be 1..256")
        if not 1 <= self.transaction_timeout_ms <= 86_400_000:
            raise ValueError("transactionTimeout must be 1..86400000 ms")
        if not 100 <= self.transaction_check_interval_ms <= 86_400_000:
            raise ValueError("transactionCheckInterval must be 100..86400000 ms")
        if not 1 <= self.transaction_check_max <= 1000:
            raise ValueError("transactionCheckMax must be 1..1000")
        if not -1 <= self.ha_listen_port <= 65535:
            raise ValueError("haListenPort must be -1 (no data socket), 0 (any port) or a port")
        if not 4096 <= self.ha_transfer_batch_size <= 1024 * 1024:
            raise ValueError("haTransferBatchSize must be 4096..1048576 bytes")
        if self.ha_max_in_flight_bytes < self.ha_transfer_batch_size:
            raise ValueError("haMaxInFlightBytes must be at least haTransferBatchSize")
        if self.ha_max_in_flight_bytes > HA_MAX_IN_FLIGHT_BYTES_MAX:
            # the window is memory a master holds per slave: 10^30 was accepted (issue 21)
            raise ValueError(
                f"haMaxInFlightBytes must be at most {HA_MAX_IN_FLIGHT_BYTES_MAX} (1 GiB)"
            )
        if not 0 <= self.ha_small_chunks_in_flight_max <= 64:
            raise ValueError("haSmallChunksInFlightMax must be 0..64 chunks")
        if not 100 <= self.ha_send_heartbeat_interval_ms <= 60_000:
            raise ValueError("haSendHeartbeatInterval must be 100..60000 ms")
        if self.ha_housekeeping_interval_ms <= self.ha_send_heartbeat_interval_ms:
            raise ValueError("haHousekeepingInterval must exceed haSendHeartbeatInterval")
        if self.ha_slave_fallbehind_max < 0:
            raise ValueError("haSlaveFallbehindMax must be >= 0")
        if not 100 <= self.slave_sync_config_interval_ms <= 3_600_000:
            raise ValueError("slaveSyncConfigInterval must be 100..3600000 ms")
        if not 1 <= self.access_message_in_memory_max_ratio <= 100:
            raise ValueError("accessMessageInMemoryMaxRatio must be 1..100")
        if self.broker_role == "SLAVE" and self.broker_id == 0:
            raise ValueError("brokerRole SLAVE needs brokerId >= 1 (brokerId 0 is the master)")
        if not 2 <= self.controller_lease_ttl_sec <= 60:
            raise ValueError("controllerLeaseTtlSec must be 2..60 (etcd leases are whole seconds)")
        if not 1000 <= self.ha_max_time_slave_not_catchup_ms <= 3_600_000:
            raise ValueError("haMaxTimeSlaveNotCatchup must be 1000..3600000 ms")
        if self.etcd_endpoints and self.replica_id < 1:
            raise ValueError(
                "in controller mode (etcdEndpoints set) brokerId is the replica's stable id and "
                "must be >= 1; whichever replica is elected registers as brokerId 0"
            )
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listenPort {self.listen_port} is not a port number")

    def _validate_gateway_settings(self) -> None:
        """The gateway block's settings for SDKs (msgtype): bounds that keep a client sane."""
        if not 1 <= self.gateway_producer_max_attempts <= 100:
            raise ValueError(
                f"gatewayProducerMaxAttempts {self.gateway_producer_max_attempts}: 1..100"
            )
        initial, most = (
            self.gateway_producer_backoff_initial_ms,
            self.gateway_producer_backoff_max_ms,
        )
        if not 1 <= initial <= 60_000:
            raise ValueError(f"gatewayProducerBackoffInitialMs {initial}: 1..60000 ms")
        if not initial <= most <= 600_000:
            raise ValueError(
                f"gatewayProducerBackoffMaxMs {most}: gatewayProducerBackoffInitialMs "
                f"({initial})..600000 ms"
            )
        if not 1.0 <= self.gateway_producer_backoff_multiplier <= 10.0:
            raise ValueError(
                f"gatewayProducerBackoffMultiplier {self.gateway_producer_backoff_multiplier}: "
                "1..10"
            )
        if not 1 <= self.gateway_receive_batch_size <= GATEWAY_RECEIVE_BATCH_MAX:
            raise ValueError(
                f"gatewayReceiveBatchSize {self.gateway_receive_batch_size}: "
                f"1..{GATEWAY_RECEIVE_BATCH_MAX} (a pop's most)"
            )
        if not GATEWAY_LONG_POLLING_MIN_MS <= self.gateway_long_polling_timeout_ms <= 60_000:
            raise ValueError(
                f"gatewayLongPollingTimeoutMs {self.gateway_long_polling_timeout_ms}: "
                f"{GATEWAY_LONG_POLLING_MIN_MS}..60000 ms"
            )

    def delay_levels_ms(self) -> list[int]:
        """``message_delay_level`` parsed: element i is the delay of level i + 1, in ms."""
        return parse_delay_levels(self.message_delay_level)

    @property
    def is_master(self) -> bool:
        if self.broker_id != 0 or self.broker_role == "SLAVE":
            return False
        return self.write_fence is None or self.write_fence()

    @property
    def controller_mode(self) -> bool:
        """Roles come from elections through etcd, not from brokerId / brokerRole."""
        return bool(self.etcd_endpoints)

    def store_config(self, advertised_port: int) -> StoreConfig:
        return StoreConfig(
            store_dir=self.store_dir,
            commitlog_file_bytes=self.commitlog_file_bytes,
            consume_queue_units_per_file=self.consume_queue_units_per_file,
            message_index_enable=self.message_index_enable,
            flush_disk_type=FlushDiskType[self.flush_disk_type],
            flush_interval_commitlog_ms=self.flush_interval_commitlog_ms,
            sync_flush_timeout_ms=self.sync_flush_timeout_ms,
            file_reserved_time_hours=self.file_reserved_time_hours,
            delete_when=self.delete_when,
            disk_max_used_space_ratio=self.disk_max_used_space_ratio,
            disk_space_clean_forcibly_ratio=max(85, self.disk_max_used_space_ratio),
            disk_space_warning_level_ratio=max(90, self.disk_max_used_space_ratio),
            max_transfer_count_in_memory=self.max_transfer_count_on_message_in_memory,
            max_transfer_bytes_in_memory=self.max_transfer_bytes_on_message_in_memory,
            access_message_in_memory_max_ratio=self.access_message_in_memory_max_ratio,
            store_host=codec.HostAddress.parse(f"{self.advertised_host}:{advertised_port}"),
            slave=not self.is_master,  # a slave's epoch history is its master's (ha_slave)
            clean_resource_interval_ms=self.clean_resource_interval_ms,
        )

    def as_properties(self) -> dict[str, str]:
        """Every key with its effective value as text (Admin.GetBrokerConfig)."""
        return TABLE.as_properties(self)

    def updated(
        self, changes: Mapping[str, str], source: str = "UpdateBrokerConfig"
    ) -> BrokerConfig:
        """A copy with RocketMQ-named keys changed; raises ConfigError naming a bad key/value."""
        return _apply(self, TABLE.from_overrides(changes, source))


_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
DELAY_LEVELS_MAX = 64


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 10s 30s 1m ... 2h"`` to milliseconds per level; ValueError on a bad item."""
    levels: list[int] = []
    for item in text.split():
        unit = _DELAY_UNITS_MS.get(item[-1:].lower())
        if unit is None or not item[:-1].isdigit() or int(item[:-1]) <= 0:
            raise ValueError(
                f"messageDelayLevel item {item!r}: expected a positive number and a unit "
                "s, m, h or d, e.g. 30s"
            )
        levels.append(int(item[:-1]) * unit)
    if not 1 <= len(levels) <= DELAY_LEVELS_MAX:
        raise ValueError(f"messageDelayLevel needs 1..{DELAY_LEVELS_MAX} levels")
    return levels


Parser = Callable[[str], Any]
FLUSH_DISK_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")

TABLE = KeyTable(
    "broker",
    [
        Key("brokerClusterName", "cluster_name"),
        Key("brokerName", "broker_name"),
        Key("brokerId", "broker_id", int),
        Key("listenAddress", "listen_host"),
        Key("listenPort", "listen_port", int),
        Key("brokerIP1", "advertised_host"),
        Key("namesrvAddr", "namesrv_addrs", parse_addrs),
        Key("storePathRootDir", "store_dir", parse_path),
        Key("brokerRole", "broker_role", str.upper, choices=BROKER_ROLES),
        Key("flushDiskType", "flush_disk_type", str.upper, choices=FLUSH_DISK_TYPES),
        Key("brokerPermission", "broker_permission", int),
        Key("autoCreateTopicEnable", "auto_create_topic_enable", parse_bool),
        Key("autoCreateSubscriptionGroup", "auto_create_subscription_group", parse_bool),
        Key("defaultTopicQueueNums", "default_topic_queue_nums", int),
        Key("maxMessageSize", "max_message_size_bytes", int),
        Key("longPollingEnable", "long_polling_enable", parse_bool),
        Key("shortPollingTimeMills", "short_polling_time_ms", int),
        Key("pullHoldCheckIntervalMs", "pull_hold_check_interval_ms", int),
        Key("flushConsumerOffsetInterval", "flush_consumer_offset_interval_ms", int),
        Key("registerNameServerPeriod", "register_name_server_period_ms", int),
        Key("brokerHeartbeatTimeoutMs", "broker_heartbeat_timeout_ms", int),
        Key("channelExpiredTimeout", "channel_expired_timeout_ms", int),
        Key("clientScanIntervalMs", "client_scan_interval_ms", int),
        Key("enablePropertyFilter", "enable_property_filter", parse_bool),
        Key("rebalanceLockMaxLiveTime", "rebalance_lock_max_live_time_ms", int),
        Key("strictSubscriptionConsistency", "strict_subscription_consistency", parse_bool),
        Key("messageDelayLevel", "message_delay_level"),
        Key("timerMaxDelaySec", "timer_max_delay_sec", int),
        Key("timerTopicQueueNums", "timer_topic_queue_nums", int),
        Key("transactionTimeout", "transaction_timeout_ms", int),
        Key("transactionCheckInterval", "transaction_check_interval_ms", int),
        Key("transactionCheckMax", "transaction_check_max", int),
        Key("haMasterAddress", "ha_master_address"),
        Key("haListenPort", "ha_listen_port", int),
        Key("haTransferBatchSize", "ha_transfer_batch_size", int),
        Key("haMaxInFlightBytes", "ha_max_in_flight_bytes", int),
        Key("haSendHeartbeatInterval", "ha_send_heartbeat_interval_ms", int),
        Key("haHousekeepingInterval", "ha_housekeeping_interval_ms", int),
        Key("haSlaveFallbehindMax", "ha_slave_fallbehind_max", int),
        Key("slaveSyncConfigInterval", "slave_sync_config_interval_ms", int),
        Key("slaveReadEnable", "slave_read_enable", parse_bool),
        Key("accessMessageInMemoryMaxRatio", "access_message_in_memory_max_ratio", int),
        Key("etcdEndpoints", "etcd_endpoints", parse_addrs),
        Key("controllerLeaseTtlSec", "controller_lease_ttl_sec", int),
        Key("controllerKeyPrefix", "controller_key_prefix"),
        Key("haMaxTimeSlaveNotCatchup", "ha_max_time_slave_not_catchup_ms", int),
        Key("brokerElectionPriority", "broker_election_priority", int),
        Key("mappedFileSizeCommitLog", "commitlog_file_bytes", int),
        Key("mappedFileUnitsConsumeQueue", "consume_queue_units_per_file", int),
        Key("messageIndexEnable", "message_index_enable", parse_bool),
        Key("fileReservedTime", "file_reserved_time_hours", float),
        Key("deleteWhen", "delete_when"),
        Key("diskMaxUsedSpaceRatio", "disk_max_used_space_ratio", int),
        Key("syncFlushTimeout", "sync_flush_timeout_ms", int),
        Key("flushIntervalCommitLog", "flush_interval_commitlog_ms", int),
        Key("maxTransferCountOnMessageInMemory", "max_transfer_count_on_message_in_memory", int),
        Key("maxTransferBytesOnMessageInMemory", "max_transfer_bytes_on_message_in_memory", int),
        # Kubernetes deployment (issue 19)
        Key("brokerHostName", "advertised_name", doc="host name clients dial; empty = brokerIP1"),
        Key("learnClusterTopics", "learn_cluster_topics", parse_bool),
        log_level_key(),
        *security_keys(),  # sec
        *telemetry_keys(),  # metricsPort, traceExporter, traceSampleRatio, traceFile
        Key("gatewayPort", "gateway_port", int),
        Key("gatewayAutoRenewInvisibleMs", "gateway_auto_renew_invisible_ms", int),
        # msgtype: the settings SDKs get (gateway/settings.py) and the message-type check
        Key("gatewayValidateMessageType", "gateway_validate_message_type", parse_bool),
        Key("gatewayProducerMaxAttempts", "gateway_producer_max_attempts", int),
        Key("gatewayProducerBackoffInitialMs", "gateway_producer_backoff_initial_ms", int),
        Key("gatewayProducerBackoffMaxMs", "gateway_producer_backoff_max_ms", int),
        Key("gatewayProducerBackoffMultiplier", "gateway_producer_backoff_multiplier", float),
        Key("gatewayReceiveBatchSize", "gateway_receive_batch_size", int),
        Key("gatewayLongPollingTimeoutMs", "gateway_long_polling_timeout_ms", int),
        Key("haSmallChunksInFlightMax", "ha_small_chunks_in_flight_max", int),  # perf3
        Key("cleanResourceInterval", "clean_resource_interval_ms", int),  # spark2
    ],
)

#: RocketMQ key → (field, parser): the table in the shape runtime updates use.
KEYS: dict[str, tuple[str, Parser]] = {k.name: (k.field, k.parse) for k in TABLE}

#: Keys that only take effect at startup (UpdateBrokerConfig answers FAILED_PRECONDITION).
STARTUP_ONLY_KEYS = frozenset(
    {
        "brokerClusterName",
        "brokerName",
        "brokerId",
        "listenAddress",
        "listenPort",
        "brokerIP1",
        "brokerHostName",
        "learnClusterTopics",
        "storePathRootDir",
        "brokerRole",
        "gatewayPort",
        "etcdEndpoints",
        "controllerKeyPrefix",
        "controllerLeaseTtlSec",
        "flushDiskType",
        "mappedFileSizeCommitLog",
        "mappedFileUnitsConsumeQueue",
        "messageIndexEnable",
        "maxTransferCountOnMessageInMemory",
        "maxTransferBytesOnMessageInMemory",
        "logLevel",
        "cleanResourceInterval",  # spark2: the store's retention loop reads it at start
        *(k.name for k in security_keys()),  # sec: certificates reload by themselves
    }
    | TELEMETRY_STARTUP_ONLY_KEYS
)


def canonical_key(key: str, source: str = "") -> str:
    """RocketMQ's spelling of ``key``; ConfigError (a ValueError) naming it if unknown."""
    return TABLE.canonical(key, source)


def load(
    config_file: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    persisted: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Defaults ← file ← environment ``ROCKETQ_BROKER_<KEY>`` ← ``persisted`` (runtime updates
    saved by UpdateBrokerConfig) ← overrides (``--set``)."""
    settings = config.gather(TABLE, config_file, None, environ)
    settings += TABLE.from_overrides(persisted or {}, "runtime update (config/broker.properties)")
    settings += TABLE.from_overrides(overrides or {})
    return _apply(BrokerConfig(), settings)


def _apply(base: BrokerConfig, settings: list[config.Setting]) -> BrokerConfig:
    values = TABLE.values(settings)
    if "broker_id" in values:
        values["replica_id"] = values["broker_id"]  # the configured id is the stable one
    return dataclasses.replace(base, **values)
