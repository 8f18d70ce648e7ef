"""Orderly consumption under faults, against a real nameserver and broker (SPEC §6.15).

A producer sends 40 keys x 100 messages with the key as sharding key (ordered sync sends, one
task per key, paced over a few seconds so consumers see arrivals during rebalances). Three
orderly consumer processes (:mod:`tests.integration.workers.orderly_worker`, one with a
coroutine listener) consume an 8-queue topic, each call lasting a few ms. Once about a third is
consumed the busiest worker is SIGKILLed and a fourth joins: the dead worker's queues stay
locked on the broker until ``rebalanceLockMaxLiveTime`` (5 s here) runs out, while some queues of
the living move to the newcomer through a clean hand-over. When everything is consumed the
workers are stopped cleanly and their recorded history is checked
(:func:`tests.integration.history.check_history`): no two calls on one queue overlap in time,
each key's messages first appear in order with no gap, nothing is lost, and duplicates occur
only for messages the killed worker had taken.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2
from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.producer import Producer, ProducerConfig
from rocketq.message import Message, MessageQueue
from tests.integration.cluster import ServiceProcess, spawn
from tests.integration.history import (
    END,
    KEY_PROPERTY,
    SEQ_PROPERTY,
    check_history,
    load_histories,
)
from tests.support.cluster import Cluster, cluster, wait_routed
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "OrderlyFaults"
GROUP = "orderly-faults"
QUEUES = 8
KEYS = 40
PER_KEY = 100
PRODUCE_S = 3.0
"""Sends of one key are spread over about this long."""
CONSUME_MS = 8
KILL_AT_FRACTION = 0.3
CONSUME_WAIT_S = 40.0
BROKER_LOCK_MAX_LIVE_MS = 5000
WORKER_MODULE = "tests.integration.workers.orderly_worker"
BROKER = "broker-a"

HANDOVER_TOPIC = "OrderlyHandover"
HANDOVER_GROUP = "orderly-handover"
HANDOVER_QUEUES = 16
HANDOVER_PER_QUEUE = 2000
HANDOVER_WORKERS = 3
HANDOVER_CONSUME_MS = 0
HANDOVER_PULL_DELAY_MS = 50
"""Pulls reach the broker this late, so one is nearly always in flight when a queue moves."""
PRELOAD_BATCH = 250
FIRST_WORKERS = (("w1",), ("w2", "--async-listener"), ("w3",))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("orderly-faults")
    with cluster(tmp, broker_keys={"rebalanceLockMaxLiveTime": BROKER_LOCK_MAX_LIVE_MS}) as c:
        yield c


async def _create_topic(namesrv: list[str], topic: str, queues: int) -> None:
    async with Admin(namesrv) as admin:
        results = await admin.create_topic(TopicConfig(topic, queues, queues, order=True))
        assert all(r.ok for r in results), results
    await wait_routed(namesrv, topic, queues)


class BackgroundProducer:
    """Ordered sync sends in a thread of its own; records what the broker acknowledged."""

    def __init__(self, namesrv: list[str]) -> None:
        self.namesrv = namesrv
        self.sent: set[tuple[str, int]] = set()
        self.errors: list[str] = []
        self.queues_of_key: dict[str, set[int]] = {}
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"producer still sending after {timeout_s}s"
        assert not self.errors, f"sends failed: {self.errors[:5]}"

    async def _run(self) -> None:
        config = ProducerConfig(group="orderly-faults-producer", namesrv_addrs=self.namesrv)
        async with Producer(config) as producer:
            await asyncio.gather(*(self._key(producer, f"key{k:02d}") for k in range(KEYS)))

    async def _key(self, producer: Producer, key: str) -> None:
        pause_s = PRODUCE_S / PER_KEY
        for seq in range(PER_KEY):
            msg = Message(
                TOPIC,
                f"{key}/{seq}".encode(),
                keys=key,
                properties={KEY_PROPERTY: key, SEQ_PROPERTY: str(seq)},
            )
            try:
                result = await producer.send(msg, sharding_key=key)
            except Exception as exc:  # an ordered send is not retried; stop this key here
                self.errors.append(f"{key}/{seq}: {exc!r}")
                return
            self.sent.add((key, seq))
            self.queues_of_key.setdefault(key, set()).add(result.message_queue.queue_id)
            await asyncio.sleep(pause_s)


class Workers:
    """The orderly worker processes of the test and their history files."""

    def __init__(self, tmp_path: Path, c: Cluster, group: str, topic: str) -> None:
        self.tmp_path = tmp_path
        self.c = c
        self.group = group
        self.topic = topic
        self.procs: dict[str, ServiceProcess] = {}
        self.killed: dict[int, int] = {}

    def start(self, name: str, *extra: str) -> ServiceProcess:
        args = [
            "--namesrv",
            self.c.namesrv,
            "--group",
            self.group,
            "--topic",
            self.topic,
            "--history",
            str(self.history(name)),
            *extra,
        ]
        sp = spawn(name, WORKER_MODULE, args, self.tmp_path / name)
        self.procs[name] = sp
        return sp

    def history(self, name: str) -> Path:
        return self.tmp_path / f"{name}.history"

    def kill(self, name: str) -> None:
        sp = self.procs[name]
        sp.kill()  # SIGKILL and wait: afterwards it certainly runs no more
        self.killed[sp.pid] = time.monotonic_ns()

    def done_per_worker(self) -> Counter[str]:
        """Completed message deliveries per worker, from the history files so far."""
        out: Counter[str] = Counter()
        for name in self.procs:
            h = load_histories([self.history(name)])
            out[name] = sum(1 for e in h.events if e.ev == END)
        return out

    def has_consumed(self, name: str) -> bool:
        """Whether worker ``name`` completed a delivery yet."""
        return self.done_per_worker()[name] > 0

    def consumed(self) -> set[tuple[str, int]]:
        h = load_histories(self.history(n) for n in self.procs)
        return {(e.key, e.seq) for e in h.events if e.ev == END}

    def logs(self) -> str:
        return "\n".join(f"--- {n} log ---\n{sp.log_tail(25)}" for n, sp in self.procs.items())


async def _lock_table(addr: str, group: str) -> str:
    """Who holds which queue on the broker, for failure messages."""
    try:
        async with RawClient(addr) as raw:
            resp = await raw.admin.GetConsumerConnection(
                admin_pb2.GetConsumerConnectionRequest(consumer_group=group), timeout=5
            )
    except grpc.aio.AioRpcError as err:
        return f"(lock table unavailable: {err.code().name} {err.details()})"
    members = ", ".join(m.client_id for m in resp.connections)
    locks = ", ".join(f"{lk.queue_id}:{lk.client_id}" for lk in resp.locks)
    return f"members [{members}]; locks [{locks}]"


async def _wait_consumed(
    workers: Workers,
    want: int,
    sent: set[tuple[str, int]],
    timeout_s: float,
    what: str,
    queues_of_key: dict[str, set[int]] | None = None,
) -> None:
    """Wait until ``want`` distinct messages were consumed; fail with the progress otherwise."""
    try:
        await until(lambda: len(workers.consumed()) >= want, what, timeout_s, interval_s=0.2)
    except AssertionError:
        got = workers.consumed()
        by_key = Counter(k for k, _ in sent - got)
        key_queues = {k: sorted((queues_of_key or {}).get(k, ())) for k in dict(by_key)}
        lock_table = await _lock_table(workers.c.brokers[0].addr, workers.group)
        raise AssertionError(
            f"{what}: {len(got)}/{want} consumed after {timeout_s:.0f} s; per worker "
            f"{dict(workers.done_per_worker())}; missing per key (first 10) "
            f"{by_key.most_common(10)}; queues of the missing keys {key_queues}"
            f"\nbroker: {lock_table}\n{workers.logs()}"
        ) from None


def _stop_all(workers: Workers) -> None:
    for name, sp in workers.procs.items():
        if sp.alive():
            assert sp.stop() == 0, f"{name} did not exit cleanly\n{sp.log_tail()}"


def _kill_leftovers(workers: Workers) -> None:
    for sp in workers.procs.values():
        if sp.alive():
            sp.kill()


async def test_order_exclusivity_and_no_loss_across_kill_and_join(
    env: Cluster, tmp_path: Path
) -> None:
    t_begin = time.monotonic()
    await _create_topic(env.namesrv_addrs, TOPIC, QUEUES)
    workers = Workers(tmp_path, env, GROUP, TOPIC)
    producer = BackgroundProducer(env.namesrv_addrs)
    consume = ("--consume-ms", str(CONSUME_MS))
    try:
        producer.start()
        with ThreadPoolExecutor(3) as pool:  # each start waits for its ready file
            list(pool.map(lambda a: workers.start(*a, *consume), FIRST_WORKERS))
        share = int(KEYS * PER_KEY * KILL_AT_FRACTION)
        await _wait_consumed(
            workers, share, producer.sent, 30, "before kill", producer.queues_of_key
        )
        await until(lambda: all(workers.done_per_worker().values()), "every worker consumed", 20)

        victim = workers.done_per_worker().most_common(1)[0][0]
        workers.kill(victim)
        t_kill = time.monotonic()
        workers.start("w4", *consume)

        await asyncio.to_thread(producer.join, 30)
        await _wait_consumed(
            workers,
            len(producer.sent),
            producer.sent,
            CONSUME_WAIT_S,
            "after kill",
            producer.queues_of_key,
        )
        t_done = time.monotonic()
        _stop_all(workers)
    finally:
        _kill_leftovers(workers)

    history = load_histories(workers.history(n) for n in workers.procs)
    report = check_history(history, producer.sent, workers.killed)
    print(
        f"\nkilled {victim}; everything consumed {t_done - t_kill:.1f} s after the kill; "
        f"test ran {time.monotonic() - t_begin:.1f} s\n{report.summary()}"
    )
    report.assert_ok()
    assert report.consumed == len(producer.sent) == KEYS * PER_KEY
    # the fault really happened mid-stream: the victim left work that others finished
    victim_pid = workers.procs[victim].pid
    assert report.consumers[victim_pid].messages < KEYS * PER_KEY
    assert len([s for s in report.consumers.values() if s.messages]) >= 3
    assert report.consumers[workers.procs["w4"].pid].messages > 0, "w4 was given nothing"


async def _preload(namesrv: list[str], topic: str, per_queue: int) -> set[tuple[str, int]]:
    """``per_queue`` messages in every queue, key ``q{queue id}``, seq = queue offset."""
    sent: set[tuple[str, int]] = set()
    config = ProducerConfig(group="orderly-handover-loader", namesrv_addrs=namesrv)
    async with Producer(config) as producer:

        async def fill(queue_id: int) -> None:
            mq = MessageQueue(topic, BROKER, queue_id)
            key = f"q{queue_id:02d}"
            for first in range(0, per_queue, PRELOAD_BATCH):
                seqs = range(first, min(per_queue, first + PRELOAD_BATCH))
                msgs = [
                    Message(topic, b"x", properties={KEY_PROPERTY: key, SEQ_PROPERTY: str(s)})
                    for s in seqs
                ]
                await producer.send_batch(msgs, queue=mq)
                sent.update((key, s) for s in seqs)

        await asyncio.gather(*(fill(q) for q in range(HANDOVER_QUEUES)))
    return sent


async def test_clean_handovers_into_a_backlog_redeliver_nothing(
    env: Cluster, tmp_path: Path
) -> None:
    """Members join one by one while a backlog drains, their pulls slowed by 20 ms of latency:
    every queue that moves is handed over cleanly (offset persisted, then unlocked), so the new
    owner starts exactly where the old one stopped — no duplicate, no overlap, no gap. A pull
    still in flight at the hand-over carries an older commit offset; if the broker applied it
    after the persisted one, the group's offset would move back and the new owner would consume
    the difference again."""
    await _create_topic(env.namesrv_addrs, HANDOVER_TOPIC, HANDOVER_QUEUES)
    sent = await _preload(env.namesrv_addrs, HANDOVER_TOPIC, HANDOVER_PER_QUEUE)
    workers = Workers(tmp_path, env, HANDOVER_GROUP, HANDOVER_TOPIC)
    flags = (
        "--async-listener",
        "--consume-ms",
        str(HANDOVER_CONSUME_MS),
        "--pull-delay-ms",
        str(HANDOVER_PULL_DELAY_MS),
    )
    try:
        for n in range(HANDOVER_WORKERS):
            name = f"h{n + 1}"
            workers.start(name, *flags)
            await until(functools.partial(workers.has_consumed, name), f"{name} consumed", 20)
        await _wait_consumed(workers, len(sent), sent, CONSUME_WAIT_S, "handover backlog")
        _stop_all(workers)
    finally:
        _kill_leftovers(workers)
    report = check_history(load_histories(workers.history(n) for n in workers.procs), sent)
    print(f"\n{report.summary()}")
    report.assert_ok()
    assert report.duplicates == 0
