"""The broker calls a consumer makes, with addressing and error translation in one place.

Which broker answers what (SPEC §6.6, §6.12, DESIGN.md §6):

| call                      | broker, best first                       | on "no address"          |
|---------------------------|------------------------------------------|--------------------------|
| Pull                      | the id the last pull response suggested  | refresh the route, retry |
|                           | (0 = master, else a slave; the master    | once, else unavailable   |
|                           | when that id is not in the route), then  |                          |
|                           | the master, then the slaves by id        |                          |
| UpdateConsumerOffset      | master, then the slaves (a slave takes   | same                     |
|                           | commits only while its master is gone)   |                          |
| QueryConsumerOffset,      | master, then the slaves by id            | same                     |
| Get{Max,Min}Offset,       |                                          |                          |
| SearchOffsetByTimestamp   |                                          |                          |
| GetConsumerIdList         | a random master of the topic's route,    | -                        |
|                           | then the other masters, then the slaves  |                          |
| ConsumerSendBack          | master of the message's broker group     | same                     |
| LockBatch / UnlockBatch   | master of the queues' broker group (one  | same                     |
|                           | call per broker name, ≤ 1024 queues)     |                          |

"Then" means: when the earlier broker cannot be reached (connection refused, UNAVAILABLE,
timeout), the next one is asked at once, and the failed address is remembered for 10 s
(:class:`~rocketq.client._route.BrokerHealth`) so that later calls start with a broker that
answers. That is how a consumer keeps reading, and committing offsets, while its master is down
but still in the route (the nameserver expires a dead broker only after its heartbeat timeout);
the master is probed again after the 10 s and used as soon as it answers.

Failover (controller mode, DESIGN.md §6): a replica the route calls the master (brokerId 0)
that answers NOT_MASTER has lost the role, so the route is stale: the route is refreshed at
once (at most every ``STALE_REFRESH_MIN_INTERVAL_S`` per consumer group) and the call goes on
with the fresh route's replicas it has not tried, the new master first. Calls that only a master
serves (LockBatch, UnlockBatch, ConsumerSendBack) refresh the same way when the master refuses
or cannot be reached, and are tried once more if the master moved. Every call reads the newest
cached route, so offset commits and pulls follow the new master once the route changes.

Every failure surfaces as a :class:`~rocketq.client.errors.RocketQError` naming the broker.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

import grpc

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc
from rocketq.client._request_stream import RequestStreams, StreamFull, StreamUnsupported
from rocketq.client._route import (
    MASTER_ID,
    BrokerHealth,
    ReadTarget,
    TopicRoute,
    read_targets,
    write_targets,
)
from rocketq.client.errors import (
    BrokerUnavailableError,
    RequestTimeoutError,
    RocketQError,
    from_rpc_error,
)
from rocketq.codec import Prop
from rocketq.message import MessageQueue, ReceivedMessage

T = TypeVar("T")

LOCK_BATCH_MAX = 1024
"""Queues per LockBatch/UnlockBatch call (messaging.proto's limit); more go in several calls."""

STALE_REFRESH_MIN_INTERVAL_S = 1.0
"""Least time between two refreshes caused by a stale master of one consumer group (a master
that lost its lease keeps answering NOT_MASTER until another is elected and registered)."""

log = logging.getLogger(__name__)


class InstanceLike(Protocol):
    """What the consumer needs of :class:`rocketq.client._instance.ClientInstance`."""

    @property
    def client_id(self) -> str: ...

    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute: ...

    def cached_route(self, topic: str) -> TopicRoute | None: ...

    def messaging(self, addr: str) -> messaging_pb2_grpc.MessagingAsyncStub: ...

    async def heartbeat_now(self) -> object: ...

    async def refresh_routes(self) -> None: ...


STREAM_HOLD_MARGIN_MS = 200
"""A pull down a stream asks the broker to hold it at most this much less than the client
waits for its answer (the broker ends a unary call's hold 50 ms before its deadline)."""


def is_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the broker could not be reached (not that it refused): another
    replica of the group may answer. A slave's NOT_MASTER refusal is an answer."""
    if isinstance(exc, RequestTimeoutError):
        return True
    return isinstance(exc, BrokerUnavailableError) and exc.reason != "NOT_MASTER"


def stale_master(target: ReadTarget, exc: BaseException) -> bool:
    """True when the replica the route names as master (brokerId 0) answered NOT_MASTER: it has
    lost the role since the route was read (a failover), so the route should be refreshed."""
    return target.broker_id == MASTER_ID and getattr(exc, "reason", "") == "NOT_MASTER"


def _mq_pb(mq: MessageQueue) -> common_pb2.MessageQueue:
    return common_pb2.MessageQueue(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


class BrokerApi:
    """The consumer-side broker calls of one consumer group."""

    def __init__(
        self,
        instance: InstanceLike,
        group: str,
        request_timeout_ms: int,
        pull_streams: RequestStreams | None = None,
    ) -> None:
        self._instance = instance
        self.group = group
        self._timeout_s = request_timeout_ms / 1000
        self._pull_streams = pull_streams
        """Pulls go down one PullStream per broker (rocketq/client/_request_stream.py); None =
        a unary Pull each."""
        self.health = BrokerHealth()
        """Addresses that failed recently; shared by pulls and offset calls of this group."""
        self._stale_refresh_at_s = float("-inf")

    # ---- addressing -------------------------------------------------------------------------

    async def _route(self, topic: str, refresh: bool = False) -> TopicRoute:
        route = None if refresh else self._instance.cached_route(topic)
        if route is None:
            route = await self._instance.get_route(topic, refresh=refresh)
        return route

    async def _addr(self, mq: MessageQueue, pick: Callable[[TopicRoute, str], str | None]) -> str:
        """An address chosen by ``pick`` from the cached route, refreshing it once if needed."""
        for refresh in (False, True):
            addr = pick(await self._route(mq.topic, refresh), mq.broker_name)
            if addr:
                return addr
        raise BrokerUnavailableError(
            f"no live broker of group {mq.broker_name} for {mq} in the route of {mq.topic!r}"
        )

    async def master_addr(self, mq: MessageQueue) -> str:
        return await self._addr(mq, lambda r, name: r.master_addr(name))

    async def pull_addr(self, mq: MessageQueue, broker_id: int) -> tuple[str, bool]:
        """Address to pull ``mq`` from when the last pull suggested ``broker_id`` (SPEC §6.6
        step 6), and whether a commit offset carried by the pull would be ignored there: True
        for a slave while its master is reachable (the slave then leaves commits to the master).
        """
        targets, route = await self._targets(
            mq, lambda r: read_targets(r, mq.broker_name, broker_id, self.health.is_unreachable)
        )
        first = targets[0]
        master = route.master_addr(mq.broker_name)
        ignored = (
            first.broker_id != MASTER_ID
            and master is not None
            and not self.health.is_unreachable(master)
        )
        return first.addr, ignored

    async def _targets(
        self, mq: MessageQueue, pick: Callable[[TopicRoute], list[ReadTarget]]
    ) -> tuple[list[ReadTarget], TopicRoute]:
        """``pick`` applied to the cached route, refreshing it once when it gives nothing."""
        for refresh in (False, True):
            route = await self._route(mq.topic, refresh)
            targets = pick(route)
            if targets:
                return targets, route
        raise BrokerUnavailableError(
            f"no live broker of group {mq.broker_name} for {mq} in the route of {mq.topic!r}"
        )

    async def _with_failover(
        self,
        mq: MessageQueue,
        pick: Callable[[TopicRoute], list[ReadTarget]],
        call: Callable[[str], Awaitable[T]],
    ) -> T:
        """``call`` on the first target that can be reached; the first failure if none can
        (a refusal, as opposed to "unreachable", ends the search unless it is NOT_MASTER)."""
        targets, _ = await self._targets(mq, pick)
        first_exc: RocketQError | None = None
        tried: set[str] = set()
        while targets:
            target = targets.pop(0)
            tried.add(target.addr)
            try:
                result = await call(target.addr)
            except RocketQError as exc:
                if not (is_unreachable(exc) or exc.reason == "NOT_MASTER"):
                    raise
                if is_unreachable(exc):
                    self.health.mark_unreachable(target.addr)
                first_exc = first_exc or exc
                if stale_master(target, exc) and await self._refresh_stale(mq.topic):
                    fresh, _ = await self._targets(mq, pick)
                    targets = [t for t in fresh if t.addr not in tried]
                continue
            self.health.mark_reachable(target.addr)
            return result
        assert first_exc is not None
        raise first_exc

    async def _refresh_stale(self, topic: str) -> bool:
        """Refresh routes after a stale master's refusal, unless that was done just now."""
        now_s = time.monotonic()
        if now_s - self._stale_refresh_at_s < STALE_REFRESH_MIN_INTERVAL_S:
            return False
        self._stale_refresh_at_s = now_s
        await self.refresh_route(topic)
        return True

    async def _on_master(self, mq: MessageQueue, call: Callable[[str], Awaitable[T]]) -> T:
        """``call`` at ``mq``'s master; once more at the new master if the route was stale."""
        addr = await self.master_addr(mq)
        try:
            return await call(addr)
        except RocketQError as exc:
            if not (is_unreachable(exc) or exc.reason == "NOT_MASTER"):
                raise
            if not await self._refresh_stale(mq.topic):
                raise
            try:
                moved = await self.master_addr(mq)
            except RocketQError:
                raise exc from None
            if moved == addr:
                raise
            log.info("group %s: master of %s moved from %s to %s", self.group, mq, addr, moved)
            return await call(moved)

    def _reads(self, mq: MessageQueue) -> Callable[[TopicRoute], list[ReadTarget]]:
        return lambda r: read_targets(r, mq.broker_name, MASTER_ID, self.health.is_unreachable)

    def _commits(self, mq: MessageQueue) -> Callable[[TopicRoute], list[ReadTarget]]:
        return lambda r: write_targets(r, mq.broker_name, self.health.is_unreachable)

    async def refresh_route(self, topic: str) -> None:
        """Ask the nameserver again (a broker stopped answering; it may have moved).

        Every route of the client instance is refreshed, not only ``topic``'s: that also ends
        the instance's streams to brokers no route names any more, so they stop being waited
        on (heartbeats, unregistering at close).
        """
        try:
            await self._instance.refresh_routes()
            await self._instance.get_route(topic)
        except RocketQError as exc:
            log.debug("route refresh of %s failed: %s", topic, exc)

    async def _call(self, addr: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except grpc.RpcError as err:
            raise from_rpc_error(err, addr) from None

    # ---- calls ------------------------------------------------------------------------------

    async def pull(
        self, addr: str, request: messaging_pb2.PullRequest, timeout_ms: int
    ) -> messaging_pb2.PullResponse:
        """One Pull at ``addr``; records whether ``addr`` could be reached (``health``)."""
        try:
            resp = await self._pull(addr, request, timeout_ms / 1000)
        except RocketQError as exc:
            if is_unreachable(exc):
                self.health.mark_unreachable(addr)
            raise
        self.health.mark_reachable(addr)
        return resp

    async def _pull(
        self, addr: str, request: messaging_pb2.PullRequest, timeout_s: float
    ) -> messaging_pb2.PullResponse:
        streams = self._pull_streams
        if streams is not None and streams.usable(addr):
            # A stream request has no deadline of its own for the broker to end its hold
            # before, as it does a unary call's: the hold is asked short enough instead.
            hold_max_ms = int(timeout_s * 1000) - STREAM_HOLD_MARGIN_MS
            if request.suspend_timeout_ms > hold_max_ms:
                request.suspend_timeout_ms = max(hold_max_ms, 0)
            # An older broker: unary from now on. A full stream: this one unary (PULL_PENDING_MAX).
            with contextlib.suppress(StreamUnsupported, StreamFull):
                resp: messaging_pb2.PullResponse = await streams.call(addr, request, timeout_s)
                return resp
        stub = self._instance.messaging(addr)
        return await self._call(addr, lambda: stub.Pull(request, timeout=timeout_s))

    async def close(self) -> None:
        """End the pull streams (the pulls waiting on them fail ClientStateError)."""
        if self._pull_streams is not None:
            await self._pull_streams.close()

    async def query_offset(self, mq: MessageQueue) -> int:
        """The group's stored offset of ``mq``; NotFoundError when it has none."""
        req = messaging_pb2.QueryConsumerOffsetRequest(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id
        )

        async def call(addr: str) -> int:
            stub = self._instance.messaging(addr)
            resp = await self._call(
                addr, lambda: stub.QueryConsumerOffset(req, timeout=self._timeout_s)
            )
            return int(resp.offset)

        return await self._with_failover(mq, self._reads(mq), call)

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        """Store ``offset`` on the master, else (master unreachable) on a slave."""
        req = messaging_pb2.UpdateConsumerOffsetRequest(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, commit_offset=offset
        )

        async def call(addr: str) -> None:
            stub = self._instance.messaging(addr)
            await self._call(addr, lambda: stub.UpdateConsumerOffset(req, timeout=self._timeout_s))

        await self._with_failover(mq, self._commits(mq), call)

    async def max_offset(self, mq: MessageQueue) -> int:
        req = messaging_pb2.GetMaxOffsetRequest(topic=mq.topic, queue_id=mq.queue_id)

        async def call(addr: str) -> int:
            stub = self._instance.messaging(addr)
            resp = await self._call(addr, lambda: stub.GetMaxOffset(req, timeout=self._timeout_s))
            return int(resp.offset)

        return await self._with_failover(mq, self._reads(mq), call)

    async def min_offset(self, mq: MessageQueue) -> int:
        req = messaging_pb2.GetMinOffsetRequest(topic=mq.topic, queue_id=mq.queue_id)

        async def call(addr: str) -> int:
            stub = self._instance.messaging(addr)
            resp = await self._call(addr, lambda: stub.GetMinOffset(req, timeout=self._timeout_s))
            return int(resp.offset)

        return await self._with_failover(mq, self._reads(mq), call)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        req = messaging_pb2.SearchOffsetByTimestampRequest(
            topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=timestamp_ms
        )

        async def call(addr: str) -> int:
            stub = self._instance.messaging(addr)
            resp = await self._call(
                addr, lambda: stub.SearchOffsetByTimestamp(req, timeout=self._timeout_s)
            )
            return int(resp.offset)

        return await self._with_failover(mq, self._reads(mq), call)

    async def consumer_ids(self, topic: str) -> list[str]:
        """The group's live members (SPEC §6.10), asked of a random master of ``topic``; when
        it cannot be reached, of the next broker (other masters, then slaves: every broker
        hears the members' heartbeats), so a rebalance works while a master is down."""
        route = await self._route(topic)
        masters = sorted(a for ids in route.brokers.values() if (a := ids.get(MASTER_ID)))
        random.shuffle(masters)  # load spreading, not security
        slaves = sorted(
            a for ids in route.brokers.values() for i, a in ids.items() if i != MASTER_ID
        )
        addrs = [a for a in masters + slaves if not self.health.is_unreachable(a)]
        addrs += [a for a in masters + slaves if a not in addrs]
        if not addrs:
            raise BrokerUnavailableError(f"no live broker in the route of {topic!r}")
        first_exc: RocketQError | None = None
        for addr in addrs:
            try:
                ids = await self._consumer_ids_at(addr)
            except RocketQError as exc:
                if not is_unreachable(exc):
                    raise
                self.health.mark_unreachable(addr)
                first_exc = first_exc or exc
                continue
            self.health.mark_reachable(addr)
            return ids
        assert first_exc is not None
        raise first_exc

    async def _consumer_ids_at(self, addr: str) -> list[str]:
        stub = self._instance.messaging(addr)
        req = messaging_pb2.GetConsumerIdListRequest(consumer_group=self.group)
        resp = await self._call(addr, lambda: stub.GetConsumerIdList(req, timeout=self._timeout_s))
        return list(resp.consumer_ids)

    async def send_back(
        self, mq: MessageQueue, msg: ReceivedMessage, delay_level: int, max_reconsume_times: int
    ) -> None:
        """Return a failed message, pulled from ``mq``, for redelivery through %RETRY%{group}
        (SPEC §6.14); the master of ``mq``'s broker group holds the record."""
        req = messaging_pb2.ConsumerSendBackRequest(
            consumer_group=self.group,
            commitlog_offset=msg.commitlog_offset,
            delay_level=delay_level,
            origin_msg_id=msg.properties.get(Prop.ORIGIN_MESSAGE_ID) or msg.msg_id,
            origin_topic=msg.properties.get(Prop.RETRY_TOPIC) or msg.topic,
        )
        if max_reconsume_times >= 0:
            req.max_reconsume_times = max_reconsume_times

        async def call(addr: str) -> None:
            stub = self._instance.messaging(addr)
            await self._call(addr, lambda: stub.ConsumerSendBack(req, timeout=self._timeout_s))

        await self._on_master(mq, call)

    # ---- queue locks (orderly consumption, SPEC §6.15) --------------------------------------

    def _lock_chunks(
        self, broker_name: str, queues: Iterable[MessageQueue]
    ) -> list[list[MessageQueue]]:
        mqs = sorted(set(queues))
        for mq in mqs:
            if mq.broker_name != broker_name:
                raise ValueError(f"{mq} is not a queue of broker {broker_name}")
        return [mqs[i : i + LOCK_BATCH_MAX] for i in range(0, len(mqs), LOCK_BATCH_MAX)]

    async def lock_batch(
        self, broker_name: str, queues: Iterable[MessageQueue]
    ) -> set[MessageQueue]:
        """Lock ``queues`` (all of ``broker_name``) for this client on their master; returns
        the ones this client now holds (the rest are held by another live member)."""
        locked: set[MessageQueue] = set()
        for chunk in self._lock_chunks(broker_name, queues):
            locked |= await self._lock_chunk(broker_name, chunk)
        return locked

    async def _lock_chunk(self, broker_name: str, chunk: list[MessageQueue]) -> set[MessageQueue]:
        req = messaging_pb2.LockBatchRequest(
            consumer_group=self.group,
            client_id=self._instance.client_id,
            queues=[_mq_pb(mq) for mq in chunk],
        )

        async def call(addr: str) -> messaging_pb2.LockBatchResponse:
            stub = self._instance.messaging(addr)
            return await self._call(addr, lambda: stub.LockBatch(req, timeout=self._timeout_s))

        resp = await self._on_master(chunk[0], call)
        wanted = set(chunk)
        answered = {
            MessageQueue(pb.topic, pb.broker_name or broker_name, pb.queue_id)
            for pb in resp.locked_queues
        }
        return answered & wanted

    async def unlock_batch(self, broker_name: str, queues: Iterable[MessageQueue]) -> None:
        """Release this client's locks of ``queues`` (all of ``broker_name``)."""
        for chunk in self._lock_chunks(broker_name, queues):
            await self._unlock_chunk(chunk)

    async def _unlock_chunk(self, chunk: list[MessageQueue]) -> None:
        req = messaging_pb2.UnlockBatchRequest(
            consumer_group=self.group,
            client_id=self._instance.client_id,
            queues=[_mq_pb(mq) for mq in chunk],
        )

        async def call(addr: str) -> None:
            stub = self._instance.messaging(addr)
            await self._call(addr, lambda: stub.UnlockBatch(req, timeout=self._timeout_s))

        await self._on_master(chunk[0], call)
