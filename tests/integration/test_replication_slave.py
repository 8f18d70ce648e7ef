"""A real slave process against a hand-rolled master (services/broker/ha_slave.py,
ha_config_sync.py).

The "master" is a Replication servicer in the test process on raw stubs: it answers the
hello with a TruncateTo the test chooses, sends commitlog bytes read from a store the test
writes in-process (the same bytes a real master would send), confirms offsets when told, drops
streams, and answers SyncConfig with tables the test sets. The slave is the real broker
started with ``haMasterAddress`` pointing at it, registered with a real nameserver. The real
master+slave system tests are test_replication_*.py (H7e).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    nameserver_pb2,
    replication_pb2,
    replication_pb2_grpc,
)
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.common.clock import ManualClock
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.message_store import MessageStore
from tests.integration.cluster import ServiceProcess, start_nameserver, start_slave
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "Orders"
GROUP = "cg"
WAIT_S = 15.0
SLAVE_KEYS: dict[str, object] = {
    "haSendHeartbeatInterval": 500,
    "haHousekeepingInterval": 3000,
    "slaveSyncConfigInterval": 300,
}

Resp = replication_pb2.ReplicationStreamResponse


class FakeMaster(replication_pb2_grpc.ReplicationServicer):
    """A scripted master: what it sends is what the test puts in ``outbox``."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.hellos: list[replication_pb2.SlaveHello] = []
        self.acks: list[replication_pb2.SlaveAck] = []
        self.sync_requests: list[replication_pb2.SyncConfigRequest] = []
        self.sync_response = replication_pb2.SyncConfigResponse()
        self.truncate: Callable[[replication_pb2.SlaveHello], replication_pb2.TruncateTo] = (
            lambda hello: replication_pb2.TruncateTo(
                physical_offset=hello.max_physical_offset,
                epochs=[replication_pb2.EpochEntry(epoch=0, start_offset=0)],
            )
        )
        self.outbox: asyncio.Queue[Resp | None] = asyncio.Queue()
        """Messages for the current stream; None ends it (the master drops the slave)."""
        self.refuse_streams = False
        self.open_streams = 0

    # Written with context.read()/write() (one reader task, one writer), not as a generator.
    async def Stream(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        if self.refuse_streams:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fake master refuses")
        first = await context.read()
        self.hellos.append(first.hello)
        await context.write(Resp(truncate=self.truncate(first.hello)))
        self.open_streams += 1
        reader = asyncio.create_task(self._read_acks(context))
        try:
            while (msg := await self.outbox.get()) is not None:
                await context.write(msg)
        finally:
            self.open_streams -= 1
            reader.cancel()

    async def _read_acks(self, context: Any) -> None:
        while (req := await context.read()) is not grpc.aio.EOF:
            self.acks.append(req.ack)

    async def SyncConfig(
        self, request: replication_pb2.SyncConfigRequest, context: Any
    ) -> replication_pb2.SyncConfigResponse:
        self.sync_requests.append(request)
        return self.sync_response

    # -- scripting helpers -------------------------------------------------------------------
    def send_chunks(self, start: int, chunk_bytes: int, end: int | None = None) -> int:
        """Queue the store's bytes from ``start`` in chunks; returns where they end."""
        end = self.store.commitlog.max_offset if end is None else end
        pos = start
        while pos < end:
            data = self.store.read_replica(pos, min(chunk_bytes, end - pos))
            self.outbox.put_nowait(
                Resp(chunk=replication_pb2.CommitLogChunk(physical_offset=pos, data=data))
            )
            pos += len(data)
        return pos

    def confirm(self, offset: int) -> None:
        self.outbox.put_nowait(Resp(confirm=replication_pb2.ConfirmOffset(confirm_offset=offset)))

    def drop_stream(self) -> None:
        self.outbox.put_nowait(None)

    def acked(self) -> int:
        return self.acks[-1].max_physical_offset if self.acks else -1


def put(store: MessageStore, first: int, count: int, queue_id: int = 0) -> None:
    store.append(
        [
            MessageToStore(
                topic=TOPIC,
                queue_id=queue_id,
                body=f"msg-{i}".encode() + b"." * 150,
                properties=codec.encode_properties({codec.Prop.KEYS: f"k{i}"}),
                keys=f"k{i}",
            )
            for i in range(first, first + count)
        ]
    )


def record_end(store: MessageStore, queue_offset: int) -> int:
    """Commitlog offset one past the record at ``queue_offset`` of TOPIC queue 0."""
    rec = codec.decode_record(store.get_messages(TOPIC, 0, queue_offset, 1).records[0])
    return rec.physical_offset + rec.total_size


def record_start(store: MessageStore, queue_offset: int) -> int:
    rec = codec.decode_record(store.get_messages(TOPIC, 0, queue_offset, 1).records[0])
    return rec.physical_offset


def tables(version: int) -> replication_pb2.SyncConfigResponse:
    dv = common_pb2.DataVersion(timestamp_ms=1_700_000_000_000, counter=version)
    return replication_pb2.SyncConfigResponse(
        topics=replication_pb2.TopicTable(
            data_version=dv, topics=[TopicConfig(TOPIC, 4, 4).to_pb()]
        ),
        subscription_groups=replication_pb2.SubscriptionGroupTable(
            data_version=dv, groups=[SubscriptionGroupConfig(GROUP, retry_max_times=5).to_pb()]
        ),
    )


@contextlib.asynccontextmanager
async def setup(tmp_path: Path) -> AsyncIterator[tuple[FakeMaster, ServiceProcess, str]]:
    """(fake master, slave process, nameserver address)."""
    store = MessageStore(
        StoreConfig(store_dir=tmp_path / "master-store", commitlog_file_bytes=64 * 1024),
        clock=ManualClock(),
    )
    store.open()
    fake = FakeMaster(store)
    fake.sync_response = tables(1)
    server = grpc.aio.server()
    replication_pb2_grpc.add_ReplicationServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    namesrv: ServiceProcess | None = None
    slave: ServiceProcess | None = None
    try:
        namesrv = await asyncio.to_thread(start_nameserver, tmp_path)
        keys: dict[str, object] = {
            "haMasterAddress": f"127.0.0.1:{port}",
            "mappedFileSizeCommitLog": 64 * 1024,
            **SLAVE_KEYS,
        }
        ns_addr = namesrv.addr
        slave = await asyncio.to_thread(
            lambda: start_slave(tmp_path, [ns_addr], "broker-a", 1, None, **keys)
        )
        assert slave is not None
        yield fake, slave, namesrv.addr
    finally:
        fake.drop_stream()
        for proc in (slave, namesrv):
            if proc is not None:
                await asyncio.to_thread(proc.stop)
        await server.stop(0)
        store.close_files()


async def pull(slave: str, offset: int = 0, max_nums: int = 100) -> messaging_pb2.PullResponse:
    async with RawClient(slave) as raw:
        resp: messaging_pb2.PullResponse = await raw.messaging.Pull(
            messaging_pb2.PullRequest(
                consumer_group=GROUP,
                topic=TOPIC,
                queue_id=0,
                queue_offset=offset,
                sys_flag=0x4,
                subscription="*",
                max_msg_nums=max_nums,
                decoded=True,
            ),
            timeout=10,
        )
        return resp


def pulled_bodies(resp: messaging_pb2.PullResponse) -> list[str]:
    return [m.message.body.split(b".")[0].decode() for m in resp.messages]


async def commit(slave: str, offset: int) -> None:
    async with RawClient(slave) as raw:
        await raw.messaging.UpdateConsumerOffset(
            messaging_pb2.UpdateConsumerOffsetRequest(
                consumer_group=GROUP, topic=TOPIC, queue_id=0, commit_offset=offset
            ),
            timeout=10,
        )


async def slave_topics(slave: str) -> list[str]:
    async with RawClient(slave) as raw:
        resp = await raw.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=10)
        return [t.topic_name for t in resp.topics]


# -- tests ---------------------------------------------------------------------------------------


async def test_slave_writes_chunks_acks_and_serves_only_confirmed_records(tmp_path: Path) -> None:
    async with setup(tmp_path) as (fake, slave, namesrv):
        await until(lambda: bool(fake.hellos), "the slave's hello", timeout_s=WAIT_S)
        hello = fake.hellos[0]
        assert (hello.broker_name, hello.broker_id) == ("broker-a", 1)
        assert hello.broker_addr == slave.addr
        assert hello.max_physical_offset == 0 and list(hello.epochs) == []
        # Config sync right after connecting: the topic and group exist on the slave.
        await until(lambda: bool(fake.sync_requests), "a SyncConfig call", timeout_s=WAIT_S)
        await until(lambda: TOPIC_IN(slave.addr), "the synced topic", timeout_s=WAIT_S)
        first = fake.sync_requests[0]
        assert first.broker_name == "broker-a" and first.broker_id == 1
        assert not first.HasField("topics_version")
        await until(
            lambda: any(r.topics_version.counter == 1 for r in fake.sync_requests),
            "a SyncConfig holding version 1",
            timeout_s=WAIT_S,
        )
        # Records streamed in chunks that end inside records.
        put(fake.store, 0, 30)
        end = fake.send_chunks(0, 700)
        await until(lambda: fake.acked() == end, f"an ack of {end}", timeout_s=WAIT_S)
        assert all(a.flushed_offset <= a.max_physical_offset for a in fake.acks)
        offsets = [a.max_physical_offset for a in fake.acks]
        assert offsets == sorted(offsets)  # never decreases on a stream
        # Nothing confirmed yet: nothing served.
        resp = await pull(slave.addr)
        assert resp.status == messaging_pb2.NO_NEW_MSG and not resp.messages
        assert resp.max_offset == 30  # the queue itself is complete
        fake.confirm(record_end(fake.store, 9))
        await until(lambda: n_pulled(slave.addr, 10), "10 confirmed records", timeout_s=WAIT_S)
        resp = await pull(slave.addr)
        assert pulled_bodies(resp) == [f"msg-{i}" for i in range(10)]
        assert resp.next_begin_offset == 10
        fake.confirm(end)
        await until(lambda: n_pulled(slave.addr, 30), "all 30 records", timeout_s=WAIT_S)
        assert pulled_bodies(await pull(slave.addr)) == [f"msg-{i}" for i in range(30)]
        # While the stream lives, offsets belong to the master.
        code, reason, _ = await refused(commit(slave.addr, 5))
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, common_pb2.NOT_MASTER)
        # The slave is in the nameserver's route of the topic (its master registers it).
        await register_fake_master(namesrv, fake)
        route = await topic_route(namesrv)
        addrs = {b.broker_name: dict(b.broker_addrs) for b in route.brokers}
        assert addrs["broker-a"].get(1) == slave.addr


async def test_slave_reconnects_truncates_where_told_and_commits_offsets_while_cut_off(
    tmp_path: Path,
) -> None:
    async with setup(tmp_path) as (fake, slave, _namesrv):
        await until(lambda: len(fake.hellos) == 1, "the first hello", timeout_s=WAIT_S)
        put(fake.store, 0, 12)
        end = fake.send_chunks(0, 1024)
        fake.confirm(end)
        await until(lambda: fake.acked() == end, "the first ack", timeout_s=WAIT_S)
        # The master drops the stream: the slave comes back with where it got to.
        fake.drop_stream()
        await until(lambda: len(fake.hellos) == 2, "a second hello", timeout_s=WAIT_S)
        again = fake.hellos[1]
        assert again.max_physical_offset == end
        assert [(e.epoch, e.start_offset) for e in again.epochs] == [(0, 0)]
        # Next time the master says the histories part at record 8 (a failover there).
        cut = record_start(fake.store, 8)
        fake.truncate = lambda hello: replication_pb2.TruncateTo(
            physical_offset=cut,
            epochs=[
                replication_pb2.EpochEntry(epoch=0, start_offset=0),
                replication_pb2.EpochEntry(epoch=2, start_offset=cut),
            ],
        )
        fake.drop_stream()
        await until(lambda: len(fake.hellos) == 3, "a third hello", timeout_s=WAIT_S)
        await until(lambda: fake.acked() == cut, f"an ack of the cut {cut}", timeout_s=WAIT_S)
        resp = await pull(slave.addr)
        assert resp.max_offset == 8 and len(resp.messages) == 8
        fake.truncate = FakeMaster(fake.store).truncate
        fake.drop_stream()
        await until(lambda: len(fake.hellos) == 4, "a fourth hello", timeout_s=WAIT_S)
        assert fake.hellos[3].max_physical_offset == cut
        assert [(e.epoch, e.start_offset) for e in fake.hellos[3].epochs] == [(0, 0), (2, cut)]
        # Streams on from the cut.
        end = fake.send_chunks(cut, 1024)
        fake.confirm(end)
        await until(lambda: n_pulled(slave.addr, 12), "12 records again", timeout_s=WAIT_S)
        # The master becomes unreachable: the slave now takes offset commits ...
        fake.refuse_streams = True
        fake.drop_stream()
        await until(lambda: fake.open_streams == 0, "the stream to end", timeout_s=WAIT_S)
        await until(lambda: commit_accepted(slave.addr, 7), "a slave commit", timeout_s=WAIT_S)
        # ... sends them with every SyncConfig ...
        await until(
            lambda: local_offsets(fake.sync_requests[-1]) == {0: 7},
            "slave_offsets {0: 7}",
            timeout_s=WAIT_S,
        )
        # ... until the master's table shows them.
        caught_up = tables(1)
        caught_up.ClearField("topics")
        caught_up.ClearField("subscription_groups")
        caught_up.consumer_offsets.CopyFrom(
            replication_pb2.ConsumerOffsetTable(
                data_version=common_pb2.DataVersion(counter=9),
                offsets=[
                    common_pb2.ConsumerOffsetEntry(
                        topic=TOPIC, consumer_group=GROUP, queue_offsets={0: 7}
                    )
                ],
            )
        )
        fake.sync_response = caught_up
        mark = len(fake.sync_requests)
        await until(
            lambda: (
                len(fake.sync_requests) > mark + 1 and local_offsets(fake.sync_requests[-1]) == {}
            ),
            "slave_offsets to empty",
            timeout_s=WAIT_S,
        )
        assert fake.sync_requests[-1].consumer_offsets_version.counter == 9
        # Back online: commits go to the master again.
        fake.refuse_streams = False
        await until(lambda: fake.open_streams == 1, "the stream back", timeout_s=WAIT_S)
        code, _, _ = await refused(commit(slave.addr, 8))
        assert code == grpc.StatusCode.UNAVAILABLE


# -- small async helpers ----------------------------------------------------------------------


async def TOPIC_IN(slave: str) -> bool:
    return TOPIC in await slave_topics(slave)


async def n_pulled(slave: str, count: int) -> bool:
    return len((await pull(slave)).messages) == count


async def commit_accepted(slave: str, offset: int) -> bool:
    try:
        await commit(slave, offset)
    except grpc.aio.AioRpcError:
        return False
    return True


def local_offsets(req: replication_pb2.SyncConfigRequest) -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in req.slave_offsets:
        if (entry.topic, entry.consumer_group) == (TOPIC, GROUP):
            out.update(entry.queue_offsets)
    return out


async def register_fake_master(namesrv: str, fake: FakeMaster) -> None:
    async with RawClient(namesrv) as raw:
        await raw.nameserver.RegisterBroker(
            nameserver_pb2.RegisterBrokerRequest(
                cluster_name="DefaultCluster",
                broker_addr="127.0.0.1:1",
                broker_name="broker-a",
                broker_id=0,
                topic_configs=[TopicConfig(TOPIC, 4, 4).to_pb()],
            ),
            timeout=10,
        )


async def topic_route(namesrv: str) -> nameserver_pb2.TopicRouteData:
    async with RawClient(namesrv) as raw:
        resp = await raw.nameserver.GetRouteInfoByTopic(
            nameserver_pb2.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=10
        )
        route: nameserver_pb2.TopicRouteData = resp.route
        return route
