"""Run the ``rocketq`` command as a user does: the installed console script, in a subprocess.

One runner for the e2e and robustness tests (tests/e2e/conftest.py re-exports it):

- ``rocketq(*args)`` runs the command and returns the finished process (stdout and stderr as
  text); ``check=True`` fails the test, with both streams in the message, on a non-zero exit.
- ``ok(*args)`` is ``rocketq(..., check=True).stdout``.
- ``json_lines(text)`` parses the one-JSON-object-per-line output of ``--json`` commands.
- ``dev_up(base, *args)`` runs ``rocketq dev up --dir BASE ARGS`` for a module fixture and, on
  exit, ``dev down`` plus a SIGKILL of every process it started, so no server outlives a test.

It invokes ``Path(sys.executable).with_name("rocketq")`` — the console script of the
environment running the tests — never a module path, so the tests do not depend on where the
command's entry point lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from services.cli._children import is_ours

REPO_ROOT = Path(__file__).resolve().parents[2]
ROCKETQ_SCRIPT = Path(sys.executable).with_name("rocketq")
DEFAULT_TIMEOUT_S = 60.0


def rocketq(
    *args: str,
    stdin: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``rocketq ARGS`` from the repository root and return the finished process.

    ``env`` is added to (not a replacement for) this process's environment; ``stdin`` is fed
    as text; ``check`` asserts a zero exit status.
    """
    assert ROCKETQ_SCRIPT.exists(), f"no rocketq console script at {ROCKETQ_SCRIPT}"
    out = subprocess.run(
        [str(ROCKETQ_SCRIPT), *args],
        check=False,
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env} if env is not None else None,
    )
    if check:
        assert out.returncode == 0, (
            f"rocketq {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        )
    return out


def ok(
    *args: str,
    stdin: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run ``rocketq ARGS``, fail the test unless it exits 0, and return its stdout."""
    return rocketq(*args, stdin=stdin, timeout_s=timeout_s, env=env, check=True).stdout


def json_lines(text: str) -> list[dict[str, Any]]:
    """One JSON object per non-blank line, as ``--json`` commands print them."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def dev_pids(base: Path) -> dict[str, int]:
    """The pid of every process ``dev up`` recorded in BASE/pids.json, by name (none if
    unreadable)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        processes = json.loads((base / "pids.json").read_text())["processes"]
        return {name: int(p["pid"]) for name, p in processes.items()}
    return {}


@contextlib.contextmanager
def dev_up(
    base: Path,
    *args: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.CompletedProcess[str]]:
    """``rocketq dev up --dir BASE ARGS`` (it must exit 0); yields the finished command.

    Afterwards ``rocketq dev down --dir BASE`` (a no-op if a test already ran it) and SIGKILL of
    every recorded process, whatever happened in between — also when ``dev up`` itself failed.
    The broker's gateway is off (``--gateway-port 0``: tests run side by side; its default 8081
    would clash) unless ``args`` give a port (the last one wins).
    """
    try:
        yield rocketq(
            *("dev", "up", "--dir", str(base), "--gateway-port", "0", *args),
            timeout_s=timeout_s,
            env=env,
            check=True,
        )
    finally:
        pids = dev_pids(base)
        rocketq("dev", "down", "--dir", str(base), timeout_s=timeout_s, env=env)
        for name, pid in pids.items():
            # Only a process still running this instance's server: after dev down its pid is
            # free, and another test's nameserver or broker may have it already (a CI run
            # lost two clusters so).
            if is_ours(pid, name, base.resolve()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
