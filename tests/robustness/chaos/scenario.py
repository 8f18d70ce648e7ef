"""One chaos run, start to verdict: cluster, traffic, fault schedule, heal, drain, read-back.

:func:`run_scenario` does, in order:

1. start the cluster (:mod:`~tests.robustness.chaos.nodes`) and wait until ``broker-a`` has a
   master and a full in-sync set; create ``ChaosTopic`` (every group) and ``ChaosOrderly``
   (``broker-a``), 4 queues each, and wait until every replica knows them (config sync);
2. start the consumers (group ``chaos-concurrent`` on ChaosTopic, ``chaos-orderly`` orderly on
   ChaosOrderly) and the producers (:mod:`~tests.robustness.chaos.traffic`);
3. the fault phase: until ``duration_s`` is spent, the next fault (the configured list in
   order, cycling, or a seeded random pick with ``shuffle``), then a seeded pause, then wait
   for the cluster to settle (:meth:`ChaosCluster.wait_healthy`); each fault is journaled;
4. heal (resume, restart, remove partitions), stop the producers, drain: wait until each
   group got every acknowledged message of its topics (or ``drain_timeout_s``), stop the
   consumers;
5. read back every queue from the final masters (``stored`` events), wait until the slaves
   caught up, stop the brokers and compare each slave's commitlog with its master's;
6. validate (:mod:`~tests.robustness.chaos.validate`) and report
   (:mod:`~tests.robustness.chaos.report`).

Every process started is stopped or killed at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc
from tests.integration.cluster import ServiceProcess, reap_since, spawn, spawned_count
from tests.integration.replication_support import create_topics
from tests.robustness.chaos import readback, report
from tests.robustness.chaos.faults import FAULTS, FaultSkipped
from tests.robustness.chaos.model import Expectations, History, duplicate_bound
from tests.robustness.chaos.nodes import (
    COMMITLOG_FILE_BYTES,
    GROUP,
    ChaosCluster,
    ClusterConfig,
)
from tests.robustness.chaos.recorder import HISTORY_DIR, Recorder, journals, read_events
from tests.robustness.chaos.traffic import PERSIST_INTERVAL_MS
from tests.robustness.chaos.validate import Verdict, validate

log = logging.getLogger("chaos.scenario")

TOPIC = "ChaosTopic"
ORDERLY_TOPIC = "ChaosOrderly"
QUEUES = 4
GROUP_CONCURRENT = "chaos-concurrent"
GROUP_ORDERLY = "chaos-orderly"
CI_FAULTS = ("kill", "pause", "kill-slave", "namesrv", "timer", "etcd", "etcd-quorum",
             "partition", "etcd-partition")  # fmt: skip
"""The CI schedule, in this order (faults that cannot run here are skipped and said so)."""
STALENESS_MS = 3000
"""A new master's consumer offsets: a config sync (1 s) old, plus the sync's round trip and
the time the fault took to be noticed."""


@dataclass(frozen=True)
class ScenarioConfig:
    seed: int = 8
    duration_s: float = 100.0
    """Length of the fault phase (the run takes about this plus ~40 s of setup and drain)."""
    faults: tuple[str, ...] = CI_FAULTS
    shuffle: bool = False
    rate: float = 15.0
    """Messages per second per producer."""
    producers: int = 2
    concurrent_consumers: int = 2
    warmup_s: float = 5.0
    gap_s: tuple[float, float] = (1.0, 3.0)
    """Seeded pause between a fault's repair and the next fault."""
    settle_timeout_s: float = 30.0
    drain_timeout_s: float = 60.0
    delay_share: float = 0.05
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


@dataclass
class Run:
    """The state of a run the faults act on."""

    cfg: ScenarioConfig
    run_dir: Path
    cluster: ChaosCluster
    rec: Recorder
    lab: Any = None
    """A :class:`~tests.robustness.chaos.netns.NetLab` when nodes run in namespaces."""
    producers: list[ServiceProcess] = field(default_factory=list)
    consumers: list[ServiceProcess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        log.info("%s", text)
        self.notes.append(text)


@dataclass
class Outcome:
    verdict: Verdict
    run_dir: Path
    kept_at: Path | None
    summary: str
    wall_s: float


def run_scenario(cfg: ScenarioConfig, run_dir: Path, keep_dir: Path | None) -> Outcome:
    """Run the scenario in ``run_dir``; on failure its evidence is copied to ``keep_dir``."""
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    mark = spawned_count()
    rec = Recorder(run_dir / HISTORY_DIR / "faults.jsonl", "injector")
    run = Run(cfg, run_dir, ChaosCluster(run_dir, cfg.cluster), rec)
    extra: dict[str, list[str]] = {}
    try:
        _setup(run)
        _fault_phase(run)
        extra = _finish(run)
    except Exception as exc:
        extra.setdefault("run", []).append(f"the run itself failed: {type(exc).__name__}: {exc}")
        log.exception("chaos run failed")
    finally:
        for sp in run.producers + run.consumers:
            with contextlib.suppress(Exception):
                sp.kill()
        run.cluster.close()
        leaked = reap_since(mark)
        if leaked:
            run.note(f"killed leftover processes: {leaked}")
        rec.close()
    verdict = validate(History.from_events(read_events(journals(run_dir))), _expectations(run))
    for check, msgs in extra.items():
        for m in msgs:
            verdict.fail(check, m)
    wall_s = time.monotonic() - started
    kept, summary = report.finish(run_dir, verdict, keep_dir, cfg, run.notes, wall_s)
    return Outcome(verdict, run_dir, kept, summary, wall_s)


# ---- setup -----------------------------------------------------------------------------------


def _setup(run: Run) -> None:
    c = run.cluster
    c.start()
    run.lab = c.lab
    problem = c.wait_healthy(60)
    if problem:
        raise RuntimeError(f"the cluster never became healthy: {problem}")
    master = c.master_of(GROUP)
    assert master is not None
    asyncio.run(create_topics(c.dial(master.addr), GROUP, [TOPIC, ORDERLY_TOPIC], QUEUES))
    if run.cfg.cluster.static_group:
        static = c.master_of("broker-b")
        assert static is not None
        asyncio.run(create_topics(c.dial(static.addr), "broker-b", [TOPIC], QUEUES))
    _wait_topics_known(run, 30)
    cfg = run.cfg
    ns = ";".join(c.namesrv_addrs)
    for i in range(cfg.concurrent_consumers):
        run.consumers.append(_consumer(run, f"c{i}", GROUP_CONCURRENT, TOPIC, "concurrent", ns))
    run.consumers.append(_consumer(run, "o0", GROUP_ORDERLY, ORDERLY_TOPIC, "orderly", ns))
    for i in range(cfg.producers):
        args = ["producer", "--namesrv", ns, "--proc", f"p{i}", "--seed", str(cfg.seed)]
        args += ["--journal", str(run.run_dir / HISTORY_DIR / f"p{i}.jsonl")]
        args += ["--topic", TOPIC, "--orderly-topic", ORDERLY_TOPIC, "--rate", str(cfg.rate)]
        args += ["--delay-share", str(cfg.delay_share if cfg.cluster.timer else 0.0)]
        run.producers.append(_traffic(run, f"p{i}", args))
    run.note(f"traffic started: {cfg.producers} producers at {cfg.rate}/s each")


def _traffic(run: Run, name: str, args: list[str]) -> ServiceProcess:
    prefix = run.lab.prefix("clients") if run.lab is not None else None
    workdir = run.run_dir / "traffic"
    return spawn(name, "tests.robustness.chaos.traffic", args, workdir, None, prefix)


def _consumer(run: Run, name: str, group: str, topic: str, mode: str, ns: str) -> ServiceProcess:
    args = ["consumer", "--namesrv", ns, "--proc", name, "--group", group, "--topic", topic]
    args += ["--mode", mode, "--journal", str(run.run_dir / HISTORY_DIR / f"{name}.jsonl")]
    return _traffic(run, name, args)


def _wait_topics_known(run: Run, timeout_s: float) -> None:
    """Until every replica of every group answers GetMaxOffset for the topics (slaves learn
    them through config sync; a slave elected before that would refuse the topic)."""
    deadline = time.monotonic() + timeout_s
    for node in [n for g in run.cluster.groups for n in run.cluster.replicas(g)]:
        topics = [TOPIC, ORDERLY_TOPIC] if node.group == GROUP else [TOPIC]
        with grpc.insecure_channel(run.cluster.dial(node.addr)) as ch:
            stub = messaging_pb2_grpc.MessagingStub(ch)
            for topic in topics:
                while True:
                    try:
                        stub.GetMaxOffset(
                            messaging_pb2.GetMaxOffsetRequest(topic=topic, queue_id=0), timeout=2
                        )
                        break
                    except grpc.RpcError:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{node.name} never learned {topic}") from None
                        time.sleep(0.3)


# ---- faults ----------------------------------------------------------------------------------


def _fault_phase(run: Run) -> None:
    cfg = run.cfg
    rng = random.Random(cfg.seed)
    time.sleep(cfg.warmup_s)
    end = time.monotonic() + cfg.duration_s
    i = skipped_in_a_row = 0
    while time.monotonic() < end and cfg.faults and skipped_in_a_row < 2 * len(cfg.faults):
        name = rng.choice(cfg.faults) if cfg.shuffle else cfg.faults[i % len(cfg.faults)]
        i += 1
        try:
            result = FAULTS[name](run, rng)
        except FaultSkipped as why:
            run.note(f"fault {name} skipped: {why}")
            skipped_in_a_row += 1
            continue
        skipped_in_a_row = 0
        run.rec.record(
            "fault", kind=result.kind, target=result.target, group=result.group,
            t0=result.t0, t1=result.t1, note=result.note,
        )  # fmt: skip
        run.note(f"fault {result.kind} on {result.target} ({result.note})")
        time.sleep(rng.uniform(*cfg.gap_s))
        problem = run.cluster.wait_healthy(cfg.settle_timeout_s)
        if problem:
            run.note(f"not settled {cfg.settle_timeout_s:.0f} s after {result.kind}: {problem}")
            run.cluster.heal_processes()


# ---- heal, drain, read back ------------------------------------------------------------------


def _finish(run: Run) -> dict[str, list[str]]:
    failures: dict[str, list[str]] = {}
    if run.lab is not None:
        run.lab.heal()
    touched = run.cluster.heal_processes()
    if touched:
        run.note(f"healed: {touched}")
    problem = run.cluster.wait_healthy(run.cfg.settle_timeout_s * 2)
    if problem:
        failures.setdefault("heal", []).append(f"not healthy after healing: {problem}")
    for sp in run.producers:
        with contextlib.suppress(AssertionError):
            sp.stop(timeout_s=30)
    _drain(run)
    for sp in run.consumers:
        with contextlib.suppress(AssertionError):
            sp.stop(timeout_s=30)
    failures.setdefault("readback", []).extend(_read_back(run))
    failures.setdefault("replicas", []).extend(_check_replicas(run))
    return failures


def _pending(run_dir: Path) -> dict[str, int]:
    h = History.from_events(read_events(journals(run_dir)))
    acked = {s.id: s.topic for s in h.sends if s.acked}
    got: dict[str, set[str]] = {GROUP_CONCURRENT: set(), GROUP_ORDERLY: set()}
    for d in h.deliveries:
        got.setdefault(d.group, set()).add(d.id)
    topic_of = {GROUP_CONCURRENT: TOPIC, GROUP_ORDERLY: ORDERLY_TOPIC}
    return {
        g: sum(1 for i, t in acked.items() if t == topic_of[g] and i not in got[g])
        for g in topic_of
    }


def _drain(run: Run) -> None:
    deadline = time.monotonic() + run.cfg.drain_timeout_s
    pending = _pending(run.run_dir)
    while any(pending.values()) and time.monotonic() < deadline:
        time.sleep(1.0)
        pending = _pending(run.run_dir)
    run.note(f"drain: still missing {pending}" if any(pending.values()) else "drained")


def _read_back(run: Run) -> list[str]:
    problems: list[str] = []
    with Recorder(run.run_dir / HISTORY_DIR / "readback.jsonl", "readback") as rec:
        for group in run.cluster.groups:
            master = run.cluster.master_of(group)
            if master is None:
                problems.append(f"no master of {group} to read back from")
                continue
            topics = {TOPIC: QUEUES, **({ORDERLY_TOPIC: QUEUES} if group == GROUP else {})}
            addr = run.cluster.dial(master.addr)
            n, errs = readback.read_queues(addr, group, topics, rec)
            problems += errs
            run.note(f"read back {n} messages from {master.name}")
    return problems


def _check_replicas(run: Run) -> list[str]:
    """Wait until the slaves caught up, stop the group, compare commitlogs."""
    c = run.cluster
    master = c.master_of(GROUP)
    if master is None:
        return [f"no master of {GROUP} at the end"]
    deadline = time.monotonic() + 20
    stats = c.group_stats(GROUP)
    while time.monotonic() < deadline:
        stats = c.group_stats(GROUP)
        ends = {st.commitlog_max_offset for st in stats.values()}
        if len(stats) == len(c.replicas(GROUP)) and len(ends) == 1:
            break
        time.sleep(0.5)
    lag = {n: st.commitlog_max_offset for n, st in stats.items()}
    run.note(f"replica ends before stopping: {lag}")
    c.stop(c.replicas(GROUP))
    entries = {
        n: (n, c.nodes[n].store, st.commitlog_min_offset, st.commitlog_max_offset)
        for n, st in stats.items()
    }
    if master.name not in entries:
        return [f"the master {master.name} gave no stats at the end"]
    slaves = [e for n, e in entries.items() if n != master.name]
    return readback.replica_prefix_failures(entries[master.name], slaves, COMMITLOG_FILE_BYTES)


def _expectations(run: Run) -> Expectations:
    faults = sum(1 for n in run.notes if n.startswith("fault ") and "skipped" not in n)
    return expectations(run.cfg, faults)


def expectations(cfg: ScenarioConfig, faults: int) -> Expectations:
    """What a run of ``cfg`` with ``faults`` faults promises (the duplicate bound grows with
    the faults: each may replay a window of consumption, see :func:`duplicate_bound`)."""
    bound = duplicate_bound(
        rate_per_s=cfg.rate * cfg.producers,
        disruptions=faults,
        persist_interval_ms=PERSIST_INTERVAL_MS,
        staleness_ms=STALENESS_MS,
    )
    return Expectations(
        groups={GROUP_CONCURRENT: frozenset({TOPIC}), GROUP_ORDERLY: frozenset({ORDERLY_TOPIC})},
        orderly_groups=frozenset({GROUP_ORDERLY}),
        duplicates_max={GROUP_CONCURRENT: bound, GROUP_ORDERLY: bound},
        offset_staleness_ms=STALENESS_MS,
    )
