#!/usr/bin/env python3
"""fanfs at ImageNet scale: packing, mounting and walking a tree of a million small files,
side by side with the raw tree, the kernel's EROFS and squashfuse_ll over images of the same
files.

    python tools/bench_scale.py                      # 1,331,167 files (ImageNet-1k shaped)
    python tools/bench_scale.py --files 100000       # the same shape, scaled down
    python tools/bench_scale.py --files 100000 --workdir /var/tmp/scale --keep

The tree has ImageNet's shape: train/ with 1,000 class directories holding 1,281,167 files
and val/ with 1,000 class directories holding 50,000 (scaled together by --files), each file
2-20 KiB of random bytes (as incompressible as JPEGs), generated once and kept with
--workdir/--keep for later runs. Every step is timed for every system in one run, so the
ratios are comparable on this noisy shared machine:

- build: `fanfs pack`, `mkfs.erofs` and `mksquashfs`: wall time, peak RSS (ru_maxrss of the build), size;
- mount: time until the mount is in mountinfo, and the daemon's RSS (and PSS for fanfs);
- `find MNT -type f`; an ImageFolder scan (scandir of the class directories, then os.walk of
  each, as torchvision's make_dataset does); os.walk with an lstat of every file; `ls -lR`;
- --reads random whole-file reads (default 100,000) by --readers processes, with a
  buffered `open().read()` (Python <= 3.13 sends one IOCTL per open) and unbuffered
  (`buffering=0`, as Python 3.14 opens regular files);
each cold (after dropping the page cache, dentries and inodes) and then warm (median of
--repeats). fanfs is also mounted with `--no-fast-paths` (system fanfs-nofast, the same pack)
unless --no-nofast: that is fanfs before pyfuse3 patch level 4's cached listings and C xattr
answers. Needs root (drop_caches, mounts), fuse3, squashfs-tools, squashfuse and erofs-utils
(mkfs.erofs -zlz4hc; the kernel mounts the image through a loop device).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

IMAGENET_TRAIN = 1_281_167
IMAGENET_VAL = 50_000
CLASSES = 1000
MIN_SIZE, MAX_SIZE = 2 * 1024, 20 * 1024
GENERATOR_VERSION = 1

# A reader process: reads the files named in its list (one per line), whole, and prints the
# bytes read. Buffered like open() on Python <= 3.13 (an isatty IOCTL per file), or
# unbuffered like Python 3.14's open() of a regular file.
READER = r"""
import sys
buffering = 0 if sys.argv[2] == "unbuffered" else -1
total = 0
with open(sys.argv[1], "rb") as names:
    for line in names:
        with open(line.rstrip(b"\n"), "rb", buffering=buffering) as f:
            total += len(f.read())
print(total)
"""

# Runs a build command and reports its peak RSS: ru_maxrss of the largest waited-for
# descendant (the build's own process tree), in KiB.
PEAK_RSS = r"""
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


# ---------------------------------------------------------------- the tree


def tree_shape(files: int) -> tuple[int, int]:
    """(train files, val files) for `files` in ImageNet's proportions."""
    val = round(files * IMAGENET_VAL / (IMAGENET_TRAIN + IMAGENET_VAL))
    return files - val, val


def file_path(root: Path, split: str, cls: int, i: int) -> str:
    return "%s/%s/n%08d/%s_%08d_%d.JPEG" % (root, split, cls, split, cls, i)


def class_counts(total: int) -> list[int]:
    base, extra = divmod(total, CLASSES)
    return [base + (c < extra) for c in range(CLASSES)]


def generate_tree(root: Path, files: int, seed: int) -> None:
    """Write the tree (skipped when a finished tree of this shape is there)."""
    stamp = root / ".bench_scale.json"
    want = {"files": files, "seed": seed, "version": GENERATOR_VERSION}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        bl.log("reusing the tree at %s", root)
        return
    if root.exists():
        bl.run_cmd(["rm", "-rf", str(root)], timeout_s=3600)
    rng = np.random.default_rng(seed)
    # One pool of random bytes; each file is a slice at a random offset (as incompressible
    # as fresh random bytes to any codec that sees one file at a time).
    pool = rng.bytes(64 << 20)
    t0, written = time.monotonic(), 0
    for split, count in zip(("train", "val"), tree_shape(files), strict=True):
        for cls, n in enumerate(class_counts(count)):
            os.makedirs("%s/%s/n%08d" % (root, split, cls))
            sizes = rng.integers(MIN_SIZE, MAX_SIZE + 1, size=n)
            offsets = rng.integers(0, len(pool) - MAX_SIZE, size=n)
            for i in range(n):
                fd = os.open(file_path(root, split, cls, i), os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.write(fd, pool[offsets[i] : offsets[i] + sizes[i]])
                finally:
                    os.close(fd)
            written += n
            if cls % 100 == 99:
                bl.log("generated %d of %d files (%.0f s)", written, files, time.monotonic() - t0)
    stamp.write_text(json.dumps(want))


def sample_paths(files: int, reads: int, seed: int) -> list[str]:
    """`reads` distinct relative paths of the tree, in random order (without listing it)."""
    counts = [
        (split, cls, n)
        for split, total in zip(("train", "val"), tree_shape(files), strict=True)
        for cls, n in enumerate(class_counts(total))
    ]
    rng = random.Random(seed)
    flat = rng.sample(range(files), min(reads, files))
    starts = np.cumsum([0] + [n for _, _, n in counts])
    out = []
    for k in flat:
        j = int(np.searchsorted(starts, k, side="right")) - 1
        split, cls, _ = counts[j]
        out.append(file_path(Path("."), split, cls, k - int(starts[j]))[2:])
    return out


# ---------------------------------------------------------------- systems


def build(name: str, cmd: Sequence[str], out: Path, log_path: Path) -> dict[str, Any]:
    """Run a build from a cold page cache: wall time, peak RSS, output size."""
    bl.drop_caches()
    rss_file = out.parent / (".%s.maxrss" % name)
    bl.log("%s build: %s", name, shlex.join(cmd))
    wrapped = [sys.executable, "-c", PEAK_RSS, str(rss_file), *cmd]
    seconds = bl.run_cmd(
        wrapped, timeout_s=bl.BUILD_TIMEOUT_S, log_path=log_path, env=bl.fanfs_env()
    )
    result = {
        "build_s": seconds,
        "build_peak_rss": int(rss_file.read_text()) * 1024,
        "size_bytes": bl.du_bytes(out),
    }
    bl.log(
        "%s build: %.1f s, peak RSS %.0f MB, %.1f MB",
        name,
        seconds,
        result["build_peak_rss"] / 1e6,
        result["size_bytes"] / 1e6,
    )
    return result


def mount(
    name: str,
    mnt: Path,
    cmd: Sequence[str],
    umount: Sequence[str],
    mounts: bl.MountStack,
    log_path: Path,
) -> dict[str, Any]:
    mnt.mkdir(parents=True, exist_ok=True)
    mounts.register(mnt, umount, log_path=log_path, env=bl.fanfs_env())
    bl.drop_caches()
    t0 = time.perf_counter()
    bl.run_cmd(cmd, timeout_s=bl.MOUNT_DEADLINE_S, log_path=log_path, env=bl.fanfs_env())
    bl.wait_mounted(mnt)
    seconds = time.perf_counter() - t0
    memory = bl.process_memory(mounts.daemon_pids(mnt)) or {}
    bl.log("%s mounted in %.2f s, RSS %.0f MB", name, seconds, memory.get("rss_bytes", 0) / 1e6)
    return {"mount_s": seconds, "mount_memory": memory}


def fanfs_stats(mnt: Path) -> dict[str, int]:
    """The mount's memory and request counters from `fanfs stats` (empty if it does not
    answer)."""
    out = subprocess.run(
        [sys.executable, "-m", "fanfs", "stats", "--json", str(mnt)],
        capture_output=True,
        text=True,
        env=bl.fanfs_env(),
        check=False,
    )
    if out.returncode != 0:
        return {}
    stats = json.loads(out.stdout)
    return {
        k: v
        for k, v in stats.items()
        if k.startswith("memory")
        or k
        in ("readdirs", "dir_opens", "fast_opendirs", "xattr_calls", "fast_getxattrs", "lookups")
    }


# ---------------------------------------------------------------- workloads


def run_find(root: Path) -> int:
    out = subprocess.run(["find", str(root), "-type", "f"], capture_output=True, check=True)
    return out.stdout.count(b"\n")


def run_imagefolder(root: Path) -> int:
    """torchvision.datasets.ImageFolder's make_dataset: the classes from a scandir of the
    split, then an os.walk of each class with an extension check per name."""
    files = 0
    for split in ("train", "val"):
        top = root / split
        classes = sorted(e.name for e in os.scandir(top) if e.is_dir())
        for cls in classes:
            for dirpath, _, names in sorted(os.walk(top / cls, followlinks=True)):
                for name in sorted(names):
                    if name.lower().endswith((".jpg", ".jpeg", ".png")):
                        os.path.join(dirpath, name)
                        files += 1
    return files


def run_walk_stat(root: Path) -> int:
    files = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.lstat(os.path.join(dirpath, name))
            files += 1
    return files


def run_ls(root: Path) -> int:
    out = subprocess.run(["ls", "-lR", str(root)], capture_output=True, check=True)
    return out.stdout.count(b"\n")


def run_reads(root: Path, lists: Sequence[Path], mode: str) -> int:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(lst), mode],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        for lst in lists
    ]
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise bl.BenchError("a reader failed under %s" % root)
        total += int(out)
    return total


def timed(fn: Callable[[Path], int], root: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn(root)
    return time.perf_counter() - t0, n


# ---------------------------------------------------------------- the run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--files",
        type=int,
        default=IMAGENET_TRAIN + IMAGENET_VAL,
        help="files in the tree (default %(default)s, ImageNet-1k)",
    )
    p.add_argument(
        "--reads", type=int, default=100_000, help="random whole-file reads (default 100000)"
    )
    p.add_argument("--readers", type=int, default=4, help="reader processes (default 4)")
    p.add_argument(
        "--repeats", type=int, default=3, help="warm repeats per cell, median (default 3)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/fanfs-bench-scale"))
    p.add_argument("--keep", action="store_true", help="keep the tree and images for the next run")
    p.add_argument(
        "--systems",
        default="native,erofs,squashfuse,fanfs,fanfs-nofast",
        help="comma-separated subset of native,erofs,squashfuse,fanfs,fanfs-nofast",
    )
    p.add_argument("--pack-args", default="", help="extra `fanfs pack` arguments")
    p.add_argument("--mount-args", default="", help="extra `fanfs mount` arguments")
    p.add_argument(
        "--workloads",
        default="find,imagefolder,walk,ls,reads",
        help="comma-separated subset of find,imagefolder,walk,ls,reads, or none (build and"
        " mount only)",
    )
    p.add_argument("--results-dir", type=Path, default=bl.RESULTS_DIR)
    args = p.parse_args(argv)
    if args.files < CLASSES * 2:
        p.error("--files must be at least %d" % (CLASSES * 2))
    args.workloads = [] if args.workloads == "none" else args.workloads.split(",")
    unknown = set(args.workloads) - {"find", "imagefolder", "walk", "ls", "reads"}
    if unknown:
        p.error("unknown workloads: %s" % ", ".join(sorted(unknown)))
    args.systems = args.systems.split(",")
    unknown = set(args.systems) - {"native", "erofs", "squashfuse", "fanfs", "fanfs-nofast"}
    if unknown:
        p.error("unknown systems: %s" % ", ".join(sorted(unknown)))
    return args


def setup_systems(
    args: argparse.Namespace, tree: Path, work: Path, mounts: bl.MountStack
) -> dict[str, dict[str, Any]]:
    systems: dict[str, dict[str, Any]] = {}
    if "native" in args.systems:
        systems["native"] = {"root": tree, "size_bytes": bl.du_bytes(tree)}
    if "squashfuse" in args.systems:
        img, mnt, log_path = (
            work / "image.squashfs",
            work / "mnt-squashfuse",
            work / "squashfuse.log",
        )
        img.unlink(missing_ok=True)
        info = build(
            "squashfuse", ["mksquashfs", str(tree), str(img), "-noappend", "-quiet"], img, log_path
        )
        info.update(
            mount(
                "squashfuse",
                mnt,
                ["squashfuse_ll", str(img), str(mnt)],
                ["fusermount3", "-u", str(mnt)],
                mounts,
                log_path,
            )
        )
        systems["squashfuse"] = {"root": mnt, **info}
    if "erofs" in args.systems:
        # The kernel's own compressed read-only filesystem (lz4hc, Debian's erofs-utils): the
        # physical limit for a compressed image, with no daemon round trip at all.
        img, mnt, log_path = work / "image.erofs", work / "mnt-erofs", work / "erofs.log"
        img.unlink(missing_ok=True)
        info = build(
            "erofs", ["mkfs.erofs", "--quiet", "-zlz4hc", str(img), str(tree)], img, log_path
        )
        info.update(
            mount(
                "erofs",
                mnt,
                ["mount", "-t", "erofs", "-o", "ro", str(img), str(mnt)],
                ["umount", str(mnt)],
                mounts,
                log_path,
            )
        )
        systems["erofs"] = {"root": mnt, **info}
    fanfs = [sys.executable, "-m", "fanfs"]
    if {"fanfs", "fanfs-nofast"} & set(args.systems):
        pack, log_path = work / "pack.fan", work / "fanfs.log"
        bl.run_cmd(["rm", "-rf", str(pack)], timeout_s=600)
        built = build(
            "fanfs",
            [*fanfs, "pack", str(tree), str(pack), "-q", *shlex.split(args.pack_args)],
            pack,
            log_path,
        )
        for name, extra in (("fanfs", ()), ("fanfs-nofast", ("--no-fast-paths",))):
            if name not in args.systems:
                continue
            mnt = work / ("mnt-" + name)
            info = dict(built)
            info.update(
                mount(
                    name,
                    mnt,
                    [*fanfs, "mount", *extra, *shlex.split(args.mount_args), str(pack), str(mnt)],
                    [*fanfs, "umount", str(mnt)],
                    mounts,
                    log_path,
                )
            )
            info["stats_after_mount"] = fanfs_stats(mnt)
            systems[name] = {"root": mnt, **info}
    return systems


def measure(
    args: argparse.Namespace, systems: dict[str, dict[str, Any]], lists: Sequence[Path]
) -> dict[str, Any]:
    workloads: list[tuple[str, str, Callable[[Path], int]]] = [
        ("find", "find -type f", run_find),
        ("imagefolder", "ImageFolder scan", run_imagefolder),
        ("walk", "os.walk + lstat", run_walk_stat),
        ("ls", "ls -lR", run_ls),
        ("reads", "random reads, buffered", lambda root: run_reads(root, lists, "buffered")),
        ("reads", "random reads, unbuffered", lambda root: run_reads(root, lists, "unbuffered")),
    ]
    results: dict[str, Any] = {}
    for key, wname, fn in workloads:
        if key not in args.workloads:
            continue
        for sname, system in systems.items():
            root = system["root"]
            bl.drop_caches()
            cold, count = timed(fn, root)
            warm = [timed(fn, root)[0] for _ in range(args.repeats)]
            results.setdefault(wname, {})[sname] = {"cold_s": cold, "warm_s": warm, "count": count}
            bl.log(
                "%-26s %-13s cold %7.2f s, warm %7.2f s (%d)",
                wname,
                sname,
                cold,
                statistics.median(warm),
                count,
            )
        counts = {s: r["count"] for s, r in results[wname].items()}
        if len(set(counts.values())) != 1:
            raise bl.BenchError("%s: the systems disagree: %s" % (wname, counts))
    return results


def table(systems: dict[str, dict[str, Any]], results: dict[str, Any]) -> str:
    names = list(systems)
    base = "native" if "native" in systems else names[0]
    rows = []
    for key, label, scale, unit in (
        ("build_s", "build time (pack, mkfs)", 1, "s"),
        ("build_peak_rss", "build peak RSS", 1e-6, "MB"),
        ("size_bytes", "size", 1e-9, "GB"),
        ("mount_s", "mount time", 1, "s"),
    ):
        rows.append(
            [
                label,
                *(
                    "%.2f %s" % (systems[n][key] * scale, unit) if key in systems[n] else "-"
                    for n in names
                ),
            ]
        )
    rows.append(
        [
            "daemon RSS after mount",
            *(
                "%.0f MB" % (systems[n]["mount_memory"].get("rss_bytes", 0) / 1e6)
                if "mount_memory" in systems[n]
                else "-"
                for n in names
            ),
        ]
    )
    for wname, per in results.items():
        for phase in ("cold", "warm"):
            cells = []
            ref = per[base]["cold_s"] if phase == "cold" else statistics.median(per[base]["warm_s"])
            for n in names:
                t = per[n]["cold_s"] if phase == "cold" else statistics.median(per[n]["warm_s"])
                cells.append("%.2f s (%.2fx)" % (t, t / ref) if ref > 0 else "%.2f s" % t)
            rows.append(["%s, %s" % (wname, phase), *cells])
    return bl.markdown_table(["", *names], rows, right_from=1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bl.install_signal_handlers()
    if os.geteuid() != 0:
        print("bench_scale: needs root (drop_caches, mounts)", file=sys.stderr)
        return 2
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    tree = work / "tree"
    try:
        t0 = time.monotonic()
        generate_tree(tree, args.files, args.seed)
        gen_s = time.monotonic() - t0
        paths = sample_paths(args.files, args.reads, args.seed)
        lists = []
        for r in range(args.readers):
            lst = work / ("reads-%d.txt" % r)
            lst.write_text("".join(p + "\n" for p in paths[r :: args.readers]))
            lists.append(lst)
        with bl.MountStack() as mounts:
            systems = setup_systems(args, tree, work, mounts)
            results = measure(args, systems, lists)
            for name in ("fanfs", "fanfs-nofast"):
                if name in systems:
                    systems[name]["stats_after_run"] = fanfs_stats(systems[name]["root"])
        text = table(systems, results)
        print(
            "\n%d files (%d train, %d val), %d random reads by %d readers; warm: median of %d\n"
            % (args.files, *tree_shape(args.files), len(paths), args.readers, args.repeats)
        )
        print(text)
        payload = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "generate_s": gen_s,
            "host": bl.host_info(),
            "git": bl.git_revision(),
            "systems": {n: {k: v for k, v in s.items() if k != "root"} for n, s in systems.items()},
            "results": results,
            "table": text,
        }
        print("\nresults: %s" % bl.write_result("bench_scale", payload, args.results_dir))
        return 0
    except bl.BenchError as exc:
        print("bench_scale: %s" % exc, file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            bl.run_cmd(["rm", "-rf", str(work)], timeout_s=3600)


if __name__ == "__main__":
    sys.exit(main())
