"""How an SDK client proves who it is and whom it talks to: TLS and signed requests.

:class:`ClientSecurity` carries both halves:

- **TLS**: the CA that signed the servers' certificates (``tls_ca_file``; empty with
  ``tls=True`` trusts the system roots) and, for mutual TLS, the client's own certificate and key.
  Files are read when a channel is opened, so a rotated client certificate is used by the next
  connection.
- **Credentials**: an access key and its secret key. Every request then carries
  ``x-mq-date-time`` (UTC, ``YYYYMMDDTHHMMSSZ``) and the RocketMQ 5 ``authorization`` header,
  ``MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>``, the
  signature being HMAC-SHA1 of the date header keyed by the secret key: the format of Apache
  RocketMQ 5's SDKs, so the same credentials work with both.

Without an explicit value a client uses :func:`default_security`: what a RocketQ service set
for its process, else the environment (``ROCKETQ_TLS_CA_FILE``, ``ROCKETQ_TLS_CERT_FILE``,
``ROCKETQ_TLS_KEY_FILE``, ``ROCKETQ_TLS`` = true, ``ROCKETQ_ACCESS_KEY``, ``ROCKETQ_SECRET_KEY``
or ``ROCKETQ_SECRET_KEY_FILE``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc

AUTHORIZATION_HEADER = "authorization"
DATE_HEADER = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
SECRET_FILE_MAX_BYTES = 4096


@dataclass(frozen=True)
class ClientSecurity:
    """TLS files and credentials of a client; the empty value is plaintext and unsigned."""

    tls_ca_file: str = ""
    """PEM CA bundle the server certificates must chain to; turns TLS on."""
    tls_cert_file: str = ""
    """PEM client certificate for mutual TLS (with ``tls_key_file``); turns TLS on."""
    tls_key_file: str = ""
    tls: bool = False
    """TLS with the system's trusted roots when no CA file is given."""
    access_key: str = ""
    secret_key: str = ""

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("a client certificate needs its key: give both tls_cert_file and "
                             "tls_key_file, or neither")  # fmt: skip
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError("credentials need both access_key and secret_key")

    def __repr__(self) -> str:  # never print the secret
        return (
            f"ClientSecurity(tls={self.tls_enabled}, ca={self.tls_ca_file!r}, "
            f"cert={self.tls_cert_file!r}, access_key={self.access_key!r})"
        )

    @property
    def tls_enabled(self) -> bool:
        return self.tls or bool(self.tls_ca_file or self.tls_cert_file)

    @property
    def signs(self) -> bool:
        return bool(self.access_key)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        env = os.environ if environ is None else environ
        secret = env.get("ROCKETQ_SECRET_KEY", "")
        if not secret and env.get("ROCKETQ_SECRET_KEY_FILE"):
            secret = read_secret_file(env["ROCKETQ_SECRET_KEY_FILE"])
        return cls(
            tls_ca_file=env.get("ROCKETQ_TLS_CA_FILE", ""),
            tls_cert_file=env.get("ROCKETQ_TLS_CERT_FILE", ""),
            tls_key_file=env.get("ROCKETQ_TLS_KEY_FILE", ""),
            tls=env.get("ROCKETQ_TLS", "").lower() in ("1", "true", "yes", "on"),
            access_key=env.get("ROCKETQ_ACCESS_KEY", ""),
            secret_key=secret,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client ``ssl`` context for a plain socket with the same trust and certificate as
        the channels (None without TLS): the CA file, else the system's roots."""
        if not self.tls_enabled:
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.tls_ca_file or None)
            if self.tls_cert_file:
                ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot use the TLS files: {exc}") from None
        return ctx

    def read_tls_files(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA, key, certificate) bytes as grpc.ssl_channel_credentials takes them."""

        def read(path: str) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read TLS file {path}: {exc.strerror}") from None

        return read(self.tls_ca_file), read(self.tls_key_file), read(self.tls_cert_file)


def read_secret_file(path: str) -> str:
    """A secret key kept in a file (a Kubernetes secret mount): its first line."""
    try:
        data = Path(path).read_bytes()[:SECRET_FILE_MAX_BYTES]
    except OSError as exc:
        raise ValueError(f"cannot read the secret key file {path}: {exc.strerror}") from None
    return data.decode("utf-8", "replace").strip()


def sign(secret_key: str, date_time: str) -> str:
    """Lower-case hex HMAC-SHA1 of the date header keyed by the secret key."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


class Signer:
    """The signed headers of a request; the HMAC is computed once per second, not per call."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._ak = access_key
        self._sk = secret_key
        self._second = -1
        self._metadata: tuple[tuple[str, str], ...] = ()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        now = int(time.time())
        if now != self._second:
            date = time.strftime(DATE_FORMAT, time.gmtime(now))
            auth = (
                f"{ALGORITHM} Credential={self._ak}, SignedHeaders={DATE_HEADER}, "
                f"Signature={sign(self._sk, date)}"
            )
            self._metadata = ((DATE_HEADER, date), (AUTHORIZATION_HEADER, auth))
            self._second = now
        return self._metadata


_default: ClientSecurity | None = None


def set_default_security(security: ClientSecurity | None) -> None:
    """Set what clients of this process use when given none (RocketQ services call this with
    their configured TLS files and internal credentials); None goes back to the environment."""
    global _default
    _default = security


def default_security() -> ClientSecurity:
    return _default if _default is not None else ClientSecurity.from_env()


def security_channel(
    addr: str,
    options: list[tuple[str, int]],
    security: ClientSecurity | None = None,
    interceptors: list[Any] | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``addr`` with TLS and signing as ``security`` (default:
    :func:`default_security`) says; RocketQ's services open their own channels with it too."""
    sec = security if security is not None else default_security()
    if sec.tls_enabled:
        ca, key, cert = sec.read_tls_files()
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        channel = grpc.aio.secure_channel(addr, creds, options=options, interceptors=interceptors)
    else:
        channel = grpc.aio.insecure_channel(addr, options=options, interceptors=interceptors)
    if sec.signs:
        return cast(
            grpc.aio.Channel, _SignedChannel(channel, Signer(sec.access_key, sec.secret_key))
        )
    return channel


class _SignedCall:
    """A multi-callable that adds the signed headers to each call's metadata."""

    __slots__ = ("_inner", "_signer")

    def __init__(self, inner: Any, signer: Signer) -> None:
        self._inner = inner
        self._signer = signer

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        signed = self._signer.metadata()
        if metadata:
            signed = (*tuple(metadata), *signed)
        return self._inner(*args, metadata=signed, **kwargs)


class _SignedChannel:
    """A channel whose calls carry the signature headers.

    Wrapping the multi-callables the stubs get costs one function call per RPC; grpc.aio's
    client interceptors, the obvious alternative, cost about a sixth of a small call's CPU.
    """

    def __init__(self, inner: grpc.aio.Channel, signer: Signer) -> None:
        self._inner = inner
        self._signer = signer

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _SignedCall(self._inner.unary_unary(*args, **kwargs), self._signer)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _SignedCall(self._inner.unary_stream(*args, **kwargs), self._signer)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _SignedCall(self._inner.stream_unary(*args, **kwargs), self._signer)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _SignedCall(self._inner.stream_stream(*args, **kwargs), self._signer)

    async def __aenter__(self) -> _SignedChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.close()

    def __getattr__(self, name: str) -> Any:  # close, get_state, channel_ready ...
        return getattr(self._inner, name)


_PLAINTEXT_ON_TLS = ("Socket closed", "Connection reset", "connection reset")
_TLS_FAILURE = ("handshake", "SSL", "ssl", "certificate", "Certificate")


def transport_hint(details: str) -> str:
    """A sentence a person can act on for a connection that failed before any RPC: gRPC only
    says "Socket closed" when a plaintext client meets a TLS port."""
    if any(s in details for s in _TLS_FAILURE):
        return (
            " (TLS handshake failed: the CA given to the client (tls_ca_file, --tls-ca, "
            "ROCKETQ_TLS_CA_FILE) must have signed the server's certificate, the server must "
            "serve TLS, and a server that requires mutual TLS needs a client certificate "
            "(tls_cert_file/tls_key_file))"
        )
    if any(s in details for s in _PLAINTEXT_ON_TLS):
        return (
            " (the server closed the connection: if it serves TLS, give the client its CA "
            "(tls_ca_file, --tls-ca or ROCKETQ_TLS_CA_FILE) and, for mutual TLS, a client "
            "certificate)"
        )
    return ""
