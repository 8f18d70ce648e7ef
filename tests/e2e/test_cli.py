"""The `rocketq` command end to end, as a user runs it: `dev up --detach` starts a real
nameserver and broker, then the admin, produce/consume and bench commands talk to them, and
`dev down` stops them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketq.client.consumer import ConsumeContext, ConsumeResult, PushConsumer, PushConsumerConfig
from rocketq.message import ReceivedMessage
from services.common.supervisor import pid_alive
from tests.e2e.conftest import dev_up, json_lines, ok, rocketq
from tests.support.until import until, until_sync

pytestmark = pytest.mark.e2e

TOPIC = "E2EOrders"


class Dev:
    def __init__(self, base: Path, up_stdout: str) -> None:
        self.base = base
        self.up_stdout = up_stdout
        data = json.loads((base / "pids.json").read_text())
        self.namesrv: str = data["namesrv"]
        self.pids = [int(p["pid"]) for p in data["processes"].values()]

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return ok(*args, "-n", self.namesrv, stdin=stdin)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    base = tmp_path_factory.mktemp("dev") / "rq"
    with dev_up(
        base,
        # every port 0: runs side by side on one machine never collide
        *("--namesrv-port", "0", "--broker-port", "0", "--timer-port", "0"),
        *("--detach", "--set", "mappedFileSizeCommitLog=67108864"),
        *("--set", "mappedFileUnitsConsumeQueue=30000"),
    ) as up:
        yield Dev(base, up.stdout)


def test_dev_up_proves_a_round_trip_before_saying_running(dev: Dev) -> None:
    assert "sent 3 messages, consumed 3 back" in dev.up_stdout
    assert "RocketQ is running" in dev.up_stdout
    assert dev.namesrv in dev.up_stdout
    assert all(pid_alive(pid) for pid in dev.pids)
    brokers = json.loads(dev("cluster", "list", "--json"))
    assert [(b["broker_name"], b["broker_id"]) for b in brokers] == [("broker-a", 0)]
    assert brokers[0]["stats"]["role"] == "ASYNC_MASTER"


def test_topic_create_list_describe(dev: Dev) -> None:
    created = json.loads(dev("topic", "create", TOPIC, "-q", "4", "--json"))
    assert [(r["broker_name"], r["ok"]) for r in created] == [("broker-a", True)]
    again = rocketq("topic", "create", TOPIC, "-n", dev.namesrv)
    assert again.returncode == 1 and "ALREADY_EXISTS" in again.stdout

    listed = {t["topic"]: t for t in json.loads(dev("topic", "list", "--json"))}
    assert TOPIC in listed and "DemoTopic" in listed
    config = listed[TOPIC]["brokers"]["broker-a"]
    assert (config["read_queue_nums"], config["write_queue_nums"], config["perm"]) == (4, 4, 6)

    desc = json.loads(dev("topic", "describe", TOPIC, "--json"))
    assert [q["broker_name"] for q in desc["route"]["queues"]] == ["broker-a"]
    queues = desc["brokers"][0]["queues"]
    assert [q["queue_id"] for q in queues] == [0, 1, 2, 3]
    assert all(q["min_offset"] == 0 == q["max_offset"] for q in queues)


def test_produce_then_consume_and_query_by_key(dev: Dev) -> None:
    sent = json_lines(
        dev("produce", TOPIC, "--tag", "TagA", "-k", "order-1", "--json", stdin="a\nb\n\nc\n")
    )
    assert len(sent) == 3 and all(s["status"] == "SEND_OK" for s in sent)

    got = json_lines(
        dev("consume", TOPIC, "--from", "first", "--count", "3", "--timeout", "15", "--json")
    )
    assert sorted(m["body"] for m in got) == ["a", "b", "c"]
    assert {m["msg_id"] for m in got} == {s["msg_id"] for s in sent}

    found = json.loads(dev("message", "query", "-t", TOPIC, "--key", "order-1", "--json"))
    assert {m["msg_id"] for m in found} == {s["msg_id"] for s in sent}
    assert all(m["properties"]["KEYS"] == "order-1" for m in found)

    one = sent[0]
    viewed = json.loads(dev("message", "view", str(one["offset_msg_id"]), "--json"))
    assert viewed["msg_id"] == one["msg_id"] and viewed["broker_name"] == "broker-a"


def test_group_describe_shows_lag(dev: Dev) -> None:
    topic = "E2ELag"
    dev("topic", "create", topic, "-q", "2")
    dev("produce", topic, "--body", "x", "--count", "3")
    dev("consume", topic, "-g", "e2e-group", "--from", "first", "--count", "3", "--timeout", "15")
    dev("produce", topic, "--body", "y", "--count", "2")
    stats = json.loads(dev("group", "describe", "e2e-group", "-t", topic, "--json"))
    assert stats["total_lag"] == 2
    assert sum(q["consumer_offset"] for q in stats["queues"]) == 3
    assert sum(q["broker_offset"] for q in stats["queues"]) == 5
    table = dev("group", "describe", "e2e-group", "-t", topic)
    assert "total lag: 2" in table


async def test_group_describe_shows_members_and_a_subscription_conflict(dev: Dev) -> None:
    topic, group = "E2EConflict", "e2e-conflict"
    dev("topic", "create", topic, "-q", "2")

    def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return ConsumeResult.CONSUME_SUCCESS

    async def conflict_shown() -> dict[str, Any] | None:
        data: dict[str, Any] = json.loads(
            await asyncio.to_thread(dev, "group", "describe", group, "--json")
        )
        return data if data["connection"] and data["connection"]["conflicts"] else None

    consumers = []
    try:
        for expression in ("tagA || tagB", "tagC"):
            consumer = PushConsumer(PushConsumerConfig(group, (dev.namesrv,)), listener)
            consumer.subscribe(topic, expression)
            await consumer.start()
            consumers.append(consumer)
        data = await until(conflict_shown, "a conflict in `group describe --json`", 15, 0.2)
        table = await asyncio.to_thread(dev, "group", "describe", group)
        exprs = {c.client_id: c.subscriptions()[topic] for c in consumers}
    finally:
        for consumer in consumers:
            await consumer.close()
    conn = data["connection"]
    assert sorted(data["consumer_ids"]) == sorted(exprs)
    subs = {
        m["client_id"]: {s["topic"]: s["expression"] for s in m["subscriptions"]}
        for m in conn["members"]
    }
    assert {cid: topics[topic] for cid, topics in subs.items()} == exprs
    [conflict] = conn["conflicts"]
    assert conflict["topic"] == topic and conflict["pulls_refused"] is True
    assert {m["client_id"]: m["expression"] for m in conflict["members"]} == exprs
    assert f"SUBSCRIPTION CONFLICT on topic {topic}" in table
    assert "pulls of it are refused" in table
    assert all(cid in table for cid in exprs) and "tagA || tagB" in table
    quiet = dev("group", "describe", group)  # both closed: nobody online, no conflict
    assert "members (0): none online" in quiet and "CONFLICT" not in quiet


def test_bench_produce_prints_progress_and_a_summary(dev: Dev) -> None:
    out = dev("bench", "produce", "-t", "E2EBench", "-d", "2", "--interval", "1", "-c", "4")
    assert "TPS" in out.splitlines()[1]  # a progress line every second
    summary = [line for line in out.splitlines() if line.startswith("SUMMARY produce:")]
    assert len(summary) == 1
    assert "failures 0" in summary[0] and " p99 " in summary[0]


def test_bad_input_is_a_clear_error(dev: Dev) -> None:
    bad = rocketq("topic", "create", "bad topic!", "-n", dev.namesrv)
    assert bad.returncode != 0
    assert "topic name 'bad topic!'" in bad.stderr and "Traceback" not in bad.stderr
    bad_send = rocketq("produce", "no/slash", "--body", "x", "-n", dev.namesrv)
    assert bad_send.returncode != 0 and "topic name" in bad_send.stderr
    missing = rocketq("topic", "describe", "NoSuchTopicHere", "-n", dev.namesrv)
    assert missing.returncode != 0 and "NoSuchTopicHere" in missing.stderr
    nobody = rocketq("topic", "list", "-n", "127.0.0.1:1")
    assert nobody.returncode != 0 and "no nameserver answered" in nobody.stderr


def test_dev_down_stops_both_processes(dev: Dev) -> None:
    out = ok("dev", "down", "--dir", str(dev.base))
    assert "RocketQ stopped" in out
    until_sync(lambda: not any(pid_alive(pid) for pid in dev.pids), "both processes gone", 10)
    assert not (dev.base / "pids.json").exists()
    again = rocketq("dev", "down", "--dir", str(dev.base))
    assert again.returncode != 0 and "no detached RocketQ" in again.stderr
