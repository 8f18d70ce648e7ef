"""How soon a slave should ack: the master's ``CommitLogChunk.ack_pace_ms``.

Every replication stream message costs both brokers a gRPC write or read, ~150-200 µs of CPU
each on a small machine and far more than its bytes. With one small chunk in flight
(haSmallChunksInFlightMax) each ack releases the next chunk, so the acks set the message rate:

- **acks at once** give a SYNC_MASTER send the shortest wait, one round trip;
- **paced acks** (one at most every few ms) give fewer, larger chunks, so less CPU per message.

Which is right depends on one thing, whether the master has CPU to spare. A fixed pace gets one
case wrong: at one ack per ms, two concurrent SYNC_MASTER senders got the throughput of one
(each second chunk waited out the pace), while acks at once cost a saturated master a quarter
of its throughput (``replication_bench``; the figures are in the issue 16 notes).

So the master measures the share of wall time its event-loop thread spent on a CPU
(``time.thread_time``) over windows of :data:`WINDOW_S`, and asks for :data:`ACK_PACE_BUSY_MS`
while that share is at least :data:`BUSY_SHARE`, for 0 (at once) otherwise. Under a load the
loop keeps up with, acks cost only idle time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from services.common.clock import Clock

BUSY_SHARE = 0.75
"""Loop-thread CPU share at or above which the master counts as busy. Measured on 2 cores with
a client, master and slave sharing them: one to four SYNC_MASTER senders 0.4-0.7, a saturating
load 0.8-0.85 (the rest of the wall time it waits for a core)."""
WINDOW_S = 0.1
"""How long one measurement runs; short enough to follow a load that starts or stops."""
ACK_PACE_BUSY_MS = 3
"""The pace asked for while busy: at 3 ms a saturating batch load spent 0.82x the CPU per
message of acks at once, at 1 ms no less than at once."""
ACK_PACE_MAX_MS = 100
"""What a slave holds an ack at most, whatever a chunk asks (a slow ack times out sends)."""


class LoopLoad:
    """The busy share of the thread that calls :meth:`ack_pace_ms` (the event loop's)."""

    def __init__(
        self,
        clock: Clock,
        cpu_s: Callable[[], float] = time.thread_time,
        window_s: float = WINDOW_S,
    ) -> None:
        self._clock = clock
        self._cpu_s = cpu_s
        self._window_s = window_s
        self._start: tuple[float, float] | None = None
        """(monotonic s, thread CPU s) where the current window began; taken on the first
        call, so from the measuring thread."""
        self.share = 0.0
        """The last whole window's CPU share."""

    def ack_pace_ms(self) -> int:
        """The pace to put in the next chunk (closes the window when it is due)."""
        now_s = self._clock.monotonic_s()
        if self._start is None:
            self._start = (now_s, self._cpu_s())
        else:
            start_s, start_cpu_s = self._start
            elapsed_s = now_s - start_s
            if elapsed_s >= self._window_s:
                cpu_s = self._cpu_s()
                self.share = (cpu_s - start_cpu_s) / elapsed_s
                self._start = (now_s, cpu_s)
        return ACK_PACE_BUSY_MS if self.share >= BUSY_SHARE else 0
