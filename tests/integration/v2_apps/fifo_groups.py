"""An ordinary RocketMQ 5 application with two FIFO message groups on one queue.

    python fifo_groups.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT messages of message group "g1" and COUNT of "g2", interleaved (g1-0, g2-0, g1-1,
...), then receives with a SimpleConsumer of a FIFO consumer group: first one message (g1-0),
kept unacked while it receives again (the other group's messages only, g1 waits), then acks
everything and receives the rest. Prints one JSON object: each receive's bodies and attempts.
"""

from __future__ import annotations

import json
import sys
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

DEADLINE_S = 60
INVISIBLE_S = 30


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        for i in range(count):
            for g in ("g1", "g2"):
                msg = Message()
                msg.topic = topic
                msg.body = f"{g}-{i}".encode()
                msg.message_group = g
                producer.send(msg)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    receives: list[list[list[object]]] = []
    try:
        end = time.monotonic() + DEADLINE_S
        held: list[object] = []
        while not held and time.monotonic() < end:
            held = consumer.receive(1, INVISIBLE_S)
        receives.append([[m.body.decode(), m.delivery_attempt, m.message_group] for m in held])
        others: list[object] = []
        while len(others) < count and time.monotonic() < end:
            others += consumer.receive(2 * count, INVISIBLE_S)
        receives.append([[m.body.decode(), m.delivery_attempt, m.message_group] for m in others])
        for m in [*held, *others]:
            consumer.ack(m)
        rest: list[object] = []
        while len(rest) < count - 1 and time.monotonic() < end:
            batch = consumer.receive(2 * count, INVISIBLE_S)
            for m in batch:
                consumer.ack(m)
            rest += batch
        receives.append([[m.body.decode(), m.delivery_attempt, m.message_group] for m in rest])
    finally:
        consumer.shutdown()
    print(json.dumps({"receives": receives}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
