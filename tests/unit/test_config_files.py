"""Config JSON files (SPEC §11.7) written atomically, and the checkpoint file (SPEC §4.4)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common import failpoints
from services.store import config_files
from services.store.checkpoint import CHECKPOINT_FILE_BYTES, Checkpoint
from services.store.config_files import (
    ConfigFileError,
    load_offset_table,
    parse_json,
    read_json,
    save_offset_table,
    write_atomic,
    write_json,
)

pytestmark = pytest.mark.unit

# SPEC §11.7, verbatim: fastjson writes integer map keys without quotes.
FASTJSON_CONSUMER_OFFSETS = """{"offsetTable":{
  "TopicTest@please_rename_unique_group_name_4":{0:1,1:0,2:0,3:0},
  "TopicTest@TopicTest-Consumer":{0:335,1:335,2:333},
  "%RETRY%TopicTest-Consumer@TopicTest-Consumer":{0:0},
  "%RETRY%rocket-mq-consumer-demo@rocket-mq-consumer-demo":{0:2},
  "%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0},
  "rocket-mq-topic@rocket-mq-consumer-demo":{0:0,1:0,2:1,3:1}
}}"""


@pytest.fixture
def no_failpoints() -> Iterator[None]:
    failpoints.reload("")
    yield
    failpoints.reload("")


# ---- atomic writes ---------------------------------------------------------------------------
def test_write_atomic_replaces_content_and_keeps_a_backup(tmp_path: Path) -> None:
    path = tmp_path / "config" / "topics.json"
    write_atomic(path, b"one")
    assert path.read_bytes() == b"one"
    assert not path.with_name("topics.json.bak").exists()
    write_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert path.with_name("topics.json.bak").read_bytes() == b"one"
    assert not path.with_name("topics.json.tmp").exists()
    assert not path.with_name("topics.json.bak.new").exists()


def test_failure_before_rename_leaves_the_old_content(tmp_path: Path, no_failpoints: None) -> None:
    path = tmp_path / "consumerOffset.json"
    write_json(path, {"v": 1})
    failpoints.reload("config_before_rename=error")
    try:
        with pytest.raises(failpoints.FailpointError):
            write_json(path, {"v": 2})
    finally:
        failpoints.reload("")
    assert json.loads(path.read_text()) == {"v": 1}
    assert read_json(path, None) == {"v": 1}
    # The next write succeeds and replaces the leftover temp file.
    write_json(path, {"v": 3})
    assert read_json(path, None) == {"v": 3}
    assert not path.with_name(path.name + ".tmp").exists()


def test_failure_on_first_write_leaves_no_file(tmp_path: Path, no_failpoints: None) -> None:
    path = tmp_path / "topics.json"
    failpoints.reload("config_before_rename=error")
    try:
        with pytest.raises(failpoints.FailpointError):
            write_json(path, {"v": 1})
    finally:
        failpoints.reload("")
    assert not path.exists()
    assert read_json(path, {"default": True}) == {"default": True}


def test_failpoint_names_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.reload("config_before_renam=error")
    failpoints.reload("")
    assert "config_before_rename" in failpoints.available()


# ---- reading ---------------------------------------------------------------------------------
def test_reads_fastjson_unquoted_integer_keys(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(FASTJSON_CONSUMER_OFFSETS)
    table = load_offset_table(path)
    assert table["TopicTest@please_rename_unique_group_name_4"] == {0: 1, 1: 0, 2: 0, 3: 0}
    assert table["TopicTest@TopicTest-Consumer"] == {0: 335, 1: 335, 2: 333}
    assert table["%RETRY%rocket-mq-consumer-demo@rocket-mq-consumer-demo"] == {0: 2}
    assert table["rocket-mq-topic@rocket-mq-consumer-demo"] == {0: 0, 1: 0, 2: 1, 3: 1}
    assert len(table) == 6


def test_parse_json_unquoted_keys_with_spaces_and_negative() -> None:
    assert parse_json("{ 0 : 8, 1:7 ,2:7,3:8}") == {"0": 8, "1": 7, "2": 7, "3": 8}
    assert parse_json('{"a":{-1:5}}') == {"a": {"-1": 5}}
    # Digits inside quoted strings are left alone when the text is already JSON.
    assert parse_json('{"x": "{1:2}"}') == {"x": "{1:2}"}


def test_reads_standard_json_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    table = {"TopicTest@g1": {0: 10, 1: 11}, "%RETRY%g1@g1": {0: 0}}
    save_offset_table(path, table)
    text = path.read_text()
    assert json.loads(text) == {
        "offsetTable": {"TopicTest@g1": {"0": 10, "1": 11}, "%RETRY%g1@g1": {"0": 0}}
    }
    assert load_offset_table(path) == table


def test_missing_file_reads_as_default(tmp_path: Path) -> None:
    assert read_json(tmp_path / "nope.json", {"x": 1}) == {"x": 1}
    assert load_offset_table(tmp_path / "nope.json") == {}


def test_bak_fallback_when_main_file_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "subscriptionGroup.json"
    write_json(path, {"version": 1})
    write_json(path, {"version": 2})
    path.write_bytes(b'{"version": 3, "trunc')  # torn by something outside our writer
    assert read_json(path, None) == {"version": 1}
    path.write_bytes(b"\xff\xfe\x00garbage")  # not even UTF-8
    assert read_json(path, None) == {"version": 1}


def test_corrupt_file_without_backup_raises_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text("{not json")
    with pytest.raises(ConfigFileError, match=r"topics\.json"):
        read_json(path, None)


def test_corrupt_main_and_backup_raise(tmp_path: Path) -> None:
    path = tmp_path / "delayOffset.json"
    path.write_text("{bad")
    path.with_name("delayOffset.json.bak").write_text("{worse")
    with pytest.raises(ConfigFileError, match=r"delayOffset\.json\.bak"):
        read_json(path, None)


def test_config_file_names() -> None:
    assert config_files.TOPICS == "topics.json"
    assert config_files.SUBSCRIPTION_GROUPS == "subscriptionGroup.json"
    assert config_files.CONSUMER_OFFSETS == "consumerOffset.json"
    assert config_files.DELAY_OFFSETS == "delayOffset.json"


# ---- checkpoint ------------------------------------------------------------------------------
def test_checkpoint_round_trip_is_a_4096_byte_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    cp = Checkpoint(
        physic_msg_timestamp_ms=1_700_000_000_003,
        logics_msg_timestamp_ms=1_700_000_000_002,
        index_msg_timestamp_ms=1_700_000_000_001,
        master_flushed_offset=1 << 33,
        confirm_phy_offset=12345,
    )
    cp.save(path)
    raw = path.read_bytes()
    assert len(raw) == CHECKPOINT_FILE_BYTES == 4096
    assert struct.unpack_from(">5q", raw) == (
        1_700_000_000_003,
        1_700_000_000_002,
        1_700_000_000_001,
        1 << 33,
        12345,
    )
    assert raw[40:] == bytes(4096 - 40)
    assert Checkpoint.load(path) == cp
    assert Checkpoint.load(path).min_timestamp_ms == 1_700_000_000_001
    # Saving again overwrites in place; the file stays one page.
    Checkpoint(1, 2, 3, 4, 5).save(path)
    assert len(path.read_bytes()) == 4096
    assert Checkpoint.load(path) == Checkpoint(1, 2, 3, 4, 5)


def test_checkpoint_missing_or_short_reads_as_zero(tmp_path: Path) -> None:
    assert Checkpoint.load(tmp_path / "checkpoint") == Checkpoint()
    short = tmp_path / "short"
    short.write_bytes(b"\x00" * 10)
    assert Checkpoint.load(short) == Checkpoint()
    assert Checkpoint().min_timestamp_ms == 0


def test_checkpoint_write_failpoint(tmp_path: Path, no_failpoints: None) -> None:
    path = tmp_path / "checkpoint"
    Checkpoint(1, 1, 1, 1, 1).save(path)
    failpoints.reload("checkpoint_before_write=error")
    try:
        with pytest.raises(failpoints.FailpointError):
            Checkpoint(2, 2, 2, 2, 2).save(path)
    finally:
        failpoints.reload("")
    assert Checkpoint.load(path) == Checkpoint(1, 1, 1, 1, 1)
