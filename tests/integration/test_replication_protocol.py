"""The master's side of replication.proto, driven by a hand-rolled slave over the raw stubs.

A real broker process is the master; the "slave" is this test: it opens Replication.Stream,
sends hellos and acks of its choosing and checks every answer - the hello statuses, TruncateTo
for empty / behind / ahead / diverged histories, contiguous chunks equal to the master's
commitlog bytes, the in-flight cap while it does not ack, ConfirmOffset, SYNC_MASTER statuses,
the silent-slave drop, SyncConfig (tables by version, slave offsets merged where ahead), and the
data socket (ha_wire: frames, acks, tokens, its refusals as stream statuses).
Real master+slave system tests are elsewhere (test_replication*.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    messaging_pb2,
    replication_pb2,
)
from services.broker import ha_wire
from tests.integration.cluster import ServiceProcess, start_broker, start_slave
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "ReplTopic"
Response = replication_pb2.ReplicationStreamResponse


@pytest.fixture
def master_factory(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    started: list[ServiceProcess] = []

    def make(**keys: object) -> ServiceProcess:
        sp = start_broker(tmp_path, [], "broker-a", None, **keys)
        started.append(sp)
        return sp

    yield make
    for sp in started:
        if sp.alive():
            sp.stop()


def _epochs(*pairs: tuple[int, int]) -> list[replication_pb2.EpochEntry]:
    return [replication_pb2.EpochEntry(epoch=e, start_offset=s) for e, s in pairs]


class FakeSlave:
    """One Replication.Stream opened by the test."""

    def __init__(self, c: RawClient) -> None:
        self.call: Any = c.replication.Stream()
        self.data = bytearray()
        self.start = 0
        self.confirms: list[int] = []
        self.accepts_chunk_confirm = False
        self.accepts_data_socket = False
        self.chunk_confirms = 0
        """Confirms that came inside a chunk."""
        self._pending: asyncio.Future[Any] | None = None

    async def hello(self, max_offset: int = 0, epochs: Any = (), **fields: Any) -> Any:
        hello = replication_pb2.SlaveHello(
            broker_name=fields.pop("broker_name", "broker-a"),
            broker_id=fields.pop("broker_id", 1),
            broker_addr="127.0.0.1:1",
            max_physical_offset=max_offset,
            epochs=list(epochs),
            accepts_chunk_confirm=self.accepts_chunk_confirm,
            accepts_data_socket=self.accepts_data_socket,
        )
        await self.call.write(replication_pb2.ReplicationStreamRequest(hello=hello))
        first = await self.read()
        assert first.WhichOneof("command") == "truncate"
        self.start = first.truncate.physical_offset
        return first.truncate

    async def read(self, timeout_s: float = 10.0) -> Any:
        msg = await self.poll(timeout_s)
        if msg is None:
            raise TimeoutError(f"no message from the master within {timeout_s:.1f} s")
        return msg

    async def poll(self, timeout_s: float) -> Any:
        """The next message, or None after ``timeout_s`` (the read stays pending: cancelling
        a read would cancel the whole call)."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.call.read())
        done, _ = await asyncio.wait({self._pending}, timeout=max(0.0, timeout_s))
        if not done:
            return None
        msg = self._pending.result()
        self._pending = None
        assert msg is not grpc.aio.EOF
        return msg

    async def ack(self, offset: int) -> None:
        ack = replication_pb2.SlaveAck(max_physical_offset=offset, flushed_offset=offset)
        await self.call.write(replication_pb2.ReplicationStreamRequest(ack=ack))

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    async def take(self, msg: Any) -> None:
        kind = msg.WhichOneof("command")
        if kind == "chunk":
            assert msg.chunk.physical_offset == self.end, "chunks must be contiguous"
            self.data += msg.chunk.data
            if msg.chunk.HasField("confirm"):
                assert self.accepts_chunk_confirm, "a confirm inside a chunk it did not accept"
                self.confirms.append(msg.chunk.confirm.confirm_offset)
                self.chunk_confirms += 1
        elif kind == "confirm":
            self.confirms.append(msg.confirm.confirm_offset)
        else:
            raise AssertionError(f"unexpected {kind} after the TruncateTo")

    async def receive_until(
        self, done: Callable[[], bool], *, ack: bool, timeout_s: float = 10
    ) -> None:
        deadline = time.monotonic() + timeout_s
        if ack:
            await self.ack(self.end)  # a full window opens only with an ack
        while not done():
            await self.take(await self.read(deadline - time.monotonic()))
            if ack:
                await self.ack(self.end)

    async def drain(self, quiet_s: float) -> None:
        """Take messages until none comes for ``quiet_s`` (no acks)."""
        while (msg := await self.poll(quiet_s)) is not None:
            await self.take(msg)


async def _produce(addr: str, count: int, body_bytes: int = 1000) -> int:
    """Create the topic and send ``count`` messages; the master's commitlog max offset."""
    async with RawClient(addr) as c:
        admin = c.admin
        await admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=TOPIC, read_queue_nums=2, write_queue_nums=2, perm=6
                ),
            )
        )
        await _send(c, count, body_bytes)
        return await _max_offset(c)


async def _send(c: RawClient, count: int, body_bytes: int = 1000) -> list[int]:
    stub = c.messaging
    statuses = []
    for i in range(count):
        resp = await stub.Send(
            messaging_pb2.SendRequest(
                queue_id=i % 2,
                messages=[common_pb2.Message(topic=TOPIC, body=bytes([65 + i % 26]) * body_bytes)],
            )
        )
        statuses.append(resp.results[0].status)
    return statuses


async def _stats(c: RawClient) -> admin_pb2.GetRuntimeStatsResponse:
    return await c.runtime_stats()


async def _in_sync(c: RawClient) -> bool:
    """Whether the master reports its one slave in sync."""
    slaves = (await _stats(c)).slaves
    return bool(slaves) and slaves[0].in_sync


async def _max_offset(c: RawClient) -> int:
    return (await _stats(c)).commitlog_max_offset


def _commitlog_bytes(master: ServiceProcess, start: int, end: int) -> bytes:
    path = master.workdir / "store" / "commitlog" / f"{0:020d}"
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


# -- hello statuses ------------------------------------------------------------------------------


async def test_hello_statuses(master_factory: Callable[..., ServiceProcess]) -> None:
    master = master_factory()

    async def expect(code: grpc.StatusCode, first: Any) -> grpc.aio.AioRpcError:
        async with RawClient(master.addr) as c:
            call = c.replication.Stream()
            await call.write(first)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(call.read(), 10)
            assert info.value.code() == code, info.value.details()
            return info.value

    def hello(**fields: Any) -> replication_pb2.ReplicationStreamRequest:
        base: dict[str, Any] = {"broker_name": "broker-a", "broker_id": 1}
        base.update(fields)
        return replication_pb2.ReplicationStreamRequest(hello=replication_pb2.SlaveHello(**base))

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await expect(invalid, replication_pb2.ReplicationStreamRequest(ack=replication_pb2.SlaveAck()))
    await expect(invalid, hello(broker_name=""))
    await expect(invalid, hello(broker_id=0))
    await expect(invalid, hello(epochs=_epochs((1, 0), (1, 10))))
    await expect(invalid, hello(epochs=_epochs((0, 10), (1, 5))))
    precondition = grpc.StatusCode.FAILED_PRECONDITION
    await expect(precondition, hello(broker_name="broker-b"))
    err = await expect(precondition, hello(epochs=_epochs((0, 0), (3, 0)), max_physical_offset=5))
    assert "newer" in (err.details() or "")
    # An ack beyond what was sent breaks the protocol.
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        await slave.hello()
        await slave.ack(1 << 30)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while True:
                await slave.read()
        assert info.value.code() == invalid


async def test_a_slave_answers_replication_calls_not_master(
    tmp_path: Path, master_factory: Callable[..., ServiceProcess]
) -> None:
    master = master_factory()
    slave = start_slave(tmp_path, [], haMasterAddress=master.addr)
    try:
        # Let the real slave settle on its own stream first (and stop it only then).
        async with RawClient(master.addr) as mc:

            async def has_slave() -> bool:
                return bool((await _stats(mc)).slaves)

            await until(has_slave, "the real slave's stream on the master", timeout_s=5)
            assert (await _stats(mc)).slaves[0].broker_id == 1
        async with RawClient(slave.addr) as c:
            call = c.replication.Stream()
            hello = replication_pb2.SlaveHello(broker_name="broker-a", broker_id=2)
            await call.write(replication_pb2.ReplicationStreamRequest(hello=hello))
            code, reason, _ = await refused(asyncio.wait_for(call.read(), 10))
            assert code == grpc.StatusCode.UNAVAILABLE
            assert reason == common_pb2.NOT_MASTER
            code, reason, _ = await refused(
                c.replication.SyncConfig(
                    replication_pb2.SyncConfigRequest(broker_name="broker-a", broker_id=2)
                )
            )
            assert code == grpc.StatusCode.UNAVAILABLE
            assert reason == common_pb2.NOT_MASTER
    finally:
        slave.stop()


# -- truncation and chunks -----------------------------------------------------------------------


async def test_truncate_to_for_empty_behind_ahead_and_diverged_histories(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory()

    end = await _produce(master.addr, 20)
    assert end > 0
    async with RawClient(master.addr) as c:
        cases = [
            ((), 0, 0),  # empty store: from the start
            (_epochs((0, 0)), 1000, 1000),  # behind: keeps everything
            (_epochs((0, 0)), end + 5000, end),  # ahead: cut back to the master's end
            (_epochs((0, 300)), 900, 0),  # histories differ from the first entry
        ]
        for epochs, slave_max, want in cases:
            slave = FakeSlave(c)
            truncate = await slave.hello(slave_max, epochs)
            assert truncate.physical_offset == want, (epochs, slave_max)
            assert [(e.epoch, e.start_offset) for e in truncate.epochs] == [(0, 0)]
            slave.call.cancel()


async def test_chunks_are_contiguous_bounded_and_equal_to_the_master_commitlog(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    batch = 8192
    master = master_factory(haTransferBatchSize=batch)

    end = await _produce(master.addr, 200)
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        truncate = await slave.hello(1000, _epochs((0, 0)))
        assert truncate.physical_offset == 1000
        sizes: list[int] = []
        while slave.end < end:
            msg = await slave.read()
            if msg.WhichOneof("command") == "chunk":
                sizes.append(len(msg.chunk.data))
            await slave.take(msg)
            await slave.ack(slave.end)
        assert slave.end == end
        assert max(sizes) <= batch and len(sizes) >= (end - 1000) // batch
        assert bytes(slave.data) == _commitlog_bytes(master, 1000, end)
        # New bytes are pushed without asking.
        await _send(c, 3)
        end2 = await _max_offset(c)
        await slave.receive_until(lambda: slave.end >= end2, ack=True)
        assert bytes(slave.data) == _commitlog_bytes(master, 1000, end2)


async def test_in_flight_bytes_are_capped_until_the_slave_acks(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory(haTransferBatchSize=4096, haMaxInFlightBytes=16384)

    end = await _produce(master.addr, 100)
    assert end > 40_000
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        await slave.hello()
        await slave.drain(quiet_s=1.0)
        assert slave.end == 16384  # the window, exactly, and nothing more without an ack
        await slave.ack(5000)
        await slave.drain(quiet_s=0.5)
        assert slave.end == 5000 + 16384
        await slave.receive_until(lambda: slave.end >= end, ack=True)
        assert slave.end == end
        assert bytes(slave.data) == _commitlog_bytes(master, 0, end)


async def test_small_appends_wait_for_the_ack_of_the_chunk_in_flight_then_ship_as_one(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory(haSmallChunksInFlightMax=1)

    end = await _produce(master.addr, 3)
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        await slave.hello()
        await slave.receive_until(lambda: slave.end >= end, ack=False)
        await _send(c, 5)  # each a small append while the first chunk is not acked
        end2 = await _max_offset(c)
        await slave.drain(quiet_s=0.5)
        assert slave.end == end  # held back: a chunk is in flight and these fill no chunk
        await slave.ack(end)
        chunks = 0
        while slave.end < end2:
            msg = await slave.read()
            chunks += msg.WhichOneof("command") == "chunk"
            await slave.take(msg)
        assert chunks == 1  # the five sends in one stream message
        assert bytes(slave.data) == _commitlog_bytes(master, 0, end2)


# -- confirm offset, SYNC_MASTER, housekeeping ---------------------------------------------------


async def test_confirm_offset_follows_the_in_sync_slave(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    # This slave withholds acks while it reads: small appends must not wait for them.
    master = master_factory(haSmallChunksInFlightMax=0)

    end = await _produce(master.addr, 10)
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        await slave.hello()
        await slave.receive_until(lambda: slave.end >= end, ack=False)
        stats = await _stats(c)
        (link,) = stats.slaves
        assert not link.in_sync and link.lag_bytes == end and link.lag_seconds > 0
        assert stats.confirm_offset == end  # nobody in sync: unbounded
        await slave.ack(end)
        await until(lambda: _in_sync(c), "the slave in sync after its ack")
        stats = await _stats(c)
        assert stats.slaves[0].in_sync and stats.slaves[0].lag_bytes == 0
        await _send(c, 5)
        end2 = await _max_offset(c)
        stats = await _stats(c)
        assert stats.confirm_offset == end  # new bytes wait for the in-sync slave
        assert stats.slaves[0].lag_bytes == end2 - end
        await slave.receive_until(lambda: slave.end >= end2, ack=False)
        await slave.ack(end2)
        await slave.receive_until(lambda: end2 in slave.confirms, ack=False)
        assert (await _stats(c)).confirm_offset == end2
        assert slave.confirms == sorted(slave.confirms)


async def test_a_slave_that_accepts_it_gets_confirms_inside_chunks_while_data_waits(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    # A one-chunk window: every ack both opens it and advances the confirm offset, so the next
    # message has data and a confirm to carry.
    master = master_factory(haTransferBatchSize=4096, haMaxInFlightBytes=4096)

    end = await _produce(master.addr, 3)
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        slave.accepts_chunk_confirm = True
        await slave.hello()
        await slave.receive_until(lambda: slave.end >= end, ack=True)
        await until(lambda: _in_sync(c), "the slave in sync after its ack")
        await _send(c, 30)
        end2 = await _max_offset(c)
        await slave.receive_until(lambda: slave.end >= end2 and end2 in slave.confirms, ack=True)
        assert slave.chunk_confirms > 0
        assert slave.confirms == sorted(slave.confirms)
        assert bytes(slave.data) == _commitlog_bytes(master, 0, end2)
        assert (await _stats(c)).confirm_offset == end2


async def test_sync_master_statuses(master_factory: Callable[..., ServiceProcess]) -> None:
    master = master_factory(brokerRole="SYNC_MASTER", syncFlushTimeout=700)

    async with RawClient(master.addr) as c:
        await _produce(master.addr, 0)
        assert await _send(c, 1) == [messaging_pb2.SLAVE_NOT_AVAILABLE]
        slave = FakeSlave(c)
        await slave.hello()
        end = await _max_offset(c)
        await slave.receive_until(lambda: slave.end >= end, ack=True)
        await until(lambda: _in_sync(c), "the slave in sync after its acks")
        assert (await _stats(c)).slaves[0].in_sync
        # The slave acks what it receives: SEND_OK.
        send = asyncio.create_task(_send(c, 1))
        await slave.receive_until(send.done, ack=True)
        assert await send == [messaging_pb2.SEND_OK]
        # The slave stops acking: FLUSH_SLAVE_TIMEOUT after syncFlushTimeout.
        started = time.monotonic()
        assert await _send(c, 1) == [messaging_pb2.FLUSH_SLAVE_TIMEOUT]
        assert time.monotonic() - started >= 0.6


async def test_a_silent_slave_is_dropped_after_the_housekeeping_interval(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory(haSendHeartbeatInterval=200, haHousekeepingInterval=1000)

    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        await slave.hello()
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await slave.receive_until(lambda: False, ack=False)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no ack" in (info.value.details() or "")
        assert 0.9 <= time.monotonic() - started < 5
        assert not (await _stats(c)).slaves


# -- SyncConfig ----------------------------------------------------------------------------------


async def test_sync_config_tables_and_slave_offsets(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory()

    # 10 messages in each queue: a commit beyond a queue's end is stored as the end (issue 21)
    await _produce(master.addr, 20)
    async with RawClient(master.addr) as c:
        msg = c.messaging
        for qid, offset in ((0, 10), (1, 10)):
            await msg.UpdateConsumerOffset(
                messaging_pb2.UpdateConsumerOffsetRequest(
                    consumer_group="g1", topic=TOPIC, queue_id=qid, commit_offset=offset
                )
            )
        repl = c.replication
        for name, code in (("", "INVALID_ARGUMENT"), ("broker-b", "FAILED_PRECONDITION")):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await repl.SyncConfig(replication_pb2.SyncConfigRequest(broker_name=name))
            assert info.value.code().name == code
        first = await repl.SyncConfig(replication_pb2.SyncConfigRequest(broker_name="broker-a"))
        assert TOPIC in [t.topic_name for t in first.topics.topics]
        assert first.HasField("subscription_groups") and first.HasField("timer_offsets")
        rows = {
            (e.topic, e.consumer_group): dict(e.queue_offsets)
            for e in first.consumer_offsets.offsets
        }
        assert rows[(TOPIC, "g1")] == {0: 10, 1: 10}

        def next_request(**extra: Any) -> replication_pb2.SyncConfigRequest:
            return replication_pb2.SyncConfigRequest(
                broker_name="broker-a",
                broker_id=1,
                topics_version=first.topics.data_version,
                subscription_groups_version=first.subscription_groups.data_version,
                consumer_offsets_version=first.consumer_offsets.data_version,
                timer_offsets_version=first.timer_offsets.data_version,
                **extra,
            )

        quiet = await repl.SyncConfig(next_request())
        assert quiet.ByteSize() == 0  # nothing changed: no table
        ahead = common_pb2.ConsumerOffsetEntry(
            topic=TOPIC, consumer_group="g1", queue_offsets={0: 15, 1: 4}
        )
        merged = await repl.SyncConfig(next_request(slave_offsets=[ahead]))
        assert not merged.HasField("topics")
        rows = {
            (e.topic, e.consumer_group): dict(e.queue_offsets)
            for e in merged.consumer_offsets.offsets
        }
        assert rows[(TOPIC, "g1")] == {0: 15, 1: 10}  # only the offset ahead was taken
        query = await msg.QueryConsumerOffset(
            messaging_pb2.QueryConsumerOffsetRequest(consumer_group="g1", topic=TOPIC, queue_id=0)
        )
        assert query.offset == 15


# -- the data socket (services/broker/ha_wire.py) -------------------------------------------------


class SocketSlave:
    """A FakeSlave's stream, then the master's data socket for chunks, confirms and acks."""

    def __init__(self, slave: FakeSlave, truncate: Any) -> None:
        self.slave = slave
        self.truncate = truncate
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self, token: bytes | None = None) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self.truncate.data_port
        )
        self.writer.write(self.truncate.data_token if token is None else token)

    async def frame(self) -> tuple[int, int, bytes, int] | None:
        """(kind, offset, data, confirm offset) of the next frame; None once closed."""
        assert self.reader is not None
        try:
            head = await asyncio.wait_for(self.reader.readexactly(ha_wire.FRAME.size), 10)
            kind, offset, length, _pace, confirm, _version = ha_wire.FRAME.unpack(head)
            data = await asyncio.wait_for(self.reader.readexactly(length), 10)
        except asyncio.IncompleteReadError:
            return None
        return kind, offset, data, confirm

    def ack(self, offset: int) -> None:
        assert self.writer is not None
        self.writer.write(ha_wire.ACK.pack(offset, offset))

    async def receive_until(self, done: Callable[[], bool]) -> None:
        """Take frames into the FakeSlave's data and confirms, acking each chunk."""
        slave = self.slave
        while not done():
            got = await self.frame()
            assert got is not None, "the master closed the data socket"
            kind, offset, data, confirm = got
            if kind == ha_wire.CHUNK:
                assert offset == slave.end, "chunks must be contiguous"
                slave.data += data
                self.ack(slave.end)
            else:
                assert kind == ha_wire.CONFIRM and not data, kind
            if confirm != ha_wire.NO_CONFIRM:
                slave.confirms.append(confirm)


async def _socket_slave(c: RawClient) -> SocketSlave:
    slave = FakeSlave(c)
    slave.accepts_data_socket = True
    truncate = await slave.hello()
    assert truncate.data_port > 0 and len(truncate.data_token) == ha_wire.TOKEN_BYTES
    return SocketSlave(slave, truncate)


async def test_the_data_socket_carries_chunks_confirms_and_acks(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory(brokerRole="SYNC_MASTER")

    end = await _produce(master.addr, 50)
    async with RawClient(master.addr) as c:
        wrong = await _socket_slave(c)
        await wrong.connect(token=bytes(ha_wire.TOKEN_BYTES))
        assert await wrong.frame() is None  # an unknown token: closed at once
        wrong.slave.call.cancel()

        sock = await _socket_slave(c)
        await sock.connect()
        slave = sock.slave
        await sock.receive_until(lambda: slave.end >= end and end in slave.confirms)
        assert bytes(slave.data) == _commitlog_bytes(master, 0, end)
        await until(lambda: _in_sync(c), "the slave in sync after its socket acks")
        # SYNC_MASTER sends are answered once this slave acks them on the socket.
        sent = asyncio.ensure_future(_send(c, 3))
        await sock.receive_until(sent.done)
        assert await sent == [messaging_pb2.SEND_OK] * 3
        end2 = await _max_offset(c)
        await sock.receive_until(lambda: end2 in slave.confirms)
        assert bytes(slave.data) == _commitlog_bytes(master, 0, end2)
        # Nothing arrives on the stream meanwhile: it only says how replication ends.
        assert await slave.poll(0.2) is None


async def test_data_socket_protocol_errors_end_the_stream_with_a_status(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory(haHousekeepingInterval=2000, haSendHeartbeatInterval=500)

    end = await _produce(master.addr, 5)
    async with RawClient(master.addr) as c:
        # An ack beyond what was sent.
        sock = await _socket_slave(c)
        await sock.connect()
        await sock.receive_until(lambda: sock.slave.end >= end)
        sock.ack(end + (1 << 20))
        code, _, details = await refused(sock.slave.read())
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        # A stream message after taking the socket, or before its token arrives.
        for connect_first in (True, False):
            sock = await _socket_slave(c)
            if connect_first:
                await sock.connect()
            await sock.slave.ack(0)
            code, _, details = await refused(sock.slave.read())
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "data socket" in details, details
        # No connection within the housekeeping interval.
        sock = await _socket_slave(c)
        code, _, details = await refused(sock.slave.read())
        assert code == grpc.StatusCode.UNAVAILABLE and "did not connect" in details, details


async def test_no_data_socket_with_ha_listen_port_off(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    master = master_factory(haListenPort=-1)

    end = await _produce(master.addr, 5)
    async with RawClient(master.addr) as c:
        slave = FakeSlave(c)
        slave.accepts_data_socket = True
        truncate = await slave.hello()
        assert truncate.data_port == 0 and not truncate.data_token
        await slave.receive_until(lambda: slave.end >= end, ack=True)
        assert bytes(slave.data) == _commitlog_bytes(master, 0, end)


async def test_a_slave_that_stops_reading_its_data_socket_is_dropped(
    master_factory: Callable[..., ServiceProcess],
) -> None:
    # A window far beyond what the sockets buffer: the master's writes block on this slave,
    # which reads nothing and never acks. The housekeeping drop must still end the stream.
    master = master_factory(
        haSendHeartbeatInterval=200,
        haHousekeepingInterval=1000,
        haMaxInFlightBytes=64 << 20,
        haTransferBatchSize=1 << 20,
    )

    async with RawClient(master.addr) as c:
        await _produce(master.addr, 1)
        body = b"s" * 4000
        for _ in range(24):  # 24 MiB
            resp = await c.messaging.Send(
                messaging_pb2.SendRequest(
                    queue_id=0, messages=[common_pb2.Message(topic=TOPIC, body=body)] * 256
                )
            )
            assert resp.results[0].status == messaging_pb2.SEND_OK
        sock = await _socket_slave(c)
        await sock.connect()
        code, _, details = await refused(sock.slave.read(timeout_s=15))
        assert code == grpc.StatusCode.UNAVAILABLE and "no ack" in details, details
        assert not (await _stats(c)).slaves
