"""Transactional messages end to end (issue 6, SPEC §9): the SDK's TransactionProducer against a
real nameserver and broker, consumed by real consumer groups.

One cluster for the module, with short transaction timings (a half message is due for its
first check 1 s after its birth; the check service looks every 300 ms; at most 15 checks).
Every test has its own topic and producer group, so their half messages and check-backs do
not meet. Delivery is judged by two push consumer groups and by the store itself (raw pulls of
every queue of the real topic): a committed message is stored and delivered exactly once to
each group, a rolled-back one never, whatever happens in between (see
:mod:`tests.integration.transaction_support` for the plans a listener plays).

Failover cases (a producer killed after its half message, broker restarts) are in
``test_transaction_failover.py``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import LocalTransactionState, TransactionProducer
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2
from rocketq.client.producer import ProducerConfig
from rocketq.codec import Prop, SysFlag
from rocketq.message import Message
from tests.integration.transaction_support import (
    COMMITTED_PLANS,
    TX_BROKER_KEYS,
    TX_CHECK_INTERVAL_MS,
    TX_TIMEOUT_MS,
    Deliveries,
    PlannedListener,
    consuming,
    create_topic,
    half_messages,
    log_alarms,
    pending_bodies,
    stored_bodies,
    stored_messages,
    wait_no_pending,
)
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

CHECK_MAX = 15
"""transactionCheckMax left at its default."""
DELIVERY_TIMEOUT_S = 20.0
MIXED_COUNT = 120
MIXED_CONCURRENCY = 16
QUIET_S = TX_TIMEOUT_MS / 1000 + 4 * TX_CHECK_INTERVAL_MS / 1000
"""How long "never delivered" is watched: past the timeout and a few check rounds."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("transactions")
    with cluster(tmp, broker_keys=TX_BROKER_KEYS) as c:
        yield c
        broker = c.brokers[0]
        assert broker.alive(), f"the broker died:\n{broker.log_tail()}"
        alarms = log_alarms(broker.log_path.read_text(errors="replace"))
        assert not alarms, f"the broker logged {alarms[:3]}:\n{broker.log_tail(80)}"


def producer(c: Cluster, group: str, listener: PlannedListener) -> TransactionProducer:
    return TransactionProducer(ProducerConfig(group, c.namesrv_addrs), listener)


async def send_planned(
    p: TransactionProducer, listener: PlannedListener, topic: str, body: str, plan: str
) -> str:
    """Send one transactional message playing ``plan``; returns its transaction id."""
    listener.plan(body, plan)
    result = await p.send_message_in_transaction(Message(topic, body.encode()))
    assert result.transaction_id, result
    return str(result.transaction_id)


# ---- 1. commit ------------------------------------------------------------------------------
async def test_commit_reaches_each_group_exactly_once(env: Cluster) -> None:
    topic, broker = "TxCommit", env.brokers[0].addr

    await create_topic(env.namesrv_addrs, topic)
    listener = PlannedListener()
    g1, g2 = Deliveries("tx-commit-g1"), Deliveries("tx-commit-g2")
    async with (
        consuming(env.namesrv_addrs, g1.group, topic, g1),
        consuming(env.namesrv_addrs, g2.group, topic, g2),
        producer(env, "tx-commit-pg", listener) as p,
    ):
        listener.plan("c0", "commit")
        result = await p.send_message_in_transaction(Message(topic, b"c0", tags="t"))
        assert result.local_state is LocalTransactionState.COMMIT_MESSAGE
        assert result.transaction_id
        bodies = [f"c{i}" for i in range(1, 10)]
        for body in bodies:
            await send_planned(p, listener, topic, body, "commit")
        everything = ["c0", *bodies]
        for d in (g1, g2):
            await d.wait_for(everything, DELIVERY_TIMEOUT_S)
        await asyncio.sleep(QUIET_S)
    for d in (g1, g2):
        assert d.snapshot() == dict.fromkeys(everything, 1), d.snapshot()
    first = g1.first["c0"]
    assert first.topic == topic and first.tags == "t"
    assert first.msg_id == result.transaction_id, "the committed copy keeps the UNIQ_KEY"
    assert first.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_COMMIT
    assert first.properties.get(Prop.PRODUCER_GROUP) == "tx-commit-pg"
    assert Prop.REAL_TOPIC not in first.properties
    assert (await stored_bodies(broker, topic)) == dict.fromkeys(everything, 1)
    assert not listener.checks, "a transaction committed at once was checked"
    assert not (await pending_bodies(broker, topic))


# ---- 2. rollback ----------------------------------------------------------------------------
async def test_rollback_is_never_delivered(env: Cluster) -> None:
    topic, broker = "TxRollback", env.brokers[0].addr

    await create_topic(env.namesrv_addrs, topic)
    listener = PlannedListener()
    g1, g2 = Deliveries("tx-rollback-g1"), Deliveries("tx-rollback-g2")
    async with (
        consuming(env.namesrv_addrs, g1.group, topic, g1),
        consuming(env.namesrv_addrs, g2.group, topic, g2),
        producer(env, "tx-rollback-pg", listener) as p,
    ):
        listener.plan("r0", "rollback")
        result = await p.send_message_in_transaction(Message(topic, b"r0"))
        assert result.local_state is LocalTransactionState.ROLLBACK_MESSAGE
        for i in range(1, 5):
            await send_planned(p, listener, topic, f"r{i}", "rollback")
        # a committed marker after them: once it arrives, earlier queue positions are past
        await send_planned(p, listener, topic, "marker", "commit")
        for d in (g1, g2):
            await d.wait_for(["marker"], DELIVERY_TIMEOUT_S)
        await asyncio.sleep(QUIET_S)  # past the timeout and several check rounds
    for d in (g1, g2):
        assert d.snapshot() == {"marker": 1}, d.snapshot()
    assert (await stored_bodies(broker, topic)) == {"marker": 1}
    assert not listener.checks, "a rolled-back transaction was checked"
    assert not (await pending_bodies(broker, topic))


# ---- 3. UNKNOW, then a check, then commit ----------------------------------------------------
async def test_unknown_then_check_then_commit(env: Cluster) -> None:
    topic, broker = "TxUnknownCommit", env.brokers[0].addr

    await create_topic(env.namesrv_addrs, topic)
    listener = PlannedListener()
    g1, g2 = Deliveries("tx-unknown-g1"), Deliveries("tx-unknown-g2")
    async with (
        consuming(env.namesrv_addrs, g1.group, topic, g1),
        consuming(env.namesrv_addrs, g2.group, topic, g2),
        producer(env, "tx-unknown-pg", listener) as p,
    ):
        listener.plan("u0", "unknown-commit")
        sent_at = time.monotonic()
        result = await p.send_message_in_transaction(Message(topic, b"u0", keys="k-u0"))
        assert result.local_state is LocalTransactionState.UNKNOW
        pending = await pending_bodies(broker, topic)
        assert "u0" in pending, f"the UNKNOW half message is not listed: {pending}"
        for d in (g1, g2):
            await d.wait_for(["u0"], DELIVERY_TIMEOUT_S)
        await asyncio.sleep(QUIET_S)
    checks = listener.checks_of("u0")
    assert checks, "delivered without any check"
    first = checks[0]
    assert first.answer is LocalTransactionState.COMMIT_MESSAGE
    assert first.msg_id == result.transaction_id
    assert first.topic == topic, "the check presents the real topic"
    assert first.at_s - sent_at >= TX_TIMEOUT_MS / 1000 * 0.9, (
        f"checked {first.at_s - sent_at:.2f} s after the send, before transactionTimeout"
    )
    for d in (g1, g2):
        assert d.snapshot() == {"u0": 1}, d.snapshot()
        assert d.first_at_s["u0"] >= first.at_s, "delivered before the check committed it"
    assert (await stored_bodies(broker, topic)) == {"u0": 1}
    assert not (await pending_bodies(broker, topic))


# ---- 6. unanswered checks, then discard -------------------------------------------------------
async def test_unanswered_checks_end_in_discard(env: Cluster) -> None:
    topic, sp = "TxDiscard", env.brokers[0]

    await create_topic(env.namesrv_addrs, topic)
    listener = PlannedListener()
    g1 = Deliveries("tx-discard-g1")
    async with (
        consuming(env.namesrv_addrs, g1.group, topic, g1),
        producer(env, "tx-discard-pg", listener) as p,
    ):
        tid = await send_planned(p, listener, topic, "d0", "unknown")
        seen_counts: set[int] = set()

        async def discarded() -> bool:  # pending, its check count rising, until discarded
            pending = await pending_bodies(sp.addr, topic)
            if "d0" in pending:
                seen_counts.add(pending["d0"])
            return "d0" not in pending

        await until(discarded, "d0 discarded", timeout_s=30, interval_s=0.1)
        assert len(seen_counts) > 2, f"check_times never rose: {sorted(seen_counts)}"
        assert max(seen_counts) <= CHECK_MAX
        # a few more rounds: a discarded message is never checked again
        await asyncio.sleep(QUIET_S)
        checks = listener.checks_of("d0")
        assert len(checks) == CHECK_MAX, f"{len(checks)} checks, not {CHECK_MAX}"
        assert all(c.msg_id == tid for c in checks)
        await send_planned(p, listener, topic, "after", "commit")
        await g1.wait_for(["after"], DELIVERY_TIMEOUT_S)
    assert g1.snapshot() == {"after": 1}, "a discarded message was delivered"
    assert (await stored_bodies(sp.addr, topic)) == {"after": 1}
    lines = [
        line
        for line in sp.log_path.read_text(errors="replace").splitlines()
        if tid in line and '"level": "ERROR"' in line
    ]
    assert lines, f"no ERROR line names the discarded transaction {tid}:\n{sp.log_tail(40)}"


# ---- 7. a mixed load --------------------------------------------------------------------------
async def test_mixed_outcomes_under_two_groups(env: Cluster) -> None:
    topic, broker = "TxMixed", env.brokers[0].addr
    rng = random.Random(6)
    choices = ["commit", "rollback", "unknown-commit", "unknown-rollback", "unknown-x2-commit"]
    plans = {f"m{i}": rng.choice(choices) for i in range(MIXED_COUNT)}
    committed = sorted(b for b, plan in plans.items() if plan in COMMITTED_PLANS)

    await create_topic(env.namesrv_addrs, topic)
    listener = PlannedListener()
    g1, g2 = Deliveries("tx-mixed-g1"), Deliveries("tx-mixed-g2")
    async with (
        consuming(env.namesrv_addrs, g1.group, topic, g1),
        consuming(env.namesrv_addrs, g2.group, topic, g2),
        producer(env, "tx-mixed-pg", listener) as p,
    ):
        sem = asyncio.Semaphore(MIXED_CONCURRENCY)

        async def one(body: str) -> None:
            async with sem:
                await send_planned(p, listener, topic, body, plans[body])

        await asyncio.gather(*(one(b) for b in plans))
        for d in (g1, g2):
            await d.wait_for(committed, DELIVERY_TIMEOUT_S + 10)
        await wait_no_pending(broker, topic, timeout_s=20)
        await asyncio.sleep(QUIET_S)
    for d in (g1, g2):
        got = d.snapshot()
        assert set(got) == set(committed), (
            f"{d.group}: unexpected {sorted(set(got) - set(committed))[:8]}, "
            f"missing {sorted(set(committed) - set(got))[:8]}"
        )
        assert not d.duplicates(), f"{d.group}: duplicates {d.duplicates()}"
    assert (await stored_bodies(broker, topic)) == dict.fromkeys(committed, 1)
    for body, plan in plans.items():
        n = len(listener.checks_of(body))
        if plan in ("commit", "rollback"):
            assert n == 0, f"{body} ({plan}) was checked {n} times"
        else:
            assert n >= (2 if plan == "unknown-x2-commit" else 1), f"{body} ({plan}): {n}"


# ---- 8. delayed or batched transactional sends ------------------------------------------------
async def test_delayed_or_batched_transactional_sends_are_refused(env: Cluster) -> None:
    topic, broker = "TxRefused", env.brokers[0].addr

    await create_topic(env.namesrv_addrs, topic)
    listener = PlannedListener()
    async with producer(env, "tx-refused-pg", listener) as p:
        for delayed in (
            Message(topic, b"x", delay_level=2),
            Message(topic, b"x", delay_ms=5000),
            Message(topic, b"x", deliver_time_ms=int(time.time() * 1000) + 60_000),
        ):
            listener.plan("x", "commit")
            with pytest.raises(ValueError, match="delay"):
                await p.send_message_in_transaction(delayed)
        assert not hasattr(p, "send_batch"), "no batch API for transactional sends"
    assert not listener.executed, "a local transaction ran for a refused message"

    half = {Prop.TRANSACTION_PREPARED: "true", Prop.PRODUCER_GROUP: "tx-raw-pg"}
    cases = [
        ("delay level", 4, [{**half, Prop.DELAY_LEVEL: "2"}], "tx-raw-pg"),
        ("delay ms", 4, [{**half, Prop.TIMER_DELAY_MS: "5000"}], "tx-raw-pg"),
        ("batch via sys flag", 4, [half, half], "tx-raw-pg"),
        ("batch via TRAN_MSG", 0, [half, {}], "tx-raw-pg"),
        ("no producer group", 4, [half], ""),
    ]
    async with RawClient(broker) as raw:
        stub = raw.messaging
        for what, sys_flag, props, group in cases:
            request = messaging_pb2.SendRequest(
                producer_group=group,
                queue_id=0,
                sys_flag=sys_flag,
                messages=[
                    common_pb2.Message(topic=topic, body=b"raw", properties=pr) for pr in props
                ],
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Send(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                what,
                err.value.details(),
            )
            if what == "no producer group":
                assert "producer_group" in (err.value.details() or ""), err.value.details()
            elif what.startswith("delay"):
                assert "delay" in (err.value.details() or "").lower(), err.value.details()
            else:
                assert "batch" in (err.value.details() or "").lower(), err.value.details()
    assert not (await stored_messages(broker, topic)), "a refused message was stored"
    resp = await half_messages(broker, topic)
    assert resp.total == 0, resp
