"""Differential tests: the mounted pack is the source tree, byte for byte and stat for stat."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Mount

pytestmark = pytest.mark.fuse


def _snapshot(root: Path) -> dict[bytes, tuple[object, ...]]:
    """Everything a user can see of a tree, keyed by relative path (bytes)."""
    out: dict[bytes, tuple[object, ...]] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, base)
            if stat.S_ISLNK(st.st_mode):
                extra: object = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    extra = hashlib.sha256(f.read()).hexdigest()
            else:
                extra = sorted(os.listdir(path))
            size = st.st_size if not stat.S_ISDIR(st.st_mode) else None
            out[rel] = (stat.filemode(st.st_mode), size, st.st_mtime_ns, extra)
    return out


def test_snapshot_equal(edge_tree: Path, edge_mount: Mount) -> None:
    source = _snapshot(edge_tree)
    mounted = _snapshot(edge_mount.mnt)
    assert mounted.keys() == source.keys()
    for rel, expected in source.items():
        assert mounted[rel] == expected, rel


def test_root_attributes(edge_tree: Path, edge_mount: Mount) -> None:
    src, mnt = os.stat(edge_tree), os.stat(edge_mount.mnt)
    assert (stat.filemode(mnt.st_mode), mnt.st_mtime_ns) == (
        stat.filemode(src.st_mode),
        src.st_mtime_ns,
    )


def test_diff_r(edge_tree: Path, edge_mount: Mount) -> None:
    result = subprocess.run(
        ["diff", "-r", "--no-dereference", str(edge_tree), str(edge_mount.mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _tar_digest(root: Path) -> str:
    tar = subprocess.run(
        ["tar", "--sort=name", "--numeric-owner", "-C", str(root), "-cf", "-", "."],
        capture_output=True,
        check=True,
    )
    return hashlib.sha256(tar.stdout).hexdigest()


def test_tar(edge_tree: Path, edge_mount: Mount) -> None:
    assert _tar_digest(edge_mount.mnt) == _tar_digest(edge_tree)


def test_find_sha256sum(edge_tree: Path, edge_mount: Mount) -> None:
    def sums(root: Path) -> bytes:
        return subprocess.run(
            "find . -type f -print0 | sort -z | xargs -0 sha256sum",
            shell=True,
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout

    assert sums(edge_mount.mnt) == sums(edge_tree)
