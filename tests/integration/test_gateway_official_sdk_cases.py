"""More of issue 17's cases for the official RocketMQ 5 Python SDK against the v2 gateway.

Async sends, a tag filter that excludes, a stale receipt handle refused, and a push consumer's
retries used up into ``%DLQ%{group}``. The SDK (``rocketmq-python-client`` 5.1.2 in
``.venv-rmq5``) runs the applications under tests/integration/v2_apps/ in their own processes,
started by the helpers of test_gateway_official_sdk.py. One nameserver and one broker with its
gateway on a free loopback port for the module; each test has its own topic and groups.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq.client.admin import Admin, GroupConfig
from services.broker.gateway._v2api import definition_pb2 as v2
from tests.integration.test_gateway_official_sdk import (
    APP_TIMEOUT_S,
    APPS,
    SDK_PYTHON,
    make_topic,
    run_app,
)
from tests.support.cluster import Cluster, cluster
from tests.support.until import until

pytestmark = pytest.mark.integration

DLQ_RETRY_MAX_TIMES = 2
"""The push test's group: delivered 1 + 2 times, then dead-lettered by the broker's revive."""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    assert SDK_PYTHON.exists(), "make setup installs the official SDK into .venv-rmq5"
    with cluster(tmp_path_factory.mktemp("gateway-cases"), gateway=True) as c:
        assert c.gateway_ports is not None
        yield c, c.gateway_ports[c.broker.name]
        c.check_logs()


async def test_async_sends_are_all_acknowledged_and_received_once(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Async")
    out = run_app("async_send.py", port, "V2Async", "v2-async", 8, tmp_path)
    sent, received = out["sent"], out["received"]
    assert len(set(sent)) == 8  # every future resolved to its own receipt
    assert sorted(r["id"] for r in received) == sorted(sent)  # each exactly once
    assert sorted(r["body"] for r in received) == sorted(f"async-{i}" for i in range(8))


async def test_a_tag_filter_excludes_other_tags(gw: tuple[Cluster, int], tmp_path: Path) -> None:
    c, port = gw
    await make_topic(c, "V2Tags")
    out = run_app("tag_filter.py", port, "V2Tags", "v2-tags", 3, tmp_path)
    sent, seen = out["sent"], out["seen"]
    # Group a, subscribed to TagA, gets exactly the TagA messages though TagB's were stored
    # between them; group b gets the TagB ones the filter skipped for a.
    assert sorted(s["id"] for s in seen["a"]) == sorted(sent["TagA"]), seen
    assert {s["tag"] for s in seen["a"]} == {"TagA"}
    assert sorted(s["id"] for s in seen["b"]) == sorted(sent["TagB"]), seen
    assert {s["tag"] for s in seen["b"]} == {"TagB"}


async def test_a_stale_receipt_handle_is_refused_and_the_new_one_acks(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    await make_topic(c, "V2Stale")
    out = run_app("stale_handle.py", port, "V2Stale", "v2-stale", 1, tmp_path)
    assert out["handles_differ"], "ChangeInvisibleDuration must return a new receipt handle"
    stale = out["stale"]
    assert stale is not None, "the ack with the old handle was accepted"
    assert (stale["type"], stale["code"]) == ("BadRequestException", v2.INVALID_RECEIPT_HANDLE)
    assert "stale" in stale["text"]  # the broker's message says what to do
    assert out["fresh"] is None  # the ack with the new handle succeeded


async def test_push_consumer_retries_exhausted_go_to_the_dead_letter_queue(
    gw: tuple[Cluster, int], tmp_path: Path
) -> None:
    c, port = gw
    group, count = "v2-doomed", 2
    await make_topic(c, "V2Doomed")
    async with Admin(c.namesrv_addrs) as admin:
        made = await admin.create_group(GroupConfig(group, retry_max_times=DLQ_RETRY_MAX_TIMES))
        assert all(r.ok for r in made)
        errors = (tmp_path / "push_dlq.stderr").open("w")  # a file: a full pipe would block it
        app = subprocess.Popen(
            [str(SDK_PYTHON), str(APPS / "push_dlq.py"), f"127.0.0.1:{port}", "V2Doomed", group,
             str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            cwd=tmp_path,
        )  # fmt: skip
        try:
            assert app.stdout is not None
            sent = json.loads(app.stdout.readline())["sent"]  # blocks only until the sends end
            assert len(sent) == count

            async def dead_lettered() -> bool:
                return (await admin.dead_letters(group)).total >= count

            await until(dead_lettered, f"{count} in %DLQ%{group}", timeout_s=APP_TIMEOUT_S)
            dead = (await admin.dead_letters(group)).messages
            # Closing its stdin (communicate does) ends the app: it reports what it saw.
            report, _ = app.communicate(timeout=APP_TIMEOUT_S)
        finally:
            if app.poll() is None:
                app.kill()
                app.wait()
            errors.close()
    err = (tmp_path / "push_dlq.stderr").read_text()
    assert app.returncode == 0, f"push_dlq.py failed:\n{err[-4000:]}"
    seen = json.loads(report.strip().splitlines()[-1])["seen"]
    attempts = DLQ_RETRY_MAX_TIMES + 1
    for msg_id in sent:  # delivered max attempts times, then never again
        assert [s["attempt"] for s in seen if s["id"] == msg_id] == list(range(1, attempts + 1))
    assert sorted(m.msg_id for m in dead) == sorted(sent)
    assert all(m.reconsume_times == attempts for m in dead)
    assert sorted(m.body for m in dead) == [b"doomed-0", b"doomed-1"]
