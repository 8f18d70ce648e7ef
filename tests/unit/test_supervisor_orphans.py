"""A benchmark killed with SIGKILL leaves no children behind once it called
``supervisor.children_die_with_this_process`` (and, without the call, they outlive it: the
kernel, not a cleanup handler, is what stops them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from services.common import supervisor
from tests.support.until import until_sync

# The "benchmark": starts a child that would run for a minute, says its pid, then waits to be
# killed. ``supervisor.launch`` is the path every service child takes (spawn goes through it).
PARENT = """
import sys, time
from pathlib import Path
from services.common import supervisor
if sys.argv[1] == "guarded":
    supervisor.children_die_with_this_process()
child = supervisor.launch("sleeper", ["sleep", "60"], Path(sys.argv[2]), lambda _sp: "")
print(child.proc.pid, flush=True)
time.sleep(60)
"""


def _running(pid: int, program: str) -> bool:
    """True once ``pid`` runs ``program``: setpriv has set the signal and exec'd it (a parent
    killed before that moment leaves an orphan the kernel was never asked to stop)."""
    try:
        return psutil.Process(pid).name() == program
    except psutil.Error:
        return False


StartParent = Callable[[str], tuple[subprocess.Popen[str], int]]
"""Starts the benchmark above ("guarded" or not); gives it and its child's pid."""


@pytest.fixture
def start_parent(tmp_path: Path) -> Iterator[StartParent]:
    started: list[int] = []

    def start(mode: str) -> tuple[subprocess.Popen[str], int]:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, mode, str(tmp_path / mode)],
            stdout=subprocess.PIPE,
            text=True,
            env=supervisor.child_env(),
        )
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        started.append(child_pid)
        return parent, child_pid

    yield start
    for pid in started:
        if supervisor.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(supervisor.shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_children_die_with_a_benchmark_killed_by_sigkill(start_parent: StartParent) -> None:
    parent, child = start_parent("guarded")
    until_sync(lambda: _running(child, "sleep"), "the child to run its program")
    parent.kill()
    parent.wait()
    until_sync(lambda: not supervisor.pid_alive(child), "the child to get SIGTERM from the kernel")


def test_without_the_call_children_outlive_a_killed_parent(start_parent: StartParent) -> None:
    parent, child = start_parent("unguarded")
    until_sync(lambda: _running(child, "sleep"), "the child to run its program")
    parent.kill()
    parent.wait()
    assert supervisor.pid_alive(child)  # what the call is for (the fixture kills it)
