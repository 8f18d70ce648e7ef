"""The durable atomic write helpers: services.common.atomic_write and the SDK's own copy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketq.client import _atomic_write as sdk_atomic_write
from services.common import atomic_write, failpoints

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    failpoints.reload("")
    yield
    failpoints.reload("")


def test_write_atomic_creates_and_replaces_leaving_no_tmp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "file.json"
    atomic_write.write_atomic(path, b"one")
    atomic_write.write_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert not atomic_write.tmp_path(path).exists()
    assert not path.with_name("file.json.bak").exists()  # no backup unless asked


def test_keep_backup_holds_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    atomic_write.write_atomic(path, b"v1", keep_backup=True)
    assert not path.with_name("topics.json.bak").exists()  # nothing to back up yet
    atomic_write.write_atomic(path, b"v2", keep_backup=True)
    atomic_write.write_atomic(path, b"v3", keep_backup=True)
    assert path.read_bytes() == b"v3"
    assert path.with_name("topics.json.bak").read_bytes() == b"v2"


@pytest.mark.parametrize("point", ["timer_before_checkpoint", "config_before_rename"])
def test_a_failure_before_the_rename_leaves_the_old_content(tmp_path: Path, point: str) -> None:
    path = tmp_path / "f"
    atomic_write.write_atomic(path, b"old")
    failpoints.reload(f"{point}=error")
    with pytest.raises(failpoints.FailpointError):
        atomic_write.write_atomic(
            path,
            b"new",
            failpoint_before_fsync="timer_before_checkpoint",
            failpoint_before_rename="config_before_rename",
        )
    assert path.read_bytes() == b"old"
    failpoints.reload("")
    atomic_write.write_atomic(path, b"new")  # a stale .tmp is simply overwritten
    assert path.read_bytes() == b"new"


def test_replace_atomic_fills_through_the_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "sparse"
    atomic_write.replace_atomic(path, lambda fd: os.ftruncate(fd, 1 << 20))
    assert path.stat().st_size == 1 << 20
    assert not atomic_write.tmp_path(path).exists()


def test_sdk_write_atomic_moves_the_previous_version_to_the_backup(tmp_path: Path) -> None:
    path = tmp_path / "g" / "offsets.json"
    bak = path.with_name("offsets.json.bak")
    sdk_atomic_write.write_atomic(path, b"1", backup_path=bak)
    assert path.read_bytes() == b"1" and not bak.exists()
    sdk_atomic_write.write_atomic(path, b"2", backup_path=bak)
    assert (path.read_bytes(), bak.read_bytes()) == (b"2", b"1")
    assert not sdk_atomic_write.tmp_path(path).exists()


def test_the_server_helper_imports_no_grpc() -> None:
    code = "import sys, services.common.atomic_write; print('grpc' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
