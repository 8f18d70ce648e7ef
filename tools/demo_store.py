"""Write a small demo store so a new user can see the storage engine and its inspection tool.

    python -m tools.demo_store DIR

Appends a few hundred messages to three topics through the real MessageStore (SYNC_FLUSH),
with small file sizes so the commitlog rolls over and ends files with blank records, then
shuts down cleanly.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
import uuid
from pathlib import Path

from rocketq import codec
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.flush import FlushDiskType
from services.store.message_store import MessageStore

TOPICS = {
    "OrderEvents": ["created", "paid", "shipped"],
    "Payments": ["card", "wallet"],
    "Audit": [""],
}


def demo_messages(count: int) -> list[MessageToStore]:
    msgs = []
    names = list(TOPICS)
    for i in range(count):
        topic = names[i % len(names)]
        tags = TOPICS[topic][i % len(TOPICS[topic])]
        uniq = uuid.uuid4().hex.upper()
        props = {codec.Prop.UNIQ_KEY: uniq, codec.Prop.KEYS: f"order-{i} customer-{i % 7}"}
        if tags:
            props[codec.Prop.TAGS] = tags
        body = f'{{"n": {i}, "topic": "{topic}", "tag": "{tags}"}}'.encode() * 20
        msgs.append(
            MessageToStore(
                topic=topic,
                queue_id=i % 4,
                body=body,
                properties=codec.encode_properties(props),
                tags_code=codec.tags_hash(tags),
                keys=props[codec.Prop.KEYS],
                uniq_key=uniq,
                born_timestamp_ms=int(time.time() * 1000),
            )
        )
    return msgs


async def write_demo(directory: Path, count: int = 300) -> None:
    cfg = StoreConfig(
        store_dir=directory,
        commitlog_file_bytes=256 * 1024,
        consume_queue_units_per_file=1000,
        index_slot_num=1000,
        index_num=4000,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        store_host=codec.HostAddress.parse("127.0.0.1:10911"),
    )
    store = MessageStore(cfg)
    await store.start()
    msgs = demo_messages(count)
    for start in range(0, count, 32):
        result = await store.put(msgs[start : start + 32])
        assert result.status.value == "PUT_OK", result.status
    await store.shutdown()
    print(
        f"wrote {count} messages to {directory} "
        f"({len(list(cfg.commitlog_dir.iterdir()))} commitlog files)"
    )


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-store")
    if directory.exists():
        shutil.rmtree(directory)
    asyncio.run(write_demo(directory))


if __name__ == "__main__":
    main()
