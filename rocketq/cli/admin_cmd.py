"""``rocketq cluster|topic|group|offset|message``: RocketQ's mqadmin, in the manner of rpk.

Every command takes ``-n/--namesrv`` (default ``$ROCKETQ_NAMESRV`` or 127.0.0.1:9876) and
``--json``; tables are for people, JSON (``dataclasses.asdict`` of the SDK's results) is for
scripts. A change (create, update, delete) prints one row per broker it reached and exits 1 if
any broker refused it, so scripts can trust the exit code.

| command                             | mqadmin equivalent                        |
|-------------------------------------|-------------------------------------------|
| cluster list / config / stats       | clusterList, getBrokerConfig, brokerStatus|
| topic create/update/delete          | updateTopic, deleteTopic                  |
| topic list / describe               | topicList, topicRoute + topicStatus       |
| group list/describe/create/delete   | consumerProgress, consumerConnection, ... |
| offset reset                        | resetOffsetByTime                         |
| message query --key / --id, view    | queryMsgByKey, queryMsgById, viewMessage  |

Split by subject: this module has the cluster and topic commands (how brokers and topics are
laid out) and collects every admin command in ``ADMIN_COMMANDS``; ``group_cmd.py`` has the
consumer side (groups and offsets), ``message_cmd.py`` the message queries, and
``_admin_common.py`` what they share (the admin client, target options, the change table).
Their commands are re-exported here, so ``rocketq.cli.admin_cmd`` still names them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
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
    run,
)
from rocketq.cli.group_cmd import (
    group,
    group_create,
    group_delete,
    group_describe,
    group_list,
    offset,
    offset_reset,
)
from rocketq.cli.message_cmd import message, message_query, message_view
from rocketq.client.admin import TOPIC_MESSAGE_TYPES, ApplyResult, RuntimeStats, TopicConfig
from rocketq.client.errors import RocketQError

__all__ = [
    "ADMIN_COMMANDS",
    "cluster",
    "cluster_config",
    "cluster_list",
    "cluster_stats",
    "group",
    "group_create",
    "group_delete",
    "group_describe",
    "group_list",
    "message",
    "message_query",
    "message_view",
    "offset",
    "offset_reset",
    "topic",
    "topic_create",
    "topic_delete",
    "topic_describe",
    "topic_list",
    "topic_update",
]

_PERMS = {2: "W", 4: "R", 6: "RW"}


# ---- cluster ----------------------------------------------------------------------------------
@click.group()
def cluster() -> None:
    """Clusters and brokers."""


@cluster.command("list")
@namesrv_option
@json_option
def cluster_list(namesrv: str, as_json: bool) -> None:
    """Every broker with its role, address, version, throughput and disk use; then each
    master's slaves with their acknowledged offset and replication lag (bytes and seconds)."""

    async def fetch() -> list[dict[str, Any]]:
        async with admin_for(namesrv) as admin:
            info = await admin.cluster_info()
            cluster_of = {name: g.cluster for name, g in info.brokers.items()}

            async def stats(addr: str) -> RuntimeStats | None:
                try:
                    return await admin.runtime_stats(addr)
                except RocketQError:
                    return None

            all_stats = await asyncio.gather(*(stats(b.broker_addr) for b in info.live_brokers))
            return [
                {
                    "cluster": cluster_of.get(b.broker_name, ""),
                    "broker_name": b.broker_name,
                    "broker_id": b.broker_id,
                    "addr": b.broker_addr,
                    "last_update_timestamp_ms": b.last_update_timestamp_ms,
                    "stats": s,
                }
                for b, s in zip(info.live_brokers, all_stats, strict=True)
            ]

    rows = run(fetch())
    if as_json:
        echo_json(rows)
        return
    table = Table(title="brokers", title_justify="left")
    for col in ("cluster", "broker", "id", "address", "role", "version", "put/s", "get/s"):
        table.add_column(col)
    table.add_column("disk")
    table.add_column("clients")
    table.add_column("replication")
    for row in rows:
        s: RuntimeStats | None = row["stats"]
        extra = ["?", "?", "-", "-", "-", "-", "-"]
        if s is not None:
            extra = [s.role, s.version, f"{s.put_messages_per_second:.1f}"]
            extra += [f"{s.get_messages_per_second:.1f}", f"{s.disk_used_ratio:.0%}"]
            extra += [str(s.connected_clients), _replication_summary(s)]
        table.add_row(
            row["cluster"], row["broker_name"], str(row["broker_id"]), row["addr"], *extra
        )
    console().print(table)
    if not rows:
        click.echo("no broker is registered with the nameserver", err=True)
    masters = [r["stats"] for r in rows if r["stats"] is not None and r["stats"].slaves]
    if masters:
        console().print(_slaves_table(masters))


def _replication_summary(s: RuntimeStats) -> str:
    """A master: its slaves (in sync / connected); a slave: its link to the master."""
    if s.role == "SLAVE":
        connected = s.extra.get("replication_connected", "")
        state = {"true": "connected", "false": "disconnected"}.get(connected.lower(), "slave")
        behind = s.extra.get("replication_behind_bytes")
        return f"{state}, {behind} B behind" if behind is not None else state
    if not s.slaves:
        return "-"
    in_sync = sum(1 for sl in s.slaves if sl.in_sync)
    return f"{len(s.slaves)} slave(s), {in_sync} in sync"


def _slaves_table(masters: list[RuntimeStats]) -> Table:
    """Each master's slaves: acknowledged offset and lag (SYNC_MASTER waits for in-sync ones)."""
    table = Table(title="replication (as each master sees its slaves)", title_justify="left")
    for col in ("broker", "master max", "slave id", "address", "acked", "in sync"):
        table.add_column(col)
    for col in ("lag bytes", "lag s", "last ack"):
        table.add_column(col)
    for m in masters:
        for sl in sorted(m.slaves, key=lambda x: x.broker_id):
            table.add_row(
                m.broker_name,
                str(m.commitlog_max_offset),
                str(sl.broker_id),
                sl.broker_addr,
                str(sl.acked_offset),
                "yes" if sl.in_sync else "[red]no[/]",
                str(sl.lag_bytes),
                f"{sl.lag_seconds:.3f}",
                fmt_time(sl.last_ack_timestamp_ms) if sl.last_ack_timestamp_ms else "-",
            )
    return table


@cluster.command("stats")
@click.argument("broker")
@namesrv_option
@json_option
def cluster_stats(broker: str, namesrv: str, as_json: bool) -> None:
    """Runtime statistics of BROKER (a broker name, meaning its master, or host:port)."""

    async def fetch() -> RuntimeStats:
        async with admin_for(namesrv) as admin:
            return await admin.runtime_stats(broker)

    stats = run(fetch())
    if as_json:
        echo_json(stats)
        return
    table = Table(title=f"{stats.broker_name} (id {stats.broker_id})", title_justify="left")
    table.add_column("key")
    table.add_column("value", overflow="fold")
    for f in dataclasses.fields(stats):
        value = getattr(stats, f.name)
        if f.name == "extra":
            for k, v in value.items():
                table.add_row(k, v)
            continue
        table.add_row(f.name, fmt_time(value) if f.name.endswith("timestamp_ms") else str(value))
    console().print(table)


@cluster.command("config")
@click.argument("broker")
@click.option("--set", "updates", multiple=True, metavar="KEY=VALUE", help="Change a key.")
@namesrv_option
@json_option
def cluster_config(broker: str, updates: tuple[str, ...], namesrv: str, as_json: bool) -> None:
    """Show BROKER's configuration, or change keys at runtime with --set KEY=VALUE."""
    changes = {}
    for item in updates:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        changes[key.strip()] = value.strip()

    async def go() -> dict[str, str]:
        async with admin_for(namesrv) as admin:
            if changes:
                return await admin.update_broker_config(broker, changes)
            return await admin.broker_config(broker)

    config = run(go())
    if as_json:
        echo_json(config)
        return
    for key, value in config.items():
        mark = "*" if key in changes else " "
        click.echo(f"{mark} {key} = {value}")


# ---- topics -----------------------------------------------------------------------------------
@click.group()
def topic() -> None:
    """Create, change, delete, list and describe topics."""


def _queue_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--order/--no-order", default=None, help="Ordered-message topic.")(f)
    f = click.option(
        "--message-type",
        type=click.Choice(TOPIC_MESSAGE_TYPES, case_sensitive=False),
        help="What RocketMQ 5 SDKs may send to it (gateway); MIXED (the default) = any.",
    )(f)
    f = click.option(
        "-p", "--perm", type=click.Choice(["2", "4", "6"]), help="2 write, 4 read, 6 both."
    )(f)
    f = click.option("-w", "--write-queues", type=int, help="Write queue count per broker.")(f)
    f = click.option("-r", "--read-queues", type=int, help="Read queue count per broker.")(f)
    return click.option("-q", "--queues", type=int, help="Read and write queue count.")(f)


@topic.command("create")
@click.argument("name")
@_queue_options
@target_options
@namesrv_option
@json_option
def topic_create(
    name: str,
    queues: int | None,
    read_queues: int | None,
    write_queues: int | None,
    perm: str | None,
    order: bool | None,
    message_type: str | None,
    cluster: str | None,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Create topic NAME (8 read and 8 write queues per broker unless told otherwise)."""
    n = queues or 8
    config = TopicConfig(
        name,
        read_queue_nums=read_queues or n,
        write_queue_nums=write_queues or n,
        perm=int(perm or 6),
        order=bool(order),
        message_type=(message_type or "MIXED").upper(),
    )

    async def go() -> list[ApplyResult]:
        async with admin_for(namesrv) as admin:
            return await admin.create_topic(config, cluster=cluster, broker=broker)

    print_apply(f"create topic {name}", run(go()), as_json)


@topic.command("update")
@click.argument("name")
@_queue_options
@target_options
@namesrv_option
@json_option
def topic_update(
    name: str,
    queues: int | None,
    read_queues: int | None,
    write_queues: int | None,
    perm: str | None,
    order: bool | None,
    message_type: str | None,
    cluster: str | None,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Change topic NAME; options not given keep their current values.

    To shrink, lower the write queues first, let consumers drain, then lower the read queues.
    """

    async def go() -> list[ApplyResult]:
        async with admin_for(namesrv) as admin:
            desc = await admin.describe_topic(name)
            current = next(
                (b.config for b in desc.brokers if not broker or b.broker_name == broker), None
            )
            if current is None:
                raise click.ClickException(f"topic {name!r} is not on any broker that answered")
            config = dataclasses.replace(
                current,
                read_queue_nums=read_queues or queues or current.read_queue_nums,
                write_queue_nums=write_queues or queues or current.write_queue_nums,
                perm=int(perm) if perm else current.perm,
                order=current.order if order is None else order,
                message_type=(message_type or current.message_type).upper(),
            )
            return await admin.update_topic(config, cluster=cluster, broker=broker)

    print_apply(f"update topic {name}", run(go()), as_json)


@topic.command("delete")
@click.argument("name")
@target_options
@namesrv_option
@json_option
def topic_delete(
    name: str, cluster: str | None, broker: str | None, namesrv: str, as_json: bool
) -> None:
    """Delete topic NAME with its queues and consumer offsets."""

    async def go() -> list[ApplyResult]:
        async with admin_for(namesrv) as admin:
            return await admin.delete_topic(name, cluster=cluster, broker=broker)

    print_apply(f"delete topic {name}", run(go()), as_json)


@topic.command("list")
@click.option("-c", "--cluster", default="", help="Only topics of this cluster.")
@click.option("--system", is_flag=True, help="Include system topics (%RETRY%, TBW102, ...).")
@namesrv_option
@json_option
def topic_list(cluster: str, system: bool, namesrv: str, as_json: bool) -> None:
    """Topics with their queue counts and permissions on each broker."""

    async def fetch() -> tuple[list[str], dict[str, list[TopicConfig]]]:
        async with admin_for(namesrv) as admin:
            names = await admin.list_topics(cluster, include_system=system)
            try:
                per_broker = await admin.broker_topics(include_system=system)
            except RocketQError:
                per_broker = {}  # names alone are still worth showing
            return names, per_broker

    names, per_broker = run(fetch())
    rows: list[tuple[str, dict[str, TopicConfig]]] = []
    for name in names:
        on = {b: c for b, cs in sorted(per_broker.items()) for c in cs if c.topic_name == name}
        rows.append((name, on))
    if as_json:
        echo_json([{"topic": name, "brokers": on} for name, on in rows])
        return
    table = Table(title="topics", title_justify="left")
    for col in ("topic", "broker", "read", "write", "perm", "order"):
        table.add_column(col)
    for name, on in rows:
        if not on:
            table.add_row(name, "-", "", "", "", "")
        for i, (b, c) in enumerate(on.items()):
            table.add_row(
                name if i == 0 else "",
                b,
                str(c.read_queue_nums),
                str(c.write_queue_nums),
                _PERMS.get(c.perm, str(c.perm)),
                "yes" if c.order else "",
            )
    console().print(table)


@topic.command("describe")
@click.argument("name")
@namesrv_option
@json_option
def topic_describe(name: str, namesrv: str, as_json: bool) -> None:
    """Route of topic NAME and min/max offsets of every queue on every broker."""

    async def fetch() -> Any:
        async with admin_for(namesrv) as admin:
            return await admin.describe_topic(name)

    desc = run(fetch())
    if as_json:
        echo_json(desc)
        return
    out = console()
    route = Table(title=f"route of {name}", title_justify="left")
    for col in ("broker", "read", "write", "perm", "addresses"):
        route.add_column(col, overflow="fold")
    addrs = {g.broker_name: g.addrs for g in desc.route.brokers}
    for q in desc.route.queues:
        members = ", ".join(f"{i}={a}" for i, a in sorted(addrs.get(q.broker_name, {}).items()))
        route.add_row(
            q.broker_name,
            str(q.read_queue_nums),
            str(q.write_queue_nums),
            _PERMS.get(q.perm, str(q.perm)),
            members,
        )
    out.print(route)
    queues = Table(title="queues", title_justify="left")
    for col in ("broker", "queue", "min offset", "max offset", "messages", "last update"):
        queues.add_column(col)
    for b in desc.brokers:
        for q in b.queues:
            queues.add_row(
                b.broker_name,
                str(q.queue_id),
                str(q.min_offset),
                str(q.max_offset),
                str(q.max_offset - q.min_offset),
                fmt_time(q.last_update_timestamp_ms),
            )
    out.print(queues)
    types = sorted({(b.broker_name, b.config.message_type) for b in desc.brokers})
    for broker_name, message_type in types:
        click.echo(f"message type on {broker_name}: {message_type}")
    for broker, error in desc.errors.items():
        click.echo(f"{broker}: {error}", err=True)


ADMIN_COMMANDS = (cluster, topic, group, offset, message)
