#!/usr/bin/env python3
"""How a fanfs mount scales with the number of files: a synthetic pack of 10 million files
(the index is real, the files tiny), mounted, timed and measured.

    python tools/bench_index.py                          # 10,000,000 files in 10,000 dirs
    python tools/bench_index.py --files 1331167 --dirs 2000

A tree of 10 M files does not fit this disk as real files, and the index alone decides what
a mount costs at start-up: this script writes the pack directly with fanfs's own
PackWriter, as `fanfs pack` would for that many files of --file-size bytes each (one raw
chunk per file, each with its own offset and format-4 checksum; ImageNet-like names,
sorted, in --dirs class directories), then mounts it with the default options and reports:
the index size, `fanfs mount` wall time until the mount answers, the daemon's RSS and PSS
(all serving processes) after mount and after reading a sample of files, and whether those
bytes are right. Needs root (mount, drop_caches).
"""

from __future__ import annotations

import argparse
import json
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _benchlib as bl

from fanfs.format.layout import bind_chunk_crc
from fanfs.format.writer import PackWriter

MTIME_NS = 1_700_000_000 * 10**9


def write_pack(
    out: Path, files: int, dirs: int, file_size: int, index_codec: str = "auto"
) -> dict[str, int]:
    """A pack of `files` files of `file_size` bytes (the same raw bytes each) spread over
    `dirs` directories under the root, in the index's breadth-first order."""
    per_dir = np.full(dirs, files // dirs, dtype=np.int64)
    per_dir[: files % dirs] += 1
    entries = 1 + dirs + files
    dir_names = [b"n%08d" % d for d in range(dirs)]
    file_names = [b"%08d.JPEG" % i for i in range(int(per_dir.max()))]
    # The names blob: root (empty), the directories, then each directory's files.
    name_len = np.empty(entries, dtype=np.uint16)
    name_len[0] = 0
    name_len[1 : 1 + dirs] = [len(n) for n in dir_names]
    file_name_len = np.array([len(n) for n in file_names], dtype=np.uint16)
    blob_parts = [b"".join(dir_names)]
    lens = [name_len[1 : 1 + dirs]]
    for d in range(dirs):
        n = int(per_dir[d])
        blob_parts.append(b"".join(file_names[:n]))
        lens.append(file_name_len[:n])
    names = np.frombuffer(b"".join(blob_parts), dtype=np.uint8)
    name_len[1:] = np.concatenate(lens)
    name_off = np.zeros(entries, dtype=np.uint64)
    name_off[1:] = np.cumsum(name_len[:-1].astype(np.uint64))[0:]
    parent = np.zeros(entries, dtype=np.uint32)
    parent[1 + dirs :] = np.repeat(np.arange(1, dirs + 1, dtype=np.uint32), per_dir)
    mode = np.full(entries, stat.S_IFREG | 0o644, dtype=np.uint32)
    mode[: 1 + dirs] = stat.S_IFDIR | 0o755
    size = np.full(entries, file_size, dtype=np.uint64)
    size[: 1 + dirs] = 0
    first = np.zeros(entries, dtype=np.uint64)
    count = np.ones(entries, dtype=np.uint32)
    first[0], count[0] = 1, dirs
    starts = 1 + dirs + np.concatenate(([0], np.cumsum(per_dir)[:-1]))
    first[1 : 1 + dirs] = starts
    count[1 : 1 + dirs] = per_dir
    first[1 + dirs :] = np.arange(files, dtype=np.uint64)  # file i has chunk i
    data = bytes(range(256)) * (file_size // 256 + 1)
    stored = data[:file_size]
    writer = PackWriter(str(out), 1, 0, index_codec)
    offset = np.empty(files, dtype=np.uint64)
    crc = np.empty(files, dtype=np.uint32)
    base_crc = zlib.crc32(stored)
    t0 = time.monotonic()
    for chunk in range(files):
        _, offset[chunk], _ = writer.add_chunk(stored, False)
        crc[chunk] = bind_chunk_crc(base_crc, chunk)
        if chunk % 1_000_000 == 999_999:
            bl.log("wrote %d of %d chunks (%.0f s)", chunk + 1, files, time.monotonic() - t0)
    columns = {
        "parent": parent,
        "name_off": name_off,
        "name_len": name_len,
        "mode": mode,
        "mtime_ns": np.full(entries, MTIME_NS, dtype=np.int64),
        "size": size,
        "first": first,
        "count": count,
        "partition": np.zeros(files, dtype=np.uint32),
        "offset": offset,
        "csize": np.full(files, file_size, dtype=np.uint32),
        "codec": np.zeros(files, dtype=np.uint8),
        "crc32": crc,
        "dict": np.zeros(files, dtype=np.uint16),
        "names": names,
    }
    manifest = {
        "created_by": "tools/bench_index.py",
        "chunk_size": 1 << 20,
        "block_size": 0,
        "options": {
            "codec": "none",
            "partitions": 1,
            "broadcast": [],
            "chunk_size": 1 << 20,
            "block_size": 0,
        },
        "totals": {
            "files": files,
            "dirs": dirs + 1,
            "symlinks": 0,
            "bytes_in": files * file_size,
            "bytes_out": files * file_size,
            "skipped": 0,
        },
        "codec_stats": {
            "none": {"chunks": files, "bytes_in": files * file_size, "bytes_out": files * file_size}
        },
        "plan": None,
    }
    done = writer.finish(columns, manifest)
    index = done["index"]
    return {
        "index_bytes": int(index["usize"]),
        "index_stored": int(index["size"]),
        "entries": entries,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--files", type=int, default=10_000_000)
    p.add_argument("--dirs", type=int, default=10_000)
    p.add_argument("--file-size", type=int, default=16, help="bytes per file (default 16)")
    p.add_argument("--sample", type=int, default=10_000, help="files read back and checked")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    p.add_argument("--mount-args", default="", help="extra `fanfs mount` arguments")
    p.add_argument(
        "--index-codec",
        choices=("auto", "zstd", "none"),
        default="auto",
        help="as for fanfs pack (default auto: these tiny files make the index most of the pack)",
    )
    p.add_argument(
        "--pack",
        type=Path,
        default=None,
        help="keep the pack here and reuse it if it exists (same --files, --dirs and "
        "--file-size; not checked); default: a new one in --workdir, removed at the end",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bl.install_signal_handlers()
    work = Path(tempfile.mkdtemp(prefix="fanfs-bench-index-", dir=args.workdir))
    pack, mnt, log_path = args.pack or work / "pack.fan", work / "mnt", work / "fanfs.log"
    fanfs = [sys.executable, "-m", "fanfs"]
    try:
        if args.pack is not None and (pack / "index").exists():
            made = {"index_bytes": (pack / "index").stat().st_size}
            bl.log("reusing %s: index %.0f MB", pack, made["index_bytes"] / 1e6)
        else:
            pack.mkdir()
            t0 = time.monotonic()
            made = write_pack(pack, args.files, args.dirs, args.file_size, args.index_codec)
            bl.log(
                "pack written in %.0f s: index %.0f MB",
                time.monotonic() - t0,
                made["index_bytes"] / 1e6,
            )
        with bl.MountStack() as mounts:
            mnt.mkdir()
            mounts.register(
                mnt, [*fanfs, "umount", str(mnt)], log_path=log_path, env=bl.fanfs_env()
            )
            bl.drop_caches()
            t0 = time.perf_counter()
            bl.run_cmd(
                [*fanfs, "mount", *args.mount_args.split(), str(pack), str(mnt)],
                timeout_s=600,
                log_path=log_path,
                env=bl.fanfs_env(),
            )
            mount_s = time.perf_counter() - t0
            after_mount = bl.process_memory(mounts.daemon_pids(mnt)) or {}
            bl.log(
                "mounted in %.2f s, RSS %.0f MB, PSS %.0f MB",
                mount_s,
                after_mount.get("rss_bytes", 0) / 1e6,
                after_mount.get("pss_bytes", 0) / 1e6,
            )
            rng = np.random.default_rng(0)
            per = args.files // args.dirs  # every directory has at least this many
            want = (bytes(range(256)) * (args.file_size // 256 + 1))[: args.file_size]
            t0 = time.perf_counter()
            for d, i in zip(
                rng.integers(0, args.dirs, size=args.sample),
                rng.integers(0, per, size=args.sample),
                strict=True,
            ):
                path = mnt / ("n%08d" % d) / ("%08d.JPEG" % i)
                if path.read_bytes() != want:
                    raise bl.BenchError("wrong bytes in %s" % path)
            read_s = time.perf_counter() - t0
            after_reads = bl.process_memory(mounts.daemon_pids(mnt)) or {}
        result = {
            "files": args.files,
            "dirs": args.dirs,
            "index_bytes": made["index_bytes"],
            "mount_s": mount_s,
            "after_mount": after_mount,
            "after_reads": after_reads,
            "sample_reads_s": read_s,
        }
        print(json.dumps(result, indent=1))
        print("results: %s" % bl.write_result("bench_index", result))
        return 0
    except bl.BenchError as exc:
        print("bench_index: %s" % exc, file=sys.stderr)
        return 1
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    sys.exit(main())
