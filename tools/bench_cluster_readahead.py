"""Read-ahead across nodes: how fast one reader gets through a tree held by 3 ranks, and
how many MPI messages its remote reads cost, with fanfs's prefetcher off and on.

The tree and pack are bench_cluster.py's (3,000 files in 30 class directories, 70%
incompressible 40-200 kB "images", 30% compressible text, 24 partitions); `mpirun -np 3
fanfs mount` starts a fresh job per run, so each run starts with empty page caches. Rank 0
reads every file once, whole, with one reader, in one of two orders:

- *sorted*: a walk of the tree (the order of `os.walk` with sorted names), which the
  prefetcher recognises from the reads alone;
- *shuffled*: a seeded random order, which no read-ahead can guess; the "hints" variant
  sends the order first through `fanfs.hints.HintChannel` and reports its position every 32
  files, as `fanfs.torch.HintedSampler` does.

Two thirds of the files are on other ranks, so most reads are remote. All mounts run with
`--cache-memory 0` (no object cache: every remote chunk is fetched once) and the default
0.5 ms coalescing window. "requests/message" is the MPI thread's requests per message sent
by rank 0: 1 means no coalescing. Files/s are medians over `--repeats`; the machine has 2
cores shared by the 3 ranks and the reader.

    .venv/bin/python tools/bench_cluster_readahead.py      # about 1 minute
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_cluster import BenchError, Job, generate, log, pack

VARIANTS = (
    # (name, order, mount options, send hints)
    ("prefetch off", "sorted", ("--prefetch", "off"), False),
    ("prefetch on", "sorted", ("--prefetch", "on"), False),
    ("prefetch off", "shuffled", ("--prefetch", "off"), False),
    ("prefetch on", "shuffled", ("--prefetch", "on"), False),
    ("prefetch on + hints", "shuffled", ("--prefetch", "on"), True),
)
COUNTERS = ("reads", "remote_fetches", "messages_sent", "prefetch_issued", "remote_timeouts")


def read_all(mnt: Path, order: str, hints: bool, seed: int) -> tuple[float, int, int]:
    """Read every file under `mnt` once; returns (seconds, files, bytes)."""
    files = sorted(
        os.path.join(d, f) for d, dirs, fs in os.walk(mnt) if not dirs.sort() for f in sorted(fs)
    )
    if order == "shuffled":
        random.Random(seed).shuffle(files)
    channel = None
    start = time.perf_counter()
    if hints:
        from fanfs.hints import HintChannel

        channel = HintChannel(str(mnt))
        channel.send_order(files)
    nbytes = 0
    try:
        for position, path in enumerate(files):
            if channel is not None and position % 32 == 0:
                channel.progress(position)
            with open(path, "rb") as f:
                nbytes += len(f.read())
    finally:
        if channel is not None:
            channel.close()
    return time.perf_counter() - start, len(files), nbytes


def one_run(workdir: Path, pack_dir: Path, variant: tuple[Any, ...], seed: int) -> dict[str, Any]:
    name, order, options, hints = variant
    jobdir = Path(tempfile.mkdtemp(prefix="job-", dir=workdir))
    try:
        with Job(jobdir, pack_dir, 0.5, "64MiB", [*options, "--cache-memory", "0"]) as job:
            before = job.stats(0)
            seconds, files, nbytes = read_all(job.mnt[0], order, hints, seed)
            after = job.stats(0)
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
    if delta["remote_timeouts"]:
        raise BenchError("%d remote timeouts: the machine is too busy" % delta["remote_timeouts"])
    return {
        "variant": name,
        "order": order,
        "seconds": seconds,
        "files": files,
        "bytes": nbytes,
        **delta,
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| order | variant | files/s | x off (same order) | READs | remote requests | messages | requests/message |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    rates: dict[tuple[str, str], float] = {}
    for name, order, _, _ in VARIANTS:
        mine = [r for r in runs if (r["variant"], r["order"]) == (name, order)]
        rate = statistics.median(r["files"] / r["seconds"] for r in mine)
        rates[(name, order)] = rate
        med = {
            k: statistics.median(r[k] for r in mine)
            for k in ("reads", "remote_fetches", "messages_sent")
        }
        lines.append(
            "| %s | %s | %s | %.2f | %d | %d | %d | %.1f |"
            % (
                order,
                name,
                f"{rate:,.0f}",
                rate / rates[("prefetch off", order)],
                med["reads"],
                med["remote_fetches"],
                med["messages_sent"],
                med["remote_fetches"] / max(med["messages_sent"], 1),
            )
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000, help="files in the tree (default 3000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("mpirun") is None:
        print(
            "bench_cluster_readahead: error: mpirun not found (run tools/setup.sh)", file=sys.stderr
        )
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="fanfs-bench-readahead-"))
    try:
        log("generating %d files", args.files)
        generate(workdir / "src", args.files, args.seed)
        pack(workdir / "src", workdir / "pack")
        runs = []
        for repeat in range(args.repeats):
            for variant in VARIANTS:
                run = one_run(workdir, workdir / "pack", variant, args.seed + repeat)
                log(
                    "repeat %d %-20s %-8s %6.0f files/s, %d remote requests in %d messages",
                    repeat + 1,
                    run["variant"],
                    run["order"],
                    run["files"] / run["seconds"],
                    run["remote_fetches"],
                    run["messages_sent"],
                )
                runs.append(run)
        print("load average at end: %.1f %.1f %.1f" % os.getloadavg())
        print(table(runs))
    except BenchError as exc:
        print("bench_cluster_readahead: error: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
