"""Signatures, permissions, the ACL file and TLS config checks, without processes (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketq.client.security import ClientSecurity, Signer, sign
from services.common.config import ConfigError
from services.common.security.acl.auth import AuthError, authenticate
from services.common.security.acl.model import AclFileError, Perm, User, parse_users, read_raw
from services.common.security.acl.rules import rule_for
from services.common.security.certs import TestCA
from services.common.security.tls import TlsConfig

pytestmark = pytest.mark.unit


def test_signature_is_rocketmq5_hmac_sha1_of_the_date_header() -> None:
    # vector from `openssl dgst -sha1 -hmac secret` over the date text
    assert sign("secret", "20240101T000000Z") == "2e5621239cbfdccc449dbd2e028cf60e7c6a592d"
    (date_name, date), (auth_name, auth) = Signer("ak1", "secret").metadata()
    assert (date_name, auth_name) == ("x-mq-date-time", "authorization")
    assert auth == (
        f"MQv2-HMAC-SHA1 Credential=ak1, SignedHeaders=x-mq-date-time, "
        f"Signature={sign('secret', date)}"
    )
    user = User("ak1", "secret")
    assert authenticate(dict([(date_name, date), (auth_name, auth)]), {"ak1": user}) is user


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "no authorization header"),
        ({"authorization": "Basic xyz"}, "is not MQv2-HMAC-SHA1"),
        ({"authorization": "MQv2-HMAC-SHA1 Credential=ak1"}, "lacks Credential"),
        ({"authorization": "MQv2-HMAC-SHA1 Credential=ak1, Signature=ab"}, "no x-mq-date-time"),
        (
            {
                "authorization": "MQv2-HMAC-SHA1 Credential=ak1, Signature=\u00e9",
                "x-mq-date-time": "d",
            },
            "does not match",
        ),
    ],
)
def test_malformed_authorization_is_refused_with_the_reason(
    headers: dict[str, str], reason: str
) -> None:
    with pytest.raises(AuthError, match=reason):
        authenticate(headers, {"ak1": User("ak1", "secret")})


def test_permissions_default_deny_wildcards_and_retry_topics() -> None:
    user = User(
        "u",
        "s",
        topics={"orders": Perm.parse("PUB|SUB"), "*": Perm.parse("SUB")},
        groups={"billing": Perm.SUB},
    )
    assert Perm.PUB in user.topic_perm("orders")[0]
    assert Perm.PUB not in user.topic_perm("other")[0]  # the wildcard grants SUB only
    assert Perm.SUB in user.topic_perm("%RETRY%billing")[0]  # governed by the group
    assert user.topic_perm("%DLQ%audit") == (Perm.DENY, "group 'audit'")
    assert User("v", "s").group_perm("billing")[0] == Perm.DENY
    with pytest.raises(ValueError, match="use PUB, SUB"):
        Perm.parse("WRITE")


def test_rules_leave_health_open_and_close_unknown_methods() -> None:
    assert rule_for("/grpc.health.v1.Health/Check").role == "open"
    assert rule_for("/rocketq.v1.Admin/CreateTopic").role == "admin"
    assert rule_for("/rocketq.v1.Admin/SomethingAddedLater").role == "admin"
    assert rule_for("/rocketq.v1.Replication/Stream").role == "internal"


def test_acl_file_secrets_from_file_and_environment(tmp_path: Path) -> None:
    (tmp_path / "sk").write_text("from-file\n")
    raw = {
        "users": {
            "a": {"secretKeyFile": str(tmp_path / "sk")},
            "b": {"secretKeyEnv": "B_SECRET", "role": "admin"},
        }
    }
    users = parse_users(raw, tmp_path / "acl.json", environ={"B_SECRET": "from-env"})
    assert (users["a"].secret_key, users["b"].secret_key) == ("from-file", "from-env")
    with pytest.raises(AclFileError, match=r"B_SECRET .* is not set"):
        parse_users(raw, tmp_path / "acl.json", environ={})
    with pytest.raises(AclFileError, match="role 'root'"):
        parse_users({"users": {"c": {"secretKey": "x", "role": "root"}}}, tmp_path / "acl.json")
    (tmp_path / "bad.json").write_text(json.dumps(["not", "users"]))
    with pytest.raises(AclFileError, match="expected"):
        read_raw(tmp_path / "bad.json")


def test_tls_config_errors_name_the_key_and_file(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    a, b = ca.issue("a"), ca.issue("b")
    TlsConfig(str(a.cert_file), str(a.key_file), str(ca.ca_file), "require").check()
    with pytest.raises(ConfigError, match="tlsCertFile and tlsKeyFile go together"):
        TlsConfig(str(a.cert_file)).check()
    with pytest.raises(ConfigError, match="is not the key of"):
        TlsConfig(str(a.cert_file), str(b.key_file)).check()
    with pytest.raises(ConfigError, match="needs tlsCertFile, tlsKeyFile and tlsCaFile"):
        TlsConfig(str(a.cert_file), str(a.key_file), "", "require").check()
    with pytest.raises(ValueError, match="needs its key"):
        ClientSecurity(tls_cert_file="c.pem")
