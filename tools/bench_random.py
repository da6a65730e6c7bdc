#!/usr/bin/env python3
"""Random reads inside large files: raw files vs a fanfs mount vs the kernel's EROFS (vs
squashfuse_ll), cold and warm, in one run.

What it measures. One tree of large files is generated (float32 data, a smooth signal along
each row plus unit noise, quantised to 1/256: zstd:3 stores it at about 2.1x and lz4hc at
1.8x; random bytes would be stored raw by fanfs and hide the decode cost this measures):

- `h5-contig`, `h5-chunked`: two HDF5 files (`--h5-mb` each) holding one float32 dataset of
  4 KiB rows, one contiguous, one in 64 KiB chunks (no HDF5 filter: the filesystem
  compresses); a read is `ds[i:i+n]` with n = 1-16 rows (4-64 KiB), through h5py
  (`locking=False`, default chunk cache);
- `npy`: a .npy file (`--npy-mb`) of 2 KiB float32 rows opened with
  `np.load(mmap_mode='r')`; a read copies n = 2-32 rows (4-64 KiB) out of the mapping;
- `lmdb`: a py-lmdb database (`--lmdb-mb`) of float32 values of 4-64 KiB; a read is one
  `txn.get`, opened `readonly=True, lock=False, readahead=False, meminit=False` as random
  access loaders open it;
- `fio`: `fio --rw=randread --bs=4k --ioengine=psync --direct=0 --invalidate=0` over a file of
  `--fio-mb` (skipped, with a warning, if fio is not installed: apt-get install fio).

Each epoch makes the same `--ops` reads (`--fio-ops` for fio) at fixed-seed random places,
from one fresh process (a forked child for the libraries: fresh h5py caches, mappings and
LMDB environment; fio for fio), timing the reads only, not the open. fio's time is the sum
of the latencies it measured per read (its own runtime field is in whole milliseconds).
The tree is packed with `fanfs pack` plus `--pack-args` verbatim (e.g. "--block-size 0";
default none), `mkfs.erofs -zlz4hc` (`--erofs-compress`, `--erofs-args`) and, if chosen (not by default:
mksquashfs took 33 s for 80 MB of this data on 2 busy cores), `mksquashfs` (default gzip,
128 KiB blocks); each image is mounted as in bench_read.py.
fanfs is mounted with `--mount-args`, by default `--cache-memory 0 --prefetch-memory 16MiB
--preload no`: a dataset much larger than the daemon's memory, as on a real node. Every epoch
makes the same reads, and `drop_caches` empties the page cache but not the daemon: with its
defaults, the background filler decodes this small pack into the object cache at mount, each
serving process keeps up to 1/32 of the memory of decoded chunks in its read-ahead buffer, and
"cold" reads would come decoded from there. With these options no decoded chunk outlives an
epoch but the last 16 MiB per serving process, and cold fanfs reads the compressed pack
through the page cache as EROFS and squashfuse read their images (`--mount-args ""`
measures the defaults). `cold` epochs come right after `sync; echo 3 >
/proc/sys/vm/drop_caches`; `warm` ones right after an untimed epoch of the same reads.
Within each repeat, every workload runs on every system, the systems in an order that rotates
from repeat to repeat (noise on a shared machine hits all alike); an epoch during which
another process dropped the page cache is run again.

How to read the table. One row per workload, epoch and system. ops/s and MB/s (1 MB = 10^6
bytes the application got) come from the median time over `--repeats`. `x raw` is the raw
files' time over this system's, within each repeat, median over repeats (higher = faster;
1.00 = as fast as the raw files): on the erofs row it is erofs/raw, on the fanfs row
fanfs/raw. `x erofs`, on fanfs rows, is erofs's time over fanfs's (1.00 = as fast as EROFS,
0.25 = a quarter of its speed). `x passthrough`, on fanfs rows, is the
`passthrough` system's time over fanfs's: with `--systems ...,passthrough`, libfuse's
passthrough_ll example (compiled from Debian's libfuse3-dev) serves the raw files through
FUSE from C, with no codec and no checksum. Each file here is opened once per epoch and
read many times, so its own `x raw` is what the kernel's FUSE READ round trip leaves of the
raw files' speed on this machine: the floor under any FUSE filesystem for these reads.
On fanfs rows, from the daemon's counters (the root xattr user.fanfs.stats,
read before and after each timed epoch): `decoded / served` is the decode amplification,
bytes decoded over bytes served in READ replies (the chunk or block size over the READ size
when every READ decodes one of its own, e.g. 1 MiB / 4 KiB = 256 for fio without blocks; 1
when decoding matches what is read; below 1 where READs find chunks decoded earlier in the
daemon's buffer; `-` when the epoch sent no READ, e.g. warm from the page cache), and `served / read` is the bytes served over
the bytes the application read (the kernel's read-ahead and page rounding). The second table
gives build time, image size, mount time and the FUSE daemon's memory, as bench_read.py's.

Correctness: an untimed pass per system makes every read of every workload once and compares
the sha256 of each read's bytes with the same read from the raw files, and the sha256 of
fio's whole file; every timed epoch checks the byte count of its reads. Any mismatch or read
error fails the run. h5py and lmdb are installed into this Python with pip if missing (the
run says so).

Run as root: `.venv/bin/python tools/bench_random.py [--quick] [--pack-args "--block-size 0"]`.
The JSON result goes to results/bench_random-<host>-<YYYYmmddTHHMM>.json and the markdown
tables to stdout; progress goes to stderr. A default run (1.6 GB of data, 3 repeats) should
take 5-10 min on 2 cores (one repeat of three workloads with 2,000 reads took 1 min);
--quick takes 15 s.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import importlib.util
import json
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

SYSTEMS = ("native", "fanfs", "erofs", "squashfuse", "passthrough")
DEFAULT_SYSTEMS = ("native", "fanfs", "erofs")
WORKLOADS = ("h5-contig", "h5-chunked", "npy", "lmdb", "fio")
# Where each workload's data lives in the tree (lmdb: a directory holding data.mdb).
WORKLOAD_PATHS = {
    "h5-contig": "h5/contig.h5",
    "h5-chunked": "h5/chunked.h5",
    "npy": "npy/array.npy",
    "lmdb": "lmdb",
    "fio": "fio/data.bin",
}
# Python modules a workload needs, and the pip package that provides each.
WORKLOAD_MODULES = {"h5-contig": "h5py", "h5-chunked": "h5py", "lmdb": "lmdb"}
# fanfs mount options for a dataset larger than memory (see the module docstring).
DEFAULT_MOUNT_ARGS = "--cache-memory 0 --prefetch-memory 16MiB --preload no"
# The fanfs daemon counters whose change over each timed epoch is recorded (the stats xattr
# also holds gauges, such as memory, whose differences mean nothing).
FANFS_COUNTERS = (
    *("reads", "read_bytes", "chunk_reads", "inline_decodes", "thread_decodes", "buffer_hits"),
    *("bytes_decoded", "read_ns", "decode_ns", "object_hits", "prefetch_pushed", "fill_bytes"),
    "inline_reads",
)
# Bump when the generated data changes, so a kept --workdir is not reused stale.
DATA_VERSION = 1
FLOAT_BYTES = 4
# HDF5: rows of 4 KiB, the chunked copy in chunks of 16 rows (64 KiB); a read is 1-16 rows.
H5_ROW_FLOATS = 1024
H5_CHUNK_ROWS = 16
H5_READ_ROWS = (1, 16)
# .npy: rows of 2 KiB; a read is 2-32 rows (4-64 KiB).
NPY_ROW_FLOATS = 512
NPY_READ_ROWS = (2, 32)
# LMDB values of 4-64 KiB (whole float32s); a write transaction commits about this much.
LMDB_VALUE_BYTES = (4096, 65536)
LMDB_TXN_BYTES = 64 << 20
# fio's block size (4 KiB random reads).
FIO_BLOCK = 4096
# The generator writes this much at a time (bounded memory for any size).
GEN_BLOCK_BYTES = 16 << 20
# (MB per data file, reads per epoch, fio reads per epoch, repeats): default, --quick.
DEFAULT_SIZES = (320, 5000, 16384, 3)
QUICK_SIZES = (16, 300, 1024, 1)


# ---------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Data:
    """The generated tree: its root, the workloads' shapes, and every file (bl.Dataset)."""

    root: Path
    h5_rows: int
    npy_rows: int
    lmdb_count: int
    fio_bytes: int
    dataset: bl.Dataset


def _float_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A smooth random walk along each row plus unit noise, quantised to 1/256, as <f4:
    compressible about 2x by zstd:3, not trivially."""
    walk = np.cumsum(rng.standard_normal((rows, cols), dtype=np.float32) * 0.05, axis=1)
    values = walk + rng.standard_normal((rows, cols), dtype=np.float32)
    return (np.round(values * 256) / 256).astype("<f4")


def _blocks(rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) row ranges of at most GEN_BLOCK_BYTES each."""
    step = max(GEN_BLOCK_BYTES // row_bytes, 1)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _write_h5(path: Path, rows: int, *, chunked: bool, rng: np.random.Generator) -> None:
    import h5py

    chunks = (H5_CHUNK_ROWS, H5_ROW_FLOATS) if chunked else None
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("x", shape=(rows, H5_ROW_FLOATS), dtype="<f4", chunks=chunks)
        for start, stop in _blocks(rows, H5_ROW_FLOATS * FLOAT_BYTES):
            ds[start:stop] = _float_rows(rng, stop - start, H5_ROW_FLOATS)


def _write_npy(path: Path, rows: int, rng: np.random.Generator) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<f4", shape=(rows, NPY_ROW_FLOATS))
    for start, stop in _blocks(rows, NPY_ROW_FLOATS * FLOAT_BYTES):
        out[start:stop] = _float_rows(rng, stop - start, NPY_ROW_FLOATS)
    out.flush()
    del out


def _write_lmdb(path: Path, total_bytes: int, rng: np.random.Generator) -> int:
    """Write values of LMDB_VALUE_BYTES under keys b"%08d" until `total_bytes`; return the
    count. lock.mdb is removed: readers open with lock=False."""
    import lmdb

    low, high = (b // FLOAT_BYTES for b in LMDB_VALUE_BYTES)
    env = lmdb.open(str(path), map_size=2 * total_bytes + (256 << 20), sync=False)
    count = written = 0
    try:
        while written < total_bytes:
            with env.begin(write=True) as txn:
                txn_bytes = 0
                while written < total_bytes and txn_bytes < LMDB_TXN_BYTES:
                    value = _float_rows(rng, 1, int(rng.integers(low, high + 1))).tobytes()
                    txn.put(b"%08d" % count, value)
                    count += 1
                    written += len(value)
                    txn_bytes += len(value)
        env.sync(True)
    finally:
        env.close()
    (path / "lock.mdb").unlink(missing_ok=True)
    return count


def _write_raw(path: Path, total_bytes: int, rng: np.random.Generator) -> None:
    """fio's file: 4 KiB rows of floats, no header."""
    rows = total_bytes // (H5_ROW_FLOATS * FLOAT_BYTES)
    with open(path, "wb") as f:
        for start, stop in _blocks(rows, H5_ROW_FLOATS * FLOAT_BYTES):
            f.write(_float_rows(rng, stop - start, H5_ROW_FLOATS).tobytes())


def _data_params(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "version": DATA_VERSION,
        "seed": args.seed,
        "workloads": args.workloads,
        "mb": {"h5": args.h5_mb, "npy": args.npy_mb, "lmdb": args.lmdb_mb, "fio": args.fio_mb},
    }


def prepare_data(args: argparse.Namespace, workdir: Path) -> Data:
    """Generate the tree under workdir/src, or reuse the one a kept --workdir holds for the
    same parameters (a manifest next to it records them)."""
    root, manifest_path = workdir / "src", workdir / "src.manifest.json"
    params = _data_params(args)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = None
    if isinstance(manifest, dict) and manifest.get("params") == params and root.is_dir():
        bl.log("reusing the data generated earlier under %s", root)
        shapes = manifest["shapes"]
    else:
        if root.exists():
            shutil.rmtree(root)
        shapes = generate_data(root, args)
        manifest_path.write_text(json.dumps({"params": params, "shapes": shapes}))
    dataset = bl.scan_dataset(root)
    bl.log("data: %d files, %.2f GB", len(dataset.relpaths), dataset.total_bytes / 1e9)
    return Data(root, dataset=dataset, **shapes)


def generate_data(root: Path, args: argparse.Namespace) -> dict[str, int]:
    """Write each chosen workload's file(s); return the shapes the reads are drawn from."""
    rng = np.random.default_rng(args.seed)
    mb, h5_row, npy_row = 1_000_000, H5_ROW_FLOATS * FLOAT_BYTES, NPY_ROW_FLOATS * FLOAT_BYTES
    shapes = {
        "h5_rows": args.h5_mb * mb // h5_row,
        "npy_rows": args.npy_mb * mb // npy_row,
        "lmdb_count": 0,
        "fio_bytes": args.fio_mb * mb // h5_row * h5_row,  # whole 4 KiB blocks
    }
    for workload in args.workloads:
        path = root / WORKLOAD_PATHS[workload]
        (path if workload == "lmdb" else path.parent).mkdir(parents=True, exist_ok=True)
        bl.log("generating %s: %s", workload, path)
        if workload.startswith("h5-"):
            _write_h5(path, shapes["h5_rows"], chunked=workload == "h5-chunked", rng=rng)
        elif workload == "npy":
            _write_npy(path, shapes["npy_rows"], rng)
        elif workload == "lmdb":
            shapes["lmdb_count"] = _write_lmdb(path, args.lmdb_mb * mb, rng)
        else:
            _write_raw(path, shapes["fio_bytes"], rng)
    return shapes


def make_ops(workload: str, data: Data, count: int, seed: int) -> list[tuple[int, int]]:
    """The reads of one workload, the same in every epoch: (first row, rows) for h5 and npy,
    (key index, 0) for lmdb; none for fio (fio draws its own offsets from --randseed)."""
    rng = np.random.default_rng([seed, WORKLOADS.index(workload)])
    if workload == "fio":
        return []
    if workload == "lmdb":
        return [(int(k), 0) for k in rng.integers(0, data.lmdb_count, count)]
    (low, high), rows = (
        (NPY_READ_ROWS, data.npy_rows) if workload == "npy" else (H5_READ_ROWS, data.h5_rows)
    )
    lengths = rng.integers(low, min(high, rows) + 1, count)
    starts = rng.integers(0, rows - lengths + 1)
    return [(int(s), int(n)) for s, n in zip(starts, lengths, strict=True)]


# ---------------------------------------------------------------- readers


@dataclass(frozen=True, slots=True)
class EpochRun:
    """One epoch's reads: time (the reads only), count, bytes the application got, and with
    digests, the sha256 of each read's bytes (verification passes)."""

    elapsed_s: float
    op_count: int
    byte_count: int
    digests: list[bytes] | None = None


Ops = Sequence[tuple[int, int]]


def _read_h5(path: str, ops: Ops, digest: bool) -> EpochRun:
    import h5py

    digests: list[bytes] | None = [] if digest else None
    nbytes = 0
    with h5py.File(path, "r", locking=False) as f:
        ds = f["x"]
        t0 = time.perf_counter_ns()
        for row, n in ops:
            block = ds[row : row + n]
            nbytes += block.nbytes
            if digests is not None:
                digests.append(hashlib.sha256(block.data).digest())
        t1 = time.perf_counter_ns()
    return EpochRun((t1 - t0) / 1e9, len(ops), nbytes, digests)


def _read_npy(path: str, ops: Ops, digest: bool) -> EpochRun:
    digests: list[bytes] | None = [] if digest else None
    nbytes = 0
    array = np.load(path, mmap_mode="r")
    t0 = time.perf_counter_ns()
    for row, n in ops:
        block = np.array(array[row : row + n])  # a copy: every page of the slice is read
        nbytes += block.nbytes
        if digests is not None:
            digests.append(hashlib.sha256(block.data).digest())
    t1 = time.perf_counter_ns()
    del array
    return EpochRun((t1 - t0) / 1e9, len(ops), nbytes, digests)


def _read_lmdb(path: str, ops: Ops, digest: bool) -> EpochRun:
    import lmdb

    digests: list[bytes] | None = [] if digest else None
    nbytes = 0
    env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False)
    try:
        with env.begin(buffers=False) as txn:
            t0 = time.perf_counter_ns()
            for key, _ in ops:
                value = txn.get(b"%08d" % key)
                if value is None:
                    raise bl.BenchError("%s: key %08d missing" % (path, key))
                nbytes += len(value)
                if digests is not None:
                    digests.append(hashlib.sha256(value).digest())
            t1 = time.perf_counter_ns()
    finally:
        env.close()
    return EpochRun((t1 - t0) / 1e9, len(ops), nbytes, digests)


READERS: dict[str, Callable[[str, Ops, bool], EpochRun]] = {
    "h5-contig": _read_h5,
    "h5-chunked": _read_h5,
    "npy": _read_npy,
    "lmdb": _read_lmdb,
}


def _child_main(workload: str, path: str, ops: Ops, digest: bool, conn: mpc.Connection) -> None:
    """Reader process body: one epoch of `workload`; sends an EpochRun or an error text."""
    try:
        result: EpochRun | str = READERS[workload](path, ops, digest)
    except BaseException as exc:  # reported to the parent, which fails the run
        result = "%s: %r" % (type(exc).__name__, exc)
    conn.send(result)
    conn.close()


def run_library_epoch(
    workload: str, path: Path, ops: Ops, *, digest: bool, timeout_s: float
) -> EpochRun:
    """One epoch in a forked child: fresh library state, and a read stuck on a mount cannot
    stop this process from unmounting it. Raises BenchError on any failure in the child."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child_main, args=(workload, str(path), ops, digest, send), daemon=True
    )
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout_s):
            raise bl.BenchError("%s on %s still running after %.0f s" % (workload, path, timeout_s))
        try:
            result = recv.recv()
        except EOFError:
            raise bl.BenchError("the %s reader of %s died" % (workload, path)) from None
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        recv.close()
    if isinstance(result, str):
        raise bl.BenchError("%s on %s: %s" % (workload, path, result))
    return result


def run_fio_epoch(
    path: Path, file_bytes: int, ops: int, seed: int, workdir: Path, timeout_s: float
) -> EpochRun:
    """`ops` 4 KiB random buffered reads of `path` by fio (one psync job, offsets from
    `seed`); time = the sum of fio's per-read latencies."""
    if ":" in str(path):
        raise bl.BenchError("fio takes ':' in --filename as a separator: %s" % path)
    out = workdir / "fio-out.json"
    out.unlink(missing_ok=True)
    cmd = ["fio", "--name=randread", "--filename=%s" % path, "--readonly", "--rw=randread"]
    cmd += ["--bs=%d" % FIO_BLOCK, "--ioengine=psync", "--direct=0", "--invalidate=0"]
    cmd += ["--size=%d" % file_bytes, "--io_size=%d" % (ops * FIO_BLOCK)]
    cmd += ["--randseed=%d" % seed, "--output-format=json", "--output=%s" % out]
    bl.run_cmd(cmd, timeout_s=timeout_s, log_path=workdir / "fio.log")
    try:
        job = json.loads(out.read_text())["jobs"][0]
        read = job["read"]
        total_ios, io_bytes, mean_ns = read["total_ios"], read["io_bytes"], read["lat_ns"]["mean"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise bl.BenchError("cannot parse fio's report %s: %r" % (out, exc)) from exc
    if job.get("error") or io_bytes != ops * FIO_BLOCK:
        raise bl.BenchError(
            "fio on %s: error %s, read %d bytes, expected %d"
            % (path, job.get("error"), io_bytes, ops * FIO_BLOCK)
        )
    return EpochRun(total_ios * mean_ns / 1e9, total_ios, io_bytes)


def file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.digest()


# ---------------------------------------------------------------- schedule


@dataclass(slots=True)
class Plan:
    """Everything the epochs need: data, roots per system, reads per workload, options."""

    data: Data
    workdir: Path
    roots: dict[str, Path]
    ops: dict[str, list[tuple[int, int]]]
    args: argparse.Namespace
    expected_bytes: dict[str, int] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)

    def epoch(self, workload: str, root: Path, *, digest: bool = False) -> EpochRun:
        path = root / WORKLOAD_PATHS[workload]
        timeout_s = self.args.epoch_timeout
        if workload == "fio":
            ops, seed = self.args.fio_ops, self.args.seed + 1
            return run_fio_epoch(path, self.data.fio_bytes, ops, seed, self.workdir, timeout_s)
        return run_library_epoch(
            workload, path, self.ops[workload], digest=digest, timeout_s=timeout_s
        )


def verify_contents(plan: Plan, systems: Sequence[str]) -> None:
    """Untimed: every read of every workload once through each mounted system, its bytes'
    sha256 compared with the same read from the raw files; fio's file hashed whole. Also
    records each workload's byte count, which every timed epoch must then match."""
    mounted = [s for s in systems if s != "native"]
    for workload in plan.args.workloads:
        if workload == "fio":
            _verify_fio_file(plan, mounted)
        else:
            _verify_reads(plan, workload, mounted)
        if mounted:
            bl.log("%s: every read via %s matches the raw files", workload, ", ".join(mounted))


def _verify_fio_file(plan: Plan, mounted: Sequence[str]) -> None:
    plan.expected_bytes["fio"] = plan.args.fio_ops * FIO_BLOCK
    reference = file_digest(plan.data.root / WORKLOAD_PATHS["fio"])
    for system in mounted:
        if file_digest(plan.roots[system] / WORKLOAD_PATHS["fio"]) != reference:
            raise bl.BenchError("%s: fio's file differs from the raw file" % system)


def _verify_reads(plan: Plan, workload: str, mounted: Sequence[str]) -> None:
    ref = plan.epoch(workload, plan.data.root, digest=True)
    plan.expected_bytes[workload] = ref.byte_count
    for system in mounted:
        run = plan.epoch(workload, plan.roots[system], digest=True)
        assert run.digests is not None and ref.digests is not None
        pairs = zip(run.digests, ref.digests, strict=True)
        bad = [i for i, (got, want) in enumerate(pairs) if got != want]
        if bad:
            raise bl.BenchError(
                "%s, %s: %d of %d reads differ from the raw files, the first at %s"
                % (system, workload, len(bad), len(ref.digests), plan.ops[workload][bad[0]])
            )


def run_schedule(plan: Plan, systems: Sequence[str]) -> None:
    """Timed epochs: per repeat and workload, every system in a rotated order, all epoch
    kinds (a system's warm epoch follows its own cold one)."""
    for rep in range(plan.args.repeats):
        shift = rep % len(systems)
        order = [*systems[shift:], *systems[:shift]]
        for workload in plan.args.workloads:
            for system in order:
                for kind in plan.args.epochs:
                    plan.records.append(_timed_epoch(plan, workload, system, kind, rep))


def _timed_epoch(plan: Plan, workload: str, system: str, kind: str, rep: int) -> dict[str, Any]:
    root = plan.roots[system]
    counters: dict[str, float] = {}

    def run() -> EpochRun:
        before = bl.fanfs_counters(root) if system == "fanfs" else None
        result = plan.epoch(workload, root)
        if before is not None:
            after = bl.fanfs_counters(root)
            counters.clear()
            counters.update({k: after.get(k, 0) - before.get(k, 0) for k in FANFS_COUNTERS})
        return result

    warm_up = (lambda: plan.epoch(workload, root)) if kind == "warm" else None
    result, attempt, disturbed = bl.run_undisturbed(run, cold=kind == "cold", warm_up=warm_up)
    if result.byte_count != plan.expected_bytes[workload]:
        raise bl.BenchError(
            "%s, %s: read %d bytes, expected %d"
            % (system, workload, result.byte_count, plan.expected_bytes[workload])
        )
    decode_amp, served_amp = _amplification(counters, result.byte_count)
    bl.log(
        "repeat %d/%d %-10s %-4s %-10s %6d reads %7.3f s %9.0f ops/s %7.1f MB/s%s",
        *(rep + 1, plan.args.repeats, workload, kind, system, result.op_count),
        *(result.elapsed_s, result.op_count / result.elapsed_s),
        result.byte_count / result.elapsed_s / 1e6,
        "  decoded/served %.1f" % decode_amp if decode_amp is not None else "",
    )
    return {
        "repeat": rep,
        "workload": workload,
        "epoch": kind,
        "system": system,
        "elapsed_s": result.elapsed_s,
        "op_count": result.op_count,
        "byte_count": result.byte_count,
        "decode_amplification": decode_amp,
        "served_per_read": served_amp,
        "fanfs_counters": counters or None,
        "attempts": attempt,
        "disturbed": disturbed,
        "loadavg_1min_after": os.getloadavg()[0],
    }


def _amplification(counters: dict[str, float], app_bytes: int) -> tuple[float | None, ...]:
    """(bytes decoded / bytes served, bytes served / bytes the application read); None
    where the divisor is 0 or there are no counters (not fanfs)."""
    if not counters:
        return None, None
    served = counters.get("read_bytes", 0)
    decode = counters.get("bytes_decoded", 0) / served if served else None
    return decode, served / app_bytes if app_bytes else None


# ---------------------------------------------------------------- report


def summarize(plan: Plan, systems: Sequence[str]) -> list[dict[str, Any]]:
    """Per (workload, epoch, system): median time, ops/s, MB/s, spread, paired ratios to the
    raw files and (fanfs) to erofs, and fanfs's median amplifications."""
    rows = []
    for workload in plan.args.workloads:
        for kind in plan.args.epochs:
            cell = {
                system: sorted(
                    (
                        r
                        for r in plan.records
                        if (r["workload"], r["epoch"], r["system"]) == (workload, kind, system)
                    ),
                    key=lambda r: r["repeat"],
                )
                for system in systems
            }
            times = {s: [r["elapsed_s"] for r in recs] for s, recs in cell.items()}
            for system in systems:
                rows.append(_summary_row(workload, kind, system, times, cell[system]))
    return rows


def _summary_row(
    workload: str,
    kind: str,
    system: str,
    times: dict[str, list[float]],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    mine = times[system]
    med = statistics.median(mine)
    native, erofs, passthrough = times.get("native"), times.get("erofs"), times.get("passthrough")

    def median_of(key: str) -> float | None:
        values = [r[key] for r in records if r[key] is not None]
        return statistics.median(values) if values else None

    return {
        "workload": workload,
        "epoch": kind,
        "system": system,
        "median_s": med,
        "elapsed_s": mine,
        "ops_per_s": records[0]["op_count"] / med,
        "mb_per_s": records[0]["byte_count"] / med / 1e6,
        "spread": (max(mine) - min(mine)) / med,
        "ratio_to_native": bl.paired_ratio(native, mine) if native else None,
        "ratio_to_erofs": bl.paired_ratio(erofs, mine) if erofs and system == "fanfs" else None,
        "ratio_to_passthrough": bl.paired_ratio(passthrough, mine)
        if passthrough and system == "fanfs"
        else None,
        "decode_amplification": median_of("decode_amplification"),
        "served_per_read": median_of("served_per_read"),
    }


def throughput_table(rows: Sequence[dict[str, Any]]) -> str:
    def num(value: float | None, fmt: str) -> str:
        return fmt % value if value is not None else "-"

    body = [
        [
            r["workload"],
            r["epoch"],
            r["system"],
            "{:,.0f}".format(r["ops_per_s"]),
            "%.0f" % r["mb_per_s"],
            num(r["ratio_to_native"], "%.2f"),
            num(r["ratio_to_erofs"], "%.2f"),
            num(r.get("ratio_to_passthrough"), "%.2f"),
            "%.0f%%" % (100 * r["spread"]),
            num(r["decode_amplification"], "%.1f"),
            num(r["served_per_read"], "%.2f"),
        ]
        for r in rows
    ]
    headers = ["workload", "epoch", "system", "ops/s", "MB/s", "x raw", "x erofs", "x passthrough"]
    headers += ["spread", "decoded / served", "served / read"]
    return bl.markdown_table(headers, body, right_from=3)


def header_lines(payload: dict[str, Any]) -> str:
    """Where, when and what ran, the data, and how much cache drops interfered."""
    opts, shapes = payload["options"], payload["data"]
    parts = []
    for workload in opts["workloads"]:
        size = shapes["bytes"][workload] / 1e6
        if workload.startswith("h5-"):
            layout = "64 KiB chunks" if workload == "h5-chunked" else "contiguous"
            parts.append("%s %.0f MB (4 KiB rows, %s)" % (workload, size, layout))
        elif workload == "npy":
            parts.append("npy %.0f MB (2 KiB rows)" % size)
        elif workload == "lmdb":
            parts.append("lmdb %.0f MB (%d values of 4-64 KiB)" % (size, shapes["lmdb_count"]))
        else:
            parts.append("fio %.0f MB" % size)
    lines = [
        bl.machine_line(payload),
        "data: " + "; ".join(parts),
        "%d reads per epoch (fio: %d x 4 KiB), 1 reader process, %d repeats, medians"
        % (opts["ops"], opts["fio_ops"], opts["repeats"]),
        "fanfs: pack args `%s`, mount args `%s`" % (opts["pack_args"], opts["mount_args"]),
        "command: `%s`" % payload["command"],
    ]
    erofs = payload["systems"].get("erofs")
    if erofs:
        lines.append(bl.erofs_line(erofs))
    if payload["skipped"]:
        lines.append("skipped: " + "; ".join(payload["skipped"]))
    if payload["pip_installed"]:
        lines.append("installed with pip for this run: " + ", ".join(payload["pip_installed"]))
    lines += bl.retry_lines(payload["epochs"])
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bl.new_parser(__doc__)
    size, ops, fio_ops, repeats = DEFAULT_SIZES
    quick = QUICK_SIZES
    for name, what in (
        ("h5", "each HDF5 file"),
        ("npy", "the .npy file"),
        ("lmdb", "the LMDB values"),
        ("fio", "fio's file"),
    ):
        p.add_argument(
            "--%s-mb" % name,
            type=int,
            help="MB of %s (default %d; %d --quick)" % (what, size, quick[0]),
        )
    p.add_argument(
        "--ops", type=int, help="reads per epoch (default %d; %d --quick)" % (ops, quick[1])
    )
    p.add_argument(
        "--fio-ops",
        type=int,
        help="fio's 4 KiB reads per epoch (default %d; %d --quick)" % (fio_ops, quick[2]),
    )
    p.add_argument(
        "--repeats",
        type=int,
        help="timed epochs per cell (default %d; %d --quick)" % (repeats, quick[3]),
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke test: %d MB files, 1 repeat" % quick[0]
    )
    bl.add_workdir_args(p, reused_with="sizes, workloads")
    bl.add_list_arg(p, "--systems", SYSTEMS, DEFAULT_SYSTEMS, show_default=True)
    bl.add_list_arg(p, "--workloads", WORKLOADS, show_default=True)
    bl.add_list_arg(p, "--epochs", bl.EPOCHS)
    p.add_argument("--seed", type=int, default=0, help="data and read-offset seed")
    bl.add_fanfs_args(
        p,
        pack_help='extra `fanfs pack` args, split as a shell would and passed verbatim, e.g. "--block-size 0" (one word alone: --pack-args=WORD)',
        mount_default=DEFAULT_MOUNT_ARGS,
        mount_help='`fanfs mount` args (default "%s": a dataset larger than memory; "" for the '
        "mount's defaults)" % DEFAULT_MOUNT_ARGS,
    )
    bl.add_erofs_args(p)
    bl.add_run_args(p)
    args = p.parse_args(argv)
    return _resolve_args(p, args, argv)


def _resolve_args(
    p: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None
) -> argparse.Namespace:
    size, ops, fio_ops, repeats = QUICK_SIZES if args.quick else DEFAULT_SIZES
    for name in ("h5_mb", "npy_mb", "lmdb_mb", "fio_mb"):
        setattr(args, name, getattr(args, name) or size)
    args.ops, args.fio_ops = args.ops or ops, args.fio_ops or fio_ops
    args.repeats = args.repeats or repeats
    bl.split_lists(p, args, {"systems": SYSTEMS, "workloads": WORKLOADS, "epochs": bl.EPOCHS})
    if min(args.ops, args.fio_ops, args.repeats, args.h5_mb, args.npy_mb) < 1:
        p.error("sizes, --ops, --fio-ops and --repeats must be positive")
    if min(args.lmdb_mb, args.fio_mb) < 1:
        p.error("sizes must be positive")
    args.command_line = bl.command_line(argv, __file__)
    return args


def ensure_tools(args: argparse.Namespace, workdir: Path) -> tuple[list[str], list[str]]:
    """Install the chosen workloads' missing Python modules into this Python with pip; drop
    fio if it is not installed. Returns (packages installed, what was skipped and why)."""
    missing = sorted(
        {
            WORKLOAD_MODULES[w]
            for w in args.workloads
            if w in WORKLOAD_MODULES and importlib.util.find_spec(WORKLOAD_MODULES[w]) is None
        }
    )
    if missing:
        bl.log("installing %s into %s with pip (missing)", " ".join(missing), sys.prefix)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", *missing]
        bl.run_cmd(cmd, timeout_s=900, log_path=workdir / "pip.log")
        importlib.invalidate_caches()
        bl.log("installed %s with pip", " ".join(missing))
    skipped = []
    if "fio" in args.workloads and not shutil.which("fio"):
        bl.log("WARNING: fio is not installed (apt-get install fio); skipping the fio workload")
        args.workloads = [w for w in args.workloads if w != "fio"]
        skipped.append("fio (not installed; apt-get install fio)")
    if not args.workloads:
        raise bl.BenchError("no workload left to run")
    return missing, skipped


def run_benchmark(args: argparse.Namespace, workdir: Path, mounts: bl.MountStack) -> dict[str, Any]:
    """Install, generate, build, mount, verify, time; return the JSON payload, markdown
    report included."""
    started, load_before = time.time(), os.getloadavg()
    bl.check_systems(args)
    installed, skipped = ensure_tools(args, workdir)
    data = prepare_data(args, workdir)
    setups = bl.setup_systems(args, data.dataset, workdir, mounts)
    ops = {w: make_ops(w, data, args.ops, args.seed) for w in args.workloads}
    plan = Plan(data, workdir, {s.name: s.root for s in setups}, ops, args)
    verify_contents(plan, args.systems)
    run_schedule(plan, args.systems)
    bl.record_memory(setups, mounts, "end")
    rows = summarize(plan, args.systems)
    sizes = {w: bl.du_bytes(data.root / WORKLOAD_PATHS[w]) for w in args.workloads}
    payload = {
        **bl.result_head("bench_random", args.command_line, started, load_before),
        "versions": program_versions(args),
        "options": {k: v for k, v in vars(args).items() if k != "command_line"},
        "pip_installed": installed,
        "skipped": skipped,
        "data": {
            **data.dataset.describe(),
            "bytes": sizes,
            "h5_rows": data.h5_rows,
            "npy_rows": data.npy_rows,
            "lmdb_count": data.lmdb_count,
            "fio_bytes": data.fio_bytes,
        },
        "systems": {s.name: s.summary() for s in setups},
        "summary": rows,
        "epochs": plan.records,
    }
    payload["report_markdown"] = "\n\n".join(
        [
            header_lines(payload),
            throughput_table(rows),
            bl.setup_table(setups, data.dataset.total_bytes),
        ]
    )
    return payload


def program_versions(args: argparse.Namespace) -> dict[str, str | None]:
    versions = bl.program_versions(
        {
            "fanfs": [*shlex.split(args.fanfs_cmd), "--version"],
            "fio": ["fio", "--version"],
            **bl.VERSION_COMMANDS,
        }
    )
    for module in ("h5py", "lmdb"):
        with_version = importlib.import_module(module) if importlib.util.find_spec(module) else None
        versions[module] = getattr(with_version, "__version__", None)
    return versions


# What a run puts in a --workdir it did not create (all removed at the end unless --keep).
WORKDIR_NAMES = [
    *("src", "src.manifest.json"),
    *bl.workdir_names(SYSTEMS),
    *("fio.log", "fio-out.json", "pip.log"),
]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return bl.mounting_main(
        "bench_random",
        args,
        functools.partial(run_benchmark, args),
        root_for="drop_caches, mounts",
        names=WORKDIR_NAMES,
    )


if __name__ == "__main__":
    sys.exit(main())
