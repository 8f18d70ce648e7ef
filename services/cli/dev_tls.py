"""``rocketq dev up --tls``: a throwaway CA and one certificate for the services and one for
clients under ``DIR/tls``, the keys that turn mutual TLS on, and the client environment."""

from __future__ import annotations

from pathlib import Path

from rocketq.client.security import ClientSecurity, set_default_security
from services.common.security.certs import TestCA


def dev_tls(base: Path) -> list[str]:
    """Make the CA and certificates; the ``KEY=VALUE`` items every service gets. The demo round
    trip of this process uses the client certificate."""
    ca = TestCA(base / "tls", "RocketQ dev CA")
    server = ca.issue("server")
    client = ca.issue("client")
    set_default_security(
        ClientSecurity(str(ca.ca_file), str(client.cert_file), str(client.key_file))
    )
    return [
        f"tlsCertFile={server.cert_file}",
        f"tlsKeyFile={server.key_file}",
        f"tlsCaFile={ca.ca_file}",
        "tlsClientAuth=require",
    ]


def tls_client_env(base: Path) -> str:
    tls = base / "tls"
    return (
        f"ROCKETQ_TLS_CA_FILE={tls / 'ca.pem'} ROCKETQ_TLS_CERT_FILE={tls / 'client.pem'} "
        f"ROCKETQ_TLS_KEY_FILE={tls / 'client-key.pem'}"
    )
