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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen[bytes]
    addr: str
    workdir: Path
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    """Extra environment it was started with (kept by :func:`restart`)."""
    prefix: list[str] = field(default_factory=list)
    """argv run before ``argv`` (e.g. ``ip netns exec NS``; kept by :func:`restart`)."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(
                f"{self.name} did not stop within {timeout_s}s\n{self.log_tail()}"
            ) from exc

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def wait_exit(self, timeout_s: float = 20.0) -> int:
        return self.proc.wait(timeout_s)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


#: Every process this module started; :func:`reap_all` (an autouse fixture of the integration
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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


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
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    argv = [sys.executable, "-m", module, *args, "--ready-file", str(ready)]
    full_env = _env()
    if env:
        full_env.update(env)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*(prefix or []), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(workdir),
        )
    sp = ServiceProcess(name, proc, "", workdir, log_path, argv, env, list(prefix or []))
    _SPAWNED.append(sp)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}\n{sp.log_tail()}")
        try:
            sp.addr = json.loads(ready.read_text())["addr"]
            return sp
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"{name} not ready within {READY_TIMEOUT_S}s\n{sp.log_tail()}")


def start_nameserver(
    tmp_path: Path,
    *args: str,
    name: str = "namesrv",
    host: str = "127.0.0.1",
    prefix: list[str] | None = None,
) -> ServiceProcess:
    """Start a nameserver listening on ``host`` (port 0); ``prefix``: see :func:`spawn`."""
    return spawn(
        name,
        "services.nameserver",
        ["--listen", f"{host}:0", *args],
        tmp_path / name,
        prefix=prefix,
    )


def broker_args(
    store_dir: Path, namesrv_addrs: list[str], name: str, config_keys: dict[str, object]
) -> list[str]:
    keys: dict[str, object] = {
        "brokerName": name,
        "listenAddress": "127.0.0.1",
        "listenPort": 0,
        "brokerIP1": "127.0.0.1",
        "namesrvAddr": ";".join(namesrv_addrs),
        "storePathRootDir": store_dir,
        # small files keep tests fast and their temp dirs small
        "mappedFileSizeCommitLog": 64 * 1024 * 1024,
        "mappedFileUnitsConsumeQueue": 30_000,
        "registerNameServerPeriod": 2000,
    }
    keys.update(config_keys)
    out: list[str] = []
    for key, value in keys.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out += ["--set", f"{key}={text}"]
    return out


def start_broker(
    tmp_path: Path,
    namesrv_addrs: list[str],
    name: str = "broker-a",
    env: dict[str, str] | None = None,
    **config_keys: object,
) -> ServiceProcess:
    """Start a broker; ``config_keys`` are RocketMQ key names (``autoCreateTopicEnable=False``)."""
    workdir = tmp_path / name
    store_dir = Path(str(config_keys.pop("storePathRootDir", workdir / "store")))
    args = broker_args(store_dir, namesrv_addrs, name, config_keys)
    return spawn(name, "services.broker", args, workdir, env)


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
    workdir = tmp_path / name
    store_dir = Path(str(config_keys.pop("storePathRootDir", workdir / "store")))
    keys: dict[str, object] = {"listenAddress": host, "brokerIP1": host, **config_keys}
    args = broker_args(store_dir, namesrv_addrs, name, keys)
    return spawn(name, "services.broker", args, workdir, env, prefix)


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
    name = f"{broker_name}-s{broker_id}"
    workdir = tmp_path / name
    store_dir = Path(str(config_keys.pop("storePathRootDir", workdir / "store")))
    keys: dict[str, object] = {"brokerName": broker_name, "brokerId": broker_id}
    keys["brokerRole"] = "SLAVE"
    keys.update(config_keys)
    args = broker_args(store_dir, namesrv_addrs, broker_name, keys)
    return spawn(name, "services.broker", args, workdir, env)


def start_timer_wheel(
    tmp_path: Path,
    namesrv_addrs: list[str],
    name: str = "timer-0",
    env: dict[str, str] | None = None,
    **config_keys: object,
) -> ServiceProcess:
    """Start a timer-wheel service (data in ``tmp_path/name/data``); ``config_keys`` as
    ``--set key=value`` (e.g. ``timerPrecisionMs=1000``)."""
    workdir = tmp_path / name
    args = [
        "--namesrv",
        ";".join(namesrv_addrs),
        "--data-dir",
        str(workdir / "data"),
        "--listen",
        "127.0.0.1:0",
    ]
    for key, value in config_keys.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        args += ["--set", f"{key}={text}"]
    return spawn(name, "services.timer_wheel", args, workdir, env)


def free_port() -> int:
    """A loopback port nobody listens on right now (for etcd, which cannot take port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        raise AssertionError(
            "etcd is not installed: `make setup` installs Debian's etcd-server (apt-get)"
        )
    return found


def start_etcd(
    tmp_path: Path, name: str = "etcd", client_port: int = 0, peer_port: int = 0
) -> ServiceProcess:
    """Start a one-member etcd on loopback (data in ``tmp_path/name/data``); ``.addr`` is its
    client endpoint ``127.0.0.1:PORT`` (what brokers take as ``etcdEndpoints``)."""
    workdir = tmp_path / name
    workdir.mkdir(parents=True, exist_ok=True)
    client = f"http://127.0.0.1:{client_port or free_port()}"
    peer = f"http://127.0.0.1:{peer_port or free_port()}"
    argv = [
        etcd_binary(),
        "--name",
        name,
        "--data-dir",
        str(workdir / "data"),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        f"{name}={peer}",
    ]
    return _spawn_etcd(name, argv, workdir, client.removeprefix("http://"))


def _spawn_etcd(
    name: str, argv: list[str], workdir: Path, addr: str, wait: bool = True
) -> ServiceProcess:
    log_path = workdir / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir))
    sp = ServiceProcess(name, proc, addr, workdir, log_path, argv, None)
    _SPAWNED.append(sp)
    if wait:
        wait_etcd_healthy([sp])
    return sp


def wait_etcd_healthy(members: list[ServiceProcess], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until every member's ``/health`` says true (etcd 3.4 answers true only when a leader
    exists and a quorum read goes through); kills them all and fails otherwise."""
    deadline = time.monotonic() + timeout_s
    waiting = list(members)
    while waiting and time.monotonic() < deadline:
        for sp in list(waiting):
            if sp.proc.poll() is not None:
                for other in members:
                    other.kill()
                raise AssertionError(f"{sp.name} exited with {sp.proc.returncode}\n{sp.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{sp.addr}/health", timeout=1) as resp:
                    if b"true" in resp.read():
                        waiting.remove(sp)
            except OSError:
                pass
        if waiting:
            time.sleep(0.05)
    if waiting:
        for sp in members:
            sp.kill()
        raise AssertionError(
            f"{[sp.name for sp in waiting]} not healthy within {timeout_s}s\n"
            + "\n".join(sp.log_tail(20) for sp in waiting)
        )


def start_etcd_cluster(
    tmp_path: Path,
    members: int = 3,
    name_prefix: str = "etcd",
    heartbeat_interval_ms: int = 100,
    election_timeout_ms: int = 1000,
) -> list[ServiceProcess]:
    """Start an etcd cluster of ``members`` members ``{name_prefix}0..`` on loopback (each on
    two free ports, data in ``tmp_path/NAME/data``) and wait until every member is healthy.

    All members are started before any is waited for: a lone member has no quorum and would
    never say healthy. Timing defaults are etcd's own (heartbeat 100 ms, election timeout
    1000 ms). :func:`restart` brings a member back with the same argv: with its data dir
    present etcd ignores the ``--initial-cluster*`` flags and rejoins as the member it was.
    ``",".join(m.addr for m in result)`` is what brokers take as ``etcdEndpoints``."""
    names = [f"{name_prefix}{i}" for i in range(members)]
    clients = {n: f"http://127.0.0.1:{free_port()}" for n in names}
    peers = {n: f"http://127.0.0.1:{free_port()}" for n in names}
    initial = ",".join(f"{n}={peers[n]}" for n in names)
    token = f"{name_prefix}-{uuid.uuid4().hex[:12]}"  # members of another cluster never join
    started: list[ServiceProcess] = []
    for n in names:
        workdir = tmp_path / n
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [etcd_binary(), "--name", n, "--data-dir", str(workdir / "data"),
                "--listen-client-urls", clients[n], "--advertise-client-urls", clients[n],
                "--listen-peer-urls", peers[n], "--initial-advertise-peer-urls", peers[n],
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", token,
                "--heartbeat-interval", str(heartbeat_interval_ms),
                "--election-timeout", str(election_timeout_ms)]  # fmt: skip
        addr = clients[n].removeprefix("http://")
        started.append(_spawn_etcd(n, argv, workdir, addr, wait=False))
    wait_etcd_healthy(started)
    return started


def restart(sp: ServiceProcess) -> ServiceProcess:
    """Start the same command again (same data dir); the port may differ if it was 0 (etcd
    keeps its ports)."""
    if Path(sp.argv[0]).name == "etcd":
        return _spawn_etcd(sp.name, sp.argv, sp.workdir, sp.addr)
    args = sp.argv[3:]
    ready_idx = args.index("--ready-file")
    args = args[:ready_idx] + args[ready_idx + 2 :]
    module = sp.argv[2]
    return spawn(sp.name, module, args, sp.workdir, sp.env, sp.prefix)


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
