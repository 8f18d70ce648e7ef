"""The security keys every service accepts, and what a running service makes of them.

Each service's config dataclass has the fields and its KeyTable appends
:func:`~.keys.security_keys`, so the names are the same everywhere: ``tlsCertFile``,
``tlsKeyFile``, ``tlsCaFile``, ``tlsClientAuth``, ``aclEnable``, ``aclFile``
(``ROCKETQ_BROKER_TLSCERTFILE`` ...).

:class:`ServiceSecurity` gives the server its port credentials and ACL interceptor, and the
service's own clients (broker → nameserver, slave → master, timer wheel → broker, admin fan-out)
their TLS files and the ACL file's ``internal`` user: it installs them as the process's default
client security, which every SDK channel of the process uses.
"""

from __future__ import annotations

from typing import Any

import grpc

from rocketq.client.security import ClientSecurity, set_default_security
from services.common.config import ConfigError
from services.common.security import tls as tls_mod
from services.common.security.acl.interceptor import AclGuard
from services.common.security.acl.store import AclStore
from services.common.security.tls import TlsConfig


class ServiceSecurity:
    """TLS and ACL of one service process, from its config (with the fields of .keys)."""

    def __init__(self, cfg: Any, service: str) -> None:
        self.tls = TlsConfig(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_ca_file,
                             cfg.tls_client_auth)  # fmt: skip
        self.tls.check()
        self.service = service
        self.acl: AclStore | None = AclStore(cfg.acl_file) if cfg.acl_file else None
        self.acl_enable = bool(cfg.acl_enable)
        if self.acl_enable and self.acl is None:
            raise ConfigError("aclEnable=true needs aclFile (the users and their permissions)")

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if self.acl_enable and self.acl is not None:
            return [AclGuard(self.acl, self.service)]
        return []

    def add_port(self, server: grpc.aio.Server, listen: str) -> int:
        return tls_mod.add_port(server, listen, self.tls)

    def client_security(self) -> ClientSecurity:
        """What this service's own calls to other RocketQ processes use."""
        internal = self.acl.internal_user() if self.acl is not None else None
        tls = self.tls
        return ClientSecurity(
            tls_ca_file=tls.ca_file,
            tls_cert_file=tls.cert_file if tls.ca_file else "",
            tls_key_file=tls.key_file if tls.ca_file else "",
            tls=tls.enabled,
            access_key=internal.access_key if internal else "",
            secret_key=internal.secret_key if internal else "",
        )

    def install_client_default(self) -> None:
        set_default_security(self.client_security())
