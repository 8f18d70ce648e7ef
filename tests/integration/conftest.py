"""Integration tier: no test may leave a RocketQ process running after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cluster import reap_since, spawned_count


@pytest.fixture(autouse=True)
def _reap_processes() -> Iterator[None]:
    # Autouse fixtures set up before the test's other function-scoped fixtures and tear down
    # after them, so the mark sits after module-scoped processes (left alone) and before
    # anything this test starts (its fixtures stop theirs first; leftovers are killed here).
    mark = spawned_count()
    yield
    reap_since(mark)
