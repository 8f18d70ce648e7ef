"""A broker group in controller mode for the failover benchmark: a nameserver, an etcd and
replicas ``1..N`` of one broker (started through services.common.supervisor), who leads it,
and SDK traffic recorded with the replica that stored each message.

The integration tests have their own, richer version (tests/integration/failover_support.py);
tools do not import tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    nameserver_pb2,
    nameserver_pb2_grpc,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, SendStatus
from services.common import etcd, launch, supervisor
from services.common.supervisor import Process, StopTimeout

TOPIC = "Failover"
QUEUES = 4
POLL_S = 0.1
FAILED_SEND_PAUSE_S = 0.05
GROUP_KEYS: dict[str, object] = {
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,
    "slaveSyncConfigInterval": 1000,
    "haSendHeartbeatInterval": 1000,
    "brokerRole": "SYNC_MASTER",
    "controllerLeaseTtlSec": 2,
    "haMaxTimeSlaveNotCatchup": 5000,
    "syncFlushTimeout": 3000,
}


@dataclass
class Group:
    """Replicas of one broker group in controller mode, by replica id."""

    root: Path
    nameserver: Process
    etcd: Process
    broker_name: str
    keys: dict[str, object]
    replicas: dict[int, Process] = field(default_factory=dict)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [self.nameserver.addr]

    def start_replica(self, rid: int) -> Process:
        keys = {**self.keys, "brokerId": rid, "etcdEndpoints": self.etcd.addr}
        label = f"{self.broker_name}-r{rid}"
        sp = launch.start_broker(
            self.root, self.namesrv_addrs, self.broker_name, keys, workdir_name=label
        )
        self.replicas[rid] = sp
        return sp

    def addr(self, rid: int) -> str:
        return self.replicas[rid].addr

    def live(self) -> dict[int, Process]:
        return {rid: sp for rid, sp in self.replicas.items() if sp.alive()}

    def restart(self, rid: int) -> Process:
        self.replicas[rid] = supervisor.restart(self.replicas[rid])
        return self.replicas[rid]

    def stop_all(self) -> None:
        for sp in [*self.replicas.values(), self.etcd, self.nameserver]:
            if sp.alive():
                with contextlib.suppress(StopTimeout):
                    sp.stop(timeout_s=15)


@contextlib.contextmanager
def ha_group(
    root: Path,
    replicas: int = 3,
    broker_name: str = "broker-a",
    keys: dict[str, object] | None = None,
) -> Iterator[Group]:
    """Nameserver, etcd, replicas 1..``replicas`` (:data:`GROUP_KEYS`, then ``keys``);
    everything stopped afterwards."""
    ns = launch.start_nameserver(root)
    member = etcd.start_etcd(root / "etcd")
    group = Group(root, ns, member, broker_name, {**GROUP_KEYS, **(keys or {})})
    try:
        for rid in range(1, replicas + 1):
            group.start_replica(rid)
        yield group
    finally:
        group.stop_all()


async def until(pred: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def stats_of(addr: str, timeout_s: float = 2.0) -> admin_pb2.GetRuntimeStatsResponse | None:
    """The replica's GetRuntimeStats, or None when it does not answer in time."""
    try:
        async with grpc.aio.insecure_channel(addr) as ch:
            resp: admin_pb2.GetRuntimeStatsResponse = await admin_pb2_grpc.AdminStub(
                ch
            ).GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest(), timeout=timeout_s)
            return resp
    except grpc.aio.AioRpcError:
        return None


def _is_master(stats: admin_pb2.GetRuntimeStatsResponse) -> bool:
    return stats.broker_id == 0 and stats.role != admin_pb2.SLAVE


async def wait_master(
    group: Group, timeout_s: float = 20.0, not_rid: int | None = None, converged: bool = True
) -> int:
    """The replica id of the master once exactly one live replica says it is (other than
    ``not_rid``); with ``converged`` also every other one follows it as a slave."""
    found: list[int] = []

    async def one_master() -> bool:
        rids = list(group.live())
        answers = await asyncio.gather(*(stats_of(group.addr(r)) for r in rids))
        stats = {r: st for r, st in zip(rids, answers, strict=True) if st is not None}
        masters = [r for r, st in stats.items() if _is_master(st)]
        if len(masters) != 1 or masters[0] == not_rid:
            return False
        leader = group.addr(masters[0])
        others = [st for r, st in stats.items() if r != masters[0]]
        if converged and not all(
            st.leader_addr == leader and st.role == admin_pb2.SLAVE for st in others
        ):
            return False
        found[:] = masters
        return True

    await until(one_master, timeout_s, f"a single master (not {not_rid})")
    return found[0]


async def wait_in_sync(master_addr: str, slaves: int, timeout_s: float = 20) -> None:
    """Until the master reports ``slaves`` slaves, all in its in-sync set."""

    async def ok() -> bool:
        stats = await stats_of(master_addr, 5)
        return (
            stats is not None
            and len(stats.slaves) >= slaves
            and all(s.in_sync for s in stats.slaves)
        )

    await until(ok, timeout_s, f"{slaves} in-sync slave(s) on {master_addr}")


async def _routed(namesrv: str, topic: str, broker_name: str) -> bool:
    async with grpc.aio.insecure_channel(namesrv) as ch:
        try:
            resp = await nameserver_pb2_grpc.NameServerStub(ch).GetRouteInfoByTopic(
                nameserver_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5
            )
        except grpc.aio.AioRpcError:
            return False
    return broker_name in {q.broker_name for q in resp.route.queues}


async def prepare(group: Group) -> int:
    """Wait for the first master, create :data:`TOPIC` there, wait until the route has it and
    every slave is in sync. Returns the master's replica id."""
    rid = await wait_master(group)
    config = common_pb2.TopicConfig(
        topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6
    )
    target = admin_pb2.ApplyTarget(broker_name=group.broker_name)
    async with grpc.aio.insecure_channel(group.addr(rid)) as ch:
        await admin_pb2_grpc.AdminStub(ch).CreateTopic(
            admin_pb2.CreateTopicRequest(target=target, config=config), timeout=10
        )
    ns = group.nameserver.addr
    await until(lambda: _routed(ns, TOPIC, group.broker_name), 15, f"route of {TOPIC}")
    await wait_in_sync(group.addr(rid), slaves=len(group.live()) - 1)
    return rid


@dataclass(frozen=True)
class Ack:
    """One SEND_OK: monotonic start and end, and the replica that stored it (host:port)."""

    t_start: float
    t_end: float
    store_addr: str


def _store_of(offset_msg_id: str) -> str:
    host, _offset = codec.decode_offset_msg_id(offset_msg_id)
    return f"{ipaddress.ip_address(host.ip)}:{host.port}"


class Traffic:
    """SDK sends by ``senders`` concurrent loops until :meth:`stop`; every SEND_OK recorded.
    A failed send is not fatal: the loop pauses a moment and goes on."""

    def __init__(
        self, namesrv_addrs: list[str], tag: str, senders: int = 3, pause_s: float = 0.01
    ) -> None:
        config = ProducerConfig(group=f"failover-{tag}", namesrv_addrs=namesrv_addrs)
        self.producer = Producer(config)
        self.tag, self.senders, self.pause_s = tag, senders, pause_s
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
            except Exception:  # an outage is what is measured: keep sending
                await asyncio.sleep(FAILED_SEND_PAUSE_S)
                continue
            if res.status == SendStatus.SEND_OK:
                self.acks.append(Ack(t0, time.monotonic(), _store_of(res.offset_msg_id)))
            await asyncio.sleep(self.pause_s)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.producer.close()

    def ok(self) -> list[Ack]:
        return list(self.acks)

    def ok_after(self, t: float, store_addr: str | None = None) -> list[Ack]:
        return [
            a
            for a in self.acks
            if a.t_start >= t and (store_addr is None or a.store_addr == store_addr)
        ]
