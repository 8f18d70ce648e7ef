"""A disk that fills up on demand: a small file system mounted at a store directory.

``DiskFiller(path, size_bytes)`` mounts a tmpfs of ``size_bytes`` at ``path`` (created if
missing), so a broker whose ``storePathRootDir`` is ``path`` runs on a volume of that size and
nothing else on the machine is affected. :meth:`DiskFiller.fill` writes a ballast file until
only ``leave_bytes`` stay free; :meth:`DiskFiller.free` deletes it; :meth:`DiskFiller.close`
unmounts (always; a lazy unmount if a process still holds files there). Everything under
``path`` is gone after ``close``: read what you need from the store first.

If mounting a tmpfs is impossible here (no privilege for it), a small ext4 image file is made
with ``mkfs.ext4`` and loop-mounted instead (``kind`` says which; the log says so too).

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

    def __init__(self, path: Path, size_bytes: int) -> None:
        if size_bytes < SIZE_MIN_BYTES:
            raise ValueError(f"size_bytes {size_bytes}: at least {SIZE_MIN_BYTES}")
        self.path = Path(path)
        self.size_bytes = size_bytes
        self.kind = ""
        """"tmpfs" or "ext4-loop" once mounted."""
        self._image: Path | None = None
        self._mounted = False
        self.path.mkdir(parents=True, exist_ok=True)
        if any(self.path.iterdir()):
            raise ValueError(f"{self.path} is not empty: mounting over it would hide files")
        try:
            self._mount()
        except BaseException:
            self.close()
            raise

    def _mount(self) -> None:
        tmpfs = _run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes},mode=0755", "tmpfs",
             str(self.path)]
        )  # fmt: skip
        if tmpfs.returncode == 0:
            self.kind = "tmpfs"
            self._mounted = True
            return
        log.warning(
            "cannot mount a tmpfs at %s (%s); using a loop-mounted ext4 image instead",
            self.path,
            tmpfs.stderr.strip(),
        )
        self._image = self.path.with_name(self.path.name + ".img")
        with open(self._image, "wb") as f:
            f.truncate(self.size_bytes)
        mkfs = _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self._image)])
        if mkfs.returncode != 0:
            raise RuntimeError(f"mkfs.ext4 failed: {mkfs.stderr.strip()}")
        loop = _run(["mount", "-o", "loop", str(self._image), str(self.path)])
        if loop.returncode != 0:
            raise RuntimeError(
                f"cannot mount a tmpfs ({tmpfs.stderr.strip()}) nor a loop image "
                f"({loop.stderr.strip()}) at {self.path}"
            )
        self.kind = "ext4-loop"
        self._mounted = True
        (self.path / "lost+found").rmdir()

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
