"""The client side of the nameserver: which one to ask, and when to give up on it.

SPEC §2.5: a client keeps one connection to one nameserver, picked as ``random % n`` at first,
and moves round-robin to the next when a request fails. Nameservers hold identical routes
(every broker registers with every one), so any answer is as good as another.

"Pseudo-death": a nameserver host that hangs without closing TCP made RocketMQ clients time out
for ten minutes, because only a closed connection made them switch. Here every request carries
a deadline, and a deadline exceeded counts as a failure like a refused connection: the client
switches at once and asks the next nameserver within the same call.

A NOT_FOUND answer is an answer (the topic has no route), not a reason to switch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import grpc

from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc
from rocketq.client._channels import open_channel
from rocketq.client._route import TopicRoute
from rocketq.client.errors import (
    NameServerUnavailableError,
    NotFoundError,
    TopicNotFoundError,
    from_rpc_error,
)
from rocketq.client.security import ClientSecurity, transport_hint

# Codes after which another nameserver may answer where this one did not.
_SWITCH_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


def parse_addrs(addrs: Sequence[str] | str) -> list[str]:
    """Nameserver addresses from a list and/or RocketMQ's "a:9876;b:9876" form, in order."""
    items = [addrs] if isinstance(addrs, str) else list(addrs)
    out = [a.strip() for item in items for a in item.split(";") if a.strip()]
    if not out:
        raise ValueError("no nameserver address given; pass e.g. ['127.0.0.1:9876']")
    return out


class NameServerChooser:
    """Which nameserver to ask: ``random % n`` first, then round-robin past failures (pure)."""

    def __init__(self, addrs: Sequence[str], rng: random.Random | None = None) -> None:
        if not addrs:
            raise ValueError("no nameserver address given")
        self.addrs = list(addrs)
        self._index = (rng or random.Random()).randrange(1 << 30) % len(self.addrs)

    @property
    def current(self) -> str:
        return self.addrs[self._index]

    def failed(self, addr: str) -> str:
        """Report that ``addr`` failed; returns the nameserver to ask next."""
        if addr == self.current:
            self._index = (self._index + 1) % len(self.addrs)
        return self.current

    def attempt_order(self) -> list[str]:
        """Every nameserver once, starting with the current one (for a single call's retries)."""
        n = len(self.addrs)
        return [self.addrs[(self._index + i) % n] for i in range(n)]


class NameServerClient:
    """Asks the nameservers for routes, switching on failure or timeout (SPEC §2.5)."""

    def __init__(
        self,
        addrs: Sequence[str] | str,
        timeout_ms: int = 3000,
        rng: random.Random | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.security = security
        self.chooser = NameServerChooser(parse_addrs(addrs), rng)
        self.timeout_ms = timeout_ms
        self._addr = ""
        self._channel: grpc.aio.Channel | None = None
        self._stub: nameserver_pb2_grpc.NameServerAsyncStub | None = None

    @property
    def addrs(self) -> list[str]:
        return list(self.chooser.addrs)

    def _stub_for(self, addr: str) -> nameserver_pb2_grpc.NameServerAsyncStub:
        if self._stub is None or addr != self._addr:
            old = self._channel
            self._channel = open_channel(addr, self.security)
            self._stub = nameserver_pb2_grpc.NameServerStub(self._channel)  # type: ignore[assignment]
            self._addr = addr
            if old is not None:
                # One long connection, to the current nameserver only (SPEC §2.5).
                _close_later(old)
        assert self._stub is not None
        return self._stub

    async def _call(self, method: str, request: object) -> object:
        failures: list[str] = []
        for addr in self.chooser.attempt_order():
            stub = self._stub_for(addr)
            try:
                return await getattr(stub, method)(request, timeout=self.timeout_ms / 1000)
            except grpc.RpcError as err:
                if err.code() not in _SWITCH_CODES:
                    raise from_rpc_error(err, addr) from None
                text = err.details() or ""
                failures.append(f"{addr}: {err.code().name} {text}{transport_hint(text)}".strip())
                self.chooser.failed(addr)
        raise NameServerUnavailableError(
            "no nameserver answered (" + "; ".join(failures) + "); check namesrv_addrs and that "
            "the nameservers are running"
        )

    async def get_route(self, topic: str) -> TopicRoute:
        """The topic's route. TopicNotFoundError when no live broker hosts it."""
        req = nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic)
        try:
            resp = await self._call("GetRouteInfoByTopic", req)
        except NotFoundError as err:
            if isinstance(err, TopicNotFoundError):
                raise
            raise TopicNotFoundError(
                err.message, code=err.code, reason=err.reason, target=err.target
            ) from None
        assert isinstance(resp, nameserver_pb2.GetRouteInfoByTopicResponse)
        if not resp.route.queues:
            raise TopicNotFoundError(f"no route for topic {topic!r}", target=self._addr)
        return TopicRoute.from_pb(topic, resp.route)

    async def cluster_info(self) -> nameserver_pb2.GetClusterInfoResponse:
        resp = await self._call("GetClusterInfo", nameserver_pb2.GetClusterInfoRequest())
        assert isinstance(resp, nameserver_pb2.GetClusterInfoResponse)
        return resp

    async def all_topics(self, cluster: str = "") -> list[str]:
        req = nameserver_pb2.GetAllTopicsRequest(cluster_name=cluster)
        resp = await self._call("GetAllTopics", req)
        assert isinstance(resp, nameserver_pb2.GetAllTopicsResponse)
        return list(resp.topics)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None


def _close_later(channel: grpc.aio.Channel) -> None:
    task = asyncio.ensure_future(channel.close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


# Keeps channel-closing tasks referenced until they finish (asyncio holds tasks weakly).
_closing: set[asyncio.Future[None]] = set()


__all__ = ["NameServerChooser", "NameServerClient", "parse_addrs"]
