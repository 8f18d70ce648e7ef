"""The one way to run a RocketQ service as a child process (``rocketq dev up``, the test
cluster, the benchmarks).

:func:`spawn` starts ``python -m MODULE ARGS --ready-file F`` (optionally under an argv prefix
such as ``ip netns exec NS``, with extra environment, a working directory and its output
appended to a log file) and waits until the service writes its ready file (``{"addr", "pid"}``,
services.common.bootstrap) — or fails with the tail of its log if it exits first or is not ready
in time. :func:`launch` does the same for any command with a caller-given readiness check (etcd
answers ``/health``). A :class:`Process` can then be stopped (SIGTERM, SIGKILL after a
timeout), killed, paused, restarted with the same command, and asked whether it is alive.
:func:`children_die_with_this_process` has the kernel stop them if this process dies first.

The repository root goes first on the child's ``PYTHONPATH``, so the services import from this
checkout whatever the child's working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
KILL_WAIT_S = 10.0
POLL_INTERVAL_S = 0.02
LOG_TAIL_LINES = 60
ROOT = Path(__file__).resolve().parents[2]
"""The repository (or installed tree) root that holds the ``services`` package."""

_DIE_WITH_US: list[str] = []
"""The argv prefix that has the kernel stop a child when this process dies (see
:func:`children_die_with_this_process`); empty until then."""

Readiness = Callable[["Process"], "str | None"]
"""Returns the process's address once it is ready, None while it is not yet."""


class SpawnError(RuntimeError):
    """A child exited while starting or was not ready in time (the message has its log tail)."""


class StopTimeout(RuntimeError):
    """A child ignored SIGTERM for the whole timeout and was killed."""


@dataclass
class Process:
    """One supervised child. The first eight fields are positional in older callers."""

    name: str
    proc: subprocess.Popen[bytes]
    addr: str
    workdir: Path
    log_path: Path
    argv: list[str] = field(default_factory=list)
    """The command, without ``prefix``."""
    env: dict[str, str] | None = None
    """Extra environment it was started with (kept by :func:`restart`)."""
    prefix: list[str] = field(default_factory=list)
    """argv run before ``argv`` (e.g. ``ip netns exec NS``; kept by :func:`restart`)."""
    ready_file: Path | None = None
    readiness: Readiness | None = None
    new_session: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code; StopTimeout (after
        a SIGKILL) if it did not exit within ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise StopTimeout(
                f"{self.name} did not stop within {timeout_s}s\n{self.log_tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(KILL_WAIT_S)

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def wait_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        return self.proc.wait(timeout_s)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" if it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository root on PYTHONPATH, then ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def read_ready_file(sp: Process) -> str | None:
    """Readiness of a RocketQ service: the ``addr`` of its ready file, once written."""
    assert sp.ready_file is not None
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads(sp.ready_file.read_text())["addr"])
    return None


def children_die_with_this_process() -> None:
    """From now on, the kernel sends SIGTERM to every child this process starts when this
    process dies, however it dies: a benchmark killed with SIGKILL (or a terminal closed on
    it) leaves no brokers running behind it. ``setpriv --pdeathsig`` (util-linux) sets the
    signal in the child before it execs the service.

    The kernel ties the signal to the *thread* that started the child, not the process: call
    this only where children are started from the main thread (a benchmark's ``main``), never
    where a worker thread that ends first may start one (its children would be stopped with
    it). A no-op where setpriv is missing. A process killed in the instant between starting a
    child and setpriv's exec of the service still orphans it; :func:`spawn` waits for the
    service to be ready, long past that instant."""
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        _DIE_WITH_US[:] = [setpriv, "--pdeathsig", "TERM"]


def launch(
    name: str,
    argv: list[str],
    workdir: Path,
    readiness: Readiness,
    *,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    log_path: Path | None = None,
    ready_file: Path | None = None,
    new_session: bool = False,
    wait: bool = True,
    timeout_s: float = READY_TIMEOUT_S,
) -> Process:
    """Start ``prefix + argv`` in ``workdir`` (its cwd), output appended to ``log_path``
    (default ``workdir/NAME.log``), and (if ``wait``) wait until ``readiness`` gives its
    address. ``new_session`` keeps a terminal's Ctrl-C away from it (the parent stops it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or workdir / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*_DIE_WITH_US, *(prefix or []), *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=str(workdir),
            start_new_session=new_session,
        )
    sp = Process(name, proc, "", workdir, log_path, list(argv), env, list(prefix or []))
    sp.ready_file, sp.readiness, sp.new_session = ready_file, readiness, new_session
    if wait:
        wait_ready([sp], timeout_s)
    return sp


def wait_ready(processes: list[Process], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until every process is ready (its readiness gives an address); on an early exit or the
    timeout, kill them all and raise SpawnError with the log tail of the ones that failed."""
    # Readiness gives None until ready; "" is a ready process that serves no address (a
    # test's worker, whose ready file says {"addr": ""}).
    waiting = list(processes)
    deadline = time.monotonic() + timeout_s
    while waiting:
        for sp in list(waiting):
            if sp.proc.poll() is not None:
                _kill_all(processes)
                raise SpawnError(
                    f"{sp.name} exited with code {sp.proc.returncode} while starting; "
                    f"last lines of {sp.log_path}:\n{sp.log_tail()}"
                )
            assert sp.readiness is not None
            addr = sp.readiness(sp)
            if addr is not None:
                sp.addr = addr
                waiting.remove(sp)
        if waiting and time.monotonic() >= deadline:
            _kill_all(processes)
            raise SpawnError(
                f"{[sp.name for sp in waiting]} not ready within {timeout_s:g}s\n"
                + "\n".join(sp.log_tail(20) for sp in waiting)
            )
        if waiting:
            time.sleep(POLL_INTERVAL_S)


def _kill_all(processes: list[Process]) -> None:
    for sp in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            sp.kill()


def spawn(
    name: str,
    module: str,
    args: list[str],
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    log_path: Path | None = None,
    ready_file: Path | None = None,
    new_session: bool = False,
    timeout_s: float = READY_TIMEOUT_S,
) -> Process:
    """Start ``python -m module args --ready-file F`` and wait for its ready file (default
    ``workdir/NAME.ready``); see :func:`launch` for the rest."""
    ready_file = ready_file or workdir / f"{name}.ready"
    argv = [sys.executable, "-m", module, *args, "--ready-file", str(ready_file)]
    return launch(
        name,
        argv,
        workdir,
        read_ready_file,
        env=env,
        prefix=prefix,
        log_path=log_path,
        ready_file=ready_file,
        new_session=new_session,
        timeout_s=timeout_s,
    )


def restart(sp: Process, timeout_s: float = READY_TIMEOUT_S) -> Process:
    """Start the same command again (same data, environment, prefix); a service that listened
    on port 0 may come back on another port."""
    assert sp.readiness is not None, f"{sp.name} was not started by the supervisor"
    return launch(
        sp.name,
        sp.argv,
        sp.workdir,
        sp.readiness,
        env=sp.env,
        prefix=sp.prefix,
        log_path=sp.log_path,
        ready_file=sp.ready_file,
        new_session=sp.new_session,
        timeout_s=timeout_s,
    )


def cmdline_has(pid: int, marker: str) -> bool:
    """Whether process ``pid`` runs with ``marker`` as one of its arguments (a recycled pid
    running something else does not)."""
    try:
        return marker in psutil.Process(pid).cmdline()
    except psutil.Error:  # gone, a zombie, or not ours to read
        return False


def pid_state(pid: int) -> str | None:
    """The kernel's state of process ``pid`` (``psutil.STATUS_*``: running, sleeping, stopped,
    zombie, ...); None once it is gone."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return None


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs: a zombie (exited, not yet reaped) counts as gone."""
    return pid_state(pid) not in (None, psutil.STATUS_ZOMBIE)


def stop_pid(
    pid: int, still_ours: Callable[[int], bool], timeout_s: float = STOP_TIMEOUT_S
) -> bool:
    """Stop a process that may not be our child (``rocketq dev down`` of a detached run):
    SIGTERM, wait, SIGKILL after ``timeout_s``. True if it stopped cleanly (or was gone)."""
    if not still_ours(pid):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
            if done:
                return True
        if not still_ours(pid) or not pid_alive(pid):
            return True
        time.sleep(POLL_INTERVAL_S)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return False
