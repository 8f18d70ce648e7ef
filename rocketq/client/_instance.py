"""One client's shared core: routes, channels and broker streams (RocketMQ's MQClientInstance).

Every producer and consumer of one process that names the same nameservers and client id
shares one :class:`ClientInstance` (per event loop), as RocketMQ's producers and consumers share
an ``MQClientInstance``:

- **Routes.** ``get_route`` answers from a cache and asks the nameserver on a miss (concurrent
  misses for one topic share one request). Every ``poll_name_server_interval_ms`` (30 s, SPEC
  §2.5) a task refreshes the route of every topic a registered producer or consumer uses. When a
  cached route changes, consumers of that topic hear ``on_route_changed``. A route the nameserver
  no longer knows stays cached, as in RocketMQ: a broker that comes back (or a borrowed
  auto-create route, SPEC §4.3) keeps working until the nameserver says something new.
- **Channels.** One gRPC channel per broker address, shared by every stub.
- **Client streams.** One ``Messaging.ClientStream`` per broker (masters and slaves) of the
  routes in use, opened lazily. The first message is a Heartbeat carrying every registered
  producer and consumer group; another follows every ``heartbeat_broker_interval_ms`` (30 s,
  SPEC §4.2) and at once on :meth:`ClientInstance.heartbeat_now`. A broken stream reconnects with
  jittered backoff (0.2 s doubling to 5 s). Commands the broker pushes down a stream go to
  the registered handles: ``consumer_ids_changed`` -> ``on_consumer_ids_changed``,
  ``reset_offset`` -> ``on_reset_offset``, ``check_transaction_state`` -> ``on_check_transaction``,
  ``subscription_conflict`` -> ``on_subscription_conflict``.
- **Subscription conflicts** (SPEC §6.17). A broker tells every live member of a clustering
  group when the members start, change or stop disagreeing about a topic's subscription (see
  services/broker/client_manager.py). The instance logs it once per change — at ERROR, since
  some messages would reach a member whose filter drops them (the broker refuses the group's
  pulls of the topic meanwhile, unless strictSubscriptionConsistency is off), at INFO when it is
  resolved — and hands it to the group's consumer handle. Every broker of the topic sends the
  same notice; repeats are not logged again.

The instance is reference counted: each user calls ``start()`` once and ``close()`` once; the
last ``close()`` says goodbye to the brokers (UnregisterClient), ends the streams and channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import weakref
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import grpc

from rocketq._api.rocketq.v1 import admin_pb2_grpc, common_pb2, messaging_pb2, messaging_pb2_grpc
from rocketq.backoff import Backoff
from rocketq.client._channels import open_channel
from rocketq.client._nameserver import NameServerClient, parse_addrs
from rocketq.client._route import TopicRoute
from rocketq.client.errors import BrokerUnavailableError, RocketQError, TopicNotFoundError
from rocketq.client.security import ClientSecurity

log = logging.getLogger(__name__)

#: Reconnect backoff of a broken client stream: first wait, and the cap of the doubling.
STREAM_BACKOFF_MIN_S = 0.2
STREAM_BACKOFF_MAX_S = 5.0
#: Commands waiting to be written on one stream; beyond this a heartbeat is dropped (the next
#: one carries the same data) rather than piling up behind a stalled broker.
STREAM_OUTBOX_MAX = 64
#: How long closing a stream waits for each step of a graceful end before cancelling it.
STREAM_CLOSE_WAIT_S = 1.0
#: Conflicts remembered (group, topic) to log each change once rather than once per broker.
CONFLICTS_REMEMBERED_MAX = 4096


@functools.cache
def local_ip() -> str:
    """This host's outward IPv4 address (no packet is sent), else its hostname's, else loopback."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        ip: str = s.getsockname()[0]
        if ip and not ip.startswith("0."):
            return ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True)
class ClientConfig:
    """What a client instance needs; shared by producers and consumers (RocketMQ's ClientConfig)."""

    namesrv_addrs: tuple[str, ...]
    """Nameserver addresses "host:port"; a list or "a:9876;b:9876" is accepted too."""
    instance_name: str = "DEFAULT"
    """Second half of the client id; clients of one process with equal ids share an instance."""
    client_ip: str = field(default_factory=local_ip)
    """First half of the client id; this host's address by default."""
    poll_name_server_interval_ms: int = 30_000
    """How often routes of topics in use are refreshed from the nameserver (SPEC §2.5)."""
    heartbeat_broker_interval_ms: int = 30_000
    """How often a heartbeat goes to every broker in use (SPEC §4.2)."""
    request_timeout_ms: int = 3_000
    """Deadline of a nameserver request and of a heartbeat's acknowledgement."""
    security: ClientSecurity | None = None
    """TLS files and access key (rocketq.client.security); None = the process default, which
    the ROCKETQ_TLS_* / ROCKETQ_ACCESS_KEY environment sets."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "namesrv_addrs", tuple(parse_addrs(self.namesrv_addrs)))
        for name in (
            "poll_name_server_interval_ms",
            "heartbeat_broker_interval_ms",
            "request_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def client_id(self) -> str:
        return f"{self.client_ip}@{self.instance_name}"


class ConsumerHandle(Protocol):
    """What a consumer shows the instance (implemented by the consumer package)."""

    def consumer_data(self) -> messaging_pb2.ConsumerData: ...
    def topics(self) -> list[str]: ...
    def on_route_changed(self, topic: str, route: TopicRoute) -> None: ...
    def on_consumer_ids_changed(self) -> None: ...
    def on_reset_offset(self, topic: str, broker_name: str, offsets: dict[int, int]) -> None: ...
    def on_subscription_conflict(self, conflict: common_pb2.SubscriptionConflict) -> None:
        """A broker's notice (SPEC §6.17); an empty ``members`` list means it is resolved."""


def describe_conflict_members(conflict: common_pb2.SubscriptionConflict) -> str:
    """'client-1: "tag1 || tag2", client-2: not subscribed' for logs."""
    parts = []
    for m in conflict.members:
        if not m.subscribed:
            parts.append(f"{m.client_id}: not subscribed")
        else:
            kind = "SQL92 " if m.expression_type == common_pb2.SQL92 else ""
            parts.append(f'{m.client_id}: {kind}"{m.expression}"')
    return ", ".join(parts)


class ProducerHandle(Protocol):
    """What a producer shows the instance."""

    def producer_data(self) -> messaging_pb2.ProducerData: ...
    def topics(self) -> list[str]: ...
    def on_check_transaction(
        self, broker_addr: str, msg: messaging_pb2.CheckTransactionState
    ) -> None: ...


class _Channel:
    """One channel to one address and the stubs over it."""

    def __init__(self, addr: str, security: ClientSecurity | None = None) -> None:
        self.channel = open_channel(addr, security)
        self.messaging: messaging_pb2_grpc.MessagingAsyncStub = messaging_pb2_grpc.MessagingStub(
            self.channel
        )  # type: ignore[assignment]
        self.admin: admin_pb2_grpc.AdminAsyncStub = admin_pb2_grpc.AdminStub(self.channel)  # type: ignore[assignment]


_Outgoing = tuple[messaging_pb2.ClientStreamRequest, "asyncio.Future[None] | None"]
# Outbox marker: the writer half-closes the stream (after everything queued before it).
_HALF_CLOSE = messaging_pb2.ClientStreamRequest()


class _BrokerStream:
    """The ClientStream to one broker: heartbeats up, pushed commands down, reconnecting."""

    def __init__(self, instance: ClientInstance, addr: str, broker_name: str) -> None:
        self.instance = instance
        self.addr = addr
        self.broker_name = broker_name
        self._outbox: asyncio.Queue[_Outgoing] = asyncio.Queue(STREAM_OUTBOX_MAX)
        # Futures of heartbeats written and not yet acknowledged, oldest first; the broker
        # answers every heartbeat in order.
        self._acks: deque[asyncio.Future[None]] = deque()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._closing = False
        self._acked = False
        self._task = asyncio.create_task(self._run(), name=f"rocketq-stream-{addr}")

    def heartbeat(self) -> asyncio.Future[None]:
        """Queue a heartbeat; the future completes when the broker acknowledges it."""
        return self._enqueue(
            messaging_pb2.ClientStreamRequest(heartbeat=self.instance._heartbeat_pb())
        )

    def send(self, req: messaging_pb2.ClientStreamRequest) -> asyncio.Future[None]:
        """Queue a command; the future completes when it has been written."""
        return self._enqueue(req)

    def _enqueue(self, req: messaging_pb2.ClientStreamRequest) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            self._outbox.put_nowait((req, fut))
        except asyncio.QueueFull:
            fut.set_exception(
                BrokerUnavailableError(f"stream to {self.addr} is backed up", target=self.addr)
            )
            fut.exception()  # mark retrieved: a dropped heartbeat is not an error to report
        return fut

    async def _run(self) -> None:
        backoff = Backoff(STREAM_BACKOFF_MIN_S, STREAM_BACKOFF_MAX_S)
        while not self._closing:
            self._acked = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.RpcError as err:
                log.debug("client stream to %s broke: %s", self.addr, err.code())
            except Exception:
                log.exception("client stream to %s failed", self.addr)
            finally:
                self._call = None
                self._fail_acks()
            if self._closing:
                return
            if self._acked:
                backoff.reset()  # the stream worked: a broker restart costs one short pause
            # jittered: every client of a restarted broker reconnects at once otherwise
            await asyncio.sleep(backoff.next_delay_s())

    async def _session(self) -> None:
        """One connection's life, until the broker ends it or it breaks."""
        call = self.instance.messaging(self.addr).ClientStream()
        self._call = call
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks.append(first)
        await call.write(messaging_pb2.ClientStreamRequest(heartbeat=self.instance._heartbeat_pb()))
        writer = asyncio.create_task(self._write_loop(call))
        try:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    return
                assert isinstance(resp, messaging_pb2.ClientStreamResponse)
                self._dispatch(resp)
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
            call.cancel()

    async def _write_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            req, fut = await self._outbox.get()
            if req is _HALF_CLOSE:
                await call.done_writing()
                return
            if fut is not None and fut.done():
                continue
            is_heartbeat = req.WhichOneof("command") == "heartbeat"
            if is_heartbeat and fut is not None:
                self._acks.append(fut)
            try:
                await call.write(req)
            except BaseException as err:
                if fut is not None and not fut.done():
                    fut.set_exception(BrokerUnavailableError(f"{self.addr}: {err!r}"))
                    fut.exception()
                raise
            if not is_heartbeat and fut is not None and not fut.done():
                fut.set_result(None)

    def _fail_acks(self) -> None:
        while self._acks:
            fut = self._acks.popleft()
            if not fut.done():
                fut.set_exception(
                    BrokerUnavailableError(f"client stream to {self.addr} closed", target=self.addr)
                )
                fut.exception()

    def _dispatch(self, resp: messaging_pb2.ClientStreamResponse) -> None:
        kind = resp.WhichOneof("command")
        inst = self.instance
        try:
            if kind == "heartbeat_ack":
                self._acked = True
                while self._acks:
                    fut = self._acks.popleft()
                    if not fut.done():
                        fut.set_result(None)
                        break
            elif kind == "consumer_ids_changed":
                consumer = inst._consumers.get(resp.consumer_ids_changed.consumer_group)
                if consumer is not None:
                    consumer.on_consumer_ids_changed()
            elif kind == "reset_offset":
                notice = resp.reset_offset
                consumer = inst._consumers.get(notice.consumer_group)
                if consumer is not None:
                    offsets = {int(q): int(o) for q, o in notice.queue_offsets.items()}
                    consumer.on_reset_offset(notice.topic, self.broker_name, offsets)
            elif kind == "subscription_conflict":
                inst._on_subscription_conflict(resp.subscription_conflict, self.addr)
            elif kind == "check_transaction_state":
                check = resp.check_transaction_state
                producer = inst._producers.get(check.producer_group)
                if producer is not None:
                    producer.on_check_transaction(self.addr, check)
        except Exception:
            # A handle's bug must not take the stream (and every other group's notices) down.
            log.exception("handling %s from %s failed", kind, self.addr)

    async def close(self, goodbye: messaging_pb2.ClientStreamRequest | None = None) -> None:
        """Write ``goodbye`` (if given) and half-close through the writer, so writes never
        overlap, and let the broker end the stream; cancel it if that takes too long. A graceful
        end leaves no gRPC operation pending when the event loop closes."""
        self._closing = True
        if self._call is not None:
            with contextlib.suppress(asyncio.QueueFull):
                if goodbye is not None:
                    self._outbox.put_nowait((goodbye, None))
                self._outbox.put_nowait((_HALF_CLOSE, None))
                await asyncio.wait({self._task}, timeout=STREAM_CLOSE_WAIT_S)
        if not self._task.done():
            if self._call is not None:
                self._call.cancel()
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._fail_acks()


class ClientInstance:
    """Routes, channels and broker streams shared by a process's producers and consumers."""

    _registry: ClassVar[
        weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[object, ...], ClientInstance]
        ]
    ] = weakref.WeakKeyDictionary()

    @classmethod
    def get(cls, config: ClientConfig) -> ClientInstance:
        """The instance for ``config``'s nameservers and client id on the running event loop.

        Must be called from a coroutine (the instance's channels belong to that loop). The first
        caller's config decides intervals and timeouts.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "ClientInstance.get must be called inside a running event loop (from a coroutine)"
            ) from None
        table = cls._registry.setdefault(loop, {})
        # clients with other credentials or TLS files must not share channels (sec)
        key = (config.namesrv_addrs, config.client_id, config.security)
        inst = table.get(key)
        if inst is None:
            inst = cls(config)
            inst._registry_key = (loop, key)
            table[key] = inst
        return inst

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.client_id = config.client_id
        self.namesrv = NameServerClient(
            list(config.namesrv_addrs), config.request_timeout_ms, security=config.security
        )
        self._registry_key: tuple[asyncio.AbstractEventLoop, tuple[object, ...]] | None = None
        self._users = 0
        self._closed = False
        self._routes: dict[str, TopicRoute] = {}
        self._fetching: dict[str, asyncio.Future[TopicRoute]] = {}
        self._channels: dict[str, _Channel] = {}
        self._streams: dict[str, _BrokerStream] = {}
        self._producers: dict[str, ProducerHandle] = {}
        # Every master of every cluster (addr -> broker name), from the nameserver's cluster
        # info, while a producer is registered: any of them may hold the group's half messages
        # and must know a live producer to send its transaction checks to (RocketMQ's producer
        # heartbeats every broker of its route table, the TBW102 template's included).
        self._masters: dict[str, str] = {}
        self._consumers: dict[str, ConsumerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # (group, topic) -> what was last logged of a conflict, so each change is logged once.
        self._conflicts_logged: dict[tuple[str, str], tuple[object, ...]] = {}

    # ---- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Count one more user; the first starts the route-refresh and heartbeat tasks."""
        if self._closed:
            raise RuntimeError("this ClientInstance is closed; call ClientInstance.get again")
        self._users += 1
        if self._users == 1:
            self._spawn(self._route_loop(), "rocketq-route-refresh")
            self._spawn(self._heartbeat_loop(), "rocketq-heartbeat")

    async def close(self) -> None:
        """Count one user less; the last one unregisters from brokers and closes everything."""
        if self._closed or self._users == 0:
            return
        self._users -= 1
        if self._users > 0:
            return
        self._closed = True
        if self._registry_key is not None:
            loop, key = self._registry_key
            table = self._registry.get(loop, {})
            if table.get(key) is self:
                del table[key]
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        goodbye = messaging_pb2.ClientStreamRequest(
            unregister=messaging_pb2.UnregisterClient(client_id=self.client_id)
        )
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close(goodbye) for s in streams), return_exceptions=True)
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.channel.close() for c in channels), return_exceptions=True)
        await self.namesrv.close()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- routes --------------------------------------------------------------------------

    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route, from the cache unless ``refresh``; TopicNotFoundError if none."""
        if not refresh:
            cached = self._routes.get(topic)
            if cached is not None:
                return cached
        pending = self._fetching.get(topic)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch_route(topic))
            self._fetching[topic] = pending
            pending.add_done_callback(lambda _f: self._fetching.pop(topic, None))
        return await asyncio.shield(pending)

    async def _fetch_route(self, topic: str) -> TopicRoute:
        try:
            route = await self.namesrv.get_route(topic)
        except TopicNotFoundError:
            cached = self._routes.get(topic)
            if cached is not None and cached.default_topic:
                return cached  # a borrowed auto-create route lives until the real one appears
            raise
        self.put_route(route)
        return route

    def cached_route(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    def put_route(self, route: TopicRoute) -> None:
        """Cache ``route`` under ``route.topic``; consumers of the topic hear of a change."""
        old = self._routes.get(route.topic)
        self._routes[route.topic] = route
        if old == route:
            return
        # A first sighting counts as a change too: a consumer's %RETRY% topic is created by its
        # own first heartbeat, after the consumer looked for its route, and must not wait for
        # the next 20 s rebalance once the route poll finds it.
        for consumer in list(self._consumers.values()):
            try:
                if route.topic in consumer.topics():
                    consumer.on_route_changed(route.topic, route)
            except Exception:
                log.exception("on_route_changed(%s) failed", route.topic)
        if self._users:
            self._open_streams()

    def find_broker_addr(
        self, broker_name: str, broker_id: int = 0, *, only_this_broker: bool = False
    ) -> str | None:
        """Address of a broker from the cached routes; falls back to any broker of the group."""
        for route in self._routes.values():
            addr = route.brokers.get(broker_name, {}).get(broker_id)
            if addr:
                return addr
        if only_this_broker:
            return None
        for route in self._routes.values():
            addr = route.broker_addr(broker_name, broker_id)
            if addr:
                return addr
        return None

    def topics_in_use(self) -> set[str]:
        topics: set[str] = set()
        handles: list[ProducerHandle | ConsumerHandle] = [
            *self._producers.values(),
            *self._consumers.values(),
        ]
        for handle in handles:
            try:
                topics.update(handle.topics())
            except Exception:
                log.exception("topics() of a handle failed")
        return topics

    async def refresh_masters(self) -> None:
        """Learn every master of the cluster while a producer is registered (a master that
        joins later is found by the next route poll); nameserver trouble keeps what is known."""
        if not self._producers:
            self._masters = {}
            return
        try:
            info = await self.namesrv.cluster_info()
        except RocketQError as err:
            log.debug("cluster info for the producers' heartbeats failed: %s", err)
            return
        self._masters = {
            data.broker_addrs[0]: name
            for name, data in info.broker_addr_table.items()
            if data.broker_addrs.get(0)
        }

    async def announce_producers(self) -> list[str]:
        """Heartbeat every master now so each knows this client's producer groups before any
        send (a standby producer must be asked about a crashed one's transactions); returns
        the addresses that acknowledged."""
        await self.refresh_masters()
        return await self.heartbeat_now()

    async def refresh_routes(self) -> None:
        """Refresh the route of every topic in use now (the periodic task calls this)."""
        await self.refresh_masters()
        topics = sorted(self.topics_in_use())
        results = await asyncio.gather(
            *(self.get_route(t, refresh=True) for t in topics), return_exceptions=True
        )
        for topic, res in zip(topics, results, strict=True):
            if isinstance(res, RocketQError):
                log.debug("route refresh of %s failed: %s", topic, res)
            elif isinstance(res, BaseException):
                log.warning("route refresh of %s failed", topic, exc_info=res)
        await self._sync_streams()

    async def _route_loop(self) -> None:
        interval_s = self.config.poll_name_server_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh_routes()
            except Exception:
                log.exception("route refresh failed")

    # ---- channels ------------------------------------------------------------------------

    def _channel(self, addr: str) -> _Channel:
        ch = self._channels.get(addr)
        if ch is None:
            if self._closed:
                raise RuntimeError("this ClientInstance is closed")
            ch = self._channels[addr] = _Channel(addr, self.config.security)
        return ch

    def messaging(self, addr: str) -> messaging_pb2_grpc.MessagingAsyncStub:
        """The Messaging stub of the broker at ``addr`` (one channel per address)."""
        return self._channel(addr).messaging

    def admin(self, addr: str) -> admin_pb2_grpc.AdminAsyncStub:
        """The Admin stub of the broker at ``addr``."""
        return self._channel(addr).admin

    # ---- groups and heartbeats -----------------------------------------------------------

    def register_producer(self, group: str, producer: ProducerHandle) -> None:
        """Add a producer group; ValueError if this client already has one of that name."""
        if group in self._producers:
            raise ValueError(
                f"producer group {group!r} is already registered in client {self.client_id}; "
                "use one producer per group, or give the second one another instance_name"
            )
        self._producers[group] = producer
        self._kick_heartbeat()

    def unregister_producer(self, group: str) -> None:
        """Remove a producer group and tell the brokers (UnregisterClient, not awaited)."""
        if self._producers.pop(group, None) is None:
            return
        req = messaging_pb2.ClientStreamRequest(
            unregister=messaging_pb2.UnregisterClient(
                client_id=self.client_id, producer_groups=[group]
            )
        )
        for stream in self._streams.values():
            stream.send(req)

    def register_consumer(self, group: str, consumer: ConsumerHandle) -> None:
        """Add a consumer group; ValueError if this client already has one of that name."""
        if group in self._consumers:
            raise ValueError(
                f"consumer group {group!r} is already registered in client {self.client_id}; "
                "use one consumer per group, or give the second one another instance_name"
            )
        self._consumers[group] = consumer
        self._kick_heartbeat()

    async def unregister_consumer(self, group: str) -> None:
        """Remove a consumer group and tell every broker, waiting (bounded) for the writes."""
        if self._consumers.pop(group, None) is None:
            return
        req = messaging_pb2.ClientStreamRequest(
            unregister=messaging_pb2.UnregisterClient(
                client_id=self.client_id, consumer_groups=[group]
            )
        )
        futs = [s.send(req) for s in self._streams.values()]
        if futs:
            await asyncio.wait(futs, timeout=self.config.request_timeout_ms / 1000)

    def _on_subscription_conflict(
        self, conflict: common_pb2.SubscriptionConflict, broker_addr: str
    ) -> None:
        """Log a conflict notice once per change and hand it to the group's consumer."""
        group, topic = conflict.consumer_group, conflict.topic
        consumer = self._consumers.get(group)
        if consumer is None:
            return  # a late notice for a consumer that has closed
        key = (group, topic)
        shown: tuple[object, ...] = (
            conflict.pulls_refused,
            *(
                (m.client_id, m.subscribed, m.expression_type, m.expression)
                for m in conflict.members
            ),
        )
        if not conflict.members:
            if self._conflicts_logged.pop(key, None) is not None:
                log.info("group %s: the members agree about %s again", group, topic)
        elif self._conflicts_logged.get(key) != shown:
            if key not in self._conflicts_logged and (
                len(self._conflicts_logged) >= CONFLICTS_REMEMBERED_MAX
            ):
                self._conflicts_logged.pop(next(iter(self._conflicts_logged)))
            self._conflicts_logged[key] = shown
            log.error(
                "group %s: members subscribe to %s differently (%s; reported by %s). They share "
                "its queues, so a member's filter would drop messages another member wants: %s",
                group,
                topic,
                describe_conflict_members(conflict),
                broker_addr,
                "the broker refuses the group's pulls of it until every member subscribes the "
                "same way"
                if conflict.pulls_refused
                else "the broker only reports it (strictSubscriptionConsistency=false), so "
                "messages can be lost",
            )
        consumer.on_subscription_conflict(conflict)

    def _heartbeat_pb(self) -> messaging_pb2.Heartbeat:
        hb = messaging_pb2.Heartbeat(client_id=self.client_id)
        for producer in self._producers.values():
            hb.producers.append(producer.producer_data())
        for consumer in self._consumers.values():
            hb.consumers.append(consumer.consumer_data())
        return hb

    def _kick_heartbeat(self) -> None:
        if self._users and not self._closed:
            self._spawn(self._quiet_heartbeat(), "rocketq-heartbeat-now")

    async def _quiet_heartbeat(self) -> None:
        with contextlib.suppress(Exception):
            await self.heartbeat_now()

    async def heartbeat_now(self) -> list[str]:
        """Heartbeat every broker of every route in use and wait (bounded) for their acks.

        Returns the addresses of the brokers that acknowledged. One that does not within
        ``request_timeout_ms`` is logged, not raised: its stream keeps reconnecting and the next
        heartbeat will reach it.
        """
        self._open_streams()
        streams = list(self._streams.values())
        futs = [s.heartbeat() for s in streams]
        if not futs:
            return []
        _done, pending = await asyncio.wait(futs, timeout=self.config.request_timeout_ms / 1000)
        for fut in pending:
            fut.cancel()
        acked = []
        for stream, fut in zip(streams, futs, strict=True):
            if fut in pending:
                log.debug("heartbeat to %s not acknowledged in time", stream.addr)
            elif fut.exception() is not None:
                log.debug("heartbeat to %s failed: %s", stream.addr, fut.exception())
            else:
                acked.append(stream.addr)
        return sorted(acked)

    async def _heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_broker_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.heartbeat_now()
            except Exception:
                log.exception("heartbeat round failed")

    # ---- streams -------------------------------------------------------------------------

    def _wanted_brokers(self) -> dict[str, str]:
        """addr -> broker name, for every broker of every cached route of a topic in use, and
        every master of the cluster while a producer is registered."""
        wanted: dict[str, str] = dict(self._masters) if self._producers else {}
        for topic in self.topics_in_use():
            route = self._routes.get(topic)
            if route is None:
                continue
            for name, ids in route.brokers.items():
                for addr in ids.values():
                    wanted[addr] = name
        return wanted

    def _open_streams(self) -> None:
        if self._closed or not self._users:
            return
        for addr, name in self._wanted_brokers().items():
            stream = self._streams.get(addr)
            if stream is None:
                self._streams[addr] = _BrokerStream(self, addr, name)
            else:
                stream.broker_name = name

    async def _sync_streams(self) -> None:
        """Open streams to brokers now in use; close those to brokers no route mentions."""
        self._open_streams()
        wanted = self._wanted_brokers()
        stale = [s for addr, s in self._streams.items() if addr not in wanted]
        for stream in stale:
            del self._streams[stream.addr]
        if stale:
            await asyncio.gather(*(s.close() for s in stale), return_exceptions=True)

    def stream_addrs(self) -> list[str]:
        """Brokers this client keeps a stream to (for diagnostics and tests)."""
        return sorted(self._streams)
