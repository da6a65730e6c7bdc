"""The streaming pack (issue 11): byte-identical output to the pre-streaming code, bounded
memory per file, many source reads in flight, and a bounded `fanfs plan`.

Byte identity is checked two ways: the golden-v4 sources repack to exactly the committed
golden-v4 packs (tests/data/make_golden.py's options), and the reference tree of
tests/reftree.py packs, under several option sets, to exactly the digests that the
pre-streaming code recorded in tests/data/pack-reference.json.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from fanfs.cli import main as fanfs_main
from tests.data.make_golden import CODECS_V3, MTIME, PACK_ARGS
from tests.reftree import SCENARIOS, build_reference_tree, pack_digests

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GOLDEN = DATA_DIR / "golden-v4"
REFERENCE = json.loads((DATA_DIR / "pack-reference.json").read_text())


def _pack(src: Path, out: Path, *args: str) -> None:
    assert fanfs_main(["pack", str(src), str(out), *args]) == 0


@pytest.fixture(scope="module")
def golden_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("golden") / "src"
    src.mkdir()
    with tarfile.open(GOLDEN / "src.tar.gz") as tar:
        tar.extractall(src, filter="fully_trusted")
        for member in tar.getmembers():  # tarfile leaves symlinks' own mtimes unset
            if member.issym():
                os.utime(src / member.name, (MTIME, MTIME), follow_symlinks=False)
    os.utime(src, (MTIME, MTIME))  # the tar has no entry for the root itself
    return src


@pytest.mark.parametrize("name", sorted(CODECS_V3))
def test_golden_sources_repack_to_the_golden_bytes(
    golden_src: Path, tmp_path: Path, name: str
) -> None:
    out = tmp_path / name
    _pack(golden_src, out, "--codec", *CODECS_V3[name].split(), *PACK_ARGS)
    # An auto pack's manifest holds the timings measured while planning; the rest is exact.
    auto = CODECS_V3[name].startswith("auto")
    assert pack_digests(out, with_manifest=not auto) == pack_digests(
        GOLDEN / name, with_manifest=not auto
    )


@pytest.fixture(scope="module")
def reference_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("reference") / "src"
    build_reference_tree(src)
    return src


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_reference_tree_packs_to_the_recorded_bytes(
    reference_src: Path, tmp_path: Path, scenario: str
) -> None:
    out = tmp_path / scenario
    _pack(reference_src, out, "-q", *SCENARIOS[scenario])
    assert pack_digests(out, with_manifest=not scenario.startswith("auto")) == REFERENCE[scenario]
