"""Fixtures of the robustness suite: where to keep a failed run, and one clean base store."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.robustness.harness import BaseStore, run_clean

KEEP_DIR_ENV = "ROCKETQ_ROBUSTNESS_KEEP_DIR"
"""Keep failed runs here (one subdirectory per test) instead of under pytest's tmp_path."""
BASE_SEED = 7001
BASE_COUNT = 1200
"""Enough for ~30 commitlog files, ~5 consume-queue files per queue and 4 index files."""


@pytest.fixture
def keep_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where the checker copies the evidence of a failed run (etcd's ``report/``)."""
    root = os.environ.get(KEEP_DIR_ENV)
    if not root:
        return tmp_path / "failed-run"
    return Path(root) / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)


@pytest.fixture(scope="session")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> BaseStore:
    root = tmp_path_factory.mktemp("base-store")
    writer = run_clean(root / "store", BASE_SEED, root / "logs", BASE_COUNT)
    acks = writer.acks()
    assert len(acks) == BASE_COUNT, writer.describe()
    return BaseStore(root / "store", acks, BASE_SEED)


@pytest.fixture
def fresh_copy(base_store: BaseStore, tmp_path: Path) -> Callable[[], Path]:
    """A private copy of the base store for a test to damage."""
    return lambda: base_store.copy_to(tmp_path / "store")
