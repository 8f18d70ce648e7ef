"""Regenerate rocketq/_api from proto/: the one way generated code is made (DESIGN.md habit 3).

    python tools/gen_protos.py           rewrite rocketq/_api to match proto/
    python tools/gen_protos.py --check   regenerate into a temp dir; exit 1 with a diff summary
                                         if the committed rocketq/_api differs

Why post-processing: protoc names Python modules after proto paths, so
`import "rocketq/v1/common.proto";` becomes `from rocketq.v1 import common_pb2`. That module does
not exist; the code lives under rocketq._api. Protobuf has no Python equivalent of go_package,
so this script rewrites those imports (and the module names passed to the protobuf builder) to
`rocketq._api.rocketq.v1`, then fails loudly if any unrewritten reference is left, which would
mean a new protoc or mypy-protobuf changed its output format.

Output is a pure function of proto/ and the tool versions: proto files are passed in sorted
order, nothing embeds a timestamp or an absolute path, and `__init__.py` files are written here
with fixed text. The tool versions are recorded in rocketq/_api/__init__.py so a failing check
can tell "proto changed" apart from "different grpcio-tools installed".

Exit status: 0 up to date (or rewritten), 1 --check found differences, 2 generation failed.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
API_ROOT = REPO_ROOT / "rocketq" / "_api"
# Python package that API_ROOT is; generated imports are re-rooted under it.
API_PACKAGE = "rocketq._api"

# Generated files per proto: messages, gRPC stubs, and mypy-protobuf stubs for both.
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")
# Limits on what --check prints, so a wholesale change stays readable in CI logs.
DIFF_LINES_PER_FILE_MAX = 40
DIFF_FILES_SHOWN_MAX = 10
# Serialized descriptors are one line of several KiB; show only its start.
DIFF_LINE_CHARS_MAX = 160

INIT_ROOT_TEMPLATE = '''"""Code generated from proto/ by tools/gen_protos.py. DO NOT EDIT.

Regenerate with `python tools/gen_protos.py` (make gen-protos); CI runs it with --check.
Generated with grpcio-tools {grpc_tools}, mypy-protobuf {mypy_protobuf}.
Modules: rocketq._api.rocketq.v1.<name>_pb2 (messages) and <name>_pb2_grpc (stubs, servicers).
"""
'''
INIT_SUB_TEXT = '"""Generated package; see rocketq/_api/__init__.py. DO NOT EDIT."""\n'


class GenerationError(Exception):
    """protoc failed, a plugin is missing, or the output had an unexpected shape."""


def proto_files(proto_root: Path) -> list[Path]:
    """All .proto files under proto_root, relative to it, in a stable order."""
    files = sorted(p.relative_to(proto_root) for p in proto_root.rglob("*.proto"))
    if not files:
        raise GenerationError(f"no .proto files under {proto_root}")
    return files


def plugin_path(name: str) -> Path:
    """The protoc plugin installed next to this interpreter (the venv's bin directory)."""
    # Not Path(sys.executable).resolve(): in a venv that follows the symlink out of the venv.
    scripts = Path(sysconfig.get_path("scripts"))
    for candidate in (scripts / name, Path(sys.executable).parent / name):
        if candidate.is_file():
            return candidate
    found = shutil.which(name)
    if found is None:
        raise GenerationError(
            f"{name} not found next to {sys.executable}; install the dev extras "
            "(mypy-protobuf) into this environment"
        )
    return Path(found)


def run_protoc(proto_root: Path, out_dir: Path) -> None:
    """Run grpc_tools.protoc over every proto into out_dir."""
    files = proto_files(proto_root)
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",  # adds the well-known types (google/protobuf/*.proto) to -I itself
        "-I.",
        *(f"--plugin={name}={plugin_path(name)}" for name in PLUGINS),
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out=quiet:{out_dir}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        *(f.as_posix() for f in files),
    ]
    # cwd = proto_root and relative names: the "source:" comments then name proto-relative paths.
    result = subprocess.run(command, cwd=proto_root, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GenerationError(
            f"protoc failed (exit {result.returncode}):\n{result.stderr}{result.stdout}"
        )
    if result.stderr.strip():  # warnings (e.g. unused imports) must not pass silently
        print(result.stderr.rstrip(), file=sys.stderr)


def top_level_packages(proto_root: Path) -> list[str]:
    """First path components of the protos (their Python top-level packages), e.g. ["rocketq"]."""
    return sorted({f.parts[0] for f in proto_files(proto_root) if len(f.parts) > 1})


def rewrite_imports(text: str, packages: list[str]) -> str:
    """Re-root generated references to our own protos under API_PACKAGE.

    Touches only import lines and quoted module names ('rocketq.v1.common_pb2' given to the
    protobuf builder, which becomes the classes' __module__). The serialized descriptor keeps
    proto paths ("rocketq/v1/common.proto") and proto names (".rocketq.v1.Message"), which are
    protobuf identities, not Python modules, and must stay as they are.
    """
    alternatives = "|".join(re.escape(p) for p in packages)
    text = re.sub(
        rf"^(\s*)(from|import) ((?:{alternatives})\.)",
        rf"\1\2 {API_PACKAGE}.\3",
        text,
        flags=re.MULTILINE,
    )
    return re.sub(
        rf"""(['"])((?:{alternatives})(?:\.\w+)*_pb2(?:_grpc)?)\1""",
        rf"\1{API_PACKAGE}.\2\1",
        text,
    )


def check_rewritten(path: Path, text: str, packages: list[str]) -> None:
    """Fail if a reference to a generated module escaped the rewrite."""
    alternatives = "|".join(re.escape(p) for p in packages)
    pattern = re.compile(rf"(?<![\w.])(?:{alternatives})\.[\w.]*_pb2\b")
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("DESCRIPTOR = "):  # serialized descriptor: proto identities only
            continue
        for match in pattern.finditer(line):
            if not match.group(0).startswith(f"{API_PACKAGE}."):
                raise GenerationError(
                    f"{path}:{number}: reference {match.group(0)!r} was not re-rooted under "
                    f"{API_PACKAGE}; the generator's output format changed, update "
                    "rewrite_imports"
                )


def drop_serviceless_grpc_modules(out_dir: Path) -> None:
    """Delete the *_pb2_grpc modules of protos that declare no service (e.g. common.proto).

    grpc_python_out writes one for every proto; without a service it holds only a grpcio version
    check, an import that can fail for nothing.
    """
    for path in sorted(out_dir.rglob("*_pb2_grpc.py")):
        if re.search(r"^class \w+Stub\b", path.read_text(encoding="utf-8"), re.MULTILINE) is None:
            path.unlink()
            path.with_suffix(".pyi").unlink(missing_ok=True)


def post_process(out_dir: Path, packages: list[str]) -> None:
    """Rewrite imports in every generated file and add the __init__.py files."""
    drop_serviceless_grpc_modules(out_dir)
    for path in sorted(out_dir.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        text = rewrite_imports(path.read_text(encoding="utf-8"), packages)
        check_rewritten(path.relative_to(out_dir), text, packages)
        path.write_text(text, encoding="utf-8")
    # Every directory between out_dir and a module must be a regular package.
    modules = list(out_dir.rglob("*.py"))
    package_dirs = {d for m in modules for d in m.parents if d.is_relative_to(out_dir)}
    for directory in sorted(package_dirs - {out_dir}):
        (directory / "__init__.py").write_text(INIT_SUB_TEXT, encoding="utf-8")
    (out_dir / "__init__.py").write_text(
        INIT_ROOT_TEMPLATE.format(
            grpc_tools=importlib.metadata.version("grpcio-tools"),
            mypy_protobuf=importlib.metadata.version("mypy-protobuf"),
        ),
        encoding="utf-8",
    )


def generate(out_dir: Path) -> None:
    """Generate the complete rocketq/_api tree into the empty directory out_dir."""
    run_protoc(PROTO_ROOT, out_dir)
    post_process(out_dir, top_level_packages(PROTO_ROOT))


def tree_files(root: Path) -> set[Path]:
    """Files under root, relative, ignoring interpreter caches."""
    if not root.is_dir():
        return set()
    return {
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def compare_trees(expected: Path, actual: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """(missing from actual, extra in actual, different), each sorted."""
    want, have = tree_files(expected), tree_files(actual)
    changed = [
        p for p in sorted(want & have) if not filecmp.cmp(expected / p, actual / p, shallow=False)
    ]
    return sorted(want - have), sorted(have - want), changed


def diff_excerpt(expected: Path, actual: Path) -> list[str]:
    """The first lines of a unified diff from the committed file to the regenerated one."""
    lines = list(
        difflib.unified_diff(
            actual.read_text(encoding="utf-8").splitlines(),
            expected.read_text(encoding="utf-8").splitlines(),
            fromfile=f"committed/{actual.name}",
            tofile=f"regenerated/{expected.name}",
            lineterm="",
            n=1,
        )
    )
    lines = [
        line if len(line) <= DIFF_LINE_CHARS_MAX else f"{line[:DIFF_LINE_CHARS_MAX]}..."
        for line in lines
    ]
    if len(lines) > DIFF_LINES_PER_FILE_MAX:
        omitted = len(lines) - DIFF_LINES_PER_FILE_MAX
        lines = [*lines[:DIFF_LINES_PER_FILE_MAX], f"... ({omitted} more diff lines)"]
    return lines


def check(api_root: Path) -> int:
    """Regenerate into a temp dir and compare with api_root; 0 if identical, 1 otherwise."""
    with tempfile.TemporaryDirectory(prefix="rocketq-gen-protos-") as tmp:
        fresh = Path(tmp)
        generate(fresh)
        missing, extra, changed = compare_trees(fresh, api_root)
        if not (missing or extra or changed):
            print(f"{api_root.relative_to(REPO_ROOT)} is up to date with proto/")
            return 0
        rel = api_root.relative_to(REPO_ROOT)
        print(f"{rel} differs from what proto/ generates:")
        for p in missing:
            print(f"  missing:  {rel / p}")
        for p in extra:
            print(f"  stale:    {rel / p}  (no longer generated)")
        for p in changed:
            print(f"  changed:  {rel / p}")
        for p in changed[:DIFF_FILES_SHOWN_MAX]:
            print()
            print("\n".join(diff_excerpt(fresh / p, api_root / p)))
        if len(changed) > DIFF_FILES_SHOWN_MAX:
            print(f"\n... diffs of {len(changed) - DIFF_FILES_SHOWN_MAX} more files omitted")
        print(
            "\nRun `python tools/gen_protos.py` (make gen-protos) and commit the result. If proto/ "
            "did not change, compare the tool versions in rocketq/_api/__init__.py with yours."
        )
        return 1


def sync(fresh: Path, api_root: Path) -> tuple[int, int]:
    """Make api_root identical to fresh; returns (files written, files removed)."""
    missing, extra, changed = compare_trees(fresh, api_root)
    for p in [*missing, *changed]:
        (api_root / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fresh / p, api_root / p)
    for p in extra:
        (api_root / p).unlink()
    # Drop directories left empty (a removed proto package), deepest first; keep api_root.
    for directory in sorted((d for d in api_root.rglob("*") if d.is_dir()), reverse=True):
        if directory.name == "__pycache__":
            continue
        if not any(directory.iterdir()):
            directory.rmdir()
    return len(missing) + len(changed), len(extra)


def write(api_root: Path) -> int:
    """Regenerate api_root in place, via a temp dir so that a failure leaves it intact."""
    with tempfile.TemporaryDirectory(prefix="rocketq-gen-protos-") as tmp:
        fresh = Path(tmp)
        generate(fresh)
        api_root.mkdir(parents=True, exist_ok=True)
        written, removed = sync(fresh, api_root)
    total = len(tree_files(api_root))
    rel = api_root.relative_to(REPO_ROOT)
    print(f"{rel}: {written} written, {removed} removed, {total - written} unchanged")
    return 0


def write_v2() -> int:
    """The gateway's apache.rocketmq.v2 classes (see tools/gen_v2_protos.py)."""
    sys.path.insert(0, str(REPO_ROOT))  # run as a script: tools/ is not on the path
    from tools import gen_v2_protos  # noqa: PLC0415 (needs the path set just above)

    try:
        digest = gen_v2_protos.generate()
    except (gen_v2_protos.V2GenerationError, OSError, subprocess.SubprocessError) as error:
        print(f"gen_protos --v2: {error}", file=sys.stderr)
        return 2
    rel = gen_v2_protos.OUT_DIR.relative_to(REPO_ROOT)
    print(
        f"{rel}: apache.rocketmq.v2 from {gen_v2_protos.SDK_PACKAGE} "
        f"{gen_v2_protos.SDK_VERSION} (descriptors sha256 {digest[:16]})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if rocketq/_api differs from a fresh generation",
    )
    parser.add_argument(
        "--v2",
        action="store_true",
        help="generate the apache.rocketmq.v2 gateway classes instead (tools/gen_v2_protos.py)",
    )
    args = parser.parse_args(argv)
    if args.v2:
        return write_v2()
    try:
        return check(API_ROOT) if args.check else write(API_ROOT)
    except GenerationError as error:
        print(f"gen_protos: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
