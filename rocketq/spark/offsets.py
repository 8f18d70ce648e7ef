"""Offsets of the ``rocketq`` source: {topic: {brokerName: {queueId: offset}}} (queue ids as
strings, every level in sorted order: Spark compares offsets as their JSON text), how a
trigger's limit is spread over the queues, when a trigger may run (minOffsetsPerTrigger) and how
a queue's range is split into Spark partitions (maxRecordsPerPartition)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from rocketq.message import MessageQueue

Offsets = dict[str, dict[str, dict[str, int]]]


def to_json_dict(offsets: dict[MessageQueue, int]) -> Offsets:
    """The canonical (sorted) offsets dict of ``offsets``."""
    out: Offsets = {}
    for mq in sorted(offsets, key=lambda q: (q.topic, q.broker_name, q.queue_id)):
        out.setdefault(mq.topic, {}).setdefault(mq.broker_name, {})[str(mq.queue_id)] = offsets[mq]
    return out


def from_json_dict(offsets: Offsets) -> dict[MessageQueue, int]:
    return {
        MessageQueue(topic, broker, int(qid)): int(off)
        for topic, brokers in offsets.items()
        for broker, queues in brokers.items()
        for qid, off in queues.items()
    }


def spread(backlogs: dict[MessageQueue, int], limit: int) -> dict[MessageQueue, int]:
    """How many of each queue's ``backlogs`` a trigger reads when at most ``limit`` may be read
    in all: everything when it fits, else shares in proportion to each backlog (Kafka's
    maxOffsetsPerTrigger), the remainder to the largest backlogs first; the sum is ``limit``."""
    total = sum(backlogs.values())
    if total <= limit:
        return dict(backlogs)
    shares = {mq: limit * b // total for mq, b in backlogs.items()}
    left = limit - sum(shares.values())
    for mq in sorted(backlogs, key=lambda q: (-(backlogs[q] - shares[q]), q)):
        if left == 0:
            break
        if shares[mq] < backlogs[mq]:
            shares[mq] += 1
            left -= 1
    return shares


def split(start: int, end: int, most: int) -> list[tuple[int, int]]:
    """[start, end) cut into the fewest ranges of at most ``most`` offsets, of even sizes
    (Kafka's maxRecordsPerPartition); one range when ``most`` is 0."""
    count = end - start
    if most <= 0 or count <= most:
        return [(start, end)]
    pieces = -(-count // most)
    bounds = [start + count * i // pieces for i in range(pieces + 1)]
    return list(itertools.pairwise(bounds))


class TriggerGate:
    """Kafka's ``minOffsetsPerTrigger`` + ``maxTriggerDelay``: a trigger runs once at least
    ``min_offsets`` new offsets are available, or ``max_delay_ms`` after the last trigger that
    ran; the first trigger of a reader always runs (as Kafka's does)."""

    def __init__(
        self, min_offsets: int, max_delay_ms: int, clock_ms: Callable[[], float] | None = None
    ) -> None:
        self.min_offsets = min_offsets
        self.max_delay_ms = max_delay_ms
        self.clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self.last_run_ms: float | None = None

    def admit(self, new_offsets: int) -> bool:
        """Whether a trigger with ``new_offsets`` available runs now."""
        if new_offsets <= 0:
            return False  # no batch runs; the delay keeps counting from the last one that did
        now_ms = self.clock_ms()
        due = self.last_run_ms is None or now_ms - self.last_run_ms >= self.max_delay_ms
        if due or new_offsets >= self.min_offsets:
            self.last_run_ms = now_ms
            return True
        return False
