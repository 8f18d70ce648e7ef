"""The container image is built once per test session (tools/build_image.sh, what `make image`
runs) and shared by every podman test; its build time is printed in the summary (CI cost)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.podman_pods import build_image, ensure_podman

IMAGE = "localhost/rocketq:test"
_BUILD_SECONDS: list[float] = []


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    ensure_podman()
    _BUILD_SECONDS.append(build_image(IMAGE))
    yield IMAGE


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for seconds in _BUILD_SECONDS:
        terminalreporter.write_line(f"container image {IMAGE} built in {seconds:.1f} s")
