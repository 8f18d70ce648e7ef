"""The official-SDK half of tools/bench/pop_bench.py, run by .venv-rmq5's Python (never imported).

    python _v2_sdk_bench_app.py ENDPOINT TOPIC GROUP COUNT

Sends COUNT 1 KiB messages with sync sends, then drains them with a SimpleConsumer
(receive(32) + ack); prints one JSON object with the counts, durations and receive latencies.
"""

from __future__ import annotations

import json
import statistics
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

DEADLINE_S = 300


def main(endpoint: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoint, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()  # before sending: a new group starts at the end of the queues
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        t0 = time.perf_counter()
        for _ in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = b"x" * 1024
            producer.send(msg)
        send_s = time.perf_counter() - t0
    finally:
        producer.shutdown()
    latencies: list[float] = []
    received = 0
    try:
        t0 = time.perf_counter()
        end = time.monotonic() + DEADLINE_S
        while received < count and time.monotonic() < end:
            r0 = time.perf_counter()
            got = consumer.receive(32, 30)
            latencies.append((time.perf_counter() - r0) * 1000)
            for m in got:
                consumer.ack(m)
            received += len(got)
        receive_s = time.perf_counter() - t0
    finally:
        consumer.shutdown()
    lat = sorted(latencies) or [0.0]
    print(
        json.dumps(
            {
                "sent": count,
                "send_s": send_s,
                "received": received,
                "receive_s": receive_s,
                "p50_ms": statistics.median(lat),
                "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
