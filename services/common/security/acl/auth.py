"""Checking the RocketMQ 5 ``authorization`` header.

``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>``
where the signature is HMAC-SHA1 of the ``x-mq-date-time`` value keyed by the user's secret key.
Apache's Python SDK writes lower-case hex and the Node SDK upper-case, so hex compares
case-insensitively. There is no clock-skew window: the Python SDK stamps local time with a "Z".
"""

from __future__ import annotations

import hmac

from rocketq.client.security import ALGORITHM, AUTHORIZATION_HEADER, DATE_HEADER, sign
from rocketq.validation import quote
from services.common.security.acl.model import User

HEADER_MAX_CHARS = 1024


class AuthError(Exception):
    """Why a request is not authenticated (the UNAUTHENTICATED message)."""


def parse_authorization(value: str) -> tuple[str, str]:
    """(access key, signature) of the header; AuthError saying what is wrong."""
    if len(value) > HEADER_MAX_CHARS:
        raise AuthError(f"the authorization header is longer than {HEADER_MAX_CHARS} characters")
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthError(
            f"authorization algorithm {quote(algorithm, 40)} is not {ALGORITHM}; sign requests "
            "with an access key and secret key (RocketMQ 5 format)"
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, val = part.strip().partition("=")
        if sep:
            fields[name] = val.strip()
    ak, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not ak or not signature:
        raise AuthError("the authorization header lacks Credential=<access key> or Signature=")
    if DATE_HEADER not in fields.get("SignedHeaders", DATE_HEADER).split(";"):
        raise AuthError(f"the authorization header must sign {DATE_HEADER}")
    return ak, signature


def authenticate(metadata: dict[str, str], lookup: dict[str, User]) -> User:
    """The user who signed the request, or AuthError."""
    value = metadata.get(AUTHORIZATION_HEADER)
    if not value:
        raise AuthError(
            "the request carries no authorization header: this server requires signed requests; "
            "give the client an access key and secret key"
        )
    ak, signature = parse_authorization(value)
    date = metadata.get(DATE_HEADER)
    if not date:
        raise AuthError(f"the request is signed but carries no {DATE_HEADER} header")
    user = lookup.get(ak)
    if user is None:
        raise AuthError(f"unknown access key {quote(ak, 64)}")
    expected = sign(user.secret_key, date)
    if not hmac.compare_digest(expected.encode(), signature.lower().encode()):
        raise AuthError(
            f"the signature of access key {quote(ak, 64)} does not match: wrong secret key"
        )
    return user
