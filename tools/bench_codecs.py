"""Validate the compressor optimizer: the auto plan against every single codec on a mixed dataset.

    .venv/bin/python tools/bench_codecs.py [--workdir DIR] [--repeats 3] [--target-share 0.8]

1. Generates a mixed dataset (JPEG-like images, real PNG masks made with zlib, float16-valued
   feature arrays, captions, small JSON annotations, a token shard), deterministic per seed.
2. Packs it with `none` and measures the read rate through the mount under the reader load
   (R reader processes, every file read once in a shuffled order, unbuffered, a fresh mount per
   repeat so every read decodes; partitions in the page cache). That is the raw serving cost.
3. Sets a prefetch budget: the job must get `target-share` x the raw rate. On this machine the
   mount's serving processes decode inline on the same cores, so the cores left for decoding
   at the target rate are cores x (1 - target-share) (`--decode-cores`).
4. Packs with `--codec auto` under that budget and with every single codec (pack time, size),
   measures each through the mount, and compares: predicted decode seconds (from the plan's
   per-class estimates of each codec) against the decode cost implied by the measured rates.

Every mount is `python -m fanfs mount PACK MNT` and is unmounted with `python -m fanfs umount MNT`
in a `finally`, lazily as a last resort. Results go to results/bench_codecs-<host>-<time>.json;
a markdown table is printed. The machine is shared and noisy: medians of the repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
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

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FANFS = [sys.executable, "-m", "fanfs"]
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
        cy, cx, r = rng.integers(0, size, 2).tolist() + [int(rng.integers(10, 60))]
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = int(rng.integers(1, 80))
    noise = rng.random((size, size)) < 0.02  # ragged annotation edges
    img[noise] = rng.integers(0, 80, int(noise.sum()))
    return _png(size, size, img)


WORDS = (
    "a the small red dog car on road grass two people near large white building with tree blue "
    "sky sitting standing holding man woman child table plate food"
).split()


def make_dataset(root: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pr = random.Random(seed)
    for d in ("images", "masks", "features", "captions", "ann", "shards"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for i in range(600):  # JPEG-like: entropy-coded bytes behind a JFIF header
        size = int(rng.integers(30_000, 90_000))
        (root / "images" / ("%05d.jpg" % i)).write_bytes(
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + rng.bytes(size) + b"\xff\xd9"
        )
    for i in range(800):
        (root / "masks" / ("%05d.png" % i)).write_bytes(_mask(rng))
    for i in range(300):  # embeddings saved as float32 but holding float16 values
        values = rng.standard_normal(32 * 1024).astype(np.float16).astype("<f4")
        (root / "features" / ("%05d.npy" % i)).write_bytes(
            b"\x93NUMPY\x01\x00v\x00" + b" " * 118 + values.tobytes()
        )
    for i in range(800):
        lines = [
            " ".join(pr.choice(WORDS) for _ in range(pr.randint(8, 20))) + "."
            for _ in range(pr.randint(20, 50))
        ]
        (root / "captions" / ("%05d.txt" % i)).write_text("\n".join(lines))
    for i in range(3000):
        record = {
            "image_id": i,
            "file_name": "%05d.jpg" % (i % 600),
            "height": 480,
            "width": 640,
            "annotations": [
                {
                    "bbox": [round(pr.uniform(0, 640), 1) for _ in range(4)],
                    "category_id": pr.randrange(80),
                    "iscrowd": 0,
                    "area": round(pr.uniform(100, 90000), 2),
                }
                for _ in range(pr.randint(1, 4))
            ],
        }
        (root / "ann" / ("%05d.json" % i)).write_text(json.dumps(record))
    tokens = (rng.zipf(1.3, 6 * 1024 * 1024) % 50_000).astype("<u2")
    (root / "shards" / "tokens-000.bin").write_bytes(tokens.tobytes())


# --- mounts and readers -----------------------------------------------------------------------


def _mounted(mnt: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(mnt) for line in f)


@contextlib.contextmanager
def mounted(pack: Path, mnt: Path) -> Iterator[Path]:
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [*FANFS, "mount", str(pack), str(mnt), "--log", str(mnt) + ".log"], check=True, timeout=120
    )
    try:
        yield mnt
    finally:
        result = subprocess.run(
            [*FANFS, "umount", str(mnt)], capture_output=True, timeout=60, check=False
        )
        if result.returncode != 0 or _mounted(mnt):
            log("umount failed (%s); lazy unmount", result.stderr.decode().strip())
            subprocess.run([*FANFS, "umount", "--lazy", str(mnt)], check=False, timeout=60)


def _reader(paths: list[str], start: Any, out: Any) -> None:
    start.wait()
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
        finally:
            os.close(fd)
    out.put(total)


def read_epoch(mnt: Path, rels: list[str], readers: int, seed: int) -> tuple[float, int]:
    """Read every file once with `readers` processes; returns (seconds, bytes)."""
    order = list(rels)
    random.Random(seed).shuffle(order)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_reader, args=([str(mnt / r) for r in order[i::readers]], start, out))
        for i in range(readers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    start.set()
    total = sum(out.get(timeout=600) for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise RuntimeError("reader failed")
    return elapsed, total


def warm_pack(pack: Path) -> None:
    for part in sorted(pack.glob("part-*")):
        with open(part, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def measure_pack(pack: Path, mnt: Path, rels: list[str], args: argparse.Namespace) -> list[float]:
    """Files/s of `repeats` cold epochs, each through a fresh mount."""
    rates = []
    for rep in range(args.repeats):
        warm_pack(pack)
        with mounted(pack, mnt):
            seconds, _ = read_epoch(mnt, rels, args.readers, seed=rep)
        rates.append(len(rels) / seconds)
    return rates


# --- packs ------------------------------------------------------------------------------------


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


def predicted_decode_s(plan: dict[str, Any], codec: str) -> float | None:
    """One-thread decode seconds per epoch of a single-codec pack, from the plan's estimates."""
    total = 0.0
    for row in plan["classes"]:
        ests = {c["codec"]: c for c in row["candidates"]}
        if codec not in ests:
            return None
        total += ests[codec]["decode_s"]
    return total


def predicted_bytes(plan: dict[str, Any], codec: str) -> int | None:
    total = 0
    for row in plan["classes"]:
        ests = {c["codec"]: c for c in row["candidates"]}
        if codec not in ests:
            return None
        total += ests[codec]["projected_bytes"]
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/fanfs-bench-codecs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument(
        "--target-share",
        type=float,
        default=0.8,
        help="the job must get this share of the raw pack's read rate (default 0.8)",
    )
    parser.add_argument("--codecs", default=" ".join(SINGLE))
    parser.add_argument("--time-budget", default="60")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--remeasure", default=None, metavar="PACKS",
                        help="only measure these packs (e.g. none,auto,zstd:19) again, interleaved, "
                        "--repeats rounds; reuses the packs in --workdir (auto must exist)")
    args = parser.parse_args()
    if args.remeasure:
        return remeasure(Path(args.workdir), args.remeasure.split(","), args)
    work = Path(args.workdir)
    src, mnt = work / "src", work / "mnt"
    if not src.exists():
        log("generating the dataset in %s", src)
        make_dataset(src, args.seed)
    rels = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    total = sum((src / r).stat().st_size for r in rels)
    log("%d files, %.1f MB", len(rels), total / 1e6)

    results: dict[str, Any] = {
        "host": platform.node(),
        "cores": CORES,
        "files": len(rels),
        "bytes": total,
        "repeats": args.repeats,
        "readers": args.readers,
        "packs": {},
    }
    none_pack = work / "none.fan"
    results["packs"]["none"] = {
        "pack_s": pack(src, none_pack, ["none"]),
        "bytes": pack_bytes(none_pack),
    }
    rates = measure_pack(none_pack, mnt, rels, args)
    raw_rate = statistics.median(rates)
    results["packs"]["none"]["rates"] = rates
    target = args.target_share * raw_rate
    decode_cores = CORES * (1 - args.target_share)
    log(
        "raw pack: %.0f files/s (median of %s); target %.0f files/s, %.2f cores for decode",
        raw_rate,
        ["%.0f" % r for r in rates],
        target,
        decode_cores,
    )
    budget = [
        "--mode",
        "prefetch",
        "--target-rate",
        "%.1f" % target,
        "--decode-cores",
        "%.3f" % decode_cores,
        "--time-budget",
        args.time_budget,
    ]
    results.update(target_files_per_s=target, decode_cores=decode_cores, raw_rate=raw_rate)

    auto_pack = work / "auto.fan"
    results["packs"]["auto"] = {
        "pack_s": pack(src, auto_pack, ["auto", *budget]),
        "bytes": pack_bytes(auto_pack),
    }
    plan = json.loads(
        subprocess.run(
            [*FANFS, "inspect", "--json", str(auto_pack)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["plan"]
    results["plan"] = plan
    budget_s = plan["budget_s"]
    log("auto plan: %s", ", ".join("%s=%s" % (r["class"], r["codec"]) for r in plan["classes"]))
    results["packs"]["auto"]["rates"] = measure_pack(auto_pack, mnt, rels, args)
    results["packs"]["auto"]["predicted_decode_s"] = plan["decode_s"]
    results["packs"]["auto"]["predicted_bytes"] = plan["projected_bytes"]
    results["packs"]["none"]["predicted_decode_s"] = 0.0
    for codec in args.codecs.split():
        if codec == "none":
            continue
        out = work / (codec.replace(":", "-") + ".fan")
        entry = {
            "pack_s": pack(src, out, [codec]),
            "bytes": pack_bytes(out),
            "predicted_decode_s": predicted_decode_s(plan, codec),
            "predicted_bytes": predicted_bytes(plan, codec),
        }
        entry["rates"] = measure_pack(out, mnt, rels, args)
        results["packs"][codec] = entry
        shutil.rmtree(out)
        log(
            "%s: %.1f MB in %.1fs, %s files/s",
            codec,
            entry["bytes"] / 1e6,
            entry["pack_s"],
            ["%.0f" % r for r in entry["rates"]],
        )
    report(results, budget_s, raw_rate, target)
    out_dir = REPO / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H-%M")
    path = out_dir / ("bench_codecs-%s-%s.json" % (platform.node(), stamp))
    path.write_text(json.dumps(results, indent=1, sort_keys=True))
    log("results in %s", path)
    return 0


def remeasure(work: Path, names: list[str], args: argparse.Namespace) -> int:
    """Round-robin over the packs, one fresh-mount epoch each per round, so that a noisy spell
    on a shared machine hits every pack alike; prints every rate and the medians."""
    src, mnt = work / "src", work / "mnt"
    rels = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    packs = {n: work / (n.replace(":", "-") + ".fan") for n in names}
    for name, path in packs.items():
        if not path.exists():
            pack(src, path, [name])
    one = argparse.Namespace(repeats=1, readers=args.readers)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(args.repeats):
        for name, path in packs.items():
            rates[name] += measure_pack(path, mnt, rels, one)
        log("round %d: %s", rnd, ", ".join("%s %.0f" % (n, r[-1]) for n, r in rates.items()))
    raw = statistics.median(rates[names[0]])
    print("| pack | files/s, %d rounds | median | vs %s |" % (args.repeats, names[0]))
    print("|---|---|---|---|")
    for name, r in rates.items():
        print("| %s | %s | %.0f | %.2f |" % (name, ", ".join("%.0f" % x for x in r), statistics.median(r),
                                            statistics.median(r) / raw))
    return 0


def report(results: dict[str, Any], budget_s: float, raw_rate: float, target: float) -> None:
    n = results["files"]
    rows = []
    print(
        "| pack | size MB | ratio | pack s | files/s (median) | vs raw | predicted decode s/epoch | "
        "predicted files/s | measured decode s/epoch | meets budget (predicted / measured) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, e in results["packs"].items():
        rate = statistics.median(e["rates"])
        pred = e.get("predicted_decode_s")
        # CPU-bound on all cores: each file costs cores/raw_rate plus its decode / cores ... in
        # files/s: 1 / (1/raw + decode_per_file/cores).
        pred_rate = 1 / (1 / raw_rate + pred / n / results["cores"]) if pred is not None else None
        measured_decode = max(0.0, (1 / rate - 1 / raw_rate) * results["cores"] * n)
        meets_pred = (
            "yes"
            if pred is not None and pred <= budget_s * 1.0001
            else "no"
            if pred is not None
            else "?"
        )
        meets_meas = "yes" if rate >= target else "no"
        rows.append((name, e["bytes"], rate, pred, meets_pred, meets_meas))
        print(
            "| %s | %.1f | %.2fx | %.1f | %.0f | %.2f | %s | %s | %.3f | %s / %s |"
            % (
                name,
                e["bytes"] / 1e6,
                results["bytes"] / e["bytes"],
                e["pack_s"],
                rate,
                rate / raw_rate,
                "%.3f" % pred if pred is not None else "-",
                "%.0f" % pred_rate if pred_rate else "-",
                measured_decode,
                meets_pred,
                meets_meas,
            )
        )
    auto = next(r for r in rows if r[0] == "auto")
    fitting = [r for r in rows if r[0] not in ("auto",) and r[4] == "yes"]
    best = min(fitting, key=lambda r: r[1])
    print()
    print(
        "budget: %.0f files/s (%.3f s of one-thread decode per epoch); raw pack %.0f files/s"
        % (target, budget_s, raw_rate)
    )
    print(
        "best single codec within the budget (predicted): %s, %.1f MB; auto %.1f MB: %.1f%% smaller"
        % (best[0], best[1] / 1e6, auto[1] / 1e6, 100 * (1 - auto[1] / best[1]))
    )
    results["summary"] = {
        "best_single": best[0],
        "best_single_bytes": best[1],
        "auto_bytes": auto[1],
        "auto_smaller_pct": 100 * (1 - auto[1] / best[1]),
        "auto_rate": auto[2],
    }


if __name__ == "__main__":
    sys.exit(main())
