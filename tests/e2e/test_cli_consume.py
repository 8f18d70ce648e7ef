"""`rocketq produce --sharding-key` and `rocketq consume --sql / --orderly` end to end, as a
user runs them: `dev up --detach` (with enablePropertyFilter=true) starts a real nameserver and
broker, every command is a separate `rocketq` process, `dev down` stops them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketq.java_hash import java_string_hash

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ROCKETQ = [sys.executable, "-c", "from services.cli.main import main; main()"]


def rocketq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ROCKETQ, *args],
        check=False,
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Dev:
    def __init__(self, base: Path) -> None:
        self.base = base
        data = json.loads((base / "pids.json").read_text())
        self.namesrv: str = data["namesrv"]
        self.pids = [int(p["pid"]) for p in data["processes"].values()]

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return rocketq(*args, "-n", self.namesrv, stdin=stdin)

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        out = self.run(*args, stdin=stdin)
        assert out.returncode == 0, f"rocketq {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    base = tmp_path_factory.mktemp("dev") / "rq"
    up = rocketq(
        *("dev", "up", "--dir", str(base), "--namesrv-port", "0", "--broker-port", "0"),
        *("--detach", "--no-demo", "--set", "enablePropertyFilter=true"),
        *(
            "--set",
            "mappedFileSizeCommitLog=67108864",
            "--set",
            "mappedFileUnitsConsumeQueue=30000",
        ),
    )
    assert up.returncode == 0, f"dev up failed:\n{up.stdout}\n{up.stderr}"
    d = Dev(base)
    try:
        yield d
    finally:
        rocketq("dev", "down", "--dir", str(base))
        for pid in d.pids:  # never leak a server, whatever happened above
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_produce_with_a_sharding_key_keeps_one_queue_in_order(dev: Dev) -> None:
    topic = "E2EOrdered"
    dev("topic", "create", topic, "-q", "8")
    lines = "".join(f"k7-{i}\n" for i in range(6))
    sent = json_lines(dev("produce", topic, "--sharding-key", "order-7", "--json", stdin=lines))
    queue = abs(java_string_hash("order-7")) % 8
    assert len(sent) == 6
    assert {s["message_queue"]["queue_id"] for s in sent} == {queue}
    assert [s["queue_offset"] for s in sent] == list(range(6))
    other = json_lines(dev("produce", topic, "--sharding-key", "order-8", "--json", stdin="x\n"))
    assert other[0]["message_queue"]["queue_id"] == abs(java_string_hash("order-8")) % 8


def _send_props(dev: Dev, topic: str) -> None:
    dev("produce", topic, "--body", "low", "--count", "3", "-p", "a=2")
    dev("produce", topic, "--body", "high", "--count", "3", "-p", "a=7", "-p", "s=x")
    dev("produce", topic, "--body", "none", "--count", "2")


def test_consume_sql_filters_on_the_broker_with_a_group(dev: Dev) -> None:
    topic = "E2ESql"
    dev("topic", "create", topic, "-q", "2")
    _send_props(dev, topic)
    out = dev.run(
        "consume",
        topic,
        "-g",
        "e2e-sql",
        "--sql",
        "a > 5",
        "--from",
        "first",
        *("--count", "4", "--timeout", "4", "--json"),
    )
    assert out.returncode == 1, out.stderr  # only 3 of the 4 asked for exist
    got = json_lines(out.stdout)
    assert [m["body"] for m in got] == ["high"] * 3
    assert all(m["properties"]["a"] == "7" for m in got)


def test_consume_sql_without_a_group_filters_in_the_cli(dev: Dev) -> None:
    topic = "E2ESqlLocal"
    dev("topic", "create", topic, "-q", "2")
    _send_props(dev, topic)
    got = json_lines(
        dev(
            "consume",
            topic,
            "--sql",
            "a IS NULL OR s = 'x'",
            "--from",
            "first",
            *("--count", "5", "--timeout", "10", "--json"),
        )
    )
    assert sorted(m["body"] for m in got) == ["high"] * 3 + ["none"] * 2


def test_consume_refuses_bad_filters_before_connecting(dev: Dev) -> None:
    bad = dev.run("consume", "E2ESql", "-g", "g", "--sql", "a >> 5")
    assert bad.returncode == 2, bad.stderr
    assert "position 3" in bad.stderr and "Traceback" not in bad.stderr
    both = dev.run("consume", "E2ESql", "--sql", "a > 1", "--tag", "A")
    assert both.returncode == 2 and "not both" in both.stderr
    no_group = dev.run("consume", "E2ESql", "--orderly")
    assert no_group.returncode == 2 and "--orderly needs --group" in no_group.stderr


def test_consume_orderly_prints_each_queue_in_order(dev: Dev) -> None:
    topic = "E2EOrderly"
    dev("topic", "create", topic, "-q", "4")
    for key in ("A", "B", "C"):
        lines = "".join(f"{key}-{i}\n" for i in range(5))
        dev("produce", topic, "--sharding-key", key, stdin=lines)
    got = json_lines(
        dev(
            "consume",
            topic,
            "--orderly",
            "-g",
            "e2e-orderly",
            "--from",
            "first",
            *("--count", "15", "--timeout", "15", "--json"),
        )
    )
    assert len(got) == 15
    per_queue: dict[int, list[int]] = {}
    per_key: dict[str, list[int]] = {}
    for m in got:
        per_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
        key, seq = str(m["body"]).split("-")
        per_key.setdefault(key, []).append(int(seq))
    assert all(offsets == sorted(offsets) for offsets in per_queue.values()), per_queue
    assert per_key == {k: list(range(5)) for k in ("A", "B", "C")}
    # The group committed what was printed: a second run finds nothing new.
    again = dev.run("consume", topic, "--orderly", "-g", "e2e-orderly", "--timeout", "3")
    assert again.returncode == 0 and "0 message(s)" in again.stderr
    text = dev("produce", topic, "--sharding-key", "A", "--body", "A-5")
    assert "SEND_OK" in text
    shown = dev(
        "consume", topic, "--orderly", "-g", "e2e-orderly", "--count", "1", "--timeout", "15"
    )
    assert shown.startswith("[broker-a#") and "A-5" in shown
