"""What the mqadmin-style commands share: opening an :class:`Admin`, the ``-c/--cluster`` and
``-b/--broker`` target options of a change, and the per-broker table a change prints.

The admin commands are split by subject (``admin_cmd.py``: cluster and topic; ``group_cmd.py``:
groups and offsets; ``message_cmd.py``: messages); these helpers sit apart so each of those
can use them without importing another, and ``admin_cmd.py`` can collect them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import click
from rich.table import Table

from rocketq.cli._common import console, echo_json, namesrv_list
from rocketq.client.admin import Admin, ApplyResult


@contextlib.asynccontextmanager
async def admin_for(namesrv: str) -> AsyncIterator[Admin]:
    """An admin client of the nameservers given by ``-n/--namesrv``; on the way out it says on
    stderr which reads a slave answered because the master did not."""
    async with Admin(namesrv_list(namesrv)) as admin:
        try:
            yield admin
        finally:
            print_replica_fallbacks(admin)


def print_replica_fallbacks(admin: Admin) -> None:
    """One stderr line per read a slave answered (stdout stays the result, --json included)."""
    for fallback in admin.replica_fallbacks:
        click.echo(f"note: {fallback.describe()}", err=True)
    admin.replica_fallbacks.clear()


def print_apply(what: str, results: list[ApplyResult], as_json: bool) -> None:
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


def target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``-c/--cluster`` or ``-b/--broker``: where a create, update or delete applies."""
    f = click.option("-b", "--broker", help="Broker mode: only this broker name.")(f)
    return click.option(
        "-c",
        "--cluster",
        help="Cluster mode: every master of this cluster (default: the only one).",
    )(f)
