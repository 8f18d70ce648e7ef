"""The broker calls the Spark data source makes, as blocking calls on a private event loop.

Spark calls a Python data source from plain threads (the driver-side reader process, executor
workers). The SDK is asyncio first, so each process keeps one event loop on a daemon thread and
one client per nameserver list on it (:func:`client`): workers are reused across tasks, and a
channel opened once serves every later task. Nothing here is opened at import or in a
constructor Spark pickles; the first call opens it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.admin import Admin
from rocketq.client.errors import (
    BrokerUnavailableError,
    NameServerUnavailableError,
    NotFoundError,
    RequestTimeoutError,
    RocketQError,
)
from rocketq.client.internal import BrokerApi, ClientConfig, ClientInstance
from rocketq.message import MessageQueue, ReceivedMessage, decode_records

T = TypeVar("T")

PULL_BATCH_MAX = 1024
"""Messages per Pull call: the broker's limit (messaging.proto)."""
REQUEST_TIMEOUT_MS = 15_000
"""Deadline of one offset or route call (generous: Spark hosts are often loaded)."""
CALL_ATTEMPTS = 4
"""Tries of one idempotent call (pull, offsets, routes) when nothing answered."""
RETRY_PAUSE_S = 1.0

FOUND = messaging_pb2.FOUND
OFFSET_ILLEGAL = messaging_pb2.OFFSET_ILLEGAL
_SUBSCRIPTION_FLAG = 0x4  # PullSysFlag FLAG_SUBSCRIPTION: filter by this request's expression
_EXPRESSION = {"TAG": common_pb2.TAG, "SQL92": common_pb2.SQL92}


class _Loop:
    """One event loop on a daemon thread; :meth:`run` blocks the caller until a coroutine ends."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="rocketq-spark", daemon=True)
        thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)


_lock = threading.Lock()
_loop: _Loop | None = None
_clients: dict[tuple[str, str], SparkClient] = {}


def loop() -> _Loop:
    """The process's event loop thread (started on first use)."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = _Loop()
        return _loop


def client(nameserver: str, group: str) -> SparkClient:
    """The process's client for ``nameserver`` acting for consumer group ``group``."""
    key = (nameserver, group)
    with _lock:
        found = _clients.get(key)
    if found is not None:
        return found
    made = SparkClient(nameserver, group)
    with _lock:
        return _clients.setdefault(key, made)


def retrying(call: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an idempotent call on the process's loop, again after a pause when no nameserver or
    broker answered (an overloaded host drops connections; a refusal is an answer, raised)."""
    for attempt in range(CALL_ATTEMPTS):
        try:
            return loop().run(call())
        except (NameServerUnavailableError, BrokerUnavailableError, RequestTimeoutError):
            if attempt + 1 == CALL_ATTEMPTS:
                raise
            time.sleep(RETRY_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable")


async def retrying_async(call: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """:func:`retrying` for a call already on the loop (a prefetched pull)."""
    for attempt in range(CALL_ATTEMPTS):
        try:
            return await call()
        except (NameServerUnavailableError, BrokerUnavailableError, RequestTimeoutError):
            if attempt + 1 == CALL_ATTEMPTS:
                raise
            await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class RawPull:
    """A Pull answer, its records undecoded (the reader cuts them into Arrow columns)."""

    status: int
    next_offset: int
    records: bytes
    """The stored records as pulled, laid end to end."""
    min_offset: int


@dataclass(frozen=True)
class PullResult:
    status: int
    next_offset: int
    messages: list[ReceivedMessage]
    min_offset: int


class SparkClient:
    """Routes, offsets and pulls of one nameserver list, blocking (see the module)."""

    def __init__(self, nameserver: str, group: str) -> None:
        self.nameserver = nameserver
        self.group = group
        self._loop = loop()
        self._instance: ClientInstance | None = None
        self._api: BrokerApi | None = None
        self._admin: Admin | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def retrying(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return retrying(call)

    async def _ready(self) -> BrokerApi:
        if self._api is None:
            cfg = ClientConfig(
                namesrv_addrs=(self.nameserver,),
                instance_name=f"spark-{os.getpid()}-{id(self)}",
                request_timeout_ms=REQUEST_TIMEOUT_MS,
            )
            instance = ClientInstance.get(cfg)
            await instance.start()
            self._instance = instance
            self._api = BrokerApi(instance, self.group, REQUEST_TIMEOUT_MS)
        return self._api

    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = self.run(_make_admin(self.nameserver))
        return self._admin

    # ---- topics and queues ------------------------------------------------------------------

    def queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` from a fresh route (RocketQError when unknown)."""

        async def go() -> list[MessageQueue]:
            await self._ready()
            assert self._instance is not None
            route = await self._instance.get_route(topic, refresh=True)
            return sorted(route.read_queues())

        return self.retrying(go)

    def list_topics(self) -> list[str]:
        admin = self.admin()
        return self.retrying(admin.list_topics)

    # ---- offsets ----------------------------------------------------------------------------

    def offsets(self, mqs: list[MessageQueue], which: str, timestamp_ms: int = 0) -> list[int]:
        """``which`` = "min", "max", "time" (first offset stored at or after ``timestamp_ms``)
        or "group" (the group's stored offset, -1 when none) of each queue."""

        async def one(api: BrokerApi, mq: MessageQueue) -> int:
            if which == "min":
                return await api.min_offset(mq)
            if which == "max":
                return await api.max_offset(mq)
            if which == "time":
                return await api.search_offset(mq, timestamp_ms)
            try:
                return await api.query_offset(mq)
            except RocketQError as exc:
                if isinstance(exc, NotFoundError):
                    return -1
                raise

        async def go() -> list[int]:
            api = await self._ready()
            return list(await asyncio.gather(*(one(api, mq) for mq in mqs)))

        return self.retrying(go)

    def store_offsets(self, offsets: dict[MessageQueue, int]) -> None:
        """Store the group's consume offset of each queue (shown by ``rocketq group describe``)."""

        async def go() -> None:
            api = await self._ready()
            await asyncio.gather(*(api.update_offset(mq, off) for mq, off in offsets.items()))

        self.retrying(go)

    # ---- pulls ------------------------------------------------------------------------------

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        expression: str,
        expression_type: str,
        timeout_ms: int,
    ) -> PullResult:
        """One Pull of ``mq`` from ``offset`` (no long polling), filtered on the broker, its
        records decoded into messages."""
        raw = self.start_pull(mq, offset, max_nums, expression, expression_type, timeout_ms)
        res = raw.result(pull_wait_s(timeout_ms))
        messages = decode_records(res.records, mq.broker_name) if res.records else []
        return PullResult(res.status, res.next_offset, messages, res.min_offset)

    def start_pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        expression: str,
        expression_type: str,
        timeout_ms: int,
    ) -> Future[RawPull]:
        """:meth:`pull` started on the loop at once, its records left undecoded: the reader
        turns one answer into Arrow columns while the next is on its way."""
        request = messaging_pb2.PullRequest(
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msg_nums=min(max_nums, PULL_BATCH_MAX),
            sys_flag=_SUBSCRIPTION_FLAG,
            subscription=expression,
            expression_type=_EXPRESSION[expression_type],
        )

        async def go() -> RawPull:
            api = await self._ready()
            tried: set[str] = set()
            while True:
                # The master first; one that cannot be reached is marked by api.pull and the
                # next pick is a slave of its group (reads go on while the master is down).
                addr, _ = await api.pull_addr(mq, 0)
                try:
                    resp = await api.pull(addr, request, timeout_ms)
                except RocketQError as exc:
                    if not is_unreachable(exc) or addr in tried:
                        raise
                    tried.add(addr)
                    await api.refresh_route(mq.topic)
                    continue
                return RawPull(
                    int(resp.status),
                    int(resp.next_begin_offset),
                    resp.records,
                    int(resp.min_offset),
                )

        return asyncio.run_coroutine_threadsafe(retrying_async(go), self._loop.loop)


def pull_wait_s(timeout_ms: int) -> float:
    """How long a pull with ``timeout_ms`` can take with every retry of :func:`retrying_async`."""
    return (timeout_ms / 1000 + RETRY_PAUSE_S) * CALL_ATTEMPTS + 30


async def _make_admin(nameserver: str) -> Admin:
    return Admin(nameserver, timeout_ms=REQUEST_TIMEOUT_MS)


def is_unreachable(exc: RocketQError) -> bool:
    """The broker could not be reached (another replica may answer); a refusal is an answer."""
    if isinstance(exc, RequestTimeoutError):
        return True
    return isinstance(exc, BrokerUnavailableError) and exc.reason != "NOT_MASTER"
