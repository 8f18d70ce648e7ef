"""The ``rocketq`` options for TLS and credentials, given before the command
(``rocketq --tls-ca ca.pem --access-key app1 --secret-key-file sk produce ...``).

They set the process's default client security (rocketq.client.security), which every client
a command opens uses. Without them the environment decides (``ROCKETQ_TLS_CA_FILE``,
``ROCKETQ_ACCESS_KEY``, ``ROCKETQ_SECRET_KEY_FILE`` ...): a secret never has to be on a command
line, where other users of the machine can read it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from rocketq.client.security import ClientSecurity, read_secret_file, set_default_security


def security_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--tls", "tls", is_flag=True, default=None,
                     help="TLS with the system's trusted CAs (or use --tls-ca)."),
        click.option("--tls-ca", type=click.Path(dir_okay=False),
                     help="PEM CA that signed the servers' certificates; turns TLS on."),
        click.option("--tls-cert", type=click.Path(dir_okay=False),
                     help="PEM client certificate for mutual TLS (with --tls-key)."),
        click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM client key."),
        click.option("--access-key", help="Sign requests as this access key (ACL)."),
        click.option("--secret-key-file", type=click.Path(dir_okay=False),
                     help="File holding the secret key (or ROCKETQ_SECRET_KEY)."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def apply_security_options(values: dict[str, Any]) -> None:
    if not any(v for v in values.values()):
        set_default_security(None)  # the environment decides (also between in-process runs)
        return
    env = ClientSecurity.from_env()
    secret = env.secret_key
    if values.get("secret_key_file"):
        try:
            secret = read_secret_file(values["secret_key_file"])
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    access_key = values.get("access_key") or env.access_key
    if access_key and not secret:
        raise click.UsageError(
            "--access-key needs its secret key: --secret-key-file FILE or ROCKETQ_SECRET_KEY"
        )
    try:
        sec = ClientSecurity(
            tls_ca_file=values.get("tls_ca") or env.tls_ca_file,
            tls_cert_file=values.get("tls_cert") or env.tls_cert_file,
            tls_key_file=values.get("tls_key") or env.tls_key_file,
            tls=bool(values.get("tls")) or env.tls,
            access_key=access_key,
            secret_key=secret if access_key else "",
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    set_default_security(sec)
