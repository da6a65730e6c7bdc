"""`fanfs pack --codec auto` through a real mount: small JSON files stored with a dictionary
(zstd, or lz4 since format version 3), incompressible files stored raw, a large file in several
chunks; every file reads back byte for byte (whole, and in odd-sized pieces), and the per-file
codec xattr says what the plan chose."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from fanfs.format.layout import PLAIN_FORMAT_VERSION
from tests.conftest import run_fanfs

pytestmark = pytest.mark.fuse


def _tree(root: Path) -> dict[str, bytes]:
    rng = random.Random(11)
    files: dict[str, bytes] = {}
    for i in range(300):
        record = {
            "image_id": i,
            "file_name": "img_%06d.jpg" % rng.randrange(10**6),
            "bbox": [round(rng.uniform(0, 640), 2) for _ in range(4)],
            "category": "class_%03d" % rng.randrange(80),
            "caption": " ".join(
                rng.choice(["a", "dog", "on", "the", "red", "car", "road"]) for _ in range(10)
            ),
        }
        files["ann/%04d.json" % i] = json.dumps(record).encode()
    for i in range(40):
        files["images/%03d.jpg" % i] = b"\xff\xd8\xff\xe0" + rng.randbytes(rng.randint(5000, 40000))
    words = [b"alpha", b"beta", b"tensor", b"label", b"\n"]
    files["corpus.txt"] = b" ".join(rng.choice(words) for _ in range(120_000))  # several chunks
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@pytest.mark.parametrize(
    ("candidates", "chosen", "xattr"),
    [
        ("lz4 zstd:3 zstd:9+dict", "zstd:9+dict", b"zstd"),
        ("lz4 lz4hc:9+dict", "lz4hc:9+dict", b"lz4"),
    ],
    ids=["zstd", "lz4"],
)
def test_auto_pack_with_dictionary_reads_back_through_the_mount(  # type: ignore[no-untyped-def]
    tmp_path: Path, mount_factory, candidates: str, chosen: str, xattr: bytes
) -> None:
    src = tmp_path / "src"
    files = _tree(src)
    pack = tmp_path / "auto.fan"
    result = run_fanfs(
        "pack",
        src,
        pack,
        "-q",
        "--codec",
        "auto",
        "--chunk-size",
        "64KiB",
        "--codecs",
        candidates,
        "--max-overhead",
        "1000%",
        "--read-mbps",
        "100",
        "--read-latency-ms",
        "1",
        "--time-budget",
        "5",
    )
    assert result.returncode == 0, result.stderr
    inspect = run_fanfs("inspect", "--json", pack)
    manifest = json.loads(inspect.stdout)
    assert [d["class"] for d in manifest["dictionaries"]] == ["ann/*.json"]
    codecs = {row["class"]: row["codec"] for row in manifest["plan"]["classes"]}
    assert codecs["ann/*.json"] == chosen
    assert codecs["images/*.jpg"] == "none"

    mount = mount_factory(pack)
    for rel, data in sorted(files.items()):
        with open(mount.mnt / rel, "rb", buffering=0) as f:
            assert f.read() == data, rel
    # Pieces that straddle the 64 KiB chunks of the large file.
    with open(mount.mnt / "corpus.txt", "rb", buffering=0) as f:
        pos, out = 0, bytearray()
        while piece := os.pread(f.fileno(), 50_001, pos):
            out += piece
            pos += len(piece)
    assert bytes(out) == files["corpus.txt"]
    assert os.getxattr(mount.mnt / "ann/0007.json", "user.fanfs.codec") == xattr
    assert os.getxattr(mount.mnt / "images/003.jpg", "user.fanfs.codec") == b"none"
    assert mount.log_lines("ERROR") == []


def _shuffled_pack(tmp_path: Path) -> tuple[dict[str, bytes], Path]:
    import numpy as np

    src = tmp_path / "src"
    rng = np.random.default_rng(12)
    files: dict[str, bytes] = {}
    for i in range(20):
        values = rng.standard_normal(rng.integers(1000, 40_000)).astype(np.float16).astype("<f4")
        files["arrays/%02d.f32" % i] = values.tobytes() + bytes(
            i % 4
        )  # some tails not whole elements
    files["big.f32"] = np.cumsum(rng.standard_normal(200_000) * 0.01).astype("<f4").tobytes()
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    pack = tmp_path / "shuf.fan"
    result = run_fanfs("pack", src, pack, "-q", "--codec", "lz4hc:9+shuf4", "--chunk-size", "64KiB")
    assert result.returncode == 0, result.stderr
    manifest = json.loads(run_fanfs("inspect", "--json", pack).stdout)
    assert manifest["format_version"] == PLAIN_FORMAT_VERSION == 6
    assert set(manifest["codec_stats"]) == {"lz4+shuf4"}
    return files, pack


def test_shuffled_pack_reads_back_through_the_mount(tmp_path: Path, mount_factory) -> None:  # type: ignore[no-untyped-def]
    """`--codec lz4hc:9+shuf4`: arrays shuffled before lz4 (codec byte 0x21) read back whole,
    in a sorted walk, and in pieces across chunks; the codec xattr names the shuffle."""
    files, pack = _shuffled_pack(tmp_path)
    mount = mount_factory(pack)
    for rel, data in sorted(files.items()):
        with open(mount.mnt / rel, "rb", buffering=0) as f:
            assert f.read() == data, rel
        assert os.getxattr(mount.mnt / rel, "user.fanfs.codec") == b"lz4+shuf4"
    with open(mount.mnt / "big.f32", "rb", buffering=0) as f:
        pieces = [
            os.pread(f.fileno(), 30_001, pos) for pos in range(0, len(files["big.f32"]), 30_001)
        ]
    assert b"".join(pieces) == files["big.f32"]
    assert mount.log_lines("ERROR") == []


def test_background_fill_caches_shuffled_chunks(tmp_path: Path, mount_factory) -> None:  # type: ignore[no-untyped-def]
    """The filler decodes every chunk of the node into the object cache, shuffled ones too
    (their decoded form is a memoryview, like a raw chunk's mapping, but is not one)."""
    files, pack = _shuffled_pack(tmp_path)
    chunks = sum(-(-len(data) // (64 * 1024)) for data in files.values())
    mount = mount_factory(pack, "--prefetch-into", "daemon")
    os.stat(mount.mnt / "big.f32")  # the first LOOKUP starts the fill
    deadline = time.monotonic() + 30
    while True:
        s = json.loads(run_fanfs("stats", "--json", mount.mnt).stdout)
        if s["fill_chunks"] == chunks or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (s["fill_chunks"], s["fill_bytes"]) == (chunks, sum(len(d) for d in files.values()))
    assert s["reads"] == 0
