"""A private network for a test, built from Linux network namespaces, that can be cut.

Every node is a network namespace with its own loopback and one veth ``eth0`` holding
``10.77.0.N/24``; the other ends of the veths hang off a bridge that lives in a namespace of its
own (the *hub*), so nothing at all is added to the host's root namespace and no host address is
touched (the project's networking rule: loopback, or namespaces the test creates itself)::

      ns LAB-a (10.77.0.1)     ns LAB-b (10.77.0.2)      ...
        lo   eth0               lo   eth0
              │                       │
      ns LAB-hub:  v1 ──── br0 ──── v2 ── ...

A process joins a node by running under :meth:`NetLab.prefix` (``ip netns exec LAB-a ...``,
which ``exec``s the command, so its pid is the command's and signals reach it directly).

**Partitions.** This Debian image has neither nft nor iptables, and its kernel lacks tc's
actions and netem, so faults use the neighbour (ARP) table: a partition between ``a`` and ``b``
pins, in each of them, a *permanent* neighbour entry mapping the other's address to a MAC that
nobody owns. Packets then leave normally and vanish on the bridge: to the sender it looks like
a cut cable (no error, no reset; connects and in-flight streams time out), which is exactly the
case that liveness timeouts must handle. Established connections are cut too, because the
neighbour is looked up on every packet. :meth:`NetLab.heal` deletes every pinned entry; ARP
then resolves the real MACs again. ``mode="reject"`` uses blackhole routes instead: the sender
gets an immediate local error (``EINVAL``) rather than silence.

**Cleanup.** Namespaces are named ``{lab name}-{node}``; ``__enter__`` removes leftovers with
the lab's prefix (a previous run that crashed) and ``__exit__`` removes everything, also after
an exception. Deleting a namespace deletes its veth end and hence the pair. Processes still
running inside a lab namespace (started by a test through :meth:`prefix`) are killed by pid
first, so a namespace never outlives the lab.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from types import TracebackType

from services.common.supervisor import pid_alive

log = logging.getLogger(__name__)

SUBNET = "10.77.0"
"""Addresses are ``SUBNET.N/24``; N starts at 1. Each lab has its own hub, so labs coexist."""
NODES_MAX = 200
DEAD_MAC = "02:00:5e:77:00:ff"
"""A locally administered MAC that no interface of the lab has: frames to it are dropped."""
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
NODE_RE = re.compile(r"^[A-Za-z0-9_.]{1,24}$")
IP_TIMEOUT_S = 10.0
KILL_WAIT_S = 5.0
LINK_UP_WAIT_S = 5.0


def available() -> str | None:
    """None if this machine can build a lab (root, ``ip netns``), else the reason it cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns` is unavailable: {exc}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _wait_link_up(ns: str, dev: str) -> None:
    """Wait until ``dev`` in ``ns`` is operationally up (carrier on both veth ends)."""
    deadline = time.monotonic() + LINK_UP_WAIT_S
    while " state UP " not in _ip("-n", ns, "-o", "link", "show", "dev", dev).stdout:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{dev} in namespace {ns} not up after {LINK_UP_WAIT_S} s")
        time.sleep(0.01)


def list_namespaces() -> list[str]:
    """Every named network namespace on the machine (``ip netns list``)."""
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@dataclass
class _Node:
    name: str
    ns: str
    ip: str
    hub_if: str


class NetLab:
    """Network namespaces on a bridge; see the module doc. Use as a context manager."""

    def __init__(self, name: str) -> None:
        if not NAME_RE.match(name):
            raise ValueError(
                f"lab name {name!r}: 1-8 lowercase letters/digits, starting with a letter "
                "(it prefixes namespace names)"
            )
        self.name = name
        self.nodes: dict[str, _Node] = {}
        self._cuts: set[tuple[str, str, str]] = set()
        """Applied faults as (mode, node, peer ip): one per direction."""
        self._entered = False

    @property
    def hub(self) -> str:
        return f"{self.name}-hub"

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> NetLab:
        self.remove_stale()
        try:
            _ip("netns", "add", self.hub)
            self._entered = True
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill what still runs inside the lab, delete every namespace (idempotent)."""
        self._entered = False
        self.nodes.clear()
        self._cuts.clear()
        self.remove_stale()

    def remove_stale(self) -> None:
        """Delete every namespace named with this lab's prefix (its own or a crashed run's)."""
        mine = [ns for ns in list_namespaces() if ns.startswith(f"{self.name}-")]
        for ns in mine:
            _kill_inside(ns)
        for ns in mine:
            result = _ip("netns", "del", ns, check=False)
            if result.returncode != 0:
                log.warning("cannot delete namespace %s: %s", ns, result.stderr.strip())

    # -- building --------------------------------------------------------------------------
    def add_node(self, node: str) -> str:
        """Create namespace ``{lab}-{node}`` on the bridge; returns its IPv4 address."""
        if not self._entered:
            raise RuntimeError("use the NetLab as a context manager before adding nodes")
        if not NODE_RE.match(node):
            raise ValueError(f"node name {node!r}: 1-24 letters, digits, '_' or '.'")
        if node in self.nodes:
            raise ValueError(f"node {node!r} already exists in lab {self.name}")
        index = len(self.nodes) + 1
        if index > NODES_MAX:
            raise ValueError(f"a lab holds at most {NODES_MAX} nodes")
        ns = f"{self.name}-{node}"
        hub_if = f"v{index}"  # unique within the hub namespace; <= 15 chars
        ip = f"{SUBNET}.{index}"
        _ip("netns", "add", ns)
        self.nodes[node] = _Node(node, ns, ip, hub_if)
        _ip("-n", ns, "link", "set", "lo", "up")
        # Both ends are created inside namespaces: the root namespace never sees them.
        _ip("-n", self.hub, "link", "add", hub_if, "type", "veth", "peer", "name", "eth0",
            "netns", ns)  # fmt: skip
        _ip("-n", self.hub, "link", "set", hub_if, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        # "set up" returns before the carrier is on: a first SYN sent meanwhile is dropped,
        # and a 1 s connect probe then times out (seen on a loaded CI machine).
        _wait_link_up(self.hub, hub_if)
        _wait_link_up(ns, "eth0")
        return ip

    def ip(self, node: str) -> str:
        return self._node(node).ip

    def namespace(self, node: str) -> str:
        return self._node(node).ns

    def prefix(self, node: str) -> list[str]:
        """argv prefix that runs a command inside ``node``'s namespace."""
        return ["ip", "netns", "exec", self._node(node).ns]

    def _node(self, node: str) -> _Node:
        try:
            return self.nodes[node]
        except KeyError:
            raise KeyError(f"no node {node!r} in lab {self.name}") from None

    # -- faults ----------------------------------------------------------------------------
    def partition(self, a: str, b: str, mode: str = "drop") -> None:
        """Drop all traffic between ``a`` and ``b``, both ways (``mode``: see module doc)."""
        if a == b:
            raise ValueError("a node cannot be partitioned from itself")
        if mode not in ("drop", "reject"):
            raise ValueError(f"mode {mode!r}: 'drop' (silent) or 'reject' (blackhole route)")
        na, nb = self._node(a), self._node(b)
        self._cut(mode, na, nb.ip)
        self._cut(mode, nb, na.ip)

    def isolate(self, node: str, mode: str = "drop") -> None:
        """Cut ``node`` off from every other node of the lab (nodes added later excepted)."""
        for other in list(self.nodes):
            if other != node:
                self.partition(node, other, mode)

    def heal(self) -> None:
        """Remove every partition; the pinned neighbour entries go, ARP works again."""
        for mode, node, peer_ip in sorted(self._cuts):
            n = self.nodes.get(node)
            if n is None:
                continue
            if mode == "drop":
                _ip("-n", n.ns, "neigh", "del", peer_ip, "dev", "eth0", check=False)
            else:
                _ip("-n", n.ns, "route", "del", "blackhole", f"{peer_ip}/32", check=False)
        self._cuts.clear()

    def partitions(self) -> list[tuple[str, str]]:
        """The (node, peer node) directions cut right now (for reports)."""
        by_ip = {n.ip: n.name for n in self.nodes.values()}
        return sorted((node, by_ip.get(ip, ip)) for _, node, ip in self._cuts)

    def _cut(self, mode: str, node: _Node, peer_ip: str) -> None:
        if (mode, node.name, peer_ip) in self._cuts:
            return
        if mode == "drop":
            _ip("-n", node.ns, "neigh", "replace", peer_ip, "lladdr", DEAD_MAC, "dev", "eth0",
                "nud", "permanent")  # fmt: skip
        else:
            _ip("-n", node.ns, "route", "replace", "blackhole", f"{peer_ip}/32")
        self._cuts.add((mode, node.name, peer_ip))


def _kill_inside(ns: str) -> None:
    """SIGKILL the processes running in namespace ``ns`` (by pid) and wait for them to go."""
    result = _ip("netns", "pids", ns, check=False)
    pids = [int(p) for p in result.stdout.split() if p.isdigit() and int(p) != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        log.warning("killed pid %d still running in namespace %s", pid, ns)
    deadline = time.monotonic() + KILL_WAIT_S
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if pid_alive(p)]
        if pids:
            time.sleep(0.02)
