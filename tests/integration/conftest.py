"""Integration tier: no test may leave a RocketQ process running after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cluster import reap_all


@pytest.fixture(autouse=True)
def _reap_processes() -> Iterator[None]:
    yield
    reap_all()
