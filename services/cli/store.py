"""``rocketq store dump|verify DIR``: look inside a store directory without changing it."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from services.store import inspect
from services.store.inspect import detect_layout
from services.store.inspect import verify as run_verify

_SECTIONS = ("commitlog", "consumequeue", "index")


def _layout(directory: Path, slots: int | None, entries: int | None) -> Any:
    try:
        return detect_layout(directory, slots, entries)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def store() -> None:
    """Inspect a store directory (read-only; safe on a live broker's directory)."""


@store.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--section",
    "sections",
    type=click.Choice(_SECTIONS),
    multiple=True,
    help="What to print (repeatable); default all three.",
)
@click.option("--limit", type=int, default=None, help="At most this many rows per section.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line instead of tables.")
@click.option("--index-slots", type=int, default=None, help="Index slot count, if not 1:4.")
@click.option("--index-entries", type=int, default=None, help="Index entry count, if not 1:4.")
def dump(
    directory: Path,
    sections: tuple[str, ...],
    limit: int | None,
    as_json: bool,
    index_slots: int | None,
    index_entries: int | None,
) -> None:
    """Print commitlog records, consume-queue units and index entries of DIRECTORY."""
    layout = _layout(directory, index_slots, index_entries)
    problems: list[str] = []
    sources = {
        "commitlog": inspect.iter_commitlog,
        "consumequeue": inspect.iter_consume_queues,
        "index": inspect.iter_index,
    }
    # Piped output has no terminal width; don't fold ids and topics into 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 220)
    for name in sections or _SECTIONS:
        rows = itertools.islice(sources[name](layout, problems), limit)
        if as_json:
            for row in rows:
                sys.stdout.write(json.dumps({"section": name, **row}) + "\n")
        else:
            _print_table(console, name, rows)
    for p in problems:
        click.echo(f"problem: {p}", err=True)


_COLUMNS = {
    "commitlog": [
        "offset",
        "size",
        "topic",
        "queue_id",
        "queue_offset",
        "tags",
        "keys",
        "body_bytes",
        "offset_msg_id",
    ],
    "consumequeue": ["topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code"],
    "index": ["file", "index_no", "key_hash", "commitlog_offset", "time_diff_s", "prev_index_no"],
}


def _print_table(console: Console, name: str, rows: Iterable[dict[str, Any]]) -> None:
    table = Table(title=name, title_justify="left")
    cols = _COLUMNS[name]
    for col in cols:
        table.add_column(col, overflow="fold")
    for row in rows:
        if row.get("blank"):
            table.add_row(str(row["offset"]), str(row["size"]), "(blank: end of file)")
            continue
        table.add_row(*(str(row.get(c, "")) for c in cols))
    console.print(table)


@store.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--index-slots", type=int, default=None, help="Index slot count, if not 1:4.")
@click.option("--index-entries", type=int, default=None, help="Index entry count, if not 1:4.")
def verify(
    directory: Path, as_json: bool, index_slots: int | None, index_entries: int | None
) -> None:
    """Check every record, unit and index entry of DIRECTORY; exit 1 on any problem."""
    report = run_verify(_layout(directory, index_slots, index_entries))
    if as_json:
        click.echo(json.dumps(report.__dict__ | {"ok": report.ok}, indent=2))
    else:
        click.echo(
            f"{directory}: {report.records} records in commitlog "
            f"[{report.commitlog_min}, {report.commitlog_end}), {report.units} consume-queue "
            f"units, {report.index_entries} index entries"
        )
        if report.unclean_shutdown:
            click.echo("note: abort marker present (unclean shutdown or running broker)")
        if report.deleted_topic_records:
            click.echo(
                f"note: {report.deleted_topic_records} records of deleted topics (kept until "
                "retention removes their files; no consume queue expected)"
            )
        for p in report.problems:
            click.echo(f"problem: {p}")
        click.echo("OK" if report.ok else f"{len(report.problems)} problem(s)")
    if not report.ok:
        sys.exit(1)
