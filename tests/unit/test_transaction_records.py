"""Transaction-typed records follow RocketMQ's dispatch rules (SPEC §9, DESIGN §8).

PREPARED and ROLLBACK records are stored in the commitlog with queue offset 0, get no
consume-queue unit and do not advance their queue; the index skips only ROLLBACK records.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketq import codec
from services.store.commitlog import MessageToStore
from services.store.config import StoreConfig
from services.store.inspect import detect_layout, verify
from services.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def _msg(sys_flag: int, key: str) -> MessageToStore:
    props = {codec.Prop.KEYS: key}
    return MessageToStore(
        topic="T",
        queue_id=0,
        body=key.encode(),
        properties=codec.encode_properties(props),
        keys=key,
        sys_flag=sys_flag,
    )


def _open(tmp_path: Path) -> MessageStore:
    store = MessageStore(
        StoreConfig(
            store_dir=tmp_path,
            commitlog_file_bytes=64 * 1024,
            consume_queue_units_per_file=100,
            index_slot_num=64,
            index_num=256,
        )
    )
    store.open()
    return store


def test_prepared_and_rollback_records_take_no_queue_offset(tmp_path: Path) -> None:
    flags = [
        codec.SysFlag.TRANSACTION_NOT_TYPE,
        codec.SysFlag.TRANSACTION_PREPARED,
        codec.SysFlag.TRANSACTION_COMMIT,
        codec.SysFlag.TRANSACTION_ROLLBACK,
        codec.SysFlag.TRANSACTION_NOT_TYPE,
    ]
    store = _open(tmp_path)
    results = store.append([_msg(f, f"k{i}") for i, f in enumerate(flags)])
    assert [r.queue_offset for r in results] == [0, 0, 1, 0, 2]
    assert store.max_offset("T", 0) == 3
    got = store.get_messages("T", 0, 0, 32)
    bodies = [codec.decode_record(r).body for r in got.records]
    assert bodies == [b"k0", b"k2", b"k4"]
    # the index finds the PREPARED record, not the ROLLBACK one
    assert [r.body for r in store.query_by_key("T", "k1", 8, 0, 2**62)] == [b"k1"]
    assert store.query_by_key("T", "k3", 8, 0, 2**62) == []
    store.close_files()
    report = verify(detect_layout(tmp_path))
    assert report.ok, report.problems
    assert (report.records, report.units) == (5, 3)


def test_recovery_keeps_the_rule(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.append([_msg(0, "a"), _msg(codec.SysFlag.TRANSACTION_PREPARED, "b")])
    store.close_files()  # crash: abort marker left, recovery re-dispatches
    store = _open(tmp_path)
    assert store.recovery is not None and store.recovery.abnormal
    assert store.max_offset("T", 0) == 1
    assert [r.queue_offset for r in store.append([_msg(0, "c")])] == [1]
    store.close_files()
