"""Real RocketQ processes for integration tests: nameservers and brokers on loopback ports.

Every process is started with ``python -m services.<name>``, listens on 127.0.0.1 port 0 and
reports its address through a ready file (JSON ``{"addr", "pid"}`` written atomically), so tests
never guess ports and never race on them. Logs go to ``<dir>/<name>.log``; a test that fails can
print them with :meth:`ServiceProcess.log_tail`.

    with cluster(tmp_path, brokers=2) as c:
        c.namesrv_addrs          # ["127.0.0.1:PORT"]
        c.brokers[0].addr        # "127.0.0.1:PORT"
        c.brokers[1].kill()
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common import etcd, launch, supervisor
from services.common.supervisor import READY_TIMEOUT_S, SpawnError, StopTimeout

ROOT = supervisor.ROOT


class ServiceProcess(supervisor.Process):
    """A supervised process (services.common.supervisor) whose failures fail the test."""

    def stop(self, timeout_s: float = supervisor.STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        try:
            return super().stop(timeout_s)
        except StopTimeout as exc:
            raise AssertionError(str(exc)) from None


#: Every process this module started; :func:`reap_since` (an autouse fixture of the integration
#: tier) kills whatever a test left running, e.g. a broker started again with :func:`restart`.
_SPAWNED: list[ServiceProcess] = []


def spawned_count() -> int:
    return len(_SPAWNED)


def reap_since(mark: int) -> list[str]:
    """Kill every still-running process started after ``mark`` (a :func:`spawned_count`);
    processes of longer-lived fixtures started before it are left alone."""
    leaked = [sp.name for sp in _SPAWNED[mark:] if sp.alive()]
    for sp in _SPAWNED[mark:]:
        if sp.alive():
            sp.kill()
    del _SPAWNED[mark:]
    return leaked


def _adopt(start: Callable[[], supervisor.Process]) -> ServiceProcess:
    """Run a supervisor start, turning its failure into a test failure; track the process."""
    try:
        process = start()
    except SpawnError as exc:
        raise AssertionError(str(exc)) from None
    return _track(process)


def _track(process: supervisor.Process) -> ServiceProcess:
    fields = {f.name: getattr(process, f.name) for f in dataclasses.fields(process)}
    sp = ServiceProcess(**fields)
    _SPAWNED.append(sp)
    return sp


def spawn(
    name: str,
    module: str,
    args: list[str],
    workdir: Path,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> ServiceProcess:
    """Start ``python -m module args --ready-file F`` and wait for its ready file; ``prefix``
    goes before the command (``["ip", "netns", "exec", NS]`` runs it in a network namespace)."""
    return _adopt(lambda: supervisor.spawn(name, module, args, workdir, env=env, prefix=prefix))


def start_nameserver(
    tmp_path: Path,
    *args: str,
    name: str = "namesrv",
    host: str = "127.0.0.1",
    prefix: list[str] | None = None,
) -> ServiceProcess:
    """Start a nameserver listening on ``host`` (port 0); ``prefix``: see :func:`spawn`."""
    return _adopt(lambda: launch.start_nameserver(tmp_path, *args, name=name, host=host,
                                                  prefix=prefix))  # fmt: skip


def broker_args(
    store_dir: Path, namesrv_addrs: list[str], name: str, config_keys: dict[str, object]
) -> list[str]:
    """A broker's flags: loopback, port 0, small files; ``config_keys`` win."""
    return launch.broker_args(store_dir, namesrv_addrs, name, config_keys)


def start_broker(
    tmp_path: Path,
    namesrv_addrs: list[str],
    name: str = "broker-a",
    env: dict[str, str] | None = None,
    **config_keys: object,
) -> ServiceProcess:
    """Start a broker; ``config_keys`` are RocketMQ key names (``autoCreateTopicEnable=False``)."""
    return _adopt(lambda: launch.start_broker(tmp_path, namesrv_addrs, name, config_keys, env=env))


def start_broker_in(
    prefix: list[str],
    host: str,
    tmp_path: Path,
    namesrv_addrs: list[str],
    name: str = "broker-a",
    env: dict[str, str] | None = None,
    **config_keys: object,
) -> ServiceProcess:
    """:func:`start_broker` run under ``prefix`` (``ip netns exec NS``), listening on and
    advertising ``host`` (a separate function: new parameters on start_broker would clash,
    for mypy, with callers passing ``**config_keys`` dicts)."""
    keys: dict[str, object] = {"listenAddress": host, "brokerIP1": host, **config_keys}
    return _adopt(
        lambda: launch.start_broker(tmp_path, namesrv_addrs, name, keys, env=env, prefix=prefix)
    )


def start_slave(
    tmp_path: Path,
    namesrv_addrs: list[str],
    broker_name: str = "broker-a",
    broker_id: int = 1,
    env: dict[str, str] | None = None,
    **config_keys: object,
) -> ServiceProcess:
    """Start slave ``broker_id`` of group ``broker_name`` (data in ``tmp_path/NAME-sID``); it
    finds its master through the nameservers unless ``haMasterAddress`` is given."""
    keys: dict[str, object] = {"brokerId": broker_id, "brokerRole": "SLAVE", **config_keys}
    label = f"{broker_name}-s{broker_id}"
    return _adopt(
        lambda: launch.start_broker(
            tmp_path, namesrv_addrs, broker_name, keys, env=env, workdir_name=label
        )
    )


def start_timer_wheel(
    tmp_path: Path,
    namesrv_addrs: list[str],
    name: str = "timer-0",
    env: dict[str, str] | None = None,
    **config_keys: object,
) -> ServiceProcess:
    """Start a timer-wheel service (data in ``tmp_path/name/data``); ``config_keys`` as
    ``--set key=value`` (e.g. ``timerPrecisionMs=1000``)."""
    return _adopt(
        lambda: launch.start_timer_wheel(tmp_path, namesrv_addrs, name, config_keys, env=env)
    )


def free_port() -> int:
    """A loopback port nobody listens on right now (for etcd, which cannot take port 0)."""
    return etcd.free_port()


def etcd_binary() -> str:
    try:
        return etcd.etcd_binary()
    except etcd.EtcdMissing as exc:
        raise AssertionError(str(exc)) from None


def start_etcd(
    tmp_path: Path, name: str = "etcd", client_port: int = 0, peer_port: int = 0
) -> ServiceProcess:
    """Start a one-member etcd on loopback (data in ``tmp_path/name/data``); ``.addr`` is its
    client endpoint ``127.0.0.1:PORT`` (what brokers take as ``etcdEndpoints``)."""
    etcd_binary()
    return _adopt(lambda: etcd.start_etcd(tmp_path / name, name, client_port, peer_port))


def wait_etcd_healthy(members: list[ServiceProcess], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until every member's ``/health`` says true; kills them all and fails otherwise."""
    try:
        etcd.wait_healthy(list(members), timeout_s)
    except SpawnError as exc:
        raise AssertionError(str(exc)) from None


def start_etcd_cluster(
    tmp_path: Path,
    members: int = 3,
    name_prefix: str = "etcd",
    heartbeat_interval_ms: int = 100,
    election_timeout_ms: int = 1000,
) -> list[ServiceProcess]:
    """Start an etcd cluster of ``members`` members ``{name_prefix}0..`` on loopback and wait
    until every member is healthy (services.common.etcd.start_etcd_cluster). :func:`restart`
    brings a member back with the same argv, rejoining as the member it was.
    ``",".join(m.addr for m in result)`` is what brokers take as ``etcdEndpoints``."""
    etcd_binary()
    try:
        started = etcd.start_etcd_cluster(
            tmp_path, members, name_prefix, heartbeat_interval_ms, election_timeout_ms
        )
    except SpawnError as exc:
        raise AssertionError(str(exc)) from None
    return [_track(p) for p in started]


def restart(sp: ServiceProcess) -> ServiceProcess:
    """Start the same command again (same data dir); the port may differ if it was 0 (etcd
    keeps its ports)."""
    if sp.readiness is None:  # built by hand from a Popen (an etcd member of the chaos suite)
        sp.readiness = etcd.readiness(sp.addr)
    return _adopt(lambda: supervisor.restart(sp))


@dataclass
class Cluster:
    nameservers: list[ServiceProcess]
    brokers: list[ServiceProcess]

    @property
    def namesrv_addrs(self) -> list[str]:
        return [n.addr for n in self.nameservers]

    @property
    def namesrv(self) -> str:
        return ";".join(self.namesrv_addrs)


def wait_for(predicate: object, timeout_s: float = 10.0, interval_s: float = 0.05) -> None:
    """Thin alias of :func:`tests.support.until.until_sync`, kept for the callers outside this
    tier's converted files (robustness, nameserver, orderly-faults, transaction-failover)."""
    from tests.support.until import until_sync  # local: keeps this module's imports untouched

    assert callable(predicate)
    until_sync(predicate, "condition", timeout_s, interval_s)


@contextlib.contextmanager
def cluster(
    tmp_path: Path, brokers: int = 1, nameservers: int = 1, **config_keys: object
) -> Iterator[Cluster]:
    """Nameservers and broker masters broker-a, broker-b, …; all stopped (killed if stuck) after.
    A thin wrapper of :func:`tests.support.cluster.cluster` (which has every option)."""
    from tests.support import cluster as family  # local: that module imports this one

    with family.cluster(
        tmp_path, brokers=brokers, nameservers=nameservers, broker_keys=config_keys
    ) as c:
        yield c


@contextlib.asynccontextmanager
async def read_only_broker(c: Cluster, broker: str = "broker-a") -> AsyncIterator[None]:
    """brokerPermission=4 for the duration: pulls work, sends and send-backs are refused (a way
    to exercise the consumer's local retry now that the broker serves ConsumerSendBack)."""
    from rocketq.client.admin import Admin  # only the async tests that use it need the SDK

    async with Admin(c.namesrv_addrs) as admin:
        await admin.update_broker_config(broker, {"brokerPermission": "4"})
        try:
            yield
        finally:
            await admin.update_broker_config(broker, {"brokerPermission": "6"})
