"""``rocketq produce`` and ``rocketq consume``: messages from and to the terminal.

``produce TOPIC`` sends ``--body`` (``--count`` times) or every non-empty line of stdin, with
the SDK :class:`~rocketq.client.producer.Producer` (sync sends, retried on another broker), and
prints where each message was stored; past ``PRINT_EACH_MAX`` messages it shows a progress bar
and a total instead. ``--sharding-key K`` sends in order (SPEC §5.4): every message goes to the
queue Java's SelectMessageQueueByHash picks for K, one send at a time, never retried elsewhere.
``--delay-level N`` / ``--deliver-at-ms T`` / ``--delay-ms D`` delay the messages through the
timer-wheel (SPEC §8); each printed msgId is that timer's handle for ``rocketq timer cancel``.
``--transaction commit|rollback|unknown`` sends each message in a transaction (SPEC §9; see
:mod:`rocketq.cli.transaction_cmd`).

``consume TOPIC`` prints messages as they arrive, with the SDK
:class:`~rocketq.client.consumer.LitePullConsumer`:

- without ``--group`` it reads every queue directly (assign mode) from ``--from first|last``
  or a time, and commits nothing, so it never disturbs a real group (like mqadmin's
  consumeMessage); ``--tag`` is applied here, on the client;
- with ``--group`` it joins that group (subscribe mode: queues shared by rebalance, the
  group's stored offsets win over ``--from``, ``--tag`` filtered by the broker) and commits
  what it printed;
- ``--sql EXPR`` filters by a SQL92 expression over properties instead of tags (SPEC §6.17):
  with ``--group`` the broker evaluates it (it needs ``enablePropertyFilter=true``), without
  it the CLI does, with the same :mod:`rocketq.sql92` semantics; a syntax error is refused
  before anything connects;
- ``--orderly`` (needs ``--group``) consumes as an orderly push consumer (SPEC §6.15): the
  group's queues are locked on the broker and each queue's messages are printed one at a time
  in queue order; the printed ones are committed.

It stops after ``--count`` messages, after ``--timeout`` seconds without a message, or on
Ctrl-C. :func:`demo_round_trip` is the check ``rocketq dev up`` runs before it says "running".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

import click
from rich.console import Console
from rich.progress import Progress

from rocketq.cli._common import (
    body_preview,
    fmt_time,
    namesrv_list,
    namesrv_option,
    parse_time_ms,
    run,
    to_json,
)
from rocketq.cli.transaction_cmd import (
    CLI_TX_PRODUCER_GROUP,
    DECISIONS,
    check_transaction_options,
    produce_in_transaction,
)
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeResult,
    ExpressionType,
    LitePullConsumer,
    LitePullConsumerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.client.consumer.config import format_consume_timestamp
from rocketq.client.errors import RocketQError, TopicNotFoundError
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import DELAY_LEVEL_MAX, Message, ReceivedMessage, SendResult

PRINT_EACH_MAX = 20
"""Up to this many sends print one line each; more show a progress bar."""
SEND_WINDOW_MAX = 32
"""Sends in flight at once when producing many messages."""
CLI_PRODUCER_GROUP = "rocketq-cli-producer"
CLI_CONSUMER_GROUP = "rocketq-cli"
POLL_TIMEOUT_MS = 500
ROUTE_WAIT_S = 10.0
DEMO_TIMEOUT_S = 30.0


# ---- produce ----------------------------------------------------------------------------------
def _bodies(body: str | None, count: int | None) -> Iterable[bytes]:
    if body is not None:
        for _ in range(count or 1):
            yield body.encode()
        return
    if sys.stdin.isatty():
        raise click.UsageError("give --body TEXT, or pipe lines on stdin (one message each)")
    sent = 0
    for line in sys.stdin:
        text = line.rstrip("\n")
        if not text:
            continue  # an empty body is not a message
        yield text.encode()
        sent += 1
        if count is not None and sent >= count:
            return


def _parse_properties(items: tuple[str, ...]) -> dict[str, str]:
    props = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--property")
        props[key] = value
    return props


def _result_line(r: SendResult) -> str:
    mq = r.message_queue
    return (
        f"{r.status.value}  msgId={r.msg_id}  offsetMsgId={r.offset_msg_id}  "
        f"queue={mq.broker_name}#{mq.queue_id}  offset={r.queue_offset}"
    )


@click.command()
@click.argument("topic")
@click.option("--body", help="Message body; without it, each line of stdin is a message.")
@click.option("-c", "--count", type=click.IntRange(min=1), help="Send --body this many times.")
@click.option("-t", "--tag", default="", help="Tag consumers can filter on.")
@click.option("-k", "--key", "keys", multiple=True, help="Business key (repeatable).")
@click.option("-p", "--property", "properties", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--sharding-key",
    help="Ordered send: every message to the queue this key hashes to, one at a time.",
)
@click.option(
    "--delay-level",
    type=click.IntRange(1, DELAY_LEVEL_MAX),
    help="Deliver after delay level N of the broker's messageDelayLevel (1s 5s ... 2h: 1..18).",
)
@click.option(
    "--deliver-at-ms",
    "deliver_at",
    metavar="TIME",
    help="Deliver at this time: ms since the epoch or an ISO date-time (local time).",
)
@click.option(
    "--delay-ms", type=click.IntRange(min=1), help="Deliver this many ms after it is stored."
)
@click.option(
    "--transaction",
    type=click.Choice(DECISIONS),
    help="Send each message in a transaction and end it so (unknown: the broker asks back).",
)
@click.option(
    "--check-answer",
    type=click.Choice(DECISIONS),
    default="commit",
    show_default=True,
    help="With --transaction: the answer to the broker's check-backs.",
)
@click.option(
    "--wait-s",
    type=click.FloatRange(min=0),
    default=0.0,
    help="With --transaction unknown: answer check-backs this long (less once all resolved).",
)
@click.option(
    "-g",
    "--group",
    default=CLI_PRODUCER_GROUP,
    show_default=True,
    help=f"Producer group ({CLI_TX_PRODUCER_GROUP} with --transaction unless given).",
)
@namesrv_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per sent message.")
def produce(
    topic: str,
    body: str | None,
    count: int | None,
    tag: str,
    keys: tuple[str, ...],
    properties: tuple[str, ...],
    sharding_key: str | None,
    delay_level: int | None,
    deliver_at: str | None,
    delay_ms: int | None,
    transaction: str | None,
    check_answer: str,
    wait_s: float,
    group: str,
    namesrv: str,
    as_json: bool,
) -> None:
    """Send messages to TOPIC and print where each was stored.

    With --delay-level, --deliver-at-ms or --delay-ms the messages are delayed (the timer-wheel
    delivers them); the printed msgId is the handle `rocketq timer cancel` takes. With
    --transaction each is a transactional message (SPEC §9): stored as a half message, then
    committed, rolled back or left unknown for the broker's check-back.
    """
    props = _parse_properties(properties)
    level, deliver_ms, delay_after_ms = _delay(delay_level, deliver_at, delay_ms)
    delayed = bool(level or deliver_ms or delay_after_ms)
    check_transaction_options(
        transaction, wait_s, ordered=sharding_key is not None, delayed=delayed
    )
    if transaction is not None and group == CLI_PRODUCER_GROUP:
        group = CLI_TX_PRODUCER_GROUP  # a transactional group is never shared (SPEC §9)
    template = _Template(topic, tag, keys, props, level, deliver_ms, delay_after_ms)
    bodies = _bodies(body, count)
    config = ProducerConfig(group, namesrv_list(namesrv))
    many = body is not None and (count or 1) > PRINT_EACH_MAX
    if transaction is not None:
        tx = produce_in_transaction(
            config,
            (template.message(data) for data in bodies),
            decision=transaction,
            check_answer=check_answer,
            wait_s=wait_s,
            as_json=as_json,
        )
        ok, failed = run(tx)
    else:
        # Concurrent sends may be stored in any order; an ordered send waits for each one.
        window_max = 1 if sharding_key is not None or not many else SEND_WINDOW_MAX
        window = _SendWindow(as_json=as_json, print_each=not many)
        ok, failed = run(
            _send_all(config, template, bodies, window, window_max, sharding_key, count or 0)
        )
    if many or failed:
        click.echo(f"sent {ok} message(s) to {topic}" + (f", {failed} failed" if failed else ""))
    if failed or ok == 0:
        sys.exit(1)


@dataclasses.dataclass(frozen=True)
class _Template:
    """What every message of one ``produce`` run shares (0 = no delay of that kind)."""

    topic: str
    tag: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    delay_level: int = 0
    deliver_time_ms: int = 0
    delay_ms: int = 0

    def message(self, data: bytes) -> Message:
        return Message(
            self.topic,
            data,
            tags=self.tag,
            keys=list(self.keys),
            properties=self.properties,
            delay_level=self.delay_level,
            deliver_time_ms=self.deliver_time_ms,
            delay_ms=self.delay_ms,
        )


class _SendWindow:
    """Sends in flight; ``drain`` awaits them all, counts and prints their outcomes in the
    order they were sent."""

    def __init__(self, *, as_json: bool, print_each: bool) -> None:
        self.as_json = as_json
        self.print_each = print_each
        self.ok = 0
        self.failed = 0
        self.pending: list[asyncio.Future[SendResult]] = []

    def add(self, send: Awaitable[SendResult]) -> None:
        self.pending.append(asyncio.ensure_future(send))

    async def drain(self) -> int:
        """Await every pending send; how many there were."""
        for outcome in await asyncio.gather(*self.pending, return_exceptions=True):
            if isinstance(outcome, SendResult):
                self.ok += 1
                if self.as_json:
                    click.echo(json.dumps(json.loads(to_json(outcome))))
                elif self.print_each:
                    click.echo(_result_line(outcome))
            elif isinstance(outcome, RocketQError) and not outcome.retriable:
                raise outcome  # bad input: every other send would fail alike
            else:
                self.failed += 1
                click.echo(f"send failed: {outcome}", err=True)
        drained = len(self.pending)
        self.pending.clear()
        return drained


async def _send_all(
    config: ProducerConfig,
    template: _Template,
    bodies: Iterable[bytes],
    window: _SendWindow,
    window_max: int,
    sharding_key: str | None,
    total: int,
) -> tuple[int, int]:
    """Send every body with up to ``window_max`` sends in flight; (sent, failed)."""
    async with Producer(config) as producer:
        show_bar = not window.print_each and not window.as_json
        with _progress(show_bar, total) as advance:
            for data in bodies:
                window.add(producer.send(template.message(data), sharding_key=sharding_key))
                if len(window.pending) >= window_max:
                    advance(await window.drain())
            advance(await window.drain())
    return window.ok, window.failed


def _delay(level: int | None, deliver_at: str | None, delay_ms: int | None) -> tuple[int, int, int]:
    """(delay_level, deliver_time_ms, delay_ms) of --delay-level / --deliver-at-ms / --delay-ms
    (at most one given; 0 = not set)."""
    given = [n for n, v in (("--delay-level", level), ("--deliver-at-ms", deliver_at),
                            ("--delay-ms", delay_ms)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise click.UsageError(f"give one of {' / '.join(given)}, not several")
    at_ms = 0
    if deliver_at is not None:
        at_ms = parse_time_ms(deliver_at)
        if at_ms <= 0:
            raise click.BadParameter(
                f"{deliver_at!r} is not a delivery time", param_hint="--deliver-at-ms"
            )
    return level or 0, at_ms, delay_ms or 0


@contextlib.contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on a terminal (stderr); ``advance(n)`` does nothing otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n: None
        return
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("sending", total=total)
        yield lambda n: progress.advance(task, n)


# ---- consume ----------------------------------------------------------------------------------
def _start_position(start: str) -> tuple[ConsumeFromWhere, str]:
    """--from first|last|TIME -> where a queue without a stored offset starts."""
    if start == "first":
        return ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, ""
    if start == "last":
        return ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, ""
    stamp = format_consume_timestamp(parse_time_ms(start))
    return ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, stamp


def _tag_filter(expression: str) -> Callable[[ReceivedMessage], bool]:
    tags = {t.strip() for t in expression.split("||") if t.strip()}
    if not tags or "*" in tags:
        return lambda m: True
    return lambda m: m.tags in tags


def _subscription(tag: str, sql: str | None) -> tuple[str, ExpressionType]:
    """The expression and its type from --tag / --sql; a bad SQL92 expression is a usage
    error here, before anything connects."""
    if sql is None:
        return tag or "*", ExpressionType.TAG
    if tag:
        raise click.UsageError("give --tag or --sql, not both")
    from rocketq.sql92 import Sql92Error, compile_sql92  # lark only when --sql is used

    try:
        compile_sql92(sql)
    except Sql92Error as exc:
        raise click.BadParameter(str(exc), param_hint="--sql") from None
    return sql, ExpressionType.SQL92


def _local_filter(expression: str, kind: ExpressionType) -> Callable[[ReceivedMessage], bool]:
    """The filter a read-only consumer (no --group, every queue assigned) applies itself."""
    if kind is ExpressionType.SQL92:
        from rocketq.sql92 import compile_sql92

        sql = compile_sql92(expression)
        return lambda m: sql.matches(m.properties)
    return _tag_filter(expression)


def _message_line(m: ReceivedMessage, show_properties: bool) -> str:
    head = (
        f"[{m.broker_name}#{m.queue_id} @{m.queue_offset}] {fmt_time(m.store_timestamp_ms)}"
        f"  msgId={m.msg_id}"
    )
    if m.tags:
        head += f"  tags={m.tags}"
    if m.keys:
        head += f"  keys={' '.join(m.keys)}"
    if show_properties:
        head += f"  properties={json.dumps(m.properties, sort_keys=True)}"
    return f"{head}\n  {body_preview(m.body, 2000)}"


def _print_message(m: ReceivedMessage, show_properties: bool, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(json.loads(to_json(m))))
    else:
        click.echo(_message_line(m, show_properties))


async def _open_consumer(
    topic: str,
    group: str | None,
    start: str,
    subscription: tuple[str, ExpressionType],
    namesrv: str,
) -> LitePullConsumer:
    where, stamp = _start_position(start)
    config = LitePullConsumerConfig(
        consumer_group=group or CLI_CONSUMER_GROUP,
        namesrv_addrs=tuple(namesrv_list(namesrv)),
        consume_from_where=where,
        auto_commit=group is not None,
    )
    if stamp:
        config = dataclasses.replace(config, consume_timestamp=stamp)
    consumer = LitePullConsumer(config)
    if group is not None:
        consumer.subscribe(topic, *subscription)
        await consumer.start()
        return consumer
    await consumer.start()
    try:
        queues = await consumer.fetch_message_queues(topic)
        consumer.assign(queues)
        if start in ("first", "last"):
            # Exact positions whatever the CLI group may have stored: it never commits.
            seek = consumer.seek_to_begin if start == "first" else consumer.seek_to_end
            await asyncio.gather(*(seek(mq) for mq in queues))
    except BaseException:
        await consumer.close()
        raise
    return consumer


@dataclasses.dataclass(frozen=True)
class _ConsumeArgs:
    topic: str
    group: str | None
    start: str
    count: int | None
    subscription: tuple[str, ExpressionType]
    timeout_s: float | None
    show_properties: bool
    namesrv: str
    as_json: bool


async def _consume_polling(a: _ConsumeArgs) -> int:
    """Read with a lite pull consumer; returns how many messages were printed."""
    keep = _local_filter(*a.subscription) if a.group is None else (lambda m: True)
    printed = 0
    consumer = await _open_consumer(a.topic, a.group, a.start, a.subscription, a.namesrv)
    try:
        idle_since = time.monotonic()
        while a.count is None or printed < a.count:
            batch = [m for m in await consumer.poll(POLL_TIMEOUT_MS) if keep(m)]
            if not batch:
                if a.timeout_s is not None and time.monotonic() - idle_since >= a.timeout_s:
                    break
                continue
            idle_since = time.monotonic()
            for m in batch[: None if a.count is None else a.count - printed]:
                _print_message(m, a.show_properties, a.as_json)
                printed += 1
    finally:
        await consumer.close()
    return printed


async def _consume_orderly(a: _ConsumeArgs) -> int:
    """Consume as an orderly push consumer of ``a.group``: one message per listener call, each
    queue in order; messages past --count are left unconsumed (suspended, not committed)."""
    assert a.group is not None
    where, stamp = _start_position(a.start)
    config = PushConsumerConfig(a.group, tuple(namesrv_list(a.namesrv)), consume_from_where=where)
    if stamp:
        config = dataclasses.replace(config, consume_timestamp=stamp)
    printed = 0
    last_message = time.monotonic()
    enough = asyncio.Event()

    async def listener(
        msgs: list[ReceivedMessage], ctx: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        nonlocal printed, last_message
        if a.count is not None and printed + len(msgs) > a.count:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        for m in msgs:
            _print_message(m, a.show_properties, a.as_json)
        printed += len(msgs)
        last_message = time.monotonic()
        if a.count is not None and printed >= a.count:
            enough.set()
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(config, listener, orderly=True)
    consumer.subscribe(a.topic, *a.subscription)
    async with consumer:
        while not enough.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), POLL_TIMEOUT_MS / 1000)
            if a.timeout_s is not None and time.monotonic() - last_message >= a.timeout_s:
                break
    return printed


@click.command()
@click.argument("topic")
@click.option("-g", "--group", help="Join this consumer group and commit (default: read only).")
@click.option(
    "--from",
    "start",
    default="last",
    show_default=True,
    help="first, last, or a time (ms, ISO date); with --group only for queues it never read.",
)
@click.option("-c", "--count", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("-t", "--tag", default="", help="Tag expression, e.g. 'TagA || TagB'.")
@click.option("--sql", help="SQL92 filter over properties, e.g. \"a > 5 AND s = 'x'\".")
@click.option(
    "--orderly", is_flag=True, help="Orderly consumer (needs --group): each queue in order."
)
@click.option("--timeout", type=float, help="Stop after this many seconds without a message.")
@click.option("--properties", "show_properties", is_flag=True, help="Print every property.")
@namesrv_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
def consume(
    topic: str,
    group: str | None,
    start: str,
    count: int | None,
    tag: str,
    sql: str | None,
    orderly: bool,
    timeout: float | None,
    show_properties: bool,
    namesrv: str,
    as_json: bool,
) -> None:
    """Print messages of TOPIC as they arrive (Ctrl-C to stop)."""
    if orderly and group is None:
        raise click.UsageError(
            "--orderly needs --group: an orderly consumer locks the group's queues on the "
            "broker and commits what it printed"
        )
    args = _ConsumeArgs(
        topic,
        group,
        start,
        count,
        _subscription(tag, sql),
        timeout,
        show_properties,
        namesrv,
        as_json,
    )
    printed = run(_consume_orderly(args) if orderly else _consume_polling(args))
    if not as_json:
        click.echo(f"{printed} message(s)", err=True)
    if count is not None and printed < count:
        sys.exit(1)


# ---- the dev up demo --------------------------------------------------------------------------
async def _wait_for_route(admin: Admin, topic: str) -> None:
    deadline = time.monotonic() + ROUTE_WAIT_S
    while True:
        try:
            await admin.route(topic)
            return
        except TopicNotFoundError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def demo_round_trip(namesrv: str, topic: str, group: str, n: int) -> str:
    """Create ``topic`` (if new), send ``n`` messages, receive them with a push consumer of
    ``group``; returns a one-line report. Raises if they do not come back in time."""
    started = time.monotonic()
    async with Admin([namesrv]) as admin:
        results = await admin.create_topic(TopicConfig(topic, 4, 4))
        for r in results:
            if not r.ok and r.code != "ALREADY_EXISTS":
                raise RocketQError(f"creating {topic} on {r.broker_name}: {r.error_message}")
        await _wait_for_route(admin, topic)
    producer_config = ProducerConfig("demo-producer", [namesrv])
    async with Producer(producer_config) as producer:
        sent = {
            (await producer.send(Message(topic, f"hello #{i}".encode(), keys="demo"))).msg_id
            for i in range(n)
        }
    seen: set[str] = set()
    all_back = asyncio.Event()

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.update(m.msg_id for m in msgs)
        if sent <= seen:
            all_back.set()
        return ConsumeResult.CONSUME_SUCCESS

    consumer_config = PushConsumerConfig(
        group,
        (namesrv,),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer = PushConsumer(consumer_config, _on_loop(listener))
    consumer.subscribe(topic)
    async with consumer:
        try:
            await asyncio.wait_for(all_back.wait(), DEMO_TIMEOUT_S)
        except TimeoutError:
            raise RocketQError(
                f"demo: sent {n} messages to {topic} but received {len(sent & seen)} back "
                f"within {DEMO_TIMEOUT_S:.0f}s; see the broker log"
            ) from None
    took_s = time.monotonic() - started
    return (
        f"demo: topic {topic} ready, sent {n} messages, consumed {n} back "
        f"(group {group}) in {took_s:.1f} s"
    )


def _on_loop(
    listener: Callable[[list[ReceivedMessage], ConsumeContext], ConsumeResult],
) -> Callable[[list[ReceivedMessage], ConsumeContext], Awaitable[ConsumeResult]]:
    """Run a listener on the event loop (as a coroutine), so it may touch asyncio objects."""

    async def run_it(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return listener(msgs, ctx)

    return run_it


IO_COMMANDS = (produce, consume)
