"""``rocketq timer stats|cancel`` and ``rocketq dlq list|resend``: delayed messages and dead
letters from the terminal.

``timer`` talks to a timer-wheel instance's ``TimerAdmin`` service (``--timer``, default
``$ROCKETQ_TIMER`` or 127.0.0.1:10931; the timer-wheel does not register with the nameservers,
so it is addressed directly). Several instances share the timer topic's queues: ``--timer
"a;b"`` shows each one's stats, and ``cancel`` asks each in turn until the one owning the timer
answers. A timer's handle is the delayed message's msgId, which ``rocketq produce`` prints.

``dlq`` reads and resends a consumer group's dead letters (``%DLQ%{group}``, which consumers
cannot read) through the brokers' Admin service, like the other admin commands (``-n``).

| command                          | what                                                   |
|----------------------------------|--------------------------------------------------------|
| timer stats                      | pending, scheduled, delivered, due/s, lateness, queues |
| timer cancel -t TOPIC HANDLE     | the delayed message HANDLE is never delivered          |
| dlq list GROUP                   | dead letters, oldest first, per broker (--offset/--max)|
| dlq resend GROUP ID... / --all   | each back to its original topic as a new message       |

Every command takes ``--json`` (``dataclasses.asdict`` of the SDK's results).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.table import Table

from rocketq.cli._admin_common import admin_for
from rocketq.cli._common import (
    body_preview,
    console,
    echo_json,
    fmt_time,
    json_option,
    namesrv_list,
    namesrv_option,
    run,
)
from rocketq.client.admin import Admin, DeadLetters, ResentDeadLetter
from rocketq.client.errors import BrokerUnavailableError, NotFoundError, RocketQError
from rocketq.client.timer import CancelledTimer, TimerClient, TimerStats
from rocketq.codec import Prop
from rocketq.message import ReceivedMessage

TIMER_ENV = "ROCKETQ_TIMER"
DEFAULT_TIMER = "127.0.0.1:10931"
#: Dead letters one `dlq resend --all` resends at most (it pages through the DLQ).
RESEND_ALL_MAX = 100_000
_PAGE_MAX = 256


def _timer_option(f: Any) -> Any:
    return click.option(
        "--timer",
        "timer_addrs",
        envvar=TIMER_ENV,
        default=DEFAULT_TIMER,
        show_default=True,
        show_envvar=True,
        help="Timer-wheel address host:port; several separated by ';'.",
    )(f)


# ---- timer ------------------------------------------------------------------------------------
@click.group()
def timer() -> None:
    """The timer-wheel service: delayed messages (delay levels, delivery times, retries)."""


@timer.command("stats")
@_timer_option
@json_option
def timer_stats(timer_addrs: str, as_json: bool) -> None:
    """Pending timers, throughput, lateness percentiles and per-queue progress."""
    addrs = namesrv_list(timer_addrs)

    async def fetch() -> list[TimerStats]:
        out = []
        for addr in addrs:
            async with TimerClient(addr) as client:
                out.append(await client.stats())
        return out

    all_stats = run(fetch())
    if as_json:
        rows = [{"addr": a} | dataclasses.asdict(s) for a, s in zip(addrs, all_stats, strict=True)]
        echo_json(rows[0] if len(rows) == 1 else rows)
        return
    out = console()
    for addr, s in zip(addrs, all_stats, strict=True):
        out.print(_stats_table(addr, s))
        if s.queues:
            out.print(_queues_table(s))


def _stats_table(addr: str, s: TimerStats) -> Table:
    table = Table(title=f"timer-wheel {addr}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    rows = [
        ("pending timers", str(s.pending_timers)),
        ("scheduled (since start)", str(s.scheduled_total)),
        ("delivered (since start)", str(s.delivered_total)),
        ("cancelled (since start)", str(s.cancelled_total)),
        ("overdue on arrival", str(s.overdue_on_arrival_total)),
        ("due per second (10 s)", f"{s.due_per_second:.1f}"),
        ("lateness p50 / p99 / max", f"{s.lateness_p50_ms} / {s.lateness_p99_ms} / "
         f"{s.lateness_max_ms} ms"),
        ("next delivery", fmt_time(s.next_delivery_timestamp_ms)),
        ("wheel hand", fmt_time(s.wheel_current_time_ms)),
        ("dequeue behind", f"{s.dequeue_behind_ms} ms"),
        ("enqueue behind", f"{s.enqueue_behind_ms} ms"),
        ("wheel", f"{s.wheel_slots_total} slots x {s.slot_precision_ms} ms"),
        ("timer log", f"{s.timer_log_bytes / (1024 * 1024):.1f} MiB"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table


def _queues_table(s: TimerStats) -> Table:
    table = Table(title="timer topic queues", title_justify="left")
    for col in ("broker", "queue", "read", "committed", "max", "lag"):
        table.add_column(col, justify="left" if col == "broker" else "right")
    for q in s.queues:
        table.add_row(
            q.broker_name,
            str(q.queue_id),
            str(q.read_offset),
            str(q.committed_offset),
            str(q.max_offset),
            str(q.lag),
        )
    return table


@timer.command("cancel")
@click.argument("handle")
@click.option("-t", "--topic", "topic_name", required=True, help="Real topic of the message.")
@_timer_option
@json_option
def timer_cancel(handle: str, topic_name: str, timer_addrs: str, as_json: bool) -> None:
    """Cancel the delayed message HANDLE (its msgId, as `rocketq produce` printed it)."""
    addrs = namesrv_list(timer_addrs)

    async def go() -> tuple[str, CancelledTimer]:
        last: RocketQError | None = None
        for addr in addrs:
            async with TimerClient(addr) as client:
                try:
                    return addr, await client.cancel(topic_name, handle)
                except (NotFoundError, BrokerUnavailableError) as exc:
                    # Another instance may own the timer's queue; ask it before giving up.
                    last = exc
        assert last is not None
        raise last

    addr, cancelled = run(go())
    if as_json:
        echo_json({"addr": addr} | dataclasses.asdict(cancelled))
        return
    click.echo(
        f"cancelled {cancelled.handle} of {cancelled.topic} (was due "
        f"{fmt_time(cancelled.delivery_timestamp_ms)}) on {addr}"
    )


# ---- dlq --------------------------------------------------------------------------------------
@click.group()
def dlq() -> None:
    """Dead letters: messages a consumer group failed too often (%DLQ%{group})."""


def _dead_letters_table(letters: DeadLetters) -> Table:
    table = Table(title=f"dead letters of {letters.group}", title_justify="left")
    for col in ("broker", "dlq offset", "offset msg id", "original topic", "origin msg id"):
        table.add_column(col, overflow="fold")
    for col in ("retries", "stored", "tags", "keys", "body"):
        table.add_column(col, overflow="fold")
    for m in letters.messages:
        table.add_row(*_dead_letter_row(m))
    return table


def _dead_letter_row(m: ReceivedMessage) -> list[str]:
    return [
        m.broker_name,
        str(m.queue_offset),
        m.offset_msg_id,
        m.properties.get(Prop.RETRY_TOPIC, ""),
        m.properties.get(Prop.ORIGIN_MESSAGE_ID, m.msg_id),
        str(m.reconsume_times),
        fmt_time(m.store_timestamp_ms),
        m.tags,
        " ".join(m.keys),
        body_preview(m.body),
    ]


@dlq.command("list")
@click.argument("group_name")
@click.option("-b", "--broker", help="Only this broker (page with --offset).")
@click.option("--offset", type=click.IntRange(min=0), help="DLQ offset to start from.")
@click.option("--max", "max_num", type=click.IntRange(1, _PAGE_MAX), default=32, show_default=True)
@namesrv_option
@json_option
def dlq_list(
    group_name: str,
    broker: str | None,
    offset: int | None,
    max_num: int,
    namesrv: str,
    as_json: bool,
) -> None:
    """Show GROUP_NAME's dead letters, oldest first, from every master (or one broker)."""

    async def go() -> DeadLetters:
        async with admin_for(namesrv) as admin:
            return await admin.dead_letters(group_name, broker, offset, max_num)

    letters = run(go())
    if as_json:
        echo_json(letters)
        return
    out = console()
    out.print(_dead_letters_table(letters))
    for page in letters.pages:
        out.print(
            f"{page.broker_name}: {page.total} dead letter(s) stored, "
            f"{len(page.messages)} shown, next offset {page.next_offset}"
        )
    for name, error in letters.errors.items():
        click.echo(f"{name}: {error}", err=True)


@dlq.command("resend")
@click.argument("group_name")
@click.argument("offset_msg_ids", nargs=-1)
@click.option("--all", "resend_all", is_flag=True, help="Resend every stored dead letter.")
@click.option("-b", "--broker", help="With --all: only this broker's dead letters.")
@namesrv_option
@json_option
def dlq_resend(
    group_name: str,
    offset_msg_ids: tuple[str, ...],
    resend_all: bool,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Send dead letters of GROUP_NAME (by offset msg id, as `dlq list` shows) back to their
    original topics as new messages; they stay in the DLQ."""
    if bool(offset_msg_ids) == resend_all:
        raise click.UsageError("give dead letters' offset msg ids, or --all")
    if broker and not resend_all:
        raise click.UsageError("--broker only goes with --all (an id names its broker)")

    async def go() -> list[ResentDeadLetter]:
        async with Admin(namesrv_list(namesrv)) as admin:
            ids = list(offset_msg_ids)
            if resend_all:
                ids = await _all_dead_letter_ids(admin, group_name, broker)
            return [await admin.resend_dead_letter(group_name, i) for i in ids]

    resent = run(go())
    if as_json:
        echo_json(resent)
        return
    for r in resent:
        click.echo(
            f"resent to {r.topic}  msgId={r.msg_id}  "
            f"queue={r.broker_name}#{r.queue_id}  offset={r.queue_offset}"
        )
    click.echo(f"resent {len(resent)} dead letter(s) of {group_name}")


async def _all_dead_letter_ids(admin: Admin, group: str, broker: str | None) -> list[str]:
    """Offset msg ids of every dead letter stored now, paging each broker to its end."""
    first = await admin.dead_letters(group, broker, None, _PAGE_MAX)
    ids: list[str] = []
    for page in first.pages:
        current, seen_offset = page, -1
        # Stop at an empty page, or if a broker's next offset fails to move forward.
        while current.messages and current.next_offset > seen_offset:
            ids += [m.offset_msg_id for m in current.messages]
            if len(ids) >= RESEND_ALL_MAX:
                break
            seen_offset = current.next_offset
            nxt = await admin.dead_letters(group, page.broker_name, seen_offset, _PAGE_MAX)
            current = nxt.pages[0]
    return ids[:RESEND_ALL_MAX]


TIMER_COMMANDS = (timer, dlq)
