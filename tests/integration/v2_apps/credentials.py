"""An ordinary RocketMQ 5 application with credentials: send one message, receive it.

    python credentials.py ENDPOINT TOPIC GROUP ACCESS_KEY SECRET_KEY

Prints one JSON object: ``send`` and ``receive`` are "ok" or the error the SDK raised (its
exception class and text, which carries the protocol's status code); ``sdk_errors`` are the
errors the SDK logged (at start-up it logs a refused route query and raises a generic error), so
a test sees what an application and its log would show when its credentials are wrong or lack a
permission.
"""

from __future__ import annotations

import contextlib
import json
import logging
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

RECEIVE_DEADLINE_S = 20
SDK_ERRORS_MAX = 20


class Errors(logging.Handler):
    """The SDK's logged errors (its logger writes to ~/logs only)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < SDK_ERRORS_MAX:
            self.lines.append(
                record.getMessage() + (f" {record.exc_info[1]}" if record.exc_info else "")
            )


def error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def send(config: ClientConfiguration, topic: str) -> str:
    producer = Producer(config, (topic,))
    try:
        producer.startup()
        msg = Message()
        msg.topic = topic
        msg.body = b"signed"
        producer.send(msg)
        return "ok"
    except Exception as exc:  # what the application sees: the test reads it
        return error(exc)
    finally:
        with contextlib.suppress(Exception):
            producer.shutdown()


def receive(config: ClientConfiguration, topic: str, group: str) -> str:
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=5)
    try:
        consumer.startup()
        end = time.monotonic() + RECEIVE_DEADLINE_S
        while time.monotonic() < end:
            messages = consumer.receive(16, 15)
            for m in messages:
                consumer.ack(m)
            if messages:
                return "ok"
        return "nothing received"
    except Exception as exc:
        return error(exc)
    finally:
        with contextlib.suppress(Exception):
            consumer.shutdown()


def main(endpoint: str, topic: str, group: str, ak: str, sk: str) -> None:
    errors = Errors()
    logging.getLogger("rocketmq-python-client").addHandler(errors)
    config = ClientConfiguration(endpoint, Credentials(ak, sk))
    out: dict[str, object] = {"send": send(config, topic)}
    out["receive"] = receive(config, topic, group) if out["send"] == "ok" else "not tried"
    out["sdk_errors"] = errors.lines
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:6])
