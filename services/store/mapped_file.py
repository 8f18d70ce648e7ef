"""Mapped files and mapped-file queues: fixed-size ``mmap`` segments named by their start offset.

Both the commitlog and every consume queue are a *queue* of equally sized files; file ``n`` is
named by the 20-digit zero-padded offset at which it starts (``00000000001073741824`` is the
second 1 GiB commitlog file), so offsets are continuous across files (SPEC §4.5).

Design notes
------------
* One writer. Positions are plain ints owned by the event loop; the only other thread that
  touches a file is the flusher, and it only calls ``os.fdatasync`` on the descriptor (which
  releases the GIL) — never the map — so no lock is needed.
* Files are created sparse (``ftruncate``) and mapped whole. The next file is created as soon as
  the current one is, so the roll on the hot path finds it ready (RocketMQ's
  AllocateMappedFileService does the same from a thread; creation here costs microseconds).
* ``fdatasync`` on the descriptor writes back pages dirtied through a shared mapping on Linux,
  so durability does not depend on ``mmap.flush`` (which holds the GIL while it syncs).
* Appends store through the map, or through ``pwrite`` where the owner asks for it
  (``write_by_syscall``: the commitlog, whose appends cover whole pages; see commitlog.py).
* Disk space is reserved (``posix_fallocate``) ahead of the write position, ``RESERVE_AHEAD_BYTES``
  at a time, before bytes are stored: a store through
  a map into a sparse page that the volume has no room for is a SIGBUS that kills the process,
  while a failed reservation is a :class:`DiskFullError` that the store handles (nothing of the
  write is stored).
* Or, where the owner asks for it (``zero_ahead``: the commitlog under SYNC_FLUSH), reserved by
  writing zeros, ``ZERO_AHEAD_BYTES`` at a time — RocketMQ's warm-up of mapped files. A fallocated
  extent is "unwritten": every fdatasync that first writes into it must also commit the journal
  transaction that converts it, which nearly doubles the fsync's time (``store_bench --only-sync``:
  ~260 against ~150 µs per 128 KiB on ext4). Zeros written ahead are allocated by one fsync, and
  the fsyncs after it, until the data reaches them, write data only. The price is each byte written
  twice, which ASYNC_FLUSH (one fsync per 500 ms) has no reason to pay. A full volume still fails
  the write, not the process: ext4 and xfs reserve delayed-allocation blocks at ``pwrite``.
* A mapped file never knows what its bytes mean; commitlog and consume queue give them meaning.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from services.store.types import FileStartOffset

FILE_NAME_DIGITS = 20
_ZERO_CHUNK_BYTES = 4 * 1024 * 1024
_ZERO_CHUNK = bytes(_ZERO_CHUNK_BYTES)
_ZERO_VIEW = memoryview(_ZERO_CHUNK)
RESERVE_AHEAD_BYTES = 64 * 1024
"""Space reserved past a write that needs more: one fallocate per 64 KiB written, and at most
this much reserved but unused per file (consume queues are many)."""
ZERO_AHEAD_BYTES = 1024 * 1024
"""Zeros written past a write that needs more, for files reserved by zeroing (``zero_ahead``):
one journalled fsync per MiB written, and ~0.2 ms of the writer's time per MiB."""


class DiskFullError(OSError):
    """The volume has no room for bytes about to be written; nothing of them was written."""


@contextlib.contextmanager
def refused_when_full(doing: str) -> Iterator[None]:
    """Turn "no space" while ``doing`` (reserving bytes, creating a directory or a file) into
    :class:`DiskFullError`, which the store undoes and answers as a full volume. Creating counts
    too: ext4 needs a block for a new directory, so the first message of a new queue can be the
    write that finds the volume full."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFullError(exc.errno, f"{exc.strerror}: {doing}") from exc


def file_name(start: int) -> str:
    """The 20-digit zero-padded name of a file starting at ``start``."""
    return f"{start:0{FILE_NAME_DIGITS}d}"


def _create_sized(path: Path, file_size_bytes: int) -> None:
    """Create ``path`` at its full size under a temporary name, then rename it into place.

    A crash between ``open(O_CREAT)`` and ``ftruncate`` would otherwise leave a real-named
    empty file that ``load`` reports as the wrong size until something writes to it again.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, file_size_bytes)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class MappedFile:
    """One fixed-size file, mapped read-write, with a write and a flush position."""

    def __init__(
        self,
        path: Path,
        file_size_bytes: int,
        *,
        readonly: bool = False,
        write_by_syscall: bool = False,
        zero_ahead: bool = False,
        reserve_ahead_bytes: int = RESERVE_AHEAD_BYTES,
    ) -> None:
        self.path = path
        self.file_size_bytes = file_size_bytes
        self.write_by_syscall = write_by_syscall
        """Appends go through ``pwrite`` instead of the map (see :meth:`append`)."""
        self.zero_ahead = zero_ahead
        """Space is reserved by writing zeros, not by fallocate (see the module doc)."""
        self.reserve_ahead_bytes = reserve_ahead_bytes
        """Space fallocated past a write that needs more."""
        self.file_from_offset = FileStartOffset(int(path.name))
        self.readonly = readonly
        existed = path.exists()
        if not readonly and not existed:
            _create_sized(path, file_size_bytes)
        flags = os.O_RDONLY if readonly else os.O_RDWR | os.O_CREAT
        self._fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(self._fd).st_size
            if not readonly and (not existed or actual == 0):
                os.ftruncate(self._fd, file_size_bytes)
            elif actual != file_size_bytes:
                raise ValueError(
                    f"{path} is {actual} bytes but files of this queue are {file_size_bytes}; "
                    "the store was written with another file size setting, or the file is damaged"
                )
            access = mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
            self._map = mmap.mmap(self._fd, file_size_bytes, access=access)
        except BaseException:
            os.close(self._fd)
            raise
        self.view = memoryview(self._map)
        self.wrote_position = 0
        """Bytes of this file that hold data (relative to the file's start)."""
        self.flushed_position = 0
        """Bytes known to be on disk."""
        self.reserved_position = 0
        """Disk space is reserved below max(this, wrote_position) (see the module doc)."""
        self.closed = False

    # -- writing ---------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self.file_size_bytes - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size_bytes

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the write position; return the position it was written at."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size_bytes:
            raise ValueError(f"{self.path.name}: {len(data)} bytes do not fit at {pos}")
        if end > self.reserved_position:
            self.reserve(end)
        if self.write_by_syscall:
            _pwrite_all(self._fd, data, pos)
        else:
            self._map[pos:end] = data
        self.wrote_position = end
        return pos

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``pos`` without moving the write position (recovery, replication)."""
        end = pos + len(data)
        if end > self.reserved_position and end > self.wrote_position:
            self.reserve(end)
        self._map[pos:end] = data

    def reserve(self, end: int) -> None:
        """Make sure the volume has room for every byte below ``end`` (and some ahead);
        :class:`DiskFullError` when it has not."""
        if self.zero_ahead:
            # Never below the write position: these bytes are data.
            start = max(self.wrote_position, self.reserved_position)
            ahead = min(self.file_size_bytes, end + ZERO_AHEAD_BYTES)
        else:
            start = min(self.wrote_position, self.reserved_position)
            ahead = min(self.file_size_bytes, end + self.reserve_ahead_bytes)
        for target in (ahead, end) if ahead > end else (end,):
            try:
                self._reserve_range(start, target)
            except DiskFullError:
                if target == end:  # not even the bytes needed now: give up
                    raise
                continue  # no room for the look-ahead: try the bytes needed now
            self.reserved_position = target
            return

    def _reserve_range(self, start: int, end: int) -> None:
        if self.zero_ahead:
            at = start
            while at < end:
                n = min(end - at, _ZERO_CHUNK_BYTES)
                _pwrite_all(self._fd, _ZERO_VIEW[:n], at)
                at += n
            return
        with refused_when_full(f"cannot reserve {end - start} bytes in {self.path}"):
            os.posix_fallocate(self._fd, start, end - start)

    # -- reading ---------------------------------------------------------------------------
    def read(self, pos: int, size: int) -> memoryview:
        """A zero-copy view of ``size`` bytes at ``pos``, clipped to what has been written."""
        end = min(pos + size, self.wrote_position)
        return self.view[pos:end] if pos < end else self.view[0:0]

    def copy(self, pos: int, size: int) -> bytes:
        """A copy of the ``size`` bytes at ``pos`` (the caller checked they are written).
        Slicing the map copies once; ``bytes(view[...])`` would build a view first."""
        return self._map[pos : pos + size]

    def copies(self, offsets: Sequence[int], sizes: Sequence[int]) -> list[bytes]:
        """Copies of ``sizes[i]`` bytes at each global offset ``offsets[i]`` of this file (the
        caller checked they are written): a pull's records, one ``bytes`` each."""
        at, whole = self.file_from_offset, self._map
        return [whole[o - at : o - at + n] for o, n in zip(offsets, sizes, strict=True)]

    # -- durability ------------------------------------------------------------------------
    def flush(self) -> int:
        """fdatasync the file; return the new flushed position. Safe off the event loop."""
        target = self.wrote_position
        if target > self.flushed_position and not self.closed:
            os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    @property
    def dirty(self) -> bool:
        return self.wrote_position > self.flushed_position

    # -- lifecycle -------------------------------------------------------------------------
    def zero_from(self, pos: int, end: int | None = None) -> None:
        """Zero the bytes from ``pos`` to ``end`` (default: the file's end) and set the write
        position to ``pos``. Zeroes a chunk at a time: a 1 GiB file never costs 1 GiB of RAM.

        Chunks already all zero are only read, never written: recovery zeroes from the end of
        the data to the file's end at every open, and writing zeros into the sparse tail would
        allocate it all - on a full disk, a SIGBUS at startup."""
        stop = self.file_size_bytes if end is None else min(end, self.file_size_bytes)
        at = pos
        while at < stop:
            n = min(stop - at, _ZERO_CHUNK_BYTES)
            zeros = _ZERO_CHUNK[:n]
            if self._map[at : at + n] != zeros:
                self._map[at : at + n] = zeros
            at += n
        self.wrote_position = pos
        self.flushed_position = min(self.flushed_position, pos)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.view.release()
        self._map.close()
        os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    def last_modified_ms(self) -> int:
        return os.stat(self.path).st_mtime_ns // 1_000_000

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position})"


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    """Write all of ``data`` at ``pos`` (a regular file's pwrite may, rarely, write less)."""
    view = memoryview(data)
    while view:
        try:
            n = os.pwrite(fd, view, pos)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(exc.errno, f"{exc.strerror}: writing at {pos}") from exc
            raise
        view = view[n:]
        pos += n


class MappedFileQueue:
    """The ordered files of one directory; offsets are global across them."""

    def __init__(
        self,
        directory: Path,
        file_size_bytes: int,
        *,
        create_ahead: bool = True,
        readonly: bool = False,
        write_by_syscall: bool = False,
        zero_ahead: bool = False,
        reserve_ahead_bytes: int = RESERVE_AHEAD_BYTES,
    ) -> None:
        if file_size_bytes <= 0:
            raise ValueError("file_size_bytes must be positive")
        self.readonly = readonly
        self.write_by_syscall = write_by_syscall
        self.zero_ahead = zero_ahead
        self.reserve_ahead_bytes = reserve_ahead_bytes
        self.directory = directory
        self.file_size_bytes = file_size_bytes
        self.create_ahead = create_ahead
        self.files: list[MappedFile] = []

    def load(self) -> list[str]:
        """Map every file of the directory; return problems found (wrong sizes, odd names).

        A file of the wrong size is never mapped, and the queue ends before it: what follows a
        hole cannot be trusted as continuous. Recovery decides what to do with the rest.
        """
        problems: list[str] = []
        if not self.directory.is_dir():
            return problems
        names = sorted(p.name for p in self.directory.iterdir() if p.is_file())
        expected: int | None = None
        for name in names:
            if len(name) != FILE_NAME_DIGITS or not name.isdigit():
                if name.endswith(".tmp"):
                    if not self.readonly:  # a creation cut short by a crash; never renamed in
                        (self.directory / name).unlink(missing_ok=True)
                else:
                    problems.append(f"{self.directory / name}: not a store file name, ignored")
                continue
            start = int(name)
            if start % self.file_size_bytes:
                problems.append(f"{self.directory / name}: start not a multiple of the file size")
                break
            if expected is not None and start != expected:
                problems.append(f"{self.directory}: gap before {name}; files after it ignored")
                break
            size = (self.directory / name).stat().st_size
            if size != self.file_size_bytes:
                problems.append(
                    f"{self.directory / name}: {size} bytes, expected {self.file_size_bytes}"
                )
                break
            mf = MappedFile(
                self.directory / name,
                self.file_size_bytes,
                readonly=self.readonly,
                write_by_syscall=self.write_by_syscall,
                zero_ahead=self.zero_ahead,
                reserve_ahead_bytes=self.reserve_ahead_bytes,
            )
            # Until recovery says otherwise, a loaded file counts as full and flushed.
            mf.wrote_position = mf.flushed_position = self.file_size_bytes
            self.files.append(mf)
            expected = start + self.file_size_bytes
        return problems

    # -- lookup ----------------------------------------------------------------------------
    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    def min_offset(self) -> int:
        """Offset of the first byte still on disk (after retention), or 0 for an empty queue."""
        return self.files[0].file_from_offset if self.files else 0

    def max_offset(self) -> int:
        """One past the last written byte."""
        last = self.last_written()
        return last.file_from_offset + last.wrote_position if last else 0

    def last_written(self) -> MappedFile | None:
        """The newest file holding data; a pre-created empty file is skipped."""
        for mf in reversed(self.files):
            if mf.wrote_position > 0 or mf is self.files[0]:
                return mf
        return None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding ``offset``, or None if it is before the first or past the last."""
        if not self.files:
            return None
        first = self.files[0].file_from_offset
        idx = (offset - first) // self.file_size_bytes
        if offset < first or idx >= len(self.files):
            return None
        return self.files[idx]

    def __iter__(self) -> Iterator[MappedFile]:
        return iter(self.files)

    # -- growth ----------------------------------------------------------------------------
    def writable_file(self, start_if_empty: int = 0) -> MappedFile:
        """The file the next append goes to, rolling to a new file when the last is full."""
        last = self.last_written()
        if last is not None and not last.is_full:
            return last
        if last is None:
            start = start_if_empty - start_if_empty % self.file_size_bytes
        else:
            start = last.file_from_offset + self.file_size_bytes
        mf = self._file_at(start)
        if self.create_ahead:
            self._file_at(start + self.file_size_bytes)
        return mf

    def _file_at(self, start: int) -> MappedFile:
        for mf in self.files:
            if mf.file_from_offset == start:
                return mf
        path = self.directory / file_name(start)
        with refused_when_full(f"cannot create {path}"):
            self.directory.mkdir(parents=True, exist_ok=True)
            mf = MappedFile(
                path,
                self.file_size_bytes,
                write_by_syscall=self.write_by_syscall,
                zero_ahead=self.zero_ahead,
                reserve_ahead_bytes=self.reserve_ahead_bytes,
            )
        self.files.append(mf)
        return mf

    # -- shrinking -------------------------------------------------------------------------
    def truncate(self, offset: int, *, written_only: bool = False) -> None:
        """Drop every byte at or after ``offset``: later files deleted, the tail file zeroed.

        ``written_only`` zeroes the tail file only up to its write position (a live store,
        where nothing lies beyond it); recovery zeroes to the file's end (torn writes may)."""
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.file_from_offset + self.file_size_bytes <= offset:
                keep.append(mf)
            elif mf.file_from_offset < offset:
                mf.zero_from(
                    offset - mf.file_from_offset, mf.wrote_position if written_only else None
                )
                keep.append(mf)
            else:
                mf.destroy()
        self.files = keep

    def delete_first(self, count: int) -> list[MappedFile]:
        """Delete the ``count`` oldest files (never the last one); return them."""
        count = min(count, len(self.files) - 1)
        gone = self.files[:count]
        for mf in gone:
            mf.destroy()
        self.files = self.files[count:]
        return gone

    def flush(self) -> int:
        """Flush every dirty file; return the flushed offset (one past the last durable byte)."""
        flushed = 0
        for mf in self.files:
            if mf.dirty:
                mf.flush()
            if mf.flushed_position:
                flushed = mf.file_from_offset + mf.flushed_position
        return flushed

    def dirty_files(self) -> list[MappedFile]:
        return [mf for mf in self.files if mf.dirty]

    def close(self) -> None:
        for mf in self.files:
            mf.close()
        self.files = []
