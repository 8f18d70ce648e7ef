"""The e2e tests' CLI runner: tests/support/cli.py, re-exported so tests import it from here."""

from __future__ import annotations

from tests.support.cli import (
    REPO_ROOT,
    ROCKETQ_SCRIPT,
    dev_pids,
    dev_up,
    json_lines,
    ok,
    rocketq,
)

__all__ = [
    "REPO_ROOT",
    "ROCKETQ_SCRIPT",
    "dev_pids",
    "dev_up",
    "json_lines",
    "ok",
    "rocketq",
]
