"""Admin.ListHalfMessages: the half messages still waiting for a decision (SPEC §9).

Read only, from the store and the check service's progress offsets alone, so a slave answers
too (its topics and offsets are replicated; its in-memory index is not): the op queue from the
op progress says which transactions are resolved, the half queue from the half progress holds
every pending copy. For each pending transaction only its latest copy is listed (earlier
copies are what the check service re-put). Filtered by real topic when the request names one,
oldest born first (ties by queue offset), cut to ``max_num``; ``total`` counts before the cut.

The walk keeps ~100 bytes per pending transaction and reads the full record only of those
returned; it yields to the event loop every ``SCAN_SLICE_MAX`` records.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rocketq import codec
from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from rocketq.codec import Prop
from rocketq.validation import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.transaction_half import (
    SCAN_SLICE_MAX,
    TransactionIndex,
    check_times,
    producer_view,
    progress,
    walk,
)
from services.common.errors import invalid
from services.store.message_store import MessageStore

MAX_NUM_DEFAULT = 100
MAX_NUM_MAX = 1000
RESPONSE_BYTES_MAX = 8 * 1024 * 1024
"""Bodies one answer carries at most: batch half messages (transaction_batch.py) are large, and
1000 of them would pass gRPC's message limit. ``total`` still counts every pending one."""


@dataclass(slots=True)
class _Copy:
    queue_offset: int
    commitlog_offset: int
    born_ms: int
    real_topic: str


async def list_half_messages(
    request: admin_pb2.ListHalfMessagesRequest,
    store: MessageStore,
    offsets: ConsumerOffsetManager,
) -> admin_pb2.ListHalfMessagesResponse:
    """Answer ListHalfMessages; INVALID_ARGUMENT for max_num outside 1..1000."""
    max_num = request.max_num if request.HasField("max_num") else MAX_NUM_DEFAULT
    if not 1 <= max_num <= MAX_NUM_MAX:
        invalid(common_pb2.ILLEGAL_ARGUMENT, f"max_num {max_num} is outside 1..{MAX_NUM_MAX}")
    index = TransactionIndex()
    latest: dict[str, _Copy] = {}
    n = 0
    op_start = progress(offsets, store, TRANS_OP_HALF_TOPIC)
    for q, raw in walk(
        store, TRANS_OP_HALF_TOPIC, op_start, store.max_offset(TRANS_OP_HALF_TOPIC, 0)
    ):
        index.load_op(q, raw)
        n += 1
        if n % SCAN_SLICE_MAX == 0:
            await asyncio.sleep(0)
    half_start = progress(offsets, store, TRANS_HALF_TOPIC)
    for q, raw in walk(store, TRANS_HALF_TOPIC, half_start, store.max_offset(TRANS_HALF_TOPIC, 0)):
        rec = codec.decode_record(raw)
        if rec.uniq_key:
            latest[rec.uniq_key] = _Copy(
                q,
                rec.physical_offset,
                rec.born_timestamp_ms,
                rec.properties.get(Prop.REAL_TOPIC, ""),
            )
        n += 1
        if n % SCAN_SLICE_MAX == 0:
            await asyncio.sleep(0)
    pending = [
        (txid, c)
        for txid, c in latest.items()
        if index.decision(txid) is None and (not request.topic or c.real_topic == request.topic)
    ]
    pending.sort(key=lambda item: (item[1].born_ms, item[1].queue_offset))
    response = admin_pb2.ListHalfMessagesResponse(total=len(pending))
    body_bytes = 0
    for txid, c in pending[:max_num]:
        full = store.read_record(c.commitlog_offset)
        if full is None:
            continue  # removed by retention since the walk
        body_bytes += len(full.body)
        if response.messages and body_bytes > RESPONSE_BYTES_MAX:
            break
        response.messages.append(
            admin_pb2.HalfMessage(
                message=producer_view(
                    full, commitlog_offset=c.commitlog_offset, queue_offset=c.queue_offset
                ),
                producer_group=full.properties.get(Prop.PRODUCER_GROUP, ""),
                transaction_id=txid,
                check_times=check_times(full),
                born_timestamp_ms=full.born_timestamp_ms,
                commitlog_offset=c.commitlog_offset,
                queue_offset=c.queue_offset,
            )
        )
    return response
