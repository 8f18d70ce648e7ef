"""The epoch history: which failover epoch wrote which range of the commitlog (DESIGN.md §6).

File ``<store>/epoch``, text, one entry per line, oldest first::

    <epoch> <start offset>

Epoch ``e`` covers ``[start of e, start of the next entry)``, the last entry up to the
commitlog's max offset. Both columns never decrease. The file is rewritten whole on every change
(write a temporary file, fsync, rename, fsync the directory), so a crash leaves either the old
history or the new one, never a torn mix.

A master and a slave compare histories when the slave connects: bytes written under the same
epoch from the same start are the same bytes (one leader per epoch), so the slave keeps the
longest common prefix and discards the rest (:func:`consistent_offset`). With static roles
(issue 7) every store has the single epoch 0; issue 8's failover bumps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from services.common.atomic_write import write_atomic
from services.store.types import PhysicalOffset

EPOCH_ENTRIES_MAX = 100_000
"""A history longer than this is refused on load (a damaged file, not real failovers)."""


class EpochEntry(NamedTuple):
    """The first commitlog offset written under one epoch."""

    epoch: int
    start_offset: int


def check_history(entries: Sequence[EpochEntry]) -> str | None:
    """Why ``entries`` is not a valid history (epochs strictly increasing, starts
    non-decreasing, none negative), or None when it is."""
    prev: EpochEntry | None = None
    for e in entries:
        if e.epoch < 0 or e.start_offset < 0:
            return f"negative epoch or offset in {tuple(e)}"
        if prev is not None:
            if e.epoch <= prev.epoch:
                return f"epoch {e.epoch} follows epoch {prev.epoch}: epochs must increase"
            if e.start_offset < prev.start_offset:
                return (
                    f"epoch {e.epoch} starts at {e.start_offset}, before epoch {prev.epoch}'s "
                    f"start {prev.start_offset}"
                )
        prev = e
    return None


class EpochHistory:
    """The persisted history of one store. Single writer (the event loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[EpochEntry] = []

    @property
    def entries(self) -> list[EpochEntry]:
        """Oldest first (a copy)."""
        return list(self._entries)

    @property
    def last_epoch(self) -> int | None:
        """The newest epoch, or None for an empty history."""
        return self._entries[-1].epoch if self._entries else None

    def load(self) -> list[EpochEntry]:
        """Read the file (a missing file is an empty history); ValueError if it is damaged."""
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            self._entries = []
            return []
        entries: list[EpochEntry] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise ValueError(f"{self.path} line {n}: {line!r} is not '<epoch> <start offset>'")
            entries.append(EpochEntry(int(parts[0]), int(parts[1])))
            if len(entries) > EPOCH_ENTRIES_MAX:
                raise ValueError(f"{self.path}: more than {EPOCH_ENTRIES_MAX} entries")
        problem = check_history(entries)
        if problem:
            raise ValueError(f"{self.path}: {problem}")
        self._entries = entries
        return self.entries

    def append(self, epoch: int, start_offset: PhysicalOffset) -> None:
        """Record that ``epoch`` starts writing at ``start_offset`` (persisted before returning).

        Appending the newest epoch again at its own start is a no-op. A new epoch starting where
        the previous one started replaces it (that epoch wrote nothing). ValueError if the epoch
        or the offset would go backwards.
        """
        last = self._entries[-1] if self._entries else None
        if last is not None:
            if epoch == last.epoch and start_offset == last.start_offset:
                return
            if epoch <= last.epoch:
                raise ValueError(f"epoch {epoch} is not newer than the last epoch {last.epoch}")
            if start_offset < last.start_offset:
                raise ValueError(
                    f"epoch {epoch} would start at {start_offset}, before the last epoch's "
                    f"start {last.start_offset}"
                )
        entries = list(self._entries)
        if last is not None and start_offset == last.start_offset:
            entries.pop()
        entries.append(EpochEntry(epoch, start_offset))
        self._write(entries)

    def truncate_from(self, offset: PhysicalOffset) -> None:
        """Drop entries starting at or after ``offset`` (the commitlog was cut back there)."""
        kept = [e for e in self._entries if e.start_offset < offset]
        if len(kept) != len(self._entries):
            self._write(kept)

    def replace(self, entries: Iterable[EpochEntry]) -> None:
        """Take another history whole (a slave adopts its master's); ValueError if invalid."""
        new = [EpochEntry(int(e[0]), int(e[1])) for e in entries]
        problem = check_history(new)
        if problem:
            raise ValueError(f"epoch history rejected: {problem}")
        if new != self._entries:
            self._write(new)

    def _write(self, entries: list[EpochEntry]) -> None:
        text = "".join(f"{e.epoch} {e.start_offset}\n" for e in entries)
        write_atomic(self.path, text.encode("ascii"))
        self._entries = entries


def consistent_offset(
    master: Sequence[EpochEntry],
    master_max: PhysicalOffset,
    slave: Sequence[EpochEntry],
    slave_max: PhysicalOffset,
) -> PhysicalOffset:
    """Where a slave must truncate its commitlog to agree with its master.

    The end of the longest common prefix of the two histories: entries are compared pairwise
    from the oldest; for the last equal one, its end on either side is the next entry's start
    (or that side's max offset), and the smaller end wins. An empty history on either side, or
    histories that differ from their first entry, share nothing: 0. Never above ``slave_max``.
    """
    common = 0
    for m, s in zip(master, slave, strict=False):
        if m != s:
            break
        common += 1
    if common == 0:
        return PhysicalOffset(0)
    master_end = master[common].start_offset if common < len(master) else master_max
    slave_end = slave[common].start_offset if common < len(slave) else slave_max
    return PhysicalOffset(max(0, min(master_end, slave_end, slave_max)))
