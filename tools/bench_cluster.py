#!/usr/bin/env python3
"""Cluster mode: local vs remote read throughput, and messages per file with and without
coalescing, with 3 ranks on this machine (issue 4).

What it measures. A generated ImageFolder-like tree (`--files` files over 30 class
directories: 70% incompressible "JPEG-like" 40-200 kB, 30% compressible text 10-100 kB) is
packed with `fanfs pack` (default 1 MiB chunks, so every file is one chunk, and
`--partitions 24`), then mounted by `mpirun -np 3 fanfs mount PACK DIR/mnt{rank}
--cache-dir DIR/cache{rank}` once per coalescing window (`--coalesce-window` 0 ms = off,
0.5 ms = the default, 2 ms). All reads go through rank 0's mount. A file is *local* when
rank 0 owns every partition its chunks are in, *remote* otherwise; ownership comes from the
pack's index (`PackReader(pack).index`: `first[entry]`, `chunk_partition[cid]`) and the
placement function `fanfs.cluster.topology.place(sizes, broadcast, ranks, replicas)`, and is
checked against the `local_partitions` rank 0 reports. The local and remote sets are cut to
the same number of files (the first N of each in a fixed-seed shuffle).

One *run* reads one set once with R reader threads (R = 1: one loader; R = 8: a
prefetching-like load with eight requests in flight; R = 32: heavier prefetching) in a
fixed-seed random order split round-robin over the threads; each file is `open(p,
'rb').read()`. Before every run the kernel page cache of the mount is emptied: by default
with POSIX_FADV_DONTNEED on each file of the set (per-file, so other benchmarks on the
machine are not disturbed), or with `--evict drop_caches` (`sync; echo 3 >
/proc/sys/vm/drop_caches`). Either way the run first checks with mincore(2) that no page of
the set is cached, and afterwards, from the daemon's counters, that every file was read
from the daemon. The mounts run with `--prefetch off --cache-memory 0` and
`--prefetch-memory 4MiB` (`--daemon-cache`): fanfs keeps decoded chunks of partly read files
in that buffer, and under 32 readers the kernel splits file reads, so a large buffer (or the
object cache, or read-ahead) would serve later repeats of the remote set without a remote
fetch; a remote run with fewer remote fetches than 95% of its files is an error. The staged
partitions stay in memory (fanfs preloads them), which is the steady state of a job.
Within one job, local and remote runs alternate (which goes first alternates too) over
`--repeats` rounds; the table shows medians.

Columns: files/s local and remote (median over repeats), remote/local (ratio of the
medians), messages sent per remote file (request batches rank 0 sent during the remote runs,
per file read; each is answered by one response message), and requests per message (how
many chunk requests a batch carried). Aims from the issue: remote >= 0.5x local, <= 1
message per 16 files under prefetching load.

Before the timed runs, every file is read once through rank 0's mount and its sha256 checked
against the source; any mismatch or error fails the benchmark.

Run as root: `.venv/bin/python tools/bench_cluster.py [--quick]`. The JSON result goes to
results/bench_cluster-<host>-<YYYYmmddTHHMMSS>.json, the markdown table to stdout, progress to
stderr. A default run takes about 5 min on 2 cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import datetime
import hashlib
import json
import mmap
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from fanfs import _harness as harness

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "results"
RANKS = 3
PARTITIONS = 24
CLASSES = 30
FSNAME = "fanfs-bench-cluster"
READY_DEADLINE_S = 120.0
STOP_WAIT_S = 15.0

_T0 = time.monotonic()


class BenchError(Exception):
    """A precondition or correctness check failed; the run is invalid."""


def log(msg: str, *args: object) -> None:
    print(
        "[%7.1fs] %s" % (time.monotonic() - _T0, msg % args if args else msg),
        file=sys.stderr,
        flush=True,
    )


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt("signal %d" % signum)


# -- dataset and pack -------------------------------------------------------------------------


def generate(src: Path, files: int, seed: int) -> dict[str, str]:
    """Write the tree; returns relative path -> sha256."""
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"tensor", b"label", b"\n"]
    digests = {}
    for i in range(files):
        d = src / ("class_%03d" % (i % CLASSES))
        d.mkdir(parents=True, exist_ok=True)
        if rng.random() < 0.7:
            name, data = "img_%06d.jpg" % i, rng.randbytes(rng.randint(40_000, 200_000))
        else:
            n = rng.randint(10_000, 100_000)
            text = bytearray()
            while len(text) < n:
                text += rng.choice(words) + b" "
            name, data = "meta_%06d.json" % i, bytes(text[:n])
        (d / name).write_bytes(data)
        digests["%s/%s" % (d.name, name)] = hashlib.sha256(data).hexdigest()
    return digests


def pack(src: Path, out: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "fanfs",
        "pack",
        str(src),
        str(out),
        "-q",
        "--partitions",
        str(PARTITIONS),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise BenchError("fanfs pack failed: %s" % result.stderr.strip())


def classify(pack_dir: Path, ranks: int) -> tuple[list[str], list[str], set[int]]:
    """(local files, remote files, rank 0's partitions) from the index and the placement."""
    import stat

    from fanfs.cluster.topology import place
    from fanfs.format.reader import PackReader

    reader = PackReader(str(pack_dir))
    try:
        parts = reader.partitions
        owners = place([p["size"] for p in parts], [p["broadcast"] for p in parts], ranks, 1)
        mine = {n for n, o in enumerate(owners) if 0 in o}
        index = reader.index
        local, remote = [], []
        for entry in range(index.entry_count):
            if not stat.S_ISREG(index.mode[entry]):
                continue
            first = index.first[entry]
            chunk_parts = {
                index.chunk_partition[c] for c in range(first, first + index.count[entry])
            }
            (local if chunk_parts <= mine else remote).append(os.fsdecode(index.path(entry)))
    finally:
        reader.close()
    return sorted(local), sorted(remote), mine


# -- the MPI job ------------------------------------------------------------------------------


class Job:
    """`mpirun -np RANKS fanfs mount` with one mountpoint and cache dir per rank."""

    def __init__(
        self,
        workdir: Path,
        pack_dir: Path,
        window_ms: float,
        cache_size: str,
        options: Sequence[str] | None = None,
    ) -> None:
        self.workdir, self.pack_dir, self.window_ms = workdir, pack_dir, window_ms
        self.cache_size = cache_size
        # Prefetch and cache options; by default both off, so that every run reaches the peers.
        self.options = (
            list(options)
            if options is not None
            else [
                "--prefetch",
                "off",
                "--cache-memory",
                "0",
                "--prefetch-memory",
                cache_size,
            ]
        )
        self.mnt = [workdir / ("mnt%d" % r) for r in range(RANKS)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []

    def command(self) -> list[str]:
        return [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            str(RANKS),
            *harness.FANFS,
            "mount",
            str(self.pack_dir),
            str(self.workdir / "mnt{rank}"),
            "--cache-dir",
            str(self.workdir / "cache{rank}"),
            "-o",
            "fsname=" + FSNAME,
            "--coalesce-window",
            str(self.window_ms),
            *self.options,
        ]

    def __enter__(self) -> Job:
        for mnt in self.mnt:
            mnt.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "mpirun.out", "ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self._kill()
            raise
        return self

    def _wait_ready(self) -> None:
        proc = self.proc
        assert proc is not None

        def ready() -> bool:
            return all(
                harness.mount_type(mnt) == harness.FSTYPE and harness.answers(mnt)
                for mnt in self.mnt
            )

        try:
            if not harness.poll(
                ready, timeout_s=READY_DEADLINE_S, alive=lambda: proc.poll() is None, step_s=0.05
            ):
                raise BenchError("the mounts did not appear within %.0fs" % READY_DEADLINE_S)
        except harness.ProcessExited:
            raise BenchError(
                "mpirun exited with %s; see %s" % (proc.returncode, self.workdir / "mpirun.out")
            ) from None
        self.pids = [int(os.getxattr(mnt, "user.fanfs.pid")) for mnt in self.mnt]

    def stats(self, rank: int = 0) -> dict[str, Any]:
        return json.loads(os.getxattr(self.mnt[rank], "user.fanfs.stats"))

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        old = signal.pthread_sigmask(
            signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        )
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                log("mpirun did not stop within %.0fs of SIGTERM; killing it", STOP_WAIT_S)
            self._kill()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _kill(self) -> None:
        """Idempotent last resort: no process and no mount of this job survives. Open MPI
        puts each rank in its own process group: the ranks are killed one by one (mpirun's
        children, found before it dies, and the pids their mounts reported)."""
        pids = set(self.pids)
        if self.proc is not None:
            children = "/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)
            with contextlib.suppress(OSError), open(children) as f:
                pids.update(int(pid) for pid in f.read().split())
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        for mnt in self.mnt:
            if harness.mount_type(mnt) is not None:
                log("lazily unmounting %s", mnt)
                harness.lazy_unmount(mnt)
        for pid in pids:
            if harness.pid_alive(pid, str(self.workdir)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# -- reading ----------------------------------------------------------------------------------


def evict(mnt: Path, files: list[str], how: str) -> None:
    """Empty the kernel page cache of these files on the mount."""
    if how == "drop_caches":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    for rel in files:
        fd = os.open(mnt / rel, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(mnt: Path, files: list[str]) -> int:
    """Pages of these files in the kernel page cache (mincore on a read-only mapping)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for rel in files:
        fd = os.open(mnt / rel, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr is None or addr == MAP_FAILED:
                raise OSError(ctypes.get_errno(), "mmap %s" % rel)
            try:
                vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), "mincore %s" % rel)
                total += sum(v & 1 for v in vec)
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def read_set(mnt: Path, files: list[str], readers: int, seed: int) -> tuple[float, int]:
    """Read every file once with `readers` threads; returns (seconds, bytes)."""
    order = list(files)
    random.Random(seed).shuffle(order)
    shares = [order[i::readers] for i in range(readers)]

    def reader(share: list[str]) -> int:
        total = 0
        for rel in share:
            with open(mnt / rel, "rb") as f:
                total += len(f.read())
        return total

    with concurrent.futures.ThreadPoolExecutor(readers) as pool:
        start = time.perf_counter()
        sizes = list(pool.map(reader, shares))
        elapsed = time.perf_counter() - start
    return elapsed, sum(sizes)


def verify(mnt: Path, digests: dict[str, str]) -> None:
    def check(rel: str) -> str | None:
        with open(mnt / rel, "rb") as f:
            return None if hashlib.sha256(f.read()).hexdigest() == digests[rel] else rel

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        bad = [rel for rel in pool.map(check, sorted(digests)) if rel]
    if bad:
        raise BenchError(
            "%d files differ from the source through %s, e.g. %s" % (len(bad), mnt, bad[:3])
        )


@dataclass
class Run:
    window_ms: float
    readers: int
    kind: str  # local | remote
    repeat: int
    seconds: float
    files: int
    bytes: int
    daemon_reads: int
    chunk_reads: int
    cache_hits: int
    remote_fetches: int
    messages_sent: int
    requests_sent: int
    pack_fallbacks: int


@dataclass
class Result:
    meta: dict[str, Any]
    runs: list[Run] = field(default_factory=list)


COUNTERS = (
    "reads",
    "chunk_reads",
    "buffer_hits",
    "remote_fetches",
    "messages_sent",
    "requests_sent",
    "pack_fallbacks",
)


def one_run(
    job: Job, files: list[str], kind: str, readers: int, repeat: int, how: str, seed: int
) -> Run:
    evict(job.mnt[0], files, how)
    left = resident_pages(job.mnt[0], files)
    if left:
        raise BenchError("%d pages of the %s set still cached after --evict %s" % (left, kind, how))
    before = job.stats()
    seconds, nbytes = read_set(job.mnt[0], files, readers, seed)
    after = job.stats()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
    if delta["reads"] < len(files):
        raise BenchError(
            "only %d daemon reads for %d files: the page cache was not emptied (--evict %s)"
            % (delta["reads"], len(files), how)
        )
    if kind == "remote" and delta["remote_fetches"] < 0.95 * len(files):
        raise BenchError(
            "only %d remote fetches for %d remote files: the daemon's chunk cache served the "
            "rest (lower --daemon-cache)" % (delta["remote_fetches"], len(files))
        )
    return Run(
        job.window_ms,
        readers,
        kind,
        repeat,
        seconds,
        len(files),
        nbytes,
        delta["reads"],
        delta["chunk_reads"],
        delta["buffer_hits"],
        delta["remote_fetches"],
        delta["messages_sent"],
        delta["requests_sent"],
        delta["pack_fallbacks"],
    )


def bench(args: argparse.Namespace, workdir: Path) -> Result:
    src, pack_dir = workdir / "src", workdir / "pack"
    log("generating %d files in %s", args.files, src)
    digests = generate(src, args.files, args.seed)
    log("packing")
    pack(src, pack_dir)
    local, remote, mine = classify(pack_dir, RANKS)
    count = min(len(local), len(remote))
    rng = random.Random(args.seed)
    rng.shuffle(local)
    rng.shuffle(remote)
    sets = {"local": sorted(local[:count]), "remote": sorted(remote[:count])}
    log(
        "rank 0 owns partitions %s: %d local and %d remote files; timing %d of each",
        sorted(mine),
        len(local),
        len(remote),
        count,
    )
    result = Result(
        meta={
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "fanfs": _fanfs_version(),
            "ranks": RANKS,
            "files": args.files,
            "partitions": PARTITIONS,
            "timed_files_per_set": count,
            "bytes_per_set": {k: sum((src / f).stat().st_size for f in v) for k, v in sets.items()},
            "evict": args.evict,
            "daemon_cache": args.daemon_cache,
            "repeats": args.repeats,
            "windows_ms": args.windows,
            "readers": args.readers,
        }
    )
    for n, window in enumerate(args.windows):
        jobdir = workdir / ("job-%g" % window)
        jobdir.mkdir()
        log("window %g ms: starting %d ranks", window, RANKS)
        with Job(jobdir, pack_dir, window, args.daemon_cache) as job:
            got = set(job.stats()["local_partitions"])
            if got != mine:
                raise BenchError("rank 0 holds %s, placement says %s" % (sorted(got), sorted(mine)))
            if n == 0:
                log("verifying every file through rank 0")
                verify(job.mnt[0], digests)
            for readers in args.readers:
                for repeat in range(args.repeats):
                    kinds = ("local", "remote") if repeat % 2 == 0 else ("remote", "local")
                    for kind in kinds:
                        run = one_run(
                            job, sets[kind], kind, readers, repeat, args.evict, args.seed + repeat
                        )
                        result.runs.append(run)
                        log(
                            "window %g ms, %2d readers, %-6s: %7.0f files/s, %5d messages, "
                            "%5d requests",
                            window,
                            readers,
                            kind,
                            run.files / run.seconds,
                            run.messages_sent,
                            run.requests_sent,
                        )
    return result


def table(result: Result) -> str:
    lines = [
        "| coalesce window | readers | files/s local | files/s remote | remote/local "
        "| messages per remote file | requests per message | spread local / remote |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r.window_ms, r.readers) for r in result.runs}, key=lambda k: (k[1], k[0]))
    for window, readers in keys:
        runs = [r for r in result.runs if r.window_ms == window and r.readers == readers]
        rates = {
            kind: [r.files / r.seconds for r in runs if r.kind == kind]
            for kind in ("local", "remote")
        }
        med = {kind: statistics.median(v) for kind, v in rates.items()}
        spread = {kind: (max(v) - min(v)) / med[kind] for kind, v in rates.items()}
        remote = [r for r in runs if r.kind == "remote"]
        messages = sum(r.messages_sent for r in remote)
        per_file = statistics.median(r.messages_sent / r.files for r in remote)
        per_message = sum(r.requests_sent for r in remote) / messages if messages else float("nan")
        lines.append(
            "| %s | %d | %.0f | %.0f | %.2fx | %.3f (1 per %.1f files) | %.2f | %.0f%% / %.0f%% |"
            % (
                "off (0 ms)" if window == 0 else "%g ms" % window,
                readers,
                med["local"],
                med["remote"],
                med["remote"] / med["local"],
                per_file,
                1 / per_file if per_file else float("inf"),
                per_message,
                100 * spread["local"],
                100 * spread["remote"],
            )
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--files", type=int, default=3000, help="files in the generated tree (default 3000)"
    )
    parser.add_argument("--readers", default="1,8,32", help="reader thread counts (default 1,8,32)")
    parser.add_argument(
        "--windows", default="0,0.5,2", help="coalescing windows in ms (default 0,0.5,2)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--evict",
        choices=("fadvise", "drop_caches"),
        default="fadvise",
        help="how to empty the mount's page cache before each run (default fadvise, per file)",
    )
    parser.add_argument(
        "--daemon-cache",
        default="4MiB",
        help="the mounts' --prefetch-memory (default 4MiB: room for the chunks being read, too small "
        "to keep a set from one run to the next)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workdir", default=None, help="keep everything here (default: a temporary dir, removed)"
    )
    parser.add_argument("--quick", action="store_true", help="600 files, 1 repeat (a smoke run)")
    args = parser.parse_args()
    args.readers = [int(x) for x in args.readers.split(",")]
    args.windows = [float(x) for x in args.windows.split(",")]
    if args.quick:
        args.files, args.repeats = 600, 1
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    if shutil.which("mpirun") is None:
        print("bench_cluster: mpirun is not installed", file=sys.stderr)
        return 2
    if args.workdir:
        workdir = Path(args.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=False)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="fanfs-bench-cluster-"))
    try:
        result = bench(args, workdir)
    except BenchError as exc:
        print("bench_cluster: %s" % exc, file=sys.stderr)
        return 1
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    out = RESULTS_DIR / ("bench_cluster-%s-%s.json" % (platform.node(), stamp))
    with open(out, "x") as f:  # never overwrite an earlier result
        json.dump({"meta": result.meta, "runs": [vars(r) for r in result.runs]}, f, indent=1)
        f.write("\n")
    print(table(result))
    print(
        "\n%d files per set (%s local, %s remote), %s; JSON: %s"
        % (
            result.meta["timed_files_per_set"],
            _mb(result.meta["bytes_per_set"]["local"]),
            _mb(result.meta["bytes_per_set"]["remote"]),
            result.meta["command"],
            out.relative_to(REPO_ROOT),
        )
    )
    return 0


def _fanfs_version() -> dict[str, Any]:
    """Which fanfs the mounts ran: module path, and the repository's commit and state."""
    import fanfs

    info: dict[str, Any] = {"module": str(Path(fanfs.__file__).parent)}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(REPO_ROOT)]
        info["commit"] = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            [*git, "status", "--porcelain", "fanfs"], capture_output=True, text=True, timeout=10
        ).stdout
        info["fanfs_dir_modified"] = bool(status.strip())
    return info


def _mb(n: int) -> str:
    return "%.1f MB" % (n / 1e6)


if __name__ == "__main__":
    sys.exit(main())
