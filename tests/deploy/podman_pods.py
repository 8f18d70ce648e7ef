"""Run the rendered chart's pods as real podman containers, the way a kubelet would run them.

Kubernetes cannot run here; what the chart's pods need from it is reproduced with podman:

- each StatefulSet ordinal is one container named and with the hostname of its pod
  (``<sts>-<ordinal>``), started from the pod template's image, command, args and env
  (``fieldRef`` metadata.name is the pod name; ``$(VAR)`` references are expanded as the kubelet
  does), ``securityContext`` (uid/gid, read-only root filesystem, dropped capabilities,
  no privilege escalation) and volumes (container ports need no publishing: every pod has
  its own address on the network, as in a cluster): an
  emptyDir is a tmpfs, a volumeClaimTemplate a podman volume ``<claim>-<pod>`` (kept when the
  pod goes, like a retained PVC);
- the headless Services' DNS names resolve: every pod gets a fixed address on an internal
  podman network this module creates, and ``--add-host`` entries for each pod's
  ``<pod>.<service>.<namespace>.svc.<domain>`` (and the shorter forms);
- probes: a gRPC readiness probe is run as the kubelet's check would be, a grpc.health.v1
  Check on the probe's port, from inside the container (the image has grpcio-health-checking);
- stopping: the preStop exec hook, then SIGTERM, SIGKILL after terminationGracePeriodSeconds.

podman runs rootful with runc and raised ulimits (DESIGN.md §9); ``ensure_podman`` installs it
with the project's own script when it is missing, never skipping.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.deploy.manifests import NAMESPACE, REPO_ROOT
from tests.support.until import until_sync

PODMAN = ["podman", "--runtime", "runc", "--network-backend", "netavark"]
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
CLUSTER_DOMAIN = "cluster.local"
ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
HEALTH_CHECK = (
    "import sys, grpc\n"
    "from grpc_health.v1 import health_pb2 as pb, health_pb2_grpc as rpc\n"
    "ch = grpc.insecure_channel(f'127.0.0.1:{sys.argv[1]}')\n"
    "r = rpc.HealthStub(ch).Check(pb.HealthCheckRequest(), timeout=3)\n"
    "sys.exit(0 if r.status == pb.HealthCheckResponse.SERVING else 1)\n"
)


def podman(
    *args: str, check: bool = True, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} ... failed:\n{out.stderr[-3000:]}")
    return out


def ensure_podman() -> None:
    """Install podman, runc and mmdebstrap with tools/install_podman.sh (what `make setup` runs)
    when one is missing; fail, never skip, if that does not give them."""
    if not all(shutil.which(t) for t in ("podman", "runc", "mmdebstrap", "iptables")):
        subprocess.run(["sh", "tools/install_podman.sh"], cwd=REPO_ROOT, check=True, timeout=900)
    missing = [t for t in ("podman", "runc", "mmdebstrap") if not shutil.which(t)]
    assert not missing, f"tools/install_podman.sh did not install {missing}"


def build_image(tag: str) -> float:
    """`make image`'s script: the image ``tag``; returns the seconds it took."""
    started = time.monotonic()
    subprocess.run(
        ["sh", "tools/build_image.sh", tag],
        cwd=REPO_ROOT,
        check=True,
        timeout=1200,
        env={
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PY": str(REPO_ROOT / ".venv" / "bin" / "python"),
            "HOME": "/root",
        },
    )
    return time.monotonic() - started


@dataclass
class Pod:
    """One StatefulSet ordinal running as a container."""

    name: str
    service: str
    address: str
    container: str
    spec: dict[str, Any]


@dataclass
class PodNetwork:
    """An internal podman network (no route out) holding the pods of one test module; names
    resolve through ``--add-host`` entries like the headless Services' DNS records."""

    name: str
    subnet_prefix: str
    image: str
    pods: dict[str, Pod] = field(default_factory=dict)
    _next_host: int = 10

    def hosts(self) -> list[str]:
        """``--add-host`` flags of every pod (reserved addresses included: a pod started later
        is reachable by name from those started before, as DNS would make it)."""
        flags: list[str] = []
        for pod in self.pods.values():
            for name in (
                f"{pod.name}.{pod.service}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}",
                f"{pod.name}.{pod.service}.{NAMESPACE}.svc",
                f"{pod.name}.{pod.service}",
            ):
                flags += ["--add-host", f"{name}:{pod.address}"]
        return flags

    def reserve(self, sts: Mapping[str, Any], ordinal: int) -> Pod:
        pod_name = f"{sts['metadata']['name']}-{ordinal}"
        address = f"{self.subnet_prefix}.{self._next_host}"
        self._next_host += 1
        pod = Pod(
            pod_name,
            sts["spec"]["serviceName"],
            address,
            f"{self.name}-{pod_name}",
            sts["spec"]["template"]["spec"],
        )
        self.pods[pod_name] = pod
        return pod

    def start(self, pod: Pod) -> None:
        """Run ``pod`` (its address reserved) as its template says."""
        podman("rm", "-f", "-v", pod.container, check=False)
        podman(
            "run",
            "-d",
            *self._run_flags(pod.name, pod.spec, pod.container, pod.address),
            "--ip",
            pod.address,
            *self._image_and_command(pod.spec),
        )

    def stop(self, pod: Pod) -> str:
        """Stop as the kubelet does: the preStop exec hook (its output is returned), then
        SIGTERM, then SIGKILL once the grace period is over."""
        grace_s = int(pod.spec.get("terminationGracePeriodSeconds", 30))
        (c,) = pod.spec["containers"]
        hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        said = ""
        if hook:
            try:
                out = podman("exec", pod.container, *hook, check=False, timeout_s=grace_s)
                said = out.stdout + out.stderr
            except subprocess.TimeoutExpired:  # the kubelet, too, gives up at the grace
                said = f"preStop hook still running after {grace_s} s"
        podman("stop", "-t", str(grace_s), pod.container, timeout_s=grace_s + 30)
        return said

    def run_once(
        self, name: str, spec: Mapping[str, Any], timeout_s: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run a pod to completion (``restartPolicy: Never``, like the helm test pod)."""
        container = f"{self.name}-{name}"
        return podman(
            "run",
            "--rm",
            *self._run_flags(name, spec, container),
            *self._image_and_command(spec),
            check=False,
            timeout_s=timeout_s,
        )

    def ready(self, pod: Pod) -> bool:
        """The pod's readiness probe (a gRPC health check on its port) passes."""
        (c,) = pod.spec["containers"]
        port = c["readinessProbe"]["grpc"]["port"]
        out = podman("exec", pod.container, "python3", "-c", HEALTH_CHECK, str(port), check=False)
        return out.returncode == 0

    def wait_ready(self, pods: list[Pod], timeout_s: float = 120) -> None:
        for pod in pods:
            until_sync(
                lambda pod=pod: self.ready(pod) or self._dead(pod),
                f"{pod.name} ready",
                timeout_s=timeout_s,
                interval_s=0.5,
            )
            assert self.ready(pod), f"{pod.name} exited:\n{self.logs(pod)}"

    def _dead(self, pod: Pod) -> bool:
        out = podman("inspect", "-f", "{{.State.Running}}", pod.container, check=False)
        return out.stdout.strip() == "false"

    def logs(self, pod: Pod) -> str:
        out = podman("logs", "--tail", "40", pod.container, check=False)
        return (out.stdout + out.stderr)[-6000:]

    def _run_flags(
        self, pod_name: str, spec: Mapping[str, Any], container: str, address: str = ""
    ) -> list[str]:
        (c,) = spec["containers"]
        flags = [
            "--name",
            container,
            "--hostname",
            pod_name,
            "--network",
            self.name,
            *ULIMITS,
            *self.hosts(),
        ]
        sec = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
        if "runAsUser" in sec:
            flags += ["--user", f"{sec['runAsUser']}:{sec.get('runAsGroup', sec['runAsUser'])}"]
        if sec.get("readOnlyRootFilesystem"):
            flags.append("--read-only")
        if sec.get("capabilities", {}).get("drop") == ["ALL"]:
            flags += ["--cap-drop", "all"]
        if sec.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        flags += self._volume_flags(pod_name, spec, c)
        for key, value in pod_env(pod_name, address, c).items():
            flags += ["--env", f"{key}={value}"]
        return flags

    def _volume_flags(
        self, pod_name: str, spec: Mapping[str, Any], c: Mapping[str, Any]
    ) -> list[str]:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        flags: list[str] = []
        for mount in c.get("volumeMounts", []):
            vol = volumes.get(mount["name"])
            if vol is not None and "emptyDir" in vol:
                flags += ["--tmpfs", f"{mount['mountPath']}:rw,size=64m,mode=1777"]
            elif vol is None:  # a volumeClaimTemplate: the pod's own retained claim
                claim = f"{self.name}-{mount['name']}-{pod_name}"
                if podman("volume", "exists", claim, check=False).returncode != 0:
                    podman("volume", "create", claim)
                flags += ["--volume", f"{claim}:{mount['mountPath']}"]
            else:
                raise AssertionError(f"volume kind of {vol} is not emulated")
        return flags

    def _image_and_command(self, spec: Mapping[str, Any]) -> list[str]:
        (c,) = spec["containers"]
        image = self.image  # the image under test, whatever tag the chart names
        if "command" in c:
            first, *rest = c["command"]
            return ["--entrypoint", first, image, *rest, *c.get("args", [])]
        return [image, *c.get("args", [])]


def pod_env(pod_name: str, pod_ip: str, container: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: fieldRef metadata.name is the pod
    name, status.podIP its address, ``$(VAR)`` expands from entries defined before it (unknown
    ones stay as written)."""
    fields = {"metadata.name": pod_name, "status.podIP": pod_ip}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = ENV_REFERENCE.sub(
                lambda m: env.get(m.group(1), m.group(0)), entry["value"]
            )
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") in fields:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"env source of {entry['name']} is not emulated: {entry}")
    return env


@contextlib.contextmanager
def pod_network(name: str, subnet_prefix: str, image: str) -> Iterator[PodNetwork]:
    """A fresh internal network ``name`` (``subnet_prefix``.0/24); on exit every container and
    claim volume of it is removed."""
    podman("network", "rm", "-f", name, check=False)
    podman("network", "create", "--internal", "--subnet", f"{subnet_prefix}.0/24", name)
    net = PodNetwork(name, subnet_prefix, image)
    try:
        yield net
    finally:
        for pod in net.pods.values():
            podman("rm", "-f", "-v", "-t", "0", pod.container, check=False)
        podman("network", "rm", "-f", name, check=False)
        out = podman("volume", "ls", "-q", "--filter", f"name={name}-", check=False)
        for vol in out.stdout.split():
            podman("volume", "rm", "-f", vol, check=False)
