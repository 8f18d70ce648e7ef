"""The TimerWheel: one 32-byte slot per precision step, pointing into the TimerLog (SPEC §8.2).

A slot covers ``precision_ms`` (1 s by default) and keeps the TimerLog positions of the first
and last unit due in it plus their count; the units themselves are chained backwards through
``prevPos``, so reading a slot means walking from ``last_pos`` to ``-1``.

Slot layout (``SLOT_SIZE`` = 32 bytes, big-endian):

| offset | bytes | field    | meaning                                                     |
|--------|-------|----------|-------------------------------------------------------------|
| 0      | 8     | timeMs   | ``time_ms // precision_ms`` of the slot (see below)         |
| 8      | 8     | firstPos | TimerLog position of the first unit linked into the slot    |
| 16     | 8     | lastPos  | TimerLog position of the newest unit (head of the chain)    |
| 24     | 4     | num      | units linked                                                |
| 28     | 4     | magic    | free for the service (RocketMQ: deprecated); 0 by default  |

The file holds ``slots_total × 2`` slots (38 707 200 bytes for 604 800 one-second slots: twice
the 7-day window, so a slot being delivered and the slot one window later never collide). For a
time ``t``:

* slot index = ``t // precision_ms % (slots_total × 2)``;
* stored timeMs = ``t // precision_ms`` — the *step number*, not milliseconds (RocketMQ stores
  ``timeMs / precisionMs`` too); :class:`Slot` reports it back as the slot's start,
  ``step × precision_ms``.

A slot whose stored step differs from the asked time's step (the slot was last used one or more
wheel turns ago), or whose ``num`` is 0, reads as :data:`EMPTY_SLOT` ``(-1, -1, -1, 0, 0)``; so
a slot never needs clearing for the wheel to wrap. Delays beyond ``window_ms`` must be rolled by
the service (a unit with ``MAGIC_ROLL`` in a slot inside the window that re-schedules it).

Changing ``precision_ms`` for an existing file makes old slots read empty (their steps then
stand for times decades away); changing ``slots_total`` changes the file size, refused at open.

Crash recovery: the wheel may have been written back past the last checkpoint; before the
TimerLog is truncated to the checkpoint, :meth:`TimerWheel.rewind` unlinks the lost tail.

Writes go straight into the mapped file; :meth:`TimerWheel.flush` fdatasyncs it (only dirty
pages are written back).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from services.common.atomic_write import replace_atomic
from services.timer_wheel.timer_log import TimerLog, TimerStoreError

SLOT = struct.Struct(
    ">q"  # timeMs: time // precision_ms (the step)
    "q"  # firstPos
    "q"  # lastPos
    "i"  # num
    "i"  # magic
)
SLOT_SIZE = 32
assert SLOT.size == SLOT_SIZE
_SLOT_DTYPE = np.dtype(
    [("step", ">i8"), ("first", ">i8"), ("last", ">i8"), ("num", ">i4"), ("magic", ">i4")]
)
assert _SLOT_DTYPE.itemsize == SLOT_SIZE

DEFAULT_SLOTS_TOTAL = 7 * 86_400
DEFAULT_PRECISION_MS = 1000
SCAN_SLOTS_MAX = 2 * DEFAULT_SLOTS_TOTAL
"""Most slots one :meth:`TimerWheel.scan` looks at (bounds its memory: 32 B per slot)."""


class Slot(NamedTuple):
    """One slot as read: ``time_ms`` is the slot's start (step × precision), or -1 if empty.

    A tuple rather than a dataclass: the enqueue path reads one per timer.
    """

    time_ms: int
    first_pos: int
    last_pos: int
    num: int
    magic: int

    @property
    def empty(self) -> bool:
        return self.num <= 0


EMPTY_SLOT = Slot(-1, -1, -1, 0, 0)


class RewindResult(NamedTuple):
    """What :meth:`TimerWheel.rewind` changed."""

    slots_rewound: int
    units_dropped: int
    broken_slots: list[Slot]
    """Slots cleared because their chain hit an unreadable (torn) unit; their timers are lost."""


class TimerWheel:
    """The wheel file at ``path``, created sparse on first open."""

    def __init__(
        self,
        path: Path | str,
        slots_total: int = DEFAULT_SLOTS_TOTAL,
        precision_ms: int = DEFAULT_PRECISION_MS,
    ) -> None:
        if slots_total <= 0 or precision_ms <= 0:
            raise ValueError("slots_total and precision_ms must be positive")
        self.path = Path(path)
        self.slots_total = slots_total
        self.precision_ms = precision_ms
        self.slot_count = slots_total * 2
        """Slots in the file: twice the window, see the module docstring."""
        self.file_bytes = self.slot_count * SLOT_SIZE
        self._fd = _open_sized(self.path, self.file_bytes)
        try:
            self._map = mmap.mmap(self._fd, self.file_bytes, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(self._fd)
            raise
        self._view = memoryview(self._map)
        self._dirty = False
        self.closed = False

    @property
    def window_ms(self) -> int:
        """Span of time the wheel schedules directly; later timers must be rolled."""
        return self.slots_total * self.precision_ms

    def slot_index(self, time_ms: int) -> int:
        """Index in the file of the slot for ``time_ms``."""
        return time_ms // self.precision_ms % self.slot_count

    def slot_time_ms(self, time_ms: int) -> int:
        """Start of the slot holding ``time_ms`` (``time_ms`` floored to the precision)."""
        return time_ms - time_ms % self.precision_ms

    # -- slots -------------------------------------------------------------------------------
    def get_slot(self, time_ms: int) -> Slot:
        """The slot for ``time_ms``, or :data:`EMPTY_SLOT` if it belongs to another turn."""
        step = time_ms // self.precision_ms
        stored, first, last, num, magic = SLOT.unpack_from(
            self._view, step % self.slot_count * SLOT_SIZE
        )
        if stored != step or num <= 0:
            return EMPTY_SLOT
        return Slot(step * self.precision_ms, first, last, num, magic)

    def put_slot(
        self, time_ms: int, first_pos: int, last_pos: int, num: int, magic: int = 0
    ) -> None:
        """Overwrite the slot for ``time_ms``."""
        if num < 0 or first_pos < -1 or last_pos < -1:
            raise ValueError(f"invalid slot: first {first_pos}, last {last_pos}, num {num}")
        step = time_ms // self.precision_ms
        SLOT.pack_into(
            self._view, step % self.slot_count * SLOT_SIZE, step, first_pos, last_pos, num, magic
        )
        self._dirty = True

    def link(self, time_ms: int, pos: int) -> Slot:
        """Record that the unit at ``pos`` (appended with ``prev_pos = get_slot(t).last_pos``)
        is now the newest of the slot for ``time_ms``; return the updated slot."""
        step = time_ms // self.precision_ms
        at = step % self.slot_count * SLOT_SIZE
        stored, first, _, num, magic = SLOT.unpack_from(self._view, at)
        if stored != step or num <= 0:  # empty or another turn's: start a new chain
            first, num, magic = pos, 0, 0
        SLOT.pack_into(self._view, at, step, first, pos, num + 1, magic)
        self._dirty = True
        return Slot(step * self.precision_ms, first, pos, num + 1, magic)

    def unlink_last(self, time_ms: int, pos: int, prev_pos: int) -> bool:
        """Undo :meth:`link` of the unit at ``pos`` (whose ``prev_pos`` is given) if it is still
        the slot's newest unit; return whether anything changed. Recovery calls this for the
        units past the checkpoint, newest first, before truncating the TimerLog; or use
        :meth:`rewind`, which needs no knowledge of which slot a unit went to."""
        slot = self.get_slot(time_ms)
        if slot.empty or slot.last_pos != pos:
            return False
        if slot.num <= 1 or prev_pos < 0:
            self.clear_slot(time_ms)
        else:
            self.put_slot(time_ms, slot.first_pos, prev_pos, slot.num - 1, slot.magic)
        return True

    def rewind(self, end_pos: int, timer_log: TimerLog) -> RewindResult:
        """Unlink every unit at or after ``end_pos`` from every slot, before the TimerLog is
        truncated to ``end_pos`` (crash recovery to a checkpoint).

        Slots whose ``last_pos`` is at or past ``end_pos`` are found in one vectorised pass over
        the file (whatever turn they belong to); each chain is then walked back through the
        still-readable tail until it reaches a unit before ``end_pos``, which becomes the slot's
        newest again, or ``-1``, which empties it. Without this, a slot could point at a
        position that the next append reuses for another slot's unit. A chain broken by a torn
        unit cannot be followed: that slot is cleared and returned in ``broken_slots``.
        """
        table = np.frombuffer(self._map, dtype=_SLOT_DTYPE, count=self.slot_count)
        rows = table[(table["num"] > 0) & (table["last"] >= end_pos)]  # a copy
        del table
        rewound = dropped = 0
        broken: list[Slot] = []
        for step, first, last, linked in zip(
            rows["step"].tolist(),
            rows["first"].tolist(),
            rows["last"].tolist(),
            rows["num"].tolist(),
            strict=True,
        ):
            time_ms = step * self.precision_ms
            magic = self.get_slot(time_ms).magic
            pos, num = last, linked
            try:
                while pos >= end_pos and num > 0:
                    pos = timer_log.read(pos).prev_pos
                    num -= 1
                    dropped += 1
            except TimerStoreError:
                broken.append(Slot(time_ms, first, last, linked, magic))
                pos = -1
            rewound += 1
            if pos < 0 or num <= 0:
                self.clear_slot(time_ms)
            else:
                self.put_slot(time_ms, first, pos, num, magic)
        return RewindResult(rewound, dropped, broken)

    def clear_slot(self, time_ms: int) -> None:
        """Make the slot for ``time_ms`` read empty (e.g. once it has been delivered)."""
        at = self.slot_index(time_ms) * SLOT_SIZE
        self._view[at : at + SLOT_SIZE] = bytes(SLOT_SIZE)
        self._dirty = True

    def scan(self, from_ms: int, to_ms: int) -> list[Slot]:
        """Every non-empty slot whose start lies in ``[slot_time(from_ms), to_ms)``, in time
        order; at most :data:`SCAN_SLOTS_MAX` slots are examined (vectorised)."""
        first_step = from_ms // self.precision_ms
        last_step = -(-to_ms // self.precision_ms)  # ceil: a slot starting before to_ms counts
        count = min(max(last_step - first_step, 0), self.slot_count, SCAN_SLOTS_MAX)
        if count == 0:
            return []
        table = np.frombuffer(self._map, dtype=_SLOT_DTYPE, count=self.slot_count)
        steps = np.arange(first_step, first_step + count, dtype=np.int64)
        rows = table[steps % self.slot_count]  # a copy: no view of the map survives the call
        del table
        hit = rows[(rows["step"] == steps) & (rows["num"] > 0)]
        return [
            Slot(step * self.precision_ms, first, last, num, magic)
            for step, first, last, num, magic in zip(
                hit["step"].tolist(),
                hit["first"].tolist(),
                hit["last"].tolist(),
                hit["num"].tolist(),
                hit["magic"].tolist(),
                strict=True,
            )
        ]

    # -- durability --------------------------------------------------------------------------
    def flush(self) -> None:
        """fdatasync the wheel if a slot changed since the last flush."""
        if self._dirty and not self.closed:
            self._dirty = False
            os.fdatasync(self._fd)

    def close(self) -> None:
        """Unmap and close the file (no flush: call ``flush`` first for durability)."""
        if self.closed:
            return
        self.closed = True
        self._view.release()
        self._map.close()
        os.close(self._fd)


def _open_sized(path: Path, file_bytes: int) -> int:
    """Open the wheel file, creating it sparse at ``file_bytes`` (tmp + rename) if missing."""
    if not path.exists():
        replace_atomic(path, lambda fd: os.ftruncate(fd, file_bytes))
    fd = os.open(path, os.O_RDWR)
    size = os.fstat(fd).st_size
    if size != file_bytes:
        os.close(fd)
        raise ValueError(
            f"{path} is {size} bytes but {file_bytes} are expected: the wheel was created "
            "with another timerWheelSlots setting"
        )
    return fd
