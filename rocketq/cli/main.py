"""Entry point of the ``rocketq`` command: a click group that collects the subcommands."""

from __future__ import annotations

import click

from rocketq.cli.admin_cmd import ADMIN_COMMANDS
from rocketq.cli.bench_cmd import BENCH_COMMANDS
from rocketq.cli.ha_cmd import HA_COMMANDS
from rocketq.cli.io_cmd import IO_COMMANDS
from rocketq.cli.server_cmd import SERVER_COMMANDS
from rocketq.cli.store_cmd import store
from rocketq.cli.timer_cmd import TIMER_COMMANDS
from rocketq.cli.transaction_cmd import TRANSACTION_COMMANDS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rocketq")
def cli() -> None:
    """RocketQ: a message queue that does what Apache RocketMQ does."""


cli.add_command(store)
for _command in (
    *SERVER_COMMANDS,
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
