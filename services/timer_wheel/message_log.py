"""The MessageLog: the timer-wheel's local copy of every timer message it has scheduled.

The timer-wheel reads a timer record from a broker's ``rmq_sys_wheel_timer`` queue, copies it
here, and points its TimerLog unit at the copy (``offsetPy``/``sizePy``). Delivering then needs
no broker read, and the broker's commit offset can move on as soon as the copy is durable.

Entry layout (big-endian):

| offset  | bytes | field     | meaning                                                     |
|---------|-------|-----------|-------------------------------------------------------------|
| 0       | 4     | size      | bytes of the whole entry, header included                   |
| 4       | 4     | magic     | ``ENTRY_MAGIC``; ``BLANK_MAGIC`` for an end-of-file blank   |
| 8       | 4     | crc       | CRC-32 of bytes ``[12, size)`` (name length, name, record)  |
| 12      | 2     | nameLen   | bytes of the broker name                                    |
| 14      | n     | broker    | UTF-8 name of the broker group the record came from         |
| 14 + n  | rest  | record    | the record as the broker stored it (:mod:`rocketq.codec`)   |

``append`` returns ``(pos, size)`` with ``size`` the whole entry; ``read(pos, size)`` checks the
header and the CRC, so a torn or stale entry raises :class:`TornRecordError` instead of handing
bad bytes to delivery.

Files: 1 GiB by default (sparse), named by their 20-digit start position; an entry never
straddles two files — when it does not fit with room for an 8-byte blank, a blank (size = bytes
left, magic ``BLANK_MAGIC``) closes the file. Recovery on open walks the last file's entries
(headers only) to find its end; the service then truncates to its checkpoint
(:meth:`MessageLog.truncate_to`). Retention removes whole files (:meth:`delete_files_before`).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from services.store.mapped_file import MappedFile
from services.timer_wheel.timer_log import PositionError, SegmentedLog, TornRecordError

HEADER = struct.Struct(
    ">i"  # size: whole entry
    "i"  # magic
    "I"  # crc32 of [12, size)
    "H"  # broker name length
)
HEADER_SIZE = 14
assert HEADER.size == HEADER_SIZE
_CRC_FROM = 12

BLANK = struct.Struct(">ii")  # size (bytes left in the file), BLANK_MAGIC
BLANK_SIZE = 8
assert BLANK.size == BLANK_SIZE

ENTRY_MAGIC = 0x54494D45  # "TIME"
BLANK_MAGIC = -0x2A2A2A2B  # any value that is not ENTRY_MAGIC and not 0
BROKER_NAME_BYTES_MAX = 255

DEFAULT_MESSAGE_LOG_FILE_BYTES = 1024 * 1024 * 1024


class MessageLog(SegmentedLog):
    """The MessageLog files of one directory; see the module docstring for the layout."""

    blank_size = BLANK_SIZE

    def __init__(
        self, directory: Path | str, file_bytes: int = DEFAULT_MESSAGE_LOG_FILE_BYTES
    ) -> None:
        if file_bytes < HEADER_SIZE + BLANK_SIZE + 1:
            raise ValueError("file_bytes is too small for one entry")
        super().__init__(directory, file_bytes)

    @property
    def entry_bytes_max(self) -> int:
        """Largest entry (header + name + record) a file can take."""
        return self.file_bytes - BLANK_SIZE

    def append(self, broker_name: str, record: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Store ``record`` from ``broker_name``; return ``(pos, size)`` of the entry."""
        name = broker_name.encode()
        if len(name) > BROKER_NAME_BYTES_MAX:
            raise ValueError(f"broker name longer than {BROKER_NAME_BYTES_MAX} bytes")
        size = HEADER_SIZE + len(name) + len(record)
        if size > self.entry_bytes_max:
            raise ValueError(f"entry of {size} bytes exceeds {self.entry_bytes_max}")
        mf = self._file_for_append(size)
        at = mf.wrote_position
        view = mf.view
        body_at = at + HEADER_SIZE
        view[body_at : body_at + len(name)] = name
        view[body_at + len(name) : at + size] = record
        # Name length first, so the CRC covers it, then the rest of the header.
        struct.pack_into(">H", view, at + _CRC_FROM, len(name))
        crc = zlib.crc32(view[at + _CRC_FROM : at + size])
        HEADER.pack_into(view, at, size, ENTRY_MAGIC, crc, len(name))
        mf.wrote_position = at + size
        return mf.file_from_offset + at, size

    def read(self, pos: int, size: int) -> tuple[str, bytes]:
        """``(broker_name, record)`` of the entry at ``pos``; its ``size`` must match.

        Raises :class:`PositionError` outside the written range and :class:`TornRecordError`
        when the bytes there are not that entry (blank, torn, zeros, CRC mismatch).
        """
        if size < HEADER_SIZE:
            raise PositionError(f"message log entry size {size} is below the header size")
        mf = self._file_for_read(pos, size)
        local = pos - mf.file_from_offset
        view = mf.view
        stored_size, magic, crc, name_len = HEADER.unpack_from(view, local)
        if magic != ENTRY_MAGIC or stored_size != size or HEADER_SIZE + name_len > size:
            what = "a blank end-of-file record" if magic == BLANK_MAGIC else "no valid entry"
            raise TornRecordError(
                f"message log position {pos} holds {what} "
                f"(size {stored_size}, expected {size}, magic {magic:#x})"
            )
        if zlib.crc32(view[local + _CRC_FROM : local + size]) != crc:
            raise TornRecordError(f"message log entry at {pos} fails its CRC (torn write)")
        name_end = local + HEADER_SIZE + name_len
        return bytes(view[local + HEADER_SIZE : name_end]).decode(), bytes(
            view[name_end : local + size]
        )

    def flush(self) -> int:
        """fdatasync every file written since the last flush; return the durable end position."""
        return self._flush_files()

    def _write_blank(self, mf: MappedFile) -> None:
        BLANK.pack_into(mf.view, mf.wrote_position, mf.free_bytes, BLANK_MAGIC)
        mf.wrote_position = self.file_bytes

    def _scan_end(self, mf: MappedFile) -> int:
        """Local end of the entries of ``mf``: walk the headers to the first one that is not
        an entry; a blank closes the file. Headers only: the checkpoint bounds what is trusted.
        """
        view = mf.view
        local = 0
        while local + BLANK_SIZE <= self.file_bytes:
            size, magic = BLANK.unpack_from(view, local)
            if magic == BLANK_MAGIC and size == self.file_bytes - local:
                return self.file_bytes
            if magic != ENTRY_MAGIC or size < HEADER_SIZE or local + size > self.file_bytes:
                return local
            local += size
        return local
