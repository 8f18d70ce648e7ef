"""Who sent a message and what it is called: the caller's address from gRPC's peer string, the
offset message id's constant head, and UNIQ_KEYs for messages that arrive without one (the
send path's naming helpers, kept apart from its checks)."""

from __future__ import annotations

import calendar
import ipaddress
import os
import struct
import time
from collections.abc import Callable
from urllib.parse import unquote

from rocketq import codec
from rocketq.codec import HostAddress

_PORT = struct.Struct(">i")


def parse_peer(peer: str) -> HostAddress:
    """The caller's address from a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``).

    IPv4-mapped IPv6 addresses become IPv4; anything unparsable (a Unix socket) is localhost.
    """
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return codec.LOCALHOST
    try:
        addr = HostAddress.parse(unquote(rest))
    except ValueError:
        return codec.LOCALHOST
    if addr.is_v6:
        mapped = ipaddress.IPv6Address(addr.ip).ipv4_mapped
        if mapped is not None:
            return HostAddress(mapped.packed, addr.port)
    return addr


def offset_msg_id_prefix(host: HostAddress) -> str:
    """The constant head of every offset message id of one store host (IP + port, hex)."""
    return (host.ip + _PORT.pack(host.port)).hex().upper()


class UniqueIds:
    """UNIQ_KEYs for messages that arrive without one (RocketMQ clients always set it; generic
    gRPC callers may not).

    Same 16-byte layout as :func:`rocketq.message.new_unique_id` — IPv4 (4) | pid (2) |
    random (4) | ms since the month began (4) | counter (2) — but the constant head is hex-
    encoded once, so an id costs one f-string instead of a lock, a pack and a hex conversion.
    """

    def __init__(self, host: HostAddress) -> None:
        ip = host.ip if not host.is_v6 else host.ip[-4:]
        head = ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
        self._head = head.hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._month_end_ms = 0

    def factory(self, now_ms: int) -> Callable[[], str]:
        """A generator of ids stamped ``now_ms`` (one per request: the stamp is shared)."""
        if not self._month_start_ms <= now_ms < self._month_end_ms:
            t = time.gmtime(now_ms / 1000)
            self._month_start_ms = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)) * 1000
            nxt = (t.tm_year + t.tm_mon // 12, t.tm_mon % 12 + 1, 1, 0, 0, 0)
            self._month_end_ms = calendar.timegm(nxt) * 1000
        stamp = f"{self._head}{(now_ms - self._month_start_ms) & 0x7FFFFFFF:08X}"

        def next_id() -> str:
            self._counter = counter = (self._counter + 1) & 0xFFFF
            return f"{stamp}{counter:04X}"

        return next_id
