"""The network-partition fault (tests/robustness/chaos/netns.py) really cuts and really heals.

* plain TCP between two lab nodes: connects both ways; a partition makes both directions time
  out (silence, not an error: a cut cable) or fail at once (``mode="reject"``); heal restores;
* a nameserver and a broker, each in its own namespace, talk over the lab network: the broker
  registers; a partition between them makes its registrations fail (the broker logs it and the
  nameserver, short heartbeat timeout, drops it from its cluster table); heal brings it back;
* the lab leaves nothing behind: no namespace after ``__exit__``, also after an exception,
  processes left inside are killed, and a crashed run's leftovers are removed on entry.

Skipped only when network namespaces are unavailable (not root, no ``ip netns``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.cluster import (
    ServiceProcess,
    start_broker_in,
    start_nameserver,
    wait_for,
)
from tests.robustness.chaos import netns
from tests.robustness.chaos.netns import NetLab
from tests.support.until import until_sync

pytestmark = [
    pytest.mark.robustness,
    pytest.mark.skipif(netns.available() is not None, reason=f"{netns.available()}"),
]

PORT = 7070
CONNECT_TIMEOUT_S = 1.0
SERVER = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "s.listen(16)\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)
PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
    "except TimeoutError:\n"
    "    print('timeout')\n"
    "except OSError as exc:\n"
    "    print(f'error {exc.errno}')\n"
    "else:\n"
    "    print('ok')\n"
)
CLUSTER_INFO = (
    "import json, sys, grpc\n"
    "from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc\n"
    "with grpc.insecure_channel(sys.argv[1]) as ch:\n"
    "    stub = nameserver_pb2_grpc.NameServerStub(ch)\n"
    "    r = stub.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), timeout=3)\n"
    "print(json.dumps({n: dict(d.broker_addrs) for n, d in r.broker_addr_table.items()}))\n"
)


def _python_in(lab: NetLab, node: str, code: str, *args: str) -> str:
    """Run a short Python snippet inside ``node``; its stdout."""
    argv = [*lab.prefix(node), sys.executable, "-c", code, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _serve(lab: NetLab, node: str) -> subprocess.Popen[str]:
    argv = [*lab.prefix(node), sys.executable, "-c", SERVER, lab.ip(node), str(PORT)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def _probe(lab: NetLab, src: str, dst: str) -> str:
    return _python_in(lab, src, PROBE, lab.ip(dst), str(PORT), str(CONNECT_TIMEOUT_S))


def test_partition_cuts_tcp_both_ways_and_heal_restores() -> None:
    with NetLab("rqtcp") as lab:
        lab.add_node("a")
        lab.add_node("b")
        lab.add_node("c")
        servers = [_serve(lab, n) for n in ("a", "b", "c")]
        try:
            assert _probe(lab, "a", "b") == "ok"
            assert _probe(lab, "b", "a") == "ok"

            lab.partition("a", "b")
            assert lab.partitions() == [("a", "b"), ("b", "a")]
            assert _probe(lab, "a", "b") == "timeout"  # silence, like a cut cable
            assert _probe(lab, "b", "a") == "timeout"
            assert _probe(lab, "a", "c") == "ok"  # only that pair is cut
            assert _probe(lab, "c", "b") == "ok"

            lab.heal()
            assert lab.partitions() == []
            assert _probe(lab, "a", "b") == "ok"
            assert _probe(lab, "b", "a") == "ok"

            lab.isolate("c")
            assert _probe(lab, "a", "c") == "timeout"
            assert _probe(lab, "c", "b") == "timeout"
            assert _probe(lab, "a", "b") == "ok"
            lab.heal()

            lab.partition("a", "b", mode="reject")  # blackhole routes: fail fast, locally
            assert _probe(lab, "a", "b").startswith("error")
            assert _probe(lab, "b", "a").startswith("error")
            lab.heal()
            assert _probe(lab, "a", "b") == "ok"
        finally:
            for proc in servers:
                proc.kill()
                proc.wait(5)


def _cluster_info(lab: NetLab, node: str, namesrv: str) -> dict[str, dict[str, str]]:
    info: dict[str, dict[str, str]] = json.loads(_python_in(lab, node, CLUSTER_INFO, namesrv))
    return info


def _log_has(sp: ServiceProcess, text: str) -> bool:
    return text in sp.log_path.read_text(errors="replace")


def test_broker_registration_over_the_lab_fails_in_a_partition_and_recovers(
    tmp_path: Path,
) -> None:
    with NetLab("rqreg") as lab:
        ns_ip = lab.add_node("ns")
        br_ip = lab.add_node("br")
        lab.add_node("cli")
        started: list[ServiceProcess] = []
        try:
            namesrv = start_nameserver(
                tmp_path, "--scan-interval-ms", "200", host=ns_ip, prefix=lab.prefix("ns")
            )
            started.append(namesrv)
            assert namesrv.addr.startswith(f"{ns_ip}:")
            broker = start_broker_in(
                lab.prefix("br"),
                br_ip,
                tmp_path,
                [namesrv.addr],
                registerNameServerPeriod=500,
                brokerHeartbeatTimeoutMs=2000,
            )
            started.append(broker)
            assert broker.addr == f"{br_ip}:{broker.port}"
            wait_for(lambda: "broker-a" in _cluster_info(lab, "cli", namesrv.addr), 10)
            assert _cluster_info(lab, "cli", namesrv.addr)["broker-a"] == {"0": broker.addr}

            lab.partition("ns", "br")
            t0 = time.monotonic()
            wait_for(lambda: _log_has(broker, "cannot register with nameserver"), 15)
            # The nameserver stops hearing from it and expires it (2 s heartbeat timeout).
            wait_for(lambda: "broker-a" not in _cluster_info(lab, "cli", namesrv.addr), 15)
            cut_s = time.monotonic() - t0

            lab.heal()
            t1 = time.monotonic()
            wait_for(lambda: "broker-a" in _cluster_info(lab, "cli", namesrv.addr), 30)
            wait_for(lambda: _log_has(broker, "registered with nameserver"), 10)
            assert broker.alive() and namesrv.alive()
            print(
                f"registration lost {cut_s:.1f}s after the cut, back {time.monotonic() - t1:.1f}s"
            )
        finally:
            for sp in reversed(started):
                if sp.alive():
                    sp.stop(timeout_s=15)


def test_lab_cleans_up_even_after_an_exception() -> None:
    def ours() -> list[str]:
        return [ns for ns in netns.list_namespaces() if ns.startswith("rqclean-")]

    # A crashed run's leftover (namespace with a process inside) is removed on entry.
    subprocess.run(["ip", "netns", "add", "rqclean-stale"], check=True)
    straggler = subprocess.Popen(["ip", "netns", "exec", "rqclean-stale", "sleep", "60"])

    def straggler_inside() -> bool:
        argv = ["ip", "netns", "pids", "rqclean-stale"]
        pids = subprocess.run(argv, capture_output=True, check=False)
        return str(straggler.pid).encode() in pids.stdout.split()

    try:
        # Until it has entered the namespace, nothing could find it there by pid.
        until_sync(straggler_inside, "the straggler inside rqclean-stale", timeout_s=10)
        with NetLab("rqclean") as lab:
            assert "rqclean-stale" not in ours()
            assert straggler.wait(5) != 0  # killed by pid with its namespace
            lab.add_node("x")
            assert sorted(ours()) == ["rqclean-hub", "rqclean-x"]
        assert ours() == []

        inside: subprocess.Popen[bytes] | None = None
        with pytest.raises(RuntimeError, match="boom"), NetLab("rqclean") as lab:
            lab.add_node("a")
            lab.add_node("b")
            lab.partition("a", "b")
            inside = subprocess.Popen([*lab.prefix("a"), "sleep", "60"])
            raise RuntimeError("boom")
        assert ours() == []
        assert inside is not None and inside.wait(5) != 0
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait(5)
        NetLab("rqclean").remove_stale()
