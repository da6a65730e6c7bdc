#!/usr/bin/env python3
"""Whole-file read throughput: raw files vs a fanfs mount vs the kernel's EROFS vs
squashfuse_ll, in one run.

What it measures. A tree of many ~100 kB files (generated: 70% JPEG-like random bytes, 15%
compressible float32 .npy, 15% JSON-lines text, over 100 class directories; or `--src DIR`)
is packed with `fanfs pack`, `mkfs.erofs -zlz4hc` (`--erofs-compress`; lzma only where that
mkfs.erofs has it, not Debian 12's 1.5) and `mksquashfs` (default gzip), the images are
mounted (EROFS by the kernel itself, from the image file with no loop device where the kernel
allows it, else through a loop device: `--erofs-mount`), and every file is read once per
epoch, in one fixed-seed random order split round-robin over
`--readers` processes that start together (elapsed = first reader start to last reader
finish). Reader styles: `buffered` is `open(p, 'rb').read()` as PIL, numpy and torch do (one
extra ioctl per file from isatty); `unbuffered` is `os.open` + `os.readv` into a reused 1 MiB
buffer until EOF (no ioctl, no fstat, no allocation). Epochs: `cold` comes right after
`sync; echo 3 > /proc/sys/vm/drop_caches` (page cache, dentries and inodes of all systems;
a FUSE daemon's own memory is kept, by design). `warm` epochs come after every system's
cold epoch and one untimed epoch of each, and are interleaved: `--warm-passes` rounds, each
one epoch of every system (in a rotating order), the median of a system's passes being its
warm time (one warm epoch lasts well under a second: alone, it times the machine's bursts
more than the system). Systems are interleaved in
rotation within each repeat, so noise on a shared machine hits all of them alike; an epoch
during which another process dropped the page cache (/proc/vmstat) is run again.

How to read the table. files/s and MB/s (1 MB = 10^6 bytes) come from the median time over
`--repeats`; `x native` is native's time over this system's in the same repeat, epoch and
reader style, median over repeats (above 1 = faster than the raw files); `spread` is (max -
min) / median of the times, so a ratio means little where it is within the spreads. `x
erofs`, on fanfs rows, is the same paired ratio against the kernel's EROFS, the limit for a
compressed read-only image (no daemon, no request round trips): erofs's time over fanfs's,
so 1.00 = as fast as EROFS and 0.50 = half its speed. `x passthrough`, on fanfs rows, is the
same against the `passthrough` system (not run by default): libfuse's passthrough_ll
example, compiled from Debian's libfuse3-dev, serving the raw files through FUSE from C,
with no codec and no checksum. It is a stock FUSE daemon, not a floor for this workload:
every open() sends it an OPEN and a RELEASE (fanfs's no-open mode sends neither), and it
holds an open file per inode the kernel knows (`--files` must stay under `ulimit -Hn`). The
second table gives image build time and size (page cache dropped first), mount time (caches
dropped first; until the mount shows in mountinfo) and the FUSE daemon's memory (VmRSS after
mount and at the end, VmHWM peak; summed over its processes). Every epoch checks that each
file read returned its expected size; an untimed pass per mounted system also compares the
sha256 of every file with the raw files. Any mismatch or read error fails.

Run as root: `.venv/bin/python tools/bench_read.py [--quick] [--systems native,fanfs,erofs]`.
The JSON result goes to results/bench_read-<host>-<YYYYmmddTHHMM>.json and the markdown
tables to stdout; progress goes to stderr. A default run takes 10-15 min on 2 cores.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

SYSTEMS = ("native", "fanfs", "fanfs-base", "erofs", "squashfuse", "passthrough")
DEFAULT_SYSTEMS = ("native", "fanfs", "erofs", "squashfuse")
STYLES = ("buffered", "unbuffered")
# The unbuffered reader's reused buffer: one read() returns a whole file below 1 MiB.
READ_BUFFER_BYTES = 1 << 20
# A reader that finds problems reports this many of them verbatim; the rest are counted.
MAX_REPORTED_ERRORS = 10
BARRIER_TIMEOUT_S = 60.0

Hasher = Any  # hashlib's _Hash is not public
ReadFn = Callable[[str, Hasher | None], int]


# ---------------------------------------------------------------- readers


def _make_reader(style: str) -> ReadFn:
    """Return a function that reads a whole file, feeds `hasher`, and returns its size."""
    if style == "buffered":

        def read_buffered(path: str, hasher: Hasher | None) -> int:
            with open(path, "rb") as f:
                data = f.read()
            if hasher is not None:
                hasher.update(data)
            return len(data)

        return read_buffered
    buf = bytearray(READ_BUFFER_BYTES)
    view = memoryview(buf)

    def read_unbuffered(path: str, hasher: Hasher | None) -> int:
        fd = os.open(path, os.O_RDONLY)
        try:
            total = 0
            while n := os.readv(fd, [buf]):
                if hasher is not None:
                    hasher.update(view[:n])
                total += n
            return total
        finally:
            os.close(fd)

    return read_unbuffered


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What one reader process did in one epoch (perf_counter_ns is system-wide here)."""

    start_ns: int
    end_ns: int
    file_count: int
    byte_count: int
    error_count: int
    errors: list[str]
    digests: dict[int, bytes]


def _reader_main(
    paths: Sequence[str],
    sizes: Sequence[int],
    indices: Sequence[int],
    style: str,
    hashing: bool,
    barrier: Any,
    conn: mpc.Connection,
) -> None:
    """Reader process body: wait at the barrier, read `indices` in order, send a report."""
    read = _make_reader(style)
    errors: list[str] = []
    digests: dict[int, bytes] = {}
    file_count = byte_count = error_count = 0
    barrier.wait(BARRIER_TIMEOUT_S)
    start_ns = time.perf_counter_ns()
    for i in indices:
        hasher = hashlib.sha256() if hashing else None
        try:
            n = read(paths[i], hasher)
        except OSError as exc:
            n, problem = -1, repr(exc)
        if n != sizes[i]:
            error_count += 1
            if len(errors) < MAX_REPORTED_ERRORS:
                what = problem if n < 0 else "read %d bytes, expected %d" % (n, sizes[i])
                errors.append("%s: %s" % (paths[i], what))
            continue
        file_count += 1
        byte_count += n
        if hasher is not None:
            digests[i] = hasher.digest()
    end_ns = time.perf_counter_ns()
    conn.send(WorkerReport(start_ns, end_ns, file_count, byte_count, error_count, errors, digests))
    conn.close()


@dataclass(frozen=True, slots=True)
class EpochRun:
    """One epoch over all files by all readers, already checked for completeness."""

    elapsed_s: float
    file_count: int
    byte_count: int
    digests: dict[int, bytes]


def run_epoch(
    paths: Sequence[str],
    sizes: Sequence[int],
    slices: Sequence[Sequence[int]],
    style: str,
    *,
    hashing: bool,
    timeout_s: float,
) -> EpochRun:
    """Fork one reader per slice, release them together, and time first start to last end.

    Raises BenchError if a reader died, timed out, or any file failed or came back short.
    """
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(slices) + 1)
    procs: list[mp.process.BaseProcess] = []
    conns: list[mpc.Connection] = []
    try:
        for indices in slices:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_reader_main,
                daemon=True,
                args=(paths, sizes, indices, style, hashing, barrier, send),
            )
            proc.start()
            send.close()
            procs.append(proc)
            conns.append(recv)
        barrier.wait(BARRIER_TIMEOUT_S)
        reports = _collect(conns, timeout_s)
    finally:
        _stop(procs)
    return _check_reports(reports, paths, sizes)


def _collect(conns: list[mpc.Connection], timeout_s: float) -> list[WorkerReport]:
    reports: list[WorkerReport] = []
    pending, deadline = list(conns), time.monotonic() + timeout_s
    while pending:
        ready = mpc.wait(pending, timeout=max(deadline - time.monotonic(), 0))
        if not ready:
            raise bl.BenchError("%d readers still running after %.0f s" % (len(pending), timeout_s))
        for conn in ready:
            assert isinstance(conn, mpc.Connection)
            try:
                reports.append(conn.recv())
            except EOFError:
                raise bl.BenchError("a reader process died (see its traceback above)") from None
            pending.remove(conn)
    return reports


def _stop(procs: list[mp.process.BaseProcess]) -> None:
    for proc in procs:
        proc.join(timeout=5 if proc.exitcode is None else 0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _check_reports(
    reports: list[WorkerReport], paths: Sequence[str], sizes: Sequence[int]
) -> EpochRun:
    error_count = sum(r.error_count for r in reports)
    if error_count:
        shown = [e for r in reports for e in r.errors]
        raise bl.BenchError(
            "%d files failed or came back short, e.g.:\n  %s" % (error_count, "\n  ".join(shown))
        )
    file_count = sum(r.file_count for r in reports)
    byte_count = sum(r.byte_count for r in reports)
    if file_count != len(paths) or byte_count != sum(sizes):
        raise bl.BenchError(
            "read %d files, %d bytes; expected %d files, %d bytes"
            % (file_count, byte_count, len(paths), sum(sizes))
        )
    elapsed_ns = max(r.end_ns for r in reports) - min(r.start_ns for r in reports)
    digests = {i: d for r in reports for i, d in r.digests.items()}
    return EpochRun(elapsed_ns / 1e9, file_count, byte_count, digests)


# ---------------------------------------------------------------- schedule


@dataclass(slots=True)
class Plan:
    """Everything the epochs need: files per system, reader slices, and options."""

    dataset: bl.Dataset
    paths: dict[str, list[str]]
    slices: list[list[int]]
    styles: list[str]
    epochs: list[str]
    repeats: int
    timeout_s: float
    warm_passes: int
    records: list[dict[str, Any]] = field(default_factory=list)

    def epoch(self, system: str, style: str, *, hashing: bool = False) -> EpochRun:
        return run_epoch(
            self.paths[system],
            self.dataset.sizes,
            self.slices,
            style,
            hashing=hashing,
            timeout_s=self.timeout_s,
        )


def make_plan(
    args: argparse.Namespace, dataset: bl.Dataset, setups: Sequence[bl.SystemSetup]
) -> Plan:
    perm = np.random.default_rng(args.seed).permutation(len(dataset.relpaths))
    slices = [perm[i :: args.readers].tolist() for i in range(args.readers)]
    paths = {s.name: [os.path.join(s.root, rel) for rel in dataset.relpaths] for s in setups}
    return Plan(
        dataset,
        paths,
        slices,
        args.styles,
        args.epochs,
        args.repeats,
        args.epoch_timeout,
        args.warm_passes,
    )


def verify_contents(plan: Plan, systems: Sequence[str]) -> None:
    """Untimed: sha256 every file through each mounted system; compare with the raw files.

    One reader style suffices: the timed epochs check every file's size in every style.
    """
    reference = run_epoch(
        [os.path.join(plan.dataset.root, r) for r in plan.dataset.relpaths],
        plan.dataset.sizes,
        plan.slices,
        plan.styles[0],
        hashing=True,
        timeout_s=plan.timeout_s,
    ).digests
    for system in systems:
        if system == "native":
            continue
        digests = plan.epoch(system, plan.styles[0], hashing=True).digests
        bad = [plan.dataset.relpaths[i] for i, d in reference.items() if digests[i] != d]
        if bad:
            raise bl.BenchError(
                "%s: %d files differ from the source, e.g. %s"
                % (system, len(bad), ", ".join(bad[:5]))
            )
        bl.log("sha256 of all %d files via %s match the source", len(digests), system)


def run_schedule(plan: Plan, systems: Sequence[str]) -> None:
    """Timed epochs: per repeat and style, every system in a rotated order.

    Cold epochs one system after another, each right after a drop of the page cache; then
    the warm epochs interleaved (`_warm_epochs`).
    """
    for rep in range(plan.repeats):
        shift = rep % len(systems)
        order = [*systems[shift:], *systems[:shift]]
        for style in plan.styles:
            if "cold" in plan.epochs:
                for system in order:
                    plan.records.append(_cold_epoch(plan, system, style, rep))
            if "warm" in plan.epochs:
                plan.records.extend(_warm_epochs(plan, order, style, rep))


def _warm_epochs(plan: Plan, order: Sequence[str], style: str, rep: int) -> list[dict[str, Any]]:
    """Every system warmed by an untimed epoch, then `--warm-passes` timed epochs of each,
    one system after another in a rotating order: a warm epoch of 20,000 files lasts well
    under a second, and a burst of load on a shared machine then hits every system alike.
    A system's warm time is the median of its passes (all again if someone else dropped the
    page cache meanwhile)."""

    def passes() -> dict[str, list[EpochRun]]:
        for system in order:
            plan.epoch(system, style)
        runs: dict[str, list[EpochRun]] = {system: [] for system in order}
        for k in range(plan.warm_passes):
            turn = k % len(order)
            for system in [*order[turn:], *order[:turn]]:
                runs[system].append(plan.epoch(system, style))
        return runs

    runs, attempt, disturbed = bl.run_undisturbed(passes, cold=False)
    return [
        _record(
            plan,
            rep,
            "warm",
            style,
            system,
            runs[system][0],
            statistics.median(run.elapsed_s for run in runs[system]),
            attempt,
            disturbed,
            pass_times_s=[run.elapsed_s for run in runs[system]],
        )
        for system in order
    ]


def _cold_epoch(plan: Plan, system: str, style: str, rep: int) -> dict[str, Any]:
    """Drop the caches, then time one epoch (again if someone else on the machine dropped
    the page cache meanwhile)."""
    run, attempt, disturbed = bl.run_undisturbed(lambda: plan.epoch(system, style), cold=True)
    return _record(plan, rep, "cold", style, system, run, run.elapsed_s, attempt, disturbed)


def _record(
    plan: Plan,
    rep: int,
    kind: str,
    style: str,
    system: str,
    run: EpochRun,
    elapsed_s: float,
    attempt: int,
    disturbed: bool,
    **extra: Any,
) -> dict[str, Any]:
    """Log one timed cell and return its record (`elapsed_s`: the time it counts for)."""
    bl.log(
        "repeat %d/%d %-4s %-10s %-10s %6d files %7.2f s %8.0f files/s %7.1f MB/s",
        *(rep + 1, plan.repeats, kind, style, system, run.file_count, elapsed_s),
        *(run.file_count / elapsed_s, run.byte_count / elapsed_s / 1e6),
    )
    return {
        "repeat": rep,
        "epoch": kind,
        "style": style,
        "system": system,
        "elapsed_s": elapsed_s,
        "file_count": run.file_count,
        "byte_count": run.byte_count,
        "attempts": attempt,
        "disturbed": disturbed,
        "loadavg_1min_after": os.getloadavg()[0],
        **extra,
    }


# ---------------------------------------------------------------- report


def summarize(plan: Plan, systems: Sequence[str]) -> list[dict[str, Any]]:
    """Per (epoch, style, system): median time, files/s, MB/s, spread, ratio to native and,
    for fanfs systems, to erofs.

    The ratios are paired: the other system's time over this one's within each repeat (the
    two ran minutes apart at most), then the median over repeats; load drifts cancel out.
    """
    rows = []
    for kind in plan.epochs:
        for style in plan.styles:
            times = {
                system: [
                    r["elapsed_s"]
                    for r in sorted(plan.records, key=lambda r: r["repeat"])
                    if (r["epoch"], r["style"], r["system"]) == (kind, style, system)
                ]
                for system in systems
            }
            for system in systems:
                rows.append(_summary_row(plan.dataset, kind, style, system, times))
    return rows


def _summary_row(
    dataset: bl.Dataset, kind: str, style: str, system: str, times: dict[str, list[float]]
) -> dict[str, Any]:
    mine = times[system]
    med = statistics.median(mine)
    native, erofs, passthrough = times.get("native"), times.get("erofs"), times.get("passthrough")
    fanfs = system.startswith("fanfs")
    return {
        "epoch": kind,
        "style": style,
        "system": system,
        "median_s": med,
        "elapsed_s": mine,
        "files_per_s": len(dataset.relpaths) / med,
        "mb_per_s": dataset.total_bytes / med / 1e6,
        "spread": (max(mine) - min(mine)) / med,
        "ratio_to_native": bl.paired_ratio(native, mine) if native else None,
        "ratio_to_erofs": bl.paired_ratio(erofs, mine) if erofs and fanfs else None,
        "ratio_to_passthrough": bl.paired_ratio(passthrough, mine)
        if passthrough and fanfs
        else None,
    }


def throughput_table(rows: Sequence[dict[str, Any]]) -> str:
    body = [
        [
            r["epoch"],
            r["style"],
            r["system"],
            "{:,.0f}".format(r["files_per_s"]),
            "%.0f" % r["mb_per_s"],
            "%.2f" % r["ratio_to_native"] if r["ratio_to_native"] else "-",
            "%.2f" % r["ratio_to_erofs"] if r["ratio_to_erofs"] else "-",
            "%.2f" % r["ratio_to_passthrough"] if r.get("ratio_to_passthrough") else "-",
            "%.0f%%" % (100 * r["spread"]),
        ]
        for r in rows
    ]
    headers = [
        "epoch",
        "reader",
        "system",
        "files/s",
        "MB/s",
        "x native",
        "x erofs",
        "x passthrough",
    ]
    headers.append("spread")
    return bl.markdown_table(headers, body, right_from=3)


def header_lines(payload: dict[str, Any]) -> str:
    """Where, when and what ran, and how much other load and cache drops interfered."""
    desc, opts = payload["dataset"], payload["options"]
    kinds = ", ".join("%d .%s" % (n, k) for k, n in sorted(desc["files_by_extension"].items()))
    lines = [
        bl.machine_line(payload),
        "dataset: %d files, %.2f GB (%s)" % (desc["file_count"], desc["total_bytes"] / 1e9, kinds)
        + "; %d readers, %d repeats, medians" % (opts["readers"], opts["repeats"]),
        "command: `%s`" % payload["command"],
    ]
    erofs = payload["systems"].get("erofs")
    if erofs:
        lines.append(bl.erofs_line(erofs))
    lines += bl.retry_lines(payload["epochs"])
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bl.new_parser(__doc__)
    p.add_argument("--files", type=int, help="files to generate (default 20000; 2000 --quick)")
    p.add_argument("--readers", type=int, default=4, help="reader processes (default 4)")
    p.add_argument("--repeats", type=int, help="timed epochs per cell (default 3; 1 --quick)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2000 files, 1 repeat")
    p.add_argument("--src", type=Path, help="read this tree instead of generating one")
    bl.add_workdir_args(p, reused_with="--files")
    bl.add_list_arg(p, "--systems", SYSTEMS, DEFAULT_SYSTEMS, show_default=True)
    p.add_argument(
        "--baseline-tree",
        type=Path,
        help="a fanfs source tree (an older revision, e.g. a git worktree) that packs and "
        "mounts the system fanfs-base, for before/after tables in one run",
    )
    bl.add_list_arg(p, "--styles", STYLES)
    bl.add_list_arg(p, "--epochs", bl.EPOCHS)
    p.add_argument("--seed", type=int, default=0, help="dataset and read-order seed")
    p.add_argument(
        "--warm-passes",
        type=int,
        default=5,
        help="timed warm epochs per system, repeat and reader style, interleaved across the "
        "systems (default 5; their median is the repeat's warm time)",
    )
    bl.add_fanfs_args(p, mount_help="extra `fanfs mount` args")
    bl.add_erofs_args(p)
    p.add_argument("--no-hash", action="store_true", help="skip the sha256 content check")
    bl.add_run_args(p)
    args = p.parse_args(argv)
    args.files = args.files or (2000 if args.quick else 20000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    bl.split_lists(p, args, {"systems": SYSTEMS, "styles": STYLES, "epochs": bl.EPOCHS})
    if ("fanfs-base" in args.systems) != (args.baseline_tree is not None):
        p.error("--systems fanfs-base and --baseline-tree DIR go together")
    if args.baseline_tree is not None and not (args.baseline_tree / "fanfs").is_dir():
        p.error("--baseline-tree %s has no fanfs package" % args.baseline_tree)
    if min(args.readers, args.repeats, args.files, args.warm_passes) < 1:
        p.error("--readers, --repeats, --files and --warm-passes must be positive")
    args.command_line = bl.command_line(argv, __file__)
    return args


def prepare_dataset(args: argparse.Namespace, workdir: Path) -> bl.Dataset:
    if args.src:
        src = args.src.resolve()
        if workdir == src or src in workdir.parents:
            raise bl.BenchError("--workdir %s must not be inside --src %s" % (workdir, src))
        dataset = bl.scan_dataset(src)
    else:
        root = workdir / "src"
        reused = bl.load_generated(root, args.files, args.seed)
        if reused is not None:
            bl.log("reusing the dataset generated earlier under %s", root)
            dataset = reused
        else:
            if root.exists():
                shutil.rmtree(root)
            bl.log("generating %d files under %s", args.files, root)
            dataset = bl.generate_dataset(root, args.files, args.seed)
    bl.log("dataset: %d files, %.2f GB", len(dataset.relpaths), dataset.total_bytes / 1e9)
    return dataset


def run_benchmark(args: argparse.Namespace, workdir: Path, mounts: bl.MountStack) -> dict[str, Any]:
    """Build, mount, verify, time; return the JSON payload, markdown report included."""
    started, load_before = time.time(), os.getloadavg()
    bl.check_systems(args)
    dataset = prepare_dataset(args, workdir)
    setups = bl.setup_systems(args, dataset, workdir, mounts, baseline_tree=args.baseline_tree)
    plan = make_plan(args, dataset, setups)
    if not args.no_hash:
        verify_contents(plan, args.systems)
    run_schedule(plan, args.systems)
    bl.record_memory(setups, mounts, "end")
    rows = summarize(plan, args.systems)
    payload = {
        **bl.result_head("bench_read", args.command_line, started, load_before),
        "versions": program_versions(args),
        "options": {k: v for k, v in vars(args).items() if k != "command_line"},
        "dataset": dataset.describe(),
        "systems": {s.name: s.summary() for s in setups},
        "summary": rows,
        "epochs": plan.records,
    }
    payload["report_markdown"] = "\n\n".join(
        [header_lines(payload), throughput_table(rows), bl.setup_table(setups, dataset.total_bytes)]
    )
    return payload


def program_versions(args: argparse.Namespace) -> dict[str, str | None]:
    fanfs = [*shlex.split(args.fanfs_cmd), "--version"]
    return bl.program_versions({"fanfs": fanfs, **bl.VERSION_COMMANDS})


# What a run puts in a --workdir it did not create (all removed at the end unless --keep),
# besides the tree it generates without --src.
WORKDIR_NAMES = bl.workdir_names(SYSTEMS)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = WORKDIR_NAMES + ([] if args.src else ["src", "src.manifest.json"])
    return bl.mounting_main(
        "bench_read",
        args,
        functools.partial(run_benchmark, args),
        root_for="drop_caches, FUSE mounts",
        names=names,
        src=args.src.resolve() if args.src else None,
    )


if __name__ == "__main__":
    sys.exit(main())
