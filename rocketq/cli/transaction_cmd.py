"""Transactional messages from the terminal (SPEC §9): ``rocketq transaction list`` and the
transactional mode of ``rocketq produce``.

| command                                   | what                                             |
|-------------------------------------------|--------------------------------------------------|
| produce TOPIC --transaction commit        | each message stored as a half message, then      |
|                                           | committed: consumers see it                      |
| produce TOPIC --transaction rollback      | ... then rolled back: consumers never see it     |
| produce TOPIC --transaction unknown       | ... then left UNKNOW: the broker asks back after |
|   [--check-answer commit|rollback|unknown]|   transactionTimeout; this process answers       |
|   [--wait-s S]                            |   --check-answer for up to S seconds (it stops   |
|                                           |   early once every message it sent is resolved)  |
| transaction list [TOPIC] [-b BROKER]      | half messages still waiting for a decision,      |
|                                           | oldest first: topic, id, group, checks, age      |

``produce --transaction`` uses the SDK's :class:`~rocketq.client.producer.TransactionProducer`
(one message at a time: each local transaction here is just the chosen answer). Check-backs go
to any live producer of the group, so while it waits this process also answers for messages an
earlier run of the same group left UNKNOW; each answer is reported on stderr.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable

import click
from rich.table import Table

from rocketq.cli._common import (
    body_preview,
    console,
    echo_json,
    fmt_time,
    json_option,
    namesrv_list,
    namesrv_option,
    run,
    to_json,
)
from rocketq.client.admin import Admin, HalfMessages
from rocketq.client.errors import RocketQError
from rocketq.client.producer import (
    LocalTransactionState,
    ProducerConfig,
    TransactionProducer,
    TransactionSendResult,
)
from rocketq.message import Message, ReceivedMessage

DECISIONS = ("commit", "rollback", "unknown")
#: Default group of `produce --transaction`: never the plain CLI producer's, because the broker
#: asks any live member of a transactional message's group about it (SPEC §9).
CLI_TX_PRODUCER_GROUP = "rocketq-cli-tx-producer"
_STATES = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}
#: How often the wait for check-backs looks whether everything sent is resolved.
_WAIT_POLL_S = 0.1


# ---- produce --transaction ---------------------------------------------------------------------
class CliListener:
    """Answers every local transaction with ``decision`` and every check-back with ``answer``,
    and keeps the ids this run left UNKNOW until a check resolves them."""

    def __init__(self, decision: str, answer: str) -> None:
        self.decision = _STATES[decision]
        self.answer = _STATES[answer]
        self._lock = threading.Lock()  # checks run on the producer's check thread
        self._unresolved: set[str] = set()

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return self.decision

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        click.echo(
            f"check-back: transaction {message.msg_id} of {message.topic} -> {self.answer.value}",
            err=True,
        )
        if self.answer is not LocalTransactionState.UNKNOW:
            with self._lock:
                self._unresolved.discard(message.msg_id)
        return self.answer

    def left_unknown(self, transaction_id: str) -> None:
        with self._lock:
            self._unresolved.add(transaction_id)

    @property
    def unresolved(self) -> int:
        with self._lock:
            return len(self._unresolved)


def check_transaction_options(transaction: str | None, wait_s: float, *, ordered: bool,
                              delayed: bool) -> None:  # fmt: skip
    """Usage errors of ``produce --transaction`` (raised before anything connects)."""
    if transaction is None:
        if wait_s:
            raise click.UsageError("--wait-s only goes with --transaction unknown")
        return
    if ordered:
        raise click.UsageError("--transaction cannot be combined with --sharding-key")
    if delayed:
        raise click.UsageError("a transactional message cannot be delayed (SPEC §9)")


def _result_line(r: TransactionSendResult) -> str:
    mq = r.message_queue
    return (
        f"{r.status.value}  msgId={r.msg_id}  transaction={r.local_state.value}  "
        f"queue={mq.broker_name}#{mq.queue_id}  halfOffset={r.queue_offset}"
    )


async def produce_in_transaction(
    config: ProducerConfig,
    messages: Iterable[Message],
    *,
    decision: str,
    check_answer: str,
    wait_s: float,
    as_json: bool,
) -> tuple[int, int]:
    """Send each message in its own transaction ended with ``decision``; then, for
    ``unknown``, answer check-backs for up to ``wait_s``. Returns (sent, failed)."""
    listener = CliListener(decision, check_answer)
    ok = failed = 0
    async with TransactionProducer(config, listener) as producer:
        for msg in messages:
            try:
                result = await producer.send_message_in_transaction(msg)
            except RocketQError as exc:
                if not exc.retriable:
                    raise  # bad input: every other send would fail alike
                failed += 1
                click.echo(f"send failed: {exc}", err=True)
                continue
            ok += 1
            if result.local_state is LocalTransactionState.UNKNOW:
                listener.left_unknown(result.transaction_id)
            click.echo(json.dumps(json.loads(to_json(result))) if as_json else _result_line(result))
        if decision == "unknown" and wait_s > 0:
            await _wait_for_checks(producer, listener, wait_s)
    return ok, failed


async def _wait_for_checks(
    producer: TransactionProducer, listener: CliListener, wait_s: float
) -> None:
    deadline = time.monotonic() + wait_s
    click.echo(
        f"waiting up to {wait_s:g}s for check-backs of {listener.unresolved} transaction(s)",
        err=True,
    )
    while time.monotonic() < deadline:
        if listener.unresolved == 0 and producer.checks.held == 0:
            click.echo("every transaction of this run is resolved", err=True)
            return
        await asyncio.sleep(_WAIT_POLL_S)
    click.echo(f"{listener.unresolved} transaction(s) still unresolved after {wait_s:g}s", err=True)


# ---- transaction list -------------------------------------------------------------------------
@click.group()
def transaction() -> None:
    """Transactional messages: half messages waiting for their producer's decision."""


def _age(now_ms: int, born_ms: int) -> str:
    seconds = max(now_ms - born_ms, 0) / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _half_table(pending: HalfMessages, now_ms: int) -> Table:
    table = Table(title="pending transactions", title_justify="left")
    for col in ("broker", "topic", "msg id", "group", "checks", "age", "born", "body"):
        table.add_column(col, overflow="fold")
    for h in pending.messages:
        table.add_row(
            h.broker_name,
            h.topic,
            h.transaction_id or h.message.msg_id,
            h.producer_group,
            str(h.check_times),
            _age(now_ms, h.born_timestamp_ms),
            fmt_time(h.born_timestamp_ms),
            body_preview(h.message.body, 40),
        )
    return table


@transaction.command("list")
@click.argument("topic", required=False, default="")
@click.option("-b", "--broker", help="Only this broker (name or host:port).")
@click.option("--max", "max_num", type=click.IntRange(1, 1000), default=100, show_default=True)
@namesrv_option
@json_option
def transaction_list(
    topic: str, broker: str | None, max_num: int, namesrv: str, as_json: bool
) -> None:
    """Half messages (of TOPIC, or every topic) still waiting for a commit or rollback."""

    async def go() -> HalfMessages:
        async with Admin(namesrv_list(namesrv)) as admin:
            return await admin.half_messages(topic, broker, max_num)

    pending = run(go())
    if as_json:
        echo_json(pending)
        return
    out = console()
    out.print(_half_table(pending, int(time.time() * 1000)))
    for name, total in pending.totals.items():
        out.print(f"{name}: {total} pending")
    for name, error in pending.errors.items():
        click.echo(f"{name}: {error}", err=True)


TRANSACTION_COMMANDS = (transaction,)
