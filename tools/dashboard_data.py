"""The data behind the README's dashboard picture: a live RocketQ, scraped, under load, drawn.

:func:`record_and_render` (``python -m tools.dashboard render``) runs, in order:

1. ``rocketq dev up --detach`` in a temporary directory, ``metricsPort`` on the broker and
   the timer wheel (``--set`` / ``--timer-set``) and on the nameserver (its environment variable);
   fast transaction checks so that panel moves within the run;
2. a scraper thread: every :data:`SCRAPE_INTERVAL_S` it reads the three /metrics endpoints
   (prometheus_client's parser) and keeps every sample with its time — what Prometheus would
   store;
3. the load: ``rocketq bench produce --accumulate`` then ``rocketq bench consume`` (the lag
   rises, then drains), then a slower produce and consume side by side; meanwhile a few delayed
   messages, transactional half messages left undecided (checked, then discarded) and refused
   requests (an empty Send: INVALID_ARGUMENT) every second;
4. :func:`evaluate` computes each panel query of :data:`tools.dashboard.PANELS` over the samples
   the way PromQL would (``rate`` over a window of 4 scrape intervals, as Grafana's
   ``$__rate_interval`` does; ``histogram_quantile`` with linear interpolation in the bucket),
   and :func:`draw` lays the panels out on the dashboard's grid with matplotlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from services.cli.dev import dev_down, dev_up
from services.common.etcd import free_port
from tools.dashboard import Query, Series, grid

SCRAPE_INTERVAL_S = 1.0
RATE_WINDOW_SCRAPES = 4
"""rate() looks back this many scrapes (Grafana's $__rate_interval is 4 scrape intervals)."""
Key = tuple[str, frozenset[tuple[str, str]]]
Scrape = tuple[float, dict[Key, float]]


# ---- recording ----------------------------------------------------------------------------


class Scraper:
    """Reads every endpoint each interval until stopped; ``scrapes`` holds (t, samples)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_INTERVAL_S):
            samples: dict[Key, float] = {}
            for url in self.urls:
                with contextlib.suppress(OSError, ValueError):
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        text = resp.read().decode()
                    for family in text_string_to_metric_families(text):
                        for s in family.samples:
                            key = (s.name, frozenset(s.labels.items()))
                            samples[key] = samples.get(key, 0.0) + s.value
            self.scrapes.append((time.monotonic() - self.t0, samples))


def _bench(namesrv: str, *args: str) -> subprocess.Popen[bytes]:
    rocketq = str(Path(sys.executable).with_name("rocketq"))
    return subprocess.Popen(
        [rocketq, "bench", *args, "--namesrv", namesrv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _side_traffic(namesrv: str, broker: str, seconds: float) -> None:
    """Delayed messages, undecided transactions and refused requests, a few per second."""
    from rocketq._api.rocketq.v1 import messaging_pb2, messaging_pb2_grpc  # noqa: PLC0415
    from rocketq.client.producer import Producer, ProducerConfig  # noqa: PLC0415
    from rocketq.client.producer.transaction import (  # noqa: PLC0415
        LocalTransactionState,
        TransactionProducer,
    )
    from rocketq.message import Message  # noqa: PLC0415

    class Undecided:
        def execute_local_transaction(self, _m: object, _a: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, _m: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

    import grpc  # noqa: PLC0415

    cfg = ProducerConfig(group="dashboard-side", namesrv_addrs=(namesrv,))
    txcfg = ProducerConfig(group="dashboard-tx", namesrv_addrs=(namesrv,))
    deadline = time.monotonic() + seconds
    async with (
        Producer(cfg) as producer,
        TransactionProducer(txcfg, Undecided()) as tx,
        grpc.aio.insecure_channel(broker) as channel,
    ):
        stub = messaging_pb2_grpc.MessagingStub(channel)
        i = 0
        while time.monotonic() < deadline:
            i += 1
            await producer.send(
                Message("DashboardDelayed", f"d{i}".encode(), delay_level=1 + i % 3)
            )
            if i % 3 == 0:
                await tx.send_message_in_transaction(Message("DashboardTx", f"t{i}".encode()), None)
            with contextlib.suppress(grpc.RpcError):
                await stub.Send(messaging_pb2.SendRequest(), timeout=5)  # INVALID_ARGUMENT
            await asyncio.sleep(0.5)


def record(seconds: float) -> list[Scrape]:
    base = Path(tempfile.mkdtemp(prefix="rocketq-dashboard-"))
    ports = {"broker": free_port(), "timer": free_port(), "namesrv": free_port()}
    os.environ["ROCKETQ_NAMESERVER_METRICSPORT"] = str(ports["namesrv"])
    try:
        dev_up.main(
            ["--dir", str(base), "--namesrv-port", "0", "--broker-port", "0", "--timer-port",
             "0", "--gateway-port", "0", "--detach", "--no-demo",
             "--set", f"metricsPort={ports['broker']}",
             "--timer-set", f"metricsPort={ports['timer']}",
             "--set", "transactionCheckInterval=3000", "--set", "transactionTimeout=2000",
             "--set", "transactionCheckMax=2"],
            standalone_mode=False,
        )  # fmt: skip
        os.environ.pop("ROCKETQ_NAMESERVER_METRICSPORT")
        data = json.loads((base / "pids.json").read_text())
        namesrv, broker = str(data["namesrv"]), str(data["broker"])
        scraper = Scraper([f"http://127.0.0.1:{p}/metrics" for p in ports.values()])
        scraper.start()
        third = seconds / 3
        side = threading.Thread(
            target=lambda: asyncio.run(_side_traffic(namesrv, broker, seconds)), daemon=True
        )
        side.start()
        topic = ["--topic", "DashboardOrders"]
        _bench(namesrv, "produce", *topic, "--accumulate", "--duration", str(third)).wait()
        consume = _bench(namesrv, "consume", *topic, "--duration", str(2 * third))
        time.sleep(third / 2)
        _bench(namesrv, "produce", *topic, "--concurrency", "4", "--duration", str(third)).wait()
        consume.wait()
        side.join(30)
        time.sleep(2 * SCRAPE_INTERVAL_S)
        scraper.stop()
        return scraper.scrapes
    finally:
        os.environ.pop("ROCKETQ_NAMESERVER_METRICSPORT", None)
        if (base / "pids.json").exists():
            dev_down.main(["--dir", str(base)], standalone_mode=False)
        shutil.rmtree(base, ignore_errors=True)


# ---- PromQL, the three shapes the panels use -----------------------------------------------------


def _matches(labels: frozenset[tuple[str, str]], where: tuple[tuple[str, str], ...]) -> bool:
    d = dict(labels)
    for k, v in where:
        if v.startswith("!"):
            if d.get(k) == v[1:]:
                return False
        elif d.get(k) != v:
            return False
    return True


def _group(labels: frozenset[tuple[str, str]], by: tuple[str, ...]) -> tuple[str, ...]:
    d = dict(labels)
    return tuple(d.get(b, "") for b in by)


def _rates(
    scrapes: list[Scrape], metric: str, where: tuple[tuple[str, str], ...]
) -> Iterator[tuple[float, dict[frozenset[tuple[str, str]], float]]]:
    """Per scrape time, the per-second increase of every matching series over the window."""
    for i in range(RATE_WINDOW_SCRAPES, len(scrapes)):
        t, now = scrapes[i]
        t0, then = scrapes[i - RATE_WINDOW_SCRAPES]
        out = {}
        for (name, labels), v in now.items():
            if name == metric and _matches(labels, where):
                before = then.get((name, labels), 0.0)
                out[labels] = max(0.0, v - before) / (t - t0)
        yield t, out


def _legend(template: str, by: tuple[str, ...], key: tuple[str, ...]) -> str:
    text = template or ", ".join(key)
    for name, value in zip(by, key, strict=True):
        text = text.replace("{{" + name + "}}", value)
    return text


def evaluate(q: Query, scrapes: list[Scrape]) -> list[Series]:
    series: dict[tuple[str, ...], Series] = {}

    def point(key: tuple[str, ...], t: float, v: float) -> None:
        s = series.setdefault(key, Series(_legend(q.legend, q.by, key)))
        s.times_s.append(t)
        s.values.append(v)

    if q.kind == "gauge":
        for t, samples in scrapes:
            sums: dict[tuple[str, ...], float] = defaultdict(float)
            for (name, labels), v in samples.items():
                if name == q.metric and _matches(labels, q.where):
                    sums[_group(labels, q.by)] += v
            for key, v in sums.items():
                point(key, t, v)
    elif q.kind == "rate":
        for t, rates in _rates(scrapes, q.metric, q.where):
            sums = defaultdict(float)
            for labels, v in rates.items():
                sums[_group(labels, q.by)] += v
            for key, v in sums.items():
                point(key, t, v)
    else:
        for t, rates in _rates(scrapes, q.metric + "_bucket", q.where):
            buckets: dict[tuple[str, ...], dict[float, float]] = defaultdict(
                lambda: defaultdict(float)
            )
            for labels, v in rates.items():
                le = float(dict(labels)["le"])
                buckets[_group(labels, q.by)][le] += v
            for key, by_le in buckets.items():
                v = histogram_quantile(q.q, by_le)
                if not math.isnan(v):
                    point(key, t, v)
    return list(series.values())


def histogram_quantile(q: float, cumulative: dict[float, float]) -> float:
    """PromQL's histogram_quantile over cumulative bucket rates {le: rate}."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return math.nan
    rank = q * cumulative[bounds[-1]]
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        count = cumulative[b]
        if count >= rank:
            if math.isinf(b):
                return prev_bound
            if count == prev_count:
                return b
            return prev_bound + (b - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = b, count
    return prev_bound


# ---- drawing ------------------------------------------------------------------------------

_UNITS = {"ops": "/s", "Bps": "B/s", "ms": "ms", "bytes": "B", "short": ""}


def draw(scrapes: list[Scrape], out: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only the render command needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import EngFormatter  # noqa: PLC0415

    layout = grid()
    rows = max(y for _p, _x, y in layout) // 8 + 1
    plt.style.use("dark_background")
    fig = plt.figure(figsize=(22, 4.2 * rows + 0.8), facecolor="#111217")
    spec = fig.add_gridspec(rows, 24, hspace=0.55, wspace=1.6, top=1 - 0.9 / (4.2 * rows + 0.8))
    fig.suptitle(
        "RocketQ — deploy/grafana/rocketq.json, each panel's query evaluated over real scrapes "
        "of a local RocketQ under rocketq bench (drawn by tools/dashboard.py, not by Grafana)",
        fontsize=12, color="#d8d9da", x=0.01, ha="left",
    )  # fmt: skip
    for panel, x, y in layout:
        ax = fig.add_subplot(spec[y // 8, x : x + panel.width], facecolor="#181b1f")
        ax.set_title(panel.title, fontsize=10, color="#d8d9da", loc="left")
        drawn = 0
        for q in panel.queries:
            for s in evaluate(q, scrapes):
                ax.plot(s.times_s, s.values, linewidth=1.4, label=s.label)
                drawn += 1
        if drawn == 0:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="#8e8e8e")
        ax.yaxis.set_major_formatter(EngFormatter(unit=_UNITS.get(panel.unit, "")))
        ax.set_xlabel("seconds since start", fontsize=8, color="#8e8e8e")
        ax.tick_params(labelsize=8, colors="#8e8e8e")
        ax.grid(color="#2c3235", linewidth=0.6)
        for side in ax.spines.values():
            side.set_color("#2c3235")
        if drawn:
            ax.legend(fontsize=7, loc="upper left", framealpha=0.4)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=70, facecolor=fig.get_facecolor())
    plt.close(fig)


def record_and_render(seconds: float, out: Path) -> None:
    scrapes = record(seconds)
    print(f"{len(scrapes)} scrapes of 3 endpoints; drawing {out}", flush=True)
    draw(scrapes, out)
