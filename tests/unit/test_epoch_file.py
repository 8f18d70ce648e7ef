"""The epoch history file and ``consistent_offset`` (issue 7, DESIGN.md §6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.store.epoch_file import EpochEntry, EpochHistory, check_history, consistent_offset

pytestmark = pytest.mark.unit

E = EpochEntry


def test_a_missing_file_is_an_empty_history(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path / "epoch")
    assert h.load() == []
    assert h.entries == []
    assert h.last_epoch is None


def test_append_persists_atomically_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "store" / "epoch"
    h = EpochHistory(path)
    h.append(0, 0)
    h.append(0, 0)  # the same entry again: nothing changes
    h.append(2, 1000)
    assert path.read_text() == "0 0\n2 1000\n"
    assert not path.with_name("epoch.tmp").exists()
    again = EpochHistory(path)
    assert again.load() == [E(0, 0), E(2, 1000)]
    assert again.last_epoch == 2


@pytest.mark.parametrize(
    ("epoch", "start"),
    [(1, 500), (2, 999), (0, 2000), (2, 2000)],
)
def test_append_refuses_to_go_backwards(tmp_path: Path, epoch: int, start: int) -> None:
    h = EpochHistory(tmp_path / "epoch")
    h.append(2, 1000)
    with pytest.raises(ValueError):
        h.append(epoch, start)
    assert h.entries == [E(2, 1000)]


def test_a_new_epoch_at_the_same_start_replaces_the_empty_one(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path / "epoch")
    h.append(0, 0)
    h.append(1, 100)
    h.append(2, 100)  # epoch 1 wrote nothing
    assert h.entries == [E(0, 0), E(2, 100)]
    assert check_history(h.entries) is None


def test_truncate_from_drops_entries_starting_at_or_after(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path / "epoch")
    h.replace([E(0, 0), E(1, 100), E(3, 250)])
    h.truncate_from(250)
    assert h.entries == [E(0, 0), E(1, 100)]
    h.truncate_from(101)
    assert h.entries == [E(0, 0), E(1, 100)]
    h.truncate_from(0)
    assert h.entries == []
    assert EpochHistory(tmp_path / "epoch").load() == []


def test_replace_validates(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path / "epoch")
    h.replace([(0, 0), (4, 10)])  # type: ignore[list-item]  # plain tuples (from protos) work
    assert h.entries == [E(0, 0), E(4, 10)]
    for bad in ([E(1, 0), E(1, 5)], [E(1, 10), E(2, 5)], [E(-1, 0)]):
        with pytest.raises(ValueError):
            h.replace(bad)
    assert h.entries == [E(0, 0), E(4, 10)]


@pytest.mark.parametrize("text", ["0 0\nx y\n", "0\n", "1 0\n0 10\n", "0 10\n1 5\n", "-1 0\n"])
def test_a_damaged_file_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "epoch").write_text(text)
    with pytest.raises(ValueError, match="epoch"):
        EpochHistory(tmp_path / "epoch").load()


def test_a_stale_tmp_file_does_not_matter(tmp_path: Path) -> None:
    (tmp_path / "epoch.tmp").write_text("garbage")
    (tmp_path / "epoch").write_text("0 0\n")
    h = EpochHistory(tmp_path / "epoch")
    assert h.load() == [E(0, 0)]
    h.append(1, 5)
    assert sorted(os.listdir(tmp_path)) == ["epoch"]


# ---- consistent_offset -------------------------------------------------------------------------
CASES = [
    # (name, master history, master max, slave history, slave max, expected truncation point)
    ("both empty", [], 0, [], 0, 0),
    ("empty slave store", [E(0, 0)], 5000, [], 0, 0),
    ("slave without history but with data", [E(0, 0)], 5000, [], 700, 0),
    ("master without history", [], 5000, [E(0, 0)], 700, 0),
    ("identical", [E(0, 0)], 5000, [E(0, 0)], 5000, 5000),
    ("slave behind, same epoch", [E(0, 0)], 5000, [E(0, 0)], 1200, 1200),
    ("slave ahead in the same epoch", [E(0, 0)], 5000, [E(0, 0)], 6000, 5000),
    ("master moved on to a new epoch", [E(0, 0), E(1, 4000)], 9000, [E(0, 0)], 3000, 3000),
    ("slave wrote past the new epoch's start", [E(0, 0), E(1, 4000)], 9000, [E(0, 0)], 4500, 4000),
    (
        "diverged at an epoch: both wrote epoch 1 from 4000, the master then epoch 2",
        [E(0, 0), E(1, 4000), E(2, 6000)],
        9000,
        [E(0, 0), E(1, 4000)],
        7000,
        6000,
    ),
    (
        "the slave has an epoch the master never had",
        [E(0, 0), E(2, 5000)],
        9000,
        [E(0, 0), E(1, 4000)],
        4800,
        4000,
    ),
    (
        "same epoch number, different start: not common",
        [E(0, 0), E(1, 4000)],
        9000,
        [E(0, 0), E(1, 3500)],
        8000,
        3500,
    ),
    ("first entries differ", [E(0, 100)], 9000, [E(0, 0)], 8000, 0),
    ("master history started later (pre-epoch data)", [E(0, 1000)], 9000, [E(0, 1000)], 800, 800),
    (
        "longer common history, slave behind in the last epoch",
        [E(0, 0), E(3, 10), E(7, 20)],
        90,
        [E(0, 0), E(3, 10), E(7, 20)],
        55,
        55,
    ),
]


@pytest.mark.parametrize(
    ("name", "master", "master_max", "slave", "slave_max", "expected"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_consistent_offset(
    name: str,
    master: list[EpochEntry],
    master_max: int,
    slave: list[EpochEntry],
    slave_max: int,
    expected: int,
) -> None:
    assert consistent_offset(master, master_max, slave, slave_max) == expected
    assert consistent_offset(master, master_max, slave, slave_max) <= slave_max
