"""Delayed messages and dead letters from the `rocketq` command, as a user runs them: `dev up
--detach` starts a nameserver, a broker and a timer-wheel; `produce --delay-ms / --delay-level /
--deliver-at-ms` delays messages, `timer stats|cancel` watches and cancels timers, and
`dlq list|resend` shows and resends a group's dead letters.

The dead-letter tests need no timer: a group with retryMaxTimes 0 sends its first failure
straight to its DLQ.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq.client.consumer import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeResult,
    PushConsumer,
    PushConsumerConfig,
)
from rocketq.message import ReceivedMessage
from services.common.supervisor import pid_alive
from tests.e2e.conftest import dev_up, json_lines, ok, rocketq
from tests.support.until import until, until_sync

pytestmark = pytest.mark.e2e


class Dev:
    def __init__(self, base: Path, up_stdout: str) -> None:
        self.base = base
        self.up_stdout = up_stdout
        data = json.loads((base / "pids.json").read_text())
        self.namesrv: str = data["namesrv"]
        self.timer: str = data["timer"]
        self.processes: dict[str, int] = {n: int(p["pid"]) for n, p in data["processes"].items()}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return rocketq(*args, "-n", self.namesrv)

    def __call__(self, *args: str) -> str:
        return ok(*args, "-n", self.namesrv)

    def timer_cmd(self, *args: str) -> subprocess.CompletedProcess[str]:
        return rocketq("timer", *args, "--timer", self.timer)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    base = tmp_path_factory.mktemp("dev") / "rq"
    with dev_up(
        base,
        *("--namesrv-port", "0", "--broker-port", "0"),
        *("--timer-port", "0", "--detach", "--no-demo"),
        *(
            "--set",
            "mappedFileSizeCommitLog=67108864",
            "--set",
            "mappedFileUnitsConsumeQueue=30000",
        ),
    ) as up:
        yield Dev(base, up.stdout)


def test_dev_up_reports_the_timer_wheel(dev: Dev) -> None:
    assert "RocketQ is running" in dev.up_stdout
    assert set(dev.processes) == {"namesrv", "broker", "timer"}
    assert all(pid_alive(pid) for pid in dev.processes.values())
    assert f"timer-wheel {dev.timer}  (data {dev.base / 'timer-0'})" in dev.up_stdout
    assert f"ROCKETQ_TIMER={dev.timer}" in dev.up_stdout
    assert (dev.base / "timer-0").is_dir()


def test_timer_stats_json_and_table(dev: Dev) -> None:
    out = dev.timer_cmd("stats", "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats["addr"] == dev.timer
    assert (stats["slot_precision_ms"], stats["wheel_slots_total"]) == (1000, 604800)
    assert stats["pending_timers"] >= 0 and isinstance(stats["queues"], list)
    table = dev.timer_cmd("stats")
    assert table.returncode == 0 and "pending timers" in table.stdout
    assert f"timer-wheel {dev.timer}" in table.stdout


def test_delayed_produce_is_delivered_no_earlier_than_its_time(dev: Dev) -> None:
    topic = "E2EDelayed"
    dev("topic", "create", topic, "-q", "2")
    before_ms = {"by-ms": int(time.time() * 1000)}
    sent = json_lines(dev("produce", topic, "--body", "by-ms", "--delay-ms", "5000", "--json"))
    early = dev.run("consume", topic, "--from", "first", "--count", "1", "--timeout", "0.5")
    assert early.returncode == 1, f"a delayed message was visible at once:\n{early.stdout}"
    before_ms["by-level"] = int(time.time() * 1000)
    sent += json_lines(dev("produce", topic, "--body", "by-level", "--delay-level", "1", "--json"))
    # Set just before its send: a CLI start can take seconds on a loaded machine, and a time
    # already past is delivered at once, without a timer.
    at_ms = int(time.time() * 1000) + 4000
    sent += json_lines(
        dev("produce", topic, "--body", "at-time", "--deliver-at-ms", str(at_ms), "--json")
    )
    assert len(sent) == 3

    out = dev("consume", topic, "--from", "first", "--count", "3", "--timeout", "15", "--json")
    got = {m["body"]: m for m in json_lines(out)}
    assert set(got) == {"by-ms", "by-level", "at-time"}
    assert {m["msg_id"] for m in got.values()} == {s["msg_id"] for s in sent}
    # The broker sets TIMER_OUT_MS = its clock + delay at the send; the re-put is stored later.
    delays = {"by-ms": 5000, "by-level": 1000}
    for body, delay_ms in delays.items():
        out_ms = int(got[body]["properties"]["TIMER_OUT_MS"])
        assert out_ms >= before_ms[body] + delay_ms, got[body]
        assert got[body]["store_timestamp_ms"] >= out_ms, got[body]
    assert int(got["at-time"]["properties"]["TIMER_OUT_MS"]) == at_ms
    assert got["at-time"]["store_timestamp_ms"] >= at_ms


def test_timer_cancel_by_the_printed_msg_id(dev: Dev) -> None:
    topic = "E2ECancel"
    dev("topic", "create", topic, "-q", "1")
    before_ms = int(time.time() * 1000)
    [sent] = json_lines(dev("produce", topic, "--body", "never", "--delay-ms", "60000", "--json"))
    handle = sent["msg_id"]

    def cancel() -> subprocess.CompletedProcess[str] | None:
        out = dev.timer_cmd("cancel", "-t", topic, handle, "--json")
        return out if out.returncode == 0 else None

    # the timer-wheel cancels what it has read from the broker
    out = until_sync(cancel, f"timer cancel of {handle}", 15, 0.2)
    assert out.returncode == 0, f"cancel failed:\n{out.stdout}\n{out.stderr}"
    cancelled = json.loads(out.stdout)
    assert (cancelled["topic"], cancelled["handle"], cancelled["addr"]) == (
        topic,
        handle,
        dev.timer,
    )
    assert cancelled["delivery_timestamp_ms"] >= before_ms + 60000
    again = dev.timer_cmd("cancel", "-t", topic, handle)
    assert again.returncode == 1 and "Traceback" not in again.stderr


def test_produce_refuses_bad_delays(dev: Dev) -> None:
    both = dev.run("produce", "E2EX", "--body", "x", "--delay-level", "1", "--delay-ms", "5")
    assert both.returncode == 2 and "not several" in both.stderr
    level = dev.run("produce", "E2EX", "--body", "x", "--delay-level", "65")
    assert level.returncode == 2 and "--delay-level" in level.stderr
    missing = dev.run("produce", "E2EX", "--body", "x", "--delay-level", "19")  # the broker's 18
    assert missing.returncode == 1 and "outside 1..18" in missing.stderr
    when = dev.run("produce", "E2EX", "--body", "x", "--deliver-at-ms", "tomorrow")
    assert when.returncode == 2 and "is not a time" in when.stderr
    nobody = rocketq("timer", "stats", "--timer", "127.0.0.1:1")
    assert nobody.returncode == 1 and "cannot reach 127.0.0.1:1" in nobody.stderr


async def _fail_into_dlq(dev: Dev, topic: str, group: str, count: int) -> None:
    """A push consumer whose listener always fails; the group allows no redelivery."""

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return ConsumeResult.RECONSUME_LATER

    async def dead_letters() -> int:
        out = await asyncio.to_thread(dev, "dlq", "list", group, "--json")
        return sum(p["total"] for p in json.loads(out)["pages"])

    async def all_dead() -> bool:
        return await dead_letters() >= count

    config = PushConsumerConfig(
        group, (dev.namesrv,), consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    consumer = PushConsumer(config, listener)
    consumer.subscribe(topic, "*")
    await consumer.start()
    try:
        await until(all_dead, f"{count} dead letters in {group}'s DLQ", 20, 0.2)
    finally:
        await consumer.close()


async def test_dlq_list_and_resend(dev: Dev) -> None:
    topic, group = "E2EDead", "e2e-dead"
    dev("topic", "create", topic, "-q", "1")
    dev("group", "create", group, "--retry-max-times", "0")
    dev("produce", topic, "--body", "poison", "-c", "3", "-t", "Bad", "-k", "order-9")
    await _fail_into_dlq(dev, topic, group, 3)

    listed = json.loads(dev("dlq", "list", group, "--json"))
    assert listed["group"] == group and not listed["errors"]
    [page] = listed["pages"]
    assert (page["broker_name"], page["total"], page["next_offset"]) == ("broker-a", 3, 3)
    letters = page["messages"]
    assert [m["queue_offset"] for m in letters] == [0, 1, 2]
    assert all(m["body"] == "poison" and m["properties"]["RETRY_TOPIC"] == topic for m in letters)
    table = dev("dlq", "list", group)
    assert f"dead letters of {group}" in table and topic in table
    assert "broker-a: 3 dead letter(s) stored, 3 shown, next offset 3" in table
    one = json.loads(
        dev("dlq", "list", group, "-b", "broker-a", "--offset", "2", "--max", "1", "--json")
    )
    assert [m["queue_offset"] for m in one["pages"][0]["messages"]] == [2]

    [resent] = json.loads(dev("dlq", "resend", group, letters[0]["offset_msg_id"], "--json"))
    assert (resent["topic"], resent["broker_name"]) == (topic, "broker-a")
    everything = dev("dlq", "resend", group, "--all")
    assert "resent 3 dead letter(s)" in everything
    back = json_lines(
        dev("consume", topic, "--from", "first", "--count", "7", "--timeout", "5", "--json")
    )
    assert len(back) == 7  # 3 originals + 1 + 3 resent copies
    copies = [m for m in back if m["queue_offset"] >= 3]
    assert all(m["body"] == "poison" and m["reconsume_times"] == 0 for m in copies)
    assert resent["msg_id"] in {m["msg_id"] for m in copies}
    assert json.loads(dev("dlq", "list", group, "--json"))["pages"][0]["total"] == 3

    bad = dev.run("dlq", "resend", group, "not-an-id")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    usage = dev.run("dlq", "resend", group)
    assert usage.returncode == 2 and "--all" in usage.stderr


def test_dev_down_stops_every_process(dev: Dev) -> None:
    out = rocketq("dev", "down", "--dir", str(dev.base))
    assert out.returncode == 0 and "RocketQ stopped" in out.stdout
    pids = dev.processes.values()
    until_sync(lambda: not any(pid_alive(p) for p in pids), "every process gone", 10)
