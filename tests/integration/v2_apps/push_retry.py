"""An ordinary RocketMQ 5 application with a PushConsumer whose listener fails once.

    python push_retry.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT messages, then consumes them with a PushConsumer: the listener answers FAILURE the
first time it sees the first message (the SDK then changes its invisible duration by the
server's backoff policy and the message comes back with delivery attempt 2) and SUCCESS
otherwise. Prints one JSON object: what was sent and each delivery the listener saw.
"""

from __future__ import annotations

import json
import sys
import threading

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


class FailOnce(MessageListener):
    def __init__(self, count: int) -> None:
        self.count = count
        self.seen: list[dict[str, object]] = []
        self.failed: set[str] = set()
        self.done: set[str] = set()
        self.lock = threading.Lock()
        self.all_done = threading.Event()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen.append({"id": message.message_id, "attempt": message.delivery_attempt})
            if not self.failed and not self.done:
                self.failed.add(message.message_id)
                return ConsumeResult.FAILURE
            self.done.add(message.message_id)
            if len(self.done) == self.count:
                self.all_done.set()
            return ConsumeResult.SUCCESS


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    sent = []
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"push-{i}".encode()
            sent.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    listener = FailOnce(count)
    consumer = PushConsumer(config, group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        listener.all_done.wait(DEADLINE_S)
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "seen": listener.seen}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
