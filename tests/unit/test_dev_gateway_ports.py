"""``rocketq dev up`` gives every broker on the host its own RocketMQ 5 gateway port, or none:
the master its ``--gateway-port``, slaves none, HA replicas one each (the flags it passes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.dev import _effective_gateway_port, _slave_args
from services.cli.dev_ha import HaPorts, _replica_args

pytestmark = pytest.mark.unit


def sets(args: list[str]) -> dict[str, str]:
    """The last value of each ``--set KEY=VALUE`` (the broker applies them in order)."""
    out: dict[str, str] = {}
    for flag, item in zip(args[::2], args[1::2], strict=True):
        assert flag == "--set"
        key, _, value = item.partition("=")
        out[key] = value
    return out


def test_ha_replicas_each_get_their_own_gateway_port_even_against_a_set() -> None:
    ports = HaPorts(namesrv=0, broker=0, etcd=0, gateway=18081)
    user = ("gatewayPort=9999",)  # one port for all would clash: the replica's own wins
    got = [sets(_replica_args(Path("/d"), k, ports, "127.0.0.1:2379", user)) for k in (1, 2, 3)]
    assert [g["gatewayPort"] for g in got] == ["18081", "18082", "18083"]
    off = HaPorts(namesrv=0, broker=0, etcd=0, gateway=0)
    assert sets(_replica_args(Path("/d"), 2, off, "e:1", ()))["gatewayPort"] == "0"


def test_slaves_serve_no_gateway_and_the_master_port_is_reported_as_set() -> None:
    assert sets(_slave_args(Path("/d"), 1, 0, ("gatewayPort=8081",)))["gatewayPort"] == "0"
    assert _effective_gateway_port(8081, ()) == 8081
    assert _effective_gateway_port(8081, ("flushDiskType=SYNC_FLUSH", "gatewayPort=0")) == 0
    assert _effective_gateway_port(0, ("gatewayPort = 18090",)) == 18090
