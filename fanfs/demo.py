"""`fanfs demo`: the quick start's main job on the built-in sample dataset.

Generates the sample, packs it, mounts the pack, reads every file in a shuffled order with a
few worker processes the way a DataLoader does (buffered `open().read()`), checks the bytes
against the raw files, prints files/s for the mount and for the raw files, and unmounts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from fanfs._sizes import format_size
from fanfs.format.layout import crc32
from fanfs.sample import generate


def _read_files(paths: list[str]) -> tuple[int, int]:
    """Worker: read each file whole; returns (bytes read, xor of crc32s)."""
    total, digest = 0, 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        total += len(data)
        digest ^= crc32(data)
    return total, digest


def _list_files(root: str) -> list[str]:
    out: list[str] = []
    for dirpath, _, names in os.walk(root):
        out.extend(os.path.relpath(os.path.join(dirpath, n), root) for n in names)
    return sorted(out)


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def _epoch(
    pool: multiprocessing.pool.Pool, root: str, files: list[str], workers: int, seed: int
) -> tuple[float, int, int]:
    order = np.random.default_rng(seed).permutation(len(files))
    paths = [os.path.join(root, files[i]) for i in order]
    shards = [paths[w::workers] for w in range(workers)]
    start = time.perf_counter()
    results = pool.map(_read_files, shards)
    elapsed = time.perf_counter() - start
    digest = 0
    for _, d in results:
        digest ^= d
    return elapsed, sum(r[0] for r in results), digest


def _fanfs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fanfs", *args], check=True)


def run_demo(args: argparse.Namespace) -> int:
    work = args.workdir or tempfile.mkdtemp(prefix="fanfs-demo-")
    os.makedirs(work, exist_ok=True)
    src, pack, mnt = (os.path.join(work, n) for n in ("sample", "sample.fan", "mnt"))
    try:
        return _run(args, src, pack, mnt)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, src: str, pack: str, mnt: str) -> int:
    print(
        "== fanfs demo: %d sample files, %d reader processes, %d epochs"
        % (args.files, args.workers, args.epochs)
    )
    if not os.path.isdir(src):
        start = time.perf_counter()
        size = generate(src, args.files)
        print("generated %s in %s (%.1fs)" % (format_size(size), src, time.perf_counter() - start))
    start = time.perf_counter()
    _fanfs("pack", src, pack, "-q", "--force")
    print("packed into %s in %.1fs" % (pack, time.perf_counter() - start))
    _fanfs("inspect", pack)
    os.makedirs(mnt, exist_ok=True)
    start = time.perf_counter()
    _fanfs("mount", pack, mnt)
    print("mounted at %s in %.2fs" % (mnt, time.perf_counter() - start))
    try:
        return _train(args, src, mnt)
    finally:
        _fanfs("umount", mnt)
        print("unmounted %s" % mnt)


def _train(args: argparse.Namespace, src: str, mnt: str) -> int:
    files = _list_files(src)
    if _list_files(mnt) != files:
        print(
            "fanfs demo: error: the mounted tree lists different files than the source",
            file=sys.stderr,
        )
        return 1
    ctx = multiprocessing.get_context("fork")
    print("\n%-6s %-10s %10s %10s %8s" % ("epoch", "source", "files/s", "MB/s", "vs raw"))
    ok = True
    with ctx.Pool(args.workers, initializer=_reader_signals) as pool:
        for epoch in range(1, args.epochs + 1):
            # One drop before the first epoch makes both sources cold; fanfs's own copy of
            # the pack stays in memory (mapped pages survive drop_caches), by design.
            cold = epoch == 1 and _drop_caches()
            raw_s, raw_bytes, raw_digest = _epoch(pool, src, files, args.workers, epoch)
            fan_s, fan_bytes, fan_digest = _epoch(pool, mnt, files, args.workers, epoch)
            label = "%d%s" % (epoch, " cold" if cold else "")
            print(
                "%-6s %-10s %10.0f %10.1f %8s"
                % (label, "raw files", len(files) / raw_s, raw_bytes / raw_s / 1e6, "1.00x")
            )
            print(
                "%-6s %-10s %10.0f %10.1f %7.2fx"
                % (label, "fanfs", len(files) / fan_s, fan_bytes / fan_s / 1e6, raw_s / fan_s)
            )
            ok = ok and (fan_bytes, fan_digest) == (raw_bytes, raw_digest)
    print(
        "\n%s: all %d files read through fanfs %s the raw files"
        % ("OK" if ok else "FAILED", len(files), "match" if ok else "DO NOT match")
    )
    _summary(mnt)
    return 0 if ok else 1


def _reader_signals() -> None:
    # The pool ends its readers with SIGTERM; they must just die, not unwind like fanfs's
    # own commands (cli.py turns SIGTERM into KeyboardInterrupt) and print tracebacks.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _summary(mnt: str) -> None:
    """What the daemon did (fanfs stats MNT shows every counter)."""
    from fanfs.stats import read_stats

    s = read_stats(mnt)
    print(
        "daemon: %d READs (the page cache served the rest), %.2fs waited inside READ; "
        "object cache %s: %d hits, %s held; read-ahead: %d chunks pushed into the page cache, "
        "background fill: %d cached, %d pushed"
        % (
            s["reads"],
            s["read_ns"] / 1e9,
            s.get("cache_policy", "off"),
            s["object_hits"],
            format_size(s.get("cache_bytes", 0)),
            s["prefetch_pushed"],
            s["fill_chunks"],
            s["fill_pushed"],
        )
    )
