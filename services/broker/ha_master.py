"""The master side of replication: the ``rocketq.v1.Replication`` service (replication.proto).

One :class:`ReplicationService` per broker, registered on the broker's normal gRPC port (the
master advertises that address as its ha_server_addr). On a slave every call is answered
UNAVAILABLE NOT_MASTER, so a slave pointed at another slave learns why at once.

**Stream**, per slave::

    hello ──▶ validate (proto statuses) ──▶ TruncateTo(consistent offset, master epochs)
              then, until the slave goes away or stays silent for haHousekeepingInterval:
    ◀── acks (reader task) ── ReplicaTracker.on_ack ── may advance the confirm offset,
                                                      resolve SYNC_MASTER waiters
    ──▶ CommitLogChunk: store.read_replica(sent, n), n = min(haTransferBatchSize,
        haMaxInFlightBytes - (sent - acked)); nothing is read while the window is full, nor,
        while haSmallChunksInFlightMax chunks are unacked, while what is new fills no chunk
        each chunk says how soon to ack it (``ack_pace_ms``: at once, or a few ms while this
        broker's event loop is busy; ``ha_pacing``)
    ──▶ ConfirmOffset: whenever it (or the topic/group tables) changes, and every
        CONFIRM_HEARTBEAT_S; inside the chunk that goes out with it when the slave's hello
        set accepts_chunk_confirm (one stream message instead of two)

**The data socket** (``ha_wire``): when the hello offers to take it and this broker has one
(haListenPort, no TLS), TruncateTo names its port and a token; the slave connects there, and
the chunks, confirm offsets and acks above travel on that socket as frames, not as stream
messages. The stream stays open with nothing more on it and ends as before, its status saying
why (an ack refused on the socket is INVALID_ARGUMENT here; a slave that does not connect within
haHousekeepingInterval, UNAVAILABLE).

The sender sleeps on its link's ``wake`` event, set by a store arrival listener (new bytes),
by acks (window opened) and by confirm changes; it never polls. The arrival listener costs the
send path one event set per connected slave: a slow slave only falls behind, it never slows a
producer (only SYNC_MASTER sends wait, at most syncFlushTimeout, in :class:`HaWaiter`).

**SyncConfig** answers the tables whose version differs from the slave's (``ha_sync_tables``)
after merging the slave's offsets that are ahead of the master's.

Bookkeeping (in-sync set, confirm offset, waiters, lag) is ``ha_tracker``; this module is the
wire around it.

**Role switches** (controller mode, ``services.broker.roles``): :meth:`ReplicationService.promote`
starts the master side on a promoted slave (empty in-sync set, ISR publishing task);
:meth:`ReplicationService.demote_now` (synchronous, on losing the lease) fails SYNC_MASTER
waiters with NOT_MASTER and ends every stream, :meth:`ReplicationService.demote` also stops the
tasks. The ISR publisher publishes ``tracker.wanted_isr()`` whenever it differs from what etcd
holds, retrying every ``ISR_RETRY_S`` after a failure.
"""

# ruff: noqa: N802  (servicer methods carry the proto's RPC names)

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple, TypeAlias

import grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    common_pb2,
    replication_pb2,
    replication_pb2_grpc,
)
from services.broker import ha_wire
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.ha_pacing import LoopLoad
from services.broker.ha_sync_tables import SyncTables
from services.broker.ha_tracker import (
    HaWaiter,
    PublishIsr,
    ReplicaTracker,
    SlaveLink,
    leadership_lost_error,
)
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError, invalid, precondition, rpc, rpc_stream
from services.common.security.tls import ServerContexts
from services.store.epoch_file import EpochEntry, check_history, consistent_offset
from services.store.errors import ReplicaRangeError
from services.store.message_store import MessageStore
from services.store.types import PhysicalOffset

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

CONFIRM_HEARTBEAT_S = 5.0
"""A ConfirmOffset goes out at least this often (the proto's "at least every 5 s"; it is also
what tells an idle slave that its master is alive)."""
HOUSEKEEPING_TICK_MAX_S = 1.0
"""How often silent slaves and in-sync membership are re-checked (at most)."""
ISR_RETRY_S = 0.5
"""Pause before publishing the in-sync replica set again after a failure."""


def _not_master(config: BrokerConfig) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        common_pb2.NOT_MASTER,
        f"broker {config.broker_name} id {config.broker_id} is not a master; replicate from "
        "broker id 0 of this group",
    )


def check_hello(hello: replication_pb2.SlaveHello, config: BrokerConfig) -> list[EpochEntry]:
    """The hello's epoch history, after the proto's checks (ServiceError on failure)."""
    if not hello.broker_name:
        invalid(common_pb2.ILLEGAL_ARGUMENT, "SlaveHello.broker_name is empty")
    if hello.broker_id < 1:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"SlaveHello.broker_id {hello.broker_id}: a slave's broker id is >= 1",
        )
    if hello.max_physical_offset < 0:
        invalid(
            common_pb2.ILLEGAL_ARGUMENT,
            f"SlaveHello.max_physical_offset {hello.max_physical_offset} is negative",
        )
    epochs = [EpochEntry(e.epoch, e.start_offset) for e in hello.epochs]
    problem = check_history(epochs)
    if problem:
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"SlaveHello.epochs: {problem}")
    if hello.broker_name != config.broker_name:
        precondition(
            f"slave of group {hello.broker_name!r} connected to the master of "
            f"{config.broker_name!r}; check its brokerName and haMasterAddress",
            broker_name=config.broker_name,
        )
    return epochs


def truncate_point(
    master: list[EpochEntry],
    master_min: PhysicalOffset,
    master_max: PhysicalOffset,
    slave: list[EpochEntry],
    slave_max: PhysicalOffset,
) -> PhysicalOffset:
    """Where the slave must truncate to, or a ServiceError: FAILED_PRECONDITION when the
    slave has seen a newer epoch than this master, OUT_OF_RANGE when streaming would have to
    start below the master's oldest retained byte."""
    master_last = master[-1].epoch if master else 0
    if slave and slave[-1].epoch > master_last:
        precondition(
            f"the slave's epoch history reaches epoch {slave[-1].epoch}, newer than this "
            f"master's {master_last}: this broker is stale and must step down"
        )
    point = consistent_offset(master, master_max, slave, slave_max)
    if point < master_min:
        raise ServiceError(
            grpc.StatusCode.OUT_OF_RANGE,
            common_pb2.ERROR_REASON_UNSPECIFIED,
            f"the slave would resume at commitlog offset {point} but the master keeps bytes "
            f"from {master_min} only (retention deleted the rest); start the slave on an empty "
            "store directory copied from the master, or from a fresh master",
        )
    return point


def _epochs_pb(entries: list[EpochEntry]) -> list[replication_pb2.EpochEntry]:
    return [replication_pb2.EpochEntry(epoch=e.epoch, start_offset=e.start_offset) for e in entries]


class ReplicationService(replication_pb2_grpc.ReplicationServicer):
    """Serves slaves: commitlog streams and config sync; owns the :class:`ReplicaTracker`."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.tracker = ReplicaTracker(
            config,
            clock,
            max_offset=lambda: store.commitlog.max_offset,
            apply_bound=self._apply_bound,
            record_time_ms=self._record_time_ms,
        )
        self.tables = SyncTables(topics=topics, groups=groups, offsets=offsets, clock=clock)
        self.load = LoopLoad(clock)
        """How busy this broker's event loop is: sets each chunk's ack_pace_ms."""
        self.config_version = 0
        """Bumped on every topic or group table change; sent in ConfirmOffset."""
        topics.on_change.append(self._config_changed)
        groups.on_change.append(self._config_changed)
        self.data_listener: ha_wire.DataListener | None = None
        """The data socket (ha_wire), once :meth:`open_data_socket` has bound it."""
        self._task: asyncio.Task[None] | None = None
        self._isr_task: asyncio.Task[None] | None = None
        self._started = False

    @property
    def waiter(self) -> HaWaiter:
        """The SYNC_MASTER send path's hook."""
        return self.tracker.waiter

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, *, force: bool = False) -> None:
        """On a master: listen to appends and start housekeeping (needs a running loop).
        ``force``: start even though ``is_master`` is still False (a promotion in progress:
        the config turns master right after)."""
        if not (force or self.config.is_master) or self._started:
            return
        self._started = True
        self.tracker.samples.covered_from = self.store.commitlog.max_offset
        self.store.dispatcher.listeners.append(self._on_arrival)
        self._task = asyncio.create_task(self._housekeeping_loop(), name="ha-housekeeping")
        if self.tracker.publish_isr is not None:
            self._isr_task = asyncio.create_task(self._isr_loop(), name="ha-isr-publisher")

    async def open_data_socket(self, tls: ServerContexts | None = None) -> None:
        """Bind the data socket (haListenPort on listenAddress) unless it is off (-1); with
        ``tls`` (the gRPC port's TLS) it serves TLS too."""
        cfg = self.config
        if cfg.ha_listen_port < 0 or self.data_listener is not None:
            return
        ssl_context = tls.base if tls is not None else None
        listener = ha_wire.DataListener(cfg.listen_host, cfg.ha_listen_port, ssl_context)
        port = await listener.start()
        self.data_listener = listener
        log.info(
            "replication data socket on %s:%d%s", cfg.listen_host, port, " (TLS)" if tls else ""
        )

    async def stop(self) -> None:
        """End every stream (their slaves reconnect to whoever is master next)."""
        self.tracker.close_all("the master is shutting down")
        await self._stop_tasks()
        if self.data_listener is not None:
            await self.data_listener.close()
            self.data_listener = None

    async def _stop_tasks(self) -> None:
        tasks = [t for t in (self._task, self._isr_task) if t is not None]
        self._task = self._isr_task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._started:
            self._started = False
            with contextlib.suppress(ValueError):
                self.store.dispatcher.listeners.remove(self._on_arrival)

    # -- role switches (controller mode, services.broker.roles) ------------------------------
    def promote(self, publish: PublishIsr, previous_isr: set[int], old_leader: int) -> None:
        """Become the group's master: the in-sync set starts empty, ``previous_isr`` (etcd's)
        is retained as published, streams are accepted from now on (the caller flips the
        config right after), and ISR changes are published through ``publish``."""
        tracker = self.tracker
        tracker.reset()
        tracker.enable_isr_publishing(
            publish, previous_isr, self.store.commitlog.max_offset, old_leader
        )
        self.start(force=True)

    def demote_now(self) -> PhysicalOffset:
        """Synchronous part of stepping down (the config is already a slave's): fail waiting
        SYNC_MASTER sends with NOT_MASTER, end every slave stream, stop publishing. Returns
        the offset readers may see (the confirm offset when demoted)."""
        visible = self.tracker.confirm_offset()
        failed = self.tracker.waiter.fail_all(leadership_lost_error())
        if failed:
            log.warning("%d sends waiting for replication answered NOT_MASTER (demoted)", failed)
        self.tracker.reset()
        return visible

    async def demote(self) -> None:
        """:meth:`demote_now` (if not done yet) and stop the master-only tasks."""
        if self._started:
            self.demote_now()
        await self._stop_tasks()

    async def _isr_loop(self) -> None:
        """Publish the wanted ISR whenever it differs from the published one; a failed
        publish is retried (the shrink it carries keeps sends waiting until then)."""
        tracker = self.tracker
        problem = ""
        while True:
            await tracker.isr_wake.wait()
            tracker.isr_wake.clear()
            publish = tracker.publish_isr
            if publish is None or tracker.published is None:
                continue
            wanted = tracker.wanted_isr()
            if wanted == tracker.published | {self.config.replica_id}:
                continue
            try:
                ok = await publish(set(wanted))
                why = "refused (not the leader any more?)"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd trouble: retried below
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if ok and tracker.publish_isr is publish:
                tracker.isr_published(wanted)
                problem = ""
                continue
            if why != problem:
                log.warning("publishing the in-sync replica set %s failed: %s", sorted(wanted), why)
                problem = why
            await asyncio.sleep(ISR_RETRY_S)
            tracker.isr_wake.set()

    def _config_changed(self) -> None:
        """A table changed: every stream sends a ConfirmOffset carrying the new version, and
        its slave syncs at once (replication.proto, ConfirmOffset.config_version)."""
        self.config_version += 1
        for link in list(self.tracker.links.values()):
            link.wake.set()

    def _on_arrival(self, _requests: object) -> None:
        self.tracker.on_append()

    async def _housekeeping_loop(self) -> None:
        while True:
            tick_s = min(HOUSEKEEPING_TICK_MAX_S, self.config.ha_housekeeping_interval_ms / 4000)
            await asyncio.sleep(tick_s)
            try:
                self.tracker.housekeep()
            except Exception:  # housekeeping must outlive any one bad pass
                log.exception("replication housekeeping failed")

    # -- store glue ------------------------------------------------------------------------
    def _apply_bound(self, bound: PhysicalOffset | None) -> None:
        # None lifts the bound (no in-sync slave); the store's confirm listeners wake held
        # pulls whenever the bound advances or is lifted.
        self.store.set_confirm_offset(bound)

    def _record_time_ms(self, offset: PhysicalOffset) -> int | None:
        try:
            record = self.store.read_record(offset)
        except Exception:  # a BLANK filler or a deleted file: the age is simply unknown
            return None
        return record.store_timestamp_ms if record is not None else None

    # -- stats -----------------------------------------------------------------------------
    def slave_stats(self) -> list[admin_pb2.SlaveStats]:
        """Connected slaves, for GetRuntimeStats."""
        return self.tracker.slave_stats()

    def confirm_offset(self) -> PhysicalOffset:
        """The confirm offset as GetRuntimeStats reports it."""
        return self.tracker.confirm_offset()

    # -- Stream ----------------------------------------------------------------------------
    @rpc_stream
    async def Stream(
        self,
        request_iterator: AsyncIterator[replication_pb2.ReplicationStreamRequest],
        context: Context,
    ) -> AsyncIterator[replication_pb2.ReplicationStreamResponse]:
        cfg = self.config
        requests = request_iterator.__aiter__()
        try:
            first = await requests.__anext__()
        except StopAsyncIteration:
            return
        # Checked after the hello is read, not before: ending the call before the caller's
        # first write lands made that write fail with INTERNAL instead of this status.
        if not cfg.is_master:
            raise _not_master(cfg)
        if first.WhichOneof("command") != "hello":
            invalid(common_pb2.ILLEGAL_ARGUMENT, "the first message on Stream must be a SlaveHello")
        hello = first.hello
        slave_epochs = check_hello(hello, cfg)
        store = self.store
        master_epochs = store.epochs.entries
        point = truncate_point(
            master_epochs,
            store.commitlog.min_offset,
            store.commitlog.max_offset,
            slave_epochs,
            PhysicalOffset(hello.max_physical_offset),
        )
        link = self.tracker.connect(hello.broker_id, hello.broker_addr, point)
        link.chunk_confirm = hello.accepts_chunk_confirm
        failure: list[ServiceError] = []
        truncate = replication_pb2.TruncateTo(
            physical_offset=point, epochs=_epochs_pb(master_epochs)
        )
        data = self.data_listener if hello.accepts_data_socket else None
        token = b""
        connected: asyncio.Future[ha_wire.Connection] | None = None
        if data is not None:
            token, connected = data.expect()
            truncate.data_port, truncate.data_token = data.port, token
            # Nothing more may come on the stream; its end (the slave went away) ends the link.
            reader = asyncio.create_task(self._read_acks(_nothing_more(requests), link, failure))
        else:
            reader = asyncio.create_task(self._read_acks(_acks_of(requests), link, failure))
        writer: asyncio.StreamWriter | None = None
        acks: asyncio.Task[None] | None = None
        try:
            yield replication_pb2.ReplicationStreamResponse(truncate=truncate)
            if connected is None:
                async for out in self._send_loop(link):
                    yield _response(out)
            else:
                socket_reader, writer = await self._data_connection(
                    link, connected, reader, failure
                )
                link.on_close.append(writer.transport.abort)  # unblocks a stuck drain
                acks = asyncio.create_task(
                    self._read_acks(ha_wire.read_acks(socket_reader), link, failure)
                )
                try:
                    async for out in self._send_loop(link):
                        _write_frame(writer, out)
                        await writer.drain()
                except OSError as exc:  # reset or broken: the slave went away
                    self.tracker.close(link, f"the data socket broke: {exc}")
            if failure:
                raise failure[0]
            if link.close_reason and link.close_reason != "stream ended":
                raise ServiceError(
                    grpc.StatusCode.UNAVAILABLE,
                    common_pb2.SERVICE_NOT_AVAILABLE,
                    f"replication stream closed by the master: {link.close_reason}",
                )
        finally:
            ha_wire.close(writer)
            if data is not None:
                data.forget(token)
            for task in (reader, acks):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            self.tracker.close(link, link.close_reason or "stream ended")

    async def _data_connection(
        self,
        link: SlaveLink,
        connected: asyncio.Future[ha_wire.Connection],
        stream_reader: asyncio.Task[None],
        failure: list[ServiceError],
    ) -> ha_wire.Connection:
        """The slave's data socket, once it connects with its token; UNAVAILABLE if it does
        not within haHousekeepingInterval (or its stream ends first), the stream reader's
        error if the slave broke the protocol there first."""
        wait_s = self.config.ha_housekeeping_interval_ms / 1000
        # This wait has its own deadline and status: the housekeeping's silence rule (the same
        # interval) must not race it with a vaguer one.
        link.last_heard_s = float("inf")
        try:
            done, _ = await asyncio.wait(
                (connected, stream_reader), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            link.last_heard_s = self.clock.monotonic_s()
        if connected in done:
            return connected.result()
        if failure:  # e.g. a stream message sent before its token reached this broker
            raise failure[0]
        port = self.data_listener.port if self.data_listener is not None else 0
        reason = link.close_reason or (
            f"the slave did not connect to the replication data socket (port {port}) within "
            f"haHousekeepingInterval ({wait_s:g} s)"
        )
        self.tracker.close(link, reason)
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            common_pb2.SERVICE_NOT_AVAILABLE,
            f"replication stream closed by the master: {reason}",
        )

    async def _read_acks(
        self,
        acks: AsyncIterator[tuple[int, int]],
        link: SlaveLink,
        failure: list[ServiceError],
    ) -> None:
        """(max offset, flushed offset) of every ack into the tracker; a protocol error or the
        end of the slave's side closes the link."""
        reason = "stream ended"
        try:
            async for max_offset, flushed_offset in acks:
                if link.closed:
                    return
                try:
                    self.tracker.on_ack(
                        link, PhysicalOffset(max_offset), PhysicalOffset(flushed_offset)
                    )
                except ValueError as exc:
                    raise ServiceError(
                        grpc.StatusCode.INVALID_ARGUMENT, common_pb2.ILLEGAL_ARGUMENT, str(exc)
                    ) from None
        except ServiceError as exc:
            failure.append(exc)
            reason = exc.message
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport broke: the sender ends, the slave reconnects
            reason = f"reading acks failed: {type(exc).__name__}: {exc}"
        self.tracker.close(link, reason)

    async def _send_loop(self, link: SlaveLink) -> AsyncIterator[Outgoing]:
        """Chunks within the in-flight window and confirm offsets, until the link closes."""
        cfg = self.config
        store = self.store
        tracker = self.tracker
        confirm_sent = PhysicalOffset(-1)
        confirm_sent_s = float("-inf")
        version_sent = self.config_version
        while not link.closed:
            link.wake.clear()  # cleared before looking, so nothing set meanwhile is lost
            confirm = tracker.confirm_offset()
            version = self.config_version
            now_s = self.clock.monotonic_s()
            confirm_due = (
                confirm != confirm_sent
                or version != version_sent
                or now_s - confirm_sent_s >= CONFIRM_HEARTBEAT_S
            )
            data = b""
            batch = min(cfg.ha_transfer_batch_size, ha_wire.CHUNK_BYTES_MAX)
            want = link.chunk_bytes(batch, cfg.ha_max_in_flight_bytes)
            if (
                want > 0
                and link.sent_offset < store.commitlog.max_offset
                and (link.chunk_confirm or not confirm_due)
                and not self._holds_small_chunk(link, want)
            ):
                data = self._read(link, want)
            if confirm_due:
                confirm_sent, confirm_sent_s, version_sent = confirm, now_s, version
            if data:
                # With a due confirm inside (a slave that accepts it): one stream message, not
                # two, per ack while data flows - each costs both brokers a gRPC write or read.
                offset = link.sent_offset
                link.sent_offset = PhysicalOffset(offset + len(data))
                link.chunk_ends.append(link.sent_offset)
                pace_ms = self.load.ack_pace_ms()
                yield Outgoing(offset, data, confirm if confirm_due else None, version, pace_ms)
            elif confirm_due:
                yield Outgoing(link.sent_offset, b"", confirm, version, 0)
            if confirm_due:
                tracker.on_confirm_sent(link, confirm)
            if data or confirm_due:
                continue
            wait_s = max(0.0, CONFIRM_HEARTBEAT_S - (now_s - confirm_sent_s))
            # asyncio.timeout, not wait_for: no task per wait (the sender waits once or twice
            # per chunk under load).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await link.wake.wait()

    def _holds_small_chunk(self, link: SlaveLink, want: int) -> bool:
        """Nagle's rule (haSmallChunksInFlightMax): with that many chunks unacked, what is new
        waits for an ack unless it fills a chunk. Under load an ack round trip then carries
        the appends of many sends in one stream message; each message costs both brokers a
        gRPC write or read, far more than the bytes."""
        held_max = self.config.ha_small_chunks_in_flight_max
        return (
            held_max > 0
            and len(link.chunk_ends) >= held_max
            and self.store.commitlog.max_offset - link.sent_offset < want
        )

    def _read(self, link: SlaveLink, max_bytes: int) -> bytes:
        try:
            return self.store.read_replica(link.sent_offset, max_bytes)
        except ReplicaRangeError as exc:
            raise ServiceError(
                grpc.StatusCode.OUT_OF_RANGE,
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"slave {link.broker_id} needs commitlog offset {link.sent_offset}, which the "
                f"master no longer holds ({exc}); start the slave on a fresh store",
            ) from None

    # -- SyncConfig ------------------------------------------------------------------------
    @rpc
    async def SyncConfig(
        self, request: replication_pb2.SyncConfigRequest, context: Context
    ) -> replication_pb2.SyncConfigResponse:
        cfg = self.config
        if not cfg.is_master:
            raise _not_master(cfg)
        if not request.broker_name:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "SyncConfigRequest.broker_name is empty")
        if request.broker_name != cfg.broker_name:
            precondition(
                f"slave of group {request.broker_name!r} asked the master of "
                f"{cfg.broker_name!r} for its config",
                broker_name=cfg.broker_name,
            )
        try:
            merged = self.tables.merge_slave_offsets(request.slave_offsets)
        except ValueError as exc:
            invalid(common_pb2.ILLEGAL_ARGUMENT, str(exc))
        if merged:
            log.info("merged %d consumer offsets committed on slave %d", merged, request.broker_id)
        return self.tables.response(request)


class Outgoing(NamedTuple):
    """What the sender sends next: a chunk (``data``, with a confirm offset riding along or
    not), or a confirm offset alone (empty ``data``)."""

    offset: int
    data: bytes
    confirm: int | None
    config_version: int
    ack_pace_ms: int


async def _acks_of(
    requests: AsyncIterator[replication_pb2.ReplicationStreamRequest],
) -> AsyncIterator[tuple[int, int]]:
    """The stream's messages after the hello: SlaveAcks only."""
    async for req in requests:
        if req.WhichOneof("command") != "ack":
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                common_pb2.ILLEGAL_ARGUMENT,
                "after the SlaveHello a slave sends only SlaveAcks",
            )
        yield req.ack.max_physical_offset, req.ack.flushed_offset


async def _nothing_more(
    requests: AsyncIterator[replication_pb2.ReplicationStreamRequest],
) -> AsyncIterator[tuple[int, int]]:
    """The stream after the hello of a slave given a data socket: its acks go there."""
    async for _req in requests:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            common_pb2.ILLEGAL_ARGUMENT,
            "a slave that took the data socket sends its acks there, nothing more on Stream",
        )
        yield 0, 0  # pragma: no cover  (makes this an async generator)


def _write_frame(writer: asyncio.StreamWriter, out: Outgoing) -> None:
    confirm = ha_wire.NO_CONFIRM if out.confirm is None else out.confirm
    if out.data:
        head = ha_wire.FRAME.pack(
            ha_wire.CHUNK, out.offset, len(out.data), out.ack_pace_ms, confirm, out.config_version
        )
        writer.write(head)
        writer.write(out.data)
    else:
        head = ha_wire.FRAME.pack(ha_wire.CONFIRM, out.offset, 0, 0, confirm, out.config_version)
        writer.write(head)


def _response(out: Outgoing) -> replication_pb2.ReplicationStreamResponse:
    """A stream message, its fields set in place. Passing the chunk to the response's
    constructor instead would serialize and re-parse it (upb merges a message argument): 120 us
    for a 135 KiB chunk, against 4 us this way."""
    resp = replication_pb2.ReplicationStreamResponse()
    if not out.data:
        assert out.confirm is not None
        resp.confirm.confirm_offset = out.confirm
        resp.confirm.config_version = out.config_version
        return resp
    chunk = resp.chunk
    chunk.physical_offset = out.offset
    chunk.data = out.data
    chunk.ack_pace_ms = out.ack_pace_ms
    if out.confirm is not None:
        chunk.confirm.confirm_offset = out.confirm
        chunk.confirm.config_version = out.config_version
    return resp
