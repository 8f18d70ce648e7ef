"""What every networked ``rocketq`` subcommand shares: the nameserver and ``--json`` options,
running a coroutine with SDK errors turned into one-line CLI errors, and output helpers.

Errors: any :class:`rocketq.client.errors.RocketQError` becomes ``Error: <message>`` on stderr
and exit code 1 (click's ClickException), never a traceback; Ctrl-C exits 130.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import enum
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
from rich.console import Console

from rocketq.client.errors import RocketQError

NAMESRV_ENV = "ROCKETQ_NAMESRV"
DEFAULT_NAMESRV = "127.0.0.1:9876"
#: Width of tables when stdout is not a terminal (pipes, tests): wide enough for ids.
PIPE_WIDTH = 220

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


def namesrv_option(f: _F) -> _F:
    """``-n/--namesrv``: nameserver addresses, from ROCKETQ_NAMESRV or 127.0.0.1:9876."""
    return click.option(
        "-n",
        "--namesrv",
        envvar=NAMESRV_ENV,
        default=DEFAULT_NAMESRV,
        show_default=True,
        show_envvar=True,
        help="Nameserver address host:port; several separated by ';'.",
    )(f)


def json_option(f: _F) -> _F:
    """``--json``: print machine-readable JSON instead of tables."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(f)


def namesrv_list(namesrv: str) -> list[str]:
    return [a.strip() for a in namesrv.replace(",", ";").split(";") if a.strip()]


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine; SDK errors and bad values become a clean CLI error (exit 1)."""
    try:
        return asyncio.run(coro)
    except RocketQError as exc:
        raise click.ClickException(exc.message) from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


def console() -> Console:
    # Piped output has no terminal width; don't fold ids and topics into 80 columns.
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray | memoryview):
        raw = bytes(obj)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode()
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"cannot print {type(obj).__name__} as JSON")


def to_json(obj: Any) -> str:
    """JSON text of dataclasses, lists and dicts; bytes as UTF-8 text or ``base64:...``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    return json.dumps(obj, indent=2, default=_json_default)


def echo_json(obj: Any) -> None:
    click.echo(to_json(obj))


def fmt_time(ms: int) -> str:
    """Local time with milliseconds, or "-" for 0 (no such time)."""
    if ms <= 0:
        return "-"
    t = datetime.datetime.fromtimestamp(ms / 1000)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def body_preview(body: bytes, limit: int = 60) -> str:
    """The start of a body as text, for tables."""
    text = body[: limit * 4].decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_time_ms(text: str) -> int:
    """A time as ms since the epoch: an integer, "now", "earliest" (0), or an ISO-8601 date
    or date-time in local time ("2024-05-01T12:00:00")."""
    value = text.strip().lower()
    if value == "now":
        return int(datetime.datetime.now().timestamp() * 1000)
    if value in ("earliest", "0"):
        return 0
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        return int(datetime.datetime.fromisoformat(text.strip()).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a time: use ms since the epoch, 'now', 'earliest' or "
            "an ISO date such as 2024-05-01T12:00:00"
        ) from None
