"""Packs of every format version still mount (issue 12: a format change keeps old packs
readable). Each committed golden pack (tests/data/golden-v*/) is mounted for real and every
file, symlink and mode read through the kernel is compared with its `src.tar.gz`."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Mount

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# One pack per version, and the version-5 pack whose large file is stored in blocks.
PACKS = [*sorted(DATA_DIR.glob("golden-v*/zstd.fan")), DATA_DIR / "golden-v5" / "blocks.fan"]


@pytest.mark.parametrize("pack", PACKS, ids=lambda p: "%s/%s" % (p.parent.name, p.name))
def test_golden_pack_mounts_and_reads_back_its_source(
    pack: Path, mount_factory: Callable[..., Mount]
) -> None:
    mount = mount_factory(pack)
    checked = 0
    with tarfile.open(pack.parent / "src.tar.gz") as tar:
        for member in tar.getmembers():
            path = mount.mnt / member.name
            st = os.lstat(path)
            assert stat.S_IMODE(st.st_mode) == member.mode, member.name
            if member.issym():
                assert os.readlink(path) == member.linkname, member.name
            elif member.isdir():
                assert stat.S_ISDIR(st.st_mode), member.name
            else:
                extracted = tar.extractfile(member)
                assert extracted is not None
                assert path.read_bytes() == extracted.read(), member.name
                checked += 1
    assert checked >= 10
