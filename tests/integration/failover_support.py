"""Helpers of the failover system tests (issue 8): a broker group in controller mode, who leads
it, recorded traffic, and the checks made on that record.

* :class:`Group` / :func:`ha_group` - a nameserver, one etcd and replicas ``1..N`` of one
  broker group (``brokerId`` = replica id, ``etcdEndpoints`` set), each in its own directory
  ``<tmp>/<broker>-r<id>``; kill, pause, resume and restart by replica id.
* :func:`wait_master` - polls every live replica's GetRuntimeStats until exactly one says it is
  the master (brokerId 0, a master role) and, by default, every other one names it as leader.
* :class:`Traffic` (SDK producer) and :func:`raw_sender` (raw gRPC Send to one address) record
  every send as an :class:`Ack`: key, monotonic start and end, outcome, and for SEND_OK the
  replica that stored it (decoded from the offset message id, which carries the store host).
* :func:`assert_single_writer` - no replica acknowledged a write after a later leader had
  acknowledged one (the fencing property, checked on client-side times: an ack whose request
  was sent after another leader's ack came back is a certain overlap);
  :func:`wait_all_readable` - every SEND_OK key is readable from the given replica (no loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_status import rpc_status

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from rocketq.client.errors import RocketQError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, SendStatus
from tests.integration.replication_support import (
    HA_KEYS,
    create_topics,
    read_all,
    wait_in_sync,
    wait_route,
)
from tests.support.cluster import Group, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

# Re-exported (the failover tests and tools/bench import it from here).
__all__ = ["Group"]

TOPIC = "Failover"
QUEUES = 4
CHECK_GROUP = "failover-check"
LEASE_TTL_S = 2
ELECTION_BOUND_S = 10.0
"""A new master must be serving within this of the old one's death (issue 8: < 10 s)."""

GROUP_KEYS: dict[str, object] = {
    **HA_KEYS,
    "brokerRole": "SYNC_MASTER",
    "controllerLeaseTtlSec": LEASE_TTL_S,
    "haMaxTimeSlaveNotCatchup": 5000,
    "syncFlushTimeout": 3000,
}
"""Broker keys of every replica of a test group (``keys`` of :func:`ha_group` win)."""


# ---- the group -------------------------------------------------------------------------------


@contextlib.contextmanager
def ha_group(
    tmp_path: Path,
    replicas: int = 3,
    broker_name: str = "broker-a",
    keys: dict[str, object] | None = None,
) -> Iterator[Group]:
    """A nameserver, an etcd and replicas 1..``replicas`` started in id order (a fresh group
    elects the lowest live id, so replica 1 leads first), with :data:`GROUP_KEYS` and ``keys``
    (which win); everything stopped afterwards. A thin wrapper of
    :func:`tests.support.cluster.cluster`."""
    group_keys = {**GROUP_KEYS, **(keys or {})}
    with cluster(
        tmp_path,
        brokers=0,
        replicas=replicas,
        group_name=broker_name,
        group_keys=group_keys,
    ) as c:
        assert c.group is not None
        yield c.group


# ---- who leads -------------------------------------------------------------------------------


async def stats_of(addr: str, timeout_s: float = 2.0) -> admin_pb2.GetRuntimeStatsResponse | None:
    """The replica's GetRuntimeStats, or None when it does not answer in time."""
    try:
        async with RawClient(addr) as c:
            return await c.runtime_stats(timeout_s)
    except grpc.aio.AioRpcError:
        return None


def is_master(stats: admin_pb2.GetRuntimeStatsResponse) -> bool:
    return stats.broker_id == 0 and stats.role != admin_pb2.SLAVE


async def group_stats(
    group: Group, exclude: frozenset[int] = frozenset()
) -> dict[int, admin_pb2.GetRuntimeStatsResponse]:
    """Stats of every live replica not in ``exclude`` that answers."""
    rids = [rid for rid in group.live() if rid not in exclude]
    answers = await asyncio.gather(*(stats_of(group.addr(rid)) for rid in rids))
    return {rid: st for rid, st in zip(rids, answers, strict=True) if st is not None}


async def wait_master(
    group: Group,
    timeout_s: float = 20.0,
    exclude: frozenset[int] = frozenset(),
    converged: bool = True,
    not_rid: int | None = None,
) -> int:
    """The replica id of the group's master once exactly one answering replica (outside
    ``exclude``) says it is master, other than ``not_rid``; with ``converged`` also every
    other answering replica names it as leader and is a slave."""
    last: dict[int, admin_pb2.GetRuntimeStatsResponse] = {}

    async def single_master() -> int | None:
        nonlocal last
        last = await group_stats(group, exclude)
        masters = [rid for rid, st in last.items() if is_master(st)]
        if len(masters) != 1 or masters[0] == not_rid:
            return None
        rid = masters[0]
        others = [st for r, st in last.items() if r != rid]
        if converged and not all(
            st.leader_addr == group.addr(rid) and st.role == admin_pb2.SLAVE for st in others
        ):
            return None
        return rid

    try:
        found = await until(single_master, "a single master", timeout_s, 0.1)
    except AssertionError:
        summary = {
            rid: (st.broker_id, admin_pb2.BrokerRole.Name(st.role), st.epoch, st.leader_addr)
            for rid, st in last.items()
        }
        raise AssertionError(
            f"no single master within {timeout_s}s (not {not_rid}); replicas say {summary}\n"
            f"{group.logs()}"
        ) from None
    assert found is not None
    return found


async def route_master(namesrv: str, topic: str, broker_name: str) -> str:
    """The address the nameserver gives for ``broker_name``'s brokerId 0 ("" if none)."""
    async with RawClient(namesrv) as c:
        try:
            resp = await c.route(topic, timeout_s=3)
        except grpc.aio.AioRpcError:
            return ""
    for bd in resp.route.brokers:
        if bd.broker_name == broker_name:
            return str(bd.broker_addrs.get(0, ""))
    return ""


async def wait_synced(group: Group, topic: str = TOPIC, timeout_s: float = 20) -> None:
    """Until every live replica knows ``topic`` (slaves get it through config sync)."""
    deadline = time.monotonic() + timeout_s
    for rid in group.live():
        async with RawClient(group.addr(rid)) as c:

            async def knows_topic() -> bool:
                try:
                    await c.messaging.GetMaxOffset(
                        messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=0), timeout=3
                    )
                except grpc.aio.AioRpcError:
                    return False
                return True

            left_s = max(0.0, deadline - time.monotonic())
            await until(knows_topic, f"replica {rid} to get {topic}", left_s, 0.2)


# ---- recorded traffic ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    """One send and its outcome, times from :func:`time.monotonic` in the test process."""

    key: str
    t_start: float
    t_end: float
    outcome: str
    """SEND_OK, another SendStatus name, or an error ("UNAVAILABLE/NOT_MASTER", ...)."""
    store_addr: str = ""
    """For a stored message: the replica that stored it (host:port)."""
    physical_offset: int = -1
    detail: str = ""
    """For a failure: the start of the error's message."""

    @property
    def ok(self) -> bool:
        return self.outcome == "SEND_OK"


def store_of(offset_msg_id: str) -> tuple[str, int]:
    host, offset = codec.decode_offset_msg_id(offset_msg_id)
    return f"{ipaddress.ip_address(host.ip)}:{host.port}", offset


def error_outcome(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        reason = ""
        status = rpc_status.from_call(err)
        if status is not None and status.details:
            detail = common_pb2.ErrorDetail()
            status.details[0].Unpack(detail)
            reason = common_pb2.ErrorReason.Name(detail.reason)
        return f"{err.code().name}/{reason}"
    if isinstance(err, RocketQError):
        return f"{type(err).__name__}/{getattr(err, 'reason', '')}"
    return type(err).__name__


class Traffic:
    """SDK sends of keys ``<tag>-<n>`` by ``senders`` concurrent loops until :meth:`stop`,
    each send recorded as an :class:`Ack`; a failed send is recorded and the loop goes on."""

    def __init__(
        self, namesrv_addrs: list[str], tag: str, senders: int = 3, pause_s: float = 0.01
    ) -> None:
        self.producer = Producer(
            ProducerConfig(group=f"failover-{tag}", namesrv_addrs=namesrv_addrs)
        )
        self.tag = tag
        self.senders = senders
        self.pause_s = pause_s
        self.acks: list[Ack] = []
        self._n = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.producer.start()
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.senders)]

    async def _loop(self) -> None:
        while not self._stop.is_set():
            key = f"{self.tag}-{self._n}"
            self._n += 1
            t0 = time.monotonic()
            try:
                res = await self.producer.send(Message(TOPIC, key.encode()))
            except Exception as exc:  # every failure is recorded, none is fatal
                outcome = error_outcome(exc)
                self.acks.append(Ack(key, t0, time.monotonic(), outcome, detail=str(exc)[:200]))
                await asyncio.sleep(0.05)
                continue
            addr, offset = store_of(res.offset_msg_id)
            outcome = "SEND_OK" if res.status == SendStatus.SEND_OK else res.status.name
            self.acks.append(Ack(key, t0, time.monotonic(), outcome, addr, offset))
            await asyncio.sleep(self.pause_s)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.producer.close()

    def ok(self) -> list[Ack]:
        return [a for a in self.acks if a.ok]

    def ok_after(self, t: float, store_addr: str | None = None) -> list[Ack]:
        return [
            a
            for a in self.ok()
            if a.t_start >= t and (store_addr is None or a.store_addr == store_addr)
        ]

    async def wait_ok_after(
        self, t: float, count: int, store_addr: str | None = None, timeout_s: float = 20
    ) -> None:
        try:
            await until(lambda: len(self.ok_after(t, store_addr)) >= count, "SEND_OK", timeout_s)
        except AssertionError:
            outcomes: dict[str, int] = {}
            details: dict[str, str] = {}
            for a in self.acks:
                if a.t_start >= t:
                    outcomes[a.outcome] = outcomes.get(a.outcome, 0) + 1
                    details.setdefault(a.outcome, a.detail or a.store_addr)
            raise AssertionError(
                f"fewer than {count} SEND_OK on {store_addr or 'any replica'} within "
                f"{timeout_s}s; outcomes since then: {outcomes}; first of each: {details}"
            ) from None


async def raw_sender(
    addr: str,
    tag: str,
    stop: asyncio.Event,
    out: list[Ack],
    in_flight: int = 2,
    timeout_s: float = 30.0,
    body_bytes: int = 100,
    batch: int = 1,
) -> None:
    """Raw gRPC sends of ``batch`` messages each to ``addr`` (queues round-robin),
    ``in_flight`` at a time, until ``stop``; every message's outcome appended to ``out``.
    Requests wait up to ``timeout_s``, so ones sent to a paused broker are answered (or
    refused) once it wakes."""
    counter = iter(range(1 << 40))
    async with RawClient(addr) as c:
        stub = c.messaging

        async def loop() -> None:
            while not stop.is_set():
                if not await send_raw(
                    stub, f"{tag}-{next(counter)}", out, timeout_s, body_bytes, batch
                ):
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(loop() for _ in range(in_flight)))


async def send_raw(
    stub: messaging_pb2_grpc.MessagingStub,
    key: str,
    out: list[Ack],
    timeout_s: float = 30.0,
    body_bytes: int = 100,
    batch: int = 1,
) -> bool:
    """One raw Send of ``batch`` messages keyed ``key`` (``key/i`` in a batch), recorded in
    ``out``; True when the call got an answer (whatever its status)."""
    keys = [key] if batch == 1 else [f"{key}/{i}" for i in range(batch)]
    queue_id = sum(key.encode()) % QUEUES
    t0 = time.monotonic()
    try:
        resp = await stub.Send(
            messaging_pb2.SendRequest(
                producer_group="failover-raw",
                queue_id=queue_id,
                messages=[
                    common_pb2.Message(topic=TOPIC, body=k.encode().ljust(body_bytes, b"."))
                    for k in keys
                ],
                born_timestamp_ms=int(time.time() * 1000),
            ),
            timeout=timeout_s,
        )
    except grpc.aio.AioRpcError as err:
        t1 = time.monotonic()
        out.extend(Ack(k, t0, t1, error_outcome(err)) for k in keys)
        return False
    t1 = time.monotonic()
    for k, r in zip(keys, resp.results, strict=True):
        store, offset = store_of(r.offset_msg_id)
        out.append(Ack(k, t0, t1, messaging_pb2.SendStatus.Name(r.status), store, offset))
    return True


# ---- checks ----------------------------------------------------------------------------------


def assert_single_writer(acks: list[Ack], leaders: list[str]) -> None:
    """``leaders`` (store addresses in the order they led) never overlapped: no SEND_OK of an
    earlier leader was requested after a SEND_OK of a later leader had come back. Also every
    SEND_OK came from one of ``leaders``."""
    ok = [a for a in acks if a.ok]
    strangers = {a.store_addr for a in ok} - set(leaders)
    assert not strangers, f"SEND_OK from replicas that never led: {strangers}"
    for i, older in enumerate(leaders):
        older_starts = [a.t_start for a in ok if a.store_addr == older]
        if not older_starts:
            continue
        for newer in leaders[i + 1 :]:
            newer_ends = [a.t_end for a in ok if a.store_addr == newer]
            if newer_ends and max(older_starts) > min(newer_ends):
                late = [a for a in ok if a.store_addr == older and a.t_start > min(newer_ends)]
                raise AssertionError(
                    f"{older} acknowledged {len(late)} write(s) requested after {newer} had "
                    f"acknowledged one (two masters at once); first: {late[0]}"
                )


async def readable_keys(addr: str, topic: str = TOPIC, queues: int = QUEUES) -> set[str]:
    """Every key stored in the topic's queues, as a consumer of ``addr`` reads them (bodies
    up to the first ``.`` padding byte)."""
    reads = await read_all(addr, CHECK_GROUP, [topic], queues)
    keys: set[str] = set()
    for raw in reads.values():
        for rec in codec.iter_records(raw):
            keys.add(rec.body.split(b".", 1)[0].decode())
    return keys


async def wait_all_readable(
    addr: str, keys: set[str], timeout_s: float = 20, what: str = "SEND_OK messages"
) -> set[str]:
    """Until every key of ``keys`` is readable from ``addr``; returns everything readable.
    Fails with how many (and which, a sample) are missing: acknowledged messages lost."""
    have: set[str] = set()

    async def all_readable() -> bool:
        nonlocal have
        have = await readable_keys(addr)
        return keys <= have

    try:
        await until(all_readable, f"every one of {what}", timeout_s, 0.3)
    except AssertionError:
        missing = keys - have
        raise AssertionError(
            f"{len(missing)} of {len(keys)} {what} not readable from {addr} after "
            f"{timeout_s}s (lost?): {sorted(missing)[:10]}"
        ) from None
    return have


def gaps(acks: list[Ack], since: float = 0.0) -> float:
    """The longest time between two consecutive SEND_OK replies after ``since`` (s)."""
    ends = sorted(a.t_end for a in acks if a.ok and a.t_end >= since)
    return max((b - a for a, b in itertools.pairwise(ends)), default=0.0)


async def prepare(group: Group) -> int:
    """Wait for the first master, create :data:`TOPIC` there, wait until the route has it,
    every replica knows it and every slave is in sync. Returns the master's replica id."""
    rid = await wait_master(group)
    await create_topics(group.addr(rid), group.broker_name, [TOPIC], QUEUES)
    await wait_route(group.nameserver.addr, TOPIC, {group.broker_name})
    await wait_synced(group)
    await wait_in_sync(group.addr(rid), slaves=len(group.live()) - 1)
    return rid
