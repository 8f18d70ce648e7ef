"""Who is connected: clients, their producer and consumer groups, and their streams (SPEC §4.2).

Every client keeps one ``ClientStream`` open to each broker it uses and sends a Heartbeat on it
first and then every 30 s. From those heartbeats this module keeps:

* per client id, a :class:`ClientChannel`: the bounded queue of messages the broker pushes
  down that client's stream (``stream_queue_max``), the time of its last heartbeat, and the
  groups it hosts;
* per consumer group, a :class:`ConsumerGroupInfo`: its live members, each member's own
  subscriptions, and the group's subscriptions (newest ``sub_version`` per topic, SPEC §6.17),
  which pulls without FLAG_SUBSCRIPTION use;
* per producer group, the client ids hosting it (transaction check-backs go to one of them).

Membership changes — a consumer joining, leaving by ``UnregisterClient``, its stream closing, or
its heartbeats stopping for ``channel_expired_timeout_ms`` (found by :meth:`run_scan_loop`,
every ``client_scan_interval_ms``) — push a ``ConsumerIdsChanged`` notice to the group's live
members so they rebalance at once rather than at their next 20 s tick, unless the group's
``notifyConsumerIdsChangedEnable`` is off (looked up through ``group_config``).

Subscription consistency (SPEC §6.17). RocketMQ keeps one subscription per (group, topic) and
shares a topic's queues among *all* members whatever each subscribes to, so members that
subscribe differently silently lose messages: a queue lands on a member whose filter drops what
another member wanted, and the member commits past it. RocketQ keeps every member's own
subscriptions and, for CLUSTERING groups, finds the topics the live members disagree about:

| member A               | member B              | conflict? | why                            |
|------------------------|-----------------------|-----------|--------------------------------|
| TAG ``"a || b"``       | TAG ``"b||a"``        | no        | tags compared as sets          |
| TAG ``"*"``            | TAG ``"a || *"``      | no        | both mean everything           |
| TAG ``"a"``            | TAG ``"b"``           | yes       | different tags                 |
| SQL92 ``"x > 1"``      | SQL92 ``"x>1"``       | no        | whitespace-normalised text     |
| SQL92 ``"x > 1"``      | TAG ``"*"``           | yes       | the type counts                |
| subscribes ``T``       | no subscription to T  | yes       | B is "not subscribed"          |

The group's own ``%RETRY%{group}`` subscription is the same for every member and is not
checked; BROADCASTING groups are never in conflict (every member reads every queue). The
conflict set is recomputed only when something can change it — a heartbeat that changes a
member's subscriptions or the group's message model, a member joining or leaving (unregister,
stream end, expiry) — and cached, because :meth:`ClientManager.check_subscription_consistent`
runs on every pull. When the set changes, the broker logs a WARNING naming the members and
their expressions (INFO when a conflict ends) and pushes a ``subscription_conflict`` notice to
every live member, one per changed topic (an empty member list means "resolved").
While a topic is in conflict and ``strictSubscriptionConsistency`` is on (the default), the pull
processor's call to ``check_subscription_consistent`` refuses the group's pulls of it with
FAILED_PRECONDITION / SUBSCRIPTION_INCONSISTENT: consumption of that topic pauses, nothing is
skipped or committed past, and it resumes by itself once the members agree (for example when a
rolling restart finishes). With the setting off the conflict is only reported, as RocketMQ
behaves.

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

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.validation import retry_topic
from services.broker.config import BrokerConfig
from services.broker.filter import SubscriptionData, parse_subscription
from services.broker.model import SubscriptionGroupConfig
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError

log = logging.getLogger(__name__)

STREAM_QUEUE_MAX = 1024
"""Messages waiting to go down one client's stream; beyond it pushes are dropped (logged)."""
CLIENTS_MAX = 100_000
"""Connected clients; a heartbeat from one more new client is refused."""
GROUPS_PER_HEARTBEAT_MAX = 1024
"""Producer plus consumer groups one heartbeat may carry."""
SUBSCRIPTIONS_PER_GROUP_MAX = 1024
"""Topics one consumer group may subscribe to."""
CONFLICT_MEMBERS_MAX = 256
"""Members one subscription conflict lists (notices, admin answers); every distinct view is
listed before a second member of the same view, so a lone dissenter is never left out."""
SUMMARY_MEMBERS_PER_VIEW_MAX = 5
"""Client ids named per distinct expression in logs and error messages ("and N more")."""

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
    last_heartbeat_mono_s: float = 0.0
    """The last heartbeat on the monotonic clock, which times expiry."""

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

    @property
    def peer_addr(self) -> str:
        """The client's address as "host:port" (gRPC's peer without its "ipv4:" prefix)."""
        for prefix in ("ipv4:", "ipv6:"):
            if self.peer.startswith(prefix):
                return self.peer[len(prefix) :]
        return self.peer

    def close(self) -> None:
        """Tell the stream to end (its writer sees ``closed`` or the ``None`` marker)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)


def subscription_view(sub: SubscriptionData | None) -> tuple[int, object] | None:
    """What decides whether two members agree about a topic; None = not subscribed.

    TAG subscriptions compare as tag sets (empty = everything, so "*" == "A || *"), SQL92 ones
    as text with the whitespace outside string literals normalised; the type counts.
    """
    if sub is None:
        return None
    if sub.is_sql92:
        return (common_pb2.SQL92, normalise_sql92(sub.expression))
    return (common_pb2.TAG, sub.tags)


_PUNCT = frozenset("()=<>!,+-*/")


def normalise_sql92(expression: str) -> str:
    """``expression`` with whitespace runs outside '...' literals collapsed to one space, and
    dropped next to operators and parentheses: "a>1 AND  b = 'x  y'" -> "a>1 AND b='x  y'"."""
    out: list[str] = []
    quoted = False
    pending_space = False
    for ch in expression.strip():
        if quoted:
            out.append(ch)
            quoted = ch != "'"
            continue
        if ch.isspace():
            pending_space = True
            continue
        # A space survives only between two words: "a AND b", never around "=" or "(".
        if pending_space and out and ch not in _PUNCT and out[-1] not in _PUNCT:
            out.append(" ")
        pending_space = False
        out.append(ch)
        quoted = ch == "'"
    return "".join(out)


def _describe(sub: SubscriptionData | None) -> str:
    if sub is None:
        return "not subscribed"
    kind = "SQL92" if sub.is_sql92 else "TAG"
    return f"{kind} {sub.expression!r}"


@dataclass(frozen=True)
class _Conflict:
    """One topic a group's live members disagree about (cached until the group changes)."""

    members: tuple[tuple[str, SubscriptionData | None], ...]
    """(client id, its subscription or None), sorted by client id, at most CONFLICT_MEMBERS_MAX."""
    summary: str
    """"TAG 'a || b': c1, c2; TAG 'c': c3; not subscribed: c4" for logs and errors."""

    def shown(self) -> tuple[tuple[str, int, str] | tuple[str], ...]:
        """What members see of it: a change here is worth a notice, a new sub_version is not."""
        return tuple(
            (cid,) if sub is None else (cid, sub.expression_type, sub.expression)
            for cid, sub in self.members
        )

    def to_pb(
        self, group: str, topic: str, *, pulls_refused: bool
    ) -> common_pb2.SubscriptionConflict:
        return common_pb2.SubscriptionConflict(
            consumer_group=group,
            topic=topic,
            members=[
                common_pb2.MemberSubscription(
                    client_id=cid,
                    subscribed=sub is not None,
                    expression=sub.expression if sub is not None else "",
                    expression_type=sub.expression_type if sub is not None else common_pb2.TAG,
                )
                for cid, sub in self.members
            ],
            pulls_refused=pulls_refused,
        )


def _conflict_of(views: dict[str, SubscriptionData | None]) -> _Conflict:
    """Describe a disagreement among ``views`` (client id -> its subscription or None)."""
    by_view: dict[object, list[str]] = {}
    for cid in sorted(views):
        by_view.setdefault(subscription_view(views[cid]), []).append(cid)
    # Round-robin over the distinct views so a lone dissenter survives the cap.
    listed: list[str] = []
    queues = [list(ids) for ids in by_view.values()]
    while len(listed) < CONFLICT_MEMBERS_MAX and any(queues):
        for ids in queues:
            if ids and len(listed) < CONFLICT_MEMBERS_MAX:
                listed.append(ids.pop(0))
    parts = []
    for ids in by_view.values():
        shown = ", ".join(ids[:SUMMARY_MEMBERS_PER_VIEW_MAX])
        more = len(ids) - SUMMARY_MEMBERS_PER_VIEW_MAX
        if more > 0:
            shown += f" and {more} more"
        parts.append(f"{_describe(views[ids[0]])}: {shown}")
    return _Conflict(tuple((cid, views[cid]) for cid in sorted(listed)), "; ".join(parts))


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
    member_subscriptions: dict[str, dict[str, SubscriptionData]] = field(default_factory=dict)
    """Client id -> topic -> that member's own subscription, from its last heartbeat."""
    conflicts: dict[str, _Conflict] = field(default_factory=dict)
    """Topic -> the live members' disagreement about it (cached; see the module docstring)."""
    last_update_ms: int = 0

    def member_ids(self) -> list[str]:
        return sorted(self.members)

    def subscriptions_of(self, client_id: str) -> list[SubscriptionData]:
        """One member's own subscriptions, sorted by topic."""
        subs = self.member_subscriptions.get(client_id, {})
        return [subs[t] for t in sorted(subs)]

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

    def compute_conflicts(self) -> dict[str, _Conflict]:
        """Topics the live members disagree about (CLUSTERING only), sorted by topic."""
        if self.message_model == messaging_pb2.BROADCASTING or len(self.members) < 2:
            return {}
        retry = retry_topic(self.group)
        member_subs = {cid: self.member_subscriptions.get(cid, {}) for cid in self.members}
        topics = {t for subs in member_subs.values() for t in subs}
        topics.discard(retry)  # the automatic retry subscription is "*" for every member
        out: dict[str, _Conflict] = {}
        for topic in sorted(topics):
            views = {cid: subs.get(topic) for cid, subs in member_subs.items()}
            if len({subscription_view(v) for v in views.values()}) > 1:
                out[topic] = _conflict_of(views)
        return out


def _shown(conflicts: dict[str, _Conflict], topic: str) -> object:
    conflict = conflicts.get(topic)
    return None if conflict is None else conflict.shown()


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

    def conflicts(self, group: str) -> list[common_pb2.SubscriptionConflict]:
        """Topics the group's live members subscribe to differently, sorted by topic; each
        says whether pulls of it are refused now (strictSubscriptionConsistency)."""
        info = self._consumers.get(group)
        if info is None:
            return []
        strict = self.config.strict_subscription_consistency
        return [c.to_pb(group, topic, pulls_refused=strict) for topic, c in info.conflicts.items()]

    def check_subscription_consistent(self, group: str, topic: str) -> None:
        """Refuse a pull of ``topic`` by ``group`` while its members disagree about it.

        Raises ServiceError(FAILED_PRECONDITION, SUBSCRIPTION_INCONSISTENT) naming every member
        and its expression when strictSubscriptionConsistency is on and the topic is in
        conflict; returns otherwise. Two dict lookups: it runs on every pull.
        """
        info = self._consumers.get(group)
        if info is None or not info.conflicts or not self.config.strict_subscription_consistency:
            return
        conflict = info.conflicts.get(topic)
        if conflict is None:
            return
        raise ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            common_pb2.SUBSCRIPTION_INCONSISTENT,
            f"members of consumer group {group} subscribe to {topic} differently "
            f"({conflict.summary}); they share its queues, so a member's filter would skip "
            "messages another member wants. Pulls of it are refused until every member "
            "subscribes the same way (strictSubscriptionConsistency=true on broker "
            f"{self.config.broker_name})",
            consumer_group=group,
            topic=topic,
            members=conflict.summary,
        )

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
        channel.last_heartbeat_mono_s = self.clock.monotonic_s()
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
        channel.last_heartbeat_mono_s = self.clock.monotonic_s()
        expire = now + self.config.channel_expired_timeout_ms
        ack = messaging_pb2.ClientStreamResponse(
            heartbeat_ack=messaging_pb2.HeartbeatAck(expire_timestamp_ms=expire)
        )
        channel.push(ack)  # before any ConsumerIdsChanged this heartbeat causes
        for p in hb.producers:
            channel.producer_groups.add(p.producer_group)
            self._producers.setdefault(p.producer_group, set()).add(channel.client_id)
        changed_groups: list[str] = []
        views_changed: list[str] = []
        for c, subs in parsed:
            changed, view_changed = self._register_consumer(channel.client_id, c, subs, now)
            if changed:
                changed_groups.append(c.consumer_group)
            if view_changed:
                views_changed.append(c.consumer_group)
            channel.consumer_groups.add(c.consumer_group)
        for group in changed_groups:
            self._notify_ids_changed(group)
        for group in views_changed:
            self._refresh_conflicts(group)
        return ack

    def _register_consumer(
        self,
        client_id: str,
        c: messaging_pb2.ConsumerData,
        subs: list[SubscriptionData],
        now: int,
    ) -> tuple[bool, bool]:
        """Add or refresh one member. Returns (membership or the group's subscriptions
        changed, something that decides subscription conflicts changed)."""
        info = self._consumers.get(c.consumer_group)
        if info is None:
            info = self._consumers[c.consumer_group] = ConsumerGroupInfo(c.consumer_group)
        info.consume_type = c.consume_type or messaging_pb2.CONSUME_TYPE_PUSH
        old_model = info.message_model
        info.message_model = c.message_model or messaging_pb2.CLUSTERING
        info.consume_from_where = c.consume_from_where or messaging_pb2.CONSUME_FROM_LAST_OFFSET
        info.consume_timestamp_ms = c.consume_timestamp_ms
        info.consume_orderly = c.consume_orderly
        info.last_update_ms = now
        joined = client_id not in info.members
        info.members[client_id] = now
        own = {sub.topic: sub for sub in subs}
        view_changed = joined or info.member_subscriptions.get(client_id) != own
        view_changed = view_changed or old_model != info.message_model
        info.member_subscriptions[client_id] = own
        subs_changed = info.update_subscriptions(subs)
        if joined:
            log.info(
                "consumer %s joined group %s (%d members)",
                client_id,
                c.consumer_group,
                len(info.members),
            )
        return joined or subs_changed, view_changed

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
            info.member_subscriptions.pop(cid, None)
            log.info("consumer %s left group %s (%d remain)", cid, group, len(info.members))
            if not info.members:
                if info.conflicts:
                    log.info("consumer group %s has no live member; its conflicts end", group)
                del self._consumers[group]
            else:
                self._notify_ids_changed(group)
                self._refresh_conflicts(group)

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

    def _refresh_conflicts(self, group: str) -> None:
        """Recompute the group's conflicts; log and tell every live member what changed."""
        info = self._consumers.get(group)
        if info is None:
            return
        old, new = info.conflicts, info.compute_conflicts()
        info.conflicts = new
        changed = sorted(t for t in old.keys() | new.keys() if _shown(old, t) != _shown(new, t))
        if not changed:
            return
        strict = self.config.strict_subscription_consistency
        ids = info.member_ids()
        for topic in changed:
            conflict = new.get(topic)
            if conflict is None:
                log.info("consumer group %s: members agree about %s again", group, topic)
                pb = common_pb2.SubscriptionConflict(consumer_group=group, topic=topic)
            else:
                log.warning(
                    "consumer group %s: members subscribe to %s differently (%s); %s",
                    group,
                    topic,
                    conflict.summary,
                    "its pulls are refused until they agree"
                    if strict
                    else "reported only (strictSubscriptionConsistency=false): members' "
                    "filters may skip messages other members want",
                )
                pb = conflict.to_pb(group, topic, pulls_refused=strict)
            msg = messaging_pb2.ClientStreamResponse(subscription_conflict=pb)
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
        # Monotonic, not wall-clock: a clock step (or a test's ScaledClock) must not expire
        # every client at once.
        deadline_s = self.clock.monotonic_s() - self.config.channel_expired_timeout_ms / 1000
        expired = [ch for ch in self._channels.values() if ch.last_heartbeat_mono_s < deadline_s]
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
