"""``rocketq group|offset``: consumer groups (configs, members, progress and lag) and their
offsets, part of RocketQ's mqadmin (see :mod:`rocketq.cli.admin_cmd` for the conventions).

| command                             | mqadmin equivalent                        |
|-------------------------------------|-------------------------------------------|
| group list                          | consumerProgress (configs)                |
| group describe                      | consumerProgress, consumerConnection      |
| group create / delete               | updateSubGroup, deleteSubGroup            |
| offset reset                        | resetOffsetByTime                         |

Kept apart from ``admin_cmd.py`` (cluster and topics) because these commands are about the
consumer side: they read what consumers committed and which members are online, not how the
brokers and topics are laid out. ``admin_cmd.ADMIN_COMMANDS`` still registers them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.table import Table

from rocketq.cli._admin_common import admin_for, print_apply, target_options
from rocketq.cli._common import (
    console,
    echo_json,
    fmt_time,
    json_option,
    namesrv_option,
    parse_time_ms,
    run,
)
from rocketq.client.admin import (
    ApplyResult,
    ConsumerConnectionInfo,
    ConsumeStats,
    GroupConfig,
)
from rocketq.client.errors import NotFoundError


# ---- groups -----------------------------------------------------------------------------------
@click.group()
def group() -> None:
    """Consumer groups: configs, members, progress and lag."""


@group.command("list")
@click.option("-b", "--broker", help="Only this broker.")
@namesrv_option
@json_option
def group_list(broker: str | None, namesrv: str, as_json: bool) -> None:
    """Subscription groups known to the brokers."""

    async def fetch() -> dict[str, list[GroupConfig]]:
        async with admin_for(namesrv) as admin:
            return await admin.list_groups(broker)

    per_broker = run(fetch())
    merged: dict[str, tuple[GroupConfig, list[str]]] = {}
    for b, configs in sorted(per_broker.items()):
        for c in configs:
            merged.setdefault(c.group_name, (c, []))[1].append(b)
    if as_json:
        echo_json(
            [dataclasses.asdict(c) | {"brokers": bs} for _, (c, bs) in sorted(merged.items())]
        )
        return
    table = Table(title="groups", title_justify="left")
    for col in ("group", "brokers", "consume", "broadcast", "orderly", "retry max", "retry queues"):
        table.add_column(col)
    for name, (c, bs) in sorted(merged.items()):
        table.add_row(
            name,
            ", ".join(bs),
            "yes" if c.consume_enable else "no",
            "yes" if c.consume_broadcast_enable else "no",
            "yes" if c.consume_message_orderly else "no",
            str(c.retry_max_times),
            str(c.retry_queue_nums),
        )
    console().print(table)


@group.command("describe")
@click.argument("name")
@click.option("-t", "--topic", default="", help="Only this topic.")
@namesrv_option
@json_option
def group_describe(name: str, topic: str, namesrv: str, as_json: bool) -> None:
    """Group NAME: offset and lag on every queue, live members and their subscriptions, any
    subscription conflict among them, and orderly queue locks."""

    async def fetch() -> tuple[ConsumeStats, ConsumerConnectionInfo | None]:
        async with admin_for(namesrv) as admin:
            stats = await admin.consume_stats(name, topic)
            try:
                conn = await admin.consumer_connection(name)
            except NotFoundError:
                conn = None  # no member online: offsets and lag are still worth showing
            return stats, conn

    stats, conn = run(fetch())
    ids = [m.client_id for m in conn.members] if conn else []
    if as_json:
        echo_json(
            dataclasses.asdict(stats)
            | {"consumer_ids": ids, "connection": dataclasses.asdict(conn) if conn else None}
        )
        return
    out = console()
    table = Table(title=f"group {name}", title_justify="left")
    for col in ("topic", "broker", "queue", "broker offset", "consumer offset", "lag"):
        table.add_column(col)
    table.add_column("last consumed")
    for q in stats.queues:
        table.add_row(
            q.topic,
            q.broker_name,
            str(q.queue_id),
            str(q.broker_offset),
            str(q.consumer_offset),
            str(q.lag),
            fmt_time(q.last_consumed_timestamp_ms),
        )
    out.print(table)
    out.print(f"total lag: {stats.total_lag}")
    if not stats.queues:
        out.print("the group has no committed offsets yet")
    if conn is None:
        out.print("members (0): none online")
    else:
        _print_connection(conn)
    for broker, error in {**stats.errors, **(conn.errors if conn else {})}.items():
        click.echo(f"{broker}: {error}", err=True)


def _print_connection(conn: ConsumerConnectionInfo) -> None:
    """Members with their subscriptions, conflicts in red, and queue locks."""
    out = console()
    model = conn.message_model + (", orderly" if conn.consume_orderly else "")
    members = Table(
        title=f"members ({len(conn.members)}): {conn.consume_type}, {model}", title_justify="left"
    )
    for col in ("client id", "address", "subscriptions", "last heartbeat"):
        members.add_column(col, overflow="fold")
    for m in conn.members:
        subs = "\n".join(
            f"{s.topic}: {s.expression}" + (" (SQL92)" if s.expression_type == "SQL92" else "")
            for s in m.subscriptions
        )
        members.add_row(m.client_id, m.addr, subs, fmt_time(m.last_heartbeat_ms))
    out.print(members)
    for c in conn.conflicts:
        views = "; ".join(
            f"{m.client_id}: " + ("not subscribed" if m.expression is None else repr(m.expression))
            for m in c.members
        )
        effect = (
            "pulls of it are refused until every member subscribes the same way (nothing is lost)"
            if c.pulls_refused
            else "only reported (strictSubscriptionConsistency=false): messages can be lost"
        )
        out.print(
            f"[bold red]SUBSCRIPTION CONFLICT[/] [red]on topic {c.topic}: members subscribe "
            f"differently ({views}); {effect}[/]",
            markup=True,
            highlight=False,
        )
    if conn.locks:
        locks = Table(title="queue locks", title_justify="left")
        for col in ("topic", "broker", "queue", "holder", "last locked"):
            locks.add_column(col)
        for lk in conn.locks:
            locks.add_row(
                lk.topic, lk.broker_name, str(lk.queue_id), lk.client_id, fmt_time(lk.last_lock_ms)
            )
        out.print(locks)


@group.command("create")
@click.argument("name")
@click.option("--retry-max-times", type=int, default=16, show_default=True)
@click.option("--retry-queues", type=int, default=1, show_default=True)
@click.option("--orderly", is_flag=True, help="The group consumes orderly.")
@click.option("--no-broadcast", is_flag=True, help="Refuse BROADCASTING consumers.")
@click.option("--disable", is_flag=True, help="Create the group with consumption disabled.")
@target_options
@namesrv_option
@json_option
def group_create(
    name: str,
    retry_max_times: int,
    retry_queues: int,
    orderly: bool,
    no_broadcast: bool,
    disable: bool,
    cluster: str | None,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Create subscription group NAME."""
    config = GroupConfig(
        name,
        consume_enable=not disable,
        consume_broadcast_enable=not no_broadcast,
        retry_queue_nums=retry_queues,
        retry_max_times=retry_max_times,
        consume_message_orderly=orderly,
    )

    async def go() -> list[ApplyResult]:
        async with admin_for(namesrv) as admin:
            return await admin.create_group(config, cluster=cluster, broker=broker)

    print_apply(f"create group {name}", run(go()), as_json)


@group.command("delete")
@click.argument("name")
@click.option("--clean-offsets", is_flag=True, help="Also delete the group's consumer offsets.")
@target_options
@namesrv_option
@json_option
def group_delete(
    name: str,
    clean_offsets: bool,
    cluster: str | None,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Delete subscription group NAME."""

    async def go() -> list[ApplyResult]:
        async with admin_for(namesrv) as admin:
            return await admin.delete_group(
                name, cluster=cluster, broker=broker, clean_offsets=clean_offsets
            )

    print_apply(f"delete group {name}", run(go()), as_json)


# ---- offsets ----------------------------------------------------------------------------------
@click.group()
def offset() -> None:
    """Consumer offsets."""


@offset.command("reset")
@click.option("-g", "--group", "group_name", required=True, help="Consumer group.")
@click.option("-t", "--topic", "topic_name", required=True, help="Topic.")
@click.option(
    "-s",
    "--timestamp",
    help="Move to the first message stored at or after this time: "
    "ms since the epoch, an ISO date, 'now' (the end) or 'earliest'.",
)
@click.option("-o", "--offset", "queue_offset", type=int, help="Move to this queue offset.")
@click.option("-q", "--queue", "queue_id", type=int, help="Only this queue id.")
@click.option("-b", "--broker", help="Only this broker.")
@namesrv_option
@json_option
def offset_reset(
    group_name: str,
    topic_name: str,
    timestamp: str | None,
    queue_offset: int | None,
    queue_id: int | None,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Move GROUP's offsets on TOPIC to a time (-s) or a queue offset (-o)."""
    if (timestamp is None) == (queue_offset is None):
        raise click.UsageError("give exactly one of --timestamp and --offset")
    ts = parse_time_ms(timestamp) if timestamp is not None else None

    async def go() -> Any:
        async with admin_for(namesrv) as admin:
            return await admin.reset_offset(
                group_name,
                topic_name,
                timestamp_ms=ts,
                queue_offset=queue_offset,
                queue_id=queue_id,
                broker=broker,
            )

    result = run(go())
    if as_json:
        echo_json(result)
        return
    table = Table(title=f"reset {group_name} on {topic_name}", title_justify="left")
    for col in ("broker", "queue", "old offset", "new offset"):
        table.add_column(col)
    for q in result.queues:
        table.add_row(q.broker_name, str(q.queue_id), str(q.old_offset), str(q.new_offset))
    out = console()
    out.print(table)
    out.print(f"members notified: {result.notified_clients}")
    for b, error in result.errors.items():
        click.echo(f"{b}: {error}", err=True)
