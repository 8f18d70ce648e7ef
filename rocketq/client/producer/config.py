"""Producer configuration: frozen dataclasses with RocketMQ's defaults (SPEC §5)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from rocketq.client._instance import ClientConfig, local_ip
from rocketq.client._nameserver import parse_addrs
from rocketq.client.security import ClientSecurity
from rocketq.validation import AUTO_CREATE_TOPIC_KEY, MESSAGE_MAX_BYTES, check_group


@dataclass(frozen=True)
class ProducerConfig:
    """How a :class:`Producer` behaves. Defaults are RocketMQ's ``DefaultMQProducer``'s."""

    group: str
    """Producer group; the broker asks any live producer of it about transactions."""
    namesrv_addrs: Sequence[str] | str
    """Nameserver addresses, a list of "host:port" or RocketMQ's "a:9876;b:9876"."""
    instance_name: str = "DEFAULT"
    """Second half of the client id; "DEFAULT" becomes the process id, as in RocketMQ."""
    client_ip: str = ""
    """First half of the client id; empty = this host's address."""
    send_msg_timeout_ms: int = 3000
    """Budget of one send, all retries included (``sendMsgTimeout``)."""
    retry_times_when_send_failed: int = 2
    """Extra attempts of a sync send (or batch), each on another broker when there is one."""
    retry_times_when_send_async_failed: int = 2
    """Extra attempts of an async send, on the same broker (SPEC §5.2)."""
    retry_another_broker_when_not_store_ok: bool = False
    """Resend elsewhere when a broker stored the message but answered FLUSH_DISK_TIMEOUT,
    FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE; otherwise that status is returned as is."""
    max_message_size_bytes: int = MESSAGE_MAX_BYTES
    """Largest message or batch: topic + body + 20 + properties, summed (SPEC §5.5)."""
    compress_msg_body_over_bytes: int = 4096
    """A message sent alone whose body is larger is zlib-compressed; 0 disables compression."""
    batch_as_records: bool = True
    """Send a batch of several messages encoded once as commitlog records (SendRequest.records,
    DESIGN.md §12), which the broker stores as they came; False = as protobuf messages."""
    send_stream: bool = True
    """Send down one Messaging.SendStream per broker instead of a unary Send per request (a
    third of gRPC's CPU per request on both sides); falls back to Send for a broker without
    it. Signed clients (an access key) always use Send."""
    send_latency_fault_enable: bool = False
    """Avoid slow or failing brokers for a while (SPEC §5.3 latency fault tolerance)."""
    create_topic_key: str = AUTO_CREATE_TOPIC_KEY
    """Template topic whose route a producer borrows for a topic that does not exist yet."""
    default_topic_queue_nums: int = 4
    """Queues per broker of an auto-created topic."""
    poll_name_server_interval_ms: int = 30_000
    """How often routes of topics in use are refreshed (SPEC §2.5)."""
    heartbeat_broker_interval_ms: int = 30_000
    """How often brokers in use get a heartbeat (SPEC §4.2)."""
    request_timeout_ms: int = 3_000
    """Deadline of a nameserver request."""
    async_in_flight_max: int = 10_000
    """Async and oneway sends not yet finished; beyond this send_async raises
    ResourceExhaustedError (RocketMQ's backPressureForAsyncSendNum)."""
    security: ClientSecurity | None = None
    """TLS files and access key (rocketq.client.security); None = the process default, which
    the ROCKETQ_TLS_* / ROCKETQ_ACCESS_KEY environment sets."""

    def __post_init__(self) -> None:
        check_group(self.group, "producer group")
        object.__setattr__(self, "namesrv_addrs", tuple(parse_addrs(self.namesrv_addrs)))
        if self.send_msg_timeout_ms <= 0:
            raise ValueError(
                f"send_msg_timeout_ms must be positive, got {self.send_msg_timeout_ms}"
            )
        for name in ("retry_times_when_send_failed", "retry_times_when_send_async_failed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.max_message_size_bytes <= MESSAGE_MAX_BYTES * 4:
            raise ValueError(
                f"max_message_size_bytes {self.max_message_size_bytes} is out of range"
            )
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise ValueError("default_topic_queue_nums must be 1..1024")
        if self.async_in_flight_max <= 0:
            raise ValueError("async_in_flight_max must be positive")

    def client_config(self) -> ClientConfig:
        instance = str(os.getpid()) if self.instance_name == "DEFAULT" else self.instance_name
        return ClientConfig(
            namesrv_addrs=tuple(self.namesrv_addrs),
            instance_name=instance,
            client_ip=self.client_ip or local_ip(),
            poll_name_server_interval_ms=self.poll_name_server_interval_ms,
            heartbeat_broker_interval_ms=self.heartbeat_broker_interval_ms,
            request_timeout_ms=self.request_timeout_ms,
            security=self.security,
        )


@dataclass(frozen=True)
class AccumulatingProducerConfig(ProducerConfig):
    """A :class:`ProducerConfig` plus the batching bounds of an :class:`AccumulatingProducer`."""

    linger_ms: int = 5
    """How long a batch waits for more messages after its first one."""
    batch_max_bytes: int = 256 * 1024
    """A batch is sent once it holds this many bytes (SPEC §5.5 accounting)."""
    batch_max_messages: int = 1000
    """A batch is sent once it holds this many messages."""
    buffer_max_bytes: int = 64 * 1024 * 1024
    """Bytes waiting or in flight; send() waits for room beyond this (backpressure)."""
    in_flight_batches_max: int = 32
    """Batches being sent at once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.linger_ms < 0:
            raise ValueError("linger_ms must be >= 0")
        if not 0 < self.batch_max_bytes <= self.max_message_size_bytes:
            raise ValueError("batch_max_bytes must be positive and <= max_message_size_bytes")
        if self.batch_max_messages <= 0 or self.in_flight_batches_max <= 0:
            raise ValueError("batch_max_messages and in_flight_batches_max must be positive")
        if self.buffer_max_bytes < self.batch_max_bytes:
            raise ValueError("buffer_max_bytes must be >= batch_max_bytes")
