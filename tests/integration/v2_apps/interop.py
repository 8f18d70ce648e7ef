"""An ordinary RocketMQ 5 application that only sends or only receives.

    python interop.py send ENDPOINT TOPIC GROUP COUNT      sends COUNT messages "v2-{i}"
    python interop.py receive ENDPOINT TOPIC GROUP COUNT   receives and acks COUNT messages

Prints one JSON object: the ids sent, or the bodies and properties received.
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


def send(config: ClientConfiguration, topic: str, count: int) -> None:
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        ids = []
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"v2-{i}".encode()
            msg.tag = "FromV2"
            msg.add_property("origin", "official-sdk")
            ids.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    print(json.dumps({"sent": ids}))


def receive(config: ClientConfiguration, topic: str, group: str, count: int) -> None:
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    got: list[dict[str, object]] = []
    try:
        end = time.monotonic() + DEADLINE_S
        while len(got) < count and time.monotonic() < end:
            for m in consumer.receive(16, 30):
                consumer.ack(m)
                got.append(
                    {
                        "id": m.message_id,
                        "body": m.body.decode(),
                        "tag": m.tag,
                        "keys": sorted(m.keys),
                        "properties": dict(m.properties),
                    }
                )
    finally:
        consumer.shutdown()
    print(json.dumps({"received": got}))


if __name__ == "__main__":
    mode, endpoint, topic, group, count = sys.argv[1:6]
    config = ClientConfiguration(endpoint, Credentials())
    if mode == "send":
        send(config, topic, int(count))
    else:
        receive(config, topic, group, int(count))
