"""`fanfs.mountinfo` against the kernel's own /proc/self/mountinfo: a real tmpfs mount with
a space and a backslash in its path (both escaped as octal there)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanfs.mountinfo import find_mount, mounts_under


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "with space\\and backslash"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "fanfs-test-src", str(mnt)], check=True
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_find_mount_reads_escaped_paths(tmpfs: Path) -> None:
    entry = find_mount(str(tmpfs))
    assert entry is not None
    assert (entry.mountpoint, entry.fstype, entry.source) == (str(tmpfs), "tmpfs", "fanfs-test-src")
    assert find_mount(str(tmpfs.parent)) is None  # a plain directory


def test_mounts_under_a_directory(tmpfs: Path) -> None:
    assert [e.mountpoint for e in mounts_under(str(tmpfs.parent))] == [str(tmpfs)]
    assert [e.mountpoint for e in mounts_under(str(tmpfs))] == [str(tmpfs)]  # itself too
    assert mounts_under(str(tmpfs.parent), source="something-else") == []
    # A sibling whose name starts with the same characters is not "under" it.
    assert mounts_under(str(tmpfs.parent / "with")) == []
