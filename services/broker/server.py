"""Broker process wiring: config → store → managers → gRPC services → registration.

Everything runs on one asyncio event loop (DESIGN.md §1): handlers, dispatch, long polling and
the background loops below. Only fsyncs leave the loop (the store's flush thread).

Startup order matters:
1. bind the port first, so the advertised address (written into every record's store host and
   every offset message id) is known before the store opens;
2. open the store (recovery) and load topics, groups and offsets;
3. start serving, then register with every nameserver — a broker is routable only when it can
   answer;
4. write the ready file.

Shutdown (SIGTERM/SIGINT) runs the reverse: health NOT_SERVING, unregister from the
nameservers (clients stop choosing us at their next route refresh), stop accepting calls with a
short grace, persist consumer offsets, then the store's clean shutdown (flush, checkpoint,
remove ``abort``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Mapping
from pathlib import Path

import grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2_grpc,
    nameserver_pb2,
    replication_pb2_grpc,
)
from services.broker import config as broker_config
from services.broker import metrics as broker_metrics
from services.broker.admin_runtime import runtime_stats
from services.broker.admin_service import AdminService
from services.broker.client_manager import ClientManager
from services.broker.cluster_topics import learn_cluster_topics
from services.broker.config import BrokerConfig
from services.broker.config_overrides import load_effective
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.controller import EtcdController
from services.broker.drain import Drainer
from services.broker.ha_config_sync import ConfigSync, SlaveOffsetCommits
from services.broker.ha_master import ReplicationService
from services.broker.ha_slave import ReplicationClient
from services.broker.messaging_service import MessagingService
from services.broker.model import TopicConfig
from services.broker.pop.revive import ReviveService
from services.broker.pull_hold import PullHoldService
from services.broker.rebalance_lock import RebalanceLockManager
from services.broker.registration import BrokerRegistrar
from services.broker.roles import RoleManager, SlaveSide
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.broker.transaction_check import TransactionCheckService
from services.broker.transaction_half import TransactionIndex
from services.common import grpc_server
from services.common.bootstrap import ServiceSpec, run_service
from services.common.clock import clock_from_env
from services.common.security.settings import ServiceSecurity
from services.common.security.tls import ServerContexts
from services.store.message_store import MessageStore

log = logging.getLogger("rocketq.broker")

SERVICE_NAMES = ("rocketq.v1.Messaging", "rocketq.v1.Admin", "rocketq.v1.Replication")
SHUTDOWN_GRACE_S = 1.0
TASK_STOP_TIMEOUT_S = 5.0


class Broker:
    """One broker process's components, started and stopped in order."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.clock = clock_from_env()  # ROCKETQ_CLOCK_SPEED runs long delays fast in tests
        self.security = ServiceSecurity(config, "broker")  # sec: TLS and ACL
        self.security.install_client_default()  # registration, replication, fan-out channels
        self.server = grpc_server.create_server(self.security)
        self.advertised_addr = ""
        self.gateway_server: grpc.aio.Server | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.stopped = asyncio.Event()
        self.ha_slave: ReplicationClient | None = None
        """On a slave: the replication stream to its master (``runtime_extra()`` for stats)."""
        self.config_sync: ConfigSync | None = None
        self.roles: RoleManager | None = None
        """Controller mode (etcdEndpoints): switches roles as the etcd election decides."""
        self.controller: EtcdController | None = None

    async def start(self) -> str:
        config_dir = self._open_store()
        self._load_managers(config_dir)
        admin = self._build_services(config_dir)
        await self.store.start()
        await self.server.start()
        await self._start_gateway(admin)
        # On every broker (a slave may be promoted), with the gRPC port's TLS when it has one.
        tls = self.security.tls
        await self.replication.open_data_socket(ServerContexts(tls) if tls.enabled else None)
        self.replication.start()  # masters only: streams to slaves, SYNC_MASTER waits
        self._start_background(admin)
        broker_metrics.install(lambda: runtime_stats(admin), self.offsets, self.store)
        await self._go_live()
        cfg = self.config
        log.info(
            "broker %s (cluster %s, id %d) serving at %s, store %s",
            cfg.broker_name,
            cfg.cluster_name,
            cfg.broker_id,
            self.advertised_addr,
            cfg.store_dir,
        )
        return self.advertised_addr

    async def _start_gateway(self, admin: AdminService) -> None:
        """The apache.rocketmq.v2 gateway on its own server, when gatewayPort is set (and its
        connected clients for the Admin RPC AskGatewayClient)."""
        cfg = self.config
        if cfg.gateway_port <= 0:
            return
        # Imported only when on: its classes are generated at setup (tools/gen_protos.py --v2),
        # and a broker without the gateway must start without them.
        from services.broker.gateway.auth import GatewayAclGuard  # noqa: PLC0415
        from services.broker.gateway.service import (  # noqa: PLC0415
            SERVICE_NAME,
            GatewayService,
            add_to_server,
        )

        acl = self.security.acl if self.security.acl_enable else None
        # The official SDKs sign like RocketQ's own: the same users, rules and refusals, said
        # in the v2 protocol's statuses (gateway/auth.py)
        server = grpc_server.create_server(acl_guard=GatewayAclGuard(acl) if acl else None)
        gateway = GatewayService(
            config=cfg, messaging=self.messaging, host=cfg.advertised_host, port=cfg.gateway_port
        )
        add_to_server(gateway, server)
        # TLS like the broker's own port when it is configured (the official SDKs take a CA)
        grpc_server.finish_setup(
            server, [SERVICE_NAME], f"{cfg.listen_host}:{cfg.gateway_port}", self.security
        )
        await server.start()
        self.gateway_server = server
        admin.gateway_commands = gateway.commands
        self._spawn(gateway.renew.run())
        log.info(
            "apache.rocketmq.v2 gateway serving at %s:%d", cfg.advertised_host, cfg.gateway_port
        )

    def _open_store(self) -> Path:
        """Bind the port first: the advertised address is written into every record the store
        appends. Then recover the store. Returns its config dir."""
        cfg = self.config
        health, port = grpc_server.finish_setup(
            self.server, SERVICE_NAMES, f"{cfg.listen_host}:{cfg.listen_port}", self.security
        )
        self.health = health
        # brokerHostName (a stable DNS name) when set; the store host stays brokerIP1's address
        self.advertised_addr = f"{cfg.advertised_name or cfg.advertised_host}:{port}"
        store_cfg = cfg.store_config(advertised_port=port)
        self.store = MessageStore(store_cfg, clock=self.clock)
        report = self.store.open()
        log.info("store opened: %s", report)
        return store_cfg.config_dir

    def _load_managers(self, config_dir: Path) -> None:
        """Topics, groups, offsets, clients, held pulls, locks, registration, transactions."""
        cfg = self.config
        self.topics = TopicConfigManager(cfg, config_dir, self.clock)
        self.topics.load()
        self.groups = SubscriptionGroupManager(cfg, config_dir)
        self.groups.load()
        self.offsets = ConsumerOffsetManager(config_dir, self.clock)
        self.offsets.load()
        self.clients = ClientManager(cfg, self.clock, group_config=self.groups.get)
        self.hold = PullHoldService(cfg, self.store, self.clock)
        self.locks = RebalanceLockManager(cfg, self.clock)
        self.registrar = BrokerRegistrar(
            cfg.namesrv_addrs,
            self._registration,
            period_ms=cfg.register_name_server_period_ms,
        )
        self.topics.on_change.append(self.registrar.trigger)
        # Which transactions are resolved: read back from the two transaction topics before
        # serving, so a repeated EndTransaction after a restart still changes nothing.
        self.transactions = TransactionIndex()
        if cfg.is_master:
            self.transactions.rebuild(self.store, self.offsets)

    def _build_services(self, config_dir: Path) -> AdminService:
        """The Messaging, Admin and Replication servicers, wired for this broker's role."""
        cfg = self.config
        messaging = MessagingService(
            config=cfg,
            store=self.store,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            clients=self.clients,
            hold=self.hold,
            locks=self.locks,
            clock=self.clock,
            transactions=self.transactions,
        )
        self.pop_revive = ReviveService(messaging.pops)
        self.messaging = messaging
        if not cfg.is_master:
            self._wire_slave(messaging, config_dir)
        admin = AdminService(
            config=cfg,
            store=self.store,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            clients=self.clients,
            hold=self.hold,
            locks=self.locks,
            registrar_trigger=self.registrar.trigger,
            advertised_addr=self.advertised_addr,
            started_ms=self.clock.now_ms(),
            clock=self.clock,
        )
        self._wire_replication(messaging, admin)
        admin.drainer = Drainer(
            config=cfg,
            store=self.store,
            topics=self.topics,
            offsets=self.offsets,
            clients=self.clients,
            registrar_trigger=self.registrar.trigger,
            unregister=lambda: self.registrar.leave(self._unregister_request()),
        )
        if cfg.controller_mode:
            self._wire_controller(admin)
        messaging_pb2_grpc.add_MessagingServicer_to_server(messaging, self.server)
        admin_pb2_grpc.add_AdminServicer_to_server(admin, self.server)
        return admin

    def _start_background(self, admin: AdminService) -> None:
        cfg = self.config
        self._spawn(self.offsets.run_persist_loop(cfg.flush_consumer_offset_interval_ms))
        self._spawn(self.clients.run_scan_loop())
        self._spawn(self.hold.run())
        self._spawn(self.pop_revive.run())
        admin.extra_stats.append(self.pop_revive.stats)
        self._spawn(self.locks.run_purge_loop())
        self.transaction_checks = TransactionCheckService(
            config=cfg,
            store=self.store,
            topics=self.topics,
            offsets=self.offsets,
            clients=self.clients,
            index=self.transactions,
            clock=self.clock,
        )
        self._spawn(self.transaction_checks.run())  # idle while a slave
        admin.extra_stats.append(self.transactions.stats)
        if self.ha_slave is not None:
            admin.extra_stats.append(self.ha_slave.runtime_extra)
        if self.ha_slave is not None and self.config_sync is not None and self.roles is None:
            self._spawn(self.ha_slave.run())
            self._spawn(self.config_sync.run())

    async def _go_live(self) -> None:
        """Health SERVING, then register (routable only once it can answer), then the election."""
        await grpc_server.set_serving(self.health, SERVICE_NAMES)
        if self.config.namesrv_addrs:
            await self.registrar.start()
        if self.config.learn_cluster_topics and self.config.is_master and self.roles is None:
            self._spawn(self._learn_cluster_topics())
        if self.roles is not None:
            # A candidate slave until the election says otherwise (serves reads meanwhile).
            self.controller = EtcdController(self.config, self.roles, self.advertised_addr)
            self.roles.attach(self.controller)
            await self.controller.start()

    async def _learn_cluster_topics(self) -> None:
        await learn_cluster_topics(self.config, self.topics)  # puts trigger a registration

    def _wire_replication(self, messaging: MessagingService, admin: AdminService) -> None:
        """The Replication service on every broker (a slave answers NOT_MASTER); on a master
        it feeds slaves, and SYNC_MASTER sends wait on it."""
        self.replication = ReplicationService(
            config=self.config,
            store=self.store,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            clock=self.clock,
        )
        replication_pb2_grpc.add_ReplicationServicer_to_server(self.replication, self.server)
        if self.config.is_master or self.config.controller_mode:
            messaging.sender.ha_waiter = self.replication.waiter
            admin.replication = self.replication
        # Pulls held on bytes beyond the confirm offset are answered once it covers them.
        self.store.confirm_listeners.append(self._confirm_advanced)

    def _wire_controller(self, admin: AdminService) -> None:
        """Controller mode: roles come from the etcd election (services.broker.roles); the
        slave side is started and stopped by the RoleManager, not here."""
        assert self.ha_slave is not None and self.config_sync is not None
        self.roles = RoleManager(
            config=self.config,
            store=self.store,
            replication=self.replication,
            slave=SlaveSide(self.ha_slave, self.config_sync, self.config_sync.commits),
            addr=self.advertised_addr,
            transactions=self.transactions,
            offsets=self.offsets,
            reregister=self._reregister,
        )
        admin.roles = self.roles

    async def _reregister(self, old_broker_id: int) -> None:
        cfg = self.config
        await self.registrar.reregister(
            nameserver_pb2.UnregisterBrokerRequest(
                cluster_name=cfg.cluster_name,
                broker_addr=self.advertised_addr,
                broker_name=cfg.broker_name,
                broker_id=old_broker_id,
            )
        )

    def _confirm_advanced(self, _offset: int) -> None:
        self.hold.check_once()

    def _wire_slave(self, messaging: MessagingService, config_dir: Path) -> None:
        """A slave replicates from its master (haMasterAddress, else as the nameservers say),
        copies its metadata, and takes offset commits while the master is unreachable."""
        cfg = self.config

        def master_addr() -> str:
            if self.roles is not None:  # controller mode: the elected leader
                return self.roles.master_addr()
            return cfg.ha_master_address or self.registrar.last_ha_server_addr

        self.ha_slave = ReplicationClient(
            config=cfg,
            store=self.store,
            master_addr=master_addr,
            broker_addr=self.advertised_addr,
            clock=self.clock,
        )
        ha_slave = self.ha_slave
        commits = SlaveOffsetCommits(self.offsets, lambda: ha_slave.connected, config_dir)
        commits.load()
        messaging.slave_commits = commits
        messaging.puller.slave_commits = commits
        self.config_sync = ConfigSync(
            config=cfg,
            topics=self.topics,
            groups=self.groups,
            offsets=self.offsets,
            commits=commits,
            master_addr=master_addr,
        )
        self.ha_slave.on_connected.append(self.config_sync.wake)
        self.ha_slave.on_config_changed.append(self.config_sync.wake)

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background task failed")

        self.tasks.append(asyncio.create_task(guarded()))

    def _registration(self) -> nameserver_pb2.RegisterBrokerRequest:
        cfg = self.config
        ts, counter = self.topics.data_version
        return nameserver_pb2.RegisterBrokerRequest(
            cluster_name=cfg.cluster_name,
            broker_addr=self.advertised_addr,
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            ha_server_addr=self.advertised_addr if cfg.is_master else "",
            topic_configs=[self._registered_topic(t).to_pb() for t in self.topics.all()],
            data_version=common_pb2.DataVersion(timestamp_ms=ts, counter=counter),
            heartbeat_timeout_ms=cfg.broker_heartbeat_timeout_ms,
            epoch=self.roles.epoch if self.roles is not None else 0,
            gateway_addr=(
                f"{cfg.advertised_host}:{cfg.gateway_port}" if self.gateway_server else ""
            ),
        )

    def _registered_topic(self, topic: TopicConfig) -> TopicConfig:
        # A broker whose permission lacks write (being drained, SPEC §2.4) registers every topic
        # with its perm masked, so producers stop choosing it while consumers keep reading.
        perm = topic.perm & self.config.broker_permission
        if perm == topic.perm:
            return topic
        return dataclasses.replace(topic, perm=perm)

    def _unregister_request(self) -> nameserver_pb2.UnregisterBrokerRequest:
        cfg = self.config
        return nameserver_pb2.UnregisterBrokerRequest(
            cluster_name=cfg.cluster_name,
            broker_addr=self.advertised_addr,
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
        )

    async def stop(self) -> None:
        log.info("broker shutting down")
        with contextlib.suppress(Exception):
            await grpc_server.set_not_serving(self.health, SERVICE_NAMES)
        if self.controller is not None:
            await self.controller.stop()  # revokes the lease: the group elects at once
        if self.roles is not None:
            await self.roles.stop()
        await self.registrar.stop(self._unregister_request())  # a no-op after a drain
        await self.replication.stop()  # ends the slaves' streams, so the grace is not spent
        if self.ha_slave is not None:
            self.ha_slave.close()
        await self.server.stop(SHUTDOWN_GRACE_S)
        if self.gateway_server is not None:
            await self.gateway_server.stop(SHUTDOWN_GRACE_S)
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            # Bounded: a task that ignores its cancellation must not keep the process alive.
            _, stuck = await asyncio.wait(self.tasks, timeout=TASK_STOP_TIMEOUT_S)
            if stuck:
                log.error("%d background task(s) did not stop; shutting down anyway", len(stuck))
        if self.config_sync is not None:
            await self.config_sync.close()
        self.offsets.persist()
        await self.store.shutdown()
        log.info("broker stopped cleanly")


def _load(config_file: Path | None, overrides: Mapping[str, str]) -> BrokerConfig:
    # Changes made at runtime with UpdateBrokerConfig live in the store's config dir; they win
    # over the file and environment, and explicit flags win over them.
    return load_effective(config_file, overrides)


def spec(prog: str = "rocketq broker") -> ServiceSpec[BrokerConfig]:
    return ServiceSpec(
        service="broker",
        prog=prog,
        description="Run a RocketQ broker (master role).",
        load=_load,
        app=Broker,
        log_context=lambda cfg: {"broker": cfg.broker_name},
        table=broker_config.TABLE,
    )


def main(argv: list[str] | None = None, prog: str = "rocketq broker") -> int:
    return run_service(spec(prog), argv)
