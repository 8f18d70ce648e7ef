"""A disk that fills up on demand: a small file system mounted at a store directory.

``DiskFiller(path, size_bytes)`` mounts a volume of ``size_bytes`` at ``path`` (created if
missing), so a broker whose ``storePathRootDir`` is ``path`` runs on a volume of that size and
nothing else on the machine is affected. :meth:`DiskFiller.fill` writes a ballast file until
only ``leave_bytes`` stay free; :meth:`DiskFiller.free` deletes it; :meth:`DiskFiller.close`
unmounts (always; a lazy unmount if a process still holds files there). Everything under
``path`` is gone after ``close``: read what you need from the store first.

Two kinds of volume (``kind``):

* ``"ext4"`` (the default): an image file (``mkfs.ext4``) loop-mounted - a real disk's
  semantics. Falls back to tmpfs, saying so, if loop devices are unavailable.
* ``"tmpfs"``: quicker, but not a disk: in a *shared mapping* of a tmpfs file even a read
  fault on a hole allocates a page, so reading the sparse, never-written tail of a mapped file
  (recovery scans the last commitlog file to its end; an index query touches random slot
  pages) consumes space and, on a full or small tmpfs, kills the reader with SIGBUS. A store
  whose files are larger than the tmpfs cannot even be reopened. Use it only for a process
  that is not restarted and whose files fit. Falls back to ext4 if it cannot be mounted.

    with DiskFiller(tmp_path / "slave-store", 8 << 20) as disk:
        ... start a broker on disk.path ...
        disk.fill()          # 0 bytes left
        ... disk.free()      # room again
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

BALLAST_NAME = "ballast.fill"
CHUNK_BYTES = 1 << 20
MOUNT_TIMEOUT_S = 30.0
SIZE_MIN_BYTES = 1 << 20


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S, check=False
    )


class DiskFiller:
    """A ``size_bytes`` volume mounted at ``path`` that :meth:`fill` fills up (module doc)."""

    def __init__(self, path: Path, size_bytes: int, kind: str = "ext4") -> None:
        if size_bytes < SIZE_MIN_BYTES:
            raise ValueError(f"size_bytes {size_bytes}: at least {SIZE_MIN_BYTES}")
        if kind not in ("ext4", "tmpfs"):
            raise ValueError(f"kind {kind!r}: 'ext4' or 'tmpfs'")
        self.path = Path(path)
        self.size_bytes = size_bytes
        self.kind = ""
        """"tmpfs" or "ext4" once mounted (the one asked for, unless it could not be)."""
        self._image: Path | None = None
        self._mounted = False
        self.path.mkdir(parents=True, exist_ok=True)
        if any(self.path.iterdir()):
            raise ValueError(f"{self.path} is not empty: mounting over it would hide files")
        try:
            first, second = (
                (self._ext4, self._tmpfs) if kind == "ext4" else (self._tmpfs, self._ext4)
            )
            problem = first()
            if problem:
                log.warning("%s; trying the other kind of volume", problem)
                other = second()
                if other:
                    raise RuntimeError(f"cannot mount a volume at {self.path}: {problem}; {other}")
        except BaseException:
            self.close()
            raise

    def _tmpfs(self) -> str:
        tmpfs = _run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes},mode=0755", "tmpfs",
             str(self.path)]
        )  # fmt: skip
        if tmpfs.returncode != 0:
            return f"cannot mount a tmpfs at {self.path}: {tmpfs.stderr.strip()}"
        self.kind = "tmpfs"
        self._mounted = True
        return ""

    def _ext4(self) -> str:
        self._image = self.path.with_name(self.path.name + ".img")
        with open(self._image, "wb") as f:
            f.truncate(self.size_bytes)
        mkfs = _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self._image)])
        if mkfs.returncode != 0:
            return f"mkfs.ext4 failed: {mkfs.stderr.strip()}"
        loop = _run(["mount", "-o", "loop", str(self._image), str(self.path)])
        if loop.returncode != 0:
            return f"cannot loop-mount an ext4 image at {self.path}: {loop.stderr.strip()}"
        self.kind = "ext4"
        self._mounted = True
        (self.path / "lost+found").rmdir()
        return ""

    # -- filling ---------------------------------------------------------------------------
    @property
    def ballast(self) -> Path:
        return self.path / BALLAST_NAME

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer can still use on the volume."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int = 0) -> int:
        """Grow the ballast until at most ``leave_bytes`` are free (or the volume refuses
        more); returns the bytes now free. Calling it again tops the ballast up."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            zeros = bytes(CHUNK_BYTES)
            while (want := self.free_bytes() - leave_bytes) > 0:
                try:
                    os.write(fd, zeros[: min(want, CHUNK_BYTES)])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(fd)
        free = self.free_bytes()
        log.info("disk %s filled: %d bytes free", self.path, free)
        return free

    def free(self) -> None:
        """Delete the ballast: the volume has its room back."""
        self.ballast.unlink(missing_ok=True)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Unmount (lazily if busy) and delete the image of the loop fallback. Idempotent."""
        if self._mounted:
            done = _run(["umount", str(self.path)])
            if done.returncode != 0:
                log.warning("umount %s: %s; unmounting lazily", self.path, done.stderr.strip())
                _run(["umount", "-l", str(self.path)])
            self._mounted = False
        if self._image is not None:
            with contextlib.suppress(OSError):
                self._image.unlink()
            self._image = None

    def __enter__(self) -> DiskFiller:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
