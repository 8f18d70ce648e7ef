"""The store's exception classes, in a module of their own so every store module can raise them.

``message_store`` re-exports them; callers import them from there or from here.
"""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot take this write; the message says why and what to do."""


class ReplicaRangeError(StoreError):
    """A replication read or truncation asked for an offset the commitlog does not hold.

    Below the oldest retained byte (retention deleted it: the slave cannot catch up by
    streaming) or beyond the newest one.
    """


class ReplicaCorruptError(StoreError):
    """Replicated bytes failed a check (length, magic, offset or body CRC).

    The slave's commitlog was cut back to the end of the last good record before this was
    raised, so it stays consistent; the slave reconnects and streams again from there.
    """
