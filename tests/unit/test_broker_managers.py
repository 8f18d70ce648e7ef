"""Broker metadata managers: topics, subscription groups, consumer offsets (SPEC §4.3, §6.12,
§6.14, §11.7), each against a temporary config directory."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from rocketq.validation import PERM_INHERIT, PERM_READ, PERM_WRITE
from services.broker.config import BrokerConfig
from services.broker.config_overrides import load_persisted_overrides, save_persisted_overrides
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.model import SubscriptionGroupConfig, TopicConfig
from services.broker.subscription_group_manager import SubscriptionGroupManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import ManualClock
from services.store.config_files import CONSUMER_OFFSETS, SUBSCRIPTION_GROUPS, TOPICS

pytestmark = pytest.mark.unit


def broker_config(tmp_path: Path, **kw: object) -> BrokerConfig:
    return BrokerConfig(store_dir=tmp_path, namesrv_addrs=[], **kw)  # type: ignore[arg-type]


def topics_manager(
    tmp_path: Path, clock: ManualClock | None = None, **kw: object
) -> TopicConfigManager:
    mgr = TopicConfigManager(
        broker_config(tmp_path, **kw), tmp_path / "config", clock or ManualClock()
    )
    mgr.load()
    return mgr


# -- topics --------------------------------------------------------------------------------


def test_system_topics_created_at_first_load(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path, cluster_name="c1", broker_name="b1", default_topic_queue_nums=8)
    tbw = mgr.get("TBW102")
    assert tbw is not None
    assert (tbw.read_queue_nums, tbw.write_queue_nums) == (8, 8)
    assert tbw.perm == PERM_INHERIT | PERM_READ | PERM_WRITE
    self_test = mgr.get("SELF_TEST_TOPIC")
    assert self_test is not None and self_test.queue_nums == 1
    for name in ("c1", "b1"):
        cfg = mgr.get(name)
        assert cfg is not None and (cfg.queue_nums, cfg.perm) == (1, 6)
    timer = mgr.get("rmq_sys_wheel_timer")
    assert timer is not None and (timer.queue_nums, timer.perm) == (8, 6)  # timerTopicQueueNums
    assert [t.topic_name for t in mgr.all()] == sorted(
        ["TBW102", "SELF_TEST_TOPIC", "c1", "b1", "rmq_sys_wheel_timer"]
    )
    assert mgr.is_system("TBW102") and mgr.is_system("c1") and not mgr.is_system("orders")
    # the file was written with RocketMQ's shape and is plain JSON
    raw = json.loads((tmp_path / "config" / TOPICS).read_text())
    assert raw["topicConfigTable"]["TBW102"] == {
        "topicName": "TBW102",
        "readQueueNums": 8,
        "writeQueueNums": 8,
        "perm": 7,
        "topicSysFlag": 0,
        "order": False,
    }
    assert raw["dataVersion"]["counter"] == 1


def test_no_template_topic_when_auto_create_disabled(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path, auto_create_topic_enable=False)
    assert mgr.get("TBW102") is None
    assert mgr.create_in_send("orders", "TBW102", 4) is None
    assert mgr.get("orders") is None


def test_auto_create_disabled_refuses_even_with_template_on_disk(tmp_path: Path) -> None:
    topics_manager(tmp_path)  # writes TBW102 with perm 7
    mgr = topics_manager(tmp_path, auto_create_topic_enable=False)
    assert mgr.get("TBW102") is not None  # kept, as RocketMQ keeps it
    assert mgr.create_in_send("orders", "TBW102", 4) is None


def test_auto_create_from_template_clamps_queues_and_drops_inherit(tmp_path: Path) -> None:
    clock = ManualClock()
    mgr = topics_manager(tmp_path, clock)
    calls: list[int] = []
    mgr.on_change.append(lambda: calls.append(1))
    before = mgr.data_version
    clock.advance_ms(1000)
    cfg = mgr.create_in_send("orders", "TBW102", 16)
    assert cfg is not None
    assert (cfg.read_queue_nums, cfg.write_queue_nums) == (4, 4)  # template writes 4
    assert cfg.perm == PERM_READ | PERM_WRITE
    assert calls == [1]
    assert mgr.data_version == (before[0] + 1000, before[1] + 1)
    small = mgr.create_in_send("small", "TBW102", 2)
    assert small is not None and small.queue_nums == 2
    # an existing topic is returned as is, without a change
    version = mgr.data_version
    assert mgr.create_in_send("orders", "TBW102", 1) == cfg
    assert mgr.data_version == version and calls == [1, 1]
    # persisted: a fresh manager sees it
    again = topics_manager(tmp_path)
    assert again.get("orders") == cfg


def test_auto_create_needs_inheritable_template(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path)
    mgr.put(TopicConfig("plain-template", 4, 4, PERM_READ | PERM_WRITE))
    assert mgr.create_in_send("orders", "plain-template", 4) is None
    assert mgr.create_in_send("orders", "missing-template", 4) is None
    read_only = TopicConfig("ro-template", 2, 2, PERM_INHERIT | PERM_READ)
    mgr.put(read_only)
    cfg = mgr.create_in_send("orders", "ro-template", 8)
    assert cfg is not None and cfg.perm == PERM_READ and cfg.queue_nums == 2


def test_put_delete_and_versions(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path)
    v0 = mgr.data_version
    assert mgr.put(TopicConfig("orders", 8, 4, 6)) is True
    v1 = mgr.data_version
    assert v1[1] == v0[1] + 1
    assert mgr.put(TopicConfig("orders", 8, 4, 6)) is False  # identical: no change at all
    assert mgr.data_version == v1
    assert mgr.put(TopicConfig("orders", 4, 4, 4)) is False  # replaced
    assert mgr.data_version[1] == v1[1] + 1
    assert mgr.get("orders") == TopicConfig("orders", 4, 4, 4)
    assert mgr.delete("orders") is True
    assert mgr.delete("orders") is False
    assert mgr.get("orders") is None
    assert mgr.data_version[1] == v1[1] + 2
    with pytest.raises(ValueError, match="1024"):
        mgr.put(TopicConfig("big", 2000, 4))
    with pytest.raises(ValueError, match="characters"):
        mgr.put(TopicConfig("bad name", 4, 4))
    with pytest.raises(ValueError, match="perm"):
        mgr.put(TopicConfig("odd-perm", 4, 4, 9))


def test_stored_object_is_not_the_callers(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path)
    cfg = TopicConfig("orders", 4, 4)
    mgr.put(cfg)
    cfg.read_queue_nums = 1  # a later change to the caller's object must not leak in
    stored = mgr.get("orders")
    assert stored is not None and stored.read_queue_nums == 4


def test_topics_round_trip_and_version_continues(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path)
    mgr.put(TopicConfig("orders", 8, 4, 2, topic_sys_flag=0, order=True))
    version = mgr.data_version
    again = topics_manager(tmp_path)
    assert again.all() == mgr.all()
    assert again.data_version == version  # nothing new to add at reload: no bump
    again.delete("orders")
    assert again.data_version[1] == version[1] + 1


def test_reads_rocketmq_topics_json(tmp_path: Path) -> None:
    # RocketMQ's file has fields we do not use (topicFilterType, attributes); they are ignored.
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / TOPICS).write_text(
        '{"dataVersion":{"counter":7,"stateVersion":0,"timestamp":1700000000000},'
        '"topicConfigTable":{"TopicTest":{"attributes":{},"order":false,"perm":6,'
        '"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicTest",'
        '"topicSysFlag":0,"writeQueueNums":4},"bad name":{"topicName":"bad name"}}}'
    )
    mgr = topics_manager(tmp_path, cluster_name="DefaultCluster", broker_name="broker-a")
    assert mgr.get("TopicTest") == TopicConfig("TopicTest", 4, 4, 6)
    assert mgr.get("bad name") is None  # skipped with a warning, not fatal
    assert mgr.data_version[1] == 8  # system topics were added: one change on top of 7


def test_create_system_topic_is_idempotent(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path)
    cfg = mgr.create_system_topic("%RETRY%g1", 1, PERM_READ | PERM_WRITE)
    version = mgr.data_version
    assert mgr.create_system_topic("%RETRY%g1", 5, PERM_WRITE) == cfg
    assert mgr.data_version == version
    assert topics_manager(tmp_path).get("%RETRY%g1") == cfg


def test_on_change_failure_does_not_undo_change(tmp_path: Path) -> None:
    mgr = topics_manager(tmp_path)

    def broken() -> None:
        raise RuntimeError("listener bug")

    mgr.on_change.append(broken)
    assert mgr.put(TopicConfig("orders")) is True
    assert topics_manager(tmp_path).get("orders") is not None


# -- subscription groups ---------------------------------------------------------------------


def groups_manager(tmp_path: Path, **kw: object) -> SubscriptionGroupManager:
    mgr = SubscriptionGroupManager(broker_config(tmp_path, **kw), tmp_path / "config")
    mgr.load()
    return mgr


def test_group_auto_create_and_defaults(tmp_path: Path) -> None:
    mgr = groups_manager(tmp_path)
    assert mgr.get("g1") is None
    cfg = mgr.find_or_create("g1")
    assert cfg == SubscriptionGroupConfig("g1")
    assert (cfg.retry_queue_nums, cfg.retry_max_times, cfg.which_broker_when_consume_slowly) == (
        1,
        16,
        1,
    )
    assert mgr.find_or_create("g1") is cfg
    assert groups_manager(tmp_path).get("g1") == cfg
    raw = json.loads((tmp_path / "config" / SUBSCRIPTION_GROUPS).read_text())
    assert raw["subscriptionGroupTable"]["g1"]["groupName"] == "g1"
    assert raw["subscriptionGroupTable"]["g1"]["retryMaxTimes"] == 16
    assert raw["subscriptionGroupTable"]["g1"]["consumeEnable"] is True
    assert raw["dataVersion"]["counter"] == 1


def test_group_auto_create_disabled(tmp_path: Path) -> None:
    mgr = groups_manager(tmp_path, auto_create_subscription_group=False)
    assert mgr.find_or_create("g1") is None
    assert not (tmp_path / "config" / SUBSCRIPTION_GROUPS).exists()


def test_group_put_delete_validation(tmp_path: Path) -> None:
    mgr = groups_manager(tmp_path)
    cfg = SubscriptionGroupConfig("g1", retry_max_times=-1, consume_message_orderly=True)
    assert mgr.put(cfg) is True
    version = mgr.data_version
    assert (
        mgr.put(SubscriptionGroupConfig("g1", retry_max_times=-1, consume_message_orderly=True))
        is False
    )
    assert mgr.data_version == version
    assert mgr.put(SubscriptionGroupConfig("g1", consume_enable=False)) is False
    assert mgr.data_version[1] == version[1] + 1
    assert mgr.put(SubscriptionGroupConfig("a0")) is True
    assert [g.group_name for g in mgr.all()] == ["a0", "g1"]
    again = groups_manager(tmp_path)
    assert again.all() == mgr.all()
    assert again.delete("g1") is True and again.delete("g1") is False
    assert groups_manager(tmp_path).get("g1") is None
    for bad in (
        SubscriptionGroupConfig("g2", retry_max_times=-2),
        SubscriptionGroupConfig("g2", retry_queue_nums=-1),
        SubscriptionGroupConfig("g2", broker_id=-1),
        SubscriptionGroupConfig("bad group"),
    ):
        with pytest.raises(ValueError):
            mgr.put(bad)


# -- consumer offsets ------------------------------------------------------------------------


def test_offsets_overwrite_and_log_decrease(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "config", ManualClock())
    mgr.load()
    assert mgr.query("g1", "t1", 0) == -1
    mgr.commit("g1", "t1", 0, 10)
    mgr.commit("g1", "t1", 0, 15)
    assert mgr.query("g1", "t1", 0) == 15
    with caplog.at_level(logging.WARNING):
        mgr.commit("g1", "t1", 0, 3, client="10.0.0.1@pid")
    assert mgr.query("g1", "t1", 0) == 3  # overwritten, not max'ed
    assert "moved back" in caplog.text and "15 -> 3" in caplog.text
    assert mgr.table("g1", "t1") == {0: 3}
    assert mgr.table("g1", "other") == {}


def test_offsets_carried_by_pulls_only_move_forward(tmp_path: Path) -> None:
    """A pull racing its consumer's release of the queue must not undo the persisted offset."""
    mgr = ConsumerOffsetManager(tmp_path / "config", ManualClock())
    mgr.load()
    mgr.commit("g1", "t1", 0, 5, increase_only=True)  # first commit: nothing stored yet
    mgr.commit("g1", "t1", 0, 20)  # the owner persists on release
    mgr.commit("g1", "t1", 0, 12, increase_only=True)  # its stale pull arrives afterwards
    assert mgr.query("g1", "t1", 0) == 20
    mgr.commit("g1", "t1", 0, 25, increase_only=True)
    assert mgr.query("g1", "t1", 0) == 25
    mgr.commit("g1", "t1", 0, 0)  # explicit updates (resets) still move it back
    assert mgr.query("g1", "t1", 0) == 0


def test_offsets_lookups_and_removal(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "config", ManualClock())
    mgr.load()
    mgr.commit("g1", "t1", 0, 1)
    mgr.commit("g1", "t1", 1, 2)
    mgr.commit("g1", "%RETRY%g1", 0, 0)
    mgr.commit("g2", "t1", 0, 5)
    mgr.commit("g2", "t2", 0, 6)
    assert mgr.topics_of_group("g1") == ["%RETRY%g1", "t1"]
    assert mgr.groups_of_topic("t1") == ["g1", "g2"]
    mgr.remove_group("g1")
    assert mgr.topics_of_group("g1") == []
    assert mgr.groups_of_topic("t1") == ["g2"]
    mgr.remove_topic("t1")
    assert mgr.groups_of_topic("t1") == []
    assert mgr.topics_of_group("g2") == ["t2"]


def test_offsets_persist_only_when_dirty_and_round_trip(tmp_path: Path) -> None:
    clock = ManualClock()
    mgr = ConsumerOffsetManager(tmp_path / "config", clock)
    mgr.load()
    mgr.persist()
    assert mgr.persist_count == 0
    assert not (tmp_path / "config" / CONSUMER_OFFSETS).exists()
    v0 = mgr.data_version
    mgr.commit("g1", "TopicTest", 0, 335)
    mgr.commit("g1", "TopicTest", 2, 333)
    mgr.commit("g1", "%RETRY%g1", 0, 0)
    assert mgr.data_version[1] == v0[1] + 3
    mgr.commit("g1", "TopicTest", 0, 335)  # same value: not a change
    assert mgr.data_version[1] == v0[1] + 3
    assert mgr.dirty
    mgr.persist()
    mgr.persist()
    assert mgr.persist_count == 1 and not mgr.dirty
    raw = json.loads((tmp_path / "config" / CONSUMER_OFFSETS).read_text())
    assert raw == {
        "offsetTable": {
            "%RETRY%g1@g1": {"0": 0},
            "TopicTest@g1": {"0": 335, "2": 333},
        }
    }
    again = ConsumerOffsetManager(tmp_path / "config", clock)
    again.load()
    assert again.table("g1", "TopicTest") == {0: 335, 2: 333}
    assert not again.dirty
    again.remove_group("nobody")  # nothing removed: still clean
    assert not again.dirty


def test_offsets_read_fastjson_file(tmp_path: Path) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / CONSUMER_OFFSETS).write_text(
        '{"offsetTable":{\n  "TopicTest@TopicTest-Consumer":{0:335,1:335,2:333},\n'
        '  "%RETRY%TopicTest-Consumer@TopicTest-Consumer":{0:0}\n}}'
    )
    mgr = ConsumerOffsetManager(config_dir, ManualClock())
    mgr.load()
    assert mgr.table("TopicTest-Consumer", "TopicTest") == {0: 335, 1: 335, 2: 333}
    assert mgr.topics_of_group("TopicTest-Consumer") == [
        "%RETRY%TopicTest-Consumer",
        "TopicTest",
    ]


async def test_offsets_persist_loop_writes_on_cancel(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "config", ManualClock())
    mgr.load()

    task = asyncio.create_task(mgr.run_persist_loop(3_600_000))
    await asyncio.sleep(0)  # let the loop start waiting
    mgr.commit("g1", "t1", 0, 7)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert mgr.persist_count == 1
    again = ConsumerOffsetManager(tmp_path / "config", ManualClock())
    again.load()
    assert again.query("g1", "t1", 0) == 7


# -- persisted broker config overrides -------------------------------------------------------


def test_persisted_overrides_round_trip(tmp_path: Path) -> None:
    assert load_persisted_overrides(tmp_path) == {}
    save_persisted_overrides(tmp_path, {"fileReservedTime": "48", "longPollingEnable": "false"})
    assert load_persisted_overrides(tmp_path) == {
        "fileReservedTime": "48",
        "longPollingEnable": "false",
    }
    # hand-edited junk and startup-only keys are skipped, not fatal
    with open(tmp_path / "broker.properties", "a") as f:
        f.write("noSuchKey=1\nbrokerName=x\nfile_reserved_time=12\n")
    assert load_persisted_overrides(tmp_path) == {
        "fileReservedTime": "12",
        "longPollingEnable": "false",
    }
