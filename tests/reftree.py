"""A deterministic source tree for byte-identity tests of `fanfs pack` (issue 11).

`build_reference_tree` writes the same names, bytes, modes and mtimes every time, so a pack of
it is the same bytes every time; tests/data/pack-reference.json records the sha256 of every
file of the packs the pre-streaming pack code (commit 9cd7d7e) wrote of it, and
tests/unit/test_pack_stream.py checks that today's code writes exactly those bytes.
`auto-dict` was recorded again after issue 14 changed the dictionary trainer on purpose
(fixed training parameters, the size chosen by measurement); the others are 9cd7d7e's.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from fanfs.format.layout import MANIFEST_HEADER, MANIFEST_NAME

MTIME_NS = 1_700_000_000_123_456_789

# name -> `fanfs pack` arguments after SRC OUT. `auto` packs keep measured timings in their
# manifest, so only their index and partitions are compared.
SCENARIOS: dict[str, list[str]] = {
    "zstd-4k-bcast": [
        "--codec", "zstd:3", "--chunk-size", "4KiB", "--broadcast", "val/**", "--jobs", "2",
    ],
    "lz4-64k-5parts": ["--codec", "lz4", "--chunk-size", "64KiB", "--partitions", "5", "--jobs", "1"],
    "none-4k-2bcast": [
        "--codec", "none", "--chunk-size", "4KiB", "--partitions", "3",
        "--broadcast", "val", "--broadcast", "train/c0*/*.json", "--jobs", "3",
    ],
    "auto-dict": [
        "--codec", "auto", "--codecs", "zstd:3,zstd:19+dict", "--max-overhead", "10000%",
        "--read-mbps", "1", "--read-latency-ms", "1", "--chunk-size", "4KiB", "--jobs", "2",
    ],
}  # fmt: skip


def _text(rng: random.Random, n: int) -> bytes:
    words = [b"alpha", b"beta", b"gamma", b"tensor", b"label", b"\n", b"0.25", b"{"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def build_reference_tree(root: Path) -> None:
    """About 1,500 entries: nested class directories, files of 0 B to 70 KiB (1 to 18 chunks of
    4 KiB; text, JSON, random), symlinks (dangling, non-UTF-8 target), non-UTF-8 and 255-byte
    names, empty directories, a `val/` split; fixed modes and mtimes."""
    rng = random.Random(11)
    b = os.fsencode(root)
    os.makedirs(b)
    paths: list[bytes] = []
    for split, classes, per in ((b"train", 12, 90), (b"val", 4, 20)):
        for c in range(classes):
            d = b"%s/c%02d" % (split, c)
            os.makedirs(b + b"/" + d)
            paths.append(d)
            for i in range(per):
                kind = rng.randrange(4)
                size = rng.choice([0, 1, 100, 4095, 4096, 4097, 9000, 20_000, 70_000])
                if kind == 0:
                    name, data = b"img_%04d.jpg" % i, rng.randbytes(size)
                elif kind == 1:
                    name, data = b"ann_%04d.json" % i, _text(rng, size)
                elif kind == 2:
                    name, data = b"feat_%04d.npy" % i, bytes(size // 2) + rng.randbytes(size // 2)
                else:
                    name, data = b"t%04d" % i, _text(rng, size)
                with open(b + b"/" + d + b"/" + name, "wb") as f:
                    f.write(data)
                os.chmod(b + b"/" + d + b"/" + name, rng.choice([0o644, 0o600, 0o755, 0o444]))
                paths.append(d + b"/" + name)
            if c % 5 == 0:
                sub = d + b"/deeper/deepest"
                os.makedirs(b + b"/" + sub)
                with open(b + b"/" + sub + b"/x.txt", "wb") as f:
                    f.write(_text(rng, 5000))
                paths += [d + b"/deeper", sub, sub + b"/x.txt"]
    os.makedirs(b + b"/names/empty_dir")
    for name in (b"bad\xff\xfename", "ünïcødé.txt".encode(), b"n" * 255, b"a-b", b"a.b", b"A"):
        with open(b + b"/names/" + name, "wb") as f:
            f.write(name + b"\n")
        paths.append(b"names/" + name)
    os.symlink(b"../train/c00/t0003", b + b"/names/link")
    os.symlink(b"does/not/exist", b + b"/names/dangling")
    os.symlink(b"\xff-target", b + b"/names/bad_target")
    paths += [b"names/link", b"names/dangling", b"names/bad_target", b"names/empty_dir"]
    paths += [b"train", b"val", b"names"]
    for i, rel in enumerate(sorted(paths, key=lambda p: (-p.count(b"/"), p))):
        ns = MTIME_NS + i * 1_000_003
        os.utime(b + b"/" + rel, ns=(ns, ns), follow_symlinks=False)
    os.utime(b, ns=(MTIME_NS, MTIME_NS))


def pack_digests(pack: Path, *, with_manifest: bool) -> dict[str, str]:
    """sha256 of every file of a pack (the manifest's JSON body without `created_by` and,
    for `auto` packs, without the manifest at all)."""
    out: dict[str, str] = {}
    for name in sorted(os.listdir(pack)):
        data = (pack / name).read_bytes()
        if name == MANIFEST_NAME:
            if not with_manifest:
                continue
            body: dict[str, Any] = json.loads(data[MANIFEST_HEADER.size :])
            body.pop("created_by")
            data = json.dumps(body, sort_keys=True).encode()
        out[name] = hashlib.sha256(data).hexdigest()
    return out
