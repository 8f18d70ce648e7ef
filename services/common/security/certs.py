"""A throwaway certificate authority: ``rocketq dev up --tls`` and the TLS tests make one.

EC P-256 keys, certificates valid for a day (minus a minute of clock skew), every leaf for
``localhost`` and ``127.0.0.1`` with both serverAuth and clientAuth usages, so one leaf serves a
process's port and its clients to other processes (mutual TLS). Not for production: a real
deployment brings certificates from its own CA (cert-manager, Vault ...).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=1)
SKEW = datetime.timedelta(minutes=1)


@dataclass(frozen=True)
class Leaf:
    cert_file: Path
    key_file: Path


class TestCA:
    """A CA key and certificate written under ``directory`` (``ca.pem``); :meth:`issue` makes
    leaves next to it."""

    __test__ = False  # not a pytest class despite the name

    def __init__(self, directory: Path, name: str = "RocketQ throwaway CA") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = self.dir / "ca.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Leaf:
        """``<name>.pem`` and ``<name>-key.pem``, written atomically (tmp + rename) so a server
        watching them never reads half a file."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        leaf = Leaf(self.dir / f"{name}.pem", self.dir / f"{name}-key.pem")
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write(leaf.key_file, key_pem, 0o600)
        _write(leaf.cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        return leaf


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)
