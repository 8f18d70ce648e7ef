"""An ordinary RocketMQ 5 application with a PushConsumer whose listener is slow once.

    python push_slow.py ENDPOINT TOPIC GROUP COUNT SLOW_S

Sends COUNT messages; the listener takes SLOW_S seconds over the first message it gets (longer
than the server's invisible time for push consumers in the test), then answers SUCCESS to all.
After every message succeeded it keeps listening QUIET_S seconds, so that a redelivery would be
seen. Prints one JSON object: what was sent and every delivery the listener saw.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
)

DEADLINE_S = 60
QUIET_S = 3


class SlowOnce(MessageListener):
    def __init__(self, count: int, slow_s: float) -> None:
        self.count = count
        self.slow_s = slow_s
        self.seen: list[dict[str, object]] = []
        self.done: set[str] = set()
        self.lock = threading.Lock()
        self.all_done = threading.Event()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            first = not self.seen
            self.seen.append({"id": message.message_id, "attempt": message.delivery_attempt})
        if first:
            time.sleep(self.slow_s)
        with self.lock:
            self.done.add(message.message_id)
            if len(self.done) == self.count:
                self.all_done.set()
        return ConsumeResult.SUCCESS


def main(endpoint: str, topic: str, group: str, count: int, slow_s: float) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    sent = []
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"slow-{i}".encode()
            sent.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    listener = SlowOnce(count, slow_s)
    consumer = PushConsumer(config, group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        listener.all_done.wait(DEADLINE_S)
        time.sleep(QUIET_S)  # a redelivery of the slow message would arrive in this window
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "seen": listener.seen}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
