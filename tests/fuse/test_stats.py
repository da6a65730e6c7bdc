"""`fanfs stats`: the running daemon's counters, as a user reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Mount, run_fanfs

pytestmark = pytest.mark.fuse


def test_stats_json_counts_reads(edge_tree: Path, edge_pack: Path, mount_factory: object) -> None:
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    before = json.loads(run_fanfs("stats", "--json", mount.mnt).stdout)
    data = (mount.mnt / "sizes" / "text_196625").read_bytes()
    assert data == (edge_tree / "sizes" / "text_196625").read_bytes()
    result = run_fanfs("stats", "--json", mount.mnt)
    assert result.returncode == 0, result.stderr
    after = json.loads(result.stdout)
    assert after["reads"] > before["reads"]
    assert after["read_bytes"] - before["read_bytes"] == len(data)
    assert after["read_ns"] > before["read_ns"]
    assert after["bytes_decoded"] >= before["bytes_decoded"] + len(data)
    assert after["data_errors"] == after["internal_errors"] == 0


def test_stats_table_and_errors(edge_pack: Path, mount_factory: object, tmp_path: Path) -> None:
    mount: Mount = mount_factory(edge_pack)  # type: ignore[operator]
    result = run_fanfs("stats", mount.mnt)
    assert result.returncode == 0
    assert "READ requests" in result.stdout and str(mount.mnt) in result.stdout.splitlines()[0]
    result = run_fanfs("stats", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "fanfs stats: error: %s: not a fanfs mount (No data available)" % tmp_path
    ]
    result = run_fanfs("stats", "--watch", "0", mount.mnt)
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "fanfs stats: error: --watch must be a positive number of seconds",
    )
