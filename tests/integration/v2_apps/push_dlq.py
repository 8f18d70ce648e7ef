"""An ordinary RocketMQ 5 application with a PushConsumer whose listener always fails.

    python push_dlq.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT messages and prints one JSON line with their ids, then consumes with a PushConsumer
whose listener answers FAILURE every time (the SDK then changes each message's invisible duration:
1 s, as SDK 5.1.2 reads only a customized backoff policy; the broker redelivers it until its
group's retryMaxTimes are used up, then moves it to ``%DLQ%{group}``). Runs until its standard
input is closed (the test closes it once the dead letters are there), then prints one JSON line
with every delivery the listener saw.
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


class AlwaysFail(MessageListener):
    def __init__(self) -> None:
        self.seen: list[dict[str, object]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen.append({"id": message.message_id, "attempt": message.delivery_attempt})
        return ConsumeResult.FAILURE


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    sent = []
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"doomed-{i}".encode()
            sent.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    print(json.dumps({"sent": sent}), flush=True)
    listener = AlwaysFail()
    consumer = PushConsumer(config, group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        sys.stdin.read()  # until the test closes it
    finally:
        consumer.shutdown()
    with listener.lock:
        print(json.dumps({"seen": listener.seen}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
