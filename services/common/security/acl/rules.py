"""What each RPC needs: nothing (health, reflection), a signed request from any user, the
``admin`` or ``internal`` role, or a permission on the topics and groups its request names.

A method of a RocketQ service missing from :data:`RULES` needs ``admin``: an RPC added later is
closed until someone decides who may call it (default deny).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rocketq import codec
from services.common.security.acl.model import Perm

Need = tuple[str, str, Perm]
"""("topic" | "group", name, the permission needed)."""


@dataclass(frozen=True)
class Rule:
    role: str  # "open" | "any" | "admin" | "internal"
    needs: Callable[[Any], Iterator[Need]] | None = None


OPEN = Rule("open")
ANY = Rule("any")
ADMIN = Rule("admin")
INTERNAL = Rule("internal")
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _send(req: Any) -> Iterator[Need]:
    for topic in {m.topic for m in req.messages}:
        yield ("topic", topic, Perm.PUB)
    if req.records:
        # An encoded batch (SendRequest.records): the broker stores it only if every record
        # names the first one's topic, so that topic is the batch's. A batch whose first record
        # cannot be read needs PUB on nothing here: the broker refuses it whole.
        try:
            yield ("topic", codec.record_topic(req.records), Perm.PUB)
        except codec.CorruptRecord:
            return


def _topic_sub(req: Any) -> Iterator[Need]:
    yield ("topic", req.topic, Perm.SUB)


def _group_sub(req: Any) -> Iterator[Need]:
    yield ("group", req.consumer_group, Perm.SUB)


def _topic_group_sub(req: Any) -> Iterator[Need]:
    yield from _group_sub(req)
    yield from _topic_sub(req)


def _locks(req: Any) -> Iterator[Need]:
    yield from _group_sub(req)
    for topic in {q.topic for q in req.queues}:
        yield ("topic", topic, Perm.SUB)


_M = "/rocketq.v1.Messaging/"
_N = "/rocketq.v1.NameServer/"
RULES: dict[str, Rule] = {
    _M + "Send": Rule("res", _send),
    _M + "Pull": Rule("res", _topic_group_sub),
    _M + "UpdateConsumerOffset": Rule("res", _topic_group_sub),
    _M + "QueryConsumerOffset": Rule("res", _topic_group_sub),
    _M + "GetMaxOffset": Rule("res", _topic_sub),
    _M + "GetMinOffset": Rule("res", _topic_sub),
    _M + "SearchOffsetByTimestamp": Rule("res", _topic_sub),
    _M + "LockBatch": Rule("res", _locks),
    _M + "UnlockBatch": Rule("res", _locks),
    _M + "ConsumerSendBack": Rule("res", _group_sub),
    _M + "GetConsumerIdList": Rule("res", _group_sub),
    _M + "QueryMessageByKey": Rule("res", _topic_sub),
    _M + "QueryMessageById": Rule("res", _topic_sub),
    # Pop consumption (services/broker/pop): the group's and the topic's SUB, like Pull
    _M + "Pop": Rule("res", _topic_group_sub),
    _M + "Ack": Rule("res", _topic_group_sub),
    _M + "ChangeInvisibleTime": Rule("res", _topic_group_sub),
    # The producer group of a transaction is not a permission of its own; the half message
    # was only stored if the user could publish to its topic.
    _M + "EndTransaction": ANY,
    # One stream per client for heartbeats and pushed commands; what it subscribes to is
    # checked where it pulls.
    _M + "ClientStream": ANY,
    _M + "ViewMessage": ADMIN,  # an offset id names no topic: any topic's message could be read
    _N + "GetRouteInfoByTopic": ANY,
    _N + "GetClusterInfo": ANY,
    _N + "GetAllTopics": ANY,
    _N + "RegisterBroker": INTERNAL,
    _N + "UnregisterBroker": INTERNAL,
    "/rocketq.v1.Replication/Stream": INTERNAL,
    "/rocketq.v1.Replication/SyncConfig": INTERNAL,
}


# -- apache.rocketmq.v2 (the broker's gateway for the official SDKs), the same rules as above:
# a v2 resource in namespace ns is RocketQ's ``ns%{name}`` (services/broker/gateway/v2common).
def _v2_name(resource: Any) -> str:
    ns = resource.resource_namespace
    return f"{ns}%{resource.name}" if ns else str(resource.name)


def _v2_send(req: Any) -> Iterator[Need]:
    for topic in {_v2_name(m.topic) for m in req.messages}:
        yield ("topic", topic, Perm.PUB)


def _v2_group_topic(req: Any) -> Iterator[Need]:
    yield ("group", _v2_name(req.group), Perm.SUB)
    yield ("topic", _v2_name(req.topic), Perm.SUB)


def _v2_group_queue(req: Any) -> Iterator[Need]:
    yield ("group", _v2_name(req.group), Perm.SUB)
    yield ("topic", _v2_name(req.message_queue.topic), Perm.SUB)


def _v2_queue(req: Any) -> Iterator[Need]:
    yield ("topic", _v2_name(req.message_queue.topic), Perm.SUB)


def _v2_recall(req: Any) -> Iterator[Need]:
    yield ("topic", _v2_name(req.topic), Perm.PUB)


_V2 = "/apache.rocketmq.v2.MessagingService/"
RULES.update(
    {
        _V2 + "QueryRoute": ANY,
        _V2 + "Heartbeat": ANY,
        _V2 + "NotifyClientTermination": ANY,
        _V2 + "Telemetry": ANY,  # settings and server commands; like ClientStream
        _V2 + "SendMessage": Rule("res", _v2_send),
        _V2 + "EndTransaction": ANY,  # as EndTransaction above
        _V2 + "RecallMessage": Rule("res", _v2_recall),  # its publisher's right to the topic
        _V2 + "QueryAssignment": Rule("res", _v2_group_topic),
        _V2 + "ReceiveMessage": Rule("res", _v2_group_queue),
        _V2 + "AckMessage": Rule("res", _v2_group_topic),
        _V2 + "ChangeInvisibleDuration": Rule("res", _v2_group_topic),
        _V2 + "ForwardMessageToDeadLetterQueue": Rule("res", _v2_group_topic),
        _V2 + "PullMessage": Rule("res", _v2_group_queue),
        _V2 + "UpdateOffset": Rule("res", _v2_group_queue),
        _V2 + "GetOffset": Rule("res", _v2_group_queue),
        _V2 + "QueryOffset": Rule("res", _v2_queue),
    }
)


def rule_for(method: str) -> Rule:
    rule = RULES.get(method)
    if rule is not None:
        return rule
    if method.startswith(OPEN_SERVICES):
        return OPEN
    return ADMIN  # Admin, TimerAdmin and anything added later
