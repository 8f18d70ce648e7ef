"""Exploratory chaos runs, and re-checking a kept one.

    python -m tests.robustness.chaos --seed 42 --duration-s 600 \\
      --faults kill,pause,kill-slave,namesrv,timer,etcd,etcd-quorum,partition,etcd-partition,disk \\
      [--shuffle] [--rate 30] [--netns auto|on|off] [--etcd-members 3] [--keep DIR]
    python -m tests.robustness.chaos --check DIR      # validate a kept run's journals again

Without ``--keep`` the run lives in a temporary directory that is copied to
``$ROCKETQ_ROBUSTNESS_KEEP_DIR/chaos-seed-N`` (or ``./chaos-failed-seed-N``) only when the run
fails. Exit status 0 = the checker found nothing, 1 = it did (the summary says what).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.robustness.chaos import netns
from tests.robustness.chaos.faults import FAULTS
from tests.robustness.chaos.model import History
from tests.robustness.chaos.nodes import ClusterConfig
from tests.robustness.chaos.recorder import journals, read_events
from tests.robustness.chaos.scenario import (
    CI_FAULTS,
    ScenarioConfig,
    expectations,
    run_scenario,
)
from tests.robustness.chaos.validate import validate

KEEP_DIR_ENV = "ROCKETQ_ROBUSTNESS_KEEP_DIR"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="RocketQ cluster chaos run (issue 8)")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--duration-s", type=float, default=120.0, help="length of the fault phase")
    p.add_argument(
        "--faults", default=",".join(CI_FAULTS), help=f"comma-separated, of: {','.join(FAULTS)}"
    )
    p.add_argument("--shuffle", action="store_true", help="seeded random picks, not in order")
    p.add_argument("--rate", type=float, default=15.0, help="messages/s per producer")
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--lease-ttl-s", type=int, default=2)
    p.add_argument(
        "--etcd-members", type=int, default=3, help="etcd cluster size (1 = a single member)"
    )
    p.add_argument("--no-static-group", action="store_true")
    p.add_argument("--no-timer", action="store_true")
    p.add_argument(
        "--netns",
        choices=("auto", "on", "off"),
        default="auto",
        help="nodes in network namespaces (partitions); auto = when running as root",
    )
    p.add_argument(
        "--disk-slave-mib",
        type=int,
        default=0,
        help="replica 3's store on a volume of this size (default 256 with the disk fault)",
    )
    p.add_argument("--keep", help="run (and keep) everything in this directory")
    p.add_argument("--check", help="only validate the journals of a kept run directory")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.check:
        history = History.from_events(read_events(journals(Path(args.check))))
        verdict = validate(history, expectations(ScenarioConfig(), len(history.faults)))
        print(verdict.summary())
        return 0 if verdict.ok else 1
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        print(f"unknown faults {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    cfg = ScenarioConfig(
        seed=args.seed,
        duration_s=args.duration_s,
        faults=faults,
        shuffle=args.shuffle,
        rate=args.rate,
        producers=args.producers,
        cluster=ClusterConfig(
            lease_ttl_s=args.lease_ttl_s,
            etcd_members=args.etcd_members,
            static_group=not args.no_static_group,
            timer=not args.no_timer,
            netns=args.netns == "on" or (args.netns == "auto" and netns.available() is None),
            disk_slave_bytes=(args.disk_slave_mib or (256 if "disk" in faults else 0)) << 20,
        ),
    )
    if args.keep:
        run_dir = Path(args.keep)
        outcome = run_scenario(cfg, run_dir, run_dir)
    else:
        root = os.environ.get(KEEP_DIR_ENV)
        keep = (
            Path(root) / f"chaos-seed-{args.seed}"
            if root
            else Path(f"chaos-failed-seed-{args.seed}")
        )
        with tempfile.TemporaryDirectory(prefix="rocketq-chaos-") as tmp:
            outcome = run_scenario(cfg, Path(tmp), keep.resolve())
    print(outcome.summary)
    return 0 if outcome.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
