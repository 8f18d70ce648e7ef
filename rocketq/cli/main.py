"""The client commands of ``rocketq``: a click group that collects the subcommands.

The ``rocketq`` console script is ``services.cli.main:main``, which adds the server commands
(``nameserver``, ``broker``, ``timer-wheel``, ``dev``, ``store``) to this group: the library
never imports the servers."""

from __future__ import annotations

import click

from rocketq.cli.admin_cmd import ADMIN_COMMANDS
from rocketq.cli.bench_cmd import BENCH_COMMANDS
from rocketq.cli.ha_cmd import HA_COMMANDS
from rocketq.cli.io_cmd import IO_COMMANDS
from rocketq.cli.security_opts import apply_security_options, security_options
from rocketq.cli.timer_cmd import TIMER_COMMANDS
from rocketq.cli.transaction_cmd import TRANSACTION_COMMANDS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rocketq")
@security_options
def cli(**security: object) -> None:
    """RocketQ: a message queue that does what Apache RocketMQ does."""
    apply_security_options(security)


for _command in (
    *ADMIN_COMMANDS,
    *IO_COMMANDS,
    *TIMER_COMMANDS,
    *TRANSACTION_COMMANDS,
    *BENCH_COMMANDS,
    *HA_COMMANDS,
):
    cli.add_command(_command)


def main() -> None:
    cli()
