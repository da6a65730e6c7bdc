"""Validate the compressor optimizer: the auto plan against every single codec on a mixed
dataset, under two budgets, with the read rate measured through the mount.

    .venv/bin/python tools/bench_codecs.py [--workdir DIR] [--rounds 7] [--readers 4]
        [--max-overhead 5%] [--target-share 0.95] [--time-budget 30]
    .venv/bin/python tools/bench_codecs.py --workdir DIR --measure-only --rounds 5   # reuse packs

The budgets (`--settings`; each one `fanfs pack --codec auto` run, checked under its own load):

- **sync** (`--mode sync --max-overhead 5%`): ONE synchronous reader, no prefetch, so every
  read waits for its decode. The planner's raw-read model (`--read-latency-ms`, `--read-mbps`)
  is fitted on that reader's per-file times through a mount of the raw pack: the time to read
  a raw sample is what reading it through fanfs costs. (By default the planner fits the model
  on reading SRC, the page cache with no FUSE in the way, which is 10-30 times faster per file
  and gives a much tighter budget: the model-only sweep printed at the end covers it.)
  Prediction: the epoch takes the raw epoch time plus the plan's one-thread decode seconds.
- **prefetch** (`--mode prefetch --target-rate SHARE x raw rate`): R reader processes keep both
  cores busy. The serving processes decode inline on the same cores that serve FUSE and run the
  readers, so at the target rate the cores left for decoding are cores x (1 - SHARE)
  (`--decode-cores`). Prediction: files/s = 1 / (1/raw + decode per file / cores).
- **sync-src** (`--mode sync --max-overhead 5%`, nothing else): the planner's default read
  model, fitted on reading SRC; one synchronous reader as for sync.

At the end, model only: the optimizer's selection and the best single codec over a range of
budgets, from the first setting's plan estimates (where mixing gains and where it cannot).

Steps: generate the dataset (deterministic per --seed); pack `none` and calibrate on it (the
sync read model, the raw rate of both loads); pack `auto` under each budget and every single
codec (pack time, size); then measure every pack under both loads in rounds. Each round
visits every (pack, load) in a freshly shuffled order and reads the raw pack under the same
load right before each visit (and once at the end), so that every epoch is compared with the
raw epochs next to it in time: the machine is shared and its load drifts within a round. Each
epoch runs on a fresh mount (`python -m fanfs mount`, read once its partitions are preloaded),
so every read decodes. Per epoch: the wall time; the CPU seconds of the mount's serving
processes (utime + stime from /proc); and the mount's own READ service time (`read_ns` in the
statistics it logs at unmount). A pack's excess over the neighbouring raw epochs measures its
decode cost: READ time is the finer measure with one reader (with several, concurrent READs
overlap and it counts their waits), serving CPU the coarser one (10 ms ticks) for any load.

A single codec "meets the budget (predicted)" when the plan's own per-class estimates for that
codec sum to at most the budget; "(measured)" when the median of its rate over the neighbouring
raw epochs' reaches 1 / (1 + budget / raw epoch time) (sync, sync-src) or SHARE (prefetch).
Every mount is unmounted in a `finally` (lazily as a last resort). Results:
results/bench_codecs-<host>-<time>.json and markdown tables on stdout; progress on stderr."""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import json
import math
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _benchlib
import numpy as np

from fanfs import _harness as harness

REPO = Path(__file__).resolve().parent.parent
FANFS = harness.FANFS
SINGLE = [
    "none",
    "lz4",
    "lz4hc:9",
    "zstd:1",
    "zstd:3",
    "zstd:6",
    "zstd:9",
    "zstd:12",
    "zstd:15",
    "zstd:19",
    "brotli:1",
    "brotli:5",
    "brotli:9",
    "brotli:11",
    "lzma:6",
]
CORES = os.cpu_count() or 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
SETTINGS = ("sync", "prefetch")


def log(msg: str, *args: object) -> None:
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg % args), file=sys.stderr, flush=True)


# --- dataset ----------------------------------------------------------------------------------


def _png(width: int, height: int, pixels: np.ndarray) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 per row
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _mask(rng: np.random.Generator) -> bytes:
    size = 192
    img = np.zeros((size, size), dtype=np.uint8)
    yy, xx = np.mgrid[0:size, 0:size]
    for _ in range(int(rng.integers(2, 6))):
        cy, cx, r = [*rng.integers(0, size, 2).tolist(), int(rng.integers(10, 60))]
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = int(rng.integers(1, 80))
    noise = rng.random((size, size)) < 0.02  # ragged annotation edges
    img[noise] = rng.integers(0, 80, int(noise.sum()))
    return _png(size, size, img)


WORDS = (
    "a the small red dog car on road grass two people near large white building with tree blue "
    "sky sitting standing holding man woman child table plate food"
).split()


# The dataset's mix (`--mix`). "coco" is the first one, unchanged since the first measurement:
# image-dominated like a detection dataset (41% of the bytes are JPEG/PNG, 3% small text).
# "balanced" gives each kind the issue names about a quarter of the bytes: images (JPEG, PNG),
# float arrays, text (captions, a token shard) and annotation JSON, whose records carry
# COCO-style segmentation polygons (1-12 objects per image; COCO 2017 averages 7.3; ~4 KB).
MIXES: dict[str, dict[str, Any]] = {
    "coco": {
        "images": 600,
        "masks": 800,
        "features": 300,
        "captions": 800,
        "ann": 3000,
        "objects": 4,
        "polygons": False,
    },
    "balanced": {
        "images": 300,
        "masks": 800,
        "features": 150,
        "captions": 3000,
        "ann": 5000,
        "objects": 12,
        "polygons": True,
    },
}


def _polygon(pr: random.Random) -> list[list[float]]:
    """One COCO-style segmentation: a closed outline of 16-48 points, 2 decimals."""
    cx, cy, r = pr.uniform(50, 590), pr.uniform(50, 430), pr.uniform(10, 120)
    n = pr.randint(16, 48)
    points: list[float] = []
    for k in range(n):
        angle = 2 * math.pi * k / n
        radius = r * pr.uniform(0.7, 1.0)
        points += [round(cx + radius * math.cos(angle), 2), round(cy + radius * math.sin(angle), 2)]
    return [points]


def make_dataset(root: Path, seed: int, mix: str = "coco") -> None:
    counts = MIXES[mix]
    rng = np.random.default_rng(seed)
    pr = random.Random(seed)
    for d in ("images", "masks", "features", "captions", "ann", "shards"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for i in range(counts["images"]):  # JPEG-like: entropy-coded bytes behind a JFIF header
        size = int(rng.integers(30_000, 90_000))
        (root / "images" / ("%05d.jpg" % i)).write_bytes(
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + rng.bytes(size) + b"\xff\xd9"
        )
    for i in range(counts["masks"]):
        (root / "masks" / ("%05d.png" % i)).write_bytes(_mask(rng))
    for i in range(counts["features"]):  # embeddings saved as float32 but holding float16 values
        values = rng.standard_normal(32 * 1024).astype(np.float16).astype("<f4")
        (root / "features" / ("%05d.npy" % i)).write_bytes(
            b"\x93NUMPY\x01\x00v\x00" + b" " * 118 + values.tobytes()
        )
    for i in range(counts["captions"]):
        lines = [
            " ".join(pr.choice(WORDS) for _ in range(pr.randint(8, 20))) + "."
            for _ in range(pr.randint(20, 50))
        ]
        (root / "captions" / ("%05d.txt" % i)).write_text("\n".join(lines))
    for i in range(counts["ann"]):
        annotations = []
        for _ in range(pr.randint(1, counts["objects"])):
            annotation: dict[str, Any] = {
                "bbox": [round(pr.uniform(0, 640), 1) for _ in range(4)],
                "category_id": pr.randrange(80),
                "iscrowd": 0,
                "area": round(pr.uniform(100, 90000), 2),
            }
            if counts["polygons"]:
                annotation["segmentation"] = _polygon(pr)
            annotations.append(annotation)
        record = {
            "image_id": i,
            "file_name": "%05d.jpg" % (i % counts["images"]),
            "height": 480,
            "width": 640,
            "annotations": annotations,
        }
        (root / "ann" / ("%05d.json" % i)).write_text(json.dumps(record))
    tokens = (rng.zipf(1.3, 6 * 1024 * 1024) % 50_000).astype("<u2")
    (root / "shards" / "tokens-000.bin").write_bytes(tokens.tobytes())


# --- mounts and readers -----------------------------------------------------------------------


def _cpu_s(pids: list[int]) -> float:
    """utime + stime of `pids` (each process's threads included), in seconds."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)
    return total / CLK_TCK


@contextlib.contextmanager
def mounted(pack: Path, mnt: Path, *, prefetch: bool = False) -> Iterator[tuple[list[int], Path]]:
    """A fresh mount of `pack`, yielded once its partitions are preloaded (or after 30 s).

    Demand decoding only by default: read-ahead and the background fill would decode ahead of
    the readers and hide the cost this benchmark checks against the plan (a decoded solid
    block's other files are still pushed into the page cache, as `--prefetch off` does since
    the balanced mode chose solid blocks). With `prefetch`,
    read-ahead is on (its decodes count in `decode_ns`, and solid blocks' other files are
    pushed into the page cache) but the fill is still off (no object cache).
    """
    mnt.mkdir(parents=True, exist_ok=True)
    log_path = mnt.parent / (mnt.name + ".log")
    log_path.unlink(missing_ok=True)
    try:
        # (Ctrl-C or SIGTERM held until the mount command is done: interrupted, it left the
        # mount its daemon brought up after, with nothing to unmount it)
        with _benchlib.signals_deferred():
            subprocess.run(
                [
                    *FANFS,
                    "mount",
                    str(pack),
                    str(mnt),
                    "--log",
                    str(log_path),
                    "--prefetch",
                    "on" if prefetch else "off",
                    "--cache-memory",
                    "0",
                ],
                check=True,
                timeout=120,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "preload" not in log_path.read_text():
            time.sleep(0.02)
        yield harness.serving_pids(mnt), log_path
    finally:
        if harness.mount_type(mnt) is not None:
            _unmount(mnt)


def _unmount(mnt: Path) -> None:
    result = subprocess.run(
        [*FANFS, "umount", str(mnt)], capture_output=True, timeout=60, check=False
    )
    if result.returncode != 0 or harness.mount_type(mnt) is not None:
        log("umount failed (%s); lazy unmount", result.stderr.decode().strip())
        subprocess.run([*FANFS, "umount", "--lazy", str(mnt)], check=False, timeout=60)


def read_and_drop(path: str | bytes | os.PathLike[str]) -> None:
    """Read a file whole in 1 MiB reads, then drop its pages from the page cache (the next
    read of it reaches the mount again)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, 1 << 20):
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _mount_stats(log_path: Path) -> dict[str, Any]:
    """The statistics the mount logs when it is unmounted (decode counters)."""
    for line in reversed(log_path.read_text().splitlines()):
        if "statistics: " in line:
            return ast.literal_eval(line.split("statistics: ", 1)[1])
    return {}


def _reader(paths: list[str], timed: bool, start: Any, out: Any) -> None:
    start.wait()
    total, times = 0, []
    for path in paths:
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
        finally:
            os.close(fd)
        if timed:
            times.append(time.perf_counter() - t0)
    out.put((total, paths if timed else None, times))


def read_epoch(
    mnt: Path, rels: list[str], readers: int, seed: int, timed: bool = False
) -> dict[str, Any]:
    """Read every file once with `readers` processes, in a shuffled order, unbuffered.
    Returns seconds, bytes, and with `timed` each file's read time (open to close)."""
    order = list(rels)
    random.Random(seed).shuffle(order)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_reader, args=([str(mnt / r) for r in order[i::readers]], timed, start, out)
        )
        for i in range(readers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    start.set()
    parts = [out.get(timeout=600) for _ in procs]
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise RuntimeError("reader failed")
    result: dict[str, Any] = {"seconds": elapsed, "bytes": sum(p[0] for p in parts)}
    if timed:
        prefix = len(str(mnt)) + 1
        result["file_s"] = {
            path[prefix:]: t for part in parts for path, t in zip(part[1], part[2], strict=True)
        }
    return result


def warm_pack(pack: Path) -> None:
    for part in sorted(pack.glob("part-*")):
        with open(part, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def epoch(
    pack: Path, mnt: Path, rels: list[str], readers: int, seed: int, timed: bool = False
) -> dict[str, Any]:
    """One cold epoch through a fresh mount: wall seconds, serving CPU seconds, decode counters."""
    warm_pack(pack)
    with mounted(pack, mnt) as (pids, log_path):
        cpu0 = _cpu_s(pids)
        result = read_epoch(mnt, rels, readers, seed, timed)
        result["cpu_s"] = _cpu_s(pids) - cpu0
        result["serving_processes"] = len(pids)
    stats = _mount_stats(log_path)
    keys = ("inline_decodes", "thread_decodes", "buffer_hits", "chunk_reads", "read_ns")
    result["stats"] = {k: stats.get(k) for k in keys}
    return result


# --- packs and plans --------------------------------------------------------------------------


def pack(src: Path, out: Path, codec_args: list[str]) -> float:
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    subprocess.run(
        [*FANFS, "pack", "-q", "-j", str(CORES), str(src), str(out), "--codec", *codec_args],
        check=True,
        timeout=3600,
    )
    return time.perf_counter() - t0


def pack_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


def pack_dir(work: Path, name: str) -> Path:
    return work / (name.replace(":", "-") + ".fan")


def recorded_plan(path: Path) -> dict[str, Any]:
    cmd = [*FANFS, "inspect", "--json", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["plan"]


def predicted(plan: dict[str, Any], codec: str) -> tuple[int, float] | None:
    """(projected bytes, one-thread decode seconds per epoch) of a single-codec pack, from the
    plan's per-class estimates; None if the plan did not profile `codec` for every class."""
    size, decode = 0, 0.0
    for row in plan["classes"]:
        ests = {c["codec"]: c for c in row["candidates"] if not c.get("solid")}
        if codec not in ests:
            return None
        size += ests[codec]["projected_bytes"]
        decode += ests[codec]["decode_s"]
    return size, decode


def fit_read_model(file_s: dict[str, float], sizes: dict[str, int]) -> tuple[float, float]:
    """Least-squares latency (s) and bandwidth (bytes/s) of t = L + size / BW."""
    from fanfs.optimizer import fit_read_model as fit

    model = fit([(sizes[rel], t) for rel, t in file_s.items()])
    return model.latency_s, model.bytes_per_s


# --- the benchmark ----------------------------------------------------------------------------


def budget_args(setting: str, cal: dict[str, Any], args: argparse.Namespace) -> list[str]:
    common = ["--time-budget", args.time_budget, "--seed", str(args.plan_seed)]
    if setting == "sync-src":  # the planner's default read model: fitted on reading SRC
        return ["--mode", "sync", "--max-overhead", args.max_overhead, *common]
    if setting == "sync":
        return [
            "--mode", "sync", "--max-overhead", args.max_overhead,
            "--read-latency-ms", "%.6f" % (cal["read_latency_s"] * 1e3),
            "--read-mbps", "%.3f" % (cal["read_bytes_per_s"] / 1e6),
            *common,
        ]  # fmt: skip
    return [
        "--mode", "prefetch",
        "--target-rate", "%.1f" % (args.target_share * cal["raw_rate_many"]),
        "--decode-cores", "%.4f" % (CORES * (1 - args.target_share)),
        *common,
    ]  # fmt: skip


def calibrate(
    work: Path, rels: list[str], sizes: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Epochs of the raw pack: the sync read model (one reader, per-file times) and the raw
    rate of the many-reader load."""
    none_pack, mnt = pack_dir(work, "none"), work / "mnt"
    per_file: dict[str, list[float]] = {r: [] for r in rels}
    one, many = [], []
    for rnd in range(args.calibrate_rounds):
        e = epoch(none_pack, mnt, rels, 1, seed=100 + rnd, timed=True)
        for rel, t in e["file_s"].items():
            per_file[rel].append(t)
        one.append(len(rels) / e["seconds"])
        many.append(
            len(rels) / epoch(none_pack, mnt, rels, args.readers, seed=100 + rnd)["seconds"]
        )
        log(
            "calibration %d: 1 reader %.0f files/s, %d readers %.0f files/s",
            rnd,
            one[-1],
            args.readers,
            many[-1],
        )
    latency, bandwidth = fit_read_model(
        {r: statistics.median(t) for r, t in per_file.items()}, sizes
    )
    cal = {
        "read_latency_s": latency,
        "read_bytes_per_s": bandwidth,
        "raw_rate_one": statistics.median(one),
        "raw_rate_many": statistics.median(many),
        "rates_one": one,
        "rates_many": many,
    }
    log(
        "read model %.1f us + size / %.0f MB/s; raw rates %.0f (1 reader), %.0f (%d readers) files/s",
        latency * 1e6,
        bandwidth / 1e6,
        cal["raw_rate_one"],
        cal["raw_rate_many"],
        args.readers,
    )
    return cal


def build_packs(
    work: Path, src: Path, cal: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    packs: dict[str, Any] = {}
    for setting in args.settings:
        path = pack_dir(work, "auto-" + setting)
        seconds = pack(src, path, ["auto", *budget_args(setting, cal, args)])
        plan = recorded_plan(path)
        packs["auto-" + setting] = {"pack_s": seconds, "bytes": pack_bytes(path), "plan": plan}
        codecs = ", ".join("%s=%s" % (r["class"], r["codec"]) for r in plan["classes"])
        log(
            "auto-%s: %.1f MB in %.1f s (profiling %.1f s): %s",
            setting,
            packs["auto-" + setting]["bytes"] / 1e6,
            seconds,
            plan["sample"]["seconds"],
            codecs,
        )
    for codec in args.codecs.split():
        path = pack_dir(work, codec)
        if codec == "none" and path.exists():
            seconds = args.none_pack_s
        else:
            seconds = pack(src, path, [codec])
        packs[codec] = {"pack_s": seconds, "bytes": pack_bytes(path)}
        log("%s: %.1f MB in %.1f s", codec, packs[codec]["bytes"] / 1e6, seconds)
    return packs


def measure(
    work: Path, rels: list[str], names: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """`rounds` rounds. Each visits every (pack, load) once, in an order shuffled per round, and
    reads the raw pack under the same load right before every visit and at the end: each
    epoch is compared with the raw epochs next to it in time, as the machine's load drifts."""
    mnt = work / "mnt"
    loads = sorted({_load(s, args) for s in args.settings})
    epochs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        visits = [(n, r) for n in names if n != "none" for r in loads]
        random.Random(1000 + rnd).shuffle(visits)
        sequence = [v for visit in visits for v in (("none", visit[1]), visit)] + [
            ("none", r) for r in loads
        ]
        t0 = time.monotonic()
        for name, readers in sequence:
            e = epoch(pack_dir(work, name), mnt, rels, readers, seed=rnd)
            if e["bytes"] != args.total_bytes:
                raise RuntimeError(
                    "%s: read %d bytes, expected %d" % (name, e["bytes"], args.total_bytes)
                )
            e.update(round=rnd, pack=name, readers=readers, seq=len(epochs))
            epochs.append(e)
        log(
            "round %d of %d in %.0f s; load average %s",
            rnd + 1,
            args.rounds,
            time.monotonic() - t0,
            " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        )
    return epochs


def _read_s(e: dict[str, Any]) -> float:
    """Seconds the mount spent serving READs in the epoch (its own counter), NaN if absent."""
    ns = e["stats"].get("read_ns")
    return ns / 1e9 if ns is not None else math.nan


def paired(
    epochs: list[dict[str, Any]], readers: int
) -> dict[str, list[tuple[dict[str, Any], dict[str, float]]]]:
    """Per pack, under the load of `readers`: each epoch with the mean wall, CPU and READ
    service seconds of the raw-pack epochs just before and after it (same load)."""
    seq = sorted((e for e in epochs if e["readers"] == readers), key=lambda e: e["seq"])
    out: dict[str, list[tuple[dict[str, Any], dict[str, float]]]] = {}
    for i, e in enumerate(seq):
        near = [e]
        if e["pack"] != "none":
            near = [next((x for x in reversed(seq[:i]) if x["pack"] == "none"), None),
                    next((x for x in seq[i + 1 :] if x["pack"] == "none"), None)]  # fmt: skip
            near = [x for x in near if x is not None]
        raw = {
            "seconds": statistics.mean(x["seconds"] for x in near),
            "cpu_s": statistics.mean(x["cpu_s"] for x in near),
            "read_s": statistics.mean(_read_s(x) for x in near),
        }
        out.setdefault(e["pack"], []).append((e, raw))
    return out


def per_class(work: Path, rels: list[str], packs: dict[str, Any], args: argparse.Namespace) -> None:
    """The cost model per class: READ service time of each class's files through the mount,
    over the raw pack's, against the plan's estimate for the codec the pack used there.

    One reader; each mount reads the class PASSES times (page cache dropped for each file with
    POSIX_FADV_DONTNEED after reading it), packs alternated, `--rounds` rounds, medians.
    """
    passes = 3
    plan = packs["auto-" + args.settings[0]]["plan"]
    names = ["none", *args.per_class.split(",")]
    classes = [row["class"] for row in plan["classes"]]
    known = frozenset(classes)
    coded = [
        row["class"] for row in plan["classes"] if any(c["decode_s"] for c in row["candidates"])
    ]
    from fanfs.optimizer import class_of

    members = {c: [r for r in rels if class_of(r.encode(), known) == c] for c in classes}
    read_s: dict[tuple[str, str], list[float]] = {}
    mnt = work / "mnt"
    for rnd in range(args.rounds):
        for cls in coded:  # incompressible classes are stored raw by every pack
            for name in names:
                pack_path = pack_dir(work, name)
                warm_pack(pack_path)
                with mounted(pack_path, mnt) as (_, log_path):
                    for _ in range(passes):
                        for rel in members[cls]:
                            read_and_drop(mnt / rel)
                read_s.setdefault((cls, name), []).append(
                    _mount_stats(log_path)["read_ns"] / 1e9 / passes
                )
        log("per-class round %d of %d", rnd + 1, args.rounds)
    print(
        "\n### Cost model per class: decode per epoch through the mount (READ time over the raw pack's) "
        "against the plan's estimate\n"
    )
    print(
        "| class | files | pack | codec there | estimated s | measured s | measured / estimated |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in plan["classes"]:
        cls = row["class"]
        if cls not in coded:
            continue
        base = statistics.median(read_s[(cls, "none")])
        for name in names[1:]:
            codec = (
                packs[name]["plan"]["classes"][classes.index(cls)]["codec"]
                if name.startswith("auto-")
                else name
            )
            est = next(
                (
                    c["decode_s"]
                    for c in row["candidates"]
                    if c["codec"] == codec and not c.get("solid")
                ),
                None,
            )
            got = statistics.median(read_s[(cls, name)]) - base
            if not est:
                continue
            print(
                "| %s | %d | %s | %s | %.4f | %.4f | %.2f |"
                % (cls, row["files"], name, codec, est, got, got / est)
            )


# --- the report -------------------------------------------------------------------------------


def _load(setting: str, args: argparse.Namespace) -> int:
    return args.readers if setting == "prefetch" else 1


def summarise(setting: str, res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Per pack, under `setting`'s load: size, predicted and measured decode and rates."""
    n, readers = res["files"], _load(setting, args)
    plan = res["packs"]["auto-" + setting]["plan"]
    budget = plan["budget_s"]
    pairs = paired(res["epochs"], readers)
    raw_s = [e["seconds"] for e, _ in pairs["none"]]
    raw_rate = n / statistics.median(raw_s)
    # In SINGLE's order (a results file's packs come back sorted by name).
    rank = {name: i for i, name in enumerate(SINGLE)}
    single_names = sorted(
        (p for p in res["packs"] if p != "none" and not p.startswith("auto-")),
        key=lambda p: (rank.get(p, len(rank)), p),
    )
    names = ["none", "auto-" + setting, *single_names]
    names += sorted(p for p in res["packs"] if p.startswith("auto-") and p != "auto-" + setting)
    threshold = args.target_share if setting == "prefetch" else 1 / (1 + budget * raw_rate / n)
    rows = []
    for name in names:
        pk = res["packs"][name]
        if name == "none":
            pred_size, pred_decode = res["bytes"], 0.0
        elif name.startswith("auto-"):
            pred_size, pred_decode = pk["plan"]["projected_bytes"], pk["plan"]["decode_s"]
        else:
            est = predicted(plan, name)
            pred_size, pred_decode = est if est else (None, None)
        if pred_decode is None:
            pred_ratio = None
        elif setting == "prefetch":
            pred_ratio = 1 / (1 + pred_decode * raw_rate / (n * CORES))
        else:  # one synchronous reader: the decode adds to the epoch
            pred_ratio = 1 / (1 + pred_decode * raw_rate / n)
        row = {
            "pack": name,
            "bytes": pk["bytes"],
            "pack_s": pk["pack_s"],
            "predicted_bytes": pred_size,
            "predicted_decode_s": pred_decode,
            "predicted_ratio": pred_ratio,
            "meets_predicted": pred_decode is not None and pred_decode <= budget * (1 + 1e-4),
            "measured": False,
        }
        eps = pairs.get(name, [])
        if eps:
            ratios = [raw["seconds"] / e["seconds"] for e, raw in eps]
            dcpu = [e["cpu_s"] - raw["cpu_s"] for e, raw in eps]
            dread = [_read_s(e) - raw["read_s"] for e, raw in eps]
            row.update(
                measured=True,
                measured_decode_cpu_s=statistics.median(dcpu),
                decode_cpu_s_rounds=dcpu,
                measured_decode_read_s=statistics.median(dread),
                decode_read_s_rounds=dread,
                rates=[n / e["seconds"] for e, _ in eps],
                rate=statistics.median([n / e["seconds"] for e, _ in eps]),
                ratios=ratios,
                ratio=statistics.median(ratios),
                meets_measured=statistics.median(ratios) >= threshold,
            )
        rows.append(row)
    auto = next(r for r in rows if r["pack"] == "auto-" + setting)
    singles = [r for r in rows if not r["pack"].startswith("auto-")]
    best_pred = min((r for r in singles if r["meets_predicted"]), key=lambda r: r["bytes"])
    best_meas = min(
        (r for r in singles if r["measured"] and r["meets_measured"]), key=lambda r: r["bytes"]
    )
    return {
        "setting": setting,
        "readers": readers,
        "budget_s": budget,
        "threshold_ratio": threshold,
        "raw_rate": raw_rate,
        "raw_rates": [n / s for s in raw_s],
        "rows": rows,
        "best_single_predicted": best_pred["pack"],
        "auto_smaller_pct": 100 * (1 - auto["bytes"] / best_pred["bytes"]),
        "best_single_measured": best_meas["pack"],
        "auto_smaller_than_measured_best_pct": 100 * (1 - auto["bytes"] / best_meas["bytes"]),
        "auto_rate_vs_predicted": auto["ratio"] / auto["predicted_ratio"],
        "auto_decode_cpu_vs_predicted": auto["measured_decode_cpu_s"] / auto["predicted_decode_s"]
        if auto["predicted_decode_s"]
        else None,
        "auto_decode_read_vs_predicted": auto["measured_decode_read_s"] / auto["predicted_decode_s"]
        if auto["predicted_decode_s"]
        else None,
    }


def print_summary(s: dict[str, Any], res: dict[str, Any], args: argparse.Namespace) -> None:
    what = {
        "sync": "sync, --max-overhead %s, read model of the raw mount" % args.max_overhead,
        "sync-src": "sync, --max-overhead %s, read model fitted on SRC (the planner's default)"
        % args.max_overhead,
        "prefetch": "prefetch, --target-rate %.0f files/s (%.2f x raw), --decode-cores %.2f"
        % (
            args.target_share * res["calibration"]["raw_rate_many"],
            args.target_share,
            res["cores"] * (1 - args.target_share),
        ),
    }[s["setting"]]
    print(
        "\n### %s: %s; %d reader(s); budget %.4f s of one-thread decode per epoch\n"
        % (s["setting"], what, s["readers"], s["budget_s"])
    )
    print(
        "| pack | size MB | ratio | pack s | predicted decode s | measured decode s (serving CPU / READ time) "
        "| files/s | vs raw (median [min, max]) | predicted vs raw | meets budget (predicted / measured) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in s["rows"]:
        measured = (
            "%.3f / %.3f | %.0f | %.2f [%.2f, %.2f]" % (
                r["measured_decode_cpu_s"], r["measured_decode_read_s"], r["rate"], r["ratio"], min(r["ratios"]),
                max(r["ratios"]))
            if r["measured"] else "- | - | -"
        )  # fmt: skip
        print(
            "| %s | %.1f | %.2fx | %.1f | %s | %s | %s | %s / %s |"
            % (
                "**%s**" % r["pack"] if r["pack"] == "auto-" + s["setting"] else r["pack"],
                r["bytes"] / 1e6,
                res["bytes"] / r["bytes"],
                r["pack_s"],
                "%.4f" % r["predicted_decode_s"] if r["predicted_decode_s"] is not None else "-",
                measured,
                "%.3f" % r["predicted_ratio"] if r["predicted_ratio"] is not None else "-",
                "yes" if r["meets_predicted"] else "no",
                ("yes" if r["meets_measured"] else "no") if r["measured"] else "-",
            )
        )
    raw = s["raw_rates"]
    auto = next(r for r in s["rows"] if r["pack"] == "auto-" + s["setting"])
    print()
    q1, _, q3 = statistics.quantiles(raw, n=4) if len(raw) > 1 else (raw[0], 0, raw[0])
    print(
        "raw pack: %d epochs, median %.0f files/s, quartiles %.0f-%.0f, range %.0f-%.0f; needed vs raw: %.3f"
        % (len(raw), s["raw_rate"], q1, q3, min(raw), max(raw), s["threshold_ratio"])
    )
    print(
        "best single codec within the budget (predicted): %s; auto %.1f%% smaller"
        % (s["best_single_predicted"], s["auto_smaller_pct"])
    )
    print(
        "best single codec within the budget (measured): %s; auto %.1f%% smaller"
        % (s["best_single_measured"], s["auto_smaller_than_measured_best_pct"])
    )
    print(
        "auto: measured %.3f of raw, predicted %.3f (measured/predicted %.2f); decode measured %.4f s "
        "(serving CPU) / %.4f s (READ time), predicted %.4f s"
        % (
            auto["ratio"],
            auto["predicted_ratio"],
            s["auto_rate_vs_predicted"],
            auto["measured_decode_cpu_s"],
            auto["measured_decode_read_s"],
            auto["predicted_decode_s"],
        )
    )


def sweep(plan: dict[str, Any], budgets: list[float]) -> list[dict[str, Any]]:
    """Model only: the auto plan and the best single codec at other budgets, from `plan`'s
    per-class estimates (the optimizer's own selection, no packing)."""
    from fanfs.optimizer import ClassProfile, Estimate, Objective, parse_candidates, select

    cands = {str(c): c for c in parse_candidates(" ".join(plan["settings"]["candidates"]))}
    profiles = [
        ClassProfile(row["class"], row["files"], row["bytes"], [
            Estimate(cands[e["codec"]], e["projected_bytes"], e["decode_s"], e["compress_s"], e["sample_units"],
                     e["sample_bytes"]) for e in row["candidates"] if not e.get("solid")])
        for row in plan["classes"]
    ]  # fmt: skip
    singles = {c: predicted(plan, c) for c in cands if not c.endswith("+dict")}
    out = []
    for budget in budgets:
        sel = select(profiles, Objective("sync", budget))
        size, name = min(
            (est[0], c) for c, est in singles.items() if est and est[1] <= budget * (1 + 1e-4)
        )
        out.append({
            "budget_s": budget,
            "auto_bytes": sel.stored_bytes,
            "auto_codecs": {
                row["class"]: str(e.candidate) for row, e in zip(plan["classes"], sel.choices, strict=True)
            },
            "best_single": name,
            "best_single_bytes": size,
            "gain_pct": 100 * (1 - sel.stored_bytes / size),
        })  # fmt: skip
    return out


def _small_text(row: dict[str, Any]) -> bool:
    """A class of small compressible objects (mean under 32 KiB, some codec shrinks it)."""
    small = row["bytes"] < 32 * 1024 * row["files"]
    return small and any(c["projected_bytes"] < row["bytes"] for c in row["candidates"])


def sensitivity(
    plan: dict[str, Any], scales: tuple[int, ...] = (1, 3, 10, 30)
) -> list[dict[str, Any]]:
    """Model only: the small-object classes scaled k-fold (files, bytes, estimates), and the
    largest gain of auto over the best single codec at any budget."""
    out = []
    for k in scales:
        rows = [
            dict(row, files=row["files"] * k, bytes=row["bytes"] * k, candidates=[
                dict(c, projected_bytes=c["projected_bytes"] * k, decode_s=c["decode_s"] * k)
                for c in row["candidates"]])
            if _small_text(row) else row
            for row in plan["classes"]
        ]  # fmt: skip
        scaled = dict(plan, classes=rows)
        total = sum(r["bytes"] for r in rows)
        top = max(
            sweep(scaled, np.geomspace(0.0005, 2.0, 120).tolist()), key=lambda r: r["gain_pct"]
        )
        out.append({
            "scale": k,
            "small_share": sum(r["bytes"] for r in rows if _small_text(r)) / total,
            "max_gain_pct": top["gain_pct"],
            "at_budget_s": top["budget_s"],
            "best_single": top["best_single"],
        })  # fmt: skip
    return out


def print_sweep(res: dict[str, Any]) -> None:
    marks = {round(res["packs"]["auto-" + s]["plan"]["budget_s"], 6): s for s in res["settings"]}
    marks.setdefault(round(res["default_plan"]["budget_s"], 6), "planner default")
    print("\n### Model only: auto against the best single codec over a range of budgets\n")
    print(
        "From the per-class estimates of the %s plan; single codecs whose estimated decode fits."
        % res["sweep_from"]
    )
    print()
    print("| decode budget s/epoch | setting | auto MB | best single | its MB | auto smaller by |")
    print("|---|---|---|---|---|---|")
    for row in res["sweep"]:
        print(
            "| %.4f | %s | %.1f | %s | %.1f | %.1f%% |"
            % (
                row["budget_s"],
                marks.get(round(row["budget_s"], 6), ""),
                row["auto_bytes"] / 1e6,
                row["best_single"],
                row["best_single_bytes"] / 1e6,
                row["gain_pct"],
            )
        )
    best = max(res["sweep"], key=lambda r: r["gain_pct"])
    print(
        "\nlargest gain %.1f%% at %.4f s (auto %s)"
        % (
            best["gain_pct"],
            best["budget_s"],
            ", ".join("%s=%s" % kv for kv in best["auto_codecs"].items()),
        )
    )
    print(
        "\nSensitivity (model only): the classes of small compressible files (%s) scaled k-fold; the largest "
        "gain of auto over the best single codec at any budget:\n"
        % ", ".join(
            r["class"]
            for r in res["packs"]["auto-" + res["sweep_from"]]["plan"]["classes"]
            if _small_text(r)
        )
    )
    print("| k | their share of the bytes | largest gain | at budget s | best single there |")
    print("|---|---|---|---|---|")
    for row in res["sensitivity"]:
        print(
            "| %d | %.1f%% | %.1f%% | %.4f | %s |"
            % (
                row["scale"],
                100 * row["small_share"],
                row["max_gain_pct"],
                row["at_budget_s"],
                row["best_single"],
            )
        )


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    """The tables (stdout) and the summaries, sweep and sensitivity (into `res`)."""
    print(
        "## bench_codecs: %d files, %.1f MB, %d cores, %d rounds"
        % (res["files"], res["bytes"] / 1e6, res["cores"], res["rounds"])
    )
    res["summaries"] = {}
    for setting in res["settings"]:
        res["summaries"][setting] = summarise(setting, res, args)
        print_summary(res["summaries"][setting], res, args)
    res["sweep_from"] = res["settings"][0]
    ref = res["packs"]["auto-" + res["sweep_from"]]["plan"]
    budgets = sorted(
        {
            *np.geomspace(0.001, 0.4, 22).tolist(),
            res["default_plan"]["budget_s"],
            *(res["packs"]["auto-" + s]["plan"]["budget_s"] for s in res["settings"]),
        }
    )
    res["sweep"] = sweep(ref, budgets)
    res["sensitivity"] = sensitivity(ref)
    print_sweep(res)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir",
        default=None,
        help="packs, mounts and the dataset (default /tmp/fanfs-bench-codecs[-MIX])",
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="interleaved measurement rounds (default 7)"
    )
    parser.add_argument("--calibrate-rounds", type=int, default=3)
    parser.add_argument(
        "--readers", type=int, default=4, help="reader processes of the prefetch load (default 4)"
    )
    parser.add_argument(
        "--settings",
        default="sync,prefetch",
        help="budgets to plan and check: sync, prefetch, sync-src (default sync,prefetch)",
    )
    parser.add_argument("--max-overhead", default="5%", help="sync budget (default 5%%)")
    parser.add_argument(
        "--target-share",
        type=float,
        default=0.95,
        help="prefetch: the job must get this share of the raw pack's rate (default 0.95)",
    )
    parser.add_argument("--codecs", default=" ".join(SINGLE))
    parser.add_argument(
        "--time-budget", default="30", help="the planner's --time-budget (default 30)"
    )
    parser.add_argument("--seed", type=int, default=1, help="dataset seed (default 1)")
    parser.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="coco",
        help="the dataset's mix of kinds (default coco; see MIXES)",
    )
    parser.add_argument("--plan-seed", type=int, default=0, help="the planner's --seed (default 0)")
    parser.add_argument(
        "--packs",
        default=None,
        metavar="LIST",
        help="measure only these single-codec packs (commas) besides none and the auto packs",
    )
    parser.add_argument(
        "--report",
        default=None,
        metavar="RESULTS",
        help="print the tables again from a results JSON of an earlier run; measure nothing",
    )
    parser.add_argument(
        "--per-class",
        default=None,
        metavar="PACKS",
        help="with --measure-only: check the cost model class by class on these packs "
        "(e.g. lz4,zstd:19,auto-sync) instead of the epoch measurements",
    )
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="reuse the packs and calibration in --workdir (packs.json); measure again",
    )
    args = parser.parse_args()
    args.settings = args.settings.split(",")
    if args.report:
        res = json.loads(Path(args.report).read_text())
        args.readers, args.target_share = res["readers"], res["target_share"]
        args.max_overhead = res["max_overhead"]
        report(res, args)
        return 0
    if not set(args.settings) <= {"sync", "prefetch", "sync-src"}:
        parser.error("--settings: sync, prefetch, sync-src")
    work = Path(
        args.workdir or "/tmp/fanfs-bench-codecs" + ("" if args.mix == "coco" else "-" + args.mix)
    )
    src = work / "src"
    marker = work / "mix"
    if marker.exists() and marker.read_text() != args.mix:
        parser.error(
            "%s holds the %r mix, not %r: choose another --workdir"
            % (work, marker.read_text(), args.mix)
        )
    if not src.exists():
        log("generating the dataset in %s", src)
        make_dataset(src, args.seed, args.mix)
        marker.write_text(args.mix)
    rels = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    sizes = {r: (src / r).stat().st_size for r in rels}
    args.total_bytes = sum(sizes.values())
    log("%d files, %.1f MB", len(rels), args.total_bytes / 1e6)
    state = work / "packs.json"
    if args.measure_only:
        saved = json.loads(state.read_text())
        cal, packs, default_plan = saved["calibration"], saved["packs"], saved["default_plan"]
        args.settings = [s for s in args.settings if "auto-" + s in packs]
    else:
        args.none_pack_s = pack(src, pack_dir(work, "none"), ["none"])
        cal = calibrate(work, rels, sizes, args)
        # What the planner does by default (sync 5%, read model fitted on SRC): the budget
        # shows in the model-only sweep.
        default_plan = json.loads(subprocess.run(
            [*FANFS, "plan", "--json", str(src), "--time-budget", args.time_budget, "--seed", str(args.plan_seed)],
            capture_output=True, text=True, check=True).stdout)  # fmt: skip
        packs = build_packs(work, src, cal, args)
        state.write_text(
            json.dumps({"calibration": cal, "packs": packs, "default_plan": default_plan})
        )
    if args.per_class:
        per_class(work, rels, packs, args)
        return 0
    res: dict[str, Any] = {
        "host": platform.node(),
        "mix": args.mix,
        "cores": CORES,
        "files": len(rels),
        "bytes": args.total_bytes,
        "rounds": args.rounds,
        "readers": args.readers,
        "settings": args.settings,
        "max_overhead": args.max_overhead,
        "target_share": args.target_share,
        "calibration": cal,
        "default_plan": default_plan,
        "packs": packs,
    }
    names = list(packs)
    if args.packs:
        keep = set(args.packs.split(","))
        names = [p for p in names if p == "none" or p.startswith("auto-") or p in keep]
    res["epochs"] = measure(work, rels, names, args)
    report(res, args)
    out_dir = REPO / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H-%M")
    path = out_dir / ("bench_codecs-%s-%s.json" % (platform.node(), stamp))
    path.write_text(json.dumps(res, indent=1, sort_keys=True))
    log("results in %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
