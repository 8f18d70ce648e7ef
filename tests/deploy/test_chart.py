"""The Helm chart, rendered by the real Helm engine for the values sets users start from, linted,
and every object validated against the oldest and newest Kubernetes the chart supports; then
what the services rely on: stable DNS names, the ordinal → brokerName/brokerId mapping, probes
on declared ports, budgets and policies that select the pods they are meant for. Bad values are
refused with a message naming the key."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.manifests import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    by_kind,
    containers,
    env_of,
    notes,
    render,
    validation_errors,
)

pytestmark = pytest.mark.unit

VALUE_SETS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "ha-etcd": {
        "nameserver": {"replicas": 3},
        "broker": {"mode": "controller", "groups": 3, "slavesPerGroup": 2, "antiAffinity": "hard"},
        "etcd": {"bundled": True, "replicas": 3},
    },
    "external-etcd": {
        "broker": {"mode": "controller", "slavesPerGroup": 1},
        "etcd": {"bundled": False, "externalEndpoints": ["etcd-0.example:2379"]},
    },
    "external-access": {
        "externalAccess": {"enabled": True, "advertisedDomain": "mq.example.com"},
    },
    "tls": {"tls": {"enabled": True, "secretName": "rocketq-tls", "clientAuth": "require"}},
    "dynamic-provisioning": {
        "persistence": {"storageClassName": "standard", "retainOnScaleDown": False},
        "metrics": {"port": 9090, "serviceMonitor": {"enabled": True}},
        "broker": {"slavesPerGroup": 0, "config": {"autoCreateTopicEnable": False}},
    },
    "local-volumes": {
        "persistence": {
            "local": {"volumes": [{"node": "node-a", "path": "/mnt/rocketq/0", "size": "10Gi"}]}
        },
        "networkPolicy": {"clientNamespaceSelector": {"matchLabels": {"rocketq-client": "yes"}}},
    },
}

IP_ADDRESS = re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(VALUE_SETS[request.param])


def test_every_rendered_object_is_valid_for_oldest_and_newest_kubernetes(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    assert docs, f"{name}: nothing rendered"
    assert validation_errors(docs) == []
    assert validation_errors(render(VALUE_SETS[name], tests=True)) == []


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_helm_lint_is_clean(values: str) -> None:
    report = helm.lint(CHART_DIR, VALUE_SETS[values], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


def test_each_statefulset_has_its_headless_service_and_budget(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    services, budgets = by_kind(docs, "Service"), by_kind(docs, "PodDisruptionBudget")
    for name, sts in by_kind(docs, "StatefulSet").items():
        svc = services[sts["spec"]["serviceName"]]
        assert svc["spec"]["clusterIP"] == "None"
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_services_find_each_other_by_stable_dns_names_never_ips(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    stss = by_kind(docs, "StatefulSet")
    nameservers = stss[f"{RELEASE}-rocketq-nameserver"]["spec"]["replicas"]
    expected = ";".join(
        f"{RELEASE}-rocketq-nameserver-{i}.{RELEASE}-rocketq-nameserver.{NAMESPACE}"
        f".svc.cluster.local:9876"
        for i in range(nameservers)
    )
    for sts in stss.values():
        for c in containers(sts):
            env = env_of(c)
            for key in ("ROCKETQ_BROKER_NAMESRVADDR", "ROCKETQ_TIMER_WHEEL_NAMESRVADDR"):
                if key in env:
                    assert env[key] == expected
            addresses = [v for k, v in env.items() if not k.endswith("_LISTENADDRESS")]
            assert not any(IP_ADDRESS.search(v) for v in addresses), (name, env)


def test_ordinal_maps_to_broker_name_and_rank_to_broker_id(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    values = VALUE_SETS[name].get("broker", {})
    controller = values.get("mode") == "controller"
    slaves = values.get("slavesPerGroup", 1)
    brokers = {
        n: env_of(next(containers(s)))
        for n, s in by_kind(docs, "StatefulSet").items()
        if "-broker" in n
    }
    expected_names = [f"{RELEASE}-rocketq-broker"] + [
        f"{RELEASE}-rocketq-broker-slave-{k}" for k in range(1, slaves + 1)
    ]
    assert sorted(brokers) == sorted(expected_names)
    for rank, sts_name in enumerate(expected_names):
        env = brokers[sts_name]
        # the entrypoint appends the pod's ordinal: <prefix>-<ordinal> is the group
        assert env["ROCKETQ_BROKER_NAME_PREFIX"] == "broker"
        assert env["ROCKETQ_BROKER_BROKERID"] == str(rank + 1 if controller else rank)
        if controller:
            assert "ROCKETQ_BROKER_BROKERROLE" not in env
            assert env["ROCKETQ_BROKER_ETCDENDPOINTS"]
        else:
            assert env["ROCKETQ_BROKER_BROKERROLE"] == ("ASYNC_MASTER" if rank == 0 else "SLAVE")
        assert env["ROCKETQ_BROKER_BROKERIP1"] == "$(POD_IP)"  # the store host in message ids
        assert env["ROCKETQ_BROKER_BROKERHOSTNAME"] == (
            f"$(POD_NAME).{sts_name}.{NAMESPACE}.svc.cluster.local"
            if "externalAccess" not in VALUE_SETS[name]
            else "$(POD_NAME).mq.example.com"
        )


def test_probes_use_declared_ports_and_pods_run_read_only_as_non_root(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    tls = "tls" in VALUE_SETS[name]
    for sts in by_kind(docs, "StatefulSet").values():
        pod = sts["spec"]["template"]["spec"]
        for c in containers(sts):
            if c["name"] == "etcd":
                continue
            port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                check = c[probe]
                assert check == {**check, **({"tcpSocket": {"port": "grpc"}} if tls else {})}
                if not tls:
                    assert check["grpc"]["port"] == port
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert pod["securityContext"]["runAsNonRoot"] is True


def test_tls_secret_is_mounted_and_named_in_every_service_env() -> None:
    docs = render(VALUE_SETS["tls"])
    for sts in by_kind(docs, "StatefulSet").values():
        c = next(containers(sts))
        env = env_of(c)
        cert_keys = [k for k in env if k.endswith("_TLSCERTFILE")]
        assert len(cert_keys) == 1 and env[cert_keys[0]] == "/etc/rocketq/tls/tls.crt"
        volumes = sts["spec"]["template"]["spec"]["volumes"]
        assert {"name": "tls", "secret": {"secretName": "rocketq-tls"}} in volumes


def test_external_access_gives_every_broker_pod_its_own_service_and_advertised_name() -> None:
    docs = render(VALUE_SETS["external-access"])
    services = by_kind(docs, "Service")
    stss = by_kind(docs, "StatefulSet")
    for sts_name in (f"{RELEASE}-rocketq-broker", f"{RELEASE}-rocketq-broker-slave-1"):
        env = env_of(next(containers(stss[sts_name])))
        assert env["ROCKETQ_BROKER_BROKERHOSTNAME"] == "$(POD_NAME).mq.example.com"
        for i in range(stss[sts_name]["spec"]["replicas"]):
            svc = services[f"{sts_name}-{i}"]
            assert svc["spec"]["type"] == "LoadBalancer"
            assert svc["spec"]["selector"] == {
                "statefulset.kubernetes.io/pod-name": f"{sts_name}-{i}"
            }
            assert (
                svc["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"]
                == f"{sts_name}-{i}.mq.example.com"
            )
    assert "mq.example.com" in notes(VALUE_SETS["external-access"])


def test_storage_local_class_waits_for_first_consumer_or_dynamic_class_is_used() -> None:
    local = render(VALUE_SETS["local-volumes"])
    (cls,) = by_kind(local, "StorageClass").values()
    assert cls["provisioner"] == "kubernetes.io/no-provisioner"
    assert cls["volumeBindingMode"] == "WaitForFirstConsumer"
    (pv,) = by_kind(local, "PersistentVolume").values()
    assert pv["spec"]["local"]["path"] == "/mnt/rocketq/0"
    broker = by_kind(local, "StatefulSet")[f"{RELEASE}-rocketq-broker"]["spec"]
    assert broker["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"
    assert broker["volumeClaimTemplates"][0]["spec"]["storageClassName"] == cls["metadata"]["name"]

    dynamic = render(VALUE_SETS["dynamic-provisioning"])
    assert by_kind(dynamic, "StorageClass") == {} and by_kind(dynamic, "PersistentVolume") == {}
    broker = by_kind(dynamic, "StatefulSet")[f"{RELEASE}-rocketq-broker"]["spec"]
    assert broker["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "standard"


def test_service_monitor_scrapes_the_metrics_port_every_service_declares() -> None:
    docs = render(VALUE_SETS["dynamic-provisioning"])
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    for svc in by_kind(docs, "Service").values():
        assert {"name": "metrics", "port": 9090, "targetPort": "metrics"} in svc["spec"]["ports"]
    for sts in by_kind(docs, "StatefulSet").values():
        env = env_of(next(containers(sts)))
        assert any(k.endswith("_METRICSPORT") and v == "9090" for k, v in env.items())


def test_helm_test_pod_produces_and_consumes_through_the_nameservers() -> None:
    (pod,) = render({}, tests=True)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "rocketq produce" in script and "rocketq consume" in script
    assert env_of(pod["spec"]["containers"][0])["ROCKETQ_NAMESRV"].startswith(
        f"{RELEASE}-rocketq-nameserver-0.{RELEASE}-rocketq-nameserver."
    )


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"broker": {"groups": 0}}, ["broker", "groups", "minimum"]),
        ({"broker": {"mode": "raft"}}, ["broker", "mode", "master-slave", "controller"]),
        ({"brokr": {"groups": 2}}, ["brokr"]),
        ({"nameserver": {"port": 70000}}, ["nameserver", "port"]),
        ({"persistence": {"brokerSize": "ten gigs"}}, ["brokerSize"]),
        ({"etcd": {"replicas": 2}}, ["etcd", "replicas"]),
    ],
    ids=["groups-0", "unknown-mode", "typo-key", "port-range", "bad-quantity", "even-etcd"],
)
def test_bad_values_are_refused_by_the_schema_naming_the_key(
    values: dict[str, Any], words: list[str]
) -> None:
    chart = helm.Chart.load(CHART_DIR)
    with pytest.raises(helm.HelmError) as failure:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    message = str(failure.value)
    assert all(w in message for w in words), message


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (
            {"broker": {"mode": "controller"}, "etcd": {"bundled": False}},
            ["etcd.bundled=true", "etcd.externalEndpoints"],
        ),
        ({"externalAccess": {"enabled": True}}, ["externalAccess.advertisedDomain"]),
        ({"tls": {"enabled": True}}, ["tls.secretName"]),
        ({"metrics": {"serviceMonitor": {"enabled": True}}}, ["metrics.port"]),
        ({"broker": {"mode": "controller", "slavesPerGroup": 0}}, ["slavesPerGroup >= 1"]),
    ],
    ids=[
        "controller-without-etcd",
        "external-without-domain",
        "tls-without-secret",
        "monitor-without-port",
        "controller-single-replica",
    ],
)
def test_values_that_contradict_each_other_fail_with_what_to_change(
    values: dict[str, Any], words: list[str]
) -> None:
    chart = helm.Chart.load(CHART_DIR)
    with pytest.raises(helm.HelmError) as failure:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    message = str(failure.value)
    assert all(w in message for w in words), message


def test_masters_drain_before_stopping_within_their_grace_and_new_groups_learn_topics() -> None:
    docs = by_kind(render({"broker": {"terminationGracePeriodSeconds": 100}}), "StatefulSet")
    master = docs[f"{RELEASE}-rocketq-broker"]
    (c,) = containers(master)
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python3", "-m", "services.broker.drain"]
    assert command[command.index("--timeout-s") + 1] == "85"  # 15 s left for the clean stop
    assert master["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 100
    assert env_of(c)["ROCKETQ_BROKER_LEARNCLUSTERTOPICS"] == "true"
    # a slave is not drained (it takes no writes); controller mode elects, TLS: not yet
    (slave,) = containers(docs[f"{RELEASE}-rocketq-broker-slave-1"])
    assert "lifecycle" not in slave
    for values in (VALUE_SETS["ha-etcd"], VALUE_SETS["tls"], {"broker": {"drainOnStop": False}}):
        (c,) = containers(by_kind(render(values), "StatefulSet")[f"{RELEASE}-rocketq-broker"])
        assert "lifecycle" not in c


@pytest.mark.parametrize(
    ("values", "port"),
    [
        ({}, 10912),
        ({"broker": {"haListenPort": -1}}, None),
        (VALUE_SETS["tls"], 10912),  # in TLS, like the gRPC port
    ],
)
def test_brokers_declare_the_replication_data_port(
    values: dict[str, Any], port: int | None
) -> None:
    """haListenPort (RocketMQ's 10912 by default; each broker is a pod of its own, so a fixed
    port cannot clash): every broker's env, and its container port when the socket opens."""
    for sts_name, sts in by_kind(render(values), "StatefulSet").items():
        if "-broker" not in sts_name:
            continue
        container = next(containers(sts))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports.get("ha") == port
        expected = "-1" if values.get("broker", {}).get("haListenPort") == -1 else "10912"
        assert env_of(container)["ROCKETQ_BROKER_HALISTENPORT"] == expected


@pytest.mark.parametrize("gateway_port", [8081, 0])
def test_brokers_serve_the_rocketmq5_gateway_on_its_declared_port_or_not_at_all(
    gateway_port: int,
) -> None:
    """gatewayPort (8081 by default): each broker pod's container port, env and Services (the
    headless one and, with external access, its own); 0 leaves it out everywhere."""
    values: dict[str, Any] = {
        "broker": {"gatewayPort": gateway_port},
        "externalAccess": {"enabled": True, "advertisedDomain": "mq.example.com"},
    }
    docs = render(values)
    services = by_kind(docs, "Service")
    for sts_name, sts in by_kind(docs, "StatefulSet").items():
        if "-broker" not in sts_name:
            continue
        container = next(containers(sts))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = env_of(container)
        exposed = [services[sts_name], services[f"{sts_name}-0"]]
        if gateway_port:
            assert ports["gateway"] == gateway_port
            assert env["ROCKETQ_BROKER_GATEWAYPORT"] == str(gateway_port)
            for svc in exposed:
                by_name = {p["name"]: p for p in svc["spec"]["ports"]}
                assert by_name["gateway"]["port"] == gateway_port
                assert by_name["gateway"]["targetPort"] == "gateway"
        else:
            assert "gateway" not in ports
            assert env["ROCKETQ_BROKER_GATEWAYPORT"] == "0"
            for svc in exposed:
                assert "gateway" not in {p["name"] for p in svc["spec"]["ports"]}
    assert ("official RocketMQ 5 SDKs" in notes(values)) == bool(gateway_port)
