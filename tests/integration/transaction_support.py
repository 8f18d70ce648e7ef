"""Helpers for the transaction system tests (issue 6): a planned listener, recording consumers,
and raw looks at what the broker stored.

A test decides up front what happens to each transactional message, by body:

| plan                  | execute_local_transaction | checks answer                        |
|-----------------------|---------------------------|--------------------------------------|
| ``commit``            | COMMIT_MESSAGE            | COMMIT_MESSAGE (if its end was lost) |
| ``rollback``          | ROLLBACK_MESSAGE          | ROLLBACK_MESSAGE (likewise)          |
| ``unknown-commit``    | UNKNOW                    | COMMIT_MESSAGE on the first check    |
| ``unknown-rollback``  | UNKNOW                    | ROLLBACK_MESSAGE on the first check  |
| ``unknown-x2-commit`` | UNKNOW                    | UNKNOW, then COMMIT_MESSAGE          |
| ``unknown``           | UNKNOW                    | UNKNOW for ever                      |

:class:`PlannedListener` plays that plan and notes every call (with the time, so a test can
say "not delivered before its first check"). Delivery is judged twice: by push consumers of
real consumer groups (:class:`Deliveries`, :func:`consuming`), and by :func:`stored_bodies`,
which pulls every queue of the real topic from offset 0 with raw gRPC — the store itself must
hold each committed message exactly once and no rolled-back one, whatever a consumer saw.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketq import LocalTransactionState
from rocketq._api.rocketq.v1 import admin_pb2, messaging_pb2
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.message import Message, ReceivedMessage, decode_records
from tests.integration.cluster import ServiceProcess, free_port, spawn
from tests.integration.timer_support import wait_assigned
from tests.support.cluster import wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

# Re-exported (the transaction failover test imports it from here).
__all__ = ["free_port"]

#: Short transaction timings for every test cluster: a half message is due for its first check
#: 1 s after it was born, and the check service looks every 300 ms.
TX_TIMEOUT_MS = 1000
TX_CHECK_INTERVAL_MS = 300
TX_BROKER_KEYS: dict[str, Any] = {
    "transactionTimeout": TX_TIMEOUT_MS,
    "transactionCheckInterval": TX_CHECK_INTERVAL_MS,
}
QUEUES = 4
FLAG_SUBSCRIPTION = 0x4
PULL_BATCH = 256
LOG_ALARMS = ("Traceback", "CRITICAL")

S = LocalTransactionState
PLANS: dict[str, tuple[LocalTransactionState, tuple[LocalTransactionState, ...]]] = {
    "commit": (S.COMMIT_MESSAGE, (S.COMMIT_MESSAGE,)),
    "rollback": (S.ROLLBACK_MESSAGE, (S.ROLLBACK_MESSAGE,)),
    "unknown-commit": (S.UNKNOW, (S.COMMIT_MESSAGE,)),
    "unknown-rollback": (S.UNKNOW, (S.ROLLBACK_MESSAGE,)),
    "unknown-x2-commit": (S.UNKNOW, (S.UNKNOW, S.COMMIT_MESSAGE)),
    "unknown": (S.UNKNOW, (S.UNKNOW,)),
}
COMMITTED_PLANS = frozenset({"commit", "unknown-commit", "unknown-x2-commit"})


@dataclass(frozen=True)
class Check:
    """One check-back as the listener saw it."""

    body: str
    msg_id: str
    topic: str
    """The message's real topic, as the broker presents it to the checker."""
    at_s: float
    """time.monotonic() of the call."""
    answer: LocalTransactionState


@dataclass
class PlannedListener:
    """A TransactionListener playing a plan per body (see the module table); thread-safe.

    ``before_end`` runs inside execute_local_transaction after the plan is looked up and before
    the answer is returned: the place where a test restarts the broker "between half message
    and end". ``gate`` holds every check answer that would resolve a transaction until it is
    set (before that, checks answer UNKNOW), so a test can keep a message pending.
    """

    plans: dict[str, str] = field(default_factory=dict)
    before_end: Callable[[str], None] | None = None
    gate: threading.Event | None = None
    executed: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def plan(self, body: str, plan: str) -> None:
        assert plan in PLANS, plan
        with self._lock:
            self.plans[body] = plan

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        body = message.body.decode()
        with self._lock:
            plan = self.plans[body]
            self.executed[body] = time.monotonic()
        if self.before_end is not None:
            self.before_end(body)
        return PLANS[plan][0]

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        body = message.body.decode()
        with self._lock:
            answers = PLANS[self.plans.get(body, "unknown")][1]
            seen = sum(1 for c in self.checks if c.body == body)
            answer = answers[min(seen, len(answers) - 1)]
            if self.gate is not None and not self.gate.is_set():
                answer = S.UNKNOW
            self.checks.append(Check(body, message.msg_id, message.topic, time.monotonic(), answer))
        return answer

    def checks_of(self, body: str) -> list[Check]:
        with self._lock:
            return [c for c in self.checks if c.body == body]


class Deliveries:
    """What one consumer group received: body -> times, and the first copy of each."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.counts: Counter[str] = Counter()
        self.first: dict[str, ReceivedMessage] = {}
        self.first_at_s: dict[str, float] = {}
        self._lock = threading.Lock()

    async def listener(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        now = time.monotonic()
        with self._lock:
            for m in msgs:
                body = m.body.decode()
                self.counts[body] += 1
                self.first.setdefault(body, m)
                self.first_at_s.setdefault(body, now)
        return ConsumeResult.CONSUME_SUCCESS

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def duplicates(self) -> dict[str, int]:
        return {b: n for b, n in self.snapshot().items() if n > 1}

    async def wait_for(self, bodies: Iterable[str], timeout_s: float) -> None:
        wanted = set(bodies)
        try:
            await until(lambda: wanted <= set(self.snapshot()), "every message", timeout_s)
        except AssertionError:
            missing = wanted - set(self.snapshot())
            raise AssertionError(
                f"group {self.group}: {len(missing)} of {len(wanted)} messages not delivered "
                f"within {timeout_s:.0f} s, e.g. {sorted(missing)[:8]}"
            ) from None


@contextlib.asynccontextmanager
async def consuming(
    namesrv_addrs: list[str], group: str, topic: str, deliveries: Deliveries
) -> AsyncIterator[PushConsumer]:
    """A push consumer of a new group reading ``topic`` from its first offset into
    ``deliveries``; yields once it owns every queue; closed on exit."""
    config = PushConsumerConfig(
        group,
        tuple(namesrv_addrs),
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        poll_name_server_interval_ms=500,
        rebalance_interval_ms=500,
    )
    consumer = PushConsumer(config, deliveries.listener)
    consumer.subscribe(topic, "*")
    await consumer.start()
    try:
        await wait_assigned(consumer, topic, QUEUES, timeout_s=20)
        yield consumer
    finally:
        await consumer.close()


async def create_topic(namesrv_addrs: list[str], topic: str, queues: int = QUEUES) -> None:
    """Create ``topic`` on the cluster's brokers and wait until the nameserver routes it."""
    async with Admin(namesrv_addrs) as admin:
        results = await admin.create_topic(TopicConfig(topic, queues, queues))
        assert all(r.ok for r in results), results
    await wait_routed(namesrv_addrs, topic, queues)


async def stored_messages(
    broker_addr: str, topic: str, queues: int = QUEUES
) -> list[ReceivedMessage]:
    """Every message the broker holds in ``topic`` (all queues, from offset 0), raw pulls."""
    out: list[ReceivedMessage] = []
    async with RawClient(broker_addr) as c:
        stub = c.messaging
        for qid in range(queues):
            offset = 0
            while True:
                resp = await stub.Pull(
                    messaging_pb2.PullRequest(
                        consumer_group="tx-store-audit",
                        topic=topic,
                        queue_id=qid,
                        queue_offset=offset,
                        max_msg_nums=PULL_BATCH,
                        sys_flag=FLAG_SUBSCRIPTION,
                        subscription="*",
                    ),
                    timeout=15,
                )
                if resp.status != messaging_pb2.FOUND:
                    break
                out += decode_records(resp.records)
                offset = resp.next_begin_offset
    return out


async def stored_bodies(broker_addr: str, topic: str, queues: int = QUEUES) -> Counter[str]:
    """Body -> stored copies in ``topic``."""
    return Counter(m.body.decode() for m in await stored_messages(broker_addr, topic, queues))


async def half_messages(
    broker_addr: str, topic: str = "", max_num: int = 1000
) -> admin_pb2.ListHalfMessagesResponse:
    """Admin.ListHalfMessages over a raw stub."""
    async with RawClient(broker_addr) as c:
        resp: admin_pb2.ListHalfMessagesResponse = await c.admin.ListHalfMessages(
            admin_pb2.ListHalfMessagesRequest(topic=topic, max_num=max_num), timeout=15
        )
        return resp


async def pending_bodies(broker_addr: str, topic: str) -> dict[str, int]:
    """Body -> check times of the half messages of ``topic`` still pending."""
    resp = await half_messages(broker_addr, topic)
    return {h.message.message.body.decode(): h.check_times for h in resp.messages}


async def wait_no_pending(broker_addr: str, topic: str, timeout_s: float) -> None:
    """Wait until ListHalfMessages shows nothing pending for ``topic``."""
    pending: dict[str, int] = {}

    async def none_pending() -> bool:
        nonlocal pending
        pending = await pending_bodies(broker_addr, topic)
        return not pending

    try:
        await until(none_pending, f"no half message of {topic} pending", timeout_s, 0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {dict(list(pending.items())[:8])}") from None


def log_alarms(text: str) -> list[str]:
    """Lines of a service log that mean it hit a bug."""
    return [line for line in text.splitlines() if any(a in line for a in LOG_ALARMS)]


# ---- producer worker processes ---------------------------------------------------------------
WORKER_MODULE = "tests.integration.workers.transaction_worker"


@dataclass
class Worker:
    """A transactional producer process (:mod:`tests.integration.workers.transaction_worker`)
    and the events it journals."""

    sp: ServiceProcess
    events_path: Path

    def events(self) -> list[dict[str, object]]:
        try:
            text = self.events_path.read_text()
        except OSError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def has(self, ev: str, body: str | None = None) -> bool:
        return any(e["ev"] == ev and (body is None or e.get("body") == body) for e in self.events())

    def sent_bodies(self) -> set[str]:
        return {str(e["body"]) for e in self.events() if e["ev"] == "sent"}

    def checked_bodies(self) -> set[str]:
        return {str(e["body"]) for e in self.events() if e["ev"] == "check"}


def start_worker(
    root: Path, namesrv: str, name: str, group: str, topic: str, plan: str, check_answer: str
) -> Worker:
    """A producer process of ``group``: one transaction per ``plan`` entry (none for an empty
    plan), every check answered ``check_answer``; its files under ``root/name``."""
    events = root / f"{name}.events"
    args = ["--namesrv", namesrv, "--group", group, "--topic", topic, "--prefix", name]
    args += ["--plan", plan, "--check-answer", check_answer, "--events", str(events)]
    return Worker(spawn(name, WORKER_MODULE, args, root / name), events)
