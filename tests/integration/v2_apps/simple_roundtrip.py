"""An ordinary RocketMQ 5 application: produce, then receive with a SimpleConsumer.

    python simple_roundtrip.py ENDPOINT TOPIC GROUP COUNT [NAMESPACE]

Sends COUNT messages (tag "TagA", a key each), receives until it has seen each of them (a message
not acked the first time comes back with delivery attempt 2: the first one is left unacked with a
10 s invisible duration, then its invisible duration is changed to 1 s), acks everything, and
prints one JSON object: what was sent and what was received, with the delivery attempts.
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


def main(endpoint: str, topic: str, group: str, count: int, namespace: str = "") -> None:
    config = ClientConfiguration(endpoint, Credentials(), namespace=namespace)
    producer = Producer(config, (topic,))
    producer.startup()
    sent = []
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"official-{i}".encode()
            msg.tag = "TagA"
            msg.keys = f"key-{i}"
            receipt = producer.send(msg)
            sent.append(receipt.message_id)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("TagA")}, await_duration=5)
    consumer.startup()
    received: list[dict[str, object]] = []
    left_once = False
    try:
        end = time.monotonic() + DEADLINE_S
        done: set[str] = set()
        while len(done) < count and time.monotonic() < end:
            for m in consumer.receive(16, 10):
                received.append(
                    {
                        "id": m.message_id,
                        "body": m.body.decode(),
                        "attempt": m.delivery_attempt,
                        "tag": m.tag,
                    }
                )
                if not left_once:
                    left_once = True  # not acked: back after a 1 s invisible duration
                    consumer.change_invisible_duration(m, 1)
                    continue
                consumer.ack(m)
                done.add(m.message_id)
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "received": received}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])
