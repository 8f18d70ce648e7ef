"""Reads that move past a group's master when it does not answer (a function of the Admin,
like ``_admin_messages.py``).

The nameserver lists a SIGKILLed master for up to 120 s, so a read that asks only "the master"
keeps failing while its slave holds every acknowledged message. :func:`read_members` asks the
group's members in order, master first, within the call's one timeout: a master that refuses
the connection gives way at once, one that hangs after half of the time left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from rocketq.client._admin_types import ReplicaFallback
from rocketq.client.errors import BrokerUnavailableError

if TYPE_CHECKING:
    from rocketq.client.admin import Admin

_T = TypeVar("_T")

Members = list[tuple[int, str]]
"""(broker id, address) of a group's live members, in the order a read tries them."""


async def read_members(
    admin: Admin, name: str, members: Members, call: Callable[[str, str], Awaitable[_T]]
) -> _T:
    """The first answer of ``call(name, addr)`` over ``members`` (master first), all within
    the admin's timeout; a member that is unreachable or silent gives way to the next. A
    slave's answer is noted in :attr:`Admin.replica_fallbacks`."""
    if not members:
        raise BrokerUnavailableError(f"broker group {name!r} has no live member")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + admin._timeout_s
    master_addr, master_error = dict(members).get(0, "(none registered)"), "not registered"
    for i, (broker_id, addr) in enumerate(members):
        left_s = max(0.0, deadline - loop.time())
        # a hung master must leave a slave time to answer: it gets half of what is left
        budget_s = left_s if i == len(members) - 1 else left_s / 2
        try:
            answer = await asyncio.wait_for(call(name, addr), budget_s)
        except (BrokerUnavailableError, TimeoutError) as exc:
            if i == len(members) - 1:
                raise
            if broker_id == 0:
                master_error = str(exc) or f"no answer within {budget_s:.1f} s"
            continue
        if broker_id != 0:
            admin.replica_fallbacks.append(
                ReplicaFallback(name, master_addr, master_error, addr, broker_id)
            )
        return answer
    raise AssertionError("unreachable: the last member's failure is raised")
