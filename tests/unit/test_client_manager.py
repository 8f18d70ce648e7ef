"""ClientManager: heartbeats, groups, membership notices and expiry (SPEC §4.2), and
subscription-consistency detection (SPEC §6.17); no sockets."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from services.broker import client_manager
from services.broker.client_manager import (
    ClientChannel,
    ClientLimitError,
    ClientManager,
    normalise_sql92,
)
from services.broker.config import BrokerConfig
from services.broker.model import SubscriptionGroupConfig
from services.common.clock import ManualClock
from services.common.errors import ServiceError

pytestmark = pytest.mark.unit


def _hb(
    client_id: str,
    group: str = "g",
    subs: tuple[tuple[str, str, int], ...] = (("T", "*", 1),),
    producers: tuple[str, ...] = (),
) -> messaging_pb2.Heartbeat:
    return messaging_pb2.Heartbeat(
        client_id=client_id,
        producers=[messaging_pb2.ProducerData(producer_group=p) for p in producers],
        consumers=[
            messaging_pb2.ConsumerData(
                consumer_group=group,
                subscriptions=[
                    messaging_pb2.SubscriptionData(topic=t, expression=e, sub_version=v)
                    for t, e, v in subs
                ],
            )
        ]
        if group
        else [],
    )


def _drain(channel: ClientChannel) -> list[str]:
    """Kinds of what was pushed to the channel, oldest first ("end" for the close marker)."""
    out: list[str] = []
    while not channel.queue.empty():
        item = channel.queue.get_nowait()
        out.append("end" if item is None else str(item.WhichOneof("command")))
    return out


def _ids_pushed(channel: ClientChannel) -> list[list[str]]:
    out = []
    while not channel.queue.empty():
        item = channel.queue.get_nowait()
        if item is not None and item.HasField("consumer_ids_changed"):
            out.append(list(item.consumer_ids_changed.consumer_ids))
    return out


async def test_heartbeat_registers_groups_and_acks_first() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    ch = cm.open_channel("c1", "ipv4:1.2.3.4:5")
    ack = cm.heartbeat(ch, _hb("c1", producers=("pg",)))
    assert ack.heartbeat_ack.expire_timestamp_ms == ManualClock().now_ms() + 120_000
    assert _drain(ch) == ["heartbeat_ack", "consumer_ids_changed"]
    assert cm.consumer_ids("g") == ["c1"]
    assert cm.producer_client_ids("pg") == ["c1"]
    assert cm.connected_count() == 1
    sub = cm.subscription("g", "T")
    assert sub is not None and sub.expression == "*"
    info = cm.consumer_group_info("g")
    assert info is not None and info.message_model == messaging_pb2.CLUSTERING
    # a repeated heartbeat changes nothing: just the ack
    cm.heartbeat(ch, _hb("c1", producers=("pg",)))
    assert _drain(ch) == ["heartbeat_ack"]


async def test_join_and_leave_notify_members_with_sorted_ids() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    c2 = cm.open_channel("c2")
    cm.heartbeat(c2, _hb("c2"))
    _drain(c2)
    c1 = cm.open_channel("c1")
    cm.heartbeat(c1, _hb("c1"))
    assert _ids_pushed(c2) == [["c1", "c2"]]
    assert _ids_pushed(c1) == [["c1", "c2"]]
    assert cm.consumer_ids("g") == ["c1", "c2"]
    cm.close_channel(c1, "test")
    assert _ids_pushed(c2) == [["c2"]]
    assert cm.consumer_ids("g") == ["c2"]
    cm.close_channel(c2, "test")
    assert cm.consumer_group_info("g") is None
    assert cm.connected_count() == 0


async def test_unregister_leaves_named_groups_or_everything() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    a = cm.open_channel("a")
    cm.heartbeat(a, _hb("a", producers=("pg",)))
    cm.heartbeat(a, _hb("a", group="g2"))
    other = cm.open_channel("b")
    cm.heartbeat(other, _hb("b"))
    _drain(other)
    cm.unregister(a, messaging_pb2.UnregisterClient(client_id="a", consumer_groups=["g"]))
    assert cm.consumer_ids("g") == ["b"] and cm.consumer_ids("g2") == ["a"]
    assert _ids_pushed(other) == [["b"]]
    cm.unregister(a, messaging_pb2.UnregisterClient(client_id="a"))
    assert cm.consumer_ids("g2") == [] and cm.producer_client_ids("pg") == []
    assert cm.connected_count() == 2  # the stream itself stays open


async def test_notify_flag_of_the_group_config_is_honoured() -> None:
    quiet = SubscriptionGroupConfig("g", notify_consumer_ids_changed_enable=False)
    cm = ClientManager(BrokerConfig(), ManualClock(), group_config=lambda g: quiet)
    a = cm.open_channel("a")
    cm.heartbeat(a, _hb("a"))
    b = cm.open_channel("b")
    cm.heartbeat(b, _hb("b"))
    assert _drain(a) == ["heartbeat_ack"]
    assert cm.consumer_ids("g") == ["a", "b"]


async def test_newest_sub_version_per_topic_wins() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    a = cm.open_channel("a")
    cm.heartbeat(a, _hb("a", subs=(("T", "A", 5), ("U", "*", 1))))
    b = cm.open_channel("b")
    cm.heartbeat(b, _hb("b", subs=(("T", "B", 3),)))  # older: ignored
    sub = cm.subscription("g", "T")
    assert sub is not None and (sub.expression, sub.sub_version) == ("A", 5)
    cm.heartbeat(b, _hb("b", subs=(("T", "C", 9),)))
    sub = cm.subscription("g", "T")
    assert sub is not None and sub.tags == {"C"}
    assert cm.subscription("g", "U") is not None  # kept though b did not mention it


async def test_bad_expression_in_heartbeat_records_nothing() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    a = cm.open_channel("a")
    with pytest.raises(ServiceError):
        cm.heartbeat(a, _hb("a", subs=(("T", "||", 1),)))
    assert cm.consumer_ids("g") == []


async def test_silent_clients_expire_and_members_are_told() -> None:
    clock = ManualClock()
    cm = ClientManager(BrokerConfig(channel_expired_timeout_ms=120_000), clock)
    a = cm.open_channel("a")
    cm.heartbeat(a, _hb("a"))
    clock.advance_ms(60_000)
    b = cm.open_channel("b")
    cm.heartbeat(b, _hb("b"))
    _drain(b)
    clock.advance_ms(60_001)
    assert cm.scan_expired() == ["a"]
    assert a.closed and _drain(a)[-1] == "end"
    assert cm.consumer_ids("g") == ["b"]
    assert _ids_pushed(b) == [["b"]]
    assert cm.scan_expired() == []


async def test_a_second_stream_replaces_the_first() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    old = cm.open_channel("a")
    cm.heartbeat(old, _hb("a"))
    new = cm.open_channel("a")
    assert old.closed and cm.channel("a") is new
    cm.close_channel(old, "old stream ended")  # must not remove the client
    assert cm.consumer_ids("g") == ["a"] and cm.connected_count() == 1
    cm.close_channel(new, "gone")
    assert cm.consumer_ids("g") == []


async def test_pushes_reset_offsets_and_drops_when_full() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock(), stream_queue_max=3)
    a = cm.open_channel("a")
    cm.heartbeat(a, _hb("a"))  # ack + ids changed: 2 of 3 slots
    assert cm.notify_reset_offset("g", "T", {0: 5}) == 1
    assert cm.notify_reset_offset("g", "T", {0: 6}) == 0  # queue full: dropped
    kinds = _drain(a)
    assert kinds == ["heartbeat_ack", "consumer_ids_changed", "reset_offset"]
    assert not cm.send_to_client("nobody", messaging_pb2.ClientStreamResponse())


async def test_client_cap() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock(), clients_max=1)
    cm.open_channel("a")
    cm.open_channel("a")  # the same client reconnecting is fine
    with pytest.raises(ClientLimitError):
        cm.open_channel("b")


# -- subscription consistency (SPEC §6.17) ---------------------------------------------------
Sub = tuple[str, str] | tuple[str, str, int]
"""(topic, expression) as TAG, or (topic, expression, common_pb2.SQL92 / TAG)."""


def _kind(sub: Sub) -> common_pb2.ExpressionType.ValueType:
    return common_pb2.ExpressionType.ValueType(sub[2]) if len(sub) == 3 else common_pb2.TAG


def _join(
    cm: ClientManager,
    client_id: str,
    *subs: Sub,
    model: int = messaging_pb2.CLUSTERING,
    version: int = 1,
) -> ClientChannel:
    """Heartbeat ``client_id`` into group "g" with ``subs`` (opening its stream if needed)."""
    channel = cm.channel(client_id) or cm.open_channel(client_id, "ipv4:10.0.0.1:4000")
    cm.heartbeat(
        channel,
        messaging_pb2.Heartbeat(
            client_id=client_id,
            consumers=[
                messaging_pb2.ConsumerData(
                    consumer_group="g",
                    message_model=messaging_pb2.MessageModel.ValueType(model),
                    subscriptions=[
                        messaging_pb2.SubscriptionData(
                            topic=s[0],
                            expression=s[1],
                            expression_type=_kind(s),
                            sub_version=version,
                        )
                        for s in subs
                    ],
                )
            ],
        ),
    )
    return channel


def _conflicts_pushed(channel: ClientChannel) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """(topic, [(client id, expression or None)]) of every conflict notice queued, in order."""
    out = []
    while not channel.queue.empty():
        item = channel.queue.get_nowait()
        if item is not None and item.HasField("subscription_conflict"):
            c = item.subscription_conflict
            out.append(
                (
                    c.topic,
                    [(m.client_id, m.expression if m.subscribed else None) for m in c.members],
                )
            )
    return out


def _topics_in_conflict(cm: ClientManager) -> list[str]:
    return [c.topic for c in cm.conflicts("g")]


async def test_tag_subscriptions_compare_as_tag_sets() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    _join(cm, "a", ("T", "A || B"), ("U", "*"))
    _join(cm, "b", ("T", "B||A"), ("U", "X || *"))
    assert cm.conflicts("g") == []
    cm.check_subscription_consistent("g", "T")  # no conflict: no error
    _join(cm, "b", ("T", "A"), ("U", "*"), version=2)
    [conflict] = cm.conflicts("g")
    assert (conflict.consumer_group, conflict.topic, conflict.pulls_refused) == ("g", "T", True)
    assert [(m.client_id, m.subscribed, m.expression) for m in conflict.members] == [
        ("a", True, "A || B"),
        ("b", True, "A"),
    ]
    assert all(m.expression_type == common_pb2.TAG for m in conflict.members)


async def test_sql92_compares_whitespace_normalised_text_and_the_type_counts() -> None:
    assert normalise_sql92(" a  >  1   AND (b = 'x  y') ") == "a>1 AND(b='x  y')"
    assert normalise_sql92("a IS  NOT NULL") == "a IS NOT NULL"

    cm = ClientManager(BrokerConfig(), ManualClock())
    _join(cm, "a", ("T", "a > 1 AND b = 'x  y'", common_pb2.SQL92))
    _join(cm, "b", ("T", "a>1   AND b='x  y'", common_pb2.SQL92))
    assert cm.conflicts("g") == []
    # whitespace inside a string literal is part of the value
    _join(cm, "b", ("T", "a>1 AND b='x y'", common_pb2.SQL92), version=2)
    assert _topics_in_conflict(cm) == ["T"]
    # same text, other type: a TAG "*" is not the SQL92 predicate
    _join(cm, "b", ("T", "a > 1 AND b = 'x  y'", common_pb2.TAG), version=3)
    [conflict] = cm.conflicts("g")
    assert [m.expression_type for m in conflict.members] == [common_pb2.SQL92, common_pb2.TAG]


async def test_a_member_without_the_topic_counts_as_not_subscribed() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    a = _join(cm, "a", ("T", "*"), ("U", "*"), ("%RETRY%g", "*"))
    b = _join(cm, "b", ("T", "*"))  # no U, and no retry subscription (ignored)
    assert _topics_in_conflict(cm) == ["U"]
    [conflict] = cm.conflicts("g")
    assert [(m.client_id, m.subscribed) for m in conflict.members] == [
        ("a", True),
        ("b", False),
    ]
    assert _conflicts_pushed(a) == [("U", [("a", "*"), ("b", None)])]
    assert _conflicts_pushed(b) == [("U", [("a", "*"), ("b", None)])]


async def test_broadcasting_groups_never_conflict() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    bc = messaging_pb2.BROADCASTING
    a = _join(cm, "a", ("T", "A"), model=bc)
    _join(cm, "b", ("T", "B"), model=bc)
    assert cm.conflicts("g") == []
    cm.check_subscription_consistent("g", "T")
    assert _conflicts_pushed(a) == []


async def test_a_leaving_member_resolves_the_conflict_and_members_are_told() -> None:
    clock = ManualClock()
    cm = ClientManager(BrokerConfig(channel_expired_timeout_ms=1000), clock)
    a = _join(cm, "a", ("T", "A"))
    b = _join(cm, "b", ("T", "B"))
    c = _join(cm, "c", ("T", "A"))
    assert _conflicts_pushed(a) == [
        ("T", [("a", "A"), ("b", "B")]),  # b joined
        ("T", [("a", "A"), ("b", "B"), ("c", "A")]),  # c joined: the conflict changed
    ]
    _conflicts_pushed(b)
    _conflicts_pushed(c)
    cm.close_channel(b, "stream ended")
    assert cm.conflicts("g") == []
    assert _conflicts_pushed(a) == [("T", [])]  # empty member list: resolved
    assert _conflicts_pushed(c) == [("T", [])]
    assert _conflicts_pushed(b) == []  # it left: nothing more for it
    cm.check_subscription_consistent("g", "T")

    # expiry ends a conflict too
    _join(cm, "d", ("T", "D"))
    assert _topics_in_conflict(cm) == ["T"]
    clock.advance_ms(600)
    _join(cm, "a", ("T", "A"))
    _join(cm, "c", ("T", "A"))
    _conflicts_pushed(a)
    clock.advance_ms(600)
    assert cm.scan_expired() == ["d"]
    assert cm.conflicts("g") == [] and _conflicts_pushed(a) == [("T", [])]


async def test_notices_only_when_the_conflict_changes() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    a = _join(cm, "a", ("T", "A"))
    b = _join(cm, "b", ("T", "B"))
    assert len(_conflicts_pushed(a)) == 1 and len(_conflicts_pushed(b)) == 1
    # periodic heartbeats, and a re-subscription to the same expression: no notice
    _join(cm, "a", ("T", "A"))
    _join(cm, "b", ("T", "B"), version=7)
    assert _conflicts_pushed(a) == [] and _conflicts_pushed(b) == []
    # another expression in the conflict: a new notice
    _join(cm, "b", ("T", "C"), version=8)
    assert _conflicts_pushed(a) == [("T", [("a", "A"), ("b", "C")])]
    # agreement
    _join(cm, "b", ("T", "A"), version=9)
    assert _conflicts_pushed(a) == [("T", [])]
    assert _conflicts_pushed(b) == [("T", [("a", "A"), ("b", "C")]), ("T", [])]


async def test_check_refuses_pulls_only_when_strict() -> None:
    config = BrokerConfig(broker_name="broker-x")
    cm = ClientManager(config, ManualClock())
    _join(cm, "a", ("T", "tag1 || tag2"), ("U", "*"))
    _join(cm, "b", ("T", "tag3"), ("U", "*"))
    with pytest.raises(ServiceError) as info:
        cm.check_subscription_consistent("g", "T")
    err = info.value
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.reason == common_pb2.SUBSCRIPTION_INCONSISTENT
    assert err.metadata["consumer_group"] == "g" and err.metadata["topic"] == "T"
    assert "TAG 'tag1 || tag2': a; TAG 'tag3': b" in err.message
    assert "broker-x" in err.message
    cm.check_subscription_consistent("g", "U")  # members agree about U
    cm.check_subscription_consistent("other", "T")  # unknown group

    config.strict_subscription_consistency = False  # a runtime config update
    cm.check_subscription_consistent("g", "T")
    [conflict] = cm.conflicts("g")
    assert conflict.topic == "T" and not conflict.pulls_refused


async def test_a_lone_dissenter_is_listed_even_beyond_the_member_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_manager, "CONFLICT_MEMBERS_MAX", 3)
    monkeypatch.setattr(client_manager, "SUMMARY_MEMBERS_PER_VIEW_MAX", 2)

    cm = ClientManager(BrokerConfig(), ManualClock())
    for cid in ("a1", "a2", "a3", "a4"):
        _join(cm, cid, ("T", "A"))
    _join(cm, "z", ("T", "Z"))
    [conflict] = cm.conflicts("g")
    assert [m.client_id for m in conflict.members] == ["a1", "a2", "z"]
    with pytest.raises(ServiceError) as info:
        cm.check_subscription_consistent("g", "T")
    assert "TAG 'A': a1, a2 and 2 more; TAG 'Z': z" in info.value.message


async def test_members_own_subscriptions_and_peer_address() -> None:
    cm = ClientManager(BrokerConfig(), ManualClock())
    a = _join(cm, "a", ("U", "*"), ("T", "A"))
    info = cm.consumer_group_info("g")
    assert info is not None
    assert [(s.topic, s.expression) for s in info.subscriptions_of("a")] == [
        ("T", "A"),
        ("U", "*"),
    ]
    assert info.subscriptions_of("nobody") == []
    assert a.peer_addr == "10.0.0.1:4000"
    assert ClientChannel("x", asyncio.Queue(), 0, "ipv6:[::1]:5").peer_addr == "[::1]:5"
