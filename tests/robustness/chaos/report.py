"""The end of a run: a summary, and the evidence of a failed run kept for whoever looks next.

:func:`finish` writes ``summary.txt`` into the run directory (configuration, the driver's notes
- faults as run, skipped ones, settling problems - the verdict's counts, recovery time per
fault and every failure) and, when the verdict failed, copies the whole run directory - store
directories of every node, every log, the journals under ``history/`` - to ``keep_dir``
(``ROCKETQ_ROBUSTNESS_KEEP_DIR`` in CI, else the test's tmp dir). A run whose ``keep_dir`` *is*
its run directory (``--keep DIR`` in the exploratory mode) is kept in place.

To re-check a kept run after changing the checker::

    python -m tests.robustness.chaos --check KEPT_DIR
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.robustness.chaos.validate import Verdict

SUMMARY_FILE = "summary.txt"
LOG_TAIL_LINES = 30


def finish(
    run_dir: Path,
    verdict: Verdict,
    keep_dir: Path | None,
    cfg: Any,
    notes: Sequence[str],
    wall_s: float,
) -> tuple[Path | None, str]:
    """Write the summary; keep the evidence when the verdict failed. Returns (where it was
    kept or None, the summary text)."""
    head = "PASSED" if verdict.ok else "FAILED"
    config = (
        dataclasses.asdict(cfg)
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
        else cfg
    )
    lines = [f"chaos run {head} in {wall_s:.0f} s", f"config: {config}", "notes:"]
    lines += [f"  {n}" for n in notes]
    lines.append(verdict.summary())
    kept: Path | None = None
    if keep_dir is not None and (not verdict.ok or keep_dir.resolve() == run_dir.resolve()):
        kept = keep(run_dir, keep_dir)
        lines.append(f"run directory (stores, logs, history) kept at {kept}")
    if not verdict.ok:
        lines += log_tails(run_dir)
    text = "\n".join(lines)
    (run_dir / SUMMARY_FILE).write_text(text + "\n")
    if kept is not None and kept != run_dir:
        (kept / SUMMARY_FILE).write_text(text + "\n")
    return kept, text


def keep(run_dir: Path, keep_dir: Path) -> Path:
    if keep_dir.resolve() == run_dir.resolve():
        return run_dir
    keep_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(keep_dir, ignore_errors=True)
    shutil.copytree(run_dir, keep_dir, symlinks=True, ignore_dangling_symlinks=True)
    return keep_dir


def log_tails(run_dir: Path) -> list[str]:
    """The last lines of every broker's log (where a failover went wrong shows first)."""
    out = []
    for log in sorted(run_dir.glob("nodes/broker-*/*.log")):
        text = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        out.append(f"--- {log.relative_to(run_dir)} (last {len(text)} lines) ---")
        out += text
    return out
