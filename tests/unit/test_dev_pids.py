"""``rocketq dev down`` and the test helper stop a recorded pid only while it still runs that
instance's server: pids are recycled, and a recycled pid may run the same kind of server for
another instance (a CI run lost two other tests' clusters to a blind SIGKILL)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli._children import is_ours

pytestmark = pytest.mark.unit


@pytest.fixture
def broker_of_instance_a(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A process whose command line is that of instance A's broker (its ready file)."""
    base = (tmp_path / "a").resolve()
    ready = base / "run" / "broker.ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; print('up', flush=True); sys.stdin.read()",
            "--ready-file",
            str(ready),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    # Popen returns once the exec has begun, before the kernel has set up the new command
    # line: /proc/PID/cmdline can still read empty then (a CI run saw it). The child's first
    # line says it runs.
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    try:
        yield proc.pid, base
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_is_ours_only_for_the_instance_whose_server_it_runs(
    broker_of_instance_a: tuple[int, Path], tmp_path: Path
) -> None:
    pid, base_a = broker_of_instance_a
    base_b = (tmp_path / "b").resolve()
    assert is_ours(pid, "broker", base_a)
    assert not is_ours(pid, "broker", base_b), "another instance's broker of the same kind"
    assert not is_ours(pid, "namesrv", base_a), "the same instance's other server"
