"""An ordinary RocketMQ 5 producer sending a NORMAL and a FIFO message to each of two topics.

    python message_types.py ENDPOINT TOPIC...

For every topic, a message without a group and one with message group "g1". Prints one JSON
object: per topic, per kind ("normal", "fifo"), "sent" or the SDK's refusal.
"""

from __future__ import annotations

import json
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main(endpoint: str, topics: list[str]) -> None:
    producer = Producer(ClientConfiguration(endpoint, Credentials()), tuple(topics))
    producer.startup()
    out: dict[str, dict[str, str]] = {}
    try:
        for topic in topics:
            out[topic] = {}
            for kind, group in (("normal", ""), ("fifo", "g1")):
                msg = Message()
                msg.topic = topic
                msg.body = f"{kind} to {topic}".encode()
                if group:
                    msg.message_group = group
                try:
                    producer.send(msg)
                    out[topic][kind] = "sent"
                except Exception as exc:  # the SDK's refusal is the answer we report
                    out[topic][kind] = f"refused: {type(exc).__name__}: {exc}"
    finally:
        producer.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
