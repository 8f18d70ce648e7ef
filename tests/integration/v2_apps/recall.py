"""An ordinary RocketMQ 5 application that recalls one of two delayed messages.

    python recall.py ENDPOINT TOPIC GROUP DELAY_S

Sends "keep" and "drop" with the same delivery timestamp DELAY_S whole seconds ahead, recalls
"drop" with the recall handle of its send receipt, tries to recall it a second time (which must
fail), then receives until "keep" arrives and once more after it. Prints one JSON object: both
message ids, the id the recall returned, what the second recall gave, and every body received.
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


def delayed(topic: str, body: bytes, deliver_s: int) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body
    msg.delivery_timestamp = deliver_s
    return msg


def main(endpoint: str, topic: str, group: str, delay_s: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    producer = Producer(config, (topic,))
    producer.startup()
    out: dict[str, object] = {}
    try:
        deliver_s = int(time.time()) + delay_s
        keep = producer.send(delayed(topic, b"keep", deliver_s))
        drop = producer.send(delayed(topic, b"drop", deliver_s))
        out.update(keep=keep.message_id, drop=drop.message_id, has_handle=bool(drop.recall_handle))
        out["recalled"] = producer.recall_message(topic, drop.recall_handle)
        # The SDK raises for most refusals but hands MESSAGE_NOT_FOUND back as no message id.
        try:
            out["again"] = producer.recall_message(topic, drop.recall_handle)
        except Exception as exc:  # the SDK's own exception types, per status
            out["again"] = f"error: {exc}"
    finally:
        producer.shutdown()
    received: list[str] = []
    try:
        end = time.monotonic() + DEADLINE_S
        while "keep" not in received and time.monotonic() < end:
            for m in consumer.receive(4, 15):
                consumer.ack(m)
                received.append(m.body.decode())
        for m in consumer.receive(4, 15):  # "drop" would be due with "keep"
            consumer.ack(m)
            received.append(m.body.decode())
    finally:
        consumer.shutdown()
    out["received"] = received
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
