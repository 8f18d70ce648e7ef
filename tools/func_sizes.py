"""List functions and modules that outgrew the size limits of STYLE.md (habit 9).

Run from the repository root::

    python -m tools.func_sizes                 # functions > 70 lines, modules > 800 lines
    python -m tools.func_sizes --func-lines 50 --module-lines 600 services/broker

A function's length is counted from its ``def`` line to its last line, so a long docstring counts
(it is part of what a reader has to get through) but decorators do not (a click command's options
are a declarative table, not logic). Nested functions are listed
on their own as well as inside their parent. Generated code (``rocketq/_api``) is skipped.

Standard library only, and imported by nothing: it is a tool for people, not part of the product.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

DEFAULT_ROOTS = ("rocketq", "services", "tools")
# Generated from proto/ by tools/gen_protos.py; its size is not ours to manage.
EXCLUDED_DIRS = (Path("rocketq") / "_api",)
FUNC_LINES_MAX = 70
MODULE_LINES_MAX = 800


def _python_files(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            if any(path.is_relative_to(excluded) for excluded in EXCLUDED_DIRS):
                continue
            yield path


def _functions(tree: ast.AST) -> Iterator[tuple[str, int, int]]:
    """Yield (qualified name, first line, line count) for every function, nested ones too."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                last = child.end_lineno or child.lineno
                yield name, child.lineno, last - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help=f"files or folders (default: {DEFAULT_ROOTS})")
    parser.add_argument("--func-lines", type=int, default=FUNC_LINES_MAX)
    parser.add_argument("--module-lines", type=int, default=MODULE_LINES_MAX)
    args = parser.parse_args(argv)
    roots = [Path(p) for p in (args.paths or DEFAULT_ROOTS)]

    long_modules: list[tuple[int, str]] = []
    long_functions: list[tuple[int, str]] = []
    for path in _python_files(roots):
        source = path.read_text(encoding="utf-8")
        module_lines = len(source.splitlines())
        if module_lines > args.module_lines:
            long_modules.append((module_lines, str(path)))
        for name, first, count in _functions(ast.parse(source, filename=str(path))):
            if count > args.func_lines:
                long_functions.append((count, f"{path}:{first} {name}"))

    print(f"modules over {args.module_lines} lines: {len(long_modules)}")
    for count, where in sorted(long_modules, reverse=True):
        print(f"  {count:5d}  {where}")
    print(f"functions over {args.func_lines} lines: {len(long_functions)}")
    for count, where in sorted(long_functions, reverse=True):
        print(f"  {count:5d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
