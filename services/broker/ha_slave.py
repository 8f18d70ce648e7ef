"""The slave side of replication: keep one ``Replication.Stream`` open to the master.

A slave's commitlog is written only here (its send paths refuse with NOT_MASTER). One task,
:meth:`ReplicationClient.run`, loops over connections::

    find the master (haMasterAddress, else what the nameservers reported) ─┐
    open Stream, send SlaveHello(max offset, epochs)                       │
    ◀── TruncateTo: truncate the store there, take the master's epochs     │ any error or end:
    ◀── CommitLogChunk: append_replica at our max offset ──▶ SlaveAck       │ back off 100 ms,
    ◀── ConfirmOffset: bound what consumers may read                       │ 200 ms ... 5 s
    ... until the stream breaks, the master goes silent, or a chunk is bad ┘ and start over

**Acks** (:class:`AckPacer`): one after each write, at once or, when the chunk asks for a
pace (``ack_pace_ms``: a busy master, ``ha_pacing``), that long after the previous ack, so one
ack covers every chunk written meanwhile; and one every ``haSendHeartbeatInterval`` while idle
so the master keeps the slave in its in-sync set. An ack
carries the store's max offset (the proto's "one past the last byte written"; a partial record
at the end counts as written) and its flushed offset. Acks are written by one task (a gRPC
stream takes one writer at a time) while another reads.

**The data socket.** When TruncateTo names a data port (``ha_wire``), the slave connects to it
at the host it reached the master on (in TLS when its channels use TLS) and takes chunks and
confirm offsets there, each applied by a ``FrameReader`` as soon as it is whole, acking on the
same socket; the stream then only says how replication ended. A master whose socket cannot be
reached there (a proxy, a port mapping) gets no offer from this slave for DATA_SOCKET_RETRY_S:
the data stays on the stream meanwhile.

**Confirm offset.** On connecting, the slave bounds reads at the point the master agreed to
(nothing it receives from now on is served before the master confirms it); each ConfirmOffset
raises the bound to min(confirm, what this slave has dispatched). A slave that never connects
keeps serving what it has: that is what consumers need while the master is down.

**Liveness.** The master sends a ConfirmOffset at least every 5 s; a stream silent for
``haHousekeepingInterval`` is taken as dead (a cut network may never reset the connection) and
replaced.

**Backoff** (:class:`Backoff`): 100 ms doubling to 5 s; reset once a stream has connected, so a
master restart costs one short pause. State changes (connected, lost, master address changed)
are logged once, not on every retry.

**Controller mode.** The master's address comes from the election (``master_addr`` reads the
current leader); :meth:`ReplicationClient.repoint` ends a stream to a former master and cuts
the backoff short, so a slave follows a failover at once. A promoted slave stops the client
(:meth:`ReplicationClient.close`) and a demoted master starts it again after
:meth:`ReplicationClient.reopen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from rocketq import backoff
from rocketq._api.rocketq.v1 import replication_pb2, replication_pb2_grpc
from rocketq.aio import wait_event
from rocketq.client.security import default_security, security_channel
from services.broker import ha_wire
from services.broker.config import BrokerConfig
from services.broker.ha_pacing import ACK_PACE_MAX_MS
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.grpc_server import PEER_CHANNEL_OPTIONS
from services.store.epoch_file import EpochEntry
from services.store.message_store import MessageStore, StoreError, StoreFullError
from services.store.types import PhysicalOffset

log = logging.getLogger(__name__)

BACKOFF_INITIAL_MS = 100
BACKOFF_MAX_MS = 5_000
DATA_SOCKET_RETRY_S = 300.0
"""How long a slave keeps the data on the stream after its master's data socket could not be
reached, before it offers to take the socket again."""


class ProtocolError(Exception):
    """The master broke replication.proto's contract (the slave reconnects)."""


class Backoff(backoff.Backoff):
    """Reconnect delays: ``initial_ms`` doubling up to ``max_ms``; :meth:`reset` after success.
    Without jitter: a slave keeps one stream to its master, there is no crowd to spread out."""

    def __init__(self, initial_ms: int = BACKOFF_INITIAL_MS, max_ms: int = BACKOFF_MAX_MS) -> None:
        super().__init__(initial_ms / 1000, max_ms / 1000, jitter=backoff.Jitter.NONE)


class AckPacer:
    """When the next ack is due: after a write, the last chunk's pace after the previous ack
    (0: at once); while idle, ``heartbeat_ms`` after it. Times are monotonic ms from the
    injected clock."""

    def __init__(self, clock: Clock, heartbeat_ms: int) -> None:
        self.clock = clock
        self.heartbeat_ms = heartbeat_ms
        self.pace_ms = 0
        """What the last chunk asked for (CommitLogChunk.ack_pace_ms), at most ACK_PACE_MAX_MS."""
        self.written = PhysicalOffset(0)
        self.acked = PhysicalOffset(-1)
        self._last_sent_ms: float | None = None

    def _now_ms(self) -> float:
        return self.clock.monotonic_s() * 1000

    def note_written(self, offset: PhysicalOffset, pace_ms: int = 0) -> None:
        self.written = max(self.written, offset)
        self.pace_ms = min(pace_ms, ACK_PACE_MAX_MS)

    def wait_ms(self) -> float:
        """Milliseconds until an ack is due (<= 0: send one now)."""
        if self._last_sent_ms is None:
            return 0.0
        gap = self.pace_ms if self.written > self.acked else self.heartbeat_ms
        return self._last_sent_ms + gap - self._now_ms()

    def sent(self, offset: PhysicalOffset) -> None:
        """An ack for ``offset`` went out. Below what was written, the store was cut back (a
        chunk refused for lack of room drops the partial record before it): nothing past it
        is left to ack, and without forgetting it every ack would ask for the next at once,
        in a loop that never waits (the data socket's acks do not wait for the writer)."""
        self.acked = offset
        self.written = min(self.written, offset)
        self._last_sent_ms = self._now_ms()


class DataSocketOffers:
    """Whether a hello offers to take the master's data socket: yes, but for a master address
    whose socket could not be reached, for :data:`DATA_SOCKET_RETRY_S` (a proxy or a port
    mapping keeps it unreachable; a network cut at the wrong moment does not)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._unreachable: dict[str, float] = {}
        """Master address -> when to offer again (monotonic s)."""

    def offer(self, addr: str) -> bool:
        again_s = self._unreachable.get(addr)
        if again_s is None:
            return True
        if self._clock.monotonic_s() < again_s:
            return False
        del self._unreachable[addr]
        return True

    def unreachable(self, addr: str) -> None:
        self._unreachable[addr] = self._clock.monotonic_s() + DATA_SOCKET_RETRY_S


class SlaveReplica:
    """What the stream's messages do to this slave's store (no I/O besides the store)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, broker_addr: str) -> None:
        self.config = config
        self.store = store
        self.broker_addr = broker_addr
        self.master_known_offset = PhysicalOffset(0)
        """The highest commitlog offset the master is known to hold (chunk ends, confirms)."""
        self.confirm_offset: PhysicalOffset | None = None
        """The master's last ConfirmOffset on the current stream."""

    def hello(self) -> replication_pb2.SlaveHello:
        return replication_pb2.SlaveHello(
            broker_name=self.config.broker_name,
            broker_id=self.config.broker_id,
            broker_addr=self.broker_addr,
            max_physical_offset=self.store.commitlog.max_offset,
            accepts_chunk_confirm=True,
            epochs=[
                replication_pb2.EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                for e in self.store.epochs.entries
            ],
        )

    def apply_truncate(self, msg: replication_pb2.TruncateTo) -> None:
        """Drop what the master does not share, take its epoch history, and bound reads."""
        ours = self.store.commitlog.max_offset
        target = PhysicalOffset(msg.physical_offset)
        if not 0 <= target <= ours:
            raise ProtocolError(f"TruncateTo {target} but this slave's commitlog ends at {ours}")
        if target < ours:
            log.warning(
                "truncating the commitlog from %d back to %d (master's history)", ours, target
            )
            self.store.truncate_replica(target)
        self.store.epochs.replace([EpochEntry(e.epoch, e.start_offset) for e in msg.epochs])
        self.confirm_offset = None
        bound = self.store.confirm_offset
        self.store.set_confirm_offset(target if bound is None else min(bound, target))
        self.master_known_offset = max(self.master_known_offset, target)

    def apply_chunk(self, physical_offset: int, data: bytes | memoryview) -> PhysicalOffset:
        """Write a chunk's data at our max offset (``data`` is not kept); returns the new max
        offset."""
        ours = self.store.commitlog.max_offset
        if physical_offset != ours:
            raise ProtocolError(
                f"chunk at {physical_offset} but this slave's commitlog ends at {ours}"
            )
        new_max = self.store.append_replica(ours, data)  # == physical_offset
        self.master_known_offset = max(self.master_known_offset, new_max)
        if self.confirm_offset is not None:
            self._bound_reads()  # a confirm that ran ahead of our data covers more now
        return new_max

    def apply_confirm(self, confirm_offset: int) -> None:
        self.confirm_offset = PhysicalOffset(confirm_offset)
        self.master_known_offset = max(self.master_known_offset, self.confirm_offset)
        self._bound_reads()

    def _bound_reads(self) -> None:
        assert self.confirm_offset is not None
        bound = min(self.confirm_offset, self.store.replica_dispatched_offset)
        current = self.store.confirm_offset
        if current is None or bound > current:
            self.store.set_confirm_offset(bound)

    def ack(self) -> replication_pb2.SlaveAck:
        written = self.store.commitlog.max_offset
        return replication_pb2.SlaveAck(
            max_physical_offset=written,
            flushed_offset=min(self.store.flusher.flushed_offset, written),
        )

    def behind_bytes(self) -> int:
        """A lower bound of how far this slave is behind its master."""
        return max(0, self.master_known_offset - self.store.replica_dispatched_offset)


class ReplicationClient:
    """The slave's replication task (see the module doc); ``connected`` while a stream lives."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        master_addr: Callable[[], str],
        broker_addr: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.clock = clock
        self.replica = SlaveReplica(config, store, broker_addr)
        self._master_addr = master_addr
        self.connected = False
        self.master_addr_in_use = ""
        self.connections = 0
        """Streams that reached TruncateTo (stats, tests)."""
        self.on_connected: list[Callable[[], None]] = []
        """Called each time a stream connects (config sync hooks in here)."""
        self.on_config_changed: list[Callable[[], None]] = []
        """Called when the master's ConfirmOffset.config_version changes within a stream."""
        self._config_version: int | None = None
        self._backoff = Backoff()
        self._channel: grpc.aio.Channel | None = None
        self._written = asyncio.Event()
        self._last_problem = ""
        self._store_full = False
        """The last stream ended on a full store: reconnects keep backing off and log nothing
        new (the store logged it) until a chunk is stored again."""
        self._closing = False
        self._call: Any = None
        self._call_addr = ""
        self._repointed = asyncio.Event()
        self._data_socket_offers = DataSocketOffers(clock)

    def close(self) -> None:
        """Stop replicating: end the current stream and let ``run`` return. Needed besides
        cancelling the task because Python 3.11's ``wait_for`` can swallow a cancellation that
        arrives as ``call.read()`` completes, which hung shutdowns now and then."""
        self._closing = True
        self._repointed.set()
        if self._call is not None:
            self._call.cancel()

    def reopen(self) -> None:
        """Allow :meth:`run` again after :meth:`close` (a demoted master becomes a slave)."""
        self._closing = False
        self._repointed.clear()
        self._backoff.reset()
        self._last_problem = ""

    def repoint(self) -> None:
        """The master changed: end a stream to another address and retry at once."""
        addr = self._master_addr()
        if self._call is not None and self._call_addr != addr:
            self._call.cancel()
        self._backoff.reset()
        self._repointed.set()

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Replicate until cancelled; never raises otherwise."""
        try:
            while not self._closing:
                delay_s = await self._connect_once() / 1000
                if self._repointed.is_set():
                    self._repointed.clear()
                    continue  # a new master: no backoff
                await wait_event(self._repointed, delay_s)
                self._repointed.clear()
        finally:
            self.connected = False
            if self._channel is not None:
                await self._channel.close()
                self._channel = None
            self.master_addr_in_use = ""  # a later run must open a channel again, even to it

    async def _connect_once(self) -> int:
        """One connection attempt and its stream; returns the delay before the next, in ms."""
        addr = self._master_addr()
        if not addr:
            self._problem("no master address yet (haMasterAddress unset, nameservers silent)")
            return self._backoff.next_delay_ms()
        if addr != self.master_addr_in_use:
            if self.master_addr_in_use:
                log.info("master address changed: %s -> %s", self.master_addr_in_use, addr)
            await self._use_channel(addr)
        try:
            await self._stream(addr)
            problem = "the master ended the stream"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._repointed.is_set() or self._closing or (task and task.cancelling()):
                raise
            problem = "the master changed"  # repoint() cancelled the call, not this task
        except grpc.aio.AioRpcError as exc:
            problem = f"{exc.code().name}: {exc.details()}"
        except TimeoutError:
            problem = f"no message from the master for {self.config.ha_housekeeping_interval_ms} ms"
        except StoreFullError as exc:
            problem = f"this slave's store is full, replication paused: {exc}"
            self._store_full = True
        except (ProtocolError, StoreError, ValueError, OSError, asyncio.InvalidStateError) as exc:
            # InvalidStateError: the ack writer hit a call the master had just ended.
            problem = f"{type(exc).__name__}: {exc}"
        finally:
            if self.connected:
                self.connected = False
                if not self._store_full:
                    log.warning("replication from master %s lost", addr)
        self._problem(f"replication from master {addr}: {problem}")
        return self._backoff.next_delay_ms()

    def _problem(self, text: str) -> None:
        if text != self._last_problem:  # once per distinct state, not on every retry
            log.warning("%s (retrying with backoff)", text)
            self._last_problem = text

    async def _use_channel(self, addr: str) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = security_channel(addr, PEER_CHANNEL_OPTIONS)
        self.master_addr_in_use = addr

    async def _stream(self, addr: str) -> None:
        assert self._channel is not None
        idle_s = self.config.ha_housekeeping_interval_ms / 1000
        stub = replication_pb2_grpc.ReplicationStub(self._channel)
        call: Any = stub.Stream()
        self._call = call
        self._call_addr = addr
        pacer = AckPacer(self.clock, self.config.ha_send_heartbeat_interval_ms)
        acks: asyncio.Task[None] | None = None
        try:
            hello = self.replica.hello()
            hello.accepts_data_socket = self._data_socket_offers.offer(addr)
            await call.write(replication_pb2.ReplicationStreamRequest(hello=hello))
            async with asyncio.timeout(idle_s):  # not wait_for: a stop's cancel must not be lost
                first = await call.read()
            if first is grpc.aio.EOF:
                return
            if first.WhichOneof("command") != "truncate":
                raise ProtocolError(f"first message is {first.WhichOneof('command')}, not truncate")
            self.replica.apply_truncate(first.truncate)
            self._on_connected(addr)
            pacer.note_written(self.store_max)
            if first.truncate.data_port:
                await self._data_socket(call, addr, first.truncate, pacer, idle_s)
                return

            async def send_ack(ack: replication_pb2.SlaveAck) -> None:
                await call.write(replication_pb2.ReplicationStreamRequest(ack=ack))

            acks = asyncio.create_task(self._ack_loop(send_ack, pacer), name="ha-slave-acks")
            loop = asyncio.get_running_loop()
            # One deadline moved per message, not a wait_for per read: wait_for makes a task
            # and a timer for every chunk, a tenth of a busy slave's CPU.
            async with asyncio.timeout(loop.time() + idle_s) as silence:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        return
                    silence.reschedule(loop.time() + idle_s)
                    self._apply(msg, pacer)
                    if acks.done():  # the writer failed: surface its error
                        await acks
        finally:
            if acks is not None:
                acks.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await acks
            call.cancel()
            self._call = None

    async def _data_socket(
        self,
        call: Any,
        addr: str,
        truncate: replication_pb2.TruncateTo,
        pacer: AckPacer,
        idle_s: float,
    ) -> None:
        """Replicate over the master's data socket (ha_wire) until either side closes it;
        the stream, which carries nothing more, then says how it ended."""
        host = addr.rsplit(":", 1)[0].strip("[]")
        # TLS exactly when this slave's channels use it (the master's socket follows its port).
        tls = default_security().ssl_context()

        def on_frame(
            kind: int, offset: int, data: memoryview, pace_ms: int, confirm: int, version: int
        ) -> None:
            if kind == ha_wire.CHUNK:
                self._apply_chunk(offset, data, pace_ms, pacer)
            elif kind != ha_wire.CONFIRM:
                raise ProtocolError(f"data socket frame of unknown kind {kind}")
            if confirm != ha_wire.NO_CONFIRM:
                self._apply_confirm(confirm, version)

        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(min(idle_s, ha_wire.TOKEN_WAIT_S)):
                transport, frames = await loop.create_connection(
                    lambda: ha_wire.FrameReader(on_frame),
                    host,
                    truncate.data_port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                )
        except (OSError, TimeoutError) as exc:
            # A master reached through a proxy or a port mapping: its data port may not be
            # reachable at that host. Replicate on the stream from the next connection on.
            self._data_socket_offers.unreachable(addr)
            raise ProtocolError(
                f"the master's replication data socket {host}:{truncate.data_port} is not "
                f"reachable ({type(exc).__name__}: {exc}); the data stays on the stream"
            ) from None
        ha_wire.no_delay(transport)
        transport.write(truncate.data_token)
        ended = asyncio.ensure_future(call.read())
        ended.add_done_callback(lambda _: transport.close())  # the socket's end follows

        async def send_ack(ack: replication_pb2.SlaveAck) -> None:
            # 16 bytes every few ms: no drain (a master that stops reading goes silent first)
            transport.write(ha_wire.ACK.pack(ack.max_physical_offset, ack.flushed_offset))

        acks = asyncio.create_task(self._ack_loop(send_ack, pacer), name="ha-slave-acks")
        try:
            # Frames are applied from the transport's read callback (FrameReader); here only
            # the socket's end and the master's silence are awaited, with no wake per frame.
            while not frames.ended.done():
                left_s = frames.last_frame_s + idle_s - loop.time()
                if left_s <= 0:
                    raise TimeoutError
                await asyncio.wait(
                    (frames.ended, acks), timeout=left_s, return_when=asyncio.FIRST_COMPLETED
                )
                if acks.done():  # the writer failed: surface its error
                    await acks
            try:
                frames.ended.result()
            except ha_wire.FrameError as exc:
                raise ProtocolError(str(exc)) from None
            # The socket ended: the stream says why (EOF after a clean end, else the status).
            async with asyncio.timeout(idle_s):
                last = await ended
            if last is not grpc.aio.EOF:
                raise ProtocolError("the master sent a stream message after the data socket")
        finally:
            acks.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await acks
            ended.cancel()
            transport.close()

    @property
    def store_max(self) -> PhysicalOffset:
        return self.replica.store.commitlog.max_offset

    def _apply(self, msg: replication_pb2.ReplicationStreamResponse, pacer: AckPacer) -> None:
        kind = msg.WhichOneof("command")
        if kind == "chunk":
            chunk = msg.chunk
            self._apply_chunk(chunk.physical_offset, chunk.data, chunk.ack_pace_ms, pacer)
            if chunk.HasField("confirm"):  # sent with the data (accepts_chunk_confirm)
                self._apply_confirm(chunk.confirm.confirm_offset, chunk.confirm.config_version)
        elif kind == "confirm":
            self._apply_confirm(msg.confirm.confirm_offset, msg.confirm.config_version)
        else:
            raise ProtocolError(f"unexpected {kind} after the stream started")

    def _apply_chunk(
        self, offset: int, data: bytes | memoryview, pace_ms: int, pacer: AckPacer
    ) -> None:
        pacer.note_written(self.replica.apply_chunk(offset, data), pace_ms)
        self._written.set()
        if self._store_full:
            self._store_full = False
            self._backoff.reset()
            self._last_problem = ""
            log.info("replication resumed: the store has room again")

    def _apply_confirm(self, confirm_offset: int, config_version: int) -> None:
        self.replica.apply_confirm(confirm_offset)
        self._note_config_version(config_version)

    def _note_config_version(self, version: int) -> None:
        """The first version of a stream only sets the baseline (connecting syncs anyway)."""
        seen, self._config_version = self._config_version, version
        if seen is None or seen == version:
            return
        for callback in list(self.on_config_changed):
            try:
                callback()
            except Exception:
                log.exception("replication on_config_changed callback failed")

    def _on_connected(self, addr: str) -> None:
        self._config_version = None
        self.connected = True
        self.connections += 1
        if self._store_full:  # a retry while the disk is full: keep the backoff, stay quiet
            log.debug("retrying replication from %s at %d (store full)", addr, self.store_max)
        else:
            self._backoff.reset()
            self._last_problem = ""
            log.info("replicating from master %s at commitlog offset %d", addr, self.store_max)
        for callback in list(self.on_connected):
            try:
                callback()
            except Exception:
                log.exception("replication on_connected callback failed")

    async def _ack_loop(
        self, send: Callable[[replication_pb2.SlaveAck], Awaitable[None]], pacer: AckPacer
    ) -> None:
        while True:
            wait_ms = pacer.wait_ms()
            if wait_ms > 0 and pacer.written > pacer.acked:
                # An ack is due at a known time: sleep to it. Waking on every chunk that lands
                # meanwhile only to wait again cost a task and a timer per chunk.
                await asyncio.sleep(wait_ms / 1000)
                continue
            if wait_ms > 0:
                self._written.clear()  # idle: the next write or the heartbeat, whichever first
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_ms / 1000):
                        await self._written.wait()
                continue
            ack = self.replica.ack()
            await send(ack)
            pacer.sent(PhysicalOffset(ack.max_physical_offset))

    # -- stats -----------------------------------------------------------------------------
    def runtime_extra(self) -> dict[str, str]:
        """Named values for GetRuntimeStats ``extra`` on a slave."""
        return {
            "master_addr": self.master_addr_in_use or self._master_addr(),
            "replication_connected": "true" if self.connected else "false",
            "replication_behind_bytes": str(self.replica.behind_bytes()),
        }
