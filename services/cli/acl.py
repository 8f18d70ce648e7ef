"""``rocketq acl``: users and permissions in an ACL file (the ``aclFile`` of the services).

The services reload the file within a second of a change, so ``rocketq acl grant`` takes effect
without a restart. Edits are atomic (tmp + rename, mode 600). Secrets are never printed, except
a generated one, once, when the user is created. Point every service at the same file (or copy
it to each host).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import click

from services.common.security.acl.model import (
    ROLES,
    AclFileError,
    Perm,
    parse_users,
    read_raw,
    write_raw,
)

ACCESS_KEY_MAX_CHARS = 128


@click.group()
@click.option("--acl-file", type=click.Path(dir_okay=False, path_type=Path), required=True,
              envvar="ROCKETQ_ACL_FILE", help="The ACL file (or ROCKETQ_ACL_FILE).")  # fmt: skip
@click.pass_context
def acl(ctx: click.Context, acl_file: Path) -> None:
    """Users (access key, secret key, role) and their topic and group permissions."""
    ctx.obj = acl_file


def _load(path: Path) -> dict[str, Any]:
    try:
        return read_raw(path)
    except AclFileError as exc:
        raise click.ClickException(str(exc)) from None


def _save(path: Path, raw: dict[str, Any]) -> None:
    try:
        # never write a file the services would refuse
        parse_users(raw, path, resolve_secrets=False)
    except AclFileError as exc:
        raise click.ClickException(str(exc)) from None
    write_raw(path, raw)


def _user(raw: dict[str, Any], access_key: str) -> dict[str, Any]:
    user = raw["users"].get(access_key)
    if user is None:
        raise click.ClickException(f"no user {access_key!r}; add it with `rocketq acl user add`")
    return dict(user)


@acl.group("user")
def user_group() -> None:
    """Add or delete users."""


@user_group.command("add")
@click.argument("access_key")
@click.option("--role", type=click.Choice(ROLES), default="user", show_default=True)
@click.option("--secret-key-file", help="Read the secret from this file when the services load.")
@click.option("--secret-key-env", help="Read the secret from this environment variable.")
@click.pass_obj
def user_add(
    path: Path, access_key: str, role: str, secret_key_file: str | None, secret_key_env: str | None
) -> None:
    """Add ACCESS_KEY (or change its role). Without --secret-key-file/-env a random secret is
    generated, stored in the file and printed once."""
    if not access_key.isprintable() or " " in access_key or len(access_key) > ACCESS_KEY_MAX_CHARS:
        raise click.BadParameter(
            "printable, no spaces, at most 128 characters", param_hint="ACCESS_KEY"
        )
    raw = _load(path)
    entry: dict[str, Any] = dict(raw["users"].get(access_key, {}))
    entry["role"] = role
    generated = ""
    if secret_key_file or secret_key_env:
        for k in _SECRET_SOURCES:
            entry.pop(k, None)
        if secret_key_file:
            entry["secretKeyFile"] = secret_key_file
        else:
            entry["secretKeyEnv"] = secret_key_env
    elif not any(entry.get(k) for k in _SECRET_SOURCES):
        generated = secrets.token_hex(20)
        entry["secretKey"] = generated
    raw["users"][access_key] = entry
    _save(path, raw)
    click.echo(f"user {access_key} ({role}) saved in {path}")
    if generated:
        click.echo(f"secret key (shown once): {generated}")


@user_group.command("delete")
@click.argument("access_key")
@click.pass_obj
def user_delete(path: Path, access_key: str) -> None:
    raw = _load(path)
    _user(raw, access_key)
    del raw["users"][access_key]
    _save(path, raw)
    click.echo(f"user {access_key} deleted")


@acl.command("grant")
@click.argument("access_key")
@click.option("--topic", help="Topic name, or * for every topic not named.")
@click.option("--group", help="Consumer group name, or *.")
@click.option("--perm", required=True, help="PUB, SUB, PUB|SUB or DENY.")
@click.pass_obj
def grant(path: Path, access_key: str, topic: str | None, group: str | None, perm: str) -> None:
    """Set ACCESS_KEY's permission on a topic or a group (the services reload within 1 s)."""
    if (topic is None) == (group is None):
        raise click.UsageError("give exactly one of --topic and --group")
    try:
        parsed = Perm.parse(perm)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--perm") from None
    raw = _load(path)
    entry = _user(raw, access_key)
    table, name = ("topics", topic) if topic is not None else ("groups", group)
    entry[table] = {**entry.get(table, {}), str(name): parsed.text()}
    raw["users"][access_key] = entry
    _save(path, raw)
    click.echo(f"{access_key}: {table[:-1]} {name} {parsed.text()}")


@acl.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON (without secrets).")
@click.pass_obj
def list_users(path: Path, as_json: bool) -> None:
    """Users, roles and permissions (secrets are not shown)."""
    raw = _load(path)
    rows = [_row(ak, entry) for ak, entry in sorted(raw["users"].items())]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        perms = [f"topic {k}={v}" for k, v in row["topics"].items()]
        perms += [f"group {k}={v}" for k, v in row["groups"].items()]
        click.echo(f"{row['accessKey']}  role={row['role']}  secret={row['secret']}  "
                   f"{', '.join(perms) or '(no permissions: default deny)'}")  # fmt: skip


_SECRET_SOURCES = ("secretKey", "secretKeyFile", "secretKeyEnv")


def _row(ak: str, entry: dict[str, Any]) -> dict[str, Any]:
    source = next((k for k in _SECRET_SOURCES if entry.get(k)), "")
    where = {
        "secretKey": "in file",
        "secretKeyFile": f"file {entry.get('secretKeyFile')}",
        "secretKeyEnv": f"env {entry.get('secretKeyEnv')}",
    }.get(source, "missing")
    return {
        "accessKey": ak,
        "role": entry.get("role", "user"),
        "secret": where,
        "topics": entry.get("topics", {}),
        "groups": entry.get("groups", {}),
    }
