"""RocketQ's Grafana dashboard: its panels, once, as data — the JSON and the README's PNG both
come from :data:`PANELS`, so the picture shows exactly the dashboard's queries.

    python -m tools.dashboard json  [--out deploy/grafana/rocketq.json]
    python -m tools.dashboard render [--seconds 90] [--out docs/images/dashboard.png]

``json`` writes the Grafana dashboard (a Prometheus data source chosen at import, PromQL per
panel). ``render`` cannot run Grafana (it is not installable here), so it does what Grafana would
with real data: it starts a local RocketQ as ``rocketq dev up --detach`` does, with metricsPort
on the nameserver, broker and timer wheel, scrapes all three /metrics endpoints every second
(:mod:`tools.dashboard_data`, a small stand-in for Prometheus), drives load with ``rocketq bench
produce`` / ``consume`` (plus a few delayed, transactional and refused sends, so every panel has
something to show), evaluates each panel's query over the scraped samples, and draws the panels
with matplotlib in the dashboard's grid.

A panel query is one of three shapes (:class:`Query`), each with its PromQL form:

- ``rate``: ``sum by (L) (rate(METRIC{F}[$__rate_interval]))``;
- ``gauge``: ``sum by (L) (METRIC{F})``;
- ``quantile``: ``histogram_quantile(Q, sum by (le, L) (rate(METRIC_bucket{F}[...])))``,
  the window being ``$__rate_interval`` in all three.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

DASHBOARD_FILE = Path("deploy/grafana/rocketq.json")
IMAGE_FILE = Path("docs/images/dashboard.png")
DS = "${DS_PROMETHEUS}"


@dataclass(frozen=True)
class Query:
    kind: Literal["rate", "gauge", "quantile"]
    metric: str
    by: tuple[str, ...] = ()
    where: tuple[tuple[str, str], ...] = ()
    """Label filters: (label, value); a value starting with ``!`` means "not equal"."""
    q: float = 0.99
    legend: str = ""

    def promql(self) -> str:
        flt = ",".join(
            f'{k}!="{v[1:]}"' if v.startswith("!") else f'{k}="{v}"' for k, v in self.where
        )
        sel = f"{{{flt}}}" if flt else ""
        by = f" by ({', '.join(self.by)})" if self.by else ""
        if self.kind == "rate":
            return f"sum{by} (rate({self.metric}{sel}[$__rate_interval]))"
        if self.kind == "gauge":
            return f"sum{by} ({self.metric}{sel})"
        le_by = f" by ({', '.join(('le', *self.by))})"
        return (
            f"histogram_quantile({self.q}, sum{le_by} "
            f"(rate({self.metric}_bucket{sel}[$__rate_interval])))"
        )


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    """Grafana unit id: ops (per second), Bps, ms, bytes, short."""
    queries: tuple[Query, ...]
    width: int = 8
    """Grid columns out of 24."""
    description: str = ""


TOPIC = "messaging_destination_name"
GROUP = "messaging_consumer_group_name"
METHOD = "rpc_method"
STATUS = "rpc_grpc_status_code"


def lg(*labels: str) -> str:
    """A Grafana legend naming each label's value: ``{{a}} / {{b}}``."""
    return " / ".join("{{" + name + "}}" for name in labels)


PANELS: tuple[Panel, ...] = (
    Panel("Messages in / s by topic", "ops",
          (Query("rate", "rocketmq_messages_in_total", (TOPIC,), legend=lg(TOPIC)),)),
    Panel("Messages out / s by topic and group", "ops",
          (Query("rate", "rocketmq_messages_out_total", (TOPIC, GROUP),
                 legend=lg(TOPIC, GROUP)),)),
    Panel("Bytes in and out / s", "Bps",
          (Query("rate", "rocketmq_throughput_in_bytes_total", legend="in"),
           Query("rate", "rocketmq_throughput_out_bytes_total", legend="out"))),
    Panel("Send latency (broker)", "ms",
          (Query("quantile", "rpc_server_duration_milliseconds", where=((METHOD, "Send"),),
                 q=0.5, legend="p50"),
           Query("quantile", "rpc_server_duration_milliseconds", where=((METHOD, "Send"),),
                 q=0.99, legend="p99"))),
    Panel("Pull latency (broker; includes long-poll holds)", "ms",
          (Query("quantile", "rpc_server_duration_milliseconds", where=((METHOD, "Pull"),),
                 q=0.5, legend="p50"),
           Query("quantile", "rpc_server_duration_milliseconds", where=((METHOD, "Pull"),),
                 q=0.99, legend="p99"))),
    Panel("Consumer lag by group and topic", "short",
          (Query("gauge", "rocketmq_consumer_lag_messages", (GROUP, TOPIC),
                 legend=lg(GROUP, TOPIC)),)),
    Panel("gRPC calls / s not OK, by method and status", "ops",
          (Query("rate", "rpc_server_duration_milliseconds_count", (METHOD, STATUS),
                 where=((STATUS, "!0"),), legend=lg(METHOD, STATUS)),)),
    Panel("Commitlog flush (fsync) latency", "ms",
          (Query("quantile", "rocketmq_storage_flush_duration_milliseconds", q=0.5, legend="p50"),
           Query("quantile", "rocketmq_storage_flush_duration_milliseconds", q=0.99,
                 legend="p99"))),
    Panel("Store: commitlog on disk, flush backlog", "bytes",
          (Query("gauge", "rocketmq_storage_size_bytes", legend="commitlog files"),
           Query("gauge", "rocketmq_storage_flush_behind_bytes", legend="not yet flushed"))),
    Panel("Replication: lag and in-sync replicas", "short",
          (Query("gauge", "rocketmq_replication_lag_bytes", ("rocketq_slave_id",),
                 legend="lag bytes, slave {{rocketq_slave_id}}"),
           Query("gauge", "rocketmq_replication_in_sync_replicas", legend="in-sync replicas"))),
    Panel("Elections: epoch", "short",
          (Query("gauge", "rocketmq_controller_epoch", legend="epoch"),)),
    Panel("Timer wheel: backlog and lateness", "short",
          (Query("gauge", "rocketq_timer_pending", legend="timers pending"),
           Query("gauge", "rocketq_timer_lateness_milliseconds", where=(("quantile", "0.99"),),
                 legend="lateness p99 (ms)"))),
    Panel("Transactions: checks and discards / s", "ops",
          (Query("rate", "rocketmq_transaction_checks_total", legend="checks"),
           Query("rate", "rocketmq_transaction_discards_total", legend="discards")),
          width=12),
    Panel("Timers scheduled and delivered / s", "ops",
          (Query("rate", "rocketq_timer_scheduled_total", legend="scheduled"),
           Query("rate", "rocketq_timer_delivered_total", legend="delivered")),
          width=12),
)  # fmt: skip


def grid(panels: tuple[Panel, ...] = PANELS) -> list[tuple[Panel, int, int]]:
    """Each panel with its (x, y) on Grafana's 24-column grid, rows of height 8."""
    out, x, y = [], 0, 0
    for p in panels:
        if x + p.width > 24:
            x, y = 0, y + 8
        out.append((p, x, y))
        x += p.width
    return out


def dashboard_json() -> dict[str, object]:
    panels = []
    for i, (p, x, y) in enumerate(grid(), start=1):
        panels.append(
            {
                "id": i,
                "type": "timeseries",
                "title": p.title,
                "description": p.description,
                "datasource": {"type": "prometheus", "uid": DS},
                "gridPos": {"x": x, "y": y, "w": p.width, "h": 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "datasource": {"type": "prometheus", "uid": DS},
                        "expr": q.promql(),
                        "legendFormat": q.legend,
                    }
                    for j, q in enumerate(p.queries)
                ],
            }
        )
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "title": "RocketQ",
        "uid": "rocketq-overview",
        "tags": ["rocketq", "messaging"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-15m", "to": "now"},
        "panels": panels,
        "templating": {"list": []},
        "annotations": {"list": []},
        "editable": True,
        "description": "RocketQ brokers, nameservers and timer wheels scraped from metricsPort "
        "(generated by tools/dashboard.py; edit the panels there).",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    js = sub.add_parser("json", help="write the Grafana dashboard JSON")
    js.add_argument("--out", type=Path, default=DASHBOARD_FILE)
    rd = sub.add_parser("render", help="scrape a live local RocketQ under load and draw the PNG")
    rd.add_argument("--seconds", type=float, default=90.0, help="length of the load")
    rd.add_argument("--out", type=Path, default=IMAGE_FILE)
    args = parser.parse_args()
    if args.cmd == "json":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dashboard_json(), indent=2) + "\n")
        print(f"wrote {args.out}")
        return
    from tools.dashboard_data import record_and_render  # noqa: PLC0415 - matplotlib, processes

    record_and_render(args.seconds, args.out)


@dataclass
class Series:
    """One evaluated line of a panel."""

    label: str
    times_s: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


if __name__ == "__main__":
    main()
