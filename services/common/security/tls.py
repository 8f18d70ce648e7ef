"""TLS for every RocketQ gRPC port: server credentials that follow their files, and the
config keys every service shares (DESIGN.md §11).

``tlsCertFile``/``tlsKeyFile`` turn TLS on; ``tlsCaFile`` is the CA client certificates must
chain to (and the CA the service's own clients trust); ``tlsClientAuth`` is ``none``,
``optional`` or ``require`` (mutual TLS). grpcio's Python server either requires a client
certificate or does not ask for one, so ``optional`` accepts every client like ``none`` and only
differs in loading the CA: a deployment can move to ``require`` once every client has a
certificate.

Rotation without a restart: the server uses grpc's dynamic certificate configuration, whose
fetcher grpc calls before each new handshake. The fetcher compares the files' (mtime, size) with
the last load and reloads when they changed; a half-written pair (a key that does not match its
certificate, a file that does not parse) is ignored until it is whole, so a rotation written as
two file copies never serves a broken pair. Connections already open keep their session.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from services.common.config import ConfigError
from services.common.security.keys import CLIENT_AUTH_MODES

log = logging.getLogger("rocketq.security")

T = TypeVar("T")

PEM_FILE_MAX_BYTES = 1024 * 1024
"""A certificate chain or key larger than this is not a PEM file someone meant to give."""


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    client_auth: str = "none"

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    def check(self) -> None:
        """ConfigError naming the key when the combination cannot work."""
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("tlsCertFile and tlsKeyFile go together: set both or neither")
        if self.client_auth not in CLIENT_AUTH_MODES:
            raise ConfigError(f"tlsClientAuth={self.client_auth!r}: one of none, optional, require")
        if self.client_auth != "none" and not (self.enabled and self.ca_file):
            raise ConfigError(
                f"tlsClientAuth={self.client_auth} needs tlsCertFile, tlsKeyFile and tlsCaFile "
                "(the CA that signed the client certificates)"
            )
        if self.ca_file and not self.enabled:
            # a CA alone configures this service's own clients (a plaintext server, TLS peers)
            return
        if self.enabled:
            load_pair(self)  # fail at start-up, naming the file, not at the first handshake


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(PEM_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    if len(data) > PEM_FILE_MAX_BYTES:
        raise ConfigError(f"{what} {path}: larger than {PEM_FILE_MAX_BYTES} bytes; not a PEM file")
    return data


def load_pair(tls: TlsConfig) -> tuple[bytes, bytes, bytes | None]:
    """(key, chain, CA) bytes, checked: both parse and the key belongs to the certificate."""
    key = _read(tls.key_file, "tlsKeyFile")
    chain = _read(tls.cert_file, "tlsCertFile")
    ca = _read(tls.ca_file, "tlsCaFile") if tls.ca_file else None
    try:
        cert = x509.load_pem_x509_certificate(chain)
    except ValueError:
        raise ConfigError(f"tlsCertFile {tls.cert_file}: not a PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"tlsKeyFile {tls.key_file}: not an unencrypted PEM key") from None
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    if cert.public_key().public_bytes(enc, fmt) != private.public_key().public_bytes(enc, fmt):
        raise ConfigError(f"tlsKeyFile {tls.key_file} is not the key of {tls.cert_file}")
    if ca is not None:
        try:
            x509.load_pem_x509_certificates(ca)
        except ValueError:
            raise ConfigError(f"tlsCaFile {tls.ca_file}: not PEM certificates") from None
    return key, chain, ca


def _stamp(tls: TlsConfig) -> tuple[tuple[int, int], ...]:
    out = []
    for path in (tls.cert_file, tls.key_file, tls.ca_file):
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append((st.st_mtime_ns, st.st_size) if st else (0, 0))
    return tuple(out)


class CertificateWatcher(Generic[T]):
    """What a server is configured with, built by ``build(key, chain, ca)`` from the files, and
    rebuilt when they change: calling it gives a new value, or None while the files are as last
    loaded (or changed but cannot be used yet). grpc calls the gRPC port's watcher before each
    new handshake; the data socket's :class:`ServerContexts` calls its own the same way."""

    def __init__(self, tls: TlsConfig, build: Callable[[bytes, bytes, bytes | None], T]) -> None:
        self.tls = tls
        self._build = build
        self._lock = threading.Lock()  # grpc may call from its own threads
        self._stamp = _stamp(tls)
        self.initial = build(*load_pair(tls))
        self.reloads = 0

    def __call__(self) -> T | None:
        stamp = _stamp(self.tls)
        if stamp == self._stamp:
            return None
        with self._lock:
            if stamp == self._stamp:
                return None
            try:
                built = self._build(*load_pair(self.tls))
            except (ConfigError, ssl.SSLError, OSError) as exc:
                # A rotation in progress (key copied, certificate not yet): keep serving the
                # old pair and look again at the next handshake.
                log.warning("TLS files changed but cannot be used yet (%s); keeping the old", exc)
                return None
            self._stamp = stamp
            self.reloads += 1
            log.info("TLS certificate reloaded from %s (reload %d)", self.tls.cert_file,
                     self.reloads)  # fmt: skip
            return built


def _grpc_configuration(
    key: bytes, chain: bytes, ca: bytes | None
) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    watcher = CertificateWatcher(tls, _grpc_configuration)
    return grpc.dynamic_ssl_server_credentials(
        watcher.initial, watcher, require_client_authentication=tls.client_auth == "require"
    )


def add_port(server: grpc.aio.Server, listen: str, tls: TlsConfig) -> int:
    """Bind ``listen`` with TLS when configured; the bound port (0 = could not bind)."""
    if tls.enabled:
        return int(server.add_secure_port(listen, server_credentials(tls)))
    return int(server.add_insecure_port(listen))


class ServerContexts:
    """An ``ssl`` server context for a plain socket (the replication data socket) that follows
    its files as the gRPC port's credentials do (:class:`CertificateWatcher`): each new
    handshake is served the newest pair that loads, by swapping the context in the SNI
    callback, which runs before the certificate is chosen (even when the client sends no SNI).

    ``require`` asks for a client certificate chained to tlsCaFile; ``optional`` and ``none``
    ask for none, as the gRPC ports do."""

    def __init__(self, tls: TlsConfig) -> None:
        self.tls = tls
        self._watcher = CertificateWatcher(tls, self._context)
        self.base = self._current = self._watcher.initial
        """The context to listen with: its callback hands each handshake the current one."""
        self.base.sni_callback = self._pick

    def _context(self, _key: bytes, _chain: bytes, ca: bytes | None) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads a pair from files only: these are the files load_pair just checked.
        ctx.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        if self.tls.client_auth == "require":
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cadata=(ca or b"").decode("ascii", "replace"))
        return ctx

    def _pick(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        rebuilt = self._watcher()
        if rebuilt is not None:
            self._current = rebuilt
        sslobj.context = self._current
