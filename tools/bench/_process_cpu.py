"""The CPU a benchmark's other processes use: one reading for every bench that reports CPU
per message for a broker, a peer's server or a slave."""

from __future__ import annotations

import psutil


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (psutil.NoSuchProcess once it
    is gone)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system
