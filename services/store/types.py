"""Names for the three kinds of offset the store juggles, and the record that dispatch consumes.

STYLE.md habit 6: a *physical* offset is a byte position in the commitlog (global across its
files); a *queue* offset is the logical index of a unit in one consume queue; a *file start*
offset is the name of one mapped file. Mixing them is the classic off-by-one trap, so each has
its own ``NewType`` and every variable says which it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, NewType

if TYPE_CHECKING:
    import numpy as np

PhysicalOffset = NewType("PhysicalOffset", int)
"""Byte position in the commitlog, counted from the start of its first-ever file."""

QueueOffset = NewType("QueueOffset", int)
"""Logical position of a unit in one consume queue (0, 1, 2, … — not bytes)."""

FileStartOffset = NewType("FileStartOffset", int)
"""The offset a mapped file starts at; also its 20-digit file name."""


@dataclass(slots=True)
class DispatchRequest:
    """Everything dispatch needs to index one stored record, without re-reading it.

    Built by the commitlog right after an append (from the values it just wrote) and by
    recovery when it re-reads records from disk.
    """

    topic: str
    queue_id: int
    commitlog_offset: PhysicalOffset
    msg_size: int
    tags_code: int
    store_timestamp_ms: int
    queue_offset: QueueOffset
    keys: str
    """The KEYS property: zero or more business keys separated by single spaces."""
    uniq_key: str
    """The client-generated unique message id (UNIQ_KEY property), or ``""``."""
    sys_flag: int = 0
    prepared_transaction_offset: int = 0


class DispatchRun(NamedTuple):
    """Records of one queue at consecutive queue offsets, none of them a transaction's half or
    rollback, as columns: what dispatch needs without a :class:`DispatchRequest` per record. A
    producer's batch on a master (``SentAppend.run``), and runs of replicated records on a
    slave. Column i describes the record at queue offset ``first_queue_offset + i``."""

    topic: str
    queue_id: int
    first_queue_offset: QueueOffset
    physical_offsets: list[int]
    sizes: list[int]
    tags_codes: list[int]
    store_timestamps_ms: list[int]
    keys: list[str]
    uniq_keys: Sequence[str]
    sys_flags: list[int]
    end_offset: PhysicalOffset
    """Just past the last record."""
    index_hashes: np.ndarray | None = None
    """The index hash of ``topic#uniq_key`` of every record (``int64``), when the reader
    computed them from the records' bytes and no record has KEYS (a slave's producer
    batches); None: the index hashes the strings itself."""

    def requests(self) -> list[DispatchRequest]:
        """The same records as DispatchRequests (for a listener or a re-dispatch)."""
        topic, qid, q0 = self.topic, self.queue_id, self.first_queue_offset
        return [
            DispatchRequest(topic, qid, PhysicalOffset(phys), size, tags, stamp,
                            QueueOffset(q0 + i), keys, uniq, sys_flag, 0)
            for i, (phys, size, tags, stamp, keys, uniq, sys_flag) in enumerate(
                zip(self.physical_offsets, self.sizes, self.tags_codes, self.store_timestamps_ms,
                    self.keys, self.uniq_keys, self.sys_flags, strict=True)
            )
        ]  # fmt: skip
