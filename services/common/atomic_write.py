"""Durable atomic file replacement, the one server-side copy (STYLE.md habit 13).

A crash at any instant leaves either the old content or the new one under the file's name,
never a mix, and once :func:`write_atomic` returns the new content survives a power loss.
Each of the four steps is needed:

1. write ``<name>.tmp`` in the *same directory* — a rename is atomic only within one file
   system, and a stale ``.tmp`` left by a crash is simply overwritten next time;
2. fsync the temporary file — otherwise the rename can reach the disk before the data and a
   power loss leaves an empty file under the real name;
3. rename it over the target (``os.replace``, atomic on POSIX);
4. fsync the directory — the rename is a change to the directory, lost with it otherwise.

Users: the store's JSON config files, the epoch file, the timer wheel's checkpoint and wheel
file. The SDK has its own small copy (``rocketq.client._atomic_write``) because ``rocketq``
never imports ``services``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from services.common import failpoints

BACKUP_SUFFIX = ".bak"
TMP_SUFFIX = ".tmp"


def tmp_path(path: Path) -> Path:
    """Where :func:`write_atomic` builds the new content of ``path``."""
    return path.with_name(path.name + TMP_SUFFIX)


def fsync_dir(directory: os.PathLike[str] | str) -> None:
    """fsync a directory, so that entries created, renamed or removed in it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path,
    data: bytes,
    *,
    keep_backup: bool = False,
    failpoint_before_fsync: str | None = None,
    failpoint_before_rename: str | None = None,
) -> None:
    """Replace ``path`` with ``data`` durably and atomically (see the module docstring).

    ``keep_backup`` first hard-links the current file to ``<name>.bak`` (best effort: a
    file system without hard links just gets no backup), as RocketMQ keeps its config
    files' previous version. The failpoints, when named, are injected after the data is
    written (before its fsync) and after the fsync (before the rename).
    """
    replace_atomic(
        path,
        lambda fd: _write_all(fd, data),
        keep_backup=keep_backup,
        failpoint_before_fsync=failpoint_before_fsync,
        failpoint_before_rename=failpoint_before_rename,
    )


def replace_atomic(
    path: Path,
    fill: Callable[[int], None],
    *,
    keep_backup: bool = False,
    failpoint_before_fsync: str | None = None,
    failpoint_before_rename: str | None = None,
) -> None:
    """:func:`write_atomic` for content that is not a ``bytes`` value: ``fill(fd)`` writes it
    into the (empty, read-write) temporary file, e.g. ``os.ftruncate`` for a sparse file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        fill(fd)
        if failpoint_before_fsync:
            failpoints.inject(failpoint_before_fsync)
        os.fsync(fd)
    finally:
        os.close(fd)
    if failpoint_before_rename:
        failpoints.inject(failpoint_before_rename)
    if keep_backup and path.exists():
        _link_backup(path)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a regular file takes it all at once; loop in case it does not
        view = view[os.write(fd, view) :]


def _link_backup(path: Path) -> None:
    """Make ``<name>.bak`` the current content of ``path`` without a moment when ``path`` is
    missing: link to a fresh name, then rename that over the old backup."""
    bak = path.with_name(path.name + BACKUP_SUFFIX)
    staged = bak.with_name(bak.name + ".new")
    try:
        os.link(path, staged)
        os.replace(staged, bak)
    except OSError:
        pass  # the backup is a convenience; never fail a write for it
