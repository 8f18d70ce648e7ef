"""Consumer configuration and the small types a listener sees (SPEC §6.1, §6.2, §6.11, §6.12).

Every default but one is RocketMQ's (``DefaultMQPushConsumer`` / ``DefaultLitePullConsumer``),
so a RocketMQ user finds the numbers they know, renamed only to put units last. The exception is
``pull_batch_size`` (RocketMQ: 32), see its note:

| RocketMQ field                  | here                                 | default        |
|---------------------------------|--------------------------------------|----------------|
| messageModel                    | message_model                        | CLUSTERING     |
| consumeFromWhere                | consume_from_where                   | LAST_OFFSET    |
| consumeTimestamp                | consume_timestamp (yyyyMMddHHmmss)   | 30 min ago     |
| allocateMessageQueueStrategy    | allocate_strategy                    | AVG            |
| consumeThreadMax                | consume_thread_max                   | 20             |
| consumeConcurrentlyMaxSpan      | consume_concurrently_max_span        | 2000           |
| pullThresholdForQueue           | pull_threshold_for_queue             | 1000           |
| pullThresholdSizeForQueue (MiB) | pull_threshold_size_for_queue_mib    | 100            |
| pullInterval                    | pull_interval_ms                     | 0              |
| consumeMessageBatchMaxSize      | consume_message_batch_max_size       | 1              |
| pullBatchSize                   | pull_batch_size                      | 256 (RMQ: 32)  |
| maxReconsumeTimes               | max_reconsume_times                  | -1 (group's)   |
| consumeTimeout (minutes)        | consume_timeout_minutes              | 15             |
| suspendCurrentQueueTimeMillis   | suspend_current_queue_time_ms        | 1000           |
| rebalance.lockInterval          | rebalance_lock_interval_ms           | 20000          |
| (client lock expiry)            | rebalance_lock_max_live_ms           | 30000          |
| rebalance waitInterval          | rebalance_interval_ms                | 20000          |
| persistConsumerOffsetInterval   | persist_consumer_offset_interval_ms  | 5000           |
| BROKER_SUSPEND_MAX_TIME_MILLIS  | broker_suspend_max_time_ms           | 15000          |
| CONSUMER_TIMEOUT_..._SUSPEND    | consumer_timeout_when_suspend_ms     | 30000          |

The configs are frozen: a running consumer never sees a field change under it.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rocketq.client.consumer.allocate import AllocateStrategy
from rocketq.client.security import ClientSecurity
from rocketq.message import MessageQueue, ReceivedMessage
from rocketq.validation import check_group

CONSUME_TIMESTAMP_FORMAT = "%Y%m%d%H%M%S"
"""RocketMQ's ``yyyyMMddHHmmss``, local time (SPEC §6.2), e.g. ``"20210701080000"``."""

CONSUME_TIMESTAMP_DEFAULT_AGO_S = 30 * 60
"""RocketMQ's default consume timestamp is half an hour before the consumer was created."""

PULL_BATCH_SIZE_MAX = 1024
"""The broker accepts at most this many messages per pull (messaging.proto)."""
CONSUME_BATCH_MAX = 1024
"""Hard ceiling of consume_message_batch_max_size; it must also be ≤ pull_batch_size (§6.18)."""
SUSPEND_CURRENT_QUEUE_TIME_MIN_MS = 10
SUSPEND_CURRENT_QUEUE_TIME_MAX_MS = 30_000
"""RocketMQ's range of suspendCurrentQueueTimeMillis (an orderly queue's pause after a failure)."""


class MessageModel(enum.Enum):
    """How a consumer group shares messages (SPEC §6.1)."""

    CLUSTERING = "CLUSTERING"
    """Each message goes to one member; offsets on the broker; failures are retried."""
    BROADCASTING = "BROADCASTING"
    """Every member gets every message; offsets in a local file; failures are dropped."""


class ConsumeFromWhere(enum.Enum):
    """Where a queue with no stored offset starts (SPEC §6.12); a stored offset always wins."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    """From the queue's max offset: only messages sent from now on (retry topics from 0)."""
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    """From the oldest message still stored."""
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"
    """From the first message stored at or after ``consume_timestamp``."""


class ExpressionType(enum.Enum):
    """How a subscription expression reads (SPEC §6.17)."""

    TAG = "TAG"
    """``"*"`` or ``"TAGA || TAGB"``: by tag hash on the broker, by tag string on the client."""
    SQL92 = "SQL92"
    """A SQL92 predicate over properties; the broker needs ``enablePropertyFilter=true``."""


class ConsumeResult(enum.Enum):
    """What a concurrent listener returns for a batch (SPEC §6.11)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    """The batch (or, with ``ConsumeContext.ack_index``, its head) is done."""
    RECONSUME_LATER = "RECONSUME_LATER"
    """Deliver the batch again later. Returning None or raising means the same."""


@dataclass
class ConsumeContext:
    """Handed to the listener with each batch; the listener may change the two tuning fields."""

    message_queue: MessageQueue
    """The queue the batch was pulled from."""
    delay_level_when_next_consume: int = 0
    """For RECONSUME_LATER in clustering mode: the retry delay level; 0 lets the broker pick
    3 + reconsume_times (SPEC §6.14), -1 sends the messages straight to the dead-letter topic."""
    ack_index: int | None = None
    """With CONSUME_SUCCESS: index of the last message of the batch that succeeded; the rest are
    retried. None (the default) means the whole batch succeeded."""


MessageListener = Callable[
    [list[ReceivedMessage], ConsumeContext],
    ConsumeResult | Awaitable[ConsumeResult | None] | None,
]
"""A concurrent listener: a plain function (run in the consume thread pool) or a coroutine
function (run on the consumer's event loop). It must be safe to call concurrently."""


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener returns for a batch (SPEC §6.15)."""

    SUCCESS = "SUCCESS"
    """The batch is done: its offset is committed and the queue's next messages follow."""
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    """Stop the queue for ``suspend_current_queue_time_ms``, then deliver the same batch again
    (locally: a retry topic would break the order). Returning None or raising means the same."""


@dataclass
class ConsumeOrderlyContext:
    """Handed to an orderly listener with each batch; the listener may change the two tuning
    fields for this batch."""

    message_queue: MessageQueue
    """The queue the batch was pulled from; every batch of a queue comes in offset order."""
    auto_commit: bool = True
    """Kept for RocketMQ compatibility. RocketMQ's COMMIT/ROLLBACK statuses are deprecated and
    not offered here, so SUCCESS commits the batch's offset whatever this says (with False,
    RocketMQ would wait for a COMMIT; with no COMMIT status, SUCCESS plays that part)."""
    suspend_current_queue_time_ms: int = -1
    """For SUSPEND_CURRENT_QUEUE_A_MOMENT: the pause before redelivery; -1 = the consumer's
    ``suspend_current_queue_time_ms``. Clamped to 10..30000."""


OrderlyMessageListener = Callable[
    [list[ReceivedMessage], ConsumeOrderlyContext],
    ConsumeOrderlyStatus | Awaitable[ConsumeOrderlyStatus | None] | None,
]
"""An orderly listener (``PushConsumer(..., orderly=True)``): a plain function (run in the
consume thread pool) or a coroutine function (run on the event loop). It is called for at most
one batch of a queue at a time, but batches of different queues run concurrently."""


@dataclass(frozen=True)
class SubscriptionConflict:
    """Members of this consumer's group that subscribe to one topic differently (SPEC §6.17),
    as the broker last reported it. Queues are shared among all members whatever they
    subscribe to, so a member whose filter drops what another wants would lose messages; while
    ``pulls_refused`` the broker refuses the group's pulls of the topic instead (nothing is
    skipped; pulls are retried every 3 s until the members agree)."""

    consumer_group: str
    topic: str
    members: tuple[tuple[str, str | None], ...]
    """(client id, expression) per live member, sorted by client id; None = not subscribed."""
    pulls_refused: bool


def _default_consume_timestamp() -> str:
    return time.strftime(
        CONSUME_TIMESTAMP_FORMAT, time.localtime(time.time() - CONSUME_TIMESTAMP_DEFAULT_AGO_S)
    )


def parse_consume_timestamp(text: str) -> int:
    """``yyyyMMddHHmmss`` (local time, as RocketMQ reads it) to milliseconds since the epoch."""
    try:
        parsed = time.strptime(text, CONSUME_TIMESTAMP_FORMAT)
    except ValueError:
        raise ValueError(
            f"consume_timestamp {text!r} is not yyyyMMddHHmmss (e.g. '20210701080000')"
        ) from None
    return int(time.mktime(parsed) * 1000)


def format_consume_timestamp(timestamp_ms: int) -> str:
    """Milliseconds since the epoch to ``yyyyMMddHHmmss`` in local time."""
    return time.strftime(CONSUME_TIMESTAMP_FORMAT, time.localtime(timestamp_ms / 1000))


def _addrs(value: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(value, str):
        # RocketMQ's namesrvAddr is one string, "host:port;host:port".
        value = [a for a in value.replace(",", ";").split(";") if a.strip()]
    return tuple(a.strip() for a in value)


def _check_common(
    group: str, addrs: tuple[str, ...], consume_timestamp: str, pull_batch_size: int
) -> None:
    check_group(group)
    if not addrs:
        raise ValueError("namesrv_addrs is empty; give at least one nameserver 'host:port'")
    parse_consume_timestamp(consume_timestamp)
    if not 1 <= pull_batch_size <= PULL_BATCH_SIZE_MAX:
        raise ValueError(f"pull_batch_size is {pull_batch_size}; allowed 1..{PULL_BATCH_SIZE_MAX}")


def _check_orderly(suspend_ms: int, lock_interval_ms: int, lock_max_live_ms: int) -> None:
    low, high = SUSPEND_CURRENT_QUEUE_TIME_MIN_MS, SUSPEND_CURRENT_QUEUE_TIME_MAX_MS
    if not low <= suspend_ms <= high:
        raise ValueError(f"suspend_current_queue_time_ms is {suspend_ms}; allowed {low}..{high}")
    if lock_interval_ms < 1:
        raise ValueError(f"rebalance_lock_interval_ms is {lock_interval_ms}; it must be ≥ 1")
    if lock_max_live_ms <= lock_interval_ms:
        raise ValueError(
            f"rebalance_lock_max_live_ms ({lock_max_live_ms}) must exceed "
            f"rebalance_lock_interval_ms ({lock_interval_ms}), or locks lapse between renewals"
        )


def clamp_suspend_ms(value_ms: int, default_ms: int) -> int:
    """The pause of an orderly queue: the context's value (-1 = ``default_ms``), clamped to
    RocketMQ's 10..30000 ms."""
    chosen = default_ms if value_ms == -1 else value_ms
    return min(max(chosen, SUSPEND_CURRENT_QUEUE_TIME_MIN_MS), SUSPEND_CURRENT_QUEUE_TIME_MAX_MS)


@dataclass(frozen=True)
class PushConsumerConfig:
    """Settings of a :class:`PushConsumer` (RocketMQ's ``DefaultMQPushConsumer``, SPEC §6.2)."""

    consumer_group: str
    """Consumer group; every member must subscribe to the same topics and tags (SPEC §6.17)."""
    namesrv_addrs: tuple[str, ...]
    """Nameserver addresses, ``("host:port", ...)`` (a "a;b" string is accepted too)."""
    message_model: MessageModel = MessageModel.CLUSTERING
    """CLUSTERING (share the queues, offsets on the broker) or BROADCASTING."""
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    """Start position of a queue the group has no stored offset for."""
    consume_timestamp: str = field(default_factory=_default_consume_timestamp)
    """For CONSUME_FROM_TIMESTAMP: local time ``yyyyMMddHHmmss``; default 30 minutes ago."""
    allocate_strategy: AllocateStrategy | None = None
    """Queue allocation in clustering mode; None = AllocateAveragely (SPEC §6.10)."""
    instance_name: str = "DEFAULT"
    """Client instance name. "DEFAULT" becomes "{pid}#{n}" in clustering mode, so two consumers
    of one process are two members; in broadcasting mode it names the local offsets directory."""
    client_ip: str | None = None
    """IP part of the client id ("ip@instance"); None = this host's address."""
    consume_thread_max: int = 20
    """Listener calls running at once (thread pool size for plain listeners; worker tasks on the
    event loop for every listener)."""
    consume_message_batch_max_size: int = 1
    """Messages per listener call (SPEC §6.18), 1..pull_batch_size."""
    pull_batch_size: int = 256
    """Messages asked for per pull, 1..1024. RocketMQ asks for 32; RocketQ for 256 because a pull
    call costs a Python client and broker a few hundred µs of CPU whatever it carries, and 32
    messages of 1 KiB fill an eighth of the broker's byte cap per pull (256 KiB,
    maxTransferBytesOnMessageInMemory, which still bounds every pull's memory). Measured on a
    drain of 1 KiB messages (issue 16): broker CPU per message 15 → 6.5 µs, client 22 → 16.5 µs.
    256 is a quarter of ``pull_threshold_for_queue``, so flow control stays fine-grained. A
    broker gives at most its maxTransferCountOnMessageInMemory (RocketQ's default is 256 too)."""
    pull_interval_ms: int = 0
    """Pause between two pulls of one queue; 0 pulls again at once."""
    pull_threshold_for_queue: int = 1000
    """Flow control: no pull while a queue caches more messages than this (SPEC §6.6)."""
    pull_threshold_size_for_queue_mib: int = 100
    """Flow control: no pull while a queue caches more body MiB than this."""
    consume_concurrently_max_span: int = 2000
    """Flow control: no pull while the cached offsets of a queue span more than this."""
    max_reconsume_times: int = -1
    """Redeliveries before the dead-letter topic; -1 = the group's setting (16). Orderly: -1
    means unlimited (a failing message blocks its queue until it succeeds, SPEC §6.15)."""
    consume_timeout_minutes: int = 15
    """A message in flight this long is sent back for retry and released (SPEC §6.13).
    Not used by orderly consumers: a stuck call there holds its queue by design."""
    suspend_current_queue_time_ms: int = 1_000
    """Orderly: the pause of a queue after SUSPEND_CURRENT_QUEUE_A_MOMENT, 10..30000 (§6.15)."""
    rebalance_lock_interval_ms: int = 20_000
    """Orderly, clustering: how often the broker locks of all owned queues are renewed."""
    rebalance_lock_max_live_ms: int = 30_000
    """Orderly, clustering: a lock not renewed for this long is treated as lost (no pulls, no
    listener calls). Keep it below the broker's rebalanceLockMaxLiveTime (60 s), so this client
    stops before the broker may give the queue to another member."""
    rebalance_interval_ms: int = 20_000
    """Periodic rebalance; membership notices from brokers trigger one at once (SPEC §6.10)."""
    persist_consumer_offset_interval_ms: int = 5_000
    """How often consume offsets are written to the broker or the local file (SPEC §6.12)."""
    broker_suspend_max_time_ms: int = 15_000
    """Long-poll hold asked of the broker when a queue is empty (SPEC §6.9)."""
    consumer_timeout_when_suspend_ms: int = 30_000
    """gRPC deadline of a long-polled pull; must exceed broker_suspend_max_time_ms."""
    pull_inflight_max: int = 4096
    """Cap on pull calls open at once across all queues (a queue waits for a slot)."""
    await_termination_ms: int = 5_000
    """On close, how long to wait for running listener calls before persisting offsets."""
    offset_store_dir: str | None = None
    """Broadcasting: directory of ``{client_id}/{group}/offsets.json``; None =
    ``$ROCKETMQ_CLIENT_LOCAL_OFFSET_STORE_DIR`` or ``~/.rocketmq_offsets``."""
    poll_name_server_interval_ms: int = 30_000
    """Route refresh period of the client instance (SPEC §2.5)."""
    heartbeat_broker_interval_ms: int = 30_000
    """Heartbeat period to every broker in use."""
    request_timeout_ms: int = 3_000
    """Timeout of non-held calls (offsets, consumer lists, send-back)."""
    pull_stream: bool = True
    """Pull down one Messaging.PullStream per broker instead of a unary Pull per request (a
    unary call costs gRPC ~2-3x the CPU of a stream message on both sides, as RocketMQ's pulls
    share one connection); falls back to Pull for a broker without it. Signed clients (an
    access key) always use Pull."""
    security: ClientSecurity | None = None
    """TLS files and access key (rocketq.client.security); None = the process default, which
    the ROCKETQ_TLS_* / ROCKETQ_ACCESS_KEY environment sets."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "namesrv_addrs", _addrs(self.namesrv_addrs))
        _check_common(
            self.consumer_group, self.namesrv_addrs, self.consume_timestamp, self.pull_batch_size
        )
        if not 1 <= self.consume_message_batch_max_size <= CONSUME_BATCH_MAX:
            raise ValueError(
                f"consume_message_batch_max_size is {self.consume_message_batch_max_size}; "
                f"allowed 1..{CONSUME_BATCH_MAX}"
            )
        if self.consume_message_batch_max_size > self.pull_batch_size:
            raise ValueError(
                f"consume_message_batch_max_size ({self.consume_message_batch_max_size}) must "
                f"not exceed pull_batch_size ({self.pull_batch_size}): a listener call never "
                "gets more than one pull returns (SPEC §6.18)"
            )
        _check_orderly(
            self.suspend_current_queue_time_ms,
            self.rebalance_lock_interval_ms,
            self.rebalance_lock_max_live_ms,
        )
        positive = {
            "consume_thread_max": self.consume_thread_max,
            "pull_threshold_for_queue": self.pull_threshold_for_queue,
            "pull_threshold_size_for_queue_mib": self.pull_threshold_size_for_queue_mib,
            "consume_concurrently_max_span": self.consume_concurrently_max_span,
            "consume_timeout_minutes": self.consume_timeout_minutes,
            "rebalance_interval_ms": self.rebalance_interval_ms,
            "persist_consumer_offset_interval_ms": self.persist_consumer_offset_interval_ms,
            "pull_inflight_max": self.pull_inflight_max,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} is {value}; it must be at least 1")
        if self.pull_interval_ms < 0:
            raise ValueError(f"pull_interval_ms is {self.pull_interval_ms}; it must be ≥ 0")
        if self.consumer_timeout_when_suspend_ms <= self.broker_suspend_max_time_ms:
            raise ValueError(
                "consumer_timeout_when_suspend_ms must exceed broker_suspend_max_time_ms, or "
                "every long-polled pull on an empty queue ends in a client timeout"
            )


@dataclass(frozen=True)
class LitePullConsumerConfig:
    """Settings of a :class:`LitePullConsumer` (RocketMQ's ``DefaultLitePullConsumer``)."""

    consumer_group: str
    """Consumer group (used for offsets and, with subscribe(), for rebalancing)."""
    namesrv_addrs: tuple[str, ...]
    """Nameserver addresses, ``("host:port", ...)``."""
    message_model: MessageModel = MessageModel.CLUSTERING
    """CLUSTERING (offsets on the broker, queues shared) or BROADCASTING (local offsets)."""
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    """Start position of a queue with no stored offset."""
    consume_timestamp: str = field(default_factory=_default_consume_timestamp)
    """For CONSUME_FROM_TIMESTAMP: local time ``yyyyMMddHHmmss``; default 30 minutes ago."""
    allocate_strategy: AllocateStrategy | None = None
    """Queue allocation for subscribe() in clustering mode; None = AllocateAveragely."""
    instance_name: str = "DEFAULT"
    """Client instance name; "DEFAULT" becomes "{pid}#{n}" in clustering mode."""
    client_ip: str | None = None
    """IP part of the client id; None = this host's address."""
    pull_batch_size: int = 10
    """Messages per pull and at most per poll() result, 1..1024."""
    pull_threshold_for_queue: int = 1000
    """Flow control: no pull while a queue holds more unpolled messages than this."""
    pull_threshold_size_for_queue_mib: int = 100
    """Flow control: no pull while a queue holds more unpolled body MiB than this."""
    pull_threshold_for_all: int = 10_000
    """Flow control: no pull while all queues together hold more unpolled messages than this."""
    poll_timeout_ms: int = 5_000
    """Default wait of poll() when nothing is buffered."""
    auto_commit: bool = True
    """Commit the offsets of what earlier poll() calls returned, from within poll() and close()."""
    auto_commit_interval_ms: int = 5_000
    """Minimum time between two automatic commits."""
    rebalance_interval_ms: int = 20_000
    """Periodic rebalance of subscribe()d topics."""
    persist_consumer_offset_interval_ms: int = 5_000
    """How often committed offsets are written when auto_commit is off and commit() kept them
    in memory only."""
    broker_suspend_max_time_ms: int = 20_000
    """Long-poll hold asked of the broker (a pull consumer's 20 s, SPEC §6.9)."""
    consumer_timeout_when_suspend_ms: int = 30_000
    """gRPC deadline of a long-polled pull; must exceed broker_suspend_max_time_ms."""
    pull_inflight_max: int = 4096
    """Cap on pull calls open at once across all queues."""
    offset_store_dir: str | None = None
    """Broadcasting: base directory of the local offsets file; None = the RocketMQ default."""
    poll_name_server_interval_ms: int = 30_000
    """Route refresh period of the client instance."""
    heartbeat_broker_interval_ms: int = 30_000
    """Heartbeat period to every broker in use."""
    request_timeout_ms: int = 3_000
    """Timeout of non-held calls (offsets, consumer lists)."""
    pull_stream: bool = True
    """Pull down one Messaging.PullStream per broker, as the push consumer does (see its
    ``pull_stream``); False = a unary Pull per request."""
    security: ClientSecurity | None = None
    """TLS files and access key (rocketq.client.security); None = the process default, which
    the ROCKETQ_TLS_* / ROCKETQ_ACCESS_KEY environment sets."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "namesrv_addrs", _addrs(self.namesrv_addrs))
        _check_common(
            self.consumer_group, self.namesrv_addrs, self.consume_timestamp, self.pull_batch_size
        )
        for name in (
            "pull_threshold_for_queue",
            "pull_threshold_size_for_queue_mib",
            "pull_threshold_for_all",
            "auto_commit_interval_ms",
            "rebalance_interval_ms",
            "persist_consumer_offset_interval_ms",
            "pull_inflight_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}; it must be at least 1")
        if self.poll_timeout_ms < 0:
            raise ValueError(f"poll_timeout_ms is {self.poll_timeout_ms}; it must be ≥ 0")
        if self.consumer_timeout_when_suspend_ms <= self.broker_suspend_max_time_ms:
            raise ValueError(
                "consumer_timeout_when_suspend_ms must exceed broker_suspend_max_time_ms"
            )
