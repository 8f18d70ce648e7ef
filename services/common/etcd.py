"""etcd for development and tests: one loopback member, or a loopback cluster of several.

Brokers in controller mode (``etcdEndpoints``) elect their master through etcd. ``rocketq dev
up --ha`` and the integration tests start it here, through the supervisor; a member is ready
once its ``/health`` answers true (etcd answers true only when a leader exists and a quorum
read goes through). A member's :attr:`Process.addr` is its client endpoint ``127.0.0.1:PORT``,
what brokers take in ``etcdEndpoints``.
"""

from __future__ import annotations

import random
import shutil
import socket
import urllib.request
import uuid
from pathlib import Path

from services.common import supervisor
from services.common.supervisor import READY_TIMEOUT_S, Process

HEALTH_TIMEOUT_S = 1.0
DEBIAN_ETCD = Path("/usr/bin/etcd")


class EtcdMissing(RuntimeError):
    """No etcd binary on this machine."""


def etcd_binary() -> str:
    found = shutil.which("etcd") or (str(DEBIAN_ETCD) if DEBIAN_ETCD.exists() else None)
    if found is None:
        raise EtcdMissing(
            "etcd is not installed: `make setup` installs Debian's etcd-server "
            "(or: sudo apt-get install etcd-server)"
        )
    return found


FREE_PORT_RANGE = (20_000, 32_000)
"""Where :func:`free_port` looks: below Linux's ephemeral range (32768-60999), from which every
outgoing connection takes its source port - a port the kernel handed out as "free" there can
be taken by a client's connection before etcd binds it (seen in CI: "address already in use")."""


def free_port() -> int:
    """A loopback port nobody listens on right now, for a process that must be told its port
    (etcd cannot take port 0; a broker restarted on the same address)."""
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(*FREE_PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free loopback port in {FREE_PORT_RANGE} after 100 tries")


def healthy(addr: str) -> bool:
    """Whether the member at client endpoint ``addr`` says ``/health`` true."""
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=HEALTH_TIMEOUT_S) as resp:
            return b"true" in resp.read()
    except OSError:
        return False


def readiness(addr: str) -> supervisor.Readiness:
    """A member at client endpoint ``addr`` is ready once it is healthy."""
    return lambda _sp: addr if healthy(addr) else None


def member_argv(name: str, data_dir: Path, client: str, peer: str) -> list[str]:
    """One member's command line; ``client``/``peer`` are ``http://host:port`` URLs."""
    return [
        etcd_binary(),
        *("--name", name, "--data-dir", str(data_dir)),
        *("--listen-client-urls", client, "--advertise-client-urls", client),
        *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
    ]


def start_etcd(
    workdir: Path,
    name: str = "etcd",
    client_port: int = 0,
    peer_port: int = 0,
    *,
    member: str = "",
    log_path: Path | None = None,
    new_session: bool = False,
    timeout_s: float = READY_TIMEOUT_S,
) -> Process:
    """A one-member etcd on loopback (data in ``workdir/data``), waited for until healthy;
    a port 0 picks a free one. ``member``: etcd's member name if not ``name`` (the process's)."""
    member = member or name
    client = f"http://127.0.0.1:{client_port or free_port()}"
    peer = f"http://127.0.0.1:{peer_port or free_port()}"
    argv = member_argv(member, workdir / "data", client, peer)
    argv += ["--initial-cluster", f"{member}={peer}"]
    addr = client.removeprefix("http://")
    return supervisor.launch(
        name,
        argv,
        workdir,
        readiness(addr),
        log_path=log_path,
        new_session=new_session,
        timeout_s=timeout_s,
    )


def start_etcd_cluster(
    root: Path,
    members: int = 3,
    name_prefix: str = "etcd",
    heartbeat_interval_ms: int = 100,
    election_timeout_ms: int = 1000,
    timeout_s: float = READY_TIMEOUT_S,
) -> list[Process]:
    """``members`` members ``{name_prefix}0..`` on loopback (data in ``root/NAME/data``), all
    started before any is waited for (a lone member has no quorum and never says healthy).
    Timing defaults are etcd's own. Restarting a member with the same argv rejoins it: with its
    data dir present etcd ignores the ``--initial-cluster*`` flags."""
    names = [f"{name_prefix}{i}" for i in range(members)]
    clients = {n: f"http://127.0.0.1:{free_port()}" for n in names}
    peers = {n: f"http://127.0.0.1:{free_port()}" for n in names}
    initial = ",".join(f"{n}={peers[n]}" for n in names)
    token = f"{name_prefix}-{uuid.uuid4().hex[:12]}"  # members of another cluster never join
    started: list[Process] = []
    for n in names:
        argv = member_argv(n, root / n / "data", clients[n], peers[n])
        argv += ["--initial-cluster", initial, "--initial-cluster-state", "new"]
        argv += ["--initial-cluster-token", token]
        argv += ["--heartbeat-interval", str(heartbeat_interval_ms)]
        argv += ["--election-timeout", str(election_timeout_ms)]
        addr = clients[n].removeprefix("http://")
        started.append(supervisor.launch(n, argv, root / n, readiness(addr), wait=False))
    supervisor.wait_ready(started, timeout_s)
    return started


def wait_healthy(members: list[Process], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until every member's ``/health`` says true again (e.g. after a restart or a partition
    heals); kills them all and raises SpawnError otherwise."""
    for sp in members:
        sp.addr, sp.readiness = "", readiness(sp.addr)
    supervisor.wait_ready(members, timeout_s)
