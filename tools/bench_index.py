"""Mount time and daemon memory of a pack whose index has millions of entries (issue 11 item 4).

    .venv/bin/python tools/bench_index.py --files 10000000 --workdir /tmp/bench-index

Writes a pack without a source tree: `--files` files of one byte each (codec none) in
`--dirs` class directories, their index generated with numpy and written by `PackWriter`
(one partition of `--files` bytes: the index alone is what is measured). Then mounts it with
`fanfs mount --preload no` and reports the time `fanfs mount` takes to return (it returns
once the mount is ready, after validating the whole index), the daemon's RSS and PSS after
mount, and `stat` of one file through the mount. It never drops the page cache (the machine
is shared; the index was just written, so it is warm). Unmounts and removes the pack at the
end unless --keep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

from fanfs.format.layout import MANIFEST_NAME, bind_chunk_crc
from fanfs.format.writer import PackWriter

MTIME_NS = 1_700_000_000_000_000_000


def _names(files: int, dirs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(names blob, offsets, lengths): the root's empty name, `cNNNN` for each directory,
    `NNNNNNNNN.jpg` for each file (9 digits: sorted within a directory)."""
    digits = 9
    fnames = np.empty((files, digits + 4), dtype=np.uint8)
    value = np.arange(files, dtype=np.int64)
    for k in range(digits - 1, -1, -1):
        fnames[:, k] = ord("0") + value % 10
        value //= 10
    fnames[:, digits:] = np.frombuffer(b".jpg", dtype=np.uint8)
    dnames = b"".join(b"c%04d" % d for d in range(dirs))
    blob = np.concatenate([np.frombuffer(dnames, dtype=np.uint8), fnames.ravel()])
    lengths = np.concatenate([[0], np.full(dirs, 5), np.full(files, digits + 4)])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return blob, offsets, lengths


def build(pack: Path, files: int, dirs: int) -> float:
    """Write the pack; returns seconds taken."""
    start = time.perf_counter()
    per = -(-files // dirs)
    dir_of = np.arange(files) // per
    dirs = int(dir_of[-1]) + 1
    n = 1 + dirs + files
    pack.mkdir(parents=True)
    writer = PackWriter(str(pack), 1, 0)
    stored, crc = b"x", zlib.crc32(b"x")
    for _ in range(files):
        writer.add_chunk(stored, False)
    first_file = 1 + dirs
    counts = np.bincount(dir_of, minlength=dirs)
    blob, offsets, lengths = _names(files, dirs)
    mode = np.full(n, stat.S_IFREG | 0o644, dtype=np.uint32)
    mode[: 1 + dirs] = stat.S_IFDIR | 0o755
    columns = {
        "parent": np.concatenate([[0], np.zeros(dirs), 1 + dir_of]).astype(np.uint32),
        "name_off": offsets,
        "name_len": lengths,
        "mode": mode,
        "mtime_ns": np.full(n, MTIME_NS, dtype=np.int64),
        "size": np.concatenate([np.zeros(1 + dirs), np.ones(files)]),
        "first": np.concatenate([[1], first_file + np.cumsum(counts) - counts, np.arange(files)]),
        "count": np.concatenate([[dirs], counts, np.ones(files)]),
        "partition": np.zeros(files),
        "offset": np.arange(files),
        "csize": np.ones(files),
        "codec": np.zeros(files),
        "crc32": np.array([bind_chunk_crc(crc, cid) for cid in range(files)], dtype=np.uint32),
        "dict": np.zeros(files),
        "names": blob,
    }
    totals = {"files": files, "dirs": dirs + 1, "symlinks": 0, "bytes_in": files}
    writer.finish(
        columns,
        {
            "created_by": "tools/bench_index.py",
            "chunk_size": 1 << 20,
            "options": {"codec": "none", "partitions": 1, "broadcast": [], "chunk_size": 1 << 20},
            "totals": {**totals, "bytes_out": files, "skipped": 0},
            "codec_stats": {"none": {"chunks": files, "bytes_in": files, "bytes_out": files}},
            "plan": None,
        },
    )
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10_000_000)
    p.add_argument("--dirs", type=int, default=1000)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench-index"))
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    pack, mnt = args.workdir / "pack.fan", args.workdir / "mnt"
    if not (pack / MANIFEST_NAME).exists():
        shutil.rmtree(pack, ignore_errors=True)
        print("built %d entries in %.1f s" % (args.files, build(pack, args.files, args.dirs)))
    index_bytes = (pack / "index").stat().st_size
    mnt.mkdir(parents=True, exist_ok=True)
    fanfs = [sys.executable, "-m", "fanfs"]
    start = time.perf_counter()
    subprocess.run(
        [*fanfs, "mount", "--preload", "no", str(pack), str(mnt)],
        check=True,
        env=bl.fanfs_env(),
        cwd="/",
    )
    mount_s = time.perf_counter() - start
    try:
        memory = bl.process_memory(bl.fuse_daemon_pids(mnt)) or {}
        os.stat(mnt / "c0000" / "000000000.jpg")
        print(
            "index %.0f MB; mount (index in the page cache) %.2f s; daemon RSS %.0f MB, PSS %.0f MB (%d processes)"
            % (
                index_bytes / 1e6,
                mount_s,
                memory.get("rss_bytes", 0) / 1e6,
                memory.get("pss_bytes", 0) / 1e6,
                memory.get("process_count", 0),
            )
        )
    finally:
        subprocess.run([*fanfs, "umount", str(mnt)], check=False, env=bl.fanfs_env(), cwd="/")
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
