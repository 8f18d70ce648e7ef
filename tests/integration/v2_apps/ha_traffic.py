"""An ordinary RocketMQ 5 application that keeps producing or keeps consuming, line by line.

    python ha_traffic.py send ENDPOINTS TOPIC GROUP      sends "m-0", "m-1", ... until stdin closes
    python ha_traffic.py receive ENDPOINTS TOPIC GROUP   receives and acks until stdin closes

ENDPOINTS lists every gateway ("host:port;host:port"): the SDK asks any live one for routes, as
an application of a cluster with several access points is configured. Failures are what an
application meets while a master fails over: each is reported on stderr and the loop goes on.
Every acknowledged send prints ``{"ok": body, "id": ..., "via": endpoints}``; every received
message ``{"got": body, "id": ..., "attempt": n, "via": endpoints}`` (printed once it is acked,
or with ``"acked": false`` when the ack failed). One JSON object a line, flushed at once.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

SEND_PAUSE_S = 0.01
FAILURE_PAUSE_S = 0.5
INVISIBLE_S = 10
RECEIVE_BATCH = 8


def emit(record: dict[str, object]) -> None:
    print(json.dumps(record), flush=True)


def until_stdin_closes() -> threading.Event:
    closed = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=watch, daemon=True).start()
    return closed


def send(config: ClientConfiguration, topic: str) -> None:
    stop = until_stdin_closes()
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        i = 0
        while not stop.is_set():
            msg = Message()
            msg.topic = topic
            msg.body = f"m-{i}".encode()
            try:
                receipt = producer.send(msg)
            except Exception as exc:  # an application keeps going; the test counts acks only
                print(f"send m-{i} failed: {exc}", file=sys.stderr, flush=True)
                time.sleep(FAILURE_PAUSE_S)
            else:
                via = str(receipt.message_queue.endpoints)
                emit({"ok": f"m-{i}", "id": receipt.message_id, "via": via})
                time.sleep(SEND_PAUSE_S)
            i += 1
    finally:
        producer.shutdown()


def receive(config: ClientConfiguration, topic: str, group: str) -> None:
    stop = until_stdin_closes()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    try:
        while not stop.is_set():
            try:
                messages = consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
            except Exception as exc:
                print(f"receive failed: {exc}", file=sys.stderr, flush=True)
                time.sleep(FAILURE_PAUSE_S)
                continue
            for m in messages:
                record = {
                    "got": m.body.decode(),
                    "id": m.message_id,
                    "attempt": m.delivery_attempt,
                    "via": str(m.endpoints),
                    "acked": True,
                }
                try:
                    consumer.ack(m)
                except Exception as exc:
                    print(f"ack {m.message_id} failed: {exc}", file=sys.stderr, flush=True)
                    record["acked"] = False
                emit(record)
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    mode, endpoints, topic, group = sys.argv[1:5]
    config = ClientConfiguration(endpoints, Credentials())
    if mode == "send":
        send(config, topic)
    else:
        receive(config, topic, group)
