"""An ordinary RocketMQ 5 application with transactional messages.

    python transactions.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT transactional messages, commits the even ones and rolls back the odd ones, then
receives with a SimpleConsumer until it has the committed ones (and a few seconds more, to see
that nothing else comes). Prints one JSON object: committed and rolled-back ids, received ids.
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
    TransactionChecker,
    TransactionResolution,
)

DEADLINE_S = 60
QUIET_S = 3


class RollBackOnCheck(TransactionChecker):
    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.ROLLBACK


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    producer = Producer(config, (topic,), RollBackOnCheck())
    producer.startup()
    committed, rolled_back = [], []
    try:
        for i in range(count):
            tx = producer.begin_transaction()
            msg = Message()
            msg.topic = topic
            msg.body = f"tx-{i}".encode()
            receipt = producer.send(msg, tx)
            if i % 2 == 0:
                tx.commit()
                committed.append(receipt.message_id)
            else:
                tx.rollback()
                rolled_back.append(receipt.message_id)
    finally:
        producer.shutdown()
    received: list[str] = []
    try:
        end = time.monotonic() + DEADLINE_S
        quiet_until = None
        while time.monotonic() < end:
            if quiet_until is None and len(received) >= len(committed):
                quiet_until = time.monotonic() + QUIET_S
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            for m in consumer.receive(16, 30):
                consumer.ack(m)
                received.append(m.message_id)
    finally:
        consumer.shutdown()
    print(json.dumps({"committed": committed, "rolled_back": rolled_back, "received": received}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
