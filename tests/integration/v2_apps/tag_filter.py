"""An ordinary RocketMQ 5 application: SimpleConsumers of two groups filtering by tag.

    python tag_filter.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT messages tagged "TagA" and COUNT tagged "TagB", interleaved, all stored before any
receive. Then group ``GROUP-a`` subscribed to "TagA" receives until it has COUNT messages, and
group ``GROUP-b`` subscribed to "TagB" likewise (each acks what it gets). Prints one JSON object:
the ids sent per tag and every delivery each group saw, with its tag.
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
TAGS = ("TagA", "TagB")


def receive_all(
    config: ClientConfiguration, group: str, topic: str, tag: str, count: int
) -> list[dict[str, object]]:
    consumer = SimpleConsumer(config, group, {topic: FilterExpression(tag)}, await_duration=5)
    consumer.startup()
    seen: list[dict[str, object]] = []
    try:
        end = time.monotonic() + DEADLINE_S
        while len(seen) < count and time.monotonic() < end:
            for m in consumer.receive(16, 10):
                seen.append({"id": m.message_id, "tag": m.tag})
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return seen


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    sent: dict[str, list[str]] = {t: [] for t in TAGS}
    try:
        for i in range(count):
            for tag in TAGS:
                msg = Message()
                msg.topic = topic
                msg.body = f"{tag}-{i}".encode()
                msg.tag = tag
                sent[tag].append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    seen = {
        "a": receive_all(config, f"{group}-a", topic, "TagA", count),
        "b": receive_all(config, f"{group}-b", topic, "TagB", count),
    }
    print(json.dumps({"sent": sent, "seen": seen}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
