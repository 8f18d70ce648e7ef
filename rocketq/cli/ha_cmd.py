"""``rocketq ha status|switchover``: failover state and maintenance handover (DESIGN.md §6).

| command                               | what it does                                         |
|---------------------------------------|------------------------------------------------------|
| ha status [BROKER_NAME]               | per group: master, epoch, in-sync set, and each      |
|                                       | replica's role, offsets, lag and lease               |
| ha switchover BROKER_NAME [--to ID]   | hand the master role to an in-sync replica (0 = the  |
|                                       | best-ranked one) and wait until it leads             |

``status`` exits 1 when a group has no master (writes are refused), so a script can wait for
an election with ``until rocketq ha status; do sleep 1; done``. ``switchover`` exits 1 when the
target did not catch up in ``--timeout-ms`` (nothing changed) or is not an in-sync replica.
"""

from __future__ import annotations

import click
from rich.table import Table

from rocketq.cli._common import console, echo_json, json_option, namesrv_list, namesrv_option, run
from rocketq.client.admin import Admin, HaGroup, SwitchoverResult

_ROLE_STYLE = {"SYNC_MASTER": "green", "ASYNC_MASTER": "green", "SLAVE": "", "DOWN": "red"}


@click.group()
def ha() -> None:
    """Failover: replica roles, epochs, in-sync sets; manual switchover."""


def _group_table(g: HaGroup) -> Table:
    master = (
        f"replica {g.master_replica_id} at {g.master_addr}"
        if g.master_replica_id is not None
        else "[red]none[/]"
    )
    isr = ",".join(str(i) for i in g.in_sync_replica_ids) or "-"
    mode = "controller (etcd)" if g.controller_mode else "static roles"
    title = f"{g.broker_name} ({g.cluster}, {mode}): master {master}, epoch {g.epoch}, ISR {isr}"
    table = Table(title=title, title_justify="left")
    for col in ("replica", "address", "role", "epoch", "max offset", "confirm", "lag bytes"):
        table.add_column(col)
    table.add_column("in ISR")
    table.add_column("lease ms")
    for r in g.replicas:
        style = _ROLE_STYLE.get(r.role, "")
        role = f"[{style}]{r.role}[/]" if style else r.role
        down = r.role == "DOWN"
        table.add_row(
            str(r.replica_id) if r.replica_id >= 0 else "?",
            r.addr or "-",
            role,
            "-" if down else str(r.epoch),
            "-" if down else str(r.max_offset),
            "-" if down else str(r.confirm_offset),
            "-" if down else str(r.lag_bytes),
            "yes" if r.in_isr else "no",
            str(r.lease_remaining_ms) if g.controller_mode and not down else "-",
        )
    return table


@ha.command("status")
@click.argument("broker_name", required=False)
@namesrv_option
@json_option
def ha_status(broker_name: str | None, namesrv: str, as_json: bool) -> None:
    """Master, epoch and in-sync replicas of every broker group (or BROKER_NAME's), and each
    replica's role, offsets and lease. Exits 1 if a group has no master."""

    async def fetch() -> list[HaGroup]:
        async with Admin(namesrv_list(namesrv)) as admin:
            return await admin.ha_status(broker_name)

    groups = run(fetch())
    if as_json:
        echo_json(groups)
    else:
        out = console()
        for g in groups:
            out.print(_group_table(g))
            for warning in g.warnings:
                out.print(f"[yellow]warning:[/] {warning}")
        if not groups:
            click.echo("no broker group is registered with the nameserver", err=True)
    if not groups or any(g.master_replica_id is None for g in groups):
        raise SystemExit(1)


@ha.command("switchover")
@click.argument("broker_name")
@click.option(
    "--to",
    "target",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Replica id of the new master; 0 = the best-ranked in-sync slave.",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(1, 120_000),
    default=10_000,
    show_default=True,
    help="How long the target may take to catch up and be elected.",
)
@namesrv_option
@json_option
def ha_switchover(
    broker_name: str, target: int, timeout_ms: int, namesrv: str, as_json: bool
) -> None:
    """Hand BROKER_NAME's master role to an in-sync replica for maintenance: the master stops
    acknowledging writes, waits until the target has every byte, and steps down; the target is
    elected and the old master follows it as a slave."""

    async def go() -> SwitchoverResult:
        async with Admin(namesrv_list(namesrv), timeout_ms=timeout_ms + 5_000) as admin:
            return await admin.switchover(broker_name, target, timeout_ms)

    result = run(go())
    if as_json:
        echo_json(result)
        return
    click.echo(
        f"{broker_name}: master moved from replica {result.old_master_replica_id} "
        f"({result.old_master_addr}) to replica {result.new_master_replica_id} "
        f"({result.new_master_addr}), epoch {result.epoch}"
    )


HA_COMMANDS = (ha,)
