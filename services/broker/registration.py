"""The broker's side of SPEC §2.3: register with every nameserver, then heartbeat every 30 s.

A broker lists every nameserver itself (nameservers never talk to each other), so it registers
with each one separately and concurrently: one slow or dead nameserver must not delay the
others, nor the broker. The registration *is* the heartbeat and carries the full topic list, so
it is rebuilt by ``build_request`` each round and nothing is diffed here.

``trigger()`` asks for a round as soon as possible (a topic was created or deleted); triggers
arriving while a round is in flight coalesce into one more round, so a burst of topic changes
costs at most two registrations. The background loop never raises: a nameserver that is down,
refuses the broker or times out is logged, once when it starts failing and once when it
recovers, and retried on the next round. ``stop()`` unregisters from every nameserver so routes
drop the broker at once instead of after the 120 s expiry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc
from rocketq.aio import wait_event
from rocketq.client.security import security_channel
from services.common.grpc_server import PEER_CHANNEL_OPTIONS

log = logging.getLogger(__name__)


CANCEL_RETRY_S = 0.05


class BrokerRegistrar:
    """Keeps this broker registered with every nameserver in ``namesrv_addrs``."""

    def __init__(
        self,
        namesrv_addrs: list[str],
        build_request: Callable[[], nameserver_pb2.RegisterBrokerRequest],
        period_ms: int = 30_000,
        timeout_ms: int = 3_000,
    ) -> None:
        self.namesrv_addrs = list(dict.fromkeys(namesrv_addrs))  # a duplicate would register twice
        self._build_request = build_request
        self._period_s = period_ms / 1000
        self._timeout_s = timeout_ms / 1000
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()
        self._stopped = False
        self.last_master_addr = ""
        """For a slave: the master's gRPC address the nameservers last reported ("" if none)."""
        self.last_ha_server_addr = ""
        """For a slave: the master's replication address the nameservers last reported."""
        self.rounds = 0
        """Registration rounds completed (whatever their outcome); handy for tests and stats."""

    async def start(self) -> None:
        """Register with every nameserver now, then every period in a background task."""
        for addr in self.namesrv_addrs:
            self._channels[addr] = security_channel(addr, PEER_CHANNEL_OPTIONS)
        await self._register_all()
        self._task = asyncio.create_task(self._run(), name="nameserver-registration")

    def trigger(self) -> None:
        """Register again soon (coalesced with other triggers), e.g. after a topic change."""
        self._wake.set()

    async def reregister(self, old: nameserver_pb2.UnregisterBrokerRequest) -> None:
        """The broker's id changed (controller mode: promoted to 0 or demoted to its replica
        id): unregister the old identity from every nameserver, then register the new one at
        once (a nameserver keeps one id per address, and routes must not list both)."""
        if self._stopped or not self._channels:
            return
        await asyncio.gather(*(self._unregister_one(a, old) for a in self._channels))
        await self._register_all()
        self.trigger()  # once more soon: a periodic round in flight may have sent the old id

    async def leave(self, unregister: nameserver_pb2.UnregisterBrokerRequest) -> None:
        """Stop heartbeating and unregister from every nameserver, keeping the channels until
        ``stop()`` (a drained broker leaving the cluster, services/broker/drain.py; closing a
        channel from inside an RPC handler could wait on that very call)."""
        await self._cancel_task()
        await asyncio.gather(*(self._unregister_one(a, unregister) for a in self._channels))

    async def stop(self, unregister: nameserver_pb2.UnregisterBrokerRequest | None) -> None:
        """Stop heartbeating, unregister from every nameserver (if given), close channels."""
        if self._stopped:
            return
        self._stopped = True
        await self._cancel_task()
        if unregister is not None:
            await asyncio.gather(*(self._unregister_one(a, unregister) for a in self._channels))
        await asyncio.gather(*(ch.close() for ch in self._channels.values()))
        self._channels.clear()

    # -- internals -------------------------------------------------------------------------------
    async def _cancel_task(self) -> None:
        """Cancel the heartbeat loop until it has ended. Its own wait keeps a cancellation
        (:func:`rocketq.aio.wait_event`), but a round's awaits may lose one on Python 3.11 (a
        ``wait_for`` in grpc or below), and the loop must not run a period more."""
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_RETRY_S)

    async def _run(self) -> None:
        while True:
            await wait_event(self._wake, self._period_s)  # or the period elapsed: a heartbeat
            self._wake.clear()
            try:
                await self._register_all()
            except Exception:  # never let one bad round end the heartbeat for good
                log.exception("nameserver registration round failed")

    async def _register_all(self) -> None:
        try:
            request = self._build_request()
        except Exception:
            log.exception("cannot build the nameserver registration; retrying next round")
            return
        responses = await asyncio.gather(
            *(self._register_one(addr, request) for addr in self._channels)
        )
        answered = [r for r in responses if r is not None]
        if answered:
            # Nameservers may briefly disagree (one has not seen the master yet); prefer one
            # that knows the master.
            best = next((r for r in answered if r.master_addr), answered[0])
            if best.master_addr != self.last_master_addr:
                log.info("master address now %r", best.master_addr)
            self.last_master_addr = best.master_addr
            self.last_ha_server_addr = best.ha_server_addr
        self.rounds += 1

    async def _register_one(
        self, addr: str, request: nameserver_pb2.RegisterBrokerRequest
    ) -> nameserver_pb2.RegisterBrokerResponse | None:
        stub = nameserver_pb2_grpc.NameServerStub(self._channels[addr])
        try:
            response: nameserver_pb2.RegisterBrokerResponse = await stub.RegisterBroker(
                request, timeout=self._timeout_s
            )
        except Exception as exc:
            if addr not in self._failing:
                self._failing.add(addr)
                log.warning("cannot register with nameserver %s: %s", addr, _describe(exc))
            else:
                log.debug("still cannot register with nameserver %s: %s", addr, _describe(exc))
            return None
        if addr in self._failing:
            self._failing.discard(addr)
            log.info("registered with nameserver %s again", addr)
        else:
            log.debug("registered with nameserver %s", addr)
        return response

    async def _unregister_one(
        self, addr: str, request: nameserver_pb2.UnregisterBrokerRequest
    ) -> None:
        stub = nameserver_pb2_grpc.NameServerStub(self._channels[addr])
        try:
            await stub.UnregisterBroker(request, timeout=self._timeout_s)
        except Exception as exc:  # shutdown goes on; the nameserver expires us in 120 s anyway
            log.warning("cannot unregister from nameserver %s: %s", addr, _describe(exc))
        else:
            log.info("unregistered from nameserver %s", addr)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
