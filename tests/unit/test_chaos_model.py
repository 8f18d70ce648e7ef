"""The chaos checker on made-up histories: each kind of violation is found, a clean history
passes, and indeterminate sends are held to nothing."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from rocketq.client.producer import Producer
from rocketq.message import Message, MessageQueue, SendResult, SendStatus
from tests.robustness.chaos.model import (
    Expectations,
    History,
    duplicate_bound,
)
from tests.robustness.chaos.recorder import Recorder, read_events
from tests.robustness.chaos.traffic import ID_PROPERTY, ProducerTraffic
from tests.robustness.chaos.validate import validate

pytestmark = pytest.mark.unit

MS = 1_000_000
GROUPS = {"g": frozenset({"T"}), "o": frozenset({"O"})}


class Builder:
    """Events of a small history; times in ms."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.next_offset: dict[tuple[str, int], int] = {}

    def send(
        self,
        id: str,
        t0: int,
        *,
        topic: str = "T",
        queue: int = 0,
        offset: int | None = None,
        outcome: str = "SEND_OK",
        shard: str = "",
        seq: int = -1,
        delay_ms: int = 0,
        store: bool = True,
    ) -> int:
        if outcome == "ERROR" and not store:
            queue = offset = -1  # an error answer carries no position
        elif offset is None:
            offset = self.next_offset.get((topic, queue), 0)
        self.next_offset[(topic, queue)] = max(self.next_offset.get((topic, queue), 0), offset + 1)
        self.events.append(
            dict(ev="send", proc="p1", id=id, topic=topic, shard=shard, seq=seq,
                 delay_ms=delay_ms, t0=t0 * MS, t1=(t0 + 5) * MS, outcome=outcome,
                 broker="broker-a", queue=queue, offset=offset)
        )  # fmt: skip
        if store and not delay_ms:
            self.stored(id, topic, queue, offset)
        return offset

    def invoke(self, id: str, t0: int, *, topic: str = "T") -> None:
        """A send begun and never answered (no ``send`` event follows)."""
        self.events.append(
            dict(ev="invoke", proc="p1", id=id, topic=topic, shard="", seq=-1, delay_ms=0,
                 t0=t0 * MS)
        )  # fmt: skip

    def stored(self, id: str, topic: str, queue: int, offset: int) -> None:
        self.events.append(
            dict(ev="stored", proc="readback", topic=topic, broker="broker-a", queue=queue,
                 offset=offset, id=id)
        )  # fmt: skip

    def deliver(
        self, id: str, t: int, *, group: str = "g", topic: str = "T", queue: int = 0,
        offset: int = 0,
    ) -> None:  # fmt: skip
        self.events.append(
            dict(ev="deliver", proc="c1", group=group, id=id, topic=topic, broker="broker-a",
                 queue=queue, offset=offset, t=t * MS)
        )  # fmt: skip

    def offset_op(self, kind: str, offset: int, t0: int, *, proc: str = "c1") -> None:
        self.events.append(
            dict(ev=kind, proc=proc, group="g", topic="T", broker="broker-a", queue=0,
                 offset=offset, t0=t0 * MS, t1=(t0 + 2) * MS)
        )  # fmt: skip

    def fault(self, kind: str, t0: int, t1: int) -> None:
        self.events.append(
            dict(ev="fault", proc="injector", kind=kind, target="broker-a/r1",
                 group="broker-a", t0=t0 * MS, t1=t1 * MS)
        )  # fmt: skip

    def check(self, **kw: Any) -> Any:
        exp = Expectations(groups=kw.pop("groups", {"g": frozenset({"T"})}), **kw)
        return validate(History.from_events(self.events), exp)


def clean(n: int = 5) -> Builder:
    b = Builder()
    for i in range(n):
        off = b.send(f"m{i}", 10 * i)
        b.deliver(f"m{i}", 10 * i + 7, offset=off)
    return b


def test_a_clean_history_passes() -> None:
    b = clean()
    b.offset_op("commit", 5, 60)
    b.offset_op("fetch", 5, 70, proc="c2")
    v = b.check(duplicates_max={"g": 0})
    assert v.ok, v.summary()
    assert v.counts["acked"] == 5 and v.counts["duplicates[g]"] == 0


def test_loss_of_an_acked_message_is_found() -> None:
    b = clean()
    b.send("lost", 100)
    v = b.check()
    assert not v.ok
    assert any("never got lost" in m for m in v.failures["loss"]), v.summary()


def test_an_acked_message_missing_from_the_stores_is_lost_too() -> None:
    b = clean()
    off = b.send("gone", 100, store=False)
    b.deliver("gone", 105, offset=off)
    v = b.check()
    assert any("not stored on the final masters" in m for m in v.failures["loss"])


def test_indeterminate_sends_may_vanish_or_arrive() -> None:
    b = clean()
    b.send("maybe1", 100, outcome="ERROR", store=False)
    off = b.send("maybe2", 110, outcome="FLUSH_SLAVE_TIMEOUT")
    b.deliver("maybe2", 120, offset=off)
    v = b.check()
    assert v.ok, v.summary()
    assert v.counts["indeterminate"] == 2


def test_a_phantom_delivery_is_found() -> None:
    b = clean()
    b.deliver("never-sent", 200, offset=9)
    assert "phantom" in b.check().failures


def test_an_unfinished_send_that_was_stored_is_not_a_phantom() -> None:
    # the producer was stopped (or killed) while this send was in flight; the broker stored it
    b = clean()
    b.invoke("in-flight", 100)
    b.stored("in-flight", "T", 0, 5)
    b.deliver("in-flight", 120, offset=5)
    v = b.check()
    assert v.ok, v.summary()
    assert v.counts["unfinished"] == 1 and v.counts["indeterminate"] == 1


def test_an_unfinished_send_may_also_vanish() -> None:
    b = clean()
    b.invoke("never-answered", 100)
    v = b.check()
    assert v.ok, v.summary()


def test_an_id_never_invoked_is_a_phantom_even_beside_unfinished_sends() -> None:
    b = clean()
    b.invoke("in-flight", 100)
    b.deliver("in-flight", 120, offset=5)
    b.deliver("never-invoked", 130, offset=6)
    v = b.check()
    assert v.failures.keys() == {"phantom"}
    assert "never-invoked" in " ".join(v.failures["phantom"])
    assert "in-flight" not in " ".join(v.failures["phantom"])


class HeldProducer:
    """Stands in for the SDK producer under ProducerTraffic: each send waits for ``release``."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[str] = []

    async def send(self, msg: Message, sharding_key: str = "") -> SendResult:
        self.sent.append(msg.properties[ID_PROPERTY])
        self.entered.set()
        await self.release.wait()
        mq = MessageQueue(msg.topic, "broker-a", 0)
        return SendResult(SendStatus.SEND_OK, "uniq", "offset-id", mq, len(self.sent) - 1)


async def test_stop_waits_for_an_in_flight_orderly_send(tmp_path: Path) -> None:
    # one sharding key, no round-robin send due for 10 s: the only send is the key's first
    args = argparse.Namespace(
        seed=0, proc="p1", topic="T", orderly_topic="O", rate=1.0, orderly_share=1.0, shards=1,
        delay_share=0.0, delay_ms=0,
    )  # fmt: skip
    producer = HeldProducer()
    path = tmp_path / "p1.jsonl"
    stop = asyncio.Event()
    with Recorder(path, "p1") as rec:
        traffic = ProducerTraffic(args, cast(Producer, producer), rec)
        running = asyncio.create_task(traffic.run(stop))
        await producer.entered.wait()
        stop.set()
        for _ in range(10):  # let run() see the stop; before the fix it cancelled the send here
            await asyncio.sleep(0)
        producer.release.set()
        await running
    h = History.from_events(read_events([path]))
    assert producer.sent == ["p1-0"], "no send may start after stop"
    assert [(s.id, s.outcome) for s in h.sends] == [("p1-0", "SEND_OK")]
    assert h.invoked == {"p1-0"} and not h.unfinished
    assert h.in_flight_at_stop == 1


def test_duplicates_are_counted_and_bounded() -> None:
    b = clean()
    for i in range(3):
        b.deliver(f"m{i}", 300 + i, offset=i)
    assert b.check(duplicates_max={"g": 3}).ok
    v = b.check(duplicates_max={"g": 2})
    assert v.counts["duplicates[g]"] == 3
    assert "duplicates" in v.failures


def test_a_message_stored_twice_by_a_retry_is_not_a_consumer_duplicate() -> None:
    b = clean(2)
    b.stored("m1", "T", 0, 2)  # the retry's second copy
    b.deliver("m1", 300, offset=2)
    v = b.check(duplicates_max={"g": 0})
    assert v.ok, v.summary()
    assert v.counts["stored_twice"] == 1


def test_per_key_order_violation_in_an_orderly_group() -> None:
    b = Builder()
    offs = [b.send(f"k{i}", 10 * i, topic="O", shard="key1", seq=i) for i in range(3)]
    b.deliver("k0", 100, group="o", topic="O", offset=offs[0])
    b.deliver("k2", 101, group="o", topic="O", offset=offs[2])
    b.deliver("k1", 102, group="o", topic="O", offset=offs[1])
    v = b.check(groups=GROUPS, orderly_groups=frozenset({"o"}))
    assert any("key key1: seq 1" in m for m in v.failures["order"]), v.summary()
    assert any("offset 1 first delivered" in m for m in v.failures["order"])


def test_redelivery_of_earlier_offsets_is_not_an_order_violation() -> None:
    b = Builder()
    offs = [b.send(f"k{i}", 10 * i, topic="O", shard="key1", seq=i) for i in range(3)]
    for i in (0, 1, 0, 1, 2):  # a rebalance replays from offset 0
        b.deliver(f"k{i}", 100 + i, group="o", topic="O", offset=offs[i])
    v = b.check(groups={"o": frozenset({"O"})}, orderly_groups=frozenset({"o"}))
    assert v.ok, v.summary()


def test_an_offset_acked_twice_is_found() -> None:
    b = clean(2)
    b.send("again", 100, offset=1)  # a second ack at the offset m1 holds
    b.deliver("again", 110, offset=1)
    v = b.check()
    msgs = v.failures["offsets"]
    assert any("offset 1 acknowledged twice" in m for m in msgs), v.summary()
    assert any("moved back" in m for m in msgs)


def test_offsets_moving_back_after_an_ack_are_found() -> None:
    b = Builder()
    b.send("a", 0, offset=5, store=False)
    b.send("b", 20, offset=3, store=False)  # begun after a's ack, lower offset
    v = b.check(groups={}, check_stored=False)
    assert any("moved back" in m for m in v.failures["offsets"]), v.summary()


def test_concurrent_sends_may_finish_out_of_offset_order() -> None:
    b = Builder()
    b.events.append(
        dict(ev="send", proc="p1", id="x", topic="T", t0=0, t1=10 * MS, outcome="SEND_OK",
             broker="broker-a", queue=0, offset=1)
    )  # fmt: skip
    b.events.append(
        dict(ev="send", proc="p2", id="y", topic="T", t0=5 * MS, t1=12 * MS, outcome="SEND_OK",
             broker="broker-a", queue=0, offset=0)
    )  # fmt: skip
    assert b.check(groups={}, check_stored=False).ok


def test_a_gap_in_a_stored_queue_is_found() -> None:
    b = clean(3)
    b.stored("m9", "T", 0, 5)  # offsets 3 and 4 missing
    v = b.check()
    assert any("miss 2: 3-4" in m for m in v.failures["gaps"]), v.summary()


def test_a_consumer_skipping_stored_offsets_is_found() -> None:
    b = Builder()
    offs = [b.send(f"m{i}", 10 * i, outcome="ERROR") for i in range(4)]  # stored anyway
    b.deliver("m0", 100, offset=offs[0])
    b.deliver("m3", 101, offset=offs[3])
    v = b.check()
    assert any("skipped 2 stored offset(s)" in m for m in v.failures["gaps"]), v.summary()


def test_a_consumer_offset_moving_back_is_found() -> None:
    b = clean()
    b.offset_op("commit", 5, 100)
    b.offset_op("fetch", 2, 200, proc="c2")
    v = b.check()
    assert any("behind 5" in m for m in v.failures["consumer_offsets"]), v.summary()


def test_a_consumer_offset_may_move_back_to_the_last_sync_across_a_failover() -> None:
    b = clean()
    b.offset_op("commit", 3, 1000)
    b.offset_op("commit", 5, 9000)  # 1 s before the master is killed: maybe not synced
    b.fault("kill-master", 10_000, 12_000)
    b.offset_op("fetch", 3, 15_000, proc="c2")
    assert b.check(offset_staleness_ms=3000).ok
    b.offset_op("fetch", 2, 16_000, proc="c3")  # behind a commit synced long before
    v = b.check(offset_staleness_ms=3000)
    assert any("behind 3" in m for m in v.failures["consumer_offsets"]), v.summary()


def test_a_timer_delivered_early_is_found() -> None:
    b = clean(1)
    b.send("late", 100, delay_ms=2000)
    b.deliver("late", 100 + 2000, offset=1)
    b.send("early", 200, delay_ms=2000)
    b.deliver("early", 200 + 1500, offset=2)
    v = b.check(check_stored=False)
    assert [m.split(" ")[0] for m in v.failures["timers"]] == ["early"], v.summary()


def test_recovery_time_is_fault_start_to_the_first_ack_after_it() -> None:
    b = clean(2)
    b.fault("kill-master", 50, 60)
    b.send("after", 3000)
    v = b.check(check_stored=False, groups={})
    (r,) = v.recoveries
    assert r.first_ok_ms == pytest.approx(2955)
    assert r.longest_gap_ms == pytest.approx(2955)  # from the fault to the first ack after it


def test_duplicate_bound_grows_with_disruptions_and_rate() -> None:
    base = dict(persist_interval_ms=5000, staleness_ms=1000, slack_ms=2000)
    assert duplicate_bound(rate_per_s=10, disruptions=0, **base) == 80
    assert duplicate_bound(rate_per_s=10, disruptions=3, **base) == 320
    assert duplicate_bound(rate_per_s=0.1, disruptions=0, **base) == 20  # the floor


def test_journals_round_trip_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    with Recorder(path, "p1") as rec:
        rec.record("send", id="a", topic="T", t0=1, t1=2, outcome="SEND_OK")
    with open(path, "a") as f:
        f.write('{"ev":"send","id":"b"')  # a writer killed mid-line
    events = list(read_events([path]))
    assert [e["id"] for e in events] == ["a"]
    h = History.from_events([*events, {"ev": "send", "id": "no-fields"}])
    assert [s.id for s in h.sends] == ["a"] and h.skipped == 1
