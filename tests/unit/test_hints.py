"""Hints without a mount: resolving hinted paths against a pack's index, and the client's
refusal of a directory that is not a fanfs mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fanfs.errors import UsageError
from fanfs.format.index import Index
from fanfs.hints import HintChannel, resolve
from tests.conftest import open_reader, run_fanfs
from tests.treegen import write_tree

MNT = b"/mnt/data"


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hints") / "src"
    write_tree(
        root,
        {
            "top.txt": b"top\n",
            "a/b/c.txt": b"c\n",
            "a/b/d.txt": b"d\n",
            "a/with space.txt": b"space\n",
            "names/\u00fcn\u00efc\u00f8d\u00e9.txt": b"unicode\n",
        },
    )
    (root / "a" / "empty").mkdir()
    os.symlink("top.txt", root / "link")
    out = root.parent / "pack.fan"
    result = run_fanfs("pack", root, out, "-q")
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def index(pack: Path) -> Index:
    return open_reader(pack).index


def path_of(index: Index, entry: int) -> bytes:
    assert entry >= 0
    return index.path(entry)


@pytest.mark.parametrize(
    "rel",
    [
        b"top.txt",
        b"a/b/c.txt",
        b"a/b/d.txt",
        b"a/with space.txt",
        "names/\u00fcn\u00efc\u00f8d\u00e9.txt".encode(),
    ],
)
def test_resolve_files(index: Index, rel: bytes) -> None:
    # Relative to the mount's root, absolute inside the mount, and with "." and "//" parts.
    assert path_of(index, resolve(index, MNT, rel)) == rel
    assert resolve(index, MNT, MNT + b"/" + rel) == resolve(index, MNT, rel)
    assert resolve(index, MNT + b"/", MNT + b"/" + rel) == resolve(index, MNT, rel)
    assert resolve(index, MNT, b"./" + rel.replace(b"/", b"//")) == resolve(index, MNT, rel)


def test_resolve_distinguishes_files(index: Index) -> None:
    entries = {resolve(index, MNT, rel) for rel in (b"top.txt", b"a/b/c.txt", b"a/b/d.txt")}
    assert len(entries) == 3 and -1 not in entries


@pytest.mark.parametrize(
    "path",
    [
        b"a",  # directories are not files
        b"a/b",
        b"a/empty",
        MNT + b"/a/b",
        b"",  # the root
        MNT,
        b"link",  # a symlink is not followed
        b"nope.txt",  # missing
        b"a/b/nope.txt",
        b"a/nope/c.txt",
        b"top.txt/c.txt",  # under a file
        b"/elsewhere/top.txt",  # outside the mount
        b"/mnt/dataset/top.txt",  # a sibling whose name starts with the mount's
        b"/mnt/top.txt",
        b"TOP.TXT",  # names are exact bytes
    ],
)
def test_resolve_refuses(index: Index, path: bytes) -> None:
    assert resolve(index, MNT, path) == -1


def test_hint_channel_needs_a_fanfs_mount(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        HintChannel(str(tmp_path))
    assert str(info.value) == "%s: no fanfs hint channel (No data available)" % tmp_path
    missing = tmp_path / "missing"
    with pytest.raises(UsageError) as info:
        HintChannel(str(missing))
    assert str(info.value) == "%s: no fanfs hint channel (No such file or directory)" % missing
