"""The RPC fuzzer in CI (issue 21): a short, fixed-seed run against real service processes.

Every RPC of the nameserver, broker and timer-wheel gets random messages, raw bytes and stream
frames (see :mod:`tests.robustness.fuzz_rpc`); afterwards every server must be alive and
SERVING, a round trip must work, no answer may be INTERNAL or UNKNOWN or carry trailers a
standard client refuses, no log may hold a handler traceback, and ``store verify`` must be clean.
Longer explorations: ``python -m tests.robustness.fuzz_rpc --budget-s 600 --seed N``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.robustness.fuzz_rpc import run

pytestmark = [pytest.mark.robustness, pytest.mark.slow]

SEED = 21
BUDGET_S = 20.0


def test_fuzz_every_rpc_of_every_service(tmp_path: Path) -> None:
    findings = run(tmp_path, BUDGET_S, SEED)
    print(findings.summary())
    assert findings.ok, findings.summary()
    # the run really exercised the servers: most inputs are refused, some accepted
    assert findings.codes["INVALID_ARGUMENT"] > 50, findings.summary()
    assert findings.codes["OK"] > 10, findings.summary()
