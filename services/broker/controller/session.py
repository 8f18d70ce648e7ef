"""A thin, bounded layer over ``aetcd``: every call has a timeout, every failure becomes one
exception type, and a failing endpoint is swapped for the next one.

Why not call ``aetcd`` directly: etcd being down or paused (SIGSTOP) must never block the
broker's event loop beyond a call's timeout nor crash it, and the controller must not care
whether a failure was a refused connection, a deadline, a closed channel or a gRPC error.

gRPC channels reconnect on their own with exponential backoff that grows to two minutes by
default; the channel options below cap it at one second, so the controller notices an etcd that
came back within about a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aetcd

from services.broker.controller.keys import KeyValue

log = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT_S = 2.0
"""Default bound of one etcd request (the lease keepalive uses a shorter one)."""
CLOSE_TIMEOUT_S = 1.0
CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 2000,
    "grpc.keepalive_timeout_ms": 2000,
}


_UNREACHABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.WatchTimeoutError,
)
"""Failures that say the endpoint is unreachable (others, like "lease not found", are answers)."""


class EtcdUnavailable(Exception):
    """An etcd request failed or timed out; ``problem`` names the kind (for log-once)."""

    def __init__(self, problem: str, detail: str) -> None:
        super().__init__(f"{problem}: {detail}")
        self.problem = problem
        self.detail = detail


class ProblemLog:
    """Logs each distinct problem once (and once more when it goes away), not on every retry."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self._what = what
        self._active: dict[str, str] = {}

    def report(self, topic: str, problem: str, detail: str) -> None:
        if self._active.get(topic) == problem:
            return
        self._active[topic] = problem
        self._log.warning("%s: %s failing (%s); retrying quietly", self._what, topic, detail)

    def resolve(self, topic: str) -> None:
        if self._active.pop(topic, None) is not None:
            self._log.warning("%s: %s working again", self._what, topic)

    def active(self) -> dict[str, str]:
        return dict(self._active)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return (host or "127.0.0.1"), int(port or 2379)


class EtcdSession:
    """One client at a time, on one of ``endpoints`` (rotated after a failure)."""

    def __init__(self, endpoints: Sequence[str], call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.call_timeout_s = call_timeout_s
        self._index = 0
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._index]

    def client(self) -> Any:
        """The current ``aetcd.Client`` (created lazily; it connects on first use)."""
        if self._client is None:
            host, port = _split(self.endpoint)
            self._client = aetcd.Client(
                host,
                port,
                timeout=self.call_timeout_s,
                options=CHANNEL_OPTIONS,
                connect_wait_timeout=int(max(1, self.call_timeout_s)),
            )
        return self._client

    async def call(
        self, fn: Callable[[Any], Awaitable[T]], what: str, timeout_s: float | None = None
    ) -> T:
        """``await fn(client)`` within ``timeout_s``; any failure → :class:`EtcdUnavailable`."""
        client = self.client()
        endpoint = self.endpoint
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the call completes (rocketq/aio.py), and the loops calling this (ISR
            # publisher, lease keeper, main loop) then outlive their stop: a demotion awaiting
            # the ISR publisher hung, holding the role lock, and the replica never campaigned
            # again (a chaos run's "no in-sync replica alive").
            async with asyncio.timeout(timeout_s or self.call_timeout_s):
                return await fn(client)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the caller itself is being cancelled (stop)
            # The request was cancelled, not us: another task's failure on this client made
            # _failed close it (several endpoints). Letting CancelledError out would end the
            # controller loop that made the call, which catches only ordinary exceptions.
            raise EtcdUnavailable(f"{what} cancelled", f"{endpoint}: client closed") from None
        except TimeoutError as exc:
            self._failed(client)
            raise EtcdUnavailable(f"{what} timed out", f"no answer from {self.endpoint}") from exc
        except Exception as exc:
            if isinstance(exc, _UNREACHABLE):
                self._failed(client)
            raise EtcdUnavailable(
                f"{what} {type(exc).__name__}", f"{self.endpoint}: {exc}"
            ) from exc

    def _failed(self, client: Any) -> None:
        """The endpoint did not answer: with one endpoint the channel reconnects by itself;
        with several, the next call goes to the next one."""
        if len(self.endpoints) > 1 and client is self._client:
            self._index = (self._index + 1) % len(self.endpoints)
            self._client = None
            asyncio.get_running_loop().create_task(_close_quietly(client))

    async def read_prefix(self, prefix: bytes) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` with the store revision of the read."""

        async def get(client: Any) -> Any:
            return await client.get_prefix(prefix)

        result = await self.call(get, "read")
        kvs = [KeyValue(kv.key, kv.value, kv.mod_revision, kv.lease) for kv in result]
        return int(result.header.revision), kvs

    async def txn(self, compare: list[Any], success: list[Any], what: str) -> bool:
        """A transaction; True when its comparisons held and ``success`` was applied."""

        async def run(client: Any) -> bool:
            succeeded, _ = await client.transaction(compare=compare, success=success, failure=[])
            return bool(succeeded)

        return await self.call(run, what)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)


async def _close_quietly(client: Any) -> None:
    try:
        await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)
    except Exception:
        log.debug("closing an etcd client failed", exc_info=True)
