"""The layering of DESIGN.md §2 at run time, where import-linter cannot look.

import-linter (``make lint``) reads import lines. A package ``__init__`` that imports the world
breaks the layering with every line looking right: ``services.store.commitlog`` imports
``rocketq.codec``, which first runs ``rocketq/__init__.py``. So this test imports the storage
engine and the grpc-free library modules in a fresh interpreter where grpc and protobuf cannot be
found, and names the import chain of anything that still reaches for them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import rocketq

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

#: Library modules the store (and any grpc-free process) may import.
GRPC_FREE_LIBRARY = ["rocketq.codec", "rocketq.message", "rocketq.java_hash", "rocketq.validation"]

# Runs in the child interpreter. A meta-path finder placed first refuses grpc and protobuf and
# records the chain of modules whose top-level code was running when they were asked for (the
# frames of module bodies on the stack, outermost first). Prints one JSON report.
_CHILD = r"""
import importlib, json, sys

chains = []

def blocked(name):
    return (name == "grpc" or name.startswith(("grpc.", "grpc_"))
            or name == "google.protobuf" or name.startswith("google.protobuf."))

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if not blocked(name):
            return None
        frame, chain = sys._getframe(1), []
        while frame is not None:
            module = frame.f_globals.get("__name__")
            if frame.f_code.co_name == "<module>" and module not in (None, "__main__"):
                chain.append(module)
            frame = frame.f_back
        chains.append(" -> ".join([*reversed(chain), name]))
        raise ModuleNotFoundError(f"{name} is refused by test_layering", name=name)

sys.meta_path.insert(0, Refuse())
failures = {}
for module in json.loads(sys.argv[1]):
    del chains[:]
    try:
        importlib.import_module(module)
    except Exception as exc:
        failures[module] = {"error": repr(exc), "chains": list(chains)}
leaked = sorted(m for m in sys.modules if blocked(m))
try:
    import grpc  # the finder must work, or the test proves nothing
    refuses_grpc = False
except ModuleNotFoundError:
    refuses_grpc = True
print(json.dumps({"failures": failures, "leaked": leaked, "refuses_grpc": refuses_grpc}))
"""


def _modules_of(package_dir: Path) -> list[str]:
    """Every module of a package, from its files (importing it to list it would defeat the test)."""
    package = ".".join(package_dir.relative_to(ROOT).parts)
    names = [package]
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts != tuple(package.split(".")):
            names.append(".".join(parts))
    return names


def test_store_and_codec_import_without_grpc_or_protobuf() -> None:
    modules = [*GRPC_FREE_LIBRARY, *_modules_of(ROOT / "services" / "store")]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["refuses_grpc"], "the child's finder did not refuse grpc; the check is void"
    failures = [
        f"{module}: {failure['error']}\n    " + "\n    ".join(failure["chains"] or ["(no chain)"])
        for module, failure in report["failures"].items()
    ]
    assert not failures, "imports that need grpc or protobuf:\n" + "\n".join(failures)
    assert not report["leaked"], f"grpc/protobuf modules loaded anyway: {report['leaked']}"


def test_private_module_contract_lists_every_private_sdk_module() -> None:
    """The import-linter contract names private modules one by one (its expressions cannot match
    a leading underscore); a private module added to the SDK must be added to it too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if "rocketq.client.internal" in c["name"]]
    private = {
        name
        for name in _modules_of(ROOT / "rocketq" / "client")
        if name.rsplit(".", 1)[-1].startswith("_")
    }
    private.add("rocketq.client.consumer.process_queue")
    assert set(contract["forbidden_modules"]) == private


def test_lazy_export_table_matches_all() -> None:
    table = set(rocketq._MODULE_OF)
    assert table == set(rocketq.__all__) - {"__version__"}
