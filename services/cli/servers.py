"""``rocketq nameserver``, ``broker`` and ``timer-wheel``: the servers in the foreground.

Each is the service's own entry point (``python -m services.nameserver`` …): the arguments go
unchanged to the service's parser (services.common.bootstrap), so the flags, ``--set`` keys,
``ROCKETQ_<SERVICE>_<KEY>`` variables and ``--help`` are one thing, declared once.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import click

from rocketq.cli._common import NAMESRV_ENV

TIMER_DATA_DIR_DEFAULT = ".rocketq-timer"
"""``rocketq timer-wheel`` keeps its data in the working directory unless told otherwise."""

_FORWARD = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": [],
}


def _forwarding(
    name: str, help_text: str, module: str, defaults: Callable[[], list[str]]
) -> click.Command:
    """A command that hands its whole argument list (after ``defaults()``) to ``module``'s
    ``main`` (imported only when run: ``rocketq --help`` stays quick)."""

    def callback(args: tuple[str, ...]) -> None:
        main = importlib.import_module(module).main
        sys.exit(main([*defaults(), *args], f"rocketq {name}"))

    return click.Command(
        name,
        callback=callback,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=help_text,
        context_settings=_FORWARD,
        add_help_option=False,
    )


def _timer_defaults() -> list[str]:
    # Earlier flags lose to later ones: the user's --set, --data-dir and --namesrv win.
    out = ["--set", f"dataDir={TIMER_DATA_DIR_DEFAULT}"]
    if os.environ.get(NAMESRV_ENV):
        out += ["--set", f"namesrvAddr={os.environ[NAMESRV_ENV]}"]
    return out


nameserver = _forwarding(
    "nameserver",
    "Run a nameserver (route registry) in the foreground; Ctrl-C or SIGTERM stops it.",
    "services.nameserver.server",
    list,
)
broker = _forwarding(
    "broker",
    "Run a broker in the foreground; Ctrl-C or SIGTERM stops it cleanly.",
    "services.broker.server",
    list,
)
timer_wheel = _forwarding(
    "timer-wheel",
    "Run a timer-wheel (delayed delivery, consume-retry backoff) in the foreground; Ctrl-C or "
    "SIGTERM stops it cleanly. Several instances share the brokers' timer queues.",
    "services.timer_wheel.server",
    _timer_defaults,
)

SERVER_COMMANDS = (nameserver, broker, timer_wheel)
