#!/usr/bin/env python3
"""Training-like reads: a PyTorch DataLoader over raw files, fanfs mounts and LMDB, side by side.

What it measures. An ImageFolder-like tree (generated once and kept in `--workdir`: `--files`
files of about `--file-size` bytes over `--classes` class directories; half JPEG-like random
bytes that no codec shrinks, a quarter float arrays (.npy, ~2x with zstd) and a quarter
annotation text (~4x); deterministic from `--seed`) is packed with `fanfs pack` and copied
into one LMDB environment (key = sample index, value = the file's bytes). A training-like
client then runs epochs over it: a `torch.utils.data.DataLoader` with `--workers` worker
processes (persistent across the epochs of one setup), shuffled by a `RandomSampler`, batches
of `--batch-size`; each sample is read whole (`open().read()`, or one LMDB get in a read-only,
lock-free environment each worker opens for itself) and returned as (index, length, adler32)
plus its class label; the training loop checks every sample against the source tree (any
mismatch, missing or duplicated sample fails the run) and then sleeps `--compute-ms` per
batch, standing in for a GPU step.

Variants (rows of the first table): `raw`, the files on the local disk; `fanfs-off` and
`fanfs-on`, a fanfs mount with `--prefetch off` / `on`; `fanfs-hints`, prefetch on and the
sampler wrapped in `fanfs.torch.HintedSampler`, which sends each epoch's order to the daemon;
`lmdb`. A fanfs without the prefetch options gets the single variant `fanfs` (default mount
options) instead. Epochs: `cold` is the first epoch of a setup made right after
`echo 3 > /proc/sys/vm/drop_caches` (or, without root, POSIX_FADV_DONTNEED over the files,
the pack or the LMDB file), through a fresh mount for fanfs (whose daemon starts preloading the
pack into its own memory at mount, as it always does); `warm` is the next epoch of the same
loader and mount, in a new shuffled order. Within a repeat every variant sees the same two
orders (the sampler's generator is seeded per repeat) and the variants take turns in a
rotated order, so noise on the shared machine hits all of them alike.

Oversized-dataset section (skip with `--no-oversize`): fanfs with `--prefetch off` and a
decoded-object cache of `--oversize-fraction` (1/4) of the dataset's bytes, once with
`--cache-policy minio` and once with `lru`, for `--oversize-epochs` epochs from one fresh
mount. Its dataset calls posix_fadvise(DONTNEED) on each file right after reading it, so the
kernel page cache cannot hold the dataset: this emulates a dataset larger than the node's
memory, where only the daemon's object cache can serve a repeated sample without decoding.

How to read the tables. samples/s is the median over `--repeats` of samples / epoch wall time
(from `iter(loader)`, which starts the workers, to the end of the last compute step); `x raw`
is raw's epoch time over this variant's in the same repeat and epoch kind, median over repeats
(above 1 = faster than the raw files). `stall` is the data-stall fraction (as in DS-Analyzer):
the time the loop spent waiting for its next batch (inside `iter()` and `next()`) over the
epoch time; 0% means the loader kept up with the compute step, and the compute-bound ceiling
is printed above the table. `spread` is (max - min) / median of the epoch times. fanfs rows
also show the daemon's counters over the epoch (`fanfs stats --json` before and after,
medians; only those this fanfs has): READ requests; prefetches issued, pushed into the page
cache, used from the daemon's buffer and wasted; object-cache hits and inserts. In the
oversize table, hit rate = object-cache hits / samples read.

Run as root: `.venv/bin/python tools/bench_loader.py [--quick] [--json out.json]`; needs
`.venv/bin/pip install torch==2.13.0 lmdb`. Tables go to stdout, progress to stderr,
`--json PATH` saves every epoch's record. A default run takes about 1.5-3 min on 2 cores,
`--quick` under a minute; a second run with the same `--workdir` reuses the tree, the pack
and the LMDB environment (the first one generates them in about 15 s).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

# Variants of the main table, in display order; "fanfs" is the one a fanfs without the
# prefetch options can run (default mount options).
ALL_VARIANTS = ("raw", "fanfs", "fanfs-off", "fanfs-on", "fanfs-hints", "lmdb")
PREFETCH_VARIANTS = ("raw", "fanfs-off", "fanfs-on", "fanfs-hints", "lmdb")
BASIC_VARIANTS = ("raw", "fanfs", "lmdb")
# Extra `fanfs mount` options per fanfs variant.
VARIANT_MOUNT_ARGS: dict[str, tuple[str, ...]] = {
    "fanfs": (),
    "fanfs-off": ("--prefetch", "off"),
    "fanfs-on": ("--prefetch", "on"),
    "fanfs-hints": ("--prefetch", "on"),
}
POLICIES = ("minio", "lru")
EPOCH_KINDS = ("cold", "warm")
# (kind, share of files): JPEG-like random bytes, float arrays (~2x), annotation text (~4x).
KIND_SHARES = (("jpg", 0.50), ("npy", 0.25), ("txt", 0.25))
# Bump when generate_tree() changes, so a kept --workdir tree is not reused stale.
TREE_VERSION = 1
# A warm epoch during which another process dropped the page cache is run again, at most
# this many times in all (the machine is shared; other benchmarks drop caches too).
EPOCH_ATTEMPTS = 3
# fanfs counters shown in the tables, when the daemon has them: (key, column header).
SHOWN_COUNTERS = (
    ("reads", "READs"),
    ("prefetch_issued", "pf issued"),
    ("prefetch_pushed", "pf pushed"),
    ("prefetch_used", "pf used"),
    ("prefetch_wasted", "pf wasted"),
    ("object_hits", "obj hits"),
    ("object_inserts", "obj inserts"),
)
DEPS_HINT = ".venv/bin/pip install torch==2.13.0 lmdb"


# ---------------------------------------------------------------- the tree


def _jpeg_like(rng: np.random.Generator, size: int) -> bytes:
    head = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    return head + rng.bytes(max(size - len(head) - 2, 0)) + b"\xff\xd9"


def _array_like(rng: np.random.Generator, size: int) -> bytes:
    # A float16 random walk stored as float32 (half the mantissa bits zero): ~2x with zstd.
    count = max((size - 128) // 4, 1)
    walk = np.cumsum(rng.standard_normal(count)).astype(np.float16).astype("<f4")
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % count
    head = b"\x93NUMPY\x01\x00" + (128 - 10).to_bytes(2, "little")
    head += header.encode().ljust(128 - 10 - 1) + b"\n"
    return head + walk.tobytes()


def _text_like(rng: np.random.Generator, size: int) -> bytes:
    # Annotation lines (~4x with zstd), cut to `size`.
    count = size // 60 + 1
    ids = rng.integers(0, 1_000_000, count)
    boxes = rng.integers(0, 640, (count, 4))
    words = rng.integers(0, len(bl.CAPTION_WORDS), (count, 4))
    lines = [
        "%07d,%d,%d,%d,%d,%s" % (ids[i], *boxes[i], " ".join(bl.CAPTION_WORDS[w] for w in words[i]))
        for i in range(count)
    ]
    return "\n".join(lines).encode()[:size]


_MAKERS: dict[str, Callable[[np.random.Generator, int], bytes]] = {
    "jpg": _jpeg_like,
    "npy": _array_like,
    "txt": _text_like,
}


def tree_manifest(args: argparse.Namespace) -> dict[str, int]:
    return {
        "version": TREE_VERSION,
        "classes": args.classes,
        "files": args.files,
        "file_size": args.file_size,
        "seed": args.seed,
    }


def generate_tree(root: Path, manifest: dict[str, int]) -> None:
    """Write the ImageFolder-like tree: files of 0.5-1.5x `file_size`, round-robin over the
    class directories; deterministic for a given manifest."""
    rng = np.random.default_rng(manifest["seed"])
    files, mean = manifest["files"], manifest["file_size"]
    kinds = rng.choice(len(KIND_SHARES), size=files, p=[s for _, s in KIND_SHARES])
    sizes = rng.integers(mean // 2, mean * 3 // 2 + 1, size=files)
    for c in range(manifest["classes"]):
        (root / ("class_%03d" % c)).mkdir(parents=True, exist_ok=True)
    for i in range(files):
        kind = KIND_SHARES[kinds[i]][0]
        rel = "class_%03d/%s_%06d.%s" % (i % manifest["classes"], kind, i, kind)
        (root / rel).write_bytes(_MAKERS[kind](rng, int(sizes[i])))


def _cached(marker: Path, manifest: dict[str, Any]) -> bool:
    try:
        return bool(json.loads(marker.read_text()) == manifest)
    except (OSError, ValueError):
        return False


def prepare_tree(workdir: Path, manifest: dict[str, int]) -> Path:
    """The generated tree under `workdir/src`, generated now unless kept from an earlier run."""
    root, marker = workdir / "src", workdir / "src.manifest.json"
    if _cached(marker, manifest):
        bl.log("reusing the tree generated earlier under %s", root)
        return root
    marker.unlink(missing_ok=True)
    if root.exists():
        shutil.rmtree(root)
    bl.log("generating %d files under %s", manifest["files"], root)
    generate_tree(root, manifest)
    marker.write_text(json.dumps(manifest))
    return root


# ---------------------------------------------------------------- samples


def scan_image_folder(root: str) -> list[tuple[str, int]]:
    """(path, class index) for every regular file, as torchvision's ImageFolder lists them:
    class directories sorted by name, files sorted by name within each."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for index, name in enumerate(classes):
        entries = sorted(os.scandir(os.path.join(root, name)), key=lambda e: e.name)
        samples += [(e.path, index) for e in entries if e.is_file()]
    return samples


def _describe(index: int, data: bytes) -> np.ndarray:
    return np.array([index, len(data), zlib.adler32(data)], dtype=np.int64)


class FolderSamples:
    """A map-style dataset over an ImageFolder-like tree: item i is
    (int64[index, length, adler32], class index) of the i-th file, read whole.

    With `drop_after_read`, each file's pages are dropped from the page cache right after
    the read (posix_fadvise DONTNEED), so the page cache never holds the dataset.
    """

    def __init__(self, root: str, *, drop_after_read: bool = False) -> None:
        self.root = root
        self.samples = scan_image_folder(root)
        self.drop_after_read = drop_after_read

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        with open(path, "rb") as f:
            data = f.read()
            if self.drop_after_read:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return _describe(index, data), label


def lmdb_key(index: int) -> bytes:
    return b"%08d" % index


class LmdbSamples:
    """The same samples from one LMDB environment (key = index, value = the file's bytes).

    Each worker process opens the environment on its first item (read-only, lock-free); an
    environment must not cross a fork.
    """

    def __init__(self, path: str, labels: Sequence[int]) -> None:
        self.path = path
        self.labels = list(labels)
        self._env: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if self._pid != os.getpid():
            import lmdb

            self._env = lmdb.open(self.path, readonly=True, lock=False)
            self._pid = os.getpid()
        with self._env.begin() as txn:
            data = txn.get(lmdb_key(index))
        if data is None:
            raise KeyError("sample %d is not in %s" % (index, self.path))
        return _describe(index, data), self.labels[index]


@dataclass(frozen=True, slots=True)
class Reference:
    """What every sample must come back as: relative path, label, length and adler32."""

    relpaths: list[str]
    labels: np.ndarray
    lengths: np.ndarray
    checksums: np.ndarray

    @property
    def total_bytes(self) -> int:
        return int(self.lengths.sum())


def reference_of(root: Path) -> Reference:
    samples = scan_image_folder(str(root))
    lengths, checksums = [], []
    for path, _ in samples:
        data = Path(path).read_bytes()
        lengths.append(len(data))
        checksums.append(zlib.adler32(data))
    return Reference(
        [os.path.relpath(p, root) for p, _ in samples],
        np.array([label for _, label in samples], dtype=np.int64),
        np.array(lengths, dtype=np.int64),
        np.array(checksums, dtype=np.int64),
    )


def check_listing(ds: FolderSamples, ref: Reference) -> None:
    got = [os.path.relpath(p, ds.root) for p, _ in ds.samples]
    if got != ref.relpaths:
        raise bl.BenchError(
            "%s lists %d samples that differ from the source's %d"
            % (ds.root, len(got), len(ref.relpaths))
        )


# ---------------------------------------------------------------- pack and LMDB


def prepare_pack(
    src: Path, workdir: Path, manifest: dict[str, int], fanfs_cmd: list[str], pack_args: list[str]
) -> Path:
    """`fanfs pack` the tree into `workdir/pack.fanfs` unless an earlier run did."""
    pack, marker = workdir / "pack.fanfs", workdir / "pack.manifest.json"
    want = {**manifest, "pack_args": pack_args}
    if _cached(marker, want) and pack.exists():
        bl.log("reusing the pack built earlier at %s", pack)
        return pack
    marker.unlink(missing_ok=True)
    cmd = [*fanfs_cmd, "pack", str(src), str(pack), "-q", "--force", *pack_args]
    bl.log("packing: %s", shlex.join(cmd))
    elapsed = bl.run_cmd(
        cmd, timeout_s=bl.BUILD_TIMEOUT_S, log_path=workdir / "fanfs.log", env=bl.fanfs_env()
    )
    bl.log("packed in %.1f s: %.1f MB", elapsed, bl.du_bytes(pack) / 1e6)
    marker.write_text(json.dumps(want))
    return pack


def prepare_lmdb(src: Path, workdir: Path, manifest: dict[str, int], ref: Reference) -> Path:
    """Copy every sample into one LMDB environment `workdir/lmdb` unless an earlier run did."""
    import lmdb

    path, marker = workdir / "lmdb", workdir / "lmdb.manifest.json"
    if _cached(marker, manifest) and (path / "data.mdb").exists():
        bl.log("reusing the LMDB environment built earlier at %s", path)
        return path
    marker.unlink(missing_ok=True)
    if path.exists():
        shutil.rmtree(path)
    bl.log("writing %d samples into LMDB at %s", len(ref.relpaths), path)
    map_size = ref.total_bytes * 2 + (256 << 20)
    env = lmdb.open(str(path), map_size=map_size, subdir=True, readahead=False)
    try:
        with env.begin(write=True) as txn:
            for i, rel in enumerate(ref.relpaths):
                txn.put(lmdb_key(i), (src / rel).read_bytes())
        env.sync(True)
    finally:
        env.close()
    marker.write_text(json.dumps(manifest))
    bl.log("LMDB environment: %.1f MB", bl.du_bytes(path) / 1e6)
    return path


# ---------------------------------------------------------------- caches and mounts


def files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return [Path(d, n) for d, _, names in os.walk(path) for n in names]


def drop_page_cache(paths: Sequence[Path]) -> None:
    """Empty the page cache: all of it if we may (root), else these files' pages only."""
    if _drop_method() == "drop_caches":
        bl.drop_caches()
        return
    for path in paths:
        for f in files_under(path):
            with contextlib.suppress(OSError):
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _drop_method() -> str:
    return "drop_caches" if os.access("/proc/sys/vm/drop_caches", os.W_OK) else "fadvise"


@dataclass(frozen=True, slots=True)
class FanfsTool:
    """How to run the fanfs CLI, and which of the new mount options it has."""

    cmd: list[str]
    mount_args: list[str]
    has_prefetch: bool
    has_cache_policy: bool
    has_hints: bool
    storage_cpus: frozenset[int] | None = None

    def stats(self, mnt: Path) -> dict[str, Any]:
        out = subprocess.run(
            [*self.cmd, "stats", "--json", str(mnt)],
            capture_output=True,
            text=True,
            timeout=60,
            env=bl.fanfs_env(),
            check=False,
        )
        if out.returncode != 0:
            raise bl.BenchError("fanfs stats %s failed: %s" % (mnt, out.stderr.strip()))
        stats: dict[str, Any] = json.loads(out.stdout)
        return stats

    @contextlib.contextmanager
    def mounted(self, pack: Path, mnt: Path, options: Sequence[str]) -> Iterator[Path]:
        """Mount `pack` on `mnt` for the block; unmount after it, whatever happens."""
        if str(mnt) in bl.mountinfo():
            raise bl.BenchError("%s is already mounted (fanfs umount %s)" % (mnt, mnt))
        mnt.mkdir(parents=True, exist_ok=True)
        env, log_path = bl.fanfs_env(), mnt.parent / "fanfs.log"
        cmd = [*self.cmd, "mount", *self.mount_args, *options, str(pack), str(mnt)]
        with bl.MountStack() as mounts:
            mounts.register(mnt, [*self.cmd, "umount", str(mnt)], log_path=log_path, env=env)
            bl.log("mounting: %s", shlex.join(cmd[len(self.cmd) :]))
            bl.run_cmd(cmd, timeout_s=bl.MOUNT_DEADLINE_S, log_path=log_path, env=env)
            bl.wait_mounted(mnt)
            pids = mounts.daemon_pids(mnt)
            if self.storage_cpus:
                pin_processes(pids, self.storage_cpus)
            yield mnt


def _cpus(text: str | None) -> frozenset[int] | None:
    if not text:
        return None
    try:
        cpus = frozenset(int(c) for c in text.split(","))
    except ValueError:
        raise bl.BenchError("invalid CPU list %r (expected e.g. 0 or 0,1)" % text) from None
    if not cpus <= os.sched_getaffinity(0):
        raise bl.BenchError("CPU list %r is not a subset of this machine's CPUs" % text)
    return cpus


def pin_processes(pids: Sequence[int], cpus: frozenset[int]) -> None:
    """Run every thread of `pids` and of their children (the daemon's serving processes and
    its cache filler) on `cpus`; threads created later inherit it."""
    todo, seen = list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir("/proc/%d/task" % pid):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpus)
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                todo += [int(c) for c in f.read().split()]


def probe_fanfs(cmd: list[str], mount_args: list[str]) -> FanfsTool:
    """Find out which of the new mount options (prefetch, cache policy, hints) fanfs has."""
    out = subprocess.run(
        [*cmd, "mount", "--help"], capture_output=True, text=True, env=bl.fanfs_env(), check=False
    )
    if out.returncode != 0:
        raise bl.BenchError("%s mount --help failed: %s" % (shlex.join(cmd), out.stderr.strip()))
    text = out.stdout
    try:
        has_hints = importlib.util.find_spec("fanfs.torch") is not None
    except ImportError:
        has_hints = False
    return FanfsTool(
        cmd,
        mount_args,
        has_prefetch="--prefetch" in text,
        has_cache_policy="--cache-policy" in text and "--cache-memory" in text,
        has_hints=has_hints,
    )


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int | float]:
    """after - before for every numeric counter present in both (bools and strings skipped)."""
    delta: dict[str, int | float] = {}
    for key, value in after.items():
        old = before.get(key)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and isinstance(old, int | float) and not isinstance(old, bool):
            delta[key] = value - old
    return delta


# ---------------------------------------------------------------- epochs


@dataclass(frozen=True, slots=True)
class LoaderConfig:
    batch_size: int
    workers: int
    compute_s: float
    batch_timeout_s: float
    # --loader-cpus: the training process and its workers run on these CPUs only (None:
    # anywhere); the fanfs daemon then runs on the others (--storage-cpus model).
    loader_cpus: frozenset[int] | None = None
    storage_cpus: frozenset[int] | None = None


def make_loader(ds: Any, cfg: LoaderConfig, seed: int, hint_paths: list[str] | None) -> Any:
    """A shuffled DataLoader with persistent workers; the sampler is wrapped in fanfs's
    HintedSampler when `hint_paths` is given."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    generator = torch.Generator().manual_seed(seed)
    sampler: Any = RandomSampler(ds, generator=generator)
    if hint_paths is not None:
        from fanfs.torch import HintedSampler

        sampler = HintedSampler(sampler, hint_paths)
    return DataLoader(
        ds,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        persistent_workers=cfg.workers > 0,
        timeout=cfg.batch_timeout_s if cfg.workers > 0 else 0,
    )


@dataclass(frozen=True, slots=True)
class EpochRun:
    elapsed_s: float
    wait_s: float
    samples: int
    batches: int


def run_epoch(loader: Any, ref: Reference, compute_s: float) -> EpochRun:
    """One epoch of the training loop: wait for a batch, check it, 'compute'; time it all.

    Raises BenchError if any sample is wrong, missing or seen twice.
    """
    seen = np.zeros(len(ref.relpaths), dtype=np.int64)
    bad: list[str] = []
    wait = 0.0
    batches = 0
    t0 = time.perf_counter()
    it = iter(loader)
    wait += time.perf_counter() - t0
    while True:
        t = time.perf_counter()
        try:
            meta, labels = next(it)
        except StopIteration:
            wait += time.perf_counter() - t
            break
        except (OSError, RuntimeError, KeyError) as exc:  # re-raised from a worker
            raise bl.BenchError("the DataLoader failed: %s" % exc) from exc
        wait += time.perf_counter() - t
        meta, labels = meta.numpy(), labels.numpy()
        idx = meta[:, 0]
        ok = (
            (meta[:, 1] == ref.lengths[idx])
            & (meta[:, 2] == ref.checksums[idx])
            & (labels == ref.labels[idx])
        )
        if not ok.all() and len(bad) < 5:
            bad += [ref.relpaths[i] for i in idx[~ok]][: 5 - len(bad)]
        np.add.at(seen, idx, 1)
        batches += 1
        time.sleep(compute_s)
    elapsed = time.perf_counter() - t0
    if bad:
        raise bl.BenchError("samples came back wrong, e.g. %s" % ", ".join(bad))
    if not (seen == 1).all():
        raise bl.BenchError(
            "%d samples missing and %d seen more than once in an epoch"
            % ((seen == 0).sum(), (seen > 1).sum())
        )
    return EpochRun(elapsed, wait, int(seen.sum()), batches)


def _record(
    section: str, variant: str, epoch: str, rep: int, run: EpochRun, **extra: Any
) -> dict[str, Any]:
    return {
        "section": section,
        "variant": variant,
        "epoch": epoch,
        "repeat": rep,
        "elapsed_s": run.elapsed_s,
        "wait_s": run.wait_s,
        "stall": run.wait_s / run.elapsed_s,
        "samples": run.samples,
        "samples_per_s": run.samples / run.elapsed_s,
        "batches": run.batches,
        "loadavg_1min_after": os.getloadavg()[0],
        **extra,
    }


@dataclass(slots=True)
class Bench:
    """Everything the epochs need, and the records they leave."""

    workdir: Path
    src: Path
    pack: Path
    lmdb_path: Path
    ref: Reference
    fanfs: FanfsTool
    loader: LoaderConfig
    seed: int
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mnt(self) -> Path:
        return self.workdir / "mnt"

    def timed_epochs(
        self,
        loader: Any,
        section: str,
        variant: str,
        epochs: Sequence[str],
        rep: int,
        mnt: Path | None,
        *,
        retry_disturbed: bool,
    ) -> None:
        """Run `epochs` in order on one loader; record each with the fanfs counter deltas.

        With `retry_disturbed`, an epoch other than the first during which someone dropped
        the page cache is run again (the first is cold anyway).
        """
        for n, epoch in enumerate(epochs):
            for attempt in range(1, EPOCH_ATTEMPTS + 1):
                before = self.fanfs.stats(mnt) if mnt is not None else None
                drops = bl.drop_count()
                run = run_epoch(loader, self.ref, self.loader.compute_s)
                disturbed = bl.drop_count() != drops
                after = self.fanfs.stats(mnt) if mnt is not None else None
                counters = counter_delta(before, after) if before and after else {}
                if n == 0 or not (disturbed and retry_disturbed) or attempt == EPOCH_ATTEMPTS:
                    break
                bl.log("WARNING: another process dropped the page cache during this epoch; again")
            rec = _record(
                section,
                variant,
                epoch,
                rep,
                run,
                attempts=attempt,
                disturbed=disturbed,
                counters=counters,
                stats_after=after,
            )
            self.records.append(rec)
            bl.log(
                "repeat %d %-12s %-5s %6.2f s %7.0f samples/s  stall %3.0f%%%s",
                *(rep + 1, variant, epoch, run.elapsed_s, rec["samples_per_s"]),
                *(100 * rec["stall"], _counter_note(counters)),
            )


def _counter_note(counters: dict[str, int | float]) -> str:
    shown = ["%s %d" % (k, counters[k]) for k, _ in SHOWN_COUNTERS if k in counters]
    return ("  [" + ", ".join(shown) + "]") if shown else ""


def run_variant(bench: Bench, variant: str, rep: int) -> None:
    """Cold and warm epochs of one variant from a dropped page cache (and a fresh mount)."""
    seed = bench.seed * 1000 + rep
    if variant == "raw":
        drop_page_cache([bench.src])
        ds: Any = FolderSamples(str(bench.src))
        check_listing(ds, bench.ref)
        _loader_epochs(bench, ds, variant, rep, seed, None, None)
    elif variant == "lmdb":
        drop_page_cache([bench.lmdb_path])
        ds = LmdbSamples(str(bench.lmdb_path), bench.ref.labels.tolist())
        _loader_epochs(bench, ds, variant, rep, seed, None, None)
    else:
        drop_page_cache([bench.pack])
        with bench.fanfs.mounted(bench.pack, bench.mnt, VARIANT_MOUNT_ARGS[variant]) as mnt:
            ds = FolderSamples(str(mnt))
            check_listing(ds, bench.ref)
            hints = [p for p, _ in ds.samples] if variant == "fanfs-hints" else None
            _loader_epochs(bench, ds, variant, rep, seed, hints, mnt)


def _loader_epochs(
    bench: Bench,
    ds: Any,
    variant: str,
    rep: int,
    seed: int,
    hints: list[str] | None,
    mnt: Path | None,
) -> None:
    loader = make_loader(ds, bench.loader, seed, hints)
    everywhere = os.sched_getaffinity(0)
    try:
        if bench.loader.loader_cpus:  # the workers fork in the first epoch and inherit it
            os.sched_setaffinity(0, bench.loader.loader_cpus)
        bench.timed_epochs(loader, "main", variant, EPOCH_KINDS, rep, mnt, retry_disturbed=True)
    finally:
        # Stop the persistent workers before the caller unmounts.
        del loader
        gc.collect()
        os.sched_setaffinity(0, everywhere)


def run_oversize(bench: Bench, policy: str, rep: int, epochs: int, budget: int) -> None:
    """`epochs` epochs through one fresh mount with a small object cache and no page cache."""
    options = ["--prefetch", "off", "--cache-memory", str(budget), "--cache-policy", policy]
    drop_page_cache([bench.pack])
    with bench.fanfs.mounted(bench.pack, bench.mnt, options) as mnt:
        ds = FolderSamples(str(mnt), drop_after_read=True)
        check_listing(ds, bench.ref)
        loader = make_loader(ds, bench.loader, bench.seed * 1000 + rep, None)
        try:
            names = [str(n + 1) for n in range(epochs)]
            # The page cache holds nothing here, so someone else's drop changes nothing.
            bench.timed_epochs(loader, "oversize", policy, names, rep, mnt, retry_disturbed=False)
        finally:
            del loader
            gc.collect()


def run_schedule(
    bench: Bench, variants: Sequence[str], policies: Sequence[str], args: argparse.Namespace
) -> None:
    """Per repeat: every variant in a rotated order, then every cache policy likewise."""
    budget = int(bench.ref.total_bytes * args.oversize_fraction)
    for rep in range(args.repeats):
        for variant in _rotated(variants, rep):
            run_variant(bench, variant, rep)
        for policy in _rotated(policies, rep):
            run_oversize(bench, policy, rep, args.oversize_epochs, budget)


def _rotated(items: Sequence[str], shift: int) -> list[str]:
    if not items:
        return []
    k = shift % len(items)
    return [*items[k:], *items[:k]]


# ---------------------------------------------------------------- report


def _median_counters(recs: Sequence[dict[str, Any]]) -> dict[str, float]:
    keys = {k for r in recs for k in r["counters"]}
    return {
        k: statistics.median(r["counters"][k] for r in recs if k in r["counters"]) for k in keys
    }


def summarize_main(
    records: Sequence[dict[str, Any]], variants: Sequence[str]
) -> list[dict[str, Any]]:
    """Per (epoch kind, variant): medians over repeats, and the paired ratio to raw."""
    rows = []
    for kind in EPOCH_KINDS:
        by_variant = {
            v: sorted(
                (
                    r
                    for r in records
                    if (r["section"], r["variant"], r["epoch"]) == ("main", v, kind)
                ),
                key=lambda r: r["repeat"],
            )
            for v in variants
        }
        raw = {r["repeat"]: r["elapsed_s"] for r in by_variant.get("raw", [])}
        for v in variants:
            recs = by_variant[v]
            if not recs:
                continue
            paired = [raw[r["repeat"]] / r["elapsed_s"] for r in recs if r["repeat"] in raw]
            rows.append(
                {
                    "epoch": kind,
                    "variant": v,
                    "ratio_to_raw": statistics.median(paired) if paired else None,
                    **_cell_medians(recs),
                }
            )
    return rows


def _cell_medians(cell: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A table cell's medians over its repeats: samples/s, stall, counters; and the spread,
    (max - min) / median of the epoch times."""
    times = [r["elapsed_s"] for r in cell]
    return {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in cell),
        "stall": statistics.median(r["stall"] for r in cell),
        "spread": (max(times) - min(times)) / statistics.median(times),
        "counters": _median_counters(cell),
        "repeats": len(cell),
    }


def summarize_oversize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (policy, epoch number): medians of samples/s, stall and object-cache hit rate."""
    rows = []
    recs = [r for r in records if r["section"] == "oversize"]
    for policy in POLICIES:
        mine = [r for r in recs if r["variant"] == policy]
        for epoch in sorted({r["epoch"] for r in mine}, key=int):
            cell = [r for r in mine if r["epoch"] == epoch]
            hits = [
                r["counters"]["object_hits"] / r["samples"]
                for r in cell
                if "object_hits" in r["counters"]
            ]
            rows.append(
                {
                    "policy": policy,
                    "epoch": epoch,
                    "hit_rate": statistics.median(hits) if hits else None,
                    **_cell_medians(cell),
                }
            )
    return rows


def _shown_counters(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    present = {k for r in rows for k in r["counters"]}
    return [(k, h) for k, h in SHOWN_COUNTERS if k in present]


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main_table(rows: Sequence[dict[str, Any]]) -> str:
    shown = _shown_counters(rows)
    body = []
    for r in rows:
        ratio = r["ratio_to_raw"]
        row = [r["epoch"], r["variant"], "{:,.0f}".format(r["samples_per_s"])]
        row += ["%.2f" % ratio if ratio is not None else "-", "%.0f%%" % (100 * r["stall"])]
        row += ["%.0f%%" % (100 * r["spread"])]
        row += [_count(r["counters"].get(k)) for k, _ in shown]
        body.append(row)
    headers = ["epoch", "variant", "samples/s", "x raw", "stall", "spread"]
    return bl.markdown_table(headers + [h for _, h in shown], body, right_from=2)


def oversize_table(rows: Sequence[dict[str, Any]]) -> str:
    shown = [(k, h) for k, h in _shown_counters(rows) if k != "object_hits"]
    body = []
    for r in rows:
        hit = "-" if r["hit_rate"] is None else "%.0f%%" % (100 * r["hit_rate"])
        row = [r["policy"], r["epoch"], "{:,.0f}".format(r["samples_per_s"]), hit]
        row += ["%.0f%%" % (100 * r["stall"]), "%.0f%%" % (100 * r["spread"])]
        row += [_count(r["counters"].get(k)) for k, _ in shown]
        body.append(row)
    headers = ["cache policy", "epoch", "samples/s", "hit rate", "stall", "spread"]
    return bl.markdown_table(headers + [h for _, h in shown], body, right_from=2)


def header_lines(payload: dict[str, Any]) -> str:
    info, opts, ds = payload["host"], payload["options"], payload["dataset"]
    load = (payload["loadavg_before"][0], payload["loadavg_after"][0])
    ceiling = opts["batch_size"] / (opts["compute_ms"] / 1000) if opts["compute_ms"] else None
    lines = [
        "bench_loader on %s (%s CPUs, %.0f GB RAM, kernel %s), %s, %.1f min"
        % (
            info["host"],
            info["cpu_count"],
            info["mem_total_bytes"] / 1e9,
            info["kernel"],
            payload["started"],
            payload["duration_s"] / 60,
        )
        + "; load average %.1f before, %.1f after" % load,
        "dataset: %d samples in %d classes, %.0f MB (%.0f MB packed); DataLoader: %d workers, "
        "batch %d, %.0f ms compute per batch (ceiling %s samples/s), %d repeats, medians"
        % (
            ds["samples"],
            ds["classes"],
            ds["total_bytes"] / 1e6,
            ds["pack_bytes"] / 1e6,
            opts["workers"],
            opts["batch_size"],
            opts["compute_ms"],
            f"{ceiling:,.0f}" if ceiling else "none",
            opts["repeats"],
        ),
        "page cache dropped by: %s; command: `%s`" % (payload["drop_method"], payload["command"]),
    ]
    if payload["skipped"]:
        lines.append("not run: " + "; ".join(payload["skipped"]))
    redone = sum(r["attempts"] > 1 for r in payload["epochs"])
    if redone:
        lines.append(
            "%d epochs were run again after another process dropped the page cache" % redone
        )
    return "\n".join(lines)


def oversize_caption(payload: dict[str, Any]) -> str:
    opts = payload["options"]
    return (
        "Dataset larger than the cache: fanfs `--prefetch off --cache-memory %.0f MB` "
        "(%.0f%% of the dataset's bytes), %d epochs from one fresh mount; every file's pages "
        "are dropped from the page cache right after it is read (posix_fadvise DONTNEED), "
        "emulating a dataset larger than the node's memory. hit rate = object-cache hits / "
        "samples read."
        % (
            payload["oversize_budget_bytes"] / 1e6,
            100 * opts["oversize_fraction"],
            opts["oversize_epochs"],
        )
    )


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bl.new_parser(__doc__)
    p.add_argument("--files", type=int, help="samples to generate (default 4000; 1000 --quick)")
    p.add_argument("--classes", type=int, help="class directories (default 40; 20 --quick)")
    p.add_argument(
        "--file-size", type=int, default=100_000, help="mean file size in bytes (default 100000)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="default 32")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.add_argument(
        "--loader-cpus",
        default=None,
        metavar="LIST",
        help="run the training loop and its workers on these CPUs only, e.g. 1 (default: "
        "anywhere); models a node whose loaders leave other cores to the storage stack",
    )
    p.add_argument(
        "--storage-cpus",
        default=None,
        metavar="LIST",
        help="run the fanfs daemon on these CPUs only, e.g. 0 (default: anywhere)",
    )
    p.add_argument(
        "--compute-ms",
        type=float,
        default=8.0,
        help="simulated compute per batch, in ms (default 8: about the time 2 workers take "
        "to load a batch of 32 cold raw files on a 2-core VM, so raw is roughly balanced)",
    )
    p.add_argument("--repeats", type=int, help="repeats of everything (default 3; 1 --quick)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1000 files, 1 repeat")
    p.add_argument(
        "--variants",
        default="auto",
        help="comma list of %s; auto (default): %s if fanfs has --prefetch, else %s"
        % (", ".join(ALL_VARIANTS), ",".join(PREFETCH_VARIANTS), ",".join(BASIC_VARIANTS)),
    )
    p.add_argument(
        "--no-oversize",
        dest="oversize",
        action="store_false",
        help="skip the larger-than-cache section (MinIO vs LRU)",
    )
    p.add_argument(
        "--oversize-epochs", type=int, default=3, help="epochs per policy there (default 3)"
    )
    p.add_argument(
        "--oversize-fraction",
        type=float,
        default=0.25,
        help="object-cache budget there, as a share of the dataset's bytes (default 0.25)",
    )
    p.add_argument("--seed", type=int, default=0, help="dataset and shuffling seed")
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/fanfs-bench-loader"),
        help="tree, pack, LMDB and mount point, kept for the next run (default %(default)s)",
    )
    bl.add_fanfs_args(p, mount_help="extra args for every `fanfs mount`")
    p.add_argument(
        "--batch-timeout", type=float, default=120.0, help="seconds a batch may take (default 120)"
    )
    p.add_argument("--json", type=Path, help="write the raw results and tables here")
    args = p.parse_args(argv)
    args.files = args.files or (1000 if args.quick else 4000)
    args.classes = args.classes or (20 if args.quick else 40)
    args.repeats = args.repeats or (1 if args.quick else 3)
    positive = ("files", "classes", "file_size", "batch_size", "repeats", "oversize_epochs")
    if any(getattr(args, name) < 1 for name in positive) or args.workers < 0:
        p.error("--%s must be positive" % "/--".join(n.replace("_", "-") for n in positive))
    if args.compute_ms < 0 or not 0 < args.oversize_fraction <= 1:
        p.error("--compute-ms must be >= 0 and --oversize-fraction in (0, 1]")
    if args.variants != "auto":
        chosen = [v for v in args.variants.split(",") if v]
        if not chosen or set(chosen) - set(ALL_VARIANTS) or len(set(chosen)) != len(chosen):
            p.error(
                "--variants takes auto or a comma list of distinct %s" % ", ".join(ALL_VARIANTS)
            )
        args.variants = chosen
    args.command_line = bl.command_line(argv, __file__)
    return args


def choose_variants(
    args: argparse.Namespace, fanfs: FanfsTool
) -> tuple[list[str], list[str], list[str]]:
    """(variants, cache policies, what is skipped and why); BenchError if an explicitly
    requested variant cannot run with this fanfs."""
    skipped = []
    if args.variants == "auto":
        if fanfs.has_prefetch:
            variants = list(PREFETCH_VARIANTS)
            if not fanfs.has_hints:
                variants.remove("fanfs-hints")
                skipped.append("fanfs-hints (no fanfs.torch module yet)")
        else:
            variants = list(BASIC_VARIANTS)
            skipped.append(
                "fanfs-off, fanfs-on, fanfs-hints (this fanfs mount has no --prefetch option "
                "yet; the fanfs row uses the default mount options)"
            )
    else:
        variants = [v for v in ALL_VARIANTS if v in args.variants]
        needs = {"fanfs-off", "fanfs-on", "fanfs-hints"} & set(variants)
        if needs and not fanfs.has_prefetch:
            raise bl.BenchError("this fanfs mount has no --prefetch option (%s)" % ", ".join(needs))
        if "fanfs-hints" in variants and not fanfs.has_hints:
            raise bl.BenchError("fanfs-hints needs the fanfs.torch module, which is missing")
    policies: list[str] = []
    if args.oversize:
        if fanfs.has_cache_policy and fanfs.has_prefetch:
            policies = list(POLICIES)
        else:
            skipped.append(
                "oversize section (this fanfs mount has no --cache-policy/--cache-memory/"
                "--prefetch options yet)"
            )
    return variants, policies, skipped


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    bl.log("load average at start: %.2f %.2f %.2f", *load_before)
    fanfs = dataclasses.replace(
        probe_fanfs(shlex.split(args.fanfs_cmd), shlex.split(args.mount_args)),
        storage_cpus=_cpus(args.storage_cpus),
    )
    variants, policies, skipped = choose_variants(args, fanfs)
    for note in skipped:
        bl.log("WARNING: not run: %s", note)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    manifest = tree_manifest(args)
    src = prepare_tree(workdir, manifest)
    ref = reference_of(src)
    pack = prepare_pack(src, workdir, manifest, fanfs.cmd, shlex.split(args.pack_args))
    lmdb_path = prepare_lmdb(src, workdir, manifest, ref) if "lmdb" in variants else Path()
    cfg = LoaderConfig(
        args.batch_size,
        args.workers,
        args.compute_ms / 1000,
        args.batch_timeout,
        loader_cpus=_cpus(args.loader_cpus),
    )
    bench = Bench(workdir, src, pack, lmdb_path, ref, fanfs, cfg, args.seed)
    bl.log(
        "variants %s; oversize policies %s; %d repeats",
        ",".join(variants),
        ",".join(policies) or "none",
        args.repeats,
    )
    run_schedule(bench, variants, policies, args)
    main_rows = summarize_main(bench.records, variants)
    over_rows = summarize_oversize(bench.records)
    payload = {
        **bl.result_head("bench_loader", args.command_line, started, load_before),
        "versions": _versions(fanfs),
        "options": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k != "command_line"
        },
        "drop_method": _drop_method(),
        "dataset": {
            "samples": len(ref.relpaths),
            "classes": args.classes,
            "total_bytes": ref.total_bytes,
            "pack_bytes": bl.du_bytes(pack),
            "lmdb_bytes": bl.du_bytes(lmdb_path) if "lmdb" in variants else None,
        },
        "fanfs_features": {
            "prefetch": fanfs.has_prefetch,
            "cache_policy": fanfs.has_cache_policy,
            "hints": fanfs.has_hints,
        },
        "skipped": skipped,
        "oversize_budget_bytes": int(ref.total_bytes * args.oversize_fraction),
        "summary": main_rows,
        "oversize_summary": over_rows,
        "epochs": bench.records,
    }
    parts = [header_lines(payload), main_table(main_rows)]
    if over_rows:
        parts += [oversize_caption(payload), oversize_table(over_rows)]
    payload["report_markdown"] = "\n\n".join(parts)
    bl.log("load average at end: %.2f %.2f %.2f", *payload["loadavg_after"])
    return payload


def _versions(fanfs: FanfsTool) -> dict[str, str | None]:
    import lmdb
    import torch

    versions = bl.program_versions({"fanfs": [*fanfs.cmd, "--version"]})
    return {**versions, "torch": torch.__version__, "lmdb": lmdb.__version__}


def missing_dependency() -> str | None:
    """The name of torch or lmdb if either cannot be imported."""
    for name in ("torch", "lmdb"):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_dependency()
    if missing:
        print(
            "bench_loader.py: %s is not installed; install it with: %s" % (missing, DEPS_HINT),
            file=sys.stderr,
        )
        return 2
    bl.install_signal_handlers()
    return bl.run_reported(functools.partial(run_benchmark, args), functools.partial(save, args))


def save(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    """Write the result to --json, if given."""
    if args.json:
        bl.write_json(args.json, payload)
        bl.log("wrote %s", args.json)


if __name__ == "__main__":
    sys.exit(main())
