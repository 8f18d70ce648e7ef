"""Replication benchmark (issue 7): what a slave costs the producer, and how far it lags.

    python -m tools.bench.replication_bench [--quick] [--duration S] [--clients N]
        [--setups "no slave,sync + 1"] [--rounds R] [--lag-duration 0] [--loads "lone 200B"]
        [--set haSmallChunksInFlightMax=0 ...] [--cold-memory]

For each of three setups, started fresh on loopback ports with data in a temporary directory
(a nameserver, a master ``broker-a`` and, in the last two, its slave ``brokerId=1``):

| setup        | master role   | slave |
|--------------|---------------|-------|
| no slave     | ASYNC_MASTER  | -     |
| async + 1    | ASYNC_MASTER  | 1     |
| sync + 1     | SYNC_MASTER   | 1     |

it measures produce throughput with the same four loads - batches of 32 x 200 B (16 calls in
flight), single 200 B sends (64 in flight), one lone sender (one 200 B send at a time, whose
latency is what replication adds to a send) and the SDK's batches (128 x 1 KiB encoded once
as records, SendRequest.records, 8 calls in flight: issue 16's produce load) - as msgs/s,
call latency p50/p99 and the ratio to the no-slave setup (RocketMQ reports sync double write
about 10 % slower), counting any send that is not SEND_OK. Then, with ASYNC_MASTER + 1 slave,
it produces batches at a fixed rate of 50 000 msgs/s (``--rate``) and samples the master's
GetRuntimeStats every 0.5 s: the slave's lag in bytes and seconds (SlaveStats.lag_bytes /
lag_seconds). When the machine cannot sustain that rate the line says so and gives the rate
actually produced.

Senders are raw gRPC Send calls (no SDK routing), from ``--clients`` processes (default 1), so
the numbers are the broker's; on a small shared machine the client, master and slave compete
for the same cores and the ratios say more than the absolute rates. Prints, never asserts.
``--quick`` (3 s per load, 8 s of lag sampling) finishes in about a minute. Each line also gives
the master's and the slave's CPU per acknowledged message (/proc), which a loaded machine
disturbs far less than throughput; ``--rounds`` interleaves the setups and reports medians.
The client's CPU (this process and its sender processes) is counted too, and the total: when
client, master and slave share a small machine, throughput follows the total CPU per message,
so the no-slave total over a setup's total ("CPU ratio") is the throughput ratio a CPU-bound
run can reach. Last on the line, the master's event-loop thread: the share of the run it spent
on a CPU, and waiting in the run queue for one (schedstat) - what the other processes on the
same cores cost the loop every producer waits on.

Before each setup starts, free memory about the size of what the run will write is touched and
released (``_page_memory.prepare``): on a VM whose host backs memory lazily, the first write to a
page costs several times a warm one, a slave writes every byte a second time, and without it
the ratio would depend on which setup ran on colder memory. ``--cold-memory`` skips it; the
cost of a new page-cache page is printed at the start and before each setup either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.queues import Queue as MpQueue
from pathlib import Path

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from rocketq.message import new_unique_ids
from services.common import supervisor
from services.common.supervisor import Process, StopTimeout
from tools.bench import _page_memory
from tools.bench._process_cpu import cpu_s

TOPIC = "ReplicationBench"
QUEUES = 8
BODY_BYTES = 200
BATCH_SIZE = 32
BATCH_IN_FLIGHT = 16
SINGLE_IN_FLIGHT = 64
LONE_IN_FLIGHT = 1
LAG_SAMPLE_INTERVAL_S = 0.5
PACED_IN_FLIGHT_MAX = 64
"""Paced batches in flight at most; beyond it the rate is what the machine sustains."""


# ---- processes -----------------------------------------------------------------------------


def stop(proc: Process) -> None:
    with contextlib.suppress(StopTimeout):
        proc.stop(timeout_s=20)


def broker_args(store: Path, namesrv: str, **keys: object) -> list[str]:
    base: dict[str, object] = {
        "brokerName": "broker-a",
        "listenAddress": "127.0.0.1",
        "listenPort": 0,
        "gatewayPort": 0,  # master and slave on one host: the default 8081 would clash
        "brokerIP1": "127.0.0.1",
        "namesrvAddr": namesrv,
        "storePathRootDir": store,
        "mappedFileSizeCommitLog": 64 * 1024 * 1024,
        "registerNameServerPeriod": 2000,
        "slaveSyncConfigInterval": 1000,
    }
    base.update(keys)
    out: list[str] = []
    for key, value in base.items():
        out += ["--set", f"{key}={value}"]
    return out


@dataclass
class Setup:
    """One fresh nameserver + master (+ slave)."""

    label: str
    role: str
    slave: bool
    keys: dict[str, str] = field(default_factory=dict)
    """Broker config keys (``--set``) for master and slave alike."""
    procs: list[Process] = field(default_factory=list)

    @property
    def master(self) -> str:
        return self.procs[1].addr

    def start(self, base: Path) -> None:
        ns = supervisor.spawn(
            "namesrv", "services.nameserver", ["--listen", "127.0.0.1:0"], base / "ns"
        )
        self.procs.append(ns)
        args = broker_args(base / "master" / "store", ns.addr, brokerRole=self.role, **self.keys)
        self.procs.append(supervisor.spawn("master", "services.broker", args, base / "master"))
        if self.slave:
            args = broker_args(
                base / "slave" / "store", ns.addr, brokerId=1, brokerRole="SLAVE", **self.keys
            )
            self.procs.append(supervisor.spawn("slave", "services.broker", args, base / "slave"))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)


async def prepare(setup: Setup) -> None:
    """Create the topic; with a slave, wait until it is connected and in sync."""
    async with grpc.aio.insecure_channel(setup.master) as ch:
        await admin_pb2_grpc.AdminStub(ch).CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6
                ),
            ),
            timeout=10,
        )
        if not setup.slave:
            return
        deadline = time.monotonic() + 30
        while True:
            stats = await admin_pb2_grpc.AdminStub(ch).GetRuntimeStats(
                admin_pb2.GetRuntimeStatsRequest(), timeout=5
            )
            if stats.slaves and all(s.in_sync for s in stats.slaves):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the slave did not get in sync within 30 s")
            await asyncio.sleep(0.2)


# ---- load ----------------------------------------------------------------------------------


@dataclass
class LoadResult:
    messages: int = 0
    not_ok: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    """Server CPU (user + system) per acknowledged message, by process (master, slave)."""
    master_loop: tuple[float, float] | None = None
    """Shares of the run's wall time the master's event-loop thread spent on a CPU and
    waiting in the run queue for one (None where /proc has no schedstat)."""

    def merge(self, other: LoadResult) -> None:
        self.messages += other.messages
        self.not_ok += other.not_ok
        self.errors += other.errors
        self.latencies_s += other.latencies_s
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s else 0.0

    def pct_ms(self, q: float) -> float:
        if not self.latencies_s:
            return 0.0
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Load:
    """One closed load: ``in_flight`` calls of ``batch`` messages of ``body_bytes`` each."""

    name: str
    batch: int
    in_flight: int
    body_bytes: int = BODY_BYTES
    records: bool = False
    """Sent as the SDK's ``send_batch`` sends them: records encoded once (SendRequest.records)
    rather than a protobuf ``Message`` each."""


BATCH_LOAD = Load("batch 32x200B", BATCH_SIZE, BATCH_IN_FLIGHT)
"""Also what the lag run sends, at its fixed rate."""
LOADS = (
    BATCH_LOAD,
    Load("single 200B", 1, SINGLE_IN_FLIGHT),
    Load("lone 200B", 1, LONE_IN_FLIGHT),
    Load("SDK batch 128x1KiB", 128, 8, 1024, records=True),
)


def _request(n: int, load: Load) -> messaging_pb2.SendRequest:
    """A request of ``load``'s messages; records each carry a UNIQ_KEY, as the SDK's do."""
    body = b"b" * load.body_bytes
    req = messaging_pb2.SendRequest(
        producer_group="replication-bench",
        queue_id=n % QUEUES,
        born_timestamp_ms=int(time.time() * 1000),
    )
    if load.records:
        ids = new_unique_ids(load.batch)
        props = [codec.encode_properties({codec.Prop.UNIQ_KEY: u}) for u in ids]
        req.records = codec.encode_sent_batch(
            TOPIC.encode(), [(body, p, 0) for p in props], req.born_timestamp_ms
        )
        req.compact_response = True
    else:
        req.messages.extend(common_pb2.Message(topic=TOPIC, body=body) for _ in range(load.batch))
    return req


async def _one(stub: messaging_pb2_grpc.MessagingStub, n: int, load: Load, out: LoadResult) -> None:
    t0 = time.monotonic()
    try:
        resp = await stub.Send(_request(n, load), timeout=10)
    except grpc.aio.AioRpcError:
        out.errors += 1
        return
    out.latencies_s.append(time.monotonic() - t0)
    if resp.HasField("batch"):  # compact_response: one status for the whole batch
        count = len(resp.batch.physical_offsets)
        out.messages += count
        out.not_ok += count if resp.batch.status != messaging_pb2.SEND_OK else 0
        return
    out.messages += len(resp.results)
    out.not_ok += sum(1 for r in resp.results if r.status != messaging_pb2.SEND_OK)


async def closed_loop(addr: str, load: Load, in_flight: int, duration_s: float) -> LoadResult:
    """``in_flight`` senders, each sending back to back for ``duration_s``."""
    out = LoadResult()
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        start = time.monotonic()
        end = start + duration_s

        async def worker(w: int) -> None:
            n = w
            while time.monotonic() < end:
                await _one(stub, n, load, out)
                n += in_flight

        await asyncio.gather(*(worker(w) for w in range(in_flight)))
        out.elapsed_s = time.monotonic() - start
    return out


def _closed_loop_proc(
    addr: str, load: Load, in_flight: int, duration_s: float, q: MpQueue[LoadResult]
) -> None:
    q.put(asyncio.run(closed_loop(addr, load, in_flight, duration_s)))


def run_load(addr: str, load: Load, duration_s: float, clients: int) -> LoadResult:
    """``load`` from ``clients`` processes (in this one when 1; a lone sender stays alone)."""
    in_flight = load.in_flight
    if clients <= 1 or in_flight <= 1:
        return asyncio.run(closed_loop(addr, load, in_flight, duration_s))
    ctx = mp.get_context("spawn")
    q: MpQueue[LoadResult] = ctx.Queue()
    per = max(1, in_flight // clients)
    workers = [
        ctx.Process(target=_closed_loop_proc, args=(addr, load, per, duration_s, q))
        for _ in range(clients)
    ]
    for w in workers:
        w.start()
    total = LoadResult()
    for _ in workers:
        total.merge(q.get(timeout=duration_s + 60))
    for w in workers:
        w.join(10)
    return total


# ---- paced load and lag --------------------------------------------------------------------


@dataclass
class LagResult:
    target_rate: float
    produced: LoadResult
    lag_bytes: list[int] = field(default_factory=list)
    lag_seconds: list[float] = field(default_factory=list)
    catch_up_s: float = 0.0


async def paced_with_lag(addr: str, rate: float, duration_s: float) -> LagResult:
    """Send batches of 32 at ``rate`` msgs/s (at most PACED_IN_FLIGHT_MAX in flight) while
    sampling the slave's lag; then time how long the slave takes to acknowledge the rest."""
    produced = LoadResult()
    result = LagResult(rate, produced)
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        admin = admin_pb2_grpc.AdminStub(ch)
        in_flight: set[asyncio.Task[None]] = set()
        batches_per_s = rate / BATCH_SIZE
        start = time.monotonic()
        next_sample = start
        issued = 0
        while (now := time.monotonic()) < start + duration_s:
            due = int((now - start) * batches_per_s) - issued
            while due > 0 and len(in_flight) < PACED_IN_FLIGHT_MAX:
                task = asyncio.create_task(_one(stub, issued, BATCH_LOAD, produced))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                issued += 1
                due -= 1
            if now >= next_sample:
                next_sample += LAG_SAMPLE_INTERVAL_S
                stats = await admin.GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest(), timeout=5)
                if stats.slaves:
                    result.lag_bytes.append(stats.slaves[0].lag_bytes)
                    result.lag_seconds.append(stats.slaves[0].lag_seconds)
            await asyncio.sleep(0.002)
        await asyncio.gather(*in_flight)
        produced.elapsed_s = time.monotonic() - start
        t_end = time.monotonic()
        while time.monotonic() - t_end < 60:
            stats = await admin.GetRuntimeStats(admin_pb2.GetRuntimeStatsRequest(), timeout=5)
            if stats.slaves and stats.slaves[0].lag_bytes == 0:
                break
            await asyncio.sleep(0.05)
        result.catch_up_s = time.monotonic() - t_end
    return result


# ---- report --------------------------------------------------------------------------------


def loop_sched_s(pid: int) -> tuple[float, float] | None:
    """Seconds process ``pid``'s main thread (a service's event loop) has spent on a CPU and
    runnable but waiting for one (/proc/PID/task/PID/schedstat); None without schedstat.

    With client, master and slave on two cores, the wait says how much of the master's
    throughput goes to sharing them: the master's loop is what a producer waits on."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except OSError:
        return None
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def client_cpu_s() -> float:
    """User + system CPU seconds of this process and its joined sender processes (with
    ``--clients`` > 1 that includes their interpreter start-up: about a second of CPU each)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _line(label: str, r: LoadResult, base: LoadResult | None) -> str:
    ratio = f"{r.rate / base.rate:5.2f}x" if base and base.rate else "  1.00x"
    extra = ""
    if r.not_ok or r.errors:
        extra = f"  ({r.not_ok} not SEND_OK, {r.errors} failed calls)"
    total = sum(r.cpu_us_per_msg.values())
    base_total = sum(base.cpu_us_per_msg.values()) if base else 0.0
    ceiling = f", CPU ratio {base_total / total:.2f}x" if base_total and total else ""
    return (
        f"  {label:<12} {r.rate:>10,.0f} msgs/s  {ratio} of no-slave   "
        f"p50 {r.pct_ms(0.5):6.2f} ms  p99 {r.pct_ms(0.99):7.2f} ms  cpu/msg "
        + " ".join(f"{who} {us:.1f} us" for who, us in r.cpu_us_per_msg.items())
        + f" (total {total:.1f} us{ceiling})"
        + (
            f"  master loop on-CPU {r.master_loop[0]:.0%} waiting {r.master_loop[1]:.0%}"
            if r.master_loop
            else ""
        )
        + extra
    )


def _lag_lines(lag: LagResult) -> list[str]:
    got = lag.produced.rate
    if got >= 0.95 * lag.target_rate:
        head = f"  produced {got:,.0f} msgs/s (target {lag.target_rate:,.0f} sustained)"
    else:
        head = (
            f"  produced {got:,.0f} msgs/s: the highest rate this machine sustained "
            f"(target {lag.target_rate:,.0f} NOT reached)"
        )
    lines = [head]
    if not lag.lag_bytes:
        return [*lines, "  no slave stats sampled (GetRuntimeStats listed no slave)"]
    lb, ls = lag.lag_bytes, lag.lag_seconds
    lines.append(
        f"  lag bytes   mean {statistics.fmean(lb):>12,.0f}  max {max(lb):>12,}  "
        f"({len(lb)} samples every {LAG_SAMPLE_INTERVAL_S} s)"
    )
    lines.append(f"  lag seconds mean {statistics.fmean(ls):>12.3f}  max {max(ls):>12.3f}")
    lines.append(f"  slave fully acknowledged {lag.catch_up_s:.2f} s after the last send")
    return lines


SETUP_LABELS = ("no slave", "async + 1", "sync + 1")


def _median(runs: list[LoadResult] | None) -> LoadResult | None:
    """The run with the median throughput (the first of two middles)."""
    if not runs:
        return None
    return sorted(runs, key=lambda r: r.rate)[(len(runs) - 1) // 2]


def _paired_ratios(runs: list[LoadResult], base: list[LoadResult]) -> list[float]:
    """Each round's throughput over the no-slave run of the same round (the setups of a round
    run back to back, so a pair shares the machine's state; drift between rounds, such as
    memory going cold, cancels out of each ratio)."""
    return [r.rate / b.rate for r, b in zip(runs, base, strict=False) if b.rate]


def run(
    duration_s: float,
    lag_duration_s: float,
    rate: float,
    clients: int,
    only: tuple[str, ...] = SETUP_LABELS,
    rounds: int = 1,
    loads: tuple[Load, ...] = LOADS,
    keys: dict[str, str] | None = None,
    warm_memory: bool = True,
) -> None:
    """``rounds`` > 1 interleaves the setups (no slave, sync + 1, no slave, ...) so a ratio
    compares runs made under the same machine load; the table shows each setup's median."""
    roles = {"no slave": ("ASYNC_MASTER", False), "async + 1": ("ASYNC_MASTER", True)}
    roles["sync + 1"] = ("SYNC_MASTER", True)
    keys = dict(keys or {})
    setups = [Setup(label, *roles[label], keys) for _ in range(rounds) for label in only]
    results: dict[str, dict[str, list[LoadResult]]] = {load.name: {} for load in loads}
    lag: LagResult | None = None
    print(f"loadavg at start: {os.getloadavg()[0]:.2f}, cores: {os.cpu_count()}", flush=True)
    print(f"a new page-cache page costs {_page_memory.probe_us_per_kib():.2f} us/KiB", flush=True)
    for setup in setups:
        print(" ", _page_memory.prepare(duration_s * len(loads), warm_memory=warm_memory))
        base = Path(tempfile.mkdtemp(prefix="rocketq-repl-bench-"))
        try:
            setup.start(base)
            asyncio.run(prepare(setup))
            for load in loads:
                name = load.name
                servers = {p.name: p.pid for p in setup.procs[1:]}
                cpu0 = {who: cpu_s(pid) for who, pid in servers.items()}
                client0 = client_cpu_s()
                loop0, wall0 = loop_sched_s(servers["master"]), time.monotonic()
                r = run_load(setup.master, load, duration_s, clients)
                r.cpu_us_per_msg["client"] = (client_cpu_s() - client0) * 1e6 / max(1, r.messages)
                for who, pid in servers.items():
                    used_s = cpu_s(pid) - cpu0[who]
                    r.cpu_us_per_msg[who] = used_s * 1e6 / max(1, r.messages)
                loop1, wall_s = loop_sched_s(servers["master"]), time.monotonic() - wall0
                if loop0 and loop1:
                    r.master_loop = ((loop1[0] - loop0[0]) / wall_s, (loop1[1] - loop0[1]) / wall_s)
                results[name].setdefault(setup.label, []).append(r)
                print(_line(setup.label, r, _median(results[name].get("no slave"))), f"[{name}]")
            if setup.label == "async + 1" and lag is None and lag_duration_s > 0:
                print(f"  lag at {rate:,.0f} msgs/s for {lag_duration_s:.0f} s ...", flush=True)
                lag = asyncio.run(paced_with_lag(setup.master, rate, lag_duration_s))
        finally:
            setup.stop()
            shutil.rmtree(base, ignore_errors=True)
    print()
    print("Produce throughput, ratio to no slave (RocketMQ: sync double write ~0.9x)")
    for name, runs_of in results.items():
        print(f" {name}")
        for label in SETUP_LABELS:
            if label in runs_of:
                runs = len(runs_of[label])
                mid = _median(runs_of[label])
                assert mid is not None
                line = _line(label, mid, _median(runs_of.get("no slave")))
                print(line, f"(median of {runs})" if runs > 1 else "")
                if label == "no slave":
                    continue
                paired = _paired_ratios(runs_of[label], runs_of.get("no slave", []))
                if len(paired) > 1:
                    print(
                        f"  {'':<12} round by round {' '.join(f'{x:.2f}x' for x in paired)}, "
                        f"median {statistics.median(paired):.2f}x"
                    )
    print(f"Replication lag, ASYNC_MASTER + 1 slave, batches of {BATCH_SIZE}")
    if lag is not None:
        for line in _lag_lines(lag):
            print(line)
    print(f"loadavg at end: {os.getloadavg()[0]:.2f}")


def main() -> None:
    supervisor.children_die_with_this_process()  # a killed bench leaves nothing running
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load")
    parser.add_argument("--lag-duration", type=float, default=20.0, help="seconds at the rate")
    parser.add_argument("--rate", type=float, default=50_000.0, help="msgs/s for the lag run")
    parser.add_argument("--clients", type=int, default=1, help="sender processes")
    parser.add_argument("--quick", action="store_true", help="3 s loads, 8 s lag run")
    parser.add_argument(
        "--setups", default=",".join(SETUP_LABELS), help="comma-separated setups to run"
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs of each setup")
    parser.add_argument(
        "--loads",
        default=",".join(load.name for load in LOADS),
        help="comma-separated loads to run",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker config key for master and slave (repeatable), e.g. haListenPort=-1",
    )
    parser.add_argument(
        "--cold-memory",
        action="store_true",
        help="do not warm free memory before each setup (see the module's notes)",
    )
    args = parser.parse_args()
    keys = dict(item.split("=", 1) for item in args.set if "=" in item)
    if len(keys) != len(args.set):
        parser.error("--set takes KEY=VALUE")
    if args.quick:
        args.duration, args.lag_duration = 3.0, 8.0
    only = tuple(label.strip() for label in args.setups.split(","))
    unknown = [label for label in only if label not in SETUP_LABELS]
    if unknown:
        parser.error(f"unknown setup(s) {unknown}; choose from {list(SETUP_LABELS)}")
    by_name = {load.name: load for load in LOADS}
    loads = tuple(by_name.get(name.strip()) for name in args.loads.split(","))
    if None in loads:
        parser.error(f"unknown load(s) in {args.loads!r}; choose from {list(by_name)}")
    chosen = tuple(load for load in loads if load is not None)
    run(
        args.duration,
        args.lag_duration,
        args.rate,
        args.clients,
        only,
        max(1, args.rounds),
        chosen,
        keys,
        warm_memory=not args.cold_memory,
    )


if __name__ == "__main__":
    main()
