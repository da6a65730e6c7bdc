"""Regenerate the golden packs under tests/data/golden-v<FORMAT_VERSION>/ (run once per format).

    python tests/data/make_golden.py

Writes `src.tar.gz` (the source tree, with names, modes, mtimes and symlinks) and one pack per
codec (`zstd.fan`, `lz4.fan`, `brotli.fan`; from version 2 also `lzma.fan`, and `auto.fan`,
whose plan stores small JSON files with a zstd dictionary; from version 3 also `lz4dict.fan`,
whose plan stores them with lz4 and a dictionary, and `shuffle.fan`, zstd after a 4-byte
shuffle; version 4 has the same packs, with chunk checksums bound to their chunk ids; version
5 adds `blocks.fan`, a file larger than a chunk in blocks; version 6 stores these small packs'
indexes compressed, and adds `plainindex.fan`, whose index is not; version 7 has only
`solid.fan` and `solidlz4.fan`, small files in solid blocks, since packs without them are
written as version 6) packed from it. Commit them and never regenerate
an existing version's directory: tests/unit/test_format.py checks that the current reader
still reads every committed golden pack byte for byte (STYLE.md B10).
"""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MTIME = 1_700_000_000  # whole seconds: tar stores seconds, packs store ns
CODECS = {"zstd.fan": "zstd:3", "lz4.fan": "lz4", "brotli.fan": "brotli:5"}
# Version 2: codec 4 and the optimizer. The plan's budget is huge and the read model fixed,
# so it picks the smallest candidate of each class: the dictionary for the ann/*.json class.
CODECS_V2 = {
    **CODECS,
    "lzma.fan": "lzma:6",
    "auto.fan": "auto --codecs zstd:3,zstd:19+dict --max-overhead 10000% --read-mbps 1 --read-latency-ms 1",
}
# Version 3: lz4 chunks with a dictionary (the only candidate besides none is lz4hc+dict, so
# the ann/*.json class gets the dictionary), and the byte shuffle in the codec byte.
CODECS_V3 = {
    **CODECS_V2,
    "lz4dict.fan": "auto --codecs lz4hc:9+dict --max-overhead 10000% --read-mbps 1 --read-latency-ms 1",
    "shuffle.fan": "zstd:3+shuf4",
}
# Version 5: a file larger than a chunk stored in blocks (data/text.txt, 9000 bytes: three
# blocks of 4 KiB; data/exact.txt, 8192 bytes, stays one chunk). Given after PACK_ARGS.
EXTRA_ARGS = {
    "blocks.fan": ["--chunk-size", "8KiB", "--block-size", "4KiB"],
    # Version 6: the index stored as its columns (the other packs, this small, compress it).
    "plainindex.fan": ["--index-codec", "none"],
}
CODECS_V5 = {**CODECS_V3, "blocks.fan": "zstd:3"}
CODECS_V6 = {**CODECS_V5, "plainindex.fan": "zstd:3"}
# Version 7: solid blocks. A pack without them is written as version 6, so this version's
# packs are the solid ones: every file of at most 1 KiB in blocks of 4 KiB, zstd and lz4.
CODECS_V7 = {"solid.fan": "zstd:3", "solidlz4.fan": "lz4"}
EXTRA_ARGS["solid.fan"] = EXTRA_ARGS["solidlz4.fan"] = ["--solid-block", "4KiB"]
PACK_ARGS = [
    "--chunk-size",
    "4KiB",
    "--partitions",
    "2",
    "--broadcast",
    "val/**",
    "--jobs",
    "1",
    "-q",
]


def _text(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"tensor", b"label", b"\n"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def _record(i: int) -> bytes:
    rng = random.Random(100 + i)
    return (
        '{"image_id": %d, "file": "img_%06d.jpg", "bbox": [%.1f, %.1f, %.1f, %.1f], '
        '"category": "class_%03d", "iscrowd": 0, "caption": "%s"}\n'
        % (
            i,
            rng.randrange(10**6),
            *(rng.uniform(0, 640) for _ in range(4)),
            rng.randrange(80),
            " ".join(
                rng.choice(["a", "dog", "on", "the", "red", "car", "road"]) for _ in range(12)
            ),
        )
    ).encode()


def build_tree(root: Path, version: int) -> None:
    """The golden source tree: small, but one of every kind of entry and chunk.

    Version 2 adds 64 small JSON files (`ann/`), a class the optimizer gives a dictionary.
    """
    b = os.fsencode(root)
    files: dict[bytes, tuple[bytes, int]] = {
        b"README.txt": (b"fanfs golden pack, format version 1\n", 0o644),
        b"run.sh": (b"#!/bin/sh\necho hello\n", 0o755),
        b"data/text.txt": (_text(9000, 1), 0o644),  # 3 chunks of 4 KiB, compressed
        b"data/random.bin": (random.Random(2).randbytes(600), 0o600),  # stored raw
        b"data/empty": (b"", 0o644),  # no chunks
        b"data/exact.txt": (b"0123456789abcdef" * 512, 0o644),  # exactly 2 chunks
        b"data/sub/deep.txt": (b"deep\n" * 20, 0o444),
        b"val/v1.txt": (_text(1500, 4), 0o644),  # broadcast
        b"val/v2.bin": (random.Random(5).randbytes(300), 0o644),  # broadcast, raw
        b"names/bad\xff\xfename": (b"non-utf8 name\n", 0o644),
        "names/ünïcødé.txt".encode(): ("unicode ✓\n".encode(), 0o644),
        b"names/" + b"n" * 255: (b"255-byte name\n", 0o644),
    }
    if version >= 2:
        files[b"README.txt"] = (b"fanfs golden pack, format version %d\n" % version, 0o644)
        for i in range(64):
            files[b"ann/%04d.json" % i] = (_record(i) * (2 + i % 3), 0o644)
    os.makedirs(b + b"/empty_dir")
    for rel, (data, mode) in files.items():
        path = b + b"/" + rel
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
    os.symlink(b"data/text.txt", b + b"/link")
    os.symlink(b"does/not/exist", b + b"/dangling")
    os.symlink(b"\xff-target", b + b"/names/bad_target")
    for dirpath, dirnames, filenames in os.walk(b, topdown=False):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (MTIME, MTIME), follow_symlinks=False)
        os.utime(dirpath, (MTIME, MTIME))


def write_tar(root: Path, dest: Path) -> None:
    """A reproducible tar.gz of the tree (sorted members, no owners, gzip mtime 0)."""
    base = os.fsencode(root)
    members = []
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            members.append(os.path.relpath(os.path.join(dirpath, name), base))
    with (
        open(dest, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        for rel in sorted(members):
            info = tar.gettarinfo(os.fsdecode(os.path.join(base, rel)), arcname=os.fsdecode(rel))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with open(os.path.join(base, rel), "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def main() -> None:
    from fanfs.format.layout import FORMAT_VERSION

    out = HERE / ("golden-v%d" % FORMAT_VERSION)
    if out.exists():
        sys.exit("%s exists: golden packs of a released format are never regenerated" % out)
    out.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        build_tree(src, FORMAT_VERSION)
        write_tar(src, out / "src.tar.gz")
        codecs = (
            CODECS_V7
            if FORMAT_VERSION >= 7
            else CODECS_V6
            if FORMAT_VERSION >= 6
            else CODECS_V5
            if FORMAT_VERSION >= 5
            else CODECS_V3
            if FORMAT_VERSION >= 3
            else CODECS_V2
            if FORMAT_VERSION >= 2
            else CODECS
        )
        for name, codec in codecs.items():
            cmd = [
                sys.executable,
                "-m",
                "fanfs",
                "pack",
                str(src),
                str(out / name),
                "--codec",
                *codec.split(),
                *PACK_ARGS,
                *EXTRA_ARGS.get(name, []),
            ]
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
