"""Shared helpers for the fanfs benchmarks in tools/: dataset, systems, mounts, results.

Owns the synthetic ImageFolder-like dataset, building and mounting the systems compared
(raw files, fanfs, squashfuse_ll, the kernel's EROFS), page-cache drops and the epochs they
disturb, FUSE daemon memory and counters, work directories, result files, and what the
benchmarks' command lines and main() functions have in common. It never imports fanfs's
filesystem code (it drives the fanfs CLI), and every mount goes through `MountStack`, which
unmounts on exit (lazily, and then kills the daemon, as a last resort).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import itertools
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Self, TypeVar

import numpy as np

from fanfs import _harness as harness
from fanfs import mountinfo as fanfs_mountinfo

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "results"
# An ImageFolder-like tree: this many class directories.
CLASS_COUNT = 100
# (kind, share of files): JPEG-like random bytes, compressible float arrays, JSON-ish text.
KIND_SHARES = (("jpg", 0.70), ("npy", 0.15), ("json", 0.15))
# Bump when generate_dataset() changes, so a kept --workdir dataset is not reused stale.
DATASET_VERSION = 1
# How long a mount may take to appear in mountinfo, and an unmount to finish.
MOUNT_DEADLINE_S = 60.0
UMOUNT_TIMEOUT_S = 30.0
# Building an image of a few GB takes minutes; this only catches a hung build.
BUILD_TIMEOUT_S = 3600.0
# A timed epoch during which another process dropped the page cache is run again, at most
# this many times in all (the machine is shared; other benchmarks drop caches too).
EPOCH_ATTEMPTS = 3
# The epoch kinds of run_undisturbed(): `cold` right after a page-cache drop, `warm` right
# after an untimed epoch of the same reads.
EPOCHS = ("cold", "warm")
# The root xattr that holds a fanfs daemon's counters as JSON (`fanfs stats` reads it).
FANFS_STATS_XATTR = "user.fanfs.stats"
# How the kernel's EROFS gets its image: `file` mounts the image file itself (kernels with
# CONFIG_EROFS_FS_BACKED_BY_FILE, 6.12 on), `loop` through a loop device, `auto` tries
# `file` first.
EROFS_MOUNT_MODES = ("auto", "file", "loop")
# libfuse's low-level passthrough example, as Debian's libfuse3-dev ships it (the "passthrough"
# system: a C FUSE daemon over the raw files).
PASSTHROUGH_SOURCE = Path("/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c")
_MS_RDONLY = 1

_T = TypeVar("_T")

_T0 = time.monotonic()


class BenchError(Exception):
    """A benchmark precondition or correctness check failed; the run is invalid."""


def log(msg: str, *args: object) -> None:
    """Print a progress line to stderr, prefixed with the seconds since start."""
    text = msg % args if args else msg
    print("[%7.1fs] %s" % (time.monotonic() - _T0, text), file=sys.stderr, flush=True)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt("signal %d" % signum)


def install_signal_handlers() -> None:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt so that `finally` cleanups run."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends (for cleanups that must finish).

    Every step inside has its own timeout, so a held Ctrl-C cannot make the script hang.
    """
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------- dataset


@dataclass(frozen=True, slots=True)
class Dataset:
    """Regular files under `root`: relative paths and their sizes, in sorted order."""

    root: Path
    relpaths: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def describe(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for rel in self.relpaths:
            ext = os.path.splitext(rel)[1].lstrip(".") or "(none)"
            kinds[ext] = kinds.get(ext, 0) + 1
        return {
            "root": str(self.root),
            "file_count": len(self.relpaths),
            "total_bytes": self.total_bytes,
            "files_by_extension": kinds,
            "min_size_bytes": min(self.sizes, default=0),
            "max_size_bytes": max(self.sizes, default=0),
        }


def scan_dataset(root: Path) -> Dataset:
    """List the regular files under `root` (symlinks and special files are skipped)."""
    entries: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                entries.append((os.path.relpath(path, root), st.st_size))
    if not entries:
        raise BenchError("no regular files under %s" % root)
    entries.sort()
    return Dataset(root, tuple(e[0] for e in entries), tuple(e[1] for e in entries))


def _jpg_like(rng: np.random.Generator, size: int) -> bytes:
    # SOI + APP0 marker, then entropy-coded-like random bytes, then EOI.
    head = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    return head + rng.bytes(max(size - len(head) - 2, 0)) + b"\xff\xd9"


def _npy_like(rng: np.random.Generator, size: int) -> bytes:
    # A smooth float32 signal quantised to 1/256: compressible, but not trivially.
    count = max((size - 128) // 4, 1)
    walk = np.cumsum(rng.standard_normal(count, dtype=np.float32))
    values = (np.round(walk * 256) / 256).astype("<f4")
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % count
    header_bytes = b"\x93NUMPY\x01\x00" + (128 - 10).to_bytes(2, "little")
    header_bytes += header.encode().ljust(128 - 10 - 1) + b"\n"
    return header_bytes + values.tobytes()


# Caption words of the generated annotation files (bench_read.py, bench_loader.py).
CAPTION_WORDS = (
    "a",
    "the",
    "small",
    "red",
    "dog",
    "car",
    "on",
    "road",
    "grass",
    "two",
    "people",
    "near",
    "large",
    "white",
    "building",
    "with",
    "tree",
    "blue",
    "sky",
    "sitting",
)


def _json_like(rng: np.random.Generator, size: int) -> bytes:
    # JSON-lines annotations, cut to `size` (not valid JSON at the cut; it need not be).
    count = size // 100 + 1
    ids = rng.integers(0, 1_000_000, count)
    boxes = np.round(rng.uniform(0, 640, (count, 4)), 2)
    cats = rng.integers(0, CLASS_COUNT, count)
    scores = rng.random(count)
    words = rng.integers(0, len(CAPTION_WORDS), (count, 5))
    lines = [
        '{"image_id": %d, "bbox": [%.2f, %.2f, %.2f, %.2f], "category": "class_%03d", '
        '"score": %.4f, "caption": "%s"}'
        % (ids[i], *boxes[i], cats[i], scores[i], " ".join(CAPTION_WORDS[w] for w in words[i]))
        for i in range(count)
    ]
    return "\n".join(lines).encode()[:size]


_MAKERS: dict[str, Callable[[np.random.Generator, int], bytes]] = {
    "jpg": _jpg_like,
    "npy": _npy_like,
    "json": _json_like,
}


def generate_dataset(root: Path, file_count: int, seed: int) -> Dataset:
    """Write `file_count` files of 50-150 kB over CLASS_COUNT class directories.

    Deterministic for a given (file_count, seed). A manifest next to `root` lets a later
    run with the same parameters reuse the tree (`load_generated`).
    """
    rng = np.random.default_rng(seed)
    kinds = rng.choice(len(KIND_SHARES), size=file_count, p=[s for _, s in KIND_SHARES])
    sizes = rng.integers(50_000, 150_001, size=file_count)
    for c in range(CLASS_COUNT):
        (root / ("class_%03d" % c)).mkdir(parents=True, exist_ok=True)
    for i in range(file_count):
        kind = KIND_SHARES[kinds[i]][0]
        rel = "class_%03d/%s_%06d.%s" % (i % CLASS_COUNT, kind, i, kind)
        (root / rel).write_bytes(_MAKERS[kind](rng, int(sizes[i])))
        if (i + 1) % 5000 == 0:
            log("generated %d/%d files", i + 1, file_count)
    dataset = scan_dataset(root)
    _manifest_path(root).write_text(json.dumps(_manifest(file_count, seed)))
    return dataset


def _manifest_path(root: Path) -> Path:
    return root.parent / (root.name + ".manifest.json")


def _manifest(file_count: int, seed: int) -> dict[str, int]:
    return {"version": DATASET_VERSION, "file_count": file_count, "seed": seed}


def load_generated(root: Path, file_count: int, seed: int) -> Dataset | None:
    """Return the dataset generated earlier at `root` with these parameters, or None."""
    try:
        manifest = json.loads(_manifest_path(root).read_text())
    except (OSError, ValueError):
        return None
    if manifest != _manifest(file_count, seed):
        return None
    dataset = scan_dataset(root)
    return dataset if len(dataset.relpaths) == file_count else None


# ---------------------------------------------------------------- system state


def run_cmd(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> float:
    """Run `cmd` to completion and return its wall time; raise BenchError on failure.

    Output goes to `log_path` (appended), never to a pipe: a daemon that inherits a pipe
    would keep `subprocess.run` waiting for EOF. The child gets its own session, so a
    Ctrl-C on the terminal reaches only this script, which then cleans up in order.
    """
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            env=env,
            start_new_session=True,
            check=False,
        )
        elapsed = time.perf_counter() - t0
    except OSError as exc:
        raise BenchError("cannot run %s: %s" % (shlex.join(cmd), exc)) from exc
    except subprocess.TimeoutExpired:
        raise BenchError("%s timed out after %.0f s" % (shlex.join(cmd), timeout_s)) from None
    finally:
        if not isinstance(out, int):
            out.close()
    if proc.returncode != 0:
        raise BenchError(
            "%s exited with %d%s" % (shlex.join(cmd), proc.returncode, _log_tail(log_path))
        )
    return elapsed


def _log_tail(log_path: Path | None, lines: int = 20) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return "; last lines of %s:\n%s" % (log_path, "\n".join(tail))


def drop_caches() -> None:
    """Write back dirty pages, then drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise BenchError("cannot drop caches (run as root): %s" % exc) from exc


def drop_count() -> int:
    """How often anyone on this machine has dropped the page cache since boot."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("drop_pagecache "):
            return int(line.split()[1])
    return 0


def run_undisturbed(
    run: Callable[[], _T], *, cold: bool, warm_up: Callable[[], object] | None = None
) -> tuple[_T, int, bool]:
    """Time one epoch with `run`, from a dropped page cache (`cold`) and/or after `warm_up`.

    Runs it again, up to EPOCH_ATTEMPTS times in all, if someone else on the machine
    dropped the page cache meanwhile (seen in /proc/vmstat). Returns the last result, the
    attempts made, and whether that last one was still disturbed.
    """
    attempt = 0
    while True:
        attempt += 1
        if cold:
            drop_caches()
        drops = drop_count()
        if warm_up is not None:
            warm_up()
        result = run()
        disturbed = drop_count() != drops
        if not disturbed or attempt == EPOCH_ATTEMPTS:
            return result, attempt, disturbed
        log("WARNING: another process dropped the page cache during this epoch; again")


def du_bytes(path: Path) -> int:
    """Apparent size in bytes of a file or tree, as `du -sb` reports it."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def mountinfo() -> dict[str, str]:
    """Mount point -> filesystem type, from /proc/self/mountinfo (not os.path.ismount)."""
    return {entry.mountpoint: entry.fstype for entry in fanfs_mountinfo.mounts()}


def wait_mounted(mnt: Path, deadline_s: float = MOUNT_DEADLINE_S) -> None:
    """Poll mountinfo until `mnt` is a mount point, with a doubling step."""
    if not harness.poll(
        lambda: harness.mount_type(mnt) is not None, timeout_s=deadline_s, step_s=0.005
    ):
        raise BenchError("%s did not appear in mountinfo within %.0f s" % (mnt, deadline_s))


def process_memory(pids: Sequence[int]) -> dict[str, int] | None:
    """Summed VmRSS, VmHWM and Pss in bytes over `pids`; None if none can be read."""
    total = {"rss_bytes": 0, "hwm_bytes": 0, "pss_bytes": 0}
    seen = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            status = Path("/proc/%d/status" % pid).read_text()
            rollup = Path("/proc/%d/smaps_rollup" % pid).read_text()
            total["rss_bytes"] += _kb_field(status, "VmRSS:")
            total["hwm_bytes"] += _kb_field(status, "VmHWM:")
            total["pss_bytes"] += _kb_field(rollup, "Pss:")
            seen += 1
    return {**total, "process_count": seen} if seen else None


def _kb_field(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- mounts


@dataclass(slots=True)
class _Mount:
    mnt: Path
    umount_cmd: list[str]
    log_path: Path | None
    env: dict[str, str] | None
    lazy_cmd: list[str] | None = None  # None: fusermount3 -u -z
    pids: list[int] = field(default_factory=list)


class MountStack:
    """Mounts made by this run; `close()` unmounts them all in reverse order.

    Register a mount point *before* running the mount command: unmounting something that
    never got mounted is a no-op, while a mount that appeared after a timeout would leak.
    Escalation per mount: its own unmount command, a lazy unmount (`fusermount3 -u -z`, or
    the mount's own `lazy_umount_cmd` for a kernel filesystem), then SIGTERM and SIGKILL to
    the daemon pids found for it (only processes serving this mount point).
    """

    def __init__(self) -> None:
        self._mounts: list[_Mount] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def register(
        self,
        mnt: Path,
        umount_cmd: Sequence[str],
        *,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        lazy_umount_cmd: Sequence[str] | None = None,
    ) -> None:
        lazy = list(lazy_umount_cmd) if lazy_umount_cmd is not None else None
        self._mounts.append(_Mount(mnt, list(umount_cmd), log_path, env, lazy))

    def daemon_pids(self, mnt: Path) -> list[int]:
        """Find (and remember, for cleanup) the daemon pids serving `mnt`."""
        for m in self._mounts:
            if m.mnt == mnt:
                m.pids = sorted(set(m.pids) | set(harness.serving_pids(mnt)))
                return m.pids
        raise KeyError(mnt)

    def close(self) -> None:
        with signals_deferred():
            self._close()

    def _close(self) -> None:
        failures = []
        while self._mounts:
            m = self._mounts.pop()
            try:
                _unmount(m)
            except BaseException as exc:  # keep cleaning up the rest, then report
                log("ERROR: cleaning up %s: %r", m.mnt, exc)
                failures.append(m.mnt)
        if failures:
            raise BenchError("could not clean up mounts: %s" % ", ".join(map(str, failures)))


def _unmount(m: _Mount) -> None:
    m.pids = sorted(set(m.pids) | set(harness.serving_pids(m.mnt)))
    if str(m.mnt) in mountinfo():
        log("unmounting %s", m.mnt)
        try:
            run_cmd(m.umount_cmd, timeout_s=UMOUNT_TIMEOUT_S, log_path=m.log_path, env=m.env)
        except BenchError as exc:
            log("WARNING: %s", exc)
    if str(m.mnt) in mountinfo():
        log("WARNING: %s still mounted; lazy unmount", m.mnt)
        if m.lazy_cmd is None:
            harness.lazy_unmount(m.mnt)
        else:
            with contextlib.suppress(BenchError):
                run_cmd(m.lazy_cmd, timeout_s=UMOUNT_TIMEOUT_S, log_path=m.log_path, env=m.env)
    _reap(m.pids)
    if str(m.mnt) in mountinfo():
        raise BenchError("%s is still mounted" % m.mnt)


def _reap(pids: Sequence[int], grace_s: float = 10.0) -> None:
    """Wait for daemon `pids` to exit after unmount; SIGTERM, then SIGKILL stragglers."""
    for sig, wait_s in ((None, grace_s), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        alive = [p for p in pids if harness.pid_alive(p)]
        if not alive:
            return
        if sig is not None:
            log("WARNING: sending %s to daemon pids %s", sig.name, alive)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        end = time.monotonic() + wait_s
        while time.monotonic() < end and any(harness.pid_alive(p) for p in alive):
            time.sleep(0.05)


# ---------------------------------------------------------------- systems


@dataclass(slots=True)
class SystemSetup:
    """One system under test, ready to read: where its files appear and what it cost."""

    name: str
    root: Path
    build_s: float | None = None
    size_bytes: int | None = None
    mount_s: float | None = None
    mnt: Path | None = None
    memory: dict[str, dict[str, int] | None] = field(default_factory=dict)
    # How it was built and mounted, where that varies (e.g. erofs: compressor, mount mode).
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "build_s": self.build_s,
            "size_bytes": self.size_bytes,
            "mount_s": self.mount_s,
            "daemon_memory": self.memory,
            **self.details,
        }


def fanfs_env(tree: Path | None = None) -> dict[str, str]:
    """Environment for `python -m fanfs` that imports fanfs from this checkout (or from the
    source tree `tree`, an older revision to compare with), ahead of any installed copy, and
    never from the current directory, which `python -m` puts first on sys.path unless
    PYTHONSAFEPATH is set (run from a checkout, a baseline would silently run its code)."""
    env = dict(os.environ)
    first = str(tree or REPO_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [first, env.get("PYTHONPATH")]))
    env["PYTHONSAFEPATH"] = "1"
    return env


# External programs each system needs.
REQUIRED_PROGRAMS = {
    "native": (),
    "fanfs": ("fusermount3",),
    "fanfs-base": ("fusermount3",),
    "squashfuse": ("mksquashfs", "squashfuse_ll", "fusermount3"),
    "erofs": ("mkfs.erofs", "umount"),
    "passthrough": ("gcc", "pkg-config", "fusermount3"),
}
# The command that reports each system's build tool version (for the result's "versions").
VERSION_COMMANDS = {
    "mksquashfs": ("mksquashfs", "-version"),
    "squashfuse_ll": ("squashfuse_ll", "--version"),
    # mkfs.erofs 1.5 has no version option; the Debian package's version is the same.
    "erofs-utils": ("dpkg-query", "-W", "-f", "erofs-utils ${Version}\\n", "erofs-utils"),
}


def check_programs(systems: Sequence[str]) -> None:
    """Raise BenchError naming any program the chosen systems need but PATH lacks."""
    missing = sorted({p for s in systems for p in REQUIRED_PROGRAMS[s] if not shutil.which(p)})
    if missing:
        raise BenchError(
            "not on PATH: %s (apt-get install fuse3 libfuse3-dev pkg-config squashfs-tools "
            "squashfuse erofs-utils)" % ", ".join(missing)
        )


def setup_native(dataset: Dataset) -> SystemSetup:
    return SystemSetup("native", dataset.root, size_bytes=dataset.total_bytes)


def setup_fanfs(
    dataset: Dataset,
    workdir: Path,
    mounts: MountStack,
    fanfs_cmd: Sequence[str],
    pack_args: Sequence[str],
    mount_args: Sequence[str],
    *,
    name: str = "fanfs",
    tree: Path | None = None,
) -> SystemSetup:
    """`fanfs pack` the dataset, then `fanfs mount` it (returns once the mount is ready).
    With `tree`, both run the fanfs code of that source tree (system `name`)."""
    pack, log_path, env = workdir / ("pack.%s" % name), workdir / ("%s.log" % name), fanfs_env(tree)
    pack_cmd = [*fanfs_cmd, "pack", str(dataset.root), str(pack), "-q", *pack_args]
    setup = _build_timed(name, pack_cmd, pack, workdir / ("mnt-%s" % name), log_path, env)
    _mount_timed(
        setup,
        mounts,
        [*fanfs_cmd, "mount", *mount_args, str(pack), str(setup.root)],
        [*fanfs_cmd, "umount", str(setup.root)],
        None,
        log_path,
        env,
    )
    return setup


def setup_squashfuse(dataset: Dataset, workdir: Path, mounts: MountStack) -> SystemSetup:
    """mksquashfs (default compression) the dataset, then mount it with squashfuse_ll."""
    img, log_path = workdir / "image.squashfs", workdir / "squashfuse.log"
    build_cmd = ["mksquashfs", str(dataset.root), str(img), "-noappend", "-quiet"]
    setup = _build_timed("squashfuse", build_cmd, img, workdir / "mnt-squashfuse", log_path, None)
    _mount_timed(
        setup,
        mounts,
        ["squashfuse_ll", str(img), str(setup.root)],
        ["fusermount3", "-u", str(setup.root)],
        None,
        log_path,
    )
    return setup


def setup_passthrough(dataset: Dataset, workdir: Path, mounts: MountStack) -> SystemSetup:
    """libfuse's `passthrough_ll` example over the raw files, mounted through FUSE.

    Its source ships in Debian's libfuse3-dev (PASSTHROUGH_SOURCE); it is compiled here, its
    "build". A multithreaded C daemon that serves each READ from the raw file (spliced, no
    copy through user space), with no codec, no checksum and no index, mounted with
    `cache=always` (kept page cache, day-long entry and attribute timeouts, as fanfs's). For
    files opened once and read many times, what it costs beyond the raw files is the kernel's
    FUSE READ round trip on this machine: the floor under any FUSE filesystem. It is no floor
    for many small files: each open() costs it an OPEN and a RELEASE, which fanfs's no-open
    mode never receives.
    """
    if not PASSTHROUGH_SOURCE.is_file():
        raise BenchError("%s is missing (apt-get install libfuse3-dev)" % PASSTHROUGH_SOURCE)
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True, check=False
    )
    if flags.returncode:
        raise BenchError("pkg-config knows no fuse3 (apt-get install libfuse3-dev)")
    # It holds an O_PATH fd for every inode the kernel knows, so a tree needs about as many
    # open files as it has files and directories (the daemon inherits this process's limit).
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    needed = len(dataset.relpaths) + len({os.path.dirname(r) for r in dataset.relpaths}) + 64
    if needed > hard:
        raise BenchError(
            "passthrough_ll holds an open file per file and directory; %d files exceed this "
            "machine's limit of %d open files (ulimit -Hn): use fewer files"
            % (len(dataset.relpaths), hard)
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    binary, log_path = workdir / "passthrough_ll", workdir / "passthrough.log"
    build_cmd = ["gcc", "-O2", str(PASSTHROUGH_SOURCE), "-o", str(binary), *flags.stdout.split()]
    setup = _build_timed(
        "passthrough", build_cmd, binary, workdir / "mnt-passthrough", log_path, None
    )
    setup.size_bytes = dataset.total_bytes  # it serves the raw files themselves
    setup.details["source"] = str(PASSTHROUGH_SOURCE)
    options = "source=%s,cache=always,ro" % dataset.root
    _mount_timed(
        setup,
        mounts,
        [str(binary), "-o", options, str(setup.root)],
        ["fusermount3", "-u", str(setup.root)],
        None,
        log_path,
    )
    return setup


def erofs_compressors() -> tuple[str, ...]:
    """The compressors this mkfs.erofs was built with, from its --help ("Available
    compressors are: lz4hc, lz4" for Debian 12's erofs-utils 1.5)."""
    try:
        out = subprocess.run(
            ["mkfs.erofs", "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    found = re.search(r"Available compressors are: *(.*)", out.stdout + out.stderr)
    return tuple(c.strip() for c in found.group(1).split(",") if c.strip()) if found else ()


def check_erofs_compress(compress: str) -> None:
    """Raise BenchError unless mkfs.erofs offers the algorithm of `compress` (ALG[,LEVEL])."""
    offered = erofs_compressors()
    if compress.split(",")[0] not in offered:
        raise BenchError(
            "mkfs.erofs here offers %s, not %s (lzma needs a newer erofs-utils built with "
            "liblzma)" % (", ".join(offered) or "no compressor", compress)
        )


def setup_erofs(
    dataset: Dataset,
    workdir: Path,
    mounts: MountStack,
    *,
    compress: str = "lz4hc",
    extra_args: Sequence[str] = (),
    mode: str = "auto",
) -> SystemSetup:
    """`mkfs.erofs -z<compress>` the dataset, then mount the image with the kernel's EROFS.

    `mode` (EROFS_MOUNT_MODES): `file` gives mount(2) the image file itself, with no loop
    device (mount(8) of util-linux 2.38 always sets one up for a regular file, so this calls
    mount(2) directly); `loop` runs `mount -t erofs -o ro,loop` (the loop device is freed at
    unmount); `auto` tries `file`, then `loop`. Unmounted with umount(8), lazily as a last
    resort. The image is a kernel filesystem: mount time is the syscall's, and there is no
    daemon (no memory columns).
    """
    img, mnt, log_path = workdir / "image.erofs", workdir / "mnt-erofs", workdir / "erofs.log"
    build_cmd = ["mkfs.erofs", "--quiet", "-z" + compress, *extra_args, str(img)]
    setup = _build_timed("erofs", [*build_cmd, str(dataset.root)], img, mnt, log_path, None)
    setup.details.update(compress=compress, mkfs_args=list(extra_args))
    umount = (["umount", str(mnt)], ["umount", "-l", str(mnt)])
    if mode in ("auto", "file"):
        try:
            _mount_timed(setup, mounts, lambda: _mount_file(img, mnt, "erofs"), *umount, log_path)
        except BenchError as exc:
            if mode == "file":
                raise
            log("erofs: cannot mount the image file itself (%s); trying a loop device", exc)
        else:
            setup.details["mount_mode"] = "file"
            return setup
    loop_cmd = ["mount", "-t", "erofs", "-o", "ro,loop", str(img), str(mnt)]
    _mount_timed(setup, mounts, loop_cmd, *umount, log_path)
    setup.details["mount_mode"] = "loop"
    return setup


def add_erofs_args(p: argparse.ArgumentParser) -> None:
    """The options of setup_erofs(): --erofs-compress, --erofs-args, --erofs-mount."""
    p.add_argument(
        "--erofs-compress",
        default="lz4hc",
        help="mkfs.erofs -z ALG[,LEVEL] (default lz4hc; lzma where mkfs.erofs offers it)",
    )
    p.add_argument(
        "--erofs-args", default="", help='extra mkfs.erofs args, e.g. "-C65536" (pcluster size)'
    )
    p.add_argument(
        "--erofs-mount",
        choices=EROFS_MOUNT_MODES,
        default="auto",
        help="mount the image file itself (file), through a loop device (loop), or the first "
        "that works (auto, the default)",
    )


def add_fanfs_args(
    p: argparse.ArgumentParser,
    *,
    pack_help: str = 'extra `fanfs pack` args, e.g. "--codec lz4"',
    mount_default: str = "",
    mount_help: str,
) -> None:
    """The options of setup_fanfs(): --fanfs-cmd, --pack-args, --mount-args (the last two
    worded, and --mount-args's default chosen, by each benchmark)."""
    p.add_argument(
        "--fanfs-cmd",
        default="%s -m fanfs" % shlex.quote(sys.executable),
        help="how to run the fanfs CLI (default: %(default)s)",
    )
    p.add_argument("--pack-args", default="", help=pack_help)
    p.add_argument("--mount-args", default=mount_default, help=mount_help)


def check_systems(args: argparse.Namespace) -> None:
    """Raise BenchError if a system of `args.systems` cannot be built here: a program it
    needs is missing, or this mkfs.erofs lacks the compressor of --erofs-compress."""
    check_programs(args.systems)
    if "erofs" in args.systems:
        check_erofs_compress(args.erofs_compress)


def setup_systems(
    args: argparse.Namespace,
    dataset: Dataset,
    workdir: Path,
    mounts: MountStack,
    *,
    baseline_tree: Path | None = None,
) -> list[SystemSetup]:
    """Build and mount each system of `args.systems`, in that order, with the options of
    add_fanfs_args() and add_erofs_args(); fanfs-base runs the fanfs of `baseline_tree`."""
    setups = []
    for name in args.systems:
        if name == "native":
            setups.append(setup_native(dataset))
        elif name in ("fanfs", "fanfs-base"):
            setups.append(
                setup_fanfs(
                    dataset,
                    workdir,
                    mounts,
                    shlex.split(args.fanfs_cmd),
                    shlex.split(args.pack_args),
                    shlex.split(args.mount_args),
                    name=name,
                    tree=baseline_tree if name == "fanfs-base" else None,
                )
            )
        elif name == "erofs":
            setups.append(
                setup_erofs(
                    dataset,
                    workdir,
                    mounts,
                    compress=args.erofs_compress,
                    extra_args=shlex.split(args.erofs_args),
                    mode=args.erofs_mount,
                )
            )
        elif name == "passthrough":
            setups.append(setup_passthrough(dataset, workdir, mounts))
        else:
            setups.append(setup_squashfuse(dataset, workdir, mounts))
    return setups


def workdir_names(systems: Sequence[str]) -> list[str]:
    """What setup_systems() puts in the work directory for `systems` (images, mount points,
    logs), for cleanup_workdir()."""
    names = []
    for name in systems:
        if name in ("fanfs", "fanfs-base"):
            names += ["pack.%s" % name, "mnt-%s" % name, "%s.log" % name]
        elif name == "erofs":
            names += ["image.erofs", "mnt-erofs", "erofs.log"]
        elif name == "squashfuse":
            names += ["image.squashfs", "mnt-squashfuse", "squashfuse.log"]
        elif name == "passthrough":
            names += ["passthrough_ll", "mnt-passthrough", "passthrough.log"]
    return names


def record_memory(setups: Sequence[SystemSetup], mounts: MountStack, when: str) -> None:
    """Record the daemon memory of each mounted system in `setups` as memory[`when`]."""
    for s in setups:
        if s.mnt is not None:
            s.memory[when] = process_memory(mounts.daemon_pids(s.mnt))


def erofs_line(summary: dict[str, Any]) -> str:
    """How the erofs image was built and mounted (from SystemSetup.summary())."""
    how = {"file": "from the image file (no loop device)", "loop": "through a loop device"}
    mkfs = shlex.join(["mkfs.erofs", "-z" + summary["compress"], *summary["mkfs_args"]])
    return "erofs: `%s`, mounted by the kernel %s" % (mkfs, how[summary["mount_mode"]])


def _mount_file(source: Path, target: Path, fstype: str) -> None:
    """mount(2) `source` read-only on `target`: a file-backed mount, no loop device."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    libc.mount.restype = ctypes.c_int
    if libc.mount(os.fsencode(source), os.fsencode(target), fstype.encode(), _MS_RDONLY, None):
        err = ctypes.get_errno()
        raise BenchError("mount(2) of %s on %s: %s" % (source, target, os.strerror(err)))


def _build_timed(
    name: str, cmd: Sequence[str], out: Path, mnt: Path, log_path: Path, env: dict[str, str] | None
) -> SystemSetup:
    """Run a build command from a cold page cache; time it and measure its output."""
    _remove(out)
    drop_caches()
    log("%s build: %s", name, shlex.join(cmd))
    build_s = run_cmd(cmd, timeout_s=BUILD_TIMEOUT_S, log_path=log_path, env=env)
    setup = SystemSetup(name, mnt, build_s=build_s, size_bytes=du_bytes(out), mnt=mnt)
    log("%s build: %.1f s, %.1f MB", name, build_s, du_bytes(out) / 1e6)
    return setup


def _mount_timed(
    setup: SystemSetup,
    mounts: MountStack,
    mount_cmd: Sequence[str] | Callable[[], None],
    umount_cmd: Sequence[str],
    lazy_umount_cmd: Sequence[str] | None,
    log_path: Path,
    env: dict[str, str] | None = None,
) -> None:
    """Mount from a cold page cache with a command (or a call, for a mount(2) done here);
    time until the mount shows in mountinfo."""
    mnt = setup.root
    mnt.mkdir(exist_ok=True)
    mounts.register(mnt, umount_cmd, log_path=log_path, env=env, lazy_umount_cmd=lazy_umount_cmd)
    drop_caches()
    t0 = time.perf_counter()
    if callable(mount_cmd):
        mount_cmd()
    else:
        run_cmd(mount_cmd, timeout_s=MOUNT_DEADLINE_S, log_path=log_path, env=env)
    wait_mounted(mnt)
    setup.mount_s = time.perf_counter() - t0
    pids = mounts.daemon_pids(mnt)
    setup.memory["after_mount"] = process_memory(pids)
    log("%s mounted in %.2f s, daemon pids %s", setup.name, setup.mount_s, pids)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def fanfs_counters(mnt: Path) -> dict[str, Any]:
    """A fanfs mount's daemon counters (summed over its serving processes), from the root
    xattr that `fanfs stats` reads."""
    try:
        return dict(json.loads(os.getxattr(mnt, FANFS_STATS_XATTR)))
    except (OSError, ValueError) as exc:
        raise BenchError("cannot read %s of %s: %s" % (FANFS_STATS_XATTR, mnt, exc)) from exc


# ---------------------------------------------------------------- command line


def new_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of a benchmark's docstring `doc`, its line
    breaks kept."""
    return argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_workdir_args(p: argparse.ArgumentParser, *, reused_with: str) -> None:
    """--workdir and --keep (make_workdir(), cleanup_workdir()); `reused_with` names what a
    later run must repeat, besides --workdir and --seed, to reuse the generated data."""
    p.add_argument(
        "--workdir",
        type=Path,
        help="images, mounts, generated data (default: "
        "a new dir under /tmp, removed at the end unless --keep)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the workdir (a later run with the same --workdir, %s and --seed reuses "
        "its generated data)" % reused_with,
    )


def add_list_arg(
    p: argparse.ArgumentParser,
    option: str,
    choices: Sequence[str],
    default: Sequence[str] | None = None,
    *,
    show_default: bool = False,
) -> None:
    """`option`, a comma list of distinct `choices` (split_lists() checks and splits it):
    by default `default`, or all of them; `show_default` puts the default in the help."""
    text = "comma list of %s" % ", ".join(choices)
    if show_default:
        text += " (default %s)" % ("all" if default is None else ",".join(default))
    p.add_argument(option, default=",".join(choices if default is None else default), help=text)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """--epoch-timeout (how long one epoch may take) and --results-dir (write_result())."""
    p.add_argument("--epoch-timeout", type=float, default=900.0, help="seconds (default 900)")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)


def split_lists(
    p: argparse.ArgumentParser, args: argparse.Namespace, lists: dict[str, Sequence[str]]
) -> None:
    """Replace each comma-list option of `args` named in `lists` (add_list_arg()) by the list
    of its words; exit with a usage error unless they are distinct words of its choices."""
    for name, allowed in lists.items():
        chosen = [x for x in getattr(args, name).split(",") if x]
        if not chosen or set(chosen) - set(allowed) or len(set(chosen)) != len(chosen):
            p.error("--%s takes a comma list of distinct %s" % (name, ", ".join(allowed)))
        setattr(args, name, chosen)


def command_line(argv: Sequence[str] | None, script: str) -> str:
    """The command that ran benchmark `script`, for its result: this Python with the
    arguments main() was given (`argv`), or else with sys.argv."""
    return shlex.join(
        [sys.executable, *sys.argv] if argv is None else [sys.executable, script, *argv]
    )


# ---------------------------------------------------------------- work directories


def make_workdir(workdir: Path | None) -> tuple[Path, bool]:
    """Return the work directory (a new one under /tmp if None) and whether this run made it."""
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="fanfs-bench-", dir="/tmp")), True
    created = not workdir.exists()
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir.resolve(), created


def cleanup_workdir(
    workdir: Path, created: bool, *, keep: bool, names: Sequence[str], src: Path | None = None
) -> None:
    """Remove what a benchmark put in `workdir`: all of it if this run made it, else the
    entries `names`. Never anything while a mount lives under `workdir`, never `src`."""
    live = [m for m in mountinfo() if m == str(workdir) or m.startswith(str(workdir) + "/")]
    if live:
        log("ERROR: not removing %s: still mounted: %s", workdir, ", ".join(live))
        return
    if keep:
        log("kept %s", workdir)
        return
    log("removing the benchmark files under %s", workdir)
    if created:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for path in (workdir / name for name in names):
        if src is not None and (path == src or path in src.parents):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------- results


def host_info() -> dict[str, Any]:
    mem_kb = _kb_field(Path("/proc/meminfo").read_text(), "MemTotal:") // 1024
    return {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem_kb * 1024,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def write_result(name: str, payload: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write `payload` as results/<name>-<host>-<YYYYmmddTHHMM>[-N].json; return the path."""
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M")
    results_dir.mkdir(parents=True, exist_ok=True)
    base = "%s-%s-%s" % (name, platform.node() or "host", stamp)
    path = results_dir / (base + ".json")
    for n in itertools.count(2):  # never overwrite a run from the same minute
        if not path.exists():
            break
        path = results_dir / ("%s-%d.json" % (base, n))
    write_json(path, payload)
    return path


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` as indented JSON (anything else JSON lacks as its str())."""
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def result_head(
    benchmark: str, command: str, started: float, load_before: tuple[float, float, float]
) -> dict[str, Any]:
    """The first fields of a benchmark's result: what ran, when (`started`, a time.time())
    and for how long until now, the load average before and now, the host, the checkout."""
    return {
        "benchmark": benchmark,
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "duration_s": time.time() - started,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "host": host_info(),
        "git": git_revision(),
    }


def machine_line(payload: dict[str, Any]) -> str:
    """The report's first line, from result_head()'s fields: benchmark, machine, when, how
    long, and the load average."""
    info = payload["host"]
    machine = (info["host"], info["cpu_count"], info["mem_total_bytes"] / 1e9, info["kernel"])
    load = (payload["loadavg_before"][0], payload["loadavg_after"][0])
    return (
        "%s on %s (%s CPUs, %.0f GB RAM, kernel %s)" % (payload["benchmark"], *machine)
        + ", %s, %.0f min" % (payload["started"], payload["duration_s"] / 60)
        + ", load average %.1f before, %.1f after" % load
    )


def retry_lines(epochs: Sequence[dict[str, Any]]) -> list[str]:
    """A report line saying how many timed epochs (records with run_undisturbed()'s
    `attempts` and `disturbed`) were run again, if any were."""
    retried = sum(r["attempts"] > 1 for r in epochs)
    if not retried:
        return []
    disturbed = sum(r["disturbed"] for r in epochs)
    return [
        "%d timed epochs were run again after another process dropped the page cache; "
        "%d were still disturbed after %d attempts" % (retried, disturbed, EPOCH_ATTEMPTS)
    ]


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 0
) -> str:
    """A GitHub markdown table; columns from index `right_from` on are right-aligned."""
    aligns = ["---:" if i >= right_from else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(aligns) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median over repeats of numerator / denominator within each repeat (times of two
    systems that ran minutes apart at most: load drifts cancel out)."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def setup_table(setups: Sequence[SystemSetup], data_bytes: int) -> str:
    """Build and mount costs, and daemon memory: RSS and peak (VmHWM) summed over the
    daemon's processes count pages they share once per process; PSS splits them."""

    def mb(mem: dict[str, int] | None, key: str) -> str:
        return "%.0f" % (mem[key] / 1e6) if mem else "-"

    def num(value: float | None, fmt: str) -> str:
        return fmt % value if value is not None else "-"

    body = []
    for s in setups:
        after, end = s.memory.get("after_mount"), s.memory.get("end")
        size = s.size_bytes or 0
        procs = str(end["process_count"]) if end else "-"
        row = [s.name, num(s.build_s, "%.1f"), "%.0f" % (size / 1e6)]
        row += ["%.3f" % (size / data_bytes), num(s.mount_s, "%.2f"), procs]
        row += [mb(after, "rss_bytes"), mb(end, "rss_bytes"), mb(end, "hwm_bytes")]
        row += [mb(after, "pss_bytes"), mb(end, "pss_bytes")]
        body.append(row)
    headers = ["system", "build s", "size MB", "size / data", "mount s", "daemon procs"]
    headers += ["RSS MB after mount", "RSS MB at end", "peak RSS MB"]
    headers += ["PSS MB after mount", "PSS MB at end"]
    return markdown_table(headers, body, right_from=1)


def program_versions(commands: dict[str, Sequence[str]]) -> dict[str, str | None]:
    """The first line with a version number in each command's output (None if none)."""
    versions: dict[str, str | None] = {}
    for name, cmd in commands.items():
        try:
            out = subprocess.run(
                list(cmd), capture_output=True, text=True, timeout=30, env=fanfs_env()
            )
            lines = (out.stdout + out.stderr).splitlines()
            versions[name] = next((x.strip() for x in lines if re.search(r"\d\.\d", x)), None)
        except (OSError, subprocess.TimeoutExpired):
            versions[name] = None
    return versions


def git_revision() -> dict[str, Any] | None:
    """HEAD of this checkout and whether tracked files differ from it; None outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {
            "head": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.CalledProcessError):
        return None


# ---------------------------------------------------------------- main


def run_reported(
    run: Callable[[], dict[str, Any]],
    save: Callable[[dict[str, Any]], None],
    cleanup: Callable[[], None] | None = None,
) -> int:
    """The end of a benchmark's main(): `run` it, `save` its result, print the markdown
    report and return 0; log a failed check (BenchError) and return 1, or an interruption
    and return 130. `cleanup` runs in any case, after a failure is logged, before `save`."""
    try:
        payload = run()
    except BenchError as exc:
        log("FAILED: %s", exc)
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if cleanup is not None:
            cleanup()
    save(payload)
    print(payload["report_markdown"])
    return 0


def mounting_main(
    benchmark: str,
    args: argparse.Namespace,
    run: Callable[[Path, MountStack], dict[str, Any]],
    *,
    root_for: str,
    names: Sequence[str],
    src: Path | None = None,
) -> int:
    """main() of a benchmark that mounts systems (`root_for` says why it needs root): `run`
    in the work directory of add_workdir_args() with a MountStack, then remove the entries
    `names` from it, never `src` (cleanup_workdir()), and write the result to --results-dir
    as `benchmark` (write_result()). Returns the exit status (2: not root; run_reported())."""
    if os.geteuid() != 0:
        print("%s.py must run as root (%s)" % (benchmark, root_for), file=sys.stderr)
        return 2
    install_signal_handlers()
    workdir, created = make_workdir(args.workdir)
    log("workdir %s", workdir)

    def run_mounted() -> dict[str, Any]:
        with MountStack() as mounts:
            return run(workdir, mounts)

    def save(payload: dict[str, Any]) -> None:
        log("wrote %s", write_result(benchmark, payload, args.results_dir))

    def cleanup() -> None:
        cleanup_workdir(workdir, created, keep=args.keep, names=names, src=src)

    return run_reported(run_mounted, save, cleanup)
