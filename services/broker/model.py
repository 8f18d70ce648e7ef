"""The broker's metadata records: topic configs and subscription group configs.

Plain dataclasses with RocketMQ's field names in their JSON form (``topics.json``,
``subscriptionGroup.json`` use RocketMQ's camelCase keys so the files read like RocketMQ's);
conversion to and from protobuf lives here, in one place, so handlers never build them by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.validation import PERM_READ, PERM_WRITE


def topic_message_type_name(value: common_pb2.TopicMessageType.ValueType) -> str:
    """A TopicMessageType as Apache RocketMQ spells it; unset reads as MIXED."""
    if value == common_pb2.TOPIC_MESSAGE_TYPE_UNSPECIFIED:
        return "MIXED"
    return common_pb2.TopicMessageType.Name(value)


def check_message_type(value: int) -> None:
    """Raise ValueError unless ``value`` is a TopicMessageType (unset counts as MIXED)."""
    if value not in common_pb2.TopicMessageType.values():
        names = "NORMAL, FIFO, DELAY, TRANSACTION, MIXED"
        raise ValueError(f"message_type {value} is not a topic message type; use one of {names}")


@dataclass
class TopicConfig:
    """One topic on this broker (SPEC §4.3). Queues [0, max(read, write)) exist."""

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0
    order: bool = False
    message_type: common_pb2.TopicMessageType.ValueType = common_pb2.TOPIC_MESSAGE_TYPE_UNSPECIFIED
    """common_pb2.TopicMessageType: what the v2 gateway accepts; unset = MIXED (RocketQ's v1
    topics were type-agnostic, so every existing topic keeps accepting everything)."""

    @property
    def queue_nums(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_pb(self) -> common_pb2.TopicConfig:
        return common_pb2.TopicConfig(
            topic_name=self.topic_name,
            read_queue_nums=self.read_queue_nums,
            write_queue_nums=self.write_queue_nums,
            perm=self.perm,
            topic_sys_flag=self.topic_sys_flag,
            order=self.order,
            message_type=self.message_type,
        )

    @classmethod
    def from_pb(cls, pb: common_pb2.TopicConfig) -> TopicConfig:
        return cls(
            topic_name=pb.topic_name,
            read_queue_nums=pb.read_queue_nums,
            write_queue_nums=pb.write_queue_nums,
            perm=pb.perm,
            topic_sys_flag=pb.topic_sys_flag,
            order=pb.order,
            message_type=pb.message_type,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }
        if self.message_type != common_pb2.TOPIC_MESSAGE_TYPE_UNSPECIFIED:
            out["messageType"] = topic_message_type_name(self.message_type)  # untyped: no key
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(data["topicName"]),
            read_queue_nums=int(data.get("readQueueNums", 4)),
            write_queue_nums=int(data.get("writeQueueNums", 4)),
            perm=int(data.get("perm", 6)),
            topic_sys_flag=int(data.get("topicSysFlag", 0)),
            order=bool(data.get("order", False)),
            message_type=common_pb2.TopicMessageType.Value(str(data["messageType"]))
            if "messageType" in data
            else common_pb2.TOPIC_MESSAGE_TYPE_UNSPECIFIED,
        )


@dataclass
class SubscriptionGroupConfig:
    """How the broker treats one consumer group (defaults are RocketMQ's)."""

    group_name: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False

    def to_pb(self) -> common_pb2.SubscriptionGroupConfig:
        return common_pb2.SubscriptionGroupConfig(**asdict(self))

    @classmethod
    def from_pb(cls, pb: common_pb2.SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Absent optional fields take their defaults."""
        out = cls(group_name=pb.group_name)
        for name in (
            "consume_enable",
            "consume_broadcast_enable",
            "retry_queue_nums",
            "retry_max_times",
            "broker_id",
            "which_broker_when_consume_slowly",
            "notify_consumer_ids_changed_enable",
            "consume_message_orderly",
        ):
            if pb.HasField(name):
                setattr(out, name, getattr(pb, name))
        return out

    _JSON_KEYS = (
        ("group_name", "groupName"),
        ("consume_enable", "consumeEnable"),
        ("consume_broadcast_enable", "consumeBroadcastEnable"),
        ("retry_queue_nums", "retryQueueNums"),
        ("retry_max_times", "retryMaxTimes"),
        ("broker_id", "brokerId"),
        ("which_broker_when_consume_slowly", "whichBrokerWhenConsumeSlowly"),
        ("notify_consumer_ids_changed_enable", "notifyConsumerIdsChangedEnable"),
        ("consume_message_orderly", "consumeMessageOrderly"),
    )

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, name) for name, key in self._JSON_KEYS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubscriptionGroupConfig:
        out = cls(group_name=str(data["groupName"]))
        for name, key in cls._JSON_KEYS[1:]:
            if key in data:
                setattr(out, name, type(getattr(out, name))(data[key]))
        return out
