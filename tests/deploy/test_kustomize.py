"""deploy/k8s: the plain-manifest base is the chart's default install (kept in step by
tools/render_k8s), and each overlay builds with kustomize into objects that are valid for the
oldest and newest supported Kubernetes and keep what the services rely on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.manifests import by_kind, containers, env_of, kustomize, validation_errors
from tools import render_k8s

pytestmark = pytest.mark.unit

OVERLAYS = ("base", "overlays/dev", "overlays/ha")
ENV_REFERENCE = re.compile(r"\$\(([A-Z_][A-Z0-9_]*)\)")


@pytest.fixture(scope="module", params=OVERLAYS)
def built(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, kustomize(request.param)


def test_base_is_the_chart_rendered_with_default_values() -> None:
    assert render_k8s.BASE_FILE.read_text() == render_k8s.render_base(), (
        "deploy/k8s/base/rocketq.yaml is out of date: run python -m tools.render_k8s"
    )


def test_every_object_of_every_overlay_is_valid(built: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = built
    assert len(by_kind(docs, "StatefulSet")) == 4, name
    assert validation_errors(docs) == []
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "StorageClass"} == {
        "rocketq"
    }


def test_env_references_name_variables_defined_before_them(
    built: tuple[str, list[dict[str, Any]]],
) -> None:
    """Kubernetes expands $(VAR) only from entries earlier in the list: a patch that reorders
    env would leave brokerIP1 as the literal text."""
    _, docs = built
    for sts in by_kind(docs, "StatefulSet").values():
        for c in containers(sts):
            seen: set[str] = set()
            for entry in c.get("env", []):
                for ref in ENV_REFERENCE.findall(entry.get("value", "")):
                    assert ref in seen, (sts["metadata"]["name"], entry["name"], ref)
                seen.add(entry["name"])
            names = [e["name"] for e in c.get("env", [])]
            assert len(names) == len(set(names)), names


def test_dev_overlay_runs_one_small_group_and_ha_three_synchronous_ones() -> None:
    dev = by_kind(kustomize("overlays/dev"), "StatefulSet")
    assert dev["rocketq-broker"]["spec"]["replicas"] == 1
    assert next(containers(dev["rocketq-broker"]))["image"] == "localhost/rocketq:dev"
    assert by_kind(kustomize("overlays/dev"), "PodDisruptionBudget") == {}

    ha = by_kind(kustomize("overlays/ha"), "StatefulSet")
    for name in ("rocketq-broker", "rocketq-broker-slave-1"):
        pod = ha[name]["spec"]["template"]["spec"]
        assert ha[name]["spec"]["replicas"] == 3
        assert (
            "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
        )
    master_env = env_of(next(containers(ha["rocketq-broker"])))
    assert master_env["ROCKETQ_BROKER_BROKERROLE"] == "SYNC_MASTER"
    assert master_env["ROCKETQ_BROKER_FLUSHDISKTYPE"] == "SYNC_FLUSH"
    slave_env = env_of(next(containers(ha["rocketq-broker-slave-1"])))
    assert slave_env["ROCKETQ_BROKER_BROKERROLE"] == "SLAVE"
