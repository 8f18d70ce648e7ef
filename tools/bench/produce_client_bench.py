"""The producer's own CPU per message, without the network: what a ``send_batch`` of 1 KiB
messages costs in Python before gRPC takes the request and after it hands back the answer.
Figures are printed, never asserted.

    python -m tools.bench.produce_client_bench [--batch 128] [--rounds 20] [--repeats 30]

| step               | what is timed (per message of one batch)                               |
|--------------------|------------------------------------------------------------------------|
| Message()          | the application making its ``Message`` objects (tags only)             |
| prepare_batch      | checks, UNIQ_KEYs, properties (``ProducerCore.prepare_batch``)         |
| build_send_request | the SendRequest with the batch encoded as records                       |
| serialize          | ``SerializeToString`` of that request (gRPC does it)                    |
| parse + to_results | a SendResponse of one result per message parsed into ``SendResult``s   |
| parse + compact    | the compact answer (SendResponse.batch) parsed into ``SendResult``s     |
| single send        | prepare + request + serialize of one message (µs per send)             |

Each figure is the best of ``--repeats`` runs of ``--rounds`` batches, in process CPU time, so a
busy machine disturbs it less than wall time. ``make bench-peers`` gives the whole client's CPU
per message, gRPC included.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from rocketq._api.rocketq.v1 import messaging_pb2
from rocketq.client.producer import ProducerConfig
from rocketq.client.producer._core import ProducerCore
from rocketq.client.producer._sender import batch_results, build_send_request, to_results
from rocketq.message import Message, MessageQueue

TOPIC = "BenchPeers"
BODY_BYTES = 1024
OFFSET_MSG_ID = "7F00000100002A9F0000000000012345"


def _best_us_per_msg(fn: Callable[[], object], per_call: int, rounds: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(rounds):
            fn()
        best = min(best, (time.process_time() - started) / rounds / per_call * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="messages per send_batch")
    parser.add_argument("--rounds", type=int, default=20, help="batches per timed run")
    parser.add_argument("--repeats", type=int, default=30, help="timed runs; the best counts")
    args = parser.parse_args()
    n, body = args.batch, b"x" * BODY_BYTES
    core = ProducerCore(ProducerConfig("bench", ["127.0.0.1:9876"]))
    mq = MessageQueue(TOPIC, "broker-a", 3)

    def make() -> list[Message]:
        return [Message(TOPIC, body, tags="bench") for _ in range(n)]

    msgs = make()
    items = core.prepare_batch(msgs)
    req = build_send_request("bench", mq, items, as_records=True)
    resp = messaging_pb2.SendResponse()
    for i, item in enumerate(items):
        resp.results.add(
            status=messaging_pb2.SEND_OK, msg_id=item.msg_id, offset_msg_id=OFFSET_MSG_ID,
            queue_id=mq.queue_id, queue_offset=1000 + i,
        )  # fmt: skip
    raw = resp.SerializeToString()
    compact = messaging_pb2.SendResponse()
    compact.batch.status = messaging_pb2.SEND_OK
    compact.batch.queue_id = mq.queue_id
    compact.batch.first_queue_offset = 1000
    compact.batch.offset_msg_id_prefix = OFFSET_MSG_ID[:16]
    compact.batch.physical_offsets.extend(range(1 << 30, (1 << 30) + n * 1200, 1200))
    raw_compact = compact.SerializeToString()
    ids = [item.msg_id for item in items]
    steps: list[tuple[str, Callable[[], object]]] = [
        ("Message()", make),
        ("prepare_batch", lambda: core.prepare_batch(msgs)),
        ("build_send_request", lambda: build_send_request("bench", mq, items, as_records=True)),
        ("serialize", req.SerializeToString),
        (
            "parse + to_results",
            lambda: to_results(messaging_pb2.SendResponse.FromString(raw), mq, n, "bench"),
        ),
        (
            "parse + compact",
            lambda: batch_results(
                messaging_pb2.SendResponse.FromString(raw_compact).batch, mq, ids, "bench"
            ),
        ),
    ]
    total = 0.0
    print(f"1 KiB messages, batches of {n}; best of {args.repeats} x {args.rounds} batches")
    for name, fn in steps:
        us = _best_us_per_msg(fn, n, args.rounds, args.repeats)
        if name != "parse + to_results":  # an older broker's answer: shown, not counted
            total += us
        print(f"  {name:20s} {us:6.2f} µs per message")
    print(f"  {'total':20s} {total:6.2f} µs per message (with the compact answer)")
    one = Message(TOPIC, body, tags="bench")

    def single() -> bytes:
        item = core.prepare(one)
        return build_send_request("bench", mq, [item]).SerializeToString()

    us = _best_us_per_msg(single, 1, args.rounds * 20, args.repeats)
    print(f"  {'single send':20s} {us:6.2f} µs per send (prepare + request + serialize)")


if __name__ == "__main__":
    main()
