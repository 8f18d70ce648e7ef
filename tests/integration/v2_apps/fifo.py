"""An ordinary RocketMQ 5 application with FIFO messages of one message group.

    python fifo.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT messages of message group "order-1", then receives them with a SimpleConsumer of a
FIFO consumer group, acking each batch before asking for the next. Prints one JSON object: the
bodies in the order received, with their delivery attempts.
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


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"step-{i}".encode()
            msg.message_group = "order-1"
            producer.send(msg)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    got: list[list[object]] = []
    try:
        end = time.monotonic() + DEADLINE_S
        while len(got) < count and time.monotonic() < end:
            batch = consumer.receive(4, 30)
            for m in batch:
                got.append([m.body.decode(), m.delivery_attempt])
            for m in batch:
                consumer.ack(m)
    finally:
        consumer.shutdown()
    print(json.dumps({"received": got}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
