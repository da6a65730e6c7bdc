"""Pack time and peak memory of `fanfs pack` on trees of many small files (issue 11).

    .venv/bin/python tools/bench_pack.py --files 100000 400000 --workdir /tmp/bench-pack

For each size: generates `train/cNNNN/NNNNNNN.jpg` (1-4 KiB, half random, half text; 100
classes; fanfs.sample.generate_small), packs it with each fanfs under test (this checkout,
and `--baseline-tree DIR`, an older fanfs source tree, as `fanfs-base`), then runs `fanfs plan`
on it with each, and prints wall time, peak RSS (the command's ru_maxrss) and RSS per file.
The trees and packs are removed at the end unless --keep (the disk is shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

from fanfs.sample import generate_small


def _run_once(tree: Path | None, args: list[str]) -> tuple[float, int]:
    """One `fanfs ARGS` in a child process: (wall seconds, peak RSS bytes)."""
    cmd = [sys.executable, "-m", "fanfs", *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=bl.fanfs_env(tree), cwd="/", stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("%s failed" % " ".join(cmd))
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, nargs="+", default=[100_000, 400_000])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench-pack"))
    p.add_argument("--baseline-tree", type=Path, help="an older fanfs source tree: fanfs-base")
    p.add_argument("--pack-args", default="--codec zstd:3", help="extra `fanfs pack` options")
    p.add_argument(
        "--plan-args",
        default="--codecs lz4,zstd:3 --time-budget 5",
        help="`fanfs plan` options (the plan is timed too; '' to skip it)",
    )
    p.add_argument("--keep", action="store_true", help="keep the generated trees and packs")
    args = p.parse_args()
    systems: list[tuple[str, Path | None]] = [("fanfs", None)]
    if args.baseline_tree:
        systems.insert(0, ("fanfs-base", args.baseline_tree))
    rows = []
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        for n in args.files:
            src = args.workdir / ("tree-%d" % n)
            if not src.exists():
                start = time.perf_counter()
                size = generate_small(str(src), n)
                print(
                    "generated %d files, %d MB in %.1f s"
                    % (n, size >> 20, time.perf_counter() - start)
                )
            out = args.workdir / "pack"
            commands = [("pack", ["pack", str(src), str(out), "-q", *args.pack_args.split()])]
            if args.plan_args:
                commands.append(("plan", ["plan", str(src), *args.plan_args.split()]))
            for command, argv in commands:
                for name, tree in systems:
                    shutil.rmtree(out, ignore_errors=True)
                    wall, rss = _run_once(tree, argv)
                    rows.append(
                        [
                            name,
                            command,
                            str(n),
                            "%.1f" % wall,
                            "%.0f" % (rss / 2**20),
                            "%.0f" % (rss / n),
                        ]
                    )
                    print(rows[-1], flush=True)
            if not args.keep:
                shutil.rmtree(src)
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    headers = ["system", "command", "files", "wall s", "peak RSS MB", "RSS B/file"]
    print(bl.markdown_table(headers, rows))


if __name__ == "__main__":
    main()
