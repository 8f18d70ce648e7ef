"""Durable atomic file replacement for the SDK's own files (the broadcasting offset store).

The server side has its own copy, ``services.common.atomic_write``: ``rocketq`` never imports
``services``. The steps are the same and each is needed: write ``<name>.tmp`` in the same
directory (a rename is atomic only within one file system), fsync it (else the rename may
reach the disk before the data), rename it over the file, fsync the directory (else the rename
itself may be lost).
"""

from __future__ import annotations

import os
from pathlib import Path


def tmp_path(path: Path) -> Path:
    """Where :func:`write_atomic` builds the new content of ``path``."""
    return path.with_name(path.name + ".tmp")


def write_atomic(path: Path, data: bytes, *, backup_path: Path | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    With ``backup_path`` the current file is first renamed there, so a crash between the two
    renames leaves no ``path`` but a whole backup: the reader must then fall back to it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it all at once; loop in case it does not
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if backup_path is not None and path.exists():
        os.replace(path, backup_path)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
