"""Entry point of the ``rocketq`` console script: the client commands of rocketq.cli.main plus
the server commands of this package."""

from __future__ import annotations

import click

from rocketq.cli.main import cli as client_cli
from services.cli.acl import acl
from services.cli.dev import dev
from services.cli.gateway import gateway
from services.cli.servers import SERVER_COMMANDS
from services.cli.store import store


def build() -> click.Group:
    """The whole ``rocketq`` group: every client command, then the servers, dev and store."""
    for command in (*SERVER_COMMANDS, dev, store, acl, gateway):
        client_cli.add_command(command)
    return client_cli


cli = build()


def main() -> None:
    cli()
