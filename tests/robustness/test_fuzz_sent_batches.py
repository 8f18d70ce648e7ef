"""Batches sent as encoded records (SendRequest.records, DESIGN.md §12) against a real broker.

A producer's batch arrives as commitlog records that the broker checks and stores as they
came. Broken batches — truncated, a wrong body CRC, a TOTALSIZE beyond the request, two topics,
a bad magic — are refused with INVALID_ARGUMENT naming the record and the fault, and nothing
of them is stored; then a few hundred randomly mutated batches (fixed seed) must each be
either stored whole or refused whole, the queue's end must count exactly the stored ones, and
``store verify`` must find the commitlog, consume queue and index consistent.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import grpc
import pytest

from rocketq import codec
from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from services.store.inspect import detect_layout, verify
from tests.integration.cluster import ServiceProcess, start_broker, start_nameserver

pytestmark = [pytest.mark.robustness, pytest.mark.slow]

TOPIC = "SentBatchFuzz"
OTHER = "SentBatchOther"
SEED = 12
MUTATED_BATCHES = 300
RECORDS = 6


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("sent-batches")
    ns = start_nameserver(root)
    b = start_broker(root, [ns.addr])
    try:
        with grpc.insecure_channel(b.addr) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            for topic in (TOPIC, OTHER):
                admin.CreateTopic(
                    admin_pb2.CreateTopicRequest(
                        target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                        config=common_pb2.TopicConfig(
                            topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=6
                        ),
                    ),
                    timeout=10,
                )
        yield b
    finally:
        for sp in (b, ns):
            if sp.alive():
                sp.stop(timeout_s=15)


def record(i: int, topic: str = TOPIC) -> bytes:
    props = {"UNIQ_KEY": f"{i:032X}", "TAGS": f"tag{i % 3}", "KEYS": f"k{i} order-{i % 5}"}
    body = f"message {i} ".encode() * (1 + i % 7)
    return codec.encode_sent_record(
        topic.encode(), body, codec.encode_properties(props), i, 0, 1_700_000_000_000 + i
    )


def batch(start: int, n: int = RECORDS) -> list[bytes]:
    return [record(start + i) for i in range(n)]


def send(stub: messaging_pb2_grpc.MessagingStub, records: bytes) -> messaging_pb2.SendResponse:
    return stub.Send(messaging_pb2.SendRequest(queue_id=0, records=records), timeout=10)


def max_offset(stub: messaging_pb2_grpc.MessagingStub) -> int:
    req = messaging_pb2.GetMaxOffsetRequest(topic=TOPIC, queue_id=0)
    return stub.GetMaxOffset(req, timeout=10).offset


def refused(stub: messaging_pb2_grpc.MessagingStub, records: bytes) -> str:
    with pytest.raises(grpc.RpcError) as info:
        send(stub, records)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    return str(err.details())


def with_int(raw: bytes, at: int, value: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into(">i", out, at, value)
    return bytes(out)


def test_a_good_batch_is_stored_in_order_with_dense_offsets(broker: ServiceProcess) -> None:
    with grpc.insecure_channel(broker.addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        before = max_offset(stub)
        resp = send(stub, b"".join(batch(1000)))
        assert [r.queue_offset for r in resp.results] == list(range(before, before + RECORDS))
        assert [r.msg_id for r in resp.results] == [f"{1000 + i:032X}" for i in range(RECORDS)]
        pulled = stub.Pull(
            messaging_pb2.PullRequest(
                consumer_group="g", topic=TOPIC, queue_id=0, queue_offset=before,
                max_msg_nums=RECORDS, suspend_timeout_ms=0, subscription="*", sys_flag=0x4,
            ),
            timeout=10,
        )  # fmt: skip
        got = list(codec.iter_records(pulled.records))
        assert [r.body for r in got] == [codec.decode_record(x).body for x in batch(1000)]
        assert [r.queue_offset for r in got] == list(range(before, before + RECORDS))
        assert got[2].properties["KEYS"] == "k1002 order-2" and got[2].flag == 1002


def test_broken_batches_are_refused_whole_naming_the_fault(broker: ServiceProcess) -> None:
    good = batch(2000)
    crc_at = codec.OFFSET_BODYCRC
    cases = {
        "truncated": (b"".join(good)[:-10], "record 5"),
        "wrong body CRC": (b"".join([*good[:3], with_int(good[3], crc_at, 12345), *good[4:]]),
                           "record 3: BODYCRC 12345"),
        "size beyond the request": (b"".join([*good[:2], with_int(good[2], 0, 1 << 20)]),
                                    "record 2 at byte"),
        "two topics": (b"".join([*good[:4], record(2004, OTHER)]), "record 4 has topic"),
        "bad magic": (b"".join([with_int(good[0], codec.OFFSET_MAGIC, 7), *good[1:]]),
                      "record 0 at byte 0: magic"),
        "a flag the producer may not set": (
            b"".join([with_int(good[0], codec.OFFSET_SYSFLAG, 0x4), *good[1:]]), "SYSFLAG 0x4"),
    }  # fmt: skip
    with grpc.insecure_channel(broker.addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        before = max_offset(stub)
        for name, (records, expected) in cases.items():
            details = refused(stub, records)
            assert expected in details, f"{name}: {details}"
        assert "TOTALSIZE 1048576" in refused(stub, cases["size beyond the request"][0])
        both = messaging_pb2.SendRequest(
            queue_id=0,
            records=b"".join(good),
            messages=[common_pb2.Message(topic=TOPIC, body=b"x")],
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Send(both, timeout=10)
        assert "not both" in str(info.value.details())
        assert max_offset(stub) == before, "nothing of a refused batch may be stored"


def mutate(rng: random.Random, raw: bytes) -> bytes:
    out = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(4)
        if kind == 0 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif kind == 1 and len(out) > 4:
            at = rng.randrange(len(out) - 4)
            out[at : at + 4] = struct.pack(">i", rng.choice([0, -1, 1 << 30, rng.randrange(400)]))
        elif kind == 2:
            del out[rng.randrange(len(out) + 1) :]
        else:
            at = rng.randrange(len(out) + 1)
            out[at:at] = out[: rng.randrange(1, 200)]
    return bytes(out)


def test_mutated_batches_are_stored_whole_or_not_at_all(broker: ServiceProcess) -> None:
    rng = random.Random(SEED)
    stored = refusals = 0
    with grpc.insecure_channel(broker.addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        start = max_offset(stub)
        for n in range(MUTATED_BATCHES):
            records = mutate(rng, b"".join(batch(10_000 + n * RECORDS)))
            try:
                resp = send(stub, records)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (n, err.details())
                refusals += 1
                continue
            stored += len(resp.results)
        assert max_offset(stub) == start + stored
    assert refusals > MUTATED_BATCHES // 2 and stored > 0, (refusals, stored)
    broker.stop(timeout_s=15)
    assert "Traceback" not in broker.log_path.read_text(errors="replace")
    report = verify(detect_layout(broker.workdir / "store"))
    assert report.ok, report.problems[:10]
