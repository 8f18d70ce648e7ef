"""Faults: start writer processes, SIGKILL them, or let a failpoint kill them; always reap them.

A :class:`WriterProcess` is a context manager: leaving the ``with`` block kills (SIGKILL) and
reaps the process if it is still running, so a failed assertion never leaks a writer that keeps
appending to a directory pytest is about to delete.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from services.common import failpoints
from tests.robustness.writer import Ack, read_acks
from tests.support.until import until_sync

REPO_ROOT = Path(__file__).resolve().parents[2]
SIGKILLED = -signal.SIGKILL
"""``Popen.returncode`` of a process that died by SIGKILL."""
READY_TIMEOUT_S = 20.0
"""Start-up (imports, recovery) of a writer on a busy 2-core CI box."""


class WriterProcess:
    """One run of ``python -m tests.robustness.writer``; stdout and stderr go to files."""

    def __init__(
        self,
        store_dir: Path,
        seed: int,
        log_dir: Path,
        *,
        count: int | None = None,
        start_seq: int = 0,
        failpoint: str | None = None,
        writers: int | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.seed = seed
        log_dir.mkdir(parents=True, exist_ok=True)
        tag = f"writer-{seed}" + (f"-{failpoint.split('=')[0]}" if failpoint else "")
        self.out_path = _unused(log_dir / f"{tag}.out")
        self.err_path = self.out_path.with_suffix(".err")
        self.argv = [sys.executable, "-m", "tests.robustness.writer", str(store_dir)]
        self.argv += ["--seed", str(seed), "--start-seq", str(start_seq)]
        if count is not None:
            self.argv += ["--count", str(count)]
        if writers is not None:
            self.argv += ["--writers", str(writers)]
        self.env = {k: v for k, v in os.environ.items() if k != failpoints.ENV_VAR}
        if failpoint is not None:
            name = failpoint.split("=", 1)[0]
            assert name in failpoints.KNOWN, f"unknown failpoint {name!r}"
            self.env[failpoints.ENV_VAR] = failpoint
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> WriterProcess:
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO_ROOT, env=self.env, stdout=out, stderr=err
            )
        return self

    def __enter__(self) -> WriterProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()

    def kill(self) -> int:
        """SIGKILL the writer (if it still runs) and reap it; returns its return code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait()

    def wait(self, timeout_s: float) -> int:
        """Wait for the writer to exit by itself; on timeout, kill it and fail loudly."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"writer {self.argv} still running after {timeout_s} s\n{self.describe()}"
            ) from None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until the writer printed READY (store open and recovered)."""
        assert self.proc is not None
        proc = self.proc

        def ready() -> bool:
            if self.out_path.read_bytes().startswith(b"READY "):
                return True
            if proc.poll() is not None:
                raise AssertionError(f"writer exited before READY\n{self.describe()}")
            return False

        try:
            until_sync(ready, "the writer's READY line", timeout_s, 0.01)
        except AssertionError:
            if proc.poll() is not None:
                raise
            self.kill()
            raise AssertionError(
                f"writer not READY within {timeout_s} s\n{self.describe()}"
            ) from None

    # -- results ---------------------------------------------------------------------------------
    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def acks(self) -> list[Ack]:
        return read_acks(self.out_path)

    def stdout_text(self) -> str:
        return self.out_path.read_text(errors="replace")

    def describe(self) -> str:
        env = self.env.get(failpoints.ENV_VAR, "")
        err = self.err_path.read_text(errors="replace")[-3000:] if self.err_path.exists() else ""
        return (
            f"writer seed={self.seed} rc={self.returncode} {failpoints.ENV_VAR}={env!r}\n"
            f"stdout: {self.out_path} ({len(self.acks())} acks)\nstderr tail:\n{err}"
        )


def _unused(path: Path) -> Path:
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
    return candidate


def run_and_sigkill(
    store_dir: Path, seed: int, log_dir: Path, delay_s: float, **kw: object
) -> WriterProcess:
    """Start a writer, let it write for ``delay_s`` after READY, SIGKILL it."""
    with WriterProcess(store_dir, seed, log_dir, **kw) as writer:  # type: ignore[arg-type]
        writer.wait_ready()
        time.sleep(delay_s)
        still_running = writer.proc is not None and writer.proc.poll() is None
        rc = writer.kill()
    assert still_running and rc == SIGKILLED, f"writer ended before the kill\n{writer.describe()}"
    return writer


def run_clean(store_dir: Path, seed: int, log_dir: Path, count: int, **kw: object) -> WriterProcess:
    """Run a writer for ``count`` messages to a clean shutdown."""
    with WriterProcess(store_dir, seed, log_dir, count=count, **kw) as writer:  # type: ignore[arg-type]
        rc = writer.wait(60)
    assert rc == 0 and "DONE" in writer.stdout_text(), writer.describe()
    return writer


@dataclass(frozen=True)
class BaseStore:
    """A store one writer filled to a clean shutdown, and that writer's ACKs."""

    path: Path
    acks: list[Ack]
    seed: int

    def copy_to(self, target: Path) -> Path:
        shutil.copytree(self.path, target)
        return target
