"""A standby producer resolves a crashed member's transactions (issue 15, part 1).

Process A of a producer group sends transactional messages whose local transaction answers
UNKNOW and is then SIGKILLed. Another member of the group that has sent nothing itself must be
asked about them: every started producer is known to every master of the cluster (RocketMQ's
producer heartbeats every broker of its route table from the start, the TBW102 template's
included). Without that, the broker has no live producer of the group to ask, and after
``transactionCheckMax`` checks the half messages are silently discarded.

Real processes: a nameserver and brokers with short transaction timings, producer A and the
standby B as worker processes (``tests.integration.workers.transaction_worker``); the scenario
where a master joins later uses an in-process standby with a short route poll.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rocketq import LocalTransactionState, TransactionProducer
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.errors import TopicNotFoundError
from rocketq.client.producer import ProducerConfig
from rocketq.message import Message, ReceivedMessage
from tests.integration.cluster import ServiceProcess, start_broker, start_nameserver
from tests.integration.transaction_support import (
    TX_BROKER_KEYS,
    Worker,
    create_topic,
    pending_bodies,
    start_worker,
    stored_bodies,
    wait_no_pending,
)
from tests.support.until import until

pytestmark = pytest.mark.integration

CHECK_MAX = 200
"""transactionCheckMax: high, so a half message is still pending (not discarded) for the whole
test whether or not a standby is ever asked."""
RESOLVE_TIMEOUT_S = 40.0
"""Generous: only a failing run waits it out (a loaded 2-core machine took 27 s once)."""


@dataclass
class TxCluster:
    root: Path
    namesrv: ServiceProcess
    brokers: list[ServiceProcess]

    def worker(self, name: str, group: str, topic: str, plan: str, answer: str) -> Worker:
        return start_worker(self.root, self.namesrv.addr, name, group, topic, plan, answer)

    def add_broker(self, name: str) -> ServiceProcess:
        broker = start_broker(
            self.root, [self.namesrv.addr], name, transactionCheckMax=CHECK_MAX, **TX_BROKER_KEYS
        )
        self.brokers.append(broker)
        return broker


@pytest.fixture
def txc(tmp_path: Path) -> Iterator[TxCluster]:
    namesrv = start_nameserver(tmp_path)
    c = TxCluster(tmp_path, namesrv, [])
    try:
        c.add_broker("broker-a")
        yield c
    finally:
        for sp in [*c.brokers, namesrv]:
            if sp.alive():
                with contextlib.suppress(AssertionError):
                    sp.stop(timeout_s=15)


async def crash_after_unknown(c: TxCluster, group: str, topic: str) -> list[str]:
    """Producer A: two transactions answered UNKNOW, then SIGKILL; their half messages pend."""
    a = c.worker("a", group, topic, "unknown,unknown", "unknown")
    bodies = ["a-0", "a-1"]
    await until(lambda: a.sent_bodies() >= set(bodies), "A's two transactions", RESOLVE_TIMEOUT_S)
    a.sp.kill()
    pending = await pending_bodies(c.brokers[0].addr, topic)
    assert set(bodies) <= set(pending), f"A's half messages are not pending: {pending}"
    return bodies


async def assert_resolved_by(c: TxCluster, topic: str, standby: Worker, bodies: list[str]) -> None:
    await until(
        lambda: standby.checked_bodies() >= set(bodies),
        "checks sent to the standby",
        RESOLVE_TIMEOUT_S,
    )
    await wait_no_pending(c.brokers[0].addr, topic, timeout_s=RESOLVE_TIMEOUT_S)
    assert await stored_bodies(c.brokers[0].addr, topic) == dict.fromkeys(bodies, 1)
    assert not standby.sent_bodies(), "the standby sent nothing of its own"


async def test_standby_started_before_the_crash_is_asked(txc: TxCluster) -> None:
    topic, group = "TxStandbyBefore", "tx-standby-before"
    await create_topic([txc.namesrv.addr], topic)
    b = txc.worker("b", group, topic, "", "commit")  # started, never sends
    bodies = await crash_after_unknown(txc, group, topic)
    await assert_resolved_by(txc, topic, b, bodies)


async def test_standby_started_after_the_crash_is_asked(txc: TxCluster) -> None:
    topic, group = "TxStandbyAfter", "tx-standby-after"
    await create_topic([txc.namesrv.addr], topic)
    bodies = await crash_after_unknown(txc, group, topic)
    b = txc.worker("b", group, topic, "", "commit")
    await assert_resolved_by(txc, topic, b, bodies)


class CommitChecks:
    """A standby's listener: never runs a transaction, commits every one it is asked about."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.checked: set[str] = set()

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        raise AssertionError("the standby sends nothing")

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        with self._lock:
            self.checked.add(message.body.decode())
        return LocalTransactionState.COMMIT_MESSAGE


async def test_standby_learns_a_master_that_joins_later(txc: TxCluster) -> None:
    topic, group = "TxStandbyJoin", "tx-standby-join"
    listener = CommitChecks()
    config = ProducerConfig(group, [txc.namesrv.addr], poll_name_server_interval_ms=500)
    async with TransactionProducer(config, listener) as standby:
        # broker-b joins after the standby started; the topic lives only there
        broker_b = txc.add_broker("broker-b")
        async with Admin([txc.namesrv.addr]) as admin:
            [created] = await admin.create_topic(TopicConfig(topic, 4, 4), broker="broker-b")
            assert created.ok, created

            async def routed() -> bool:
                with contextlib.suppress(TopicNotFoundError):
                    return bool((await admin.route(topic)).queues)
                return False

            await until(routed, f"the route of {topic}", RESOLVE_TIMEOUT_S)
        await until(
            lambda: broker_b.addr in standby.instance.stream_addrs(),
            "the standby's stream to the new master",
            RESOLVE_TIMEOUT_S,
        )
        a = txc.worker("a", group, topic, "unknown", "unknown")
        await until(lambda: a.sent_bodies() >= {"a-0"}, "A's transaction", RESOLVE_TIMEOUT_S)
        a.sp.kill()
        await until(lambda: "a-0" in listener.checked, "a check of a-0", RESOLVE_TIMEOUT_S)
        await wait_no_pending(broker_b.addr, topic, timeout_s=RESOLVE_TIMEOUT_S)
    assert await stored_bodies(broker_b.addr, topic) == {"a-0": 1}


async def test_declared_topics_have_routes_before_the_first_send(txc: TxCluster) -> None:
    topic = "TxDeclared"
    await create_topic([txc.namesrv.addr], topic)
    config = ProducerConfig("tx-declared", [txc.namesrv.addr])
    async with TransactionProducer(config, CommitChecks(), topics=[topic]) as p:
        route = p.instance.cached_route(topic)
        assert route is not None and "broker-a" in route.brokers
        assert txc.brokers[0].addr in p.instance.stream_addrs()
    with pytest.raises(TypeError, match="not one string"):
        TransactionProducer(config, CommitChecks(), topics=topic)
