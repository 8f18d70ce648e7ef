"""The `rocketq store` command end to end, as a user runs it: a real store, the installed CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ROCKETQ = [sys.executable, "-c", "from services.cli.main import main; main()"]


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*args], cwd=ROOT, capture_output=True, text=True, check=check, timeout=120
    )


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cli") / "demo-store"
    out = run(sys.executable, "-m", "tools.demo_store", str(directory))
    assert "wrote 300 messages" in out.stdout
    return directory


def test_dump_json_lists_every_record_unit_and_index_entry(demo_store: Path) -> None:
    out = run(*ROCKETQ, "store", "dump", str(demo_store), "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    records = [r for r in rows if r["section"] == "commitlog" and not r.get("blank")]
    blanks = [r for r in rows if r["section"] == "commitlog" and r.get("blank")]
    units = [r for r in rows if r["section"] == "consumequeue"]
    entries = [r for r in rows if r["section"] == "index"]
    assert len(records) == 300
    assert blanks, "256 KiB files must have rolled over with a blank record"
    assert len(units) == 300
    # every message has a unique key and two business keys
    assert len(entries) == 900
    assert {r["topic"] for r in records} == {"OrderEvents", "Payments", "Audit"}
    # units point at records
    assert {u["commitlog_offset"] for u in units} == {r["offset"] for r in records}


def test_dump_tables_for_people(demo_store: Path) -> None:
    out = run(*ROCKETQ, "store", "dump", str(demo_store), "--section", "commitlog", "--limit", "2")
    assert "commitlog" in out.stdout
    assert "OrderEvents" in out.stdout


def test_verify_clean_store_exits_zero(demo_store: Path) -> None:
    out = run(*ROCKETQ, "store", "verify", str(demo_store))
    assert out.stdout.strip().endswith("OK")
    report = json.loads(run(*ROCKETQ, "store", "verify", str(demo_store), "--json").stdout)
    assert report["ok"] and report["records"] == 300 and report["units"] == 300


def test_verify_reports_a_flipped_body_byte(demo_store: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(demo_store, copy)
    first = sorted((copy / "commitlog").iterdir())[0]
    data = bytearray(first.read_bytes())
    data[200] ^= 0xFF  # inside the first record's body
    first.write_bytes(bytes(data))
    out = run(*ROCKETQ, "store", "verify", str(copy), check=False)
    assert out.returncode == 1
    assert "CRC" in out.stdout


def test_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    out = run(*ROCKETQ, "store", "verify", str(tmp_path), check=False)
    assert out.returncode != 0
    assert "not a RocketQ store directory" in out.stderr
