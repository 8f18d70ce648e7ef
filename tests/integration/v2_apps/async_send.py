"""An ordinary RocketMQ 5 application sending with ``Producer.send_async``, then receiving.

    python async_send.py ENDPOINT TOPIC GROUP COUNT

Starts COUNT asynchronous sends at once (each a ``concurrent.futures.Future``), waits for every
future's SendReceipt, then receives with a SimpleConsumer until each sent message was seen, acking
each. Prints one JSON object: the message ids the futures resolved to and every delivery seen.
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
        futures = []
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"async-{i}".encode()
            futures.append(producer.send_async(msg))
        sent = [f.result(timeout=DEADLINE_S).message_id for f in futures]
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    received: list[dict[str, object]] = []
    try:
        end = time.monotonic() + DEADLINE_S
        while len(received) < count and time.monotonic() < end:
            for m in consumer.receive(16, 10):
                received.append({"id": m.message_id, "body": m.body.decode()})
                consumer.ack(m)
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "received": received}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
