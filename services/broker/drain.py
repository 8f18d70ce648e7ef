"""Draining a broker before it leaves the cluster (Admin.DrainBroker; DESIGN.md §9).

A Kubernetes scale-down removes the highest-ordinal broker group. Its pod's preStop hook runs
``python -m services.broker.drain`` against the broker in the same pod, which:

1. turns write permission off *in memory* (brokerPermission 4, not persisted: a restarted
   broker writes again) and re-registers at once, so the nameservers hand producers a route
   without this group's write queues while consumers keep reading it;
2. waits, polling, until every consumer group with offsets here (and every live group
   subscribed to a topic here) has consumed every queue of this broker to its end, or until
   the timeout (the pod's termination grace bounds it);
3. unregisters from every nameserver and stops heartbeating, so routes drop the group at
   once; the process then exits on the SIGTERM that follows the hook.

Nothing acknowledged is lost either way: what is left unconsumed stays in the store on the
retained volume, and a scale back up serves it again.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from services.broker.admin_common import require_master
from services.broker.client_manager import ClientManager
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager, split_key
from services.broker.topic_config_manager import TopicConfigManager
from services.common.errors import ServiceError
from services.store.message_store import MessageStore

READ_ONLY_PERMISSION = 4
DRAIN_TIMEOUT_MAX_MS = 3_600_000
POLL_INTERVAL_S = 0.5
DEADLINE_MARGIN_S = 30.0
"""The client waits this much longer than the drain (unregistering, a loaded host)."""
PENDING_SHOWN_MAX = 100
"""DrainBrokerResponse.pending lists at most this many group/topic pairs (largest first)."""


class Drainer:
    """DrainBroker of one broker."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        clients: ClientManager,
        registrar_trigger: Callable[[], None],
        unregister: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.registrar_trigger = registrar_trigger
        self.unregister = unregister

    async def drain(self, request: admin_pb2.DrainBrokerRequest) -> admin_pb2.DrainBrokerResponse:
        if not 0 <= request.timeout_ms <= DRAIN_TIMEOUT_MAX_MS:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                common_pb2.ILLEGAL_ARGUMENT,
                f"timeout_ms {request.timeout_ms}: must be 0..{DRAIN_TIMEOUT_MAX_MS}",
            )
        require_master(self.config)
        # In place, not persisted: the configured permission is back after a restart.
        self.config.broker_permission &= READ_ONLY_PERMISSION
        self.registrar_trigger()
        started = time.monotonic()
        deadline = started + request.timeout_ms / 1000
        pending = self.pending()
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
            pending = self.pending()
        if request.unregister:
            await self.unregister()
        ranked = sorted(pending.items(), key=lambda kv: -kv[1])
        return admin_pb2.DrainBrokerResponse(
            drained=not pending,
            pending_messages=sum(pending.values()),
            pending=[
                admin_pb2.DrainPending(group=g, topic=t, messages=n)
                for (g, t), n in ranked[:PENDING_SHOWN_MAX]
            ],
            waited_ms=int((time.monotonic() - started) * 1000),
            unregistered=request.unregister,
        )

    def pending(self) -> dict[tuple[str, str], int]:
        """(group, topic) → messages stored here that the group has not consumed yet, for
        every group with offsets here and every live group subscribed to a topic here (a
        queue it never committed on counts from its first message); zero entries left out."""
        committed: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in self.offsets.snapshot().items():
            topic, group = split_key(key)
            committed[(group, topic)] = queues
        for group in self.clients.consumer_groups():
            for name in (t.topic_name for t in self.topics.all()):
                if self.clients.subscription(group, name) is not None:
                    committed.setdefault((group, name), {})
        out: dict[tuple[str, str], int] = {}
        for (group, topic), queues in committed.items():
            cfg = self.topics.get(topic)
            if cfg is None:
                continue
            left = 0
            for queue_id in range(cfg.read_queue_nums):
                end = int(self.store.max_offset(topic, queue_id))
                first = int(self.store.min_offset(topic, queue_id))
                left += max(0, end - max(queues.get(queue_id, first), first))
            if left:
                out[(group, topic)] = left
        return out


async def _drain_remote(addr: str, timeout_s: float) -> admin_pb2.DrainBrokerResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        request = admin_pb2.DrainBrokerRequest(timeout_ms=int(timeout_s * 1000), unregister=True)
        response: admin_pb2.DrainBrokerResponse = await stub.DrainBroker(
            request, timeout=timeout_s + DEADLINE_MARGIN_S
        )
        return response


def main(argv: list[str] | None = None) -> int:
    """``python -m services.broker.drain``: drain the broker at --addr (the preStop hook)."""
    parser = argparse.ArgumentParser(
        prog="python -m services.broker.drain",
        description="Drain a broker before it leaves: write off, wait for consumers, "
        "unregister (Admin.DrainBroker).",
    )
    parser.add_argument("--addr", default="127.0.0.1:10911", help="the broker's gRPC address")
    parser.add_argument(
        "--timeout-s", type=float, default=30.0, help="longest wait for the consumers (s)"
    )
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(_drain_remote(args.addr, args.timeout_s))
    except grpc.RpcError as exc:
        print(f"drain {args.addr}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    if result.drained:
        print(f"drained {args.addr} in {result.waited_ms} ms; unregistered")
        return 0
    left = ", ".join(f"{p.group}/{p.topic}: {p.messages}" for p in result.pending[:10])
    print(
        f"{args.addr}: {result.pending_messages} message(s) still unconsumed after "
        f"{result.waited_ms} ms ({left}); unregistered, the data stays on the volume",
        file=sys.stderr,
    )
    return 3


if __name__ == "__main__":
    sys.exit(main())
