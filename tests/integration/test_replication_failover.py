"""The master of a replicated broker group SIGKILLed (issue 7), with real processes.

* Consumers keep going: a running PushConsumer with a backlog on broker-a, and a LitePullConsumer
  started only after the kill, both read every replicated message of broker-a from its slave;
  the producer's sends all land on the other broker group (broker-b) with SEND_OK. The push
  consumer's offsets, committed to the slave while the master is down, survive the master's
  return: after it restarts, the master holds them (the slave sends them with SyncConfig), and a
  new member of the group gets only messages sent after that - bound asserted: zero
  redeliveries, because the first consumer closed cleanly (its close persists every offset;
  the at-least-once window only opens when a consumer dies between consuming and persisting).
* SYNC_MASTER never acknowledges a message the slave lacks: senders run until the master is
  SIGKILLed right after an acknowledgement; every SEND_OK message is in the slave's commitlog
  (read off its files after a clean stop) and readable by consumers of the slave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2, messaging_pb2, messaging_pb2_grpc
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    LitePullConsumer,
    LitePullConsumerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, ReceivedMessage, SendStatus
from tests.integration.cluster import restart, start_nameserver
from tests.integration.replication_support import (
    Sent,
    bodies_of,
    create_group,
    create_topics,
    read_all,
    runtime_stats,
    send_batch,
    start_ha_slave,
    start_master,
    stored_uniq_keys,
    wait_in_sync,
    wait_readable,
    wait_replicated,
    wait_route,
)
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "HaFailover"
QUEUES = 4
GROUP = "ha-failover"
LITE_GROUP = "ha-failover-lite"


class Recorder:
    """Every body a consumer was handed, in order (duplicates kept)."""

    def __init__(self) -> None:
        self.bodies: list[str] = []

    def listener(
        self,
    ) -> Callable[[list[ReceivedMessage], ConsumeContext], Awaitable[ConsumeResult]]:
        async def on_messages(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            self.bodies.extend(m.body.decode() for m in msgs)
            return ConsumeResult.CONSUME_SUCCESS

        return on_messages

    def has(self, bodies: set[str]) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return bodies <= set(self.bodies)

        return check


def push_consumer(namesrv: str, recorder: Recorder) -> PushConsumer:
    cfg = PushConsumerConfig(
        GROUP,
        (namesrv,),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        persist_consumer_offset_interval_ms=1000,
        rebalance_interval_ms=2000,
        # Small pulls: a pull held when the consumer is suspended takes only a few of the
        # backlog's messages before the kill; the rest must come from the slave.
        pull_batch_size=4,
    )
    consumer = PushConsumer(cfg, recorder.listener())
    consumer.subscribe(TOPIC, "*")
    return consumer


async def send_phase(p: Producer, tag: str, n: int) -> dict[str, str]:
    """Send ``n`` messages one by one; body -> broker name, every one SEND_OK."""
    where: dict[str, str] = {}
    for i in range(n):
        body = f"{tag}-{i}"
        res = await p.send(Message(TOPIC, body.encode()))
        assert res.status == SendStatus.SEND_OK, (body, res)
        where[body] = res.message_queue.broker_name
    return where


async def committed(addr: str, group: str) -> dict[int, int]:
    out: dict[int, int] = {}
    async with RawClient(addr) as raw:
        stub = raw.messaging
        for q in range(QUEUES):
            try:
                resp = await stub.QueryConsumerOffset(
                    messaging_pb2.QueryConsumerOffsetRequest(
                        consumer_group=group, topic=TOPIC, queue_id=q
                    ),
                    timeout=5,
                )
                out[q] = resp.offset
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
                out[q] = -1
    return out


async def test_master_killed_consumers_read_slave_producers_move_offsets_kept(
    tmp_path: Path,
) -> None:
    ns = start_nameserver(tmp_path)
    master_a = start_master(tmp_path, [ns.addr], "broker-a")
    slave_a = start_ha_slave(tmp_path, [ns.addr], "broker-a")
    master_b = start_master(tmp_path, [ns.addr], "broker-b")
    procs = [ns, master_a, slave_a, master_b]

    try:
        for m, name in ((master_a, "broker-a"), (master_b, "broker-b")):
            await create_topics(m.addr, name, [TOPIC], QUEUES)
            await create_group(m.addr, name, GROUP)
            await create_group(m.addr, name, LITE_GROUP)
        await wait_route(ns.addr, TOPIC, {"broker-a", "broker-b"})
        await wait_in_sync(master_a.addr)
        rec = Recorder()
        consumer = push_consumer(ns.addr, rec)
        await consumer.start()
        producer = Producer(ProducerConfig(group="ha-failover-p", namesrv_addrs=[ns.addr]))
        await producer.start()
        try:
            warm = await send_phase(producer, "warm", 40)
            await until(rec.has(set(warm)), "the warm-up messages consumed", timeout_s=30)
            consumer.suspend()
            backlog = await send_phase(producer, "backlog", 200)
            on_a = {b for b, broker in backlog.items() if broker == "broker-a"}
            assert len(on_a) >= 50, "round robin should put half the backlog on broker-a"
            await wait_replicated(master_a.addr, slave_a.addr, [TOPIC], QUEUES)
            await wait_readable(master_a.addr, slave_a.addr, GROUP, [TOPIC], QUEUES)

            master_a.kill()
            before_kill = set(rec.bodies)
            consumer.resume()
            moved = await send_phase(producer, "moved", 60)
            assert set(moved.values()) == {"broker-b"}, "sends kept going to the dead master"
            everything = set(warm) | set(backlog) | set(moved)
            await until(
                rec.has(everything), "the push consumer reading broker-a's slave", timeout_s=45
            )
            from_slave = on_a - before_kill
            assert len(from_slave) >= len(on_a) // 2, (
                f"only {len(from_slave)} of broker-a's {len(on_a)} backlog messages were read "
                "after its master died: the test did not exercise reading from the slave"
            )

            lite = LitePullConsumer(
                LitePullConsumerConfig(
                    LITE_GROUP,
                    (ns.addr,),
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                )
            )
            lite.subscribe(TOPIC, "*")
            await lite.start()
            try:
                seen: set[str] = set()

                async def polled_everything() -> bool:
                    seen.update(m.body.decode() for m in await lite.poll(1000))
                    return everything <= seen

                await until(
                    polled_everything, "the lite pull consumer to read every message", 45, 0
                )
            finally:
                await lite.close()
        finally:
            await consumer.close()  # persists its offsets: broker-a's go to the slave
            await producer.close()

        # The slave took the commits for broker-a's queues while its master was down.
        on_slave = await committed(slave_a.addr, GROUP)
        slave_reads = await read_all(slave_a.addr, GROUP, [TOPIC], QUEUES)
        ends = {q: len(bodies_of(slave_reads[(TOPIC, q)])) for q in range(QUEUES)}
        assert on_slave == ends, f"slave-side commits {on_slave}, queue ends {ends}"

        # The master returns: the slave hands it those offsets; a new member resumes there.
        procs.append(master_a_again := restart(master_a))
        await until(
            lambda: _equals(committed(master_a_again.addr, GROUP), ends),
            "the returned master holding the offsets committed on its slave",
            timeout_s=20,
        )
        rec2 = Recorder()
        consumer2 = push_consumer(ns.addr, rec2)
        await consumer2.start()
        try:
            await wait_route(ns.addr, TOPIC, {"broker-a", "broker-b"})
            async with Producer(
                ProducerConfig(group="ha-failover-p2", namesrv_addrs=[ns.addr])
            ) as p2:
                after = await send_phase(p2, "after", 40)
            assert set(after.values()) == {"broker-a", "broker-b"}
            await until(rec2.has(set(after)), "the new member consuming new messages", timeout_s=30)
            await asyncio.sleep(1.0)  # time for any wrongful redelivery to show up
        finally:
            await consumer2.close()
        again = [b for b in rec2.bodies if b not in after]
        assert not again, f"{len(again)} old messages redelivered, e.g. {again[:5]}"
    finally:
        for sp in reversed(procs):
            sp.kill()


async def _equals(got: Awaitable[dict[int, int]], want: dict[int, int]) -> bool:
    return await got == want


async def test_sync_master_never_acks_what_the_slave_lacks(tmp_path: Path) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(tmp_path, [ns.addr], brokerRole="SYNC_MASTER")
    slave = start_ha_slave(tmp_path, [ns.addr])
    acked: list[Sent] = []
    kill_after = 300

    async def sender(stub: messaging_pb2_grpc.MessagingStub, qid: int) -> None:
        n = 0
        while master.alive():
            size = 1 + n % 4  # single sends and small batches
            bodies = [f"sync-{qid}-{n + i}".encode() for i in range(size)]
            n += size
            try:
                results = await send_batch(stub, TOPIC, qid, bodies)
            except grpc.aio.AioRpcError:
                return  # the master is gone; this call's fate is unknown, as for any client
            acked.extend(r for r in results if r.status == messaging_pb2.SEND_OK)
            if len(acked) >= kill_after and master.alive():
                master.kill()  # right after an acknowledgement, other sends in flight

    try:
        await create_topics(master.addr, "broker-a", [TOPIC], QUEUES)
        await create_group(master.addr, "broker-a", GROUP)
        await wait_in_sync(master.addr)
        async with RawClient(master.addr) as raw:
            stub = raw.messaging
            await asyncio.gather(*(sender(stub, q) for q in range(QUEUES)))
        assert not master.alive() and len(acked) >= kill_after
        assert (await runtime_stats(slave.addr)).role == admin_pb2.SLAVE
        reads = await read_all(slave.addr, GROUP, [TOPIC], QUEUES)
        readable = {b for r in reads.values() for b in bodies_of(r)}
        assert slave.stop() == 0
        on_disk = stored_uniq_keys(slave.workdir / "store")
        lacking = [s.body for s in acked if s.msg_id not in on_disk]
        assert not lacking, (
            f"{len(lacking)} of {len(acked)} SEND_OK messages not in the slave's commitlog, "
            f"e.g. {lacking[:5]}"
        )
        # Consumers of the slave see them too: the slave's readable end (its confirm offset)
        # covers every acknowledged message.
        hidden = [s.body for s in acked if s.body not in readable]
        assert not hidden, (
            f"{len(hidden)} of {len(acked)} SEND_OK messages stored on the slave but not "
            f"readable there (confirm offset behind), e.g. {hidden[:5]}"
        )
    finally:
        for sp in (slave, master, ns):
            sp.kill()
