"""Solid blocks (format 7) through a real mount: small files compressed together read back
byte for byte at every offset, a corrupt block fails every file in it (and only those), and
`fanfs stats` counts what the blocks cost."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fanfs.compression import CODEC_ZSTD
from fanfs.format.reader import PackReader
from fanfs.stats import read_stats
from tests.conftest import Mount, entry_at, run_fanfs
from tests.fuse.test_corruption import damage_chunk, read_errno
from tests.treegen import label_text, write_tree

# Small text files in two directories (grouped by walk order), empty files (never in a
# block), files just above the member limit (a quarter of the 8 KiB block: their own chunk),
# and one file in 4 KiB blocks.
FILES = {
    **{"a/%03d.txt" % i: label_text(50 + 37 * i, i) for i in range(40)},
    **{"b/%03d.json" % i: label_text(2048 - i, 100 + i) for i in range(8)},
    "b/edge.txt": label_text(2049, 7),
    "b/empty": b"",
    "c/big.bin": label_text(20000, 3),
}


@pytest.fixture(scope="module")
def solid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("solid")
    src = write_tree(root / "src", FILES)
    pack = root / "solid.fan"
    args = ("--chunk-size", "16KiB", "--block-size", "4KiB", "--solid-block", "8KiB")
    result = run_fanfs("pack", src, pack, "-q", *args)
    assert result.returncode == 0, result.stderr
    return src, pack


def _solid_rows(pack: Path) -> dict[str, tuple[int, int, int]]:
    """rel -> (partition, offset, skip) of every file stored in a solid block."""
    reader = PackReader(str(pack))
    try:
        index = reader.index
        out = {}
        for rel in FILES:
            cid = index.first[entry_at(reader, rel)]
            if FILES[rel] and index.chunk_bsize[cid]:
                out[rel] = (
                    index.chunk_partition[cid],
                    index.chunk_offset[cid],
                    index.chunk_skip[cid],
                )
        return out
    finally:
        reader.close()


def test_small_files_share_blocks_and_large_ones_do_not(solid: tuple[Path, Path]) -> None:
    _, pack = solid
    rows = _solid_rows(pack)
    assert set(rows) == {rel for rel, data in FILES.items() if 0 < len(data) <= 2048}
    blocks = {(p, o) for p, o, _ in rows.values()}
    assert 5 <= len(blocks) < len(rows)
    manifest = PackReader(str(pack)).manifest
    assert manifest["format_version"] == 7
    assert manifest["options"]["solid_block"] == 8192


def test_a_solid_pack_is_deterministic(solid: tuple[Path, Path], tmp_path: Path) -> None:
    src, pack = solid
    again = tmp_path / "again.fan"
    args = ("--chunk-size", "16KiB", "--block-size", "4KiB", "--solid-block", "8KiB", "-j", "2")
    assert run_fanfs("pack", src, again, "-q", *args).returncode == 0
    for name in sorted(os.listdir(pack)):
        assert (again / name).read_bytes() == (pack / name).read_bytes(), name


def test_every_file_reads_back_at_every_offset(
    solid: tuple[Path, Path], mount_factory: Callable[..., Mount]
) -> None:
    src, pack = solid
    mnt = mount_factory(pack, "--prefetch", "off", "--cache-memory", "0").mnt
    rng = random.Random(7)
    rels = sorted(FILES)
    rng.shuffle(rels)
    for rel in rels:
        want = (src / rel).read_bytes()
        assert (mnt / rel).read_bytes() == want, rel
        with open(mnt / rel, "rb", buffering=0) as f:
            for _ in range(5):
                off = rng.randrange(len(want) + 1)
                length = rng.randrange(1, 3000)
                assert os.pread(f.fileno(), length, off) == want[off : off + length], rel
    stats = read_stats(str(mnt))
    solid_bytes = sum(len(FILES[r]) for r in _solid_rows(pack))
    # Every block was decoded at least once, and files of a decoded block were served from it.
    assert stats["solid_bytes"] >= solid_bytes
    assert stats["solid_hits"] > 0


def test_a_corrupt_solid_block_fails_exactly_its_files(
    solid: tuple[Path, Path], tmp_path: Path, mount_factory: Callable[..., Mount]
) -> None:
    src, pack = solid
    damaged = tmp_path / "damaged.fan"
    shutil.copytree(pack, damaged)
    rows = _solid_rows(pack)
    victim = rows["a/010.txt"][:2]
    damage_chunk(damaged, "a/010.txt", 0, CODEC_ZSTD)
    mnt = mount_factory(damaged, "--prefetch", "off").mnt
    in_block = {rel for rel, row in rows.items() if row[:2] == victim}
    assert len(in_block) > 1
    for rel in FILES:
        if rel in in_block:
            assert read_errno(mnt / rel) == errno.EIO, rel
        else:
            assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel
    result = run_fanfs("verify", damaged)
    assert result.returncode != 0
    for rel in in_block:
        assert rel in result.stdout + result.stderr


def test_decode_amplification_counts_whole_solid_blocks(
    solid: tuple[Path, Path], mount_factory: Callable[..., Mount]
) -> None:
    """Reading one small file of each block decodes every block whole: `fanfs stats` counts
    the blocks' bytes, and its decode amplification is (chunks + blocks decoded) / served."""
    _, pack = solid
    mnt = mount_factory(pack, "--prefetch", "off", "--cache-memory", "0").mnt
    rows = _solid_rows(pack)
    first_of_block: dict[tuple[int, int], str] = {}
    for rel, (part, off, _) in sorted(rows.items()):
        first_of_block.setdefault((part, off), rel)
    served = sum((mnt / rel).stat().st_size for rel in first_of_block.values())
    for rel in first_of_block.values():
        (mnt / rel).read_bytes()
    result = run_fanfs("stats", "--json", mnt)
    stats = json.loads(result.stdout)
    assert stats["read_bytes"] == served
    assert stats["solid_hits"] == 0
    # Every block decoded once, whole: much more than the one file read from each.
    assert stats["solid_bytes"] >= 2 * served
    prom = run_fanfs("stats", "--prometheus", mnt).stdout
    line = next(x for x in prom.splitlines() if x.startswith("fanfs_decode_amplification{"))
    want = (stats["bytes_decoded"] + stats["solid_bytes"]) / served
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(want)


@pytest.mark.parametrize("prefetch", ["on", "off"])
def test_reading_one_file_of_a_block_puts_its_block_mates_in_the_page_cache(
    solid: tuple[Path, Path], mount_factory: Callable[..., Mount], prefetch: str
) -> None:
    """The serving process that decodes a solid block pushes the block's other files into the
    page cache: they then read back byte for byte with no READ and no second decode (in any
    serving process). Also with --prefetch off (no read-ahead): a balanced plan counts each
    block decoded once an epoch."""
    src, pack = solid
    mnt = mount_factory(pack, "--cache-memory", "0", "--prefetch", prefetch).mnt
    rows = _solid_rows(pack)
    target = "a/005.txt"
    mates = sorted(r for r, row in rows.items() if row[:2] == rows[target][:2] and r != target)
    assert len(mates) >= 2
    for rel in FILES:
        (mnt / rel).stat()  # the kernel knows each inode, as after a walk
    assert (mnt / target).read_bytes() == (src / target).read_bytes()
    deadline = time.monotonic() + 10
    while read_stats(str(mnt))["solid_pushed"] < len(mates):
        assert time.monotonic() < deadline, (len(mates), read_stats(str(mnt))["solid_pushed"])
        time.sleep(0.02)
    before = read_stats(str(mnt))
    for rel in mates:
        assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel
    after = read_stats(str(mnt))
    assert after["reads"] == before["reads"]
    assert after["solid_bytes"] == before["solid_bytes"]
    assert after["solid_pushed"] == len(mates)


def test_two_serving_processes_decode_each_block_once(
    solid: tuple[Path, Path], mount_factory: Callable[..., Mount]
) -> None:
    """Files of a block read one after another reach both serving processes (the kernel
    hands each READ to whichever is free), before the block's other files are pushed into
    the page cache (here mostly never: the kernel has no inode for them yet). The process that
    decodes a block shares it: every block is decoded once in all, and every file reads back
    byte for byte, some of them from the other process's copy. (Which process the kernel
    hands a READ is its choice: in one CI run of many, one process served every file, so
    up to three fresh mounts are read until one shares.)"""
    src, pack = solid
    rows = _solid_rows(pack)
    reader = PackReader(str(pack))
    try:
        index = reader.index
        sizes = {
            row[:2]: index.chunk_bsize[index.first[entry_at(reader, rel)]]
            for rel, row in rows.items()
        }
    finally:
        reader.close()
    for attempt in range(3):
        mnt = mount_factory(
            pack, "--processes", "2", "--cache-memory", "0", "--prefetch", "off",
            name="mnt%d" % attempt,
        ).mnt  # fmt: skip
        for rel in sorted(rows, key=rows.__getitem__):  # in storage order
            assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel
        stats = read_stats(str(mnt))
        assert stats["solid_bytes"] == sum(sizes.values())
        assert stats["solid_shared"] <= stats["solid_hits"]
        if stats["solid_shared"] > 0:
            break
    assert stats["solid_shared"] > 0
