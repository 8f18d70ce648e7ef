"""A transactional producer process, for tests that kill a producer and start another instance
of its group.

    python -m tests.integration.workers.transaction_worker --namesrv HOST:PORT --group G \\
        --topic T --prefix P --plan commit,unknown,hang --check-answer commit \\
        [--answer-file F] --events FILE --ready-file F

Runs one :class:`rocketq.TransactionProducer` of group G and sends one transactional message
per ``--plan`` entry, in order, with body ``P-<i>``; entry i is what its local transaction
does:

| plan entry | execute_local_transaction                                              |
|------------|------------------------------------------------------------------------|
| commit     | COMMIT_MESSAGE                                                         |
| rollback   | ROLLBACK_MESSAGE                                                       |
| unknown    | UNKNOW (the broker will check back)                                    |
| hang       | notes a ``half`` event, then never returns: the half message is stored |
|            | and the process never ends the transaction (kill it)                   |

Every check-back is answered with ``--check-answer`` (commit, rollback or unknown), or with the
word in ``--answer-file`` when that file exists (read at each check, so a test can change the
answer while the process runs).

``--events`` gets one JSON line per event, each line one ``os.write`` on an ``O_APPEND``
descriptor (a SIGKILL loses nothing already written): ``{"ev": "half" | "sent" | "check" |
"error", "body", "pid", ...}``; ``sent`` has the transaction id and local state, ``check`` the
message id and the answer given. Once the producer has started, the ready file gets
``{"addr": "", "pid", "client_id"}``; SIGTERM or SIGINT closes the producer and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rocketq import LocalTransactionState, TransactionProducer
from rocketq.client.producer import ProducerConfig
from rocketq.message import Message, ReceivedMessage

log = logging.getLogger("transaction_worker")

ANSWERS = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}
PLAN_ENTRIES = (*ANSWERS, "hang")
CLIENT_IP = "127.0.0.1"


class Events:
    """Appends JSON lines to a file, one write each (thread-safe by O_APPEND)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ev: str, **fields: object) -> None:
        line = json.dumps({"ev": ev, "pid": os.getpid(), "t": time.time(), **fields}) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


class WorkerListener:
    """Plays ``plans`` (body -> plan entry) and answers checks from argv or the answer file."""

    def __init__(
        self, plans: dict[str, str], answer: str, answer_file: Path | None, events: Events
    ) -> None:
        self.plans = plans
        self.answer = answer
        self.answer_file = answer_file
        self.events = events
        self._never = threading.Event()

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        body = message.body.decode()
        entry = self.plans.get(body, "unknown")
        if entry == "hang":
            self.events.write("half", body=body)
            self._never.wait()  # the transaction is never ended by this process
        return ANSWERS[entry if entry != "hang" else "unknown"]

    def current_answer(self) -> str:
        if self.answer_file is not None:
            try:
                word = self.answer_file.read_text().strip()
            except OSError:
                word = ""
            if word in ANSWERS:
                return word
        return self.answer

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        word = self.current_answer()
        self.events.write("check", body=message.body.decode(), msg_id=message.msg_id, answer=word)
        return ANSWERS[word]


def write_json_atomically(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    events = Events(Path(args.events))
    plan = [p for p in args.plan.split(",") if p]
    bodies = [f"{args.prefix}-{i}" for i in range(len(plan))]
    listener = WorkerListener(
        dict(zip(bodies, plan, strict=True)),
        args.check_answer,
        Path(args.answer_file) if args.answer_file else None,
        events,
    )
    config = ProducerConfig(
        args.group, args.namesrv, client_ip=CLIENT_IP, instance_name=f"txw{os.getpid()}"
    )
    producer = TransactionProducer(config, listener)
    await producer.start()
    client_id = getattr(producer, "client_id", "")
    write_json_atomically(
        Path(args.ready_file), {"addr": "", "pid": os.getpid(), "client_id": client_id}
    )
    try:
        for body in bodies:
            try:
                result = await producer.send_message_in_transaction(
                    Message(args.topic, body.encode())
                )
            except Exception as exc:
                events.write("error", body=body, error=repr(exc))
                log.exception("send of %s failed", body)
                continue
            events.write(
                "sent",
                body=body,
                tid=str(result.transaction_id),
                state=result.local_state.name,
            )
        events.write("done")
        await stop.wait()
    finally:
        await producer.close()
        events.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--namesrv", required=True, help="nameserver host:port (';' separates more)")
    p.add_argument("--group", required=True, help="producer group")
    p.add_argument("--topic", required=True)
    p.add_argument("--prefix", default="tx", help="bodies are PREFIX-<i>")
    p.add_argument("--plan", default="", help=f"comma-separated, each one of {PLAN_ENTRIES}")
    p.add_argument("--check-answer", choices=tuple(ANSWERS), default="unknown")
    p.add_argument("--answer-file", help="if it holds commit/rollback/unknown, that answers")
    p.add_argument("--events", required=True, help="append JSON event lines here")
    p.add_argument("--ready-file", required=True)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    bad = [e for e in args.plan.split(",") if e and e not in PLAN_ENTRIES]
    if bad:
        p.error(f"unknown plan entries {bad}; use {PLAN_ENTRIES}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
