"""Offset stores (SPEC §6.12, §11.8): the broadcasting file (format, atomic write, .bak fallback)
and the broker-backed cache (ReadOffsetType, -1 / -2, pushing only what changed).

The broker-backed store's fetch/push are plain async functions standing in for the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketq.client.consumer.offset_store import (
    LOCAL_OFFSET_STORE_DIR_ENV,
    NO_OFFSET,
    OFFSET_READ_ERROR,
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
    format_offsets,
    parse_offsets,
)
from rocketq.client.errors import BrokerUnavailableError, NotFoundError, RocketQError
from rocketq.message import MessageQueue

pytestmark = pytest.mark.unit

MEMORY = ReadOffsetType.READ_FROM_MEMORY
STORE = ReadOffsetType.READ_FROM_STORE
MEMORY_FIRST = ReadOffsetType.MEMORY_FIRST_THEN_STORE

Q0 = MessageQueue("TopicTest", "broker-a", 0)
Q1 = MessageQueue("TopicTest", "broker-a", 1)
Q2 = MessageQueue("TopicTest", "broker-a", 2)
OTHER = MessageQueue("Other", "broker-b", 0)


# ---- local file store -----------------------------------------------------------------------


def local(tmp_path: Path) -> LocalFileOffsetStore:
    return LocalFileOffsetStore("10.0.0.1@1234", "group-a", base_dir=tmp_path)


async def test_local_round_trip_and_path(tmp_path: Path) -> None:
    store = local(tmp_path)
    await store.load()  # nothing there yet
    assert await store.read_offset(Q0, MEMORY) == NO_OFFSET
    store.update_offset(Q0, 335, increase_only=False)
    store.update_offset(Q1, 335, increase_only=False)
    store.update_offset(Q2, 333, increase_only=False)
    await store.persist_all([Q0, Q1, Q2])
    assert store.path == tmp_path / "10.0.0.1@1234" / "group-a" / "offsets.json"
    assert store.path.exists()

    again = local(tmp_path)
    await again.load()
    assert await again.read_offset(Q0, MEMORY) == 335
    assert await again.read_offset(Q2, MEMORY_FIRST) == 333
    assert again.clone_offset_table("TopicTest") == {Q0: 335, Q1: 335, Q2: 333}
    assert await again.read_offset(OTHER, STORE) == NO_OFFSET


async def test_local_file_is_the_rocketmq_format(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.update_offset(Q2, 333, increase_only=False)
    store.update_offset(Q0, 335, increase_only=False)
    await store.persist(Q0)
    assert store.path.read_text() == (
        '{"offsetTable":{\n'
        '  {"brokerName":"broker-a","queueId":0,"topic":"TopicTest"}:335,\n'
        '  {"brokerName":"broker-a","queueId":2,"topic":"TopicTest"}:333\n'
        "}}\n"
    )


def test_parse_accepts_the_spec_example_and_refuses_garbage() -> None:
    spec_text = """{"offsetTable":{
      {"brokerName":"broker-a","queueId":2,"topic":"TopicTest"}:333,
      {"brokerName":"broker-a","queueId":1,"topic":"TopicTest"}:335,
      {"brokerName":"broker-a","queueId":0,"topic":"TopicTest"}:335
    }}"""
    assert parse_offsets(spec_text) == {Q0: 335, Q1: 335, Q2: 333}
    assert parse_offsets('{ "offsetTable" : { } }') == {}
    assert parse_offsets(format_offsets({})) == {}
    table = {Q0: 0, OTHER: 2**40}
    assert parse_offsets(format_offsets(table)) == table
    for bad in (
        "",
        "{}",
        '{"offsetTable":{',
        '{"offsetTable":{"k":1}}',
        '{"offsetTable":{{"brokerName":"b","queueId":-1,"topic":"T"}:1}}',
        '{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:"1"}}',
        '{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:1,}}',
        '{"offsetTable":{}} trailing',
    ):
        with pytest.raises(ValueError):
            parse_offsets(bad)


def test_local_directory_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOCAL_OFFSET_STORE_DIR_ENV, str(tmp_path / "env"))
    assert LocalFileOffsetStore("c", "g").path == tmp_path / "env" / "c" / "g" / "offsets.json"
    # the argument wins over the environment
    assert LocalFileOffsetStore("c", "g", tmp_path / "arg").path.parent.parent.parent == (
        tmp_path / "arg"
    )
    monkeypatch.delenv(LOCAL_OFFSET_STORE_DIR_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert LocalFileOffsetStore("c", "g").path == (
        tmp_path / "home" / ".rocketmq_offsets" / "c" / "g" / "offsets.json"
    )


async def test_local_keeps_the_previous_file_as_bak_and_falls_back_to_it(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.update_offset(Q0, 10, increase_only=False)
    await store.persist_all([Q0])
    store.update_offset(Q0, 20, increase_only=False)
    await store.persist_all([Q0])
    assert parse_offsets(store.bak_path.read_text()) == {Q0: 10}
    assert parse_offsets(store.path.read_text()) == {Q0: 20}

    store.path.write_text('{"offsetTable":{{"brokerNa')  # torn
    fallback = local(tmp_path)
    await fallback.load()
    assert await fallback.read_offset(Q0, MEMORY) == 10

    store.path.write_text("")  # empty
    assert await local(tmp_path).read_offset(Q0, STORE) == 10

    store.path.unlink()  # crash between the two renames
    assert await local(tmp_path).read_offset(Q0, STORE) == 10


async def test_local_both_files_unreadable(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.path.parent.mkdir(parents=True)
    store.path.write_text("not json")
    store.bak_path.write_text("{also not")
    with pytest.raises(RocketQError, match="delete them"):
        await local(tmp_path).load()
    assert await store.read_offset(Q0, STORE) == OFFSET_READ_ERROR


async def test_local_increase_only_and_reset(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.update_offset(Q0, 100, increase_only=True)
    store.update_offset(Q0, 90, increase_only=True)
    assert await store.read_offset(Q0, MEMORY) == 100
    store.update_offset(Q0, 120, increase_only=True)
    assert await store.read_offset(Q0, MEMORY) == 120
    store.update_offset(Q0, 5, increase_only=False)  # an offset reset
    assert await store.read_offset(Q0, MEMORY) == 5


async def test_local_persists_every_queue_and_only_when_changed(tmp_path: Path) -> None:
    store = local(tmp_path)
    await store.persist_all([Q0])  # nothing held: no file
    assert not store.path.exists()
    store.update_offset(Q0, 1, increase_only=False)
    store.update_offset(OTHER, 7, increase_only=False)
    store.remove_offset(OTHER)  # broadcasting keeps it for when the queue returns
    await store.persist_all([Q0])
    assert parse_offsets(store.path.read_text()) == {Q0: 1, OTHER: 7}
    store.path.unlink()
    await store.persist_all([Q0])  # unchanged since the last write
    assert not store.path.exists()
    store.update_offset(Q0, 1, increase_only=False)  # same value: still unchanged
    await store.persist(Q0)
    assert not store.path.exists()
    store.update_offset(Q0, 2, increase_only=False)
    await store.persist(Q0)
    assert parse_offsets(store.path.read_text()) == {Q0: 2, OTHER: 7}


async def test_local_read_from_store_refreshes_memory(tmp_path: Path) -> None:
    writer = local(tmp_path)
    writer.update_offset(Q0, 42, increase_only=False)
    await writer.persist(Q0)
    reader = local(tmp_path)
    reader.update_offset(Q0, 99, increase_only=False)
    assert await reader.read_offset(Q0, MEMORY_FIRST) == 99
    assert await reader.read_offset(Q0, STORE) == 42
    assert await reader.read_offset(Q0, MEMORY) == 42


def test_local_refuses_empty_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LocalFileOffsetStore("", "g", tmp_path)
    slashy = LocalFileOffsetStore("a/../b", "g", tmp_path)
    assert slashy.path.parent.parent.parent == tmp_path


# ---- broker-backed store --------------------------------------------------------------------


class FakeBroker:
    """Stands in for QueryConsumerOffset / UpdateConsumerOffset."""

    def __init__(self) -> None:
        self.offsets: dict[MessageQueue, int] = {}
        self.pushes: list[tuple[MessageQueue, int]] = []
        self.fetches = 0
        self.down = False

    async def fetch(self, mq: MessageQueue) -> int:
        self.fetches += 1
        if self.down:
            raise BrokerUnavailableError("cannot reach 127.0.0.1:10911")
        if mq not in self.offsets:
            raise NotFoundError("no offset for the group")
        return self.offsets[mq]

    async def push(self, mq: MessageQueue, offset: int) -> None:
        if self.down:
            raise BrokerUnavailableError("cannot reach 127.0.0.1:10911")
        self.pushes.append((mq, offset))
        self.offsets[mq] = offset


def remote(broker: FakeBroker) -> RemoteBrokerOffsetStore:
    return RemoteBrokerOffsetStore("group-a", broker.fetch, broker.push)


def test_both_stores_fit_the_protocol(tmp_path: Path) -> None:
    stores: list[OffsetStore] = [local(tmp_path), remote(FakeBroker())]
    assert len(stores) == 2


async def test_remote_read_types_and_minus_one_minus_two() -> None:
    broker = FakeBroker()
    broker.offsets[Q0] = 77
    store = remote(broker)
    await store.load()
    assert await store.read_offset(Q0, MEMORY) == NO_OFFSET
    assert broker.fetches == 0
    assert await store.read_offset(Q0, STORE) == 77
    assert await store.read_offset(Q0, MEMORY) == 77  # the fetch filled the cache
    store.update_offset(Q0, 80, increase_only=True)
    assert await store.read_offset(Q0, MEMORY_FIRST) == 80
    assert broker.fetches == 1
    assert await store.read_offset(Q1, MEMORY_FIRST) == NO_OFFSET  # NotFound -> -1
    assert broker.fetches == 2
    broker.down = True
    assert await store.read_offset(Q0, STORE) == OFFSET_READ_ERROR
    assert await store.read_offset(Q0, MEMORY) == 80  # a failed read changes nothing


async def test_remote_read_from_store_overrides_a_larger_cached_value() -> None:
    broker = FakeBroker()
    broker.offsets[Q0] = 3  # e.g. an offset reset
    store = remote(broker)
    store.update_offset(Q0, 50, increase_only=False)
    assert await store.read_offset(Q0, STORE) == 3
    assert await store.read_offset(Q0, MEMORY) == 3


async def test_remote_persist_all_pushes_only_changes() -> None:
    broker = FakeBroker()
    store = remote(broker)
    store.update_offset(Q0, 10, increase_only=True)
    store.update_offset(Q1, 20, increase_only=True)
    await store.persist_all([Q0, Q1])
    assert sorted(broker.pushes) == [(Q0, 10), (Q1, 20)]
    broker.pushes.clear()
    await store.persist_all([Q0, Q1])
    assert broker.pushes == []
    store.update_offset(Q1, 25, increase_only=True)
    store.update_offset(Q0, 5, increase_only=True)  # ignored: not an increase
    await store.persist_all([Q0, Q1])
    assert broker.pushes == [(Q1, 25)]


async def test_remote_failed_push_is_retried_next_time() -> None:
    broker = FakeBroker()
    store = remote(broker)
    store.update_offset(Q0, 10, increase_only=True)
    broker.down = True
    await store.persist_all([Q0])  # logged, not raised
    await store.persist(Q0)
    broker.down = False
    await store.persist_all([Q0])
    assert broker.pushes == [(Q0, 10)]


async def test_remote_forgets_queues_no_longer_held() -> None:
    broker = FakeBroker()
    store = remote(broker)
    store.update_offset(Q0, 1, increase_only=True)
    store.update_offset(OTHER, 2, increase_only=True)
    await store.persist_all([Q0])
    assert broker.pushes == [(Q0, 1)]
    assert store.clone_offset_table("") == {Q0: 1}
    store.update_offset(Q1, 4, increase_only=True)
    store.remove_offset(Q1)
    assert store.clone_offset_table("TopicTest") == {Q0: 1}
    await store.persist_all([])  # nothing held: nothing pushed, nothing forgotten
    assert store.clone_offset_table("") == {Q0: 1}


async def test_remote_persist_one_pushes_even_unchanged() -> None:
    broker = FakeBroker()
    store = remote(broker)
    await store.persist(Q0)  # nothing cached: nothing to push
    store.update_offset(Q0, 9, increase_only=True)
    await store.persist(Q0)
    await store.persist(Q0)
    assert broker.pushes == [(Q0, 9), (Q0, 9)]


def test_clone_offset_table_by_topic() -> None:
    store = remote(FakeBroker())
    store.update_offset(Q0, 1, increase_only=False)
    store.update_offset(OTHER, 2, increase_only=False)
    assert store.clone_offset_table("Other") == {OTHER: 2}
    assert store.clone_offset_table("") == {Q0: 1, OTHER: 2}
    copy = store.clone_offset_table("TopicTest")
    copy[Q0] = 100
    assert store.clone_offset_table("TopicTest") == {Q0: 1}
