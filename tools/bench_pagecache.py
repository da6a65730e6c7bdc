#!/usr/bin/env python3
"""First reads through a fresh mount of a pack that is not preloaded: its partitions in the
kernel's page cache, or on the disk, against the raw files cold and warm, in one run.

This is the regime of a pack larger than the preload budget (`--preload auto` copies at most a
quarter of the available memory) on a node whose page cache keeps the rest of the pack: every
file is new to the mount (no page of it is cached by FUSE) but its compressed bytes may be in
memory already. fanfs then reads a chunk without waiting for the disk (`RWF_NOWAIT`) and decodes
it on the request thread; from the disk, the chunk goes through a worker thread.

Each repeat, in this order: the raw files after `drop_caches` (native cold) and again at once
(native warm); then fanfs mounted with `--preload no --cache-memory 0 --prefetch off` after
`drop_caches` (pack on disk); then a fresh mount after reading the partition files once (pack
cached). Every file is read once, whole, in one fixed-seed random order split over `--readers`
processes; the bytes read are counted and checked against the file sizes, the sha256 of every
file through the mount is compared with the raw files once. The table gives files/s from the
median time, `x native cold` (that time over the system's, within each repeat, median), and the
mount's inline and thread decodes in the last repeat (from `user.fanfs.stats`).

    .venv/bin/python tools/bench_pagecache.py [--files 20000] [--repeats 3]   # as root
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

MOUNT_ARGS = ("--preload", "no", "--cache-memory", "0", "--prefetch", "off")
SYSTEMS = ("native cold", "native warm", "fanfs, pack on disk", "fanfs, pack in page cache")


def _read_all(paths: Sequence[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            total += len(f.read())
    return total


def timed_epoch(
    root: Path, relpaths: Sequence[str], expected: int, readers: int, seed: int
) -> float:
    order = [str(root / rel) for rel in relpaths]
    random.Random(seed).shuffle(order)
    slices = [order[i::readers] for i in range(readers)]
    with ProcessPoolExecutor(readers) as pool:
        start = time.perf_counter()
        total = sum(pool.map(_read_all, slices))
        elapsed = time.perf_counter() - start
    if total != expected:
        raise bl.BenchError("read %d bytes under %s, expected %d" % (total, root, expected))
    return elapsed


def digests(root: Path, relpaths: Sequence[str]) -> list[bytes]:
    return [hashlib.sha256((root / rel).read_bytes()).digest() for rel in relpaths]


def cache_pack(pack: Path) -> None:
    for name in sorted(os.listdir(pack)):
        with open(pack / name, "rb") as f:
            while f.read(1 << 24):
                pass


def main(argv: Sequence[str] | None = None) -> int:
    p = bl.new_parser(__doc__ or "")
    p.add_argument("--files", type=int, default=20000, help="files to generate (default 20000)")
    p.add_argument("--readers", type=int, default=4, help="reader processes (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="repeats (default 3)")
    p.add_argument("--seed", type=int, default=0, help="dataset and read-order seed")
    p.add_argument("--workdir", type=Path, help="work directory (default: a new one, removed)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_pagecache: needs root (mount, drop_caches)")
    workdir, created = bl.make_workdir(args.workdir)
    mounts = bl.MountStack()
    try:
        src = workdir / "src"
        dataset = bl.load_generated(src, args.files, args.seed) or bl.generate_dataset(
            src, args.files, args.seed
        )
        relpaths = list(dataset.relpaths)
        expected = sum((src / rel).stat().st_size for rel in relpaths)
        pack = workdir / "pack.fanfs"
        fanfs = [sys.executable, "-m", "fanfs"]
        if not pack.exists():
            bl.run_cmd([*fanfs, "pack", str(src), str(pack), "-q"], timeout_s=3600)
        reference = digests(src, relpaths)
        times: dict[str, list[float]] = {name: [] for name in SYSTEMS}
        stats: dict[str, dict[str, Any]] = {}
        for repeat in range(args.repeats):
            bl.drop_caches()
            times["native cold"].append(timed_epoch(src, relpaths, expected, args.readers, repeat))
            times["native warm"].append(timed_epoch(src, relpaths, expected, args.readers, repeat))
            for name, cached in ((SYSTEMS[2], False), (SYSTEMS[3], True)):
                mnt = workdir / "mnt"
                mnt.mkdir(exist_ok=True)
                mounts.register(mnt, [*fanfs, "umount", str(mnt)])
                bl.run_cmd([*fanfs, "mount", *MOUNT_ARGS, str(pack), str(mnt)], timeout_s=120)
                bl.drop_caches()
                if cached:
                    cache_pack(pack)
                times[name].append(timed_epoch(mnt, relpaths, expected, args.readers, repeat))
                if repeat == 0 and digests(mnt, relpaths) != reference:
                    raise bl.BenchError("bytes read through %s differ from the raw files" % mnt)
                stats[name] = bl.fanfs_counters(mnt)
                mounts.close()
            bl.log("repeat %d: %s", repeat + 1, {k: round(v[-1], 3) for k, v in times.items()})
        rows = []
        for name in SYSTEMS:
            ratio = statistics.median(
                cold / mine for cold, mine in zip(times["native cold"], times[name], strict=True)
            )
            s = stats.get(name, {})
            rows.append(
                [
                    name,
                    f"{len(relpaths) / statistics.median(times[name]):,.0f}",
                    "%.2f" % ratio,
                    str(s.get("inline_decodes", "-")),
                    str(s.get("inline_reads", "-")),
                    str(s.get("thread_decodes", "-")),
                ]
            )
        print(
            bl.markdown_table(
                [
                    "system",
                    "files/s",
                    "x native cold",
                    "inline decodes",
                    "of them read inline",
                    "thread decodes",
                ],
                rows,
                right_from=1,
            )
        )
        payload = {"host": bl.host_info(), "git": bl.git_revision(), "times": times}
        bl.write_result("bench_pagecache", json.loads(json.dumps(payload, default=str)))
    finally:
        mounts.close()
        if created:
            bl.cleanup_workdir(workdir, created, keep=False, names=[])
    return 0


if __name__ == "__main__":
    sys.exit(main())
