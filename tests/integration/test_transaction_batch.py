"""Batch half messages on real processes (services/broker/transaction_batch.py): one half whose
body is many records, committed all at once, rolled back all at once, delayed records sent
through the timer wheel at the commit, and every malformed batch refused when the half is sent.

One nameserver, one broker and a timer wheel for the module; each test uses its own topic.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2, messaging_pb2
from rocketq.codec import Prop, SysFlag
from rocketq.message import new_unique_id
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

GROUP = "batch-half-pg"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("batch_half")
    with cluster(root, timer_wheel=True, timer_keys={"timerPrecisionMs": 100}) as c:
        yield c
        c.check_logs()


def records(topic: str, rows: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """Rows as a sent batch's records, each with its own UNIQ_KEY unless given."""
    out = []
    for body, props in rows:
        full = {Prop.UNIQ_KEY: new_unique_id(), **props}
        encoded = codec.encode_properties({k: v for k, v in full.items() if v != ""})
        out.append(codec.encode_sent_record(topic.encode(), body, encoded, 0, 0, 1))
    return b"".join(out)


async def send_half(
    c: RawClient, topic: str, body: bytes, count: int | str, sys_flag: int = 0
) -> messaging_pb2.SendResult:
    resp = await c.messaging.Send(
        messaging_pb2.SendRequest(
            producer_group=GROUP,
            default_topic="TBW102",
            queue_id=0,
            sys_flag=SysFlag.TRANSACTION_PREPARED | sys_flag,
            messages=[
                common_pb2.Message(
                    topic=topic,
                    body=body,
                    properties={
                        Prop.TRANSACTION_PREPARED: "true",
                        Prop.TRANSACTION_BATCH: str(count),
                    },
                )
            ],
        )
    )
    result: messaging_pb2.SendResult = resp.results[0]
    return result


async def end(c: RawClient, sent: messaging_pb2.SendResult, resolution: int) -> None:
    await c.messaging.EndTransaction(
        messaging_pb2.EndTransactionRequest(
            producer_group=GROUP,
            commitlog_offset=codec.decode_offset_msg_id(sent.offset_msg_id)[1],
            queue_offset=sent.queue_offset,
            transaction_id=sent.transaction_id,
            resolution=resolution,  # type: ignore[arg-type]
        )
    )


async def pulled(c: RawClient, topic: str) -> list[common_pb2.StoredMessage]:
    """Every message of queue 0 of ``topic``, from its start."""
    out: list[common_pb2.StoredMessage] = []
    while True:
        resp = await c.messaging.Pull(
            messaging_pb2.PullRequest(
                consumer_group="batch-half-reader",
                topic=topic,
                queue_id=0,
                queue_offset=len(out),
                sys_flag=0x4,
                subscription="*",
                decoded=True,
                max_msg_nums=1000,
            )
        )
        if not resp.messages:
            return out
        out.extend(resp.messages)


async def test_commit_stores_every_record_in_order_and_rollback_none(env: Cluster) -> None:
    async with RawClient(env.broker.addr) as c:
        await c.make_topic("BatchHalf", queues=1)
        rows = [(f"r{i:03d}".encode(), {Prop.TAGS: "t", "n": str(i)}) for i in range(300)]
        sent = await send_half(c, "BatchHalf", records("BatchHalf", rows), 300)
        assert sent.status == messaging_pb2.SEND_OK
        listed = await c.admin.ListHalfMessages(
            admin_pb2.ListHalfMessagesRequest(topic="BatchHalf")
        )
        assert listed.total == 1  # one transaction for the 300 rows
        before = [m.message.body for m in await pulled(c, "BatchHalf")]
        await end(c, sent, messaging_pb2.TRANSACTION_COMMIT)
        await end(c, sent, messaging_pb2.TRANSACTION_COMMIT)  # idempotent: nothing more
        got = [m.message for m in (await pulled(c, "BatchHalf"))[len(before) :]]
        assert [m.body for m in got] == [b for b, _ in rows]
        assert [m.properties["n"] for m in got] == [str(i) for i in range(300)]
        assert all(m.properties[Prop.TAGS] == "t" for m in got)
        assert len({m.properties[Prop.UNIQ_KEY] for m in got}) == 300
        assert all(Prop.TRANSACTION_BATCH not in m.properties for m in got)
        dropped = await send_half(c, "BatchHalf", records("BatchHalf", rows[:5]), 5)
        await end(c, dropped, messaging_pb2.TRANSACTION_ROLLBACK)
        await end(c, dropped, messaging_pb2.TRANSACTION_COMMIT)  # too late: rolled back
        assert len(await pulled(c, "BatchHalf")) == len(before) + 300


async def test_delayed_records_wait_for_the_commit_then_their_time(env: Cluster) -> None:
    async with RawClient(env.broker.addr) as c:
        await c.make_topic("BatchHalfLater", queues=1)
        base = len(await pulled(c, "BatchHalfLater"))
        rows = [
            (b"now", {}),
            (b"later", {Prop.TIMER_DELAY_MS: "1500"}),
            (b"past", {Prop.TIMER_DELIVER_MS: "1"}),
        ]
        sent = await send_half(c, "BatchHalfLater", records("BatchHalfLater", rows), 3)
        assert sent.status == messaging_pb2.SEND_OK
        committed_ms = time.time() * 1000
        await end(c, sent, messaging_pb2.TRANSACTION_COMMIT)
        first = [m.message.body for m in (await pulled(c, "BatchHalfLater"))[base:]]
        assert first == [b"now", b"past"]

        async def arrived() -> bool:
            return len(await pulled(c, "BatchHalfLater")) == base + 3

        await until(arrived, "the delayed record delivered by the timer wheel", timeout_s=30)
        late = (await pulled(c, "BatchHalfLater"))[base + 2]
        assert late.message.body == b"later"
        # Counted from the commit (the clocks are one machine's; 50 ms for rounding).
        assert late.store_timestamp_ms >= committed_ms + 1500 - 50


async def test_malformed_batches_are_refused_when_sent(env: Cluster) -> None:
    async with RawClient(env.broker.addr) as c:
        await c.make_topic("BatchHalfBad", queues=1)
        good = records("BatchHalfBad", [(b"a", {}), (b"b", {})])
        corrupt = bytearray(good)
        corrupt[-3] ^= 0xFF  # inside record 1's properties, past its CRC'd body: bad UTF-8
        crc_broken = bytearray(good)
        crc_broken[2] ^= 0x01  # record 0's TOTALSIZE
        no_uniq = b"".join(
            codec.encode_sent_record(b"BatchHalfBad", b"x", b"", 0, 0, 1) for _ in range(2)
        )
        cases: list[tuple[bytes, int | str, int, str]] = [
            (good, 3, 0, "holds 2 records"),
            (good, "many", 0, "1..65536"),
            (good, 0, 0, "1..65536"),
            (zlib.compress(good), 2, SysFlag.COMPRESSED, "must not be compressed"),
            (b"not records at all", 1, 0, "batch half message body"),
            (bytes(corrupt), 2, 0, "record 1"),
            (bytes(crc_broken), 2, 0, "record 0"),
            (records("OtherTopic", [(b"a", {})]), 1, 0, "OtherTopic"),
            (no_uniq, 2, 0, "no UNIQ_KEY"),
            (records("BatchHalfBad", [(b"a", {Prop.REAL_TOPIC: "x"})]), 1, 0, "REAL_TOPIC"),
            (records("BatchHalfBad", [(b"a", {Prop.TIMER_SOURCE: "1"})]), 1, 0, "TIMER_SOURCE"),
            (records("BatchHalfBad", [(b"a", {Prop.TIMER_DELAY_MS: "soon"})]), 1, 0, "integer"),
            (
                records(
                    "BatchHalfBad",
                    [(b"a", {Prop.TIMER_DELAY_MS: "5", Prop.TIMER_DELIVER_MS: "9"})],
                ),
                1,
                0,
                "one delay property",
            ),
            (
                records("BatchHalfBad", [(b"a", {Prop.TIMER_DELAY_MS: str(10**12)})]),
                1,
                0,
                "timerMaxDelaySec",
            ),
        ]
        for body, count, flag, words in cases:
            code, _, text = await refused(send_half(c, "BatchHalfBad", body, count, flag))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (words, text)
            assert words in text, (words, text)
        listed = await c.admin.ListHalfMessages(
            admin_pb2.ListHalfMessagesRequest(topic="BatchHalfBad")
        )
        assert listed.total == 0  # nothing of a refused batch was stored
        # Only the message that created the topic is in it.
        assert [m.message.body for m in await pulled(c, "BatchHalfBad")] == [b"x"]
