"""The transaction check service on a real store and ClientManager, with a ManualClock (SPEC §9).

Producers are ClientManager channels registered by heartbeat, exactly as ClientStream does it;
a check "arrives" when it lands in a channel's push queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.codec import Prop
from rocketq.validation import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from services.broker.client_manager import ClientChannel
from services.broker.transaction_check import TransactionCheckService
from services.broker.transaction_half import CHECK_GROUP, TRAN_STATE, TransactionIndex
from tests.unit.test_transaction_end import COMMIT, ROLLBACK, Tx

pytestmark = pytest.mark.unit

TIMEOUT_MS = 6000


class Checked(Tx):
    def __init__(self, root: Path, **config: object) -> None:
        super().__init__(root, **config)
        self.checker = TransactionCheckService(
            config=self.config,
            store=self.store,
            topics=self.topics,
            offsets=self.offsets,
            clients=self.clients,
            index=self.index,
            clock=self.clock,
        )

    def producer(self, client_id: str, group: str = "pg") -> ClientChannel:
        channel = self.clients.open_channel(client_id, "ipv4:10.0.0.9:5000")
        self.clients.heartbeat(
            channel,
            messaging_pb2.Heartbeat(
                client_id=client_id, producers=[messaging_pb2.ProducerData(producer_group=group)]
            ),
        )
        channel.queue.get_nowait()  # the heartbeat ack
        return channel

    async def round(self) -> None:
        await self.checker.check_once()

    def progress(self, topic: str = TRANS_HALF_TOPIC) -> int:
        return self.offsets.query(CHECK_GROUP, topic, 0)


def checks(channel: ClientChannel) -> list[messaging_pb2.CheckTransactionState]:
    out = []
    while not channel.queue.empty():
        push = channel.queue.get_nowait()
        assert push is not None and push.HasField("check_transaction_state")
        out.append(push.check_transaction_state)
    return out


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Checked]:
    parts = Checked(tmp_path, transaction_check_max=3)
    yield parts
    parts.close()


async def test_young_half_messages_are_not_checked(c: Checked) -> None:
    p = c.producer("p1")
    await c.half()
    c.clock.advance_ms(TIMEOUT_MS - 1)
    await c.round()
    assert checks(p) == []
    assert c.store.max_offset(TRANS_HALF_TOPIC, 0) == 1
    assert c.progress() == 0, "the round moved past a message it stopped at"


async def test_an_old_half_message_is_reput_and_checked_once_per_round(c: Checked) -> None:
    p = c.producer("p1")
    sent = await c.half(b"x", queue_id=2)
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    [check] = checks(p)
    [old, copy] = c.records(TRANS_HALF_TOPIC)
    assert copy.uniq_key == sent.transaction_id and copy.born_timestamp_ms == old.born_timestamp_ms
    assert copy.properties[Prop.TRANSACTION_CHECK_TIMES] == "1"
    assert check.producer_group == "pg"
    assert check.transaction_id == check.msg_id == sent.transaction_id
    assert (check.commitlog_offset, check.queue_offset) == (copy.physical_offset, 1)
    assert check.message.message.topic == "T" and check.message.queue_id == 2
    assert check.message.message.body == b"x"
    assert check.message.commitlog_offset == copy.physical_offset
    assert Prop.REAL_TOPIC not in check.message.message.properties
    assert c.progress() == 1, "progress stops at the max offset the round began with"
    assert c.index.checks == 1


async def test_the_answer_to_a_check_commits_exactly_once(c: Checked) -> None:
    p = c.producer("p1")
    sent = await c.half(b"x")
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    [check] = checks(p)
    answer = messaging_pb2.EndTransactionRequest(
        producer_group=check.producer_group,
        commitlog_offset=check.commitlog_offset,
        queue_offset=check.queue_offset,
        msg_id=check.msg_id,
        transaction_id=check.transaction_id,
        resolution=COMMIT,
        from_transaction_check=True,
    )
    await c.ends.end(answer)
    await c.end(sent, COMMIT)  # the producer's own late commit of the first copy
    c.clock.advance_ms(60_000)
    await c.round()
    assert checks(p) == []
    assert [r.body for r in c.records("T", 1)] == [b"x"]
    assert c.store.max_offset(TRANS_HALF_TOPIC, 0) == 2, "a resolved message was re-put"


async def test_resolved_messages_are_skipped_and_progress_passes_them(c: Checked) -> None:
    p = c.producer("p1")
    for decision in (COMMIT, ROLLBACK):
        await c.end(await c.half(), decision)
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    assert checks(p) == []
    assert c.progress() == 2
    assert c.progress(TRANS_OP_HALF_TOPIC) == 2, "the op progress did not follow"
    assert c.index.entries == {}, "decided entries below the progress are kept"


async def test_discard_after_check_max(c: Checked, caplog: pytest.LogCaptureFixture) -> None:
    sent = await c.half()  # no producer alive: every check counts anyway
    for _ in range(3):
        c.clock.advance_ms(TIMEOUT_MS)
        await c.round()
    assert c.index.checks == 3 and c.index.discarded == 0
    c.clock.advance_ms(TIMEOUT_MS)
    with caplog.at_level("ERROR"):
        await c.round()
    assert c.index.discarded == 1
    assert any(
        "discarded" in r.message and sent.transaction_id in r.message for r in caplog.records
    )
    [op] = c.records(TRANS_OP_HALF_TOPIC)
    assert op.properties[TRAN_STATE] == "DISCARD"
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    assert c.index.checks == 3, "a discarded message was checked again"
    await c.end(sent, COMMIT)
    assert c.store.max_offset("T", 1) == 0, "a discarded message was committed"
    assert c.index.stats() == {
        "transaction_half_pending": "0",
        "transaction_checks": "3",
        "transaction_discarded": "1",
    }


async def test_checks_rotate_over_producers_and_skip_a_dead_one(c: Checked) -> None:
    p1, p2 = c.producer("p1"), c.producer("p2")
    c.producer("q1", group="other")
    for _ in range(2):
        await c.half()
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    assert len(checks(p1)) == 1 and len(checks(p2)) == 1
    p1.close()
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    assert len(checks(p2)) == 2


async def test_check_immunity_property(c: Checked) -> None:
    p = c.producer("p1")
    late = await c.half(b"late", CHECK_IMMUNITY_TIME_IN_SECONDS="60")
    early = await c.half(b"early", CHECK_IMMUNITY_TIME_IN_SECONDS="2")
    c.clock.advance_ms(2000)
    await c.round()
    # "late" is younger than the timeout: the round stops there, "early" waits behind it
    assert checks(p) == []
    c.clock.advance_ms(TIMEOUT_MS)
    await c.round()
    [check] = checks(p)
    assert check.transaction_id == early.transaction_id
    deferred = c.records(TRANS_HALF_TOPIC)[-2]
    assert deferred.uniq_key == late.transaction_id
    assert Prop.TRANSACTION_CHECK_TIMES not in deferred.properties or (
        deferred.properties[Prop.TRANSACTION_CHECK_TIMES] == "0"
    )
    c.clock.advance_ms(60_000)
    await c.round()
    assert [x.transaction_id for x in checks(p)] == [late.transaction_id, early.transaction_id]


async def test_an_older_copy_left_behind_by_a_crash_is_not_checked(tmp_path: Path) -> None:
    parts = Checked(tmp_path)
    try:
        p = parts.producer("p1")
        await parts.half()
        parts.clock.advance_ms(TIMEOUT_MS)
        await parts.round()
        assert len(checks(p)) == 1
        # A crash before the progress was persisted: back to 0, the index rebuilt.
        parts.offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, 0)
        parts.index.rebuild(parts.store, parts.offsets)
        parts.clock.advance_ms(TIMEOUT_MS)
        await parts.round()
        [check] = checks(p)
        assert check.queue_offset == 2, "the stale first copy was checked"
        assert parts.store.max_offset(TRANS_HALF_TOPIC, 0) == 3
    finally:
        parts.close()


async def test_round_runs_in_slices(tmp_path: Path) -> None:
    parts = Checked(tmp_path)
    parts.checker.slice_records_max = 3
    try:
        for _ in range(10):
            await parts.half()
        parts.clock.advance_ms(TIMEOUT_MS)
        await parts.round()
        assert parts.index.checks == 10
        assert parts.progress() == 10
        assert parts.store.max_offset(TRANS_HALF_TOPIC, 0) == 20
    finally:
        parts.close()


async def test_index_rebuild_matches_what_was_stored(tmp_path: Path) -> None:
    parts = Checked(tmp_path)
    await parts.half()
    await parts.end(await parts.half(), COMMIT)
    index = TransactionIndex()
    index.rebuild(parts.store, parts.offsets)
    assert index.stats()["transaction_half_pending"] == "1"
    assert len(index.ops) == 1
    assert {e.decision for e in index.entries.values()} == {None, "COMMIT"}
    parts.close()
