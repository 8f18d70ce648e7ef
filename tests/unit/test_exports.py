"""Guards the public surface: `import rocketq` exposes exactly what it declares, and the client
library never imports the server side (DESIGN.md §2: services depend on rocketq, not back)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rocketq

pytestmark = pytest.mark.unit


def test_all_names_exist() -> None:
    for name in rocketq.__all__:
        assert hasattr(rocketq, name), name


def test_public_names_are_declared() -> None:
    public = {n for n in vars(rocketq) if not n.startswith("_")}
    undeclared = public - set(rocketq.__all__) - {"annotations", "version", "PackageNotFoundError"}
    # submodules imported as a side effect are fine; anything else must be in __all__
    undeclared = {n for n in undeclared if not hasattr(getattr(rocketq, n), "__path__")}
    undeclared -= {"codec", "java_hash"}
    assert not undeclared, f"public names missing from rocketq.__all__: {sorted(undeclared)}"


def test_client_library_does_not_import_services() -> None:
    code = (
        "import sys, rocketq, rocketq.codec, rocketq.java_hash\n"
        "bad = [m for m in sys.modules if m == 'services' or m.startswith('services.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
