"""Offsets of the ``rocketq`` source: {topic: {brokerName: {queueId: offset}}} (queue ids as
strings, every level in sorted order: Spark compares offsets as their JSON text), and how a
trigger's limit is spread over the queues."""

from __future__ import annotations

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
