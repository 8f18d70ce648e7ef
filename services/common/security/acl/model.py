"""Users and permissions, and their JSON file (``aclFile``).

The file::

    {"users": {
        "app1": {"secretKey": "...",            # or "secretKeyFile": path, "secretKeyEnv": NAME
                 "role": "user",                # user | admin | internal
                 "topics": {"orders": "PUB", "*": "DENY"},
                 "groups": {"billing": "SUB"}},
        "rocketq-internal": {"secretKeyEnv": "ROCKETQ_INTERNAL_SECRET", "role": "internal"}}}

A permission is ``PUB``, ``SUB``, ``PUB|SUB`` or ``DENY``; a topic or group not named falls back
to ``*`` and then to DENY (default deny). ``admin`` may do everything but the internal RPCs
(replication, broker registration); ``internal`` (the services' own calls) may do everything.
A retry or dead-letter topic (``%RETRY%g``, ``%DLQ%g``) is governed by group ``g``'s permission.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketq.client.security import read_secret_file

ROLES = ("user", "admin", "internal")
ACL_FILE_MAX_BYTES = 4 * 1024 * 1024
USERS_MAX = 10_000
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


class AclFileError(ValueError):
    """The ACL file cannot be used; the message says where and why."""


class Perm(enum.Flag):
    DENY = 0
    PUB = 1
    SUB = 2

    @classmethod
    def parse(cls, text: str) -> Perm:
        out = cls.DENY
        for raw in text.upper().replace(",", "|").split("|"):
            part = raw.strip()
            if part == "DENY":
                return cls.DENY
            if part not in ("PUB", "SUB"):
                raise ValueError(f"permission {text!r}: use PUB, SUB, PUB|SUB or DENY")
            out |= cls[part]
        return out

    def text(self) -> str:
        if self == Perm.DENY:
            return "DENY"
        return "|".join(p.name for p in (Perm.PUB, Perm.SUB) if p in self and p.name)


@dataclass(frozen=True)
class User:
    access_key: str
    secret_key: str
    role: str = "user"
    topics: dict[str, Perm] = field(default_factory=dict)
    groups: dict[str, Perm] = field(default_factory=dict)

    def topic_perm(self, topic: str) -> tuple[Perm, str]:
        """This user's permission on ``topic`` and the resource it was decided on."""
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if topic.startswith(prefix):
                group = topic[len(prefix) :]
                return self.group_perm(group)[0], f"group {group!r}"
        return _lookup(self.topics, topic), f"topic {topic!r}"

    def group_perm(self, group: str) -> tuple[Perm, str]:
        return _lookup(self.groups, group), f"group {group!r}"


def _lookup(table: dict[str, Perm], name: str) -> Perm:
    perm = table.get(name)
    if perm is None:
        perm = table.get("*", Perm.DENY)
    return perm


def read_raw(path: Path) -> dict[str, Any]:
    """The file's JSON, checked for shape only (secrets are not resolved)."""
    try:
        with open(path, "rb") as f:
            data = f.read(ACL_FILE_MAX_BYTES + 1)
    except FileNotFoundError:
        return {"users": {}}
    except OSError as exc:
        raise AclFileError(f"aclFile {path}: {exc.strerror}") from None
    if len(data) > ACL_FILE_MAX_BYTES:
        raise AclFileError(f"aclFile {path}: larger than {ACL_FILE_MAX_BYTES} bytes")
    try:
        raw = json.loads(data or b'{"users": {}}')
    except ValueError as exc:
        raise AclFileError(f"aclFile {path}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("users", {}), dict):
        raise AclFileError(f'aclFile {path}: expected {{"users": {{access key: user}}}}')
    raw.setdefault("users", {})
    if len(raw["users"]) > USERS_MAX:
        raise AclFileError(f"aclFile {path}: more than {USERS_MAX} users")
    return raw


def write_raw(path: Path, raw: dict[str, Any]) -> None:
    """Write atomically (tmp + rename, mode 600: it may hold secrets); servers reload it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=2, sort_keys=True)
        f.write("\n")
    tmp.replace(path)


def parse_users(
    raw: dict[str, Any], path: Path, environ: Any = None, resolve_secrets: bool = True
) -> dict[str, User]:
    """Users of the file's JSON; ``resolve_secrets=False`` checks the shape only (the CLI,
    whose environment is not the services')."""
    env = os.environ if environ is None else environ
    users: dict[str, User] = {}
    for ak, entry in raw["users"].items():
        where = f"aclFile {path}: user {ak!r}"
        if not isinstance(entry, dict):
            raise AclFileError(f"{where}: expected an object")
        role = entry.get("role", "user")
        if role not in ROLES:
            raise AclFileError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        if resolve_secrets:
            secret = _secret(entry, env, where)
        elif not any(entry.get(k) for k in ("secretKey", "secretKeyFile", "secretKeyEnv")):
            raise AclFileError(f"{where}: no secretKey, secretKeyFile or secretKeyEnv")
        else:
            secret = ""
        try:
            topics = {str(k): Perm.parse(str(v)) for k, v in entry.get("topics", {}).items()}
            groups = {str(k): Perm.parse(str(v)) for k, v in entry.get("groups", {}).items()}
        except (ValueError, AttributeError) as exc:
            raise AclFileError(f"{where}: {exc}") from None
        users[ak] = User(ak, secret, role, topics, groups)
    return users


def _secret(entry: dict[str, Any], env: Any, where: str) -> str:
    if entry.get("secretKey"):
        return str(entry["secretKey"])
    if entry.get("secretKeyFile"):
        try:
            return read_secret_file(str(entry["secretKeyFile"]))
        except ValueError as exc:
            raise AclFileError(f"{where}: {exc}") from None
    if entry.get("secretKeyEnv"):
        name = str(entry["secretKeyEnv"])
        if not env.get(name):
            raise AclFileError(f"{where}: environment variable {name} (secretKeyEnv) is not set")
        return str(env[name])
    raise AclFileError(f"{where}: no secretKey, secretKeyFile or secretKeyEnv")
