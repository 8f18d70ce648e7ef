"""``rocketq message query|view``: find stored messages by key or unique id and read one in
full by its offset message id, part of RocketQ's mqadmin (see :mod:`rocketq.cli.admin_cmd`).

| command                             | mqadmin equivalent                        |
|-------------------------------------|-------------------------------------------|
| message query --key / --id          | queryMsgByKey, queryMsgById               |
| message view                        | viewMessage                               |

Kept apart from ``admin_cmd.py`` because these commands read message contents (index files
and the commitlog) rather than configure the cluster; ``admin_cmd.ADMIN_COMMANDS`` still
registers them.
"""

from __future__ import annotations

import dataclasses

import click
from rich.table import Table

from rocketq.cli._admin_common import admin_for
from rocketq.cli._common import (
    body_preview,
    console,
    echo_json,
    fmt_time,
    json_option,
    namesrv_option,
    parse_time_ms,
    run,
)
from rocketq.message import ReceivedMessage


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
        async with admin_for(namesrv) as admin:
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
        async with admin_for(namesrv) as admin:
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
