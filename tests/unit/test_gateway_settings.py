"""The gateway's settings for the official SDKs and the topics' message types, without a server:
the broker's config keys (validation), the Settings built from them and a group's retry policy,
the type check of a v2 message, and message_type in topics.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketq._api.rocketq.v1 import common_pb2
from services.broker import config as broker_config
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway.message_types import accepted_types, conflict
from services.broker.gateway.settings import settings_for
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import ManualClock
from services.store.config_files import TOPICS

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("gatewayProducerMaxAttempts", "0", "1..100"),
        ("gatewayProducerBackoffInitialMs", "0", "1..60000"),
        ("gatewayProducerBackoffMaxMs", "5", r"gatewayProducerBackoffInitialMs \(10\)"),
        ("gatewayProducerBackoffMultiplier", "0.5", "1..10"),
        ("gatewayReceiveBatchSize", "33", "1..32"),
        ("gatewayLongPollingTimeoutMs", "4999", "5000..60000"),
        ("gatewayValidateMessageType", "perhaps", "gatewayValidateMessageType"),
    ],
)
def test_gateway_keys_refuse_values_out_of_range(key: str, value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        broker_config.load(None, {key: value}, {})


def producer_settings(**keys: str) -> v2.Settings:
    cfg = broker_config.load(None, keys, {})
    client = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[]))
    return settings_for(client, cfg, None)


def test_producer_settings_follow_the_keys() -> None:
    default = producer_settings()
    assert default.backoff_policy.max_attempts == 3
    assert default.publishing.validate_message_type is True
    assert default.metric.on is False
    tuned = producer_settings(
        gatewayProducerMaxAttempts="5",
        gatewayProducerBackoffInitialMs="200",
        gatewayProducerBackoffMaxMs="3500",
        gatewayProducerBackoffMultiplier="3",
        gatewayValidateMessageType="false",
        maxMessageSize="65536",
    )
    exp = tuned.backoff_policy.exponential_backoff
    assert tuned.backoff_policy.max_attempts == 5
    assert (exp.initial.ToMilliseconds(), exp.max.ToMilliseconds(), exp.multiplier) == (
        200,
        3500,
        3.0,
    )
    assert tuned.publishing.max_body_size == 65536
    assert tuned.publishing.validate_message_type is False


def consumer_settings(
    group: SubscriptionGroupConfig | None,
    language: int = v2.PYTHON,
    asked_poll_s: int = 0,
    **keys: str,
) -> v2.Settings:
    cfg = broker_config.load(None, keys, {})
    sub = v2.Subscription(group=v2.Resource(name="g"))
    if asked_poll_s:
        sub.long_polling_timeout.FromSeconds(asked_poll_s)
    client = v2.Settings(
        client_type=v2.PUSH_CONSUMER,
        subscription=sub,
        user_agent=v2.UA(language=language),
    )
    return settings_for(client, cfg, group)


def test_consumer_backoff_follows_the_delay_levels_and_the_groups_retries() -> None:
    out = consumer_settings(
        SubscriptionGroupConfig("g", retry_max_times=2, consume_message_orderly=True),
        messageDelayLevel="2s 7s 1m",
        gatewayReceiveBatchSize="8",
        gatewayLongPollingTimeoutMs="15000",
    )
    policy = out.backoff_policy
    assert policy.WhichOneof("strategy") == "customized_backoff"
    assert [d.ToSeconds() for d in policy.customized_backoff.next] == [2, 7, 60]
    assert policy.max_attempts == 3  # retryMaxTimes + 1
    assert out.subscription.fifo is True
    assert out.subscription.receive_batch_size == 8
    assert out.subscription.long_polling_timeout.ToMilliseconds() == 15_000


def test_consumer_defaults_for_an_unknown_group_and_its_own_polling_time() -> None:
    out = consumer_settings(None, asked_poll_s=7)
    assert out.backoff_policy.max_attempts == 17  # RocketMQ's 16 retries + the first
    assert out.subscription.fifo is False
    assert out.subscription.receive_batch_size == 32
    assert out.subscription.long_polling_timeout.ToSeconds() == 7  # the client's own kept


def test_node_consumers_get_the_table_as_an_exponential_backoff() -> None:
    out = consumer_settings(SubscriptionGroupConfig("g"), v2.NODE_JS, messageDelayLevel="3s 9s")
    exp = out.backoff_policy.exponential_backoff
    assert (exp.initial.ToSeconds(), exp.max.ToSeconds()) == (3, 9)


def v2_message(**sp: object) -> v2.Message:
    return v2.Message(topic=v2.Resource(name="t"), system_properties=v2.SystemProperties(**sp))


def test_message_types_against_topic_types() -> None:
    normal, fifo = v2_message(), v2_message(message_group="g1")
    delayed = v2_message(delivery_timestamp={"seconds": 5})
    half = v2_message(message_type=v2.TRANSACTION, message_group="g1")  # transaction wins
    fifo_topic = TopicConfig("t", message_type=common_pb2.FIFO)
    assert conflict(fifo_topic, fifo) is None
    refused = conflict(fifo_topic, normal)
    assert refused.code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert "FIFO" in refused.message and "NORMAL" in refused.message
    assert "TRANSACTION" in conflict(fifo_topic, half).message
    untyped, mixed = TopicConfig("t"), TopicConfig("t", message_type=common_pb2.MIXED)
    for topic in (untyped, mixed):
        assert all(conflict(topic, m) is None for m in (normal, fifo, delayed, half))
        assert set(accepted_types(topic.message_type)) == {
            v2.NORMAL,
            v2.FIFO,
            v2.DELAY,
            v2.TRANSACTION,
        }
    assert accepted_types(common_pb2.DELAY) == (v2.DELAY,)


def test_message_type_is_kept_in_topics_json_and_a_bad_one_is_skipped(tmp_path: Path) -> None:
    cfg = broker_config.BrokerConfig(store_dir=tmp_path, namesrv_addrs=[])
    mgr = TopicConfigManager(cfg, tmp_path / "config", ManualClock())
    mgr.load()
    mgr.put(TopicConfig("Orders", message_type=common_pb2.FIFO))
    mgr.put(TopicConfig("Any"))
    raw = json.loads((tmp_path / "config" / TOPICS).read_text())["topicConfigTable"]
    assert raw["Orders"]["messageType"] == "FIFO" and "messageType" not in raw["Any"]
    raw["Any"]["messageType"] = "SOMETIMES"
    (tmp_path / "config" / TOPICS).write_text(json.dumps({"topicConfigTable": raw}))
    again = TopicConfigManager(cfg, tmp_path / "config", ManualClock())
    again.load()
    orders = again.get("Orders")
    assert orders is not None and orders.message_type == common_pb2.FIFO
    assert again.get("Any") is None  # skipped with a warning, as any malformed entry
