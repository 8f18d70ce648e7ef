"""An ordinary RocketMQ 5 application sending a delayed message and receiving it.

    python delayed.py ENDPOINT TOPIC GROUP DELAY_S

Sends one message with a delivery timestamp DELAY_S whole seconds ahead (the SDK sends whole
seconds), receives it with a SimpleConsumer and acks it. Prints one JSON object: the message id,
the delivery timestamp asked for and the received message id and when it was received (ms).
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


def main(endpoint: str, topic: str, group: str, delay_s: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        msg = Message()
        msg.topic = topic
        msg.body = b"later"
        deliver_s = int(time.time()) + delay_s
        msg.delivery_timestamp = deliver_s
        sent = producer.send(msg).message_id
    finally:
        producer.shutdown()
    got = None
    try:
        end = time.monotonic() + DEADLINE_S
        while got is None and time.monotonic() < end:
            for m in consumer.receive(1, 15):
                consumer.ack(m)
                got = {"id": m.message_id, "received_ms": int(time.time() * 1000)}
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "deliver_ms": deliver_s * 1000, "got": got}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
