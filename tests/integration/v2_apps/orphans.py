"""An ordinary RocketMQ 5 application whose transactions are left open: the server asks.

    python orphans.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT transactional messages and resolves none of them; its TransactionChecker commits
whatever the server asks about. Once the checker has been asked about every message, receives
them with a SimpleConsumer. Prints one JSON object: the ids sent, asked about and received.
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
    TransactionChecker,
    TransactionResolution,
)

DEADLINE_S = 60


class CommitOnCheck(TransactionChecker):
    def __init__(self, count: int) -> None:
        self.asked: list[str] = []
        self.count = count
        self.all_asked = threading.Event()

    def check(self, message: Message) -> TransactionResolution:
        self.asked.append(message.message_id)
        if len(set(self.asked)) >= self.count:
            self.all_asked.set()
        return TransactionResolution.COMMIT


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    checker = CommitOnCheck(count)
    producer = Producer(config, (topic,), checker)
    producer.startup()
    sent = []
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"orphan-{i}".encode()
            sent.append(producer.send(msg, producer.begin_transaction()).message_id)
        checker.all_asked.wait(DEADLINE_S)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    received: list[str] = []
    try:
        end = time.monotonic() + DEADLINE_S
        while len(received) < count and time.monotonic() < end:
            for m in consumer.receive(16, 30):
                consumer.ack(m)
                received.append(m.message_id)
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "asked": sorted(set(checker.asked)), "received": received}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
