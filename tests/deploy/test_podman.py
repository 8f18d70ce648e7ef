"""The chart's pods as real containers of the project's image, under podman: a nameserver, a
broker group of a master and a slave, and a timer wheel, each started from its rendered
StatefulSet (command, args, env, ports, volumes, security context, probes) and finding the
others by the headless Services' DNS names. Messages go through them; the `helm test` pod's own
command passes; the slave catches up; a second broker group joins when the StatefulSet scales."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.manifests import NAMESPACE, RELEASE, by_kind, render
from tests.deploy.podman_pods import Pod, PodNetwork, pod_network
from tests.support.until import until_sync

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

VALUES: dict[str, Any] = {
    "nameserver": {"replicas": 1},
    "broker": {
        "groups": 1,
        "slavesPerGroup": 1,
        "terminationGracePeriodSeconds": 40,  # the preStop drain waits up to 25 s
        "config": {"registerNameServerPeriod": 2000},
    },
    "timerWheel": {"enabled": True},
}
SCALED_GROUPS = 2
"""Ordinals up to this are given addresses (DNS names) at the start; the test scales to it."""


def broker_host(sts: str, ordinal: int) -> str:
    return (
        f"{RELEASE}-rocketq-{sts}-{ordinal}.{RELEASE}-rocketq-{sts}.{NAMESPACE}.svc.cluster.local"
    )


@pytest.fixture(scope="module")
def cluster(image: str) -> Iterator[PodNetwork]:
    docs = render(VALUES)
    name = f"rqk8s{os.getpid() % 100000}"
    with pod_network(name, f"10.213.{os.getpid() % 200 + 20}", image) as net:
        started: list[Pod] = []
        for sts in by_kind(docs, "StatefulSet").values():
            replicas = sts["spec"]["replicas"]
            broker = "-broker" in sts["metadata"]["name"]
            for ordinal in range(SCALED_GROUPS if broker else replicas):
                pod = net.reserve(sts, ordinal)
                if ordinal < replicas:
                    started.append(pod)
        for pod in started:
            net.start(pod)
        net.wait_ready(started)
        yield net


def client(net: PodNetwork, script: str, timeout_s: float = 180) -> str:
    """Run ``script`` (sh) in a pod like the helm test pod (same image, env, security)."""
    (pod,) = render(VALUES, tests=True)
    spec = json.loads(json.dumps(pod["spec"]))
    spec["containers"][0]["args"] = [script]
    out = net.run_once("client", spec, timeout_s)
    assert out.returncode == 0, (
        f"client failed ({out.returncode}):\n{out.stdout}\n{out.stderr[-3000:]}"
    )
    return out.stdout


def brokers(net: PodNetwork) -> list[dict[str, Any]]:
    return json.loads(client(net, "rocketq cluster list --json"))


def test_brokers_register_under_their_stable_dns_names_with_names_from_ordinals(
    cluster: PodNetwork,
) -> None:
    rows = until_sync(
        lambda: r if len(r := brokers(cluster)) == 2 else None,
        "master and slave registered",
        timeout_s=60,
        interval_s=1,
    )
    seen = {(r["broker_name"], r["broker_id"], r["addr"]) for r in rows}
    assert seen == {
        ("broker-0", 0, f"{broker_host('broker', 0)}:10911"),
        ("broker-0", 1, f"{broker_host('broker-slave-1', 0)}:10911"),
    }


def test_the_helm_test_pod_command_passes(cluster: PodNetwork) -> None:
    (pod,) = render(VALUES, tests=True)
    out = cluster.run_once(pod["metadata"]["name"], pod["spec"])
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-3000:]}"
    assert "helm test: produced and consumed one message" in out.stdout


def test_messages_round_trip_and_the_slave_catches_up(cluster: PodNetwork) -> None:
    out = client(
        cluster,
        "rocketq produce k8s-round-trip --body m -c 30 >/dev/null && "
        "rocketq consume k8s-round-trip -g k8s-rt --from first --count 30 --timeout 30 --json",
    )
    consumed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(consumed) == 30
    assert {m["broker_name"] for m in consumed} == {"broker-0"}
    # message ids carry the store host: brokerIP1, the pod's address (clients dial its name)
    master = cluster.pods[f"{RELEASE}-rocketq-broker-0"]
    assert {m["store_host"] for m in consumed} == {f"{master.address}:10911"}

    until_sync(
        lambda: slave_in_step(cluster, "broker-0"),
        "the slave's max offset equal to the master's",
        timeout_s=60,
        interval_s=1,
    )
    # ... over the data port the chart pins (haListenPort), never falling back to the stream
    slave = cluster.pods[f"{RELEASE}-rocketq-broker-slave-1-0"]
    assert "replication data socket on 0.0.0.0:10912" in cluster.logs(master)
    assert "is not reachable" not in cluster.logs(slave)


def slave_in_step(net: PodNetwork, broker: str) -> bool:
    """Master and slave of ``broker`` hold the same (non-empty) commitlog."""
    (group,) = json.loads(client(net, f"rocketq ha status {broker} --json"))
    offsets = {r["replica_id"]: r["max_offset"] for r in group["replicas"]}
    return len(offsets) == 2 and len(set(offsets.values())) == 1 and offsets[0] > 0


def route_brokers(net: PodNetwork, topic: str) -> set[str]:
    desc = json.loads(client(net, f"rocketq topic describe {topic} --json"))
    return {q["broker_name"] for q in desc["route"]["queues"]}


def test_scaling_up_adds_a_group_that_takes_existing_topics_and_traffic(
    cluster: PodNetwork,
) -> None:
    # On every group there is (broker-0). Broker mode: the cluster-mode fan-out's own
    # nameserver lookup (3 s deadline) timed out twice here on a host loaded 9-15 (see report).
    client(cluster, "rocketq topic create k8s-existing -q 2 -b broker-0")
    assert route_brokers(cluster, "k8s-existing") == {"broker-0"}
    new = [
        cluster.pods[f"{RELEASE}-rocketq-broker-1"],
        cluster.pods[f"{RELEASE}-rocketq-broker-slave-1-1"],
    ]
    for pod in new:  # kubectl scale statefulset ... --replicas=2, both ranks
        cluster.start(pod)
    cluster.wait_ready(new)
    until_sync(
        lambda: route_brokers(cluster, "k8s-existing") == {"broker-0", "broker-1"},
        "broker-1 hosting the existing topic",
        timeout_s=60,
        interval_s=1,
    )
    out = client(cluster, "rocketq produce k8s-existing --body s -c 40 --json")
    stored_on = {
        json.loads(line)["message_queue"]["broker_name"]
        for line in out.splitlines()
        if line.startswith("{")
    }
    assert stored_on == {"broker-0", "broker-1"}
    until_sync(
        lambda: slave_in_step(cluster, "broker-1"),
        "the new group's slave caught up",
        timeout_s=60,
        interval_s=1,
    )


def test_scaling_down_drains_the_leaving_group_first(cluster: PodNetwork) -> None:
    """Runs after the scale-up: the 40 messages of k8s-existing are on both groups."""
    out = client(
        cluster,
        "rocketq consume k8s-existing -g k8s-drain --from first --count 40 --timeout 30 --json",
    )
    assert sum(line.startswith("{") for line in out.splitlines()) == 40
    leaving = cluster.pods[f"{RELEASE}-rocketq-broker-1"]
    said = cluster.stop(leaving)  # kubectl scale ... --replicas=1: preStop, then SIGTERM
    assert said.startswith("drained 127.0.0.1:10911"), f"{said}\n{cluster.logs(leaving)}"
    cluster.stop(cluster.pods[f"{RELEASE}-rocketq-broker-slave-1-1"])
    assert {(r["broker_name"], r["broker_id"]) for r in brokers(cluster)} == {
        ("broker-0", 0),
        ("broker-0", 1),
    }
    assert route_brokers(cluster, "k8s-existing") == {"broker-0"}
