"""The server's part of the Settings a Telemetry stream answers, built from the broker's config.

The reply echoes the client's settings and adds (shared brief v2-protocol.md, "Start-up and
settings"; names as Apache's proxy config, with a ``gateway`` prefix):

| client     | field                          | from                                          |
|------------|--------------------------------|-----------------------------------------------|
| producer   | backoff_policy (exponential)   | gatewayProducerMaxAttempts, ...BackoffInitial- |
|            |                                | Ms / ...BackoffMaxMs / ...BackoffMultiplier   |
|            | publishing.max_body_size       | maxMessageSize                                |
|            | publishing.validate_message_type | gatewayValidateMessageType                  |
| consumer   | backoff_policy.max_attempts    | the group's retryMaxTimes + 1                 |
|            | backoff_policy (customized)    | the broker's messageDelayLevel table: retry n |
|            |                                | waits level n, the last level beyond it       |
|            | subscription.fifo              | the group's consumeMessageOrderly             |
|            | subscription.receive_batch_size| gatewayReceiveBatchSize                       |
|            | subscription.long_polling_...  | gatewayLongPollingTimeoutMs (unless the       |
|            |                                | client asked for its own)                     |
| every one  | metric.on = false              |                                               |

A consumer's backoff is customized like Apache's (its default retry policy follows the delay
levels) except for the Node.js SDK, which ignores a customized backoff (1.0.8: "not yet
implemented") and would then give up after one attempt: it gets the same table as an
exponential backoff from the first level to the last.
"""

from __future__ import annotations

from typing import Any

from services.broker.config import BrokerConfig
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway.v2common import duration, named
from services.broker.model import SubscriptionGroupConfig

DEFAULT_RETRY_MAX_TIMES = 16
"""A group the broker does not know yet (created on first use) retries as RocketMQ's default."""
CUSTOMIZED_BACKOFF_MAX_LEVELS = 64
_NO_CUSTOMIZED_BACKOFF = frozenset({v2.NODE_JS})
"""SDK languages that ignore a customized backoff (module docstring)."""


def settings_for(client: Any, config: BrokerConfig, group: SubscriptionGroupConfig | None) -> Any:
    """The reply to ``client``'s Settings; ``group``: its consumer group's config, if known."""
    out = v2.Settings()
    out.CopyFrom(client)
    out.metric.CopyFrom(v2.Metric(on=False))
    if client.HasField("publishing"):
        _producer(out, config)
    if client.HasField("subscription"):
        _consumer(out, config, group, client.user_agent.language)
    return out


def _producer(out: Any, config: BrokerConfig) -> None:
    backoff = out.backoff_policy
    backoff.max_attempts = config.gateway_producer_max_attempts
    backoff.exponential_backoff.CopyFrom(
        v2.ExponentialBackoff(
            initial=duration(config.gateway_producer_backoff_initial_ms),
            max=duration(config.gateway_producer_backoff_max_ms),
            multiplier=config.gateway_producer_backoff_multiplier,
        )
    )
    out.publishing.max_body_size = config.max_message_size_bytes
    out.publishing.validate_message_type = config.gateway_validate_message_type


def _consumer(
    out: Any, config: BrokerConfig, group: SubscriptionGroupConfig | None, language: int
) -> None:
    retries = group.retry_max_times if group is not None else DEFAULT_RETRY_MAX_TIMES
    levels_ms = config.delay_levels_ms()[:CUSTOMIZED_BACKOFF_MAX_LEVELS]
    backoff = out.backoff_policy
    # retryMaxTimes -1 (an orderly group retrying forever, DESIGN.md §5) has no attempt count in
    # the protocol: the largest int32 is as close as it gets
    backoff.max_attempts = retries + 1 if retries >= 0 else 2**31 - 1
    if language in _NO_CUSTOMIZED_BACKOFF:
        backoff.exponential_backoff.CopyFrom(
            v2.ExponentialBackoff(
                initial=duration(levels_ms[0]), max=duration(levels_ms[-1]), multiplier=2.0
            )
        )
    else:
        backoff.customized_backoff.CopyFrom(
            v2.CustomizedBackoff(next=[duration(ms) for ms in levels_ms])
        )
    sub = out.subscription
    sub.fifo = group is not None and group.consume_message_orderly
    sub.receive_batch_size = config.gateway_receive_batch_size
    if not sub.HasField("long_polling_timeout"):
        sub.long_polling_timeout.CopyFrom(duration(config.gateway_long_polling_timeout_ms))


def group_of(client: Any, groups: Any) -> SubscriptionGroupConfig | None:
    """The consumer group config of a subscribing client (None for producers or unknown)."""
    if not client.HasField("subscription"):
        return None
    found: SubscriptionGroupConfig | None = groups.get(named(client.subscription.group))
    return found
