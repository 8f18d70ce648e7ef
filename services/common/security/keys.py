"""The security keys every service's KeyTable appends (no grpc here: config modules import it).

Each service's config dataclass has the fields ``tls_cert_file``, ``tls_key_file``,
``tls_ca_file``, ``tls_client_auth`` (``none``), ``acl_enable`` (False), ``acl_file``.
"""

from __future__ import annotations

from services.common.config import Key, parse_bool

CLIENT_AUTH_MODES = ("none", "optional", "require")


def security_keys() -> list[Key]:
    return [
        Key("tlsCertFile", "tls_cert_file", doc="PEM certificate chain; set = TLS on every port"),
        Key("tlsKeyFile", "tls_key_file", doc="PEM private key of tlsCertFile"),
        Key("tlsCaFile", "tls_ca_file", doc="PEM CA for client certificates and own clients"),
        Key("tlsClientAuth", "tls_client_auth", str.lower, "mutual TLS", choices=CLIENT_AUTH_MODES),
        Key("aclEnable", "acl_enable", parse_bool, "check signatures and permissions"),
        Key("aclFile", "acl_file", doc="JSON users and permissions (reloaded on change)"),
    ]
