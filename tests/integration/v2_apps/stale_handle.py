"""An ordinary RocketMQ 5 application acking with a receipt handle made stale on purpose.

    python stale_handle.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT messages and receives the first that arrives with a SimpleConsumer. Changes its
invisible duration (the SDK keeps the new receipt handle the server returns), then acks with the
OLD handle, which the server must refuse, and finally acks with the new one. Prints one JSON
object: whether the handles differ, the exception (type, protocol code, message) the stale ack
raised, and the error of the ack with the new handle (null when it succeeded).
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
INVISIBLE_S = 10


def error_of(exc: Exception | None) -> dict[str, object] | None:
    if exc is None:
        return None
    code = getattr(exc, "code", None)
    return {"type": type(exc).__name__, "code": int(code) if code else None, "text": str(exc)}


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"stale-{i}".encode()
            producer.send(msg)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    try:
        end = time.monotonic() + DEADLINE_S
        got = []
        while not got and time.monotonic() < end:
            got = consumer.receive(1, INVISIBLE_S)
        [m] = got
        old = m.receipt_handle
        consumer.change_invisible_duration(m, INVISIBLE_S)
        new = m.receipt_handle
        m.receipt_handle = old
        stale: Exception | None = None
        try:
            consumer.ack(m)
        except Exception as exc:  # the SDK's ClientException subclass for the status code
            stale = exc
        m.receipt_handle = new
        fresh: Exception | None = None
        try:
            consumer.ack(m)
        except Exception as exc:
            fresh = exc
    finally:
        consumer.shutdown()
    out = {"handles_differ": old != new, "stale": error_of(stale), "fresh": error_of(fresh)}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
