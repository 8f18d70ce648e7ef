"""The ACL file as a running server sees it: loaded at start (an unusable file stops the
service with the reason), looked at again at most once a second and reloaded when its mtime or
size changed. A reload that fails keeps the users in force and logs why: an operator's typo
must not lock every client out."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from services.common.config import ConfigError
from services.common.security.acl.model import AclFileError, User, parse_users, read_raw

log = logging.getLogger("rocketq.security")

RECHECK_INTERVAL_S = 1.0


class AclStore:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(
                f"aclFile {path} does not exist; create it with `rocketq acl user add`"
            )
        self._checked_at = time.monotonic()
        self._stamp = self._stat()
        try:
            self._users = parse_users(read_raw(self.path), self.path)
        except AclFileError as exc:
            raise ConfigError(str(exc)) from None

    def _stat(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
        except OSError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_size)

    def users(self) -> dict[str, User]:
        now = time.monotonic()
        if now - self._checked_at >= RECHECK_INTERVAL_S:
            self._checked_at = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._users = parse_users(read_raw(self.path), self.path)
                    log.info("ACL reloaded from %s: %d users", self.path, len(self._users))
                except AclFileError as exc:
                    log.error("ACL file changed but cannot be used, keeping the old: %s", exc)
        return self._users

    def user(self, access_key: str) -> User | None:
        return self.users().get(access_key)

    def internal_user(self) -> User | None:
        """The user a service signs its own calls with: the first of role ``internal``."""
        for user in self.users().values():
            if user.role == "internal":
                return user
        return None
