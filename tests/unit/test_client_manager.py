"""ClientManager: heartbeats, groups, membership notices and expiry (SPEC §4.2), no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rocketq._api.rocketq.v1 import messaging_pb2
from services.broker.client_manager import ClientChannel, ClientLimitError, ClientManager
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


def _run(fn: Callable[[], None]) -> None:
    """asyncio.Queue needs no running loop on 3.11, but keep every test loop-safe anyway."""

    async def main() -> None:
        fn()

    asyncio.run(main())


def test_heartbeat_registers_groups_and_acks_first() -> None:
    def body() -> None:
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

    _run(body)


def test_join_and_leave_notify_members_with_sorted_ids() -> None:
    def body() -> None:
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

    _run(body)


def test_unregister_leaves_named_groups_or_everything() -> None:
    def body() -> None:
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

    _run(body)


def test_notify_flag_of_the_group_config_is_honoured() -> None:
    def body() -> None:
        quiet = SubscriptionGroupConfig("g", notify_consumer_ids_changed_enable=False)
        cm = ClientManager(BrokerConfig(), ManualClock(), group_config=lambda g: quiet)
        a = cm.open_channel("a")
        cm.heartbeat(a, _hb("a"))
        b = cm.open_channel("b")
        cm.heartbeat(b, _hb("b"))
        assert _drain(a) == ["heartbeat_ack"]
        assert cm.consumer_ids("g") == ["a", "b"]

    _run(body)


def test_newest_sub_version_per_topic_wins() -> None:
    def body() -> None:
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

    _run(body)


def test_bad_expression_in_heartbeat_records_nothing() -> None:
    def body() -> None:
        cm = ClientManager(BrokerConfig(), ManualClock())
        a = cm.open_channel("a")
        with pytest.raises(ServiceError):
            cm.heartbeat(a, _hb("a", subs=(("T", "||", 1),)))
        assert cm.consumer_ids("g") == []

    _run(body)


def test_silent_clients_expire_and_members_are_told() -> None:
    def body() -> None:
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

    _run(body)


def test_a_second_stream_replaces_the_first() -> None:
    def body() -> None:
        cm = ClientManager(BrokerConfig(), ManualClock())
        old = cm.open_channel("a")
        cm.heartbeat(old, _hb("a"))
        new = cm.open_channel("a")
        assert old.closed and cm.channel("a") is new
        cm.close_channel(old, "old stream ended")  # must not remove the client
        assert cm.consumer_ids("g") == ["a"] and cm.connected_count() == 1
        cm.close_channel(new, "gone")
        assert cm.consumer_ids("g") == []

    _run(body)


def test_pushes_reset_offsets_and_drops_when_full() -> None:
    def body() -> None:
        cm = ClientManager(BrokerConfig(), ManualClock(), stream_queue_max=3)
        a = cm.open_channel("a")
        cm.heartbeat(a, _hb("a"))  # ack + ids changed: 2 of 3 slots
        assert cm.notify_reset_offset("g", "T", {0: 5}) == 1
        assert cm.notify_reset_offset("g", "T", {0: 6}) == 0  # queue full: dropped
        kinds = _drain(a)
        assert kinds == ["heartbeat_ack", "consumer_ids_changed", "reset_offset"]
        assert not cm.send_to_client("nobody", messaging_pb2.ClientStreamResponse())

    _run(body)


def test_client_cap() -> None:
    def body() -> None:
        cm = ClientManager(BrokerConfig(), ManualClock(), clients_max=1)
        cm.open_channel("a")
        cm.open_channel("a")  # the same client reconnecting is fine
        with pytest.raises(ClientLimitError):
            cm.open_channel("b")

    _run(body)
