"""What a new page of file data costs this machine, and warming free memory so every setup of a
benchmark pays the same.

On a virtual machine whose memory the host backs lazily (Firecracker, or any VMM with a
virtio-balloon that has free page reporting), the first write to a guest page the host has not
backed, or has taken back, traps to the host. The guest sees that time as CPU spent in whatever
copied into the page: a broker's ``pwrite`` into a new page-cache page. On the 2-core VM the
benchmarks run on, writing a fresh file page cost ~1.3-1.7 us per KiB where a warm one cost ~0.2
(``probe_us_per_kib``), and the balloon hands freed memory back to the host within about a minute,
so the cost came and went between runs.

A broker writes every message into new page-cache pages, and a slave writes each one a second
time, so a replication benchmark run on cold memory charged SYNC_MASTER for the VM's traps twice
and no-slave once, and which setup ran on colder memory depended on the order of the runs.
:func:`warm` touches free memory in a child process that then exits: the kernel keeps the freed,
host-backed pages at the front of its free lists (pages the balloon has reported go to the back),
so the page cache of the run that follows is built from them.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

import psutil

_MADV_POPULATE_WRITE = 23  # Linux 5.14; Python 3.11's mmap module does not name it
_GIB = 1 << 30
_PAGE = mmap.PAGESIZE
_PROBE_CHUNK_BYTES = 160 * 1024  # about what a replicated chunk of 1 KiB messages writes at once
_HEADROOM_BYTES = 2 * _GIB  # never warm the memory the run itself needs for its processes
WRITTEN_BYTES_PER_S_MAX = 256 << 20
"""What a benchmark's servers write at most together (master and slave, or one peer system),
sizing the memory :func:`prepare` warms."""


def available_bytes() -> int:
    """The kernel's estimate of memory available without swapping (MemAvailable)."""
    return int(psutil.virtual_memory().available)


def probe_us_per_kib(mib: int = 256, directory: str | None = None) -> float:
    """Time ``pwrite`` of ``mib`` MiB into a new file (new page-cache pages): us per KiB.
    The file is deleted, so its pages go back to the free lists."""
    data = os.urandom(_PROBE_CHUNK_BYTES)
    with tempfile.TemporaryDirectory(prefix="rocketq-page-probe-", dir=directory) as tmp:
        path = Path(tmp) / "probe"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            end = mib << 20
            start_s = time.perf_counter()
            for pos in range(0, end - len(data) + 1, len(data)):
                os.pwrite(fd, data, pos)
            elapsed_s = time.perf_counter() - start_s
        finally:
            os.close(fd)
    return elapsed_s * 1e6 / (end >> 10)


def _touch(size_bytes: int) -> None:
    # One GiB map at a time, all kept until the end: every GiB is a new part of memory.
    maps = []
    for _ in range(0, size_bytes, _GIB):
        region = mmap.mmap(-1, _GIB)
        try:
            region.madvise(_MADV_POPULATE_WRITE)
        except OSError:  # an older kernel: write a byte into every page instead
            for at in range(0, _GIB, _PAGE):
                region[at] = 1
        maps.append(region)


def warm(size_bytes: int) -> int:
    """Touch up to ``size_bytes`` of free memory (whole GiB, leaving 2 GiB available) in a child
    process and let it exit; return the bytes touched."""
    size = min(size_bytes, available_bytes() - _HEADROOM_BYTES) // _GIB * _GIB
    if size <= 0:
        return 0
    child = mp.get_context("spawn").Process(target=_touch, args=(size,), daemon=True)
    child.start()
    child.join()
    return size if child.exitcode == 0 else 0


def prepare(write_s: float, *, warm_memory: bool = True) -> str:
    """Before a setup that writes for about ``write_s`` seconds: warm enough free memory for
    it (unless ``warm_memory`` is off), then probe; the line to print about both."""
    warmed = warm(int(write_s * WRITTEN_BYTES_PER_S_MAX) + _GIB) if warm_memory else 0
    cost = probe_us_per_kib()
    return f"({warmed >> 30} GiB of memory warmed; a new page-cache page costs {cost:.2f} us/KiB)"
