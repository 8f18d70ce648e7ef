"""Transactions across failures (issue 6, SPEC §9): a producer killed after its half message, and
the broker restarted (SIGTERM, or SIGKILL) between a half message and its end.

Each test gets its own nameserver and broker with short transaction timings (first check 1 s
after birth, a round every 300 ms, up to 200 checks). The broker listens on a port chosen up
front, so a restart brings it back on the address the producer stored its half messages at
(the SDK ends a transaction at that address). Consumer groups are started only once the
failures are over and read from the first offset: a broker SIGKILL may lose a consumer's
recent offset commits, and redelivery then is RocketMQ's at-least-once, not a transaction bug.
What must hold is in the store: each committed message exactly once in its topic, each
rolled-back one never, nothing left pending.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq import TransactionProducer
from rocketq.client.errors import RocketQError
from rocketq.client.producer import ProducerConfig
from rocketq.message import Message
from tests.integration.transaction_support import (
    TX_BROKER_KEYS,
    Deliveries,
    PlannedListener,
    Worker,
    consuming,
    create_topic,
    free_port,
    log_alarms,
    pending_bodies,
    stored_bodies,
    wait_no_pending,
)
from tests.integration.transaction_support import start_worker as start_tx_worker
from tests.support.cluster import Cluster, cluster
from tests.support.until import until

pytestmark = pytest.mark.integration

CHECK_MAX = 200
"""transactionCheckMax here: with a round every 300 ms, the default 15 would discard a message
checked while no producer of its group is up (a worker process starting on a loaded machine,
a broker restart) within about 5 s."""
DELIVERY_TIMEOUT_S = 20.0
QUIET_S = 2.5
"""After the last expected delivery, how long to watch for a duplicate or a rolled-back one."""


def restart_broker(c: Cluster, how: str) -> None:
    """Stop the broker (``term``: SIGTERM and wait; ``kill``: SIGKILL) and start it again on
    the same port and data."""
    old = c.broker
    if how == "kill":
        old.kill()
    else:
        assert old.stop() == 0, f"unclean broker shutdown:\n{old.log_tail()}"
    new = c.restart(old)
    assert new.addr == old.addr, (old.addr, new.addr)


@pytest.fixture
def txc(tmp_path: Path) -> Iterator[Cluster]:
    # A fixed port: a restarted broker comes back where producers and consumers look for it.
    keys = {"listenPort": free_port(), "transactionCheckMax": CHECK_MAX, **TX_BROKER_KEYS}
    with cluster(tmp_path, broker_keys=keys) as c:
        yield c
        assert c.broker.alive(), f"the broker died:\n{c.broker.log_tail()}"
        alarms = log_alarms(c.broker.log_path.read_text(errors="replace"))
        assert not alarms, f"the broker logged {alarms[:3]}:\n{c.broker.log_tail(80)}"


# ---- the worker processes ------------------------------------------------------------------
def start_worker(
    c: Cluster, name: str, group: str, topic: str, plan: str, check_answer: str
) -> Worker:
    return start_tx_worker(c.root, c.nameserver.addr, name, group, topic, plan, check_answer)


# ---- 4. the producer killed after its half message --------------------------------------------
async def test_killed_producer_second_instance_answers_the_check(txc: Cluster) -> None:
    topic, group = "TxKilledProducer", "tx-killed-pg"
    await create_topic(txc.namesrv_addrs, topic)
    # instance A: one UNKNOW transaction, then one it never ends (it hangs in the local
    # transaction after the half message is stored); it answers checks UNKNOW meanwhile
    a = start_worker(txc, "a", group, topic, "unknown,hang", "unknown")
    await until(lambda: a.has("sent", "a-0") and a.has("half", "a-1"), "a's two half messages", 20)
    a.sp.kill()
    pending = await pending_bodies(txc.broker.addr, topic)
    assert {"a-0", "a-1"} <= set(pending), f"the half messages are not pending: {pending}"

    g1, g2 = Deliveries("tx-killed-g1"), Deliveries("tx-killed-g2")
    async with (
        consuming(txc.namesrv_addrs, g1.group, topic, g1),
        consuming(txc.namesrv_addrs, g2.group, topic, g2),
    ):
        # instance B of the same group, another process: its own first transaction opens
        # its stream to the broker; it answers every check COMMIT
        b = start_worker(txc, "b", group, topic, "commit", "commit")
        for d in (g1, g2):
            await d.wait_for(["a-0", "a-1", "b-0"], DELIVERY_TIMEOUT_S)
        await wait_no_pending(txc.broker.addr, topic, timeout_s=10)
        await asyncio.sleep(QUIET_S)
        assert {"a-0", "a-1"} <= b.checked_bodies(), b.events()
        b.sp.stop()
    for d in (g1, g2):
        assert d.snapshot() == {"a-0": 1, "a-1": 1, "b-0": 1}, d.snapshot()
    assert (await stored_bodies(txc.broker.addr, topic)) == {"a-0": 1, "a-1": 1, "b-0": 1}


# ---- 5. the broker restarted between half message and end -------------------------------------
async def send_when_reachable(p: TransactionProducer, msg: Message, timeout_s: float = 15) -> None:
    """A transactional send right after a broker restart: the producer's channel may still be
    in its reconnect backoff, and a half send that fails (nothing stored, no local transaction
    run) is simply tried again."""

    async def sent() -> bool:
        try:
            await p.send_message_in_transaction(msg)
        except RocketQError:
            return False
        return True

    await until(sent, "a transactional send after the restart", timeout_s, interval_s=0.2)


@pytest.mark.parametrize("how", ["term", "kill"])
async def test_broker_restart_between_half_and_end(txc: Cluster, how: str) -> None:
    topic = f"TxRestart{how.capitalize()}"
    committed = ["p-commit", "e-commit"]

    async def produce() -> None:
        await create_topic(txc.namesrv_addrs, topic)
        gate = threading.Event()  # until the first restart, checks answer UNKNOW

        def restart_in_local_transaction(body: str) -> None:
            if body.startswith("e-"):
                restart_broker(txc, how)
                gate.set()

        listener = PlannedListener(before_end=restart_in_local_transaction, gate=gate)
        config = ProducerConfig(f"tx-restart-{how}-pg", txc.namesrv_addrs)
        async with TransactionProducer(config, listener) as p:
            # pending across the restarts, resolved by the check service afterwards
            for body, plan in (("p-commit", "unknown-commit"), ("p-rollback", "unknown-rollback")):
                listener.plan(body, plan)
                await p.send_message_in_transaction(Message(topic, body.encode()))
            # the broker goes down and comes back inside the local transaction: the end (or,
            # if it was lost, the check's answer) arrives at the restarted broker
            for body, plan in (("e-commit", "commit"), ("e-rollback", "rollback")):
                listener.plan(body, plan)
                await send_when_reachable(p, Message(topic, body.encode()))
            assert len(txc.replaced) == 2
            await wait_no_pending(txc.broker.addr, topic, timeout_s=20)

    async def consume() -> None:
        g1, g2 = Deliveries(f"tx-restart-{how}-g1"), Deliveries(f"tx-restart-{how}-g2")
        async with (
            consuming(txc.namesrv_addrs, g1.group, topic, g1),
            consuming(txc.namesrv_addrs, g2.group, topic, g2),
        ):
            for d in (g1, g2):
                await d.wait_for(committed, DELIVERY_TIMEOUT_S)
            await asyncio.sleep(QUIET_S)
        for d in (g1, g2):
            assert d.snapshot() == dict.fromkeys(committed, 1), d.snapshot()
        assert (await stored_bodies(txc.broker.addr, topic)) == dict.fromkeys(committed, 1)

    await produce()
    await consume()
    # one more restart: the resolved state comes back from the op topic, nothing is re-checked
    # or committed twice
    restart_broker(txc, how)
    # A deliberate quiet window: a re-check or second commit would land within it.
    await asyncio.sleep(QUIET_S)
    assert not await pending_bodies(txc.broker.addr, topic)
    assert (await stored_bodies(txc.broker.addr, topic)) == dict.fromkeys(committed, 1)
