"""Who is connected: clients, their producer and consumer groups, and their streams (SPEC §4.2).

Every client keeps one ``ClientStream`` open to each broker it uses and sends a Heartbeat on it
first and then every 30 s. From those heartbeats this module keeps:

* per client id, a :class:`ClientChannel`: the bounded queue of messages the broker pushes
  down that client's stream (``stream_queue_max``), the time of its last heartbeat, and the
  groups it hosts;
* per consumer group, a :class:`ConsumerGroupInfo`: its live members and its subscriptions
  (newest ``sub_version`` per topic, SPEC §6.17), which pulls without FLAG_SUBSCRIPTION use;
* per producer group, the client ids hosting it (transaction check-backs go to one of them).

Membership changes — a consumer joining, leaving by ``UnregisterClient``, its stream closing, or
its heartbeats stopping for ``channel_expired_timeout_ms`` (found by :meth:`run_scan_loop`,
every ``client_scan_interval_ms``) — push a ``ConsumerIdsChanged`` notice to the group's live
members so they rebalance at once rather than at their next 20 s tick, unless the group's
``notifyConsumerIdsChangedEnable`` is off (looked up through ``group_config``).

A client id that opens a second stream (a reconnect racing the old stream's teardown) replaces
the first: the old stream is told to end, and its later teardown does not remove the client.

Everything runs on the broker's one event loop; nothing here blocks or needs a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rocketq._api.rocketq.v1 import messaging_pb2
from services.broker.config import BrokerConfig
from services.broker.filter import SubscriptionData, parse_subscription
from services.broker.model import SubscriptionGroupConfig
from services.common.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

STREAM_QUEUE_MAX = 1024
"""Messages waiting to go down one client's stream; beyond it pushes are dropped (logged)."""
CLIENTS_MAX = 100_000
"""Connected clients; a heartbeat from one more new client is refused."""
GROUPS_PER_HEARTBEAT_MAX = 1024
"""Producer plus consumer groups one heartbeat may carry."""
SUBSCRIPTIONS_PER_GROUP_MAX = 1024
"""Topics one consumer group may subscribe to."""

GroupConfigLookup = Callable[[str], SubscriptionGroupConfig | None]


class ClientLimitError(RuntimeError):
    """The broker already tracks CLIENTS_MAX clients."""


@dataclass(eq=False)
class ClientChannel:
    """One client's live stream and what its heartbeats said."""

    client_id: str
    queue: asyncio.Queue[messaging_pb2.ClientStreamResponse | None]
    """What to push down the stream; ``None`` tells the stream to end."""
    last_heartbeat_ms: int
    peer: str = ""
    producer_groups: set[str] = field(default_factory=set)
    consumer_groups: set[str] = field(default_factory=set)
    closed: bool = False

    def push(self, msg: messaging_pb2.ClientStreamResponse) -> bool:
        """Queue ``msg`` for the stream; False (and logged) if closed or the queue is full."""
        if self.closed:
            return False
        try:
            self.queue.put_nowait(msg)
        except asyncio.QueueFull:
            log.warning(
                "client %s: stream queue full (%d); dropping a %s push",
                self.client_id,
                self.queue.maxsize,
                msg.WhichOneof("command"),
            )
            return False
        return True

    def close(self) -> None:
        """Tell the stream to end (its writer sees ``closed`` or the ``None`` marker)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)


@dataclass
class ConsumerGroupInfo:
    """A consumer group as this broker knows it from its members' heartbeats."""

    group: str
    consume_type: int = messaging_pb2.CONSUME_TYPE_PUSH
    message_model: int = messaging_pb2.CLUSTERING
    consume_from_where: int = messaging_pb2.CONSUME_FROM_LAST_OFFSET
    consume_timestamp_ms: int = 0
    consume_orderly: bool = False
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    """Topic -> the newest subscription any member sent."""
    members: dict[str, int] = field(default_factory=dict)
    """Client id -> time of that member's last heartbeat (ms)."""
    last_update_ms: int = 0

    def member_ids(self) -> list[str]:
        return sorted(self.members)

    def update_subscriptions(self, subs: Iterable[SubscriptionData]) -> bool:
        """Keep the newest version per topic; True if anything changed."""
        changed = False
        for sub in subs:
            old = self.subscriptions.get(sub.topic)
            if old is None or sub.sub_version > old.sub_version:
                if old is None or (old.expression, old.expression_type) != (
                    sub.expression,
                    sub.expression_type,
                ):
                    changed = True
                self.subscriptions[sub.topic] = sub
        return changed


class ClientManager:
    """Clients, producer groups and consumer groups of one broker (SPEC §4.2)."""

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock = SYSTEM_CLOCK,
        *,
        group_config: GroupConfigLookup | None = None,
        stream_queue_max: int = STREAM_QUEUE_MAX,
        clients_max: int = CLIENTS_MAX,
    ) -> None:
        self.config = config
        self.clock = clock
        self.group_config = group_config
        """Looks up a group's SubscriptionGroupConfig (notify flag); None = always notify."""
        self.stream_queue_max = stream_queue_max
        self.clients_max = clients_max
        self._channels: dict[str, ClientChannel] = {}
        self._consumers: dict[str, ConsumerGroupInfo] = {}
        self._producers: dict[str, set[str]] = {}

    # -- queries ---------------------------------------------------------------------------
    def consumer_ids(self, group: str) -> list[str]:
        """Live members of a consumer group, sorted (empty for an unknown group)."""
        info = self._consumers.get(group)
        return info.member_ids() if info else []

    def consumer_group_info(self, group: str) -> ConsumerGroupInfo | None:
        return self._consumers.get(group)

    def consumer_groups(self) -> list[str]:
        return sorted(self._consumers)

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self._consumers.get(group)
        return info.subscriptions.get(topic) if info else None

    def producer_client_ids(self, group: str) -> list[str]:
        return sorted(self._producers.get(group, ()))

    def channel(self, client_id: str) -> ClientChannel | None:
        return self._channels.get(client_id)

    def connected_count(self) -> int:
        return len(self._channels)

    # -- stream lifecycle ------------------------------------------------------------------
    def open_channel(self, client_id: str, peer: str = "") -> ClientChannel:
        """A new stream for ``client_id``; an older stream of the same id is told to end.

        The groups the old stream registered stay (the client is the same); the next heartbeat
        on the new stream refreshes them.
        """
        old = self._channels.get(client_id)
        if old is None and len(self._channels) >= self.clients_max:
            raise ClientLimitError(
                f"this broker already serves {self.clients_max} clients; try another broker"
            )
        channel = ClientChannel(
            client_id,
            asyncio.Queue(maxsize=self.stream_queue_max),
            self.clock.now_ms(),
            peer,
        )
        if old is not None:
            channel.producer_groups = old.producer_groups
            channel.consumer_groups = old.consumer_groups
            old.close()
        self._channels[client_id] = channel
        return channel

    def heartbeat(
        self, channel: ClientChannel, hb: messaging_pb2.Heartbeat
    ) -> messaging_pb2.ClientStreamResponse:
        """Record a heartbeat (already validated by the caller); push and return its ack.

        Raises ServiceError (ILLEGAL_EXPRESSION) if a subscription does not parse; nothing is
        recorded then.
        """
        now = self.clock.now_ms()
        parsed = [
            (
                c,
                [
                    parse_subscription(s.topic, s.expression, s.expression_type, s.sub_version)
                    for s in c.subscriptions[:SUBSCRIPTIONS_PER_GROUP_MAX]
                ],
            )
            for c in hb.consumers
        ]
        channel.last_heartbeat_ms = now
        expire = now + self.config.channel_expired_timeout_ms
        ack = messaging_pb2.ClientStreamResponse(
            heartbeat_ack=messaging_pb2.HeartbeatAck(expire_timestamp_ms=expire)
        )
        channel.push(ack)  # before any ConsumerIdsChanged this heartbeat causes
        for p in hb.producers:
            channel.producer_groups.add(p.producer_group)
            self._producers.setdefault(p.producer_group, set()).add(channel.client_id)
        changed_groups: list[str] = []
        for c, subs in parsed:
            if self._register_consumer(channel.client_id, c, subs, now):
                changed_groups.append(c.consumer_group)
            channel.consumer_groups.add(c.consumer_group)
        for group in changed_groups:
            self._notify_ids_changed(group)
        return ack

    def _register_consumer(
        self,
        client_id: str,
        c: messaging_pb2.ConsumerData,
        subs: list[SubscriptionData],
        now: int,
    ) -> bool:
        """Add or refresh one member; True if membership or subscriptions changed."""
        info = self._consumers.get(c.consumer_group)
        if info is None:
            info = self._consumers[c.consumer_group] = ConsumerGroupInfo(c.consumer_group)
        info.consume_type = c.consume_type or messaging_pb2.CONSUME_TYPE_PUSH
        info.message_model = c.message_model or messaging_pb2.CLUSTERING
        info.consume_from_where = c.consume_from_where or messaging_pb2.CONSUME_FROM_LAST_OFFSET
        info.consume_timestamp_ms = c.consume_timestamp_ms
        info.consume_orderly = c.consume_orderly
        info.last_update_ms = now
        joined = client_id not in info.members
        info.members[client_id] = now
        subs_changed = info.update_subscriptions(subs)
        if joined:
            log.info(
                "consumer %s joined group %s (%d members)",
                client_id,
                c.consumer_group,
                len(info.members),
            )
        return joined or subs_changed

    def unregister(self, channel: ClientChannel, req: messaging_pb2.UnregisterClient) -> None:
        """Leave the named groups, or every group when both lists are empty."""
        if not req.producer_groups and not req.consumer_groups:
            producers = list(channel.producer_groups)
            consumers = list(channel.consumer_groups)
        else:
            producers = list(req.producer_groups)
            consumers = list(req.consumer_groups)
        self._remove_groups(channel, producers, consumers)

    def close_channel(self, channel: ClientChannel, reason: str) -> None:
        """The stream of ``channel`` ended: forget the client unless a newer stream replaced it."""
        channel.close()
        if self._channels.get(channel.client_id) is not channel:
            return
        del self._channels[channel.client_id]
        log.info("client %s disconnected (%s)", channel.client_id, reason)
        self._remove_groups(channel, list(channel.producer_groups), list(channel.consumer_groups))

    def _remove_groups(
        self, channel: ClientChannel, producers: list[str], consumers: list[str]
    ) -> None:
        cid = channel.client_id
        for group in producers:
            channel.producer_groups.discard(group)
            ids = self._producers.get(group)
            if ids is not None:
                ids.discard(cid)
                if not ids:
                    del self._producers[group]
        for group in consumers:
            channel.consumer_groups.discard(group)
            info = self._consumers.get(group)
            if info is None or info.members.pop(cid, None) is None:
                continue
            log.info("consumer %s left group %s (%d remain)", cid, group, len(info.members))
            if not info.members:
                del self._consumers[group]
            else:
                self._notify_ids_changed(group)

    # -- pushes ----------------------------------------------------------------------------
    def send_to_client(self, client_id: str, msg: messaging_pb2.ClientStreamResponse) -> bool:
        """Push ``msg`` down one client's stream; False if it is not connected or backed up."""
        channel = self._channels.get(client_id)
        return channel.push(msg) if channel is not None else False

    def notify_reset_offset(self, group: str, topic: str, queue_offsets: dict[int, int]) -> int:
        """Tell every live member of ``group`` about an offset reset; how many were told."""
        msg = messaging_pb2.ClientStreamResponse(
            reset_offset=messaging_pb2.ResetOffsetNotice(
                consumer_group=group, topic=topic, queue_offsets=queue_offsets
            )
        )
        return sum(self.send_to_client(cid, msg) for cid in self.consumer_ids(group))

    def _notify_ids_changed(self, group: str) -> None:
        if not self._notify_enabled(group):
            return
        ids = self.consumer_ids(group)
        msg = messaging_pb2.ClientStreamResponse(
            consumer_ids_changed=messaging_pb2.ConsumerIdsChanged(
                consumer_group=group, consumer_ids=ids
            )
        )
        for cid in ids:
            self.send_to_client(cid, msg)

    def _notify_enabled(self, group: str) -> bool:
        if self.group_config is None:
            return True
        try:
            cfg = self.group_config(group)
        except Exception:  # a lookup failure must not stop membership bookkeeping
            log.exception("looking up subscription group %s failed", group)
            return True
        return cfg is None or cfg.notify_consumer_ids_changed_enable

    # -- expiry ----------------------------------------------------------------------------
    def scan_expired(self) -> list[str]:
        """Drop clients silent for ``channel_expired_timeout_ms``; return their ids."""
        deadline = self.clock.now_ms() - self.config.channel_expired_timeout_ms
        expired = [ch for ch in self._channels.values() if ch.last_heartbeat_ms < deadline]
        for ch in expired:
            log.warning(
                "client %s sent no heartbeat for %d ms; closing its stream",
                ch.client_id,
                self.config.channel_expired_timeout_ms,
            )
            self.close_channel(ch, "heartbeat expired")
        return [ch.client_id for ch in expired]

    async def run_scan_loop(self) -> None:
        """Every ``client_scan_interval_ms``, expire silent clients; cancelled on shutdown."""
        while True:
            await asyncio.sleep(self.config.client_scan_interval_ms / 1000)
            try:
                self.scan_expired()
            except Exception:  # the scan must survive anything and try again next time
                log.exception("client scan failed")

    def close_all(self) -> None:
        """End every stream (broker shutdown)."""
        for ch in list(self._channels.values()):
            ch.close()
