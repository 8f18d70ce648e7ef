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
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

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
    parse_time_ms,
    run,
)
from rocketq.client.admin import (
    Admin,
    ApplyResult,
    ConsumerConnectionInfo,
    ConsumeStats,
    GroupConfig,
    RuntimeStats,
    TopicConfig,
)
from rocketq.client.errors import NotFoundError, RocketQError
from rocketq.message import ReceivedMessage

_PERMS = {2: "W", 4: "R", 6: "RW"}


def _admin(namesrv: str) -> Admin:
    return Admin(namesrv_list(namesrv))


def _print_apply(what: str, results: list[ApplyResult], as_json: bool) -> None:
    """One row per broker; exit 1 if any broker did not apply the change."""
    if as_json:
        echo_json([dataclasses.asdict(r) | {"ok": r.ok} for r in results])
    else:
        table = Table(title=what, title_justify="left")
        for col in ("broker", "address", "result", "message"):
            table.add_column(col, overflow="fold")
        for r in results:
            status = "[green]OK[/]" if r.ok else f"[red]{r.code}[/]"
            table.add_row(r.broker_name, r.broker_addr, status, r.error_message)
        console().print(table)
    if not results or not all(r.ok for r in results):
        raise SystemExit(1)


def _target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("-b", "--broker", help="Broker mode: only this broker name.")(f)
    return click.option(
        "-c",
        "--cluster",
        help="Cluster mode: every master of this cluster (default: the only one).",
    )(f)


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
        async with _admin(namesrv) as admin:
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
        async with _admin(namesrv) as admin:
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
        async with _admin(namesrv) as admin:
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
        "-p", "--perm", type=click.Choice(["2", "4", "6"]), help="2 write, 4 read, 6 both."
    )(f)
    f = click.option("-w", "--write-queues", type=int, help="Write queue count per broker.")(f)
    f = click.option("-r", "--read-queues", type=int, help="Read queue count per broker.")(f)
    return click.option("-q", "--queues", type=int, help="Read and write queue count.")(f)


@topic.command("create")
@click.argument("name")
@_queue_options
@_target_options
@namesrv_option
@json_option
def topic_create(
    name: str,
    queues: int | None,
    read_queues: int | None,
    write_queues: int | None,
    perm: str | None,
    order: bool | None,
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
    )

    async def go() -> list[ApplyResult]:
        async with _admin(namesrv) as admin:
            return await admin.create_topic(config, cluster=cluster, broker=broker)

    _print_apply(f"create topic {name}", run(go()), as_json)


@topic.command("update")
@click.argument("name")
@_queue_options
@_target_options
@namesrv_option
@json_option
def topic_update(
    name: str,
    queues: int | None,
    read_queues: int | None,
    write_queues: int | None,
    perm: str | None,
    order: bool | None,
    cluster: str | None,
    broker: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Change topic NAME; options not given keep their current values.

    To shrink, lower the write queues first, let consumers drain, then lower the read queues.
    """

    async def go() -> list[ApplyResult]:
        async with _admin(namesrv) as admin:
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
            )
            return await admin.update_topic(config, cluster=cluster, broker=broker)

    _print_apply(f"update topic {name}", run(go()), as_json)


@topic.command("delete")
@click.argument("name")
@_target_options
@namesrv_option
@json_option
def topic_delete(
    name: str, cluster: str | None, broker: str | None, namesrv: str, as_json: bool
) -> None:
    """Delete topic NAME with its queues and consumer offsets."""

    async def go() -> list[ApplyResult]:
        async with _admin(namesrv) as admin:
            return await admin.delete_topic(name, cluster=cluster, broker=broker)

    _print_apply(f"delete topic {name}", run(go()), as_json)


@topic.command("list")
@click.option("-c", "--cluster", default="", help="Only topics of this cluster.")
@click.option("--system", is_flag=True, help="Include system topics (%RETRY%, TBW102, ...).")
@namesrv_option
@json_option
def topic_list(cluster: str, system: bool, namesrv: str, as_json: bool) -> None:
    """Topics with their queue counts and permissions on each broker."""

    async def fetch() -> tuple[list[str], dict[str, list[TopicConfig]]]:
        async with _admin(namesrv) as admin:
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
        async with _admin(namesrv) as admin:
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
    for broker, error in desc.errors.items():
        click.echo(f"{broker}: {error}", err=True)


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
        async with _admin(namesrv) as admin:
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
        async with _admin(namesrv) as admin:
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
@_target_options
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
        async with _admin(namesrv) as admin:
            return await admin.create_group(config, cluster=cluster, broker=broker)

    _print_apply(f"create group {name}", run(go()), as_json)


@group.command("delete")
@click.argument("name")
@click.option("--clean-offsets", is_flag=True, help="Also delete the group's consumer offsets.")
@_target_options
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
        async with _admin(namesrv) as admin:
            return await admin.delete_group(
                name, cluster=cluster, broker=broker, clean_offsets=clean_offsets
            )

    _print_apply(f"delete group {name}", run(go()), as_json)


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
        async with _admin(namesrv) as admin:
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


# ---- messages ---------------------------------------------------------------------------------
@click.group()
def message() -> None:
    """Find and read stored messages."""


def _messages_table(title: str, msgs: list[ReceivedMessage]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("msg id", "offset msg id", "broker", "queue", "queue offset", "tags", "keys"):
        table.add_column(col, overflow="fold")
    table.add_column("stored")
    table.add_column("body", overflow="fold")
    for m in msgs:
        table.add_row(
            m.msg_id,
            m.offset_msg_id,
            m.broker_name,
            str(m.queue_id),
            str(m.queue_offset),
            m.tags,
            " ".join(m.keys),
            fmt_time(m.store_timestamp_ms),
            body_preview(m.body),
        )
    return table


@message.command("query")
@click.option("-t", "--topic", "topic_name", required=True, help="Topic.")
@click.option("-k", "--key", help="Business key (one word of the message's keys).")
@click.option("-i", "--id", "msg_id", help="Unique message id (SendResult.msg_id).")
@click.option("--begin", default="earliest", show_default=True, help="Stored at or after.")
@click.option("--end", default="now", show_default=True, help="Stored at or before.")
@click.option("--max", "max_num", type=click.IntRange(1, 64), default=32, show_default=True)
@namesrv_option
@json_option
def message_query(
    topic_name: str,
    key: str | None,
    msg_id: str | None,
    begin: str,
    end: str,
    max_num: int,
    namesrv: str,
    as_json: bool,
) -> None:
    """Find messages of a topic by key (index files) or by unique id."""
    if (key is None) == (msg_id is None):
        raise click.UsageError("give exactly one of --key and --id")
    begin_ms, end_ms = parse_time_ms(begin), parse_time_ms(end)

    async def go() -> list[ReceivedMessage]:
        async with _admin(namesrv) as admin:
            if key is not None:
                return await admin.query_by_key(topic_name, key, begin_ms, end_ms, max_num)
            assert msg_id is not None
            return await admin.query_by_id(topic_name, msg_id)

    msgs = run(go())
    if as_json:
        echo_json(msgs)
        return
    console().print(_messages_table(f"{len(msgs)} message(s)", msgs))


@message.command("view")
@click.argument("offset_msg_id")
@namesrv_option
@json_option
def message_view(offset_msg_id: str, namesrv: str, as_json: bool) -> None:
    """Show the message OFFSET_MSG_ID (SendResult.offset_msg_id) in full."""

    async def go() -> ReceivedMessage:
        async with _admin(namesrv) as admin:
            return await admin.view_message(offset_msg_id)

    m = run(go())
    if as_json:
        echo_json(m)
        return
    table = Table(title=f"message {m.offset_msg_id}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for f in dataclasses.fields(m):
        value = getattr(m, f.name)
        if f.name == "body":
            continue
        if f.name == "properties":
            for k, v in sorted(value.items()):
                table.add_row(f"property {k}", v)
            continue
        shown = fmt_time(value) if f.name.endswith("timestamp_ms") else str(value)
        table.add_row(f.name, shown)
    table.add_row("body", body_preview(m.body, 4000))
    console().print(table)


ADMIN_COMMANDS = (cluster, topic, group, offset, message)
