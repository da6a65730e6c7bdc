"""The foundation's acceptance run: 20,000 files plus every edge case, packed, mounted by the
background daemon, and compared with the source by `diff -r`, `tar c` and `sha256sum`."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_fanfs
from tests.treegen import make_dataset, make_edge_tree

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

FILES = 20_000


def _mounted(mnt: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(mnt) for line in f)


def _tar_sha(root: Path) -> str:
    tar = subprocess.run(
        ["tar", "--sort=name", "--numeric-owner", "-C", str(root), "-cf", "-", "."],
        capture_output=True,
        check=True,
    )
    return hashlib.sha256(tar.stdout).hexdigest()


def _sha256sums(root: Path) -> bytes:
    return subprocess.run(
        "find . -type f -print0 | sort -z | xargs -0 sha256sum",
        shell=True,
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout


def test_20000_files_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_edge_tree(src / "edge", chunk_size=256 * 1024)
    make_dataset(src / "data", FILES)
    os.utime(src, ns=(1_400_000_000_000_000_000,) * 2)
    os.utime(src / "data", ns=(1_400_000_000_000_000_000,) * 2)
    pack, mnt = tmp_path / "pack", tmp_path / "mnt"
    result = run_fanfs("pack", src, pack, "-q", "--chunk-size", "256KiB", timeout=600)
    assert result.returncode == 0, result.stderr
    mnt.mkdir()
    result = run_fanfs("mount", pack, mnt, "-o", "fsname=fanfs-test")
    assert result.returncode == 0, result.stderr
    try:
        diff = subprocess.run(
            ["diff", "-r", "--no-dereference", str(src), str(mnt)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert diff.returncode == 0, diff.stdout[-2000:] + diff.stderr[-2000:]
        assert _tar_sha(mnt) == _tar_sha(src)
        assert _sha256sums(mnt) == _sha256sums(src)
        assert len(os.listdir(mnt / "data" / "class_000")) == 500
    finally:
        result = run_fanfs("umount", mnt)
        if result.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
    assert result.returncode == 0, result.stderr
    assert not _mounted(mnt)
