"""fanfs against squashfs and tar on a real mixed dataset built from Debian and PyPI packages.

    .venv/bin/python tools/bench_realdata.py [--cache /var/tmp/fanfs-realdata] [--quick]
        [--systems default,auto-balanced,auto-sync,auto-prefetch,auto-capacity,squashfs-zstd,...]
        [--per-class auto-balanced,auto-capacity [--epoch]] [--keep]

The dataset: package archives fetched with `apt-get download` (Debian) and `pip download`
(PyPI wheels), cached under `--cache`/archives, unpacked into `--cache`/tree-full (or
tree-quick), one top-level directory per package. Nothing is committed. It mixes real images
(wallpapers, clip art, GIMP patterns and brushes, JPEG XL test images as PNG/JPEG/PPM),
numeric arrays (ESO-MIDAS FITS test data, PyTables HDF5, DICOM from pydicom, NIfTI from
nibabel, ONNX tensors, seismic waveforms from obspy, astropy and scikit-image test data) and
many small text files (Python, Go and Perl sources, HTML docs, botocore's JSON models, Django, sympy,
ISO codes, word lists). The full set is about 1 GB, 60 k files; `--quick` about 150 MB.

Prints one markdown table (pack, ratio, size, time), the per-class ratios of each fanfs pack
(realised, from the pack itself), and with `--per-class PACKS` each coded class's decode through
the mount against the plan's prediction: one reader reads each class in walk order on a fresh
mount (read-ahead on, no object cache, the page cache dropped per file) once it has served one
file of every other class, and the daemon's own decode time for the class (`decode_ns`: verify
and decode) is taken, median of `--passes` mounts; the count of classes within 25% of their
prediction, and of those at most 25% over it, follow the table; when the default system is
built too, each class is also read from the default (zstd:3) pack in turn in each pass, and
its decode over the default's compared with the plan's ratio to its zstd:3 estimate, which
the host's drift and the mount's own costs leave alone. With
`--epoch`, each of those packs is also read whole once in a shuffled order across all classes
(read-ahead off, then on), as a training epoch reads it, against the plan's epoch; and when
the default system is built too, against the default pack's own epochs (`--epoch-repeats`
rounds, in turn): what the balanced mode promises, measured without the plan's model; and
each class's decode within such epochs (read-ahead off, the mount's decode trace,
FANFS_DECODE_TRACE, charged to each chunk's class; `--epoch-repeats` of them, each pack's in
turn with the default pack's): the plan's prediction in the scenario it models, cold caches between one
file of a class and the next.

Systems:
- default: `fanfs pack` (zstd:3)
- auto-balanced: `--codec auto` (the default mode: decode no slower in all than zstd:3)
- auto-sync: `--codec auto --mode sync` (decode may add 5% to reading SRC raw)
- auto-prefetch: `--codec auto --mode prefetch --target-rate 2000` (decode hidden on idle cores)
- auto-capacity: `--codec auto --mode prefetch --target-rate 500`, the capacity-leaning plan:
  a loader consuming 500 files/s leaves the cores time for slow, dense codecs
- auto-capacity-60s: the same with `--time-budget 60` (what more profiling buys)
- squashfs-zstd, squashfs-xz: `mksquashfs -comp zstd|xz` (defaults: zstd level 15, 128 KiB blocks)
- tar-zstd: `tar c | zstd -3 -T0` (a solid archive: no random access)

Results: `--cache`/results-<time>.json and the tables on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tools")]
import _benchlib  # noqa: E402
import bench_codecs  # noqa: E402  (its fresh-mount helper: read-ahead and caches off)

from fanfs.stats import read_stats  # noqa: E402

FANFS = [sys.executable, "-m", "fanfs"]
CORES = os.cpu_count() or 1

# Debian bookworm packages: (name, what it brings).
DEBS_FULL = (
    ("gnome-backgrounds", "JPEG/PNG wallpapers"),
    ("desktop-base", "PNG/SVG artwork"),
    ("openclipart-png", "PNG clip art, 10 k files"),
    ("gimp-data", "PNG patterns, brushes (raw pixels), scripts"),
    ("libjxl-testdata", "PNG/JPEG/PPM/PFM test images"),
    ("eso-midas-testdata", "FITS images and tables"),
    ("python-tables-data", "HDF5 test files"),
    ("python3-pydicom", "DICOM test files"),
    ("python3-nibabel", "NIfTI and other neuroimaging test data"),
    ("libonnx-testdata", "ONNX tensors (protobuf)"),
    ("python3.11-doc", "HTML documentation"),
    ("libpython3.11-stdlib", "Python sources"),
    ("python3-botocore", "JSON service models"),
    ("python3-django", "Python sources, translations"),
    ("python3-sympy", "Python sources"),
    ("python3-scipy", "Python sources, test arrays (.mat, .npz, .npy)"),
    ("golang-1.19-src", "Go sources, 10 k small files"),
    ("perl-modules-5.36", "Perl modules and POD"),
    ("ruby3.1-doc", "HTML documentation"),
    ("tzdata", "small binary time-zone files"),
    ("iso-codes", "JSON, translations"),
    ("wbritish-insane", "word list"),
    ("wamerican-huge", "word list"),
)
# PyPI wheels (pinned): test data shipped inside the packages.
WHEELS_FULL = (
    ("obspy==1.5.1", "seismic waveforms (MiniSEED, SAC, GSE2...)"),
    ("scikit-image==0.26.0", "sample images and arrays"),
    ("astropy==8.0.2", "FITS, VOTable, ASDF test data"),
    ("pydicom==2.4.4", "DICOM test files"),
)
DEBS_QUICK = (
    "desktop-base",
    "python3-pydicom",
    "python3-nibabel",
    "libonnx-testdata",
    "python3.11-doc",
    "iso-codes",
    "wamerican-huge",
)
WHEELS_QUICK = ("pydicom==2.4.4",)

SYSTEMS = (
    "default",
    "auto-balanced",
    "auto-sync",
    "auto-prefetch",
    "auto-capacity",
    "auto-capacity-60s",
    "squashfs-zstd",
    "squashfs-xz",
    "tar-zstd",
)
AUTO_ARGS = {
    "auto-balanced": ["--codec", "auto"],
    "auto-sync": ["--codec", "auto", "--mode", "sync"],
    "auto-prefetch": ["--codec", "auto", "--mode", "prefetch", "--target-rate", "2000"],
    "auto-capacity": ["--codec", "auto", "--mode", "prefetch", "--target-rate", "500"],
    # the same with 60 s of profiling instead of the default share of the pack time
    "auto-capacity-60s": [
        "--codec",
        "auto",
        "--mode",
        "prefetch",
        "--target-rate",
        "500",
        "--time-budget",
        "60",
    ],
}


def log(msg: str, *args: object) -> None:
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg % args), file=sys.stderr, flush=True)


# --- the dataset --------------------------------------------------------------------------------


def _fetch_debs(names: list[str], archives: Path) -> dict[str, Path]:
    archives.mkdir(parents=True, exist_ok=True)

    def found(name: str) -> Path | None:
        hits = sorted(archives.glob("%s_*.deb" % name))
        return hits[-1] if hits else None

    missing = [n for n in names if found(n) is None]
    if missing:
        log("apt-get download %s", " ".join(missing))
        subprocess.run(["apt-get", "download", *missing], cwd=archives, check=True)
    out = {}
    for n in names:
        path = found(n)
        if path is None:
            raise SystemExit("bench_realdata: apt-get download gave no archive for %s" % n)
        out[n] = path
    return out


def _fetch_wheels(reqs: list[str], archives: Path) -> dict[str, Path]:
    archives.mkdir(parents=True, exist_ok=True)

    def found(req: str) -> Path | None:
        name, _, version = req.partition("==")
        stem = name.replace("-", "_").lower()
        hits = [
            p
            for p in archives.glob("*.whl")
            if p.name.lower().startswith("%s-%s-" % (stem, version))
        ]
        return sorted(hits)[-1] if hits else None

    missing = [r for r in reqs if found(r) is None]
    if missing:
        log("pip download %s", " ".join(missing))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                str(archives),
                *missing,
            ],
            check=True,
        )
    out = {}
    for r in reqs:
        path = found(r)
        if path is None:
            raise SystemExit("bench_realdata: pip download gave no wheel for %s" % r)
        out[r.partition("==")[0]] = path
    return out


def build_dataset(cache: Path, quick: bool) -> Path:
    """Fetch (once) and unpack (once) the packages; returns the tree."""
    debs = list(DEBS_QUICK) if quick else [n for n, _ in DEBS_FULL]
    wheels = list(WHEELS_QUICK) if quick else [r for r, _ in WHEELS_FULL]
    tree = cache / ("tree-quick" if quick else "tree-full")
    stamp = tree / ".complete"
    wanted = "\n".join(sorted(debs + wheels))
    if stamp.exists() and stamp.read_text() == wanted:
        return tree
    deb_files = _fetch_debs(debs, cache / "archives" / "deb")
    wheel_files = _fetch_wheels(wheels, cache / "archives" / "pypi")
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    for name, path in deb_files.items():
        log("unpack %s", path.name)
        subprocess.run(["dpkg-deb", "-x", str(path), str(tree / name)], check=True)
    for name, path in wheel_files.items():
        log("unpack %s", path.name)
        with zipfile.ZipFile(path) as z:
            z.extractall(tree / ("pypi-" + name))
    # Symlinks and empty files stay (real trees have them); only regular files count below.
    stamp.write_text(wanted)
    (tree / ".complete").chmod(0o644)
    return tree


def tree_stats(tree: Path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(tree):
        for n in names:
            p = os.path.join(root, n)
            st = os.lstat(p)
            if os.path.isfile(p) and not os.path.islink(p):
                files += 1
                size += st.st_size
    return files, size


# --- packing ------------------------------------------------------------------------------------


def _timed(cmd: list[str], log_path: Path, **kw: Any) -> float:
    t0 = time.perf_counter()
    with open(log_path, "ab") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, **kw)
    return time.perf_counter() - t0


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def run_system(name: str, tree: Path, work: Path, reuse: bool = False) -> dict[str, Any]:
    """Pack `tree` with `name`; returns bytes, seconds and (fanfs) the pack's path. With
    `reuse`, a fanfs pack kept by an earlier run (`--keep`) is taken as it is (seconds: the
    pack's own plan record cannot tell, so NaN)."""
    kept = work / ("%s.fan" % name)
    if reuse and (kept / "fanfs.manifest").exists():
        return {"bytes": _du(kept), "seconds": float("nan"), "path": str(kept), "reused": True}
    logp = work / ("%s.log" % name)
    logp.unlink(missing_ok=True)
    src = str(tree)
    if name == "default" or name in AUTO_ARGS or name == "none":
        out = work / ("%s.fan" % name)
        if out.exists():
            shutil.rmtree(out)
        codec = AUTO_ARGS.get(name, ["--codec", "none"] if name == "none" else [])
        cmd = [*FANFS, "pack", "-j", str(CORES), "--skip-unreadable", src, str(out), *codec]
        seconds = _timed(cmd, logp)
        return {"bytes": _du(out), "seconds": seconds, "path": str(out)}
    if name.startswith("squashfs-"):
        out = work / ("%s.sqfs" % name)
        out.unlink(missing_ok=True)
        comp = name.split("-", 1)[1]
        cmd = ["mksquashfs", src, str(out), "-comp", comp, "-processors", str(CORES)]
        seconds = _timed([*cmd, "-no-progress", "-quiet"], logp)
        return {"bytes": _du(out), "seconds": seconds}
    if name == "tar-zstd":
        out = work / "tar-zstd.tar.zst"
        cmd = "tar -C %s -cf - . | zstd -3 -T0 -q -f -o %s" % (
            _quote(src),
            _quote(str(out)),
        )
        seconds = _timed(["bash", "-o", "pipefail", "-c", cmd], logp)
        return {"bytes": _du(out), "seconds": seconds}
    raise SystemExit("bench_realdata: unknown system %r" % name)


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def pack_summary(path: Path) -> dict[str, Any]:
    """`fanfs inspect --json`: the plan (with each class's realised bytes) if any."""
    out = subprocess.run(
        [*FANFS, "inspect", "--json", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


# --- decode through the mount -------------------------------------------------------------------


def _decode_ns(log_path: Path) -> float:
    return float(bench_codecs._mount_stats(log_path)["decode_ns"])


def _read_class(mnt: Path, rels: list[bytes]) -> None:
    # A loader scans its files before reading them (ImageFolder, a file list): the kernel then
    # knows their inodes, which a push into the page cache needs.
    for rel in rels:
        os.stat(os.path.join(bytes(mnt), rel))
    for rel in rels:
        bench_codecs.read_and_drop(os.path.join(bytes(mnt), rel))


def class_members(tree: Path, classes: list[str]) -> dict[str, list[bytes]]:
    sys.path.insert(0, str(REPO))
    from fanfs.optimizer import class_of

    known = frozenset(classes)
    out: dict[str, list[bytes]] = {c: [] for c in classes}
    base = len(bytes(tree)) + 1
    for root, _, names in os.walk(bytes(tree)):
        for n in names:
            p = os.path.join(root, n)
            if os.path.isfile(p) and not os.path.islink(p) and os.access(p, os.R_OK):
                rel = p[base:]
                if rel == b".complete":
                    continue
                out.setdefault(class_of(rel, known), []).append(rel)
    return out


def reference_pass_s(tree: Path, plan: dict[str, Any]) -> float:
    """The plan's reference pass done again now: zstd:3 measured on every class's sample,
    drawn as the plan drew it (same tree, chunk and block size, sample budget and seed). The
    plan record's `sample.reference_s` is the CPU time of the same work on the same bytes
    when the pack was planned, so the two tell how much slower or faster this shared host
    runs now than then."""
    sys.path.insert(0, str(REPO))
    from fanfs.optimizer import REFERENCE, sample_classes
    from fanfs.optimizer.measurement import measure_reference, measurement_cost
    from fanfs.pack import effective_block_size
    from fanfs.walk import sample_tree

    settings = plan["settings"]
    sample = sample_tree(str(tree), seed=settings["seed"], skip_unreadable=True)
    chunk_size = settings["chunk_size"]
    classes, _ = sample_classes(
        sample.files,
        chunk_size=chunk_size,
        block_size=effective_block_size(chunk_size, None),
        sample_bytes=settings["sample_bytes_budget"],
        seed=settings["seed"],
    )
    swept = measure_reference([c for c in classes if c.units], REFERENCE)
    return sum(measurement_cost(m) for m in swept.values())


Blocks = list[tuple[int, bytes, int, bytes | None]]


def class_blocks(pack: Path, rels: list[bytes]) -> Blocks:
    """The distinct stored objects that hold the files `rels` of a pack (a solid block once),
    as (codec, stored bytes, decoded size, dictionary)."""
    from fanfs.format.reader import PackReader
    from fanfs.hints import resolve

    reader = PackReader(str(pack))
    try:
        ix = reader.index
        seen: dict[object, tuple[int, bytes, int, bytes | None]] = {}
        for rel in rels:
            entry = resolve(ix, b"", rel)
            if entry < 0:
                continue
            for k in range(int(ix.count[entry])):
                cid = int(ix.first[entry]) + k
                bsize = int(ix.chunk_bsize[cid])
                key = ix.block_key(cid) if bsize else cid
                if key not in seen:
                    usize = bsize or reader.chunk_usize(entry, k)
                    stored = bytes(reader.read_stored(cid))
                    dic = reader.dictionary(int(ix.chunk_dict[cid]))
                    seen[key] = (int(ix.chunk_codec[cid]), stored, usize, dic)
        return list(seen.values())
    finally:
        reader.close()


def decode_outside(blocks: Blocks) -> float:
    """CPU seconds to verify (crc32) and decode `blocks` once each, back to back in this
    process: the same work the daemon times, outside the mount, at this moment."""
    from fanfs.compression import decompress
    from fanfs.format.layout import crc32

    start = time.thread_time()
    for codec, stored, usize, dic in blocks:
        crc32(stored)
        decompress(codec, stored, usize, dic)
    return time.thread_time() - start


def decode_through_mount(
    packs: dict[str, Path], tree: Path, plan: dict[str, Any], work: Path, passes: int
) -> dict[str, dict[str, float]]:
    """Decode seconds per class of each pack, as the daemon timed them (`decode_ns`: the CPU
    time of verifying and decoding, solid blocks and read-ahead included), medians of `passes`
    fresh mounts with read-ahead on and no object cache, the files read in walk order after a
    scan, once the mount has served one file of every other class and the page cache was
    dropped. Beside each mount, the class's stored objects are decoded once back to back in this
    process (`decode_outside`; key "outside:" + the pack's name), so that a class that decodes
    slower than predicted shows whether the mount or the host's speed at this moment did."""
    classes = [row["class"] for row in plan["classes"]]
    members = class_members(tree, classes)
    mnt = work / "mnt"
    out: dict[str, dict[str, float]] = {}
    for cls in classes:
        if not members.get(cls):
            continue
        times: dict[str, list[float]] = {}
        blocks = {name: class_blocks(path, members[cls]) for name, path in packs.items()}
        # The last file of every other class, read first: a fresh mount's first decodes
        # pay for its threads' codec contexts and its heap's first pages, once a mount and
        # not once a class (a 46-file class of 3 ms decoded in 9 ms on a fresh mount, 6 ms
        # read again on the same one).
        others = [members[c][-1] for c in classes if c != cls and members.get(c)]
        for _ in range(passes):
            for name, path in packs.items():
                with bench_codecs.mounted(path, mnt, prefetch=True):
                    _read_class(mnt, others)
                    _settle(mnt)
                    _benchlib.drop_caches()  # (read-ahead may have pushed the class's files)
                    before = read_stats(str(mnt))["decode_ns"]
                    _read_class(mnt, members[cls])
                    after = _settle(mnt)
                times.setdefault(name, []).append((after - before) / 1e9)
                times.setdefault("outside:" + name, []).append(decode_outside(blocks[name]))
        out[cls] = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return out


def _settle(mnt: Path) -> int:
    """The mount's `decode_ns` once read-ahead has stopped decoding (unchanged for 0.2 s)."""
    last = read_stats(str(mnt))["decode_ns"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = read_stats(str(mnt))["decode_ns"]
        if now == last:
            break
        last = now
    return int(last)


def shuffled_epoch(
    pack: Path, tree: Path, plan: dict[str, Any], work: Path, *, prefetch: bool, seed: int = 1
) -> float:
    """Decode seconds of one shuffled epoch through a fresh mount (`decode_ns`): every file of
    the dataset read once, whole, in a seeded random order across all classes, as a training
    loader reads. The scenario the plan predicts (a class's decode with cold caches, a solid
    block decoded for each member read), where `decode_through_mount` reads one class at a
    time in walk order."""
    members = class_members(tree, [row["class"] for row in plan["classes"]])
    files = sorted(rel for rels in members.values() for rel in rels)
    random.Random(seed).shuffle(files)
    with bench_codecs.mounted(pack, work / "mnt", prefetch=prefetch) as (_, log_path):
        _read_class(work / "mnt", files)
    return _decode_ns(log_path) / 1e9


def shuffled_epoch_per_class(
    pack: Path, tree: Path, plan: dict[str, Any], work: Path, seed: int = 1
) -> dict[str, float]:
    """Decode seconds per class within one shuffled epoch (`shuffled_epoch`'s order) through a
    fresh mount with read-ahead off: the mount's decode trace (FANFS_DECODE_TRACE: each
    decode's chunk and CPU ns, written at unmount) charged to each chunk's class. The
    scenario the plan predicts, one class at a time: its cold penalties are paid between
    files of other classes, where `decode_through_mount` reads a class alone and its
    dictionary and tables stay in the caches from one file to the next. A solid block is
    decoded once (its other members are pushed into the page cache; the plan's "walk").
    Nothing asks the mount anything between reads: a stats request after each file added
    16% to the epoch's decode, most of it to the classes of small files."""
    classes = [row["class"] for row in plan["classes"]]
    return traced_epoch(pack, class_members(tree, classes), work, seed)


def traced_epoch(
    pack: Path, members: dict[str, list[bytes]], work: Path, seed: int = 1
) -> dict[str, float]:
    """`shuffled_epoch_per_class` of the files `members` (by class, paths relative to the
    pack's root): every one read once in one seeded random order through a fresh mount with
    read-ahead off, the mount's decode trace charged to each chunk's class."""
    from fanfs.format.reader import PackReader
    from fanfs.hints import resolve
    from fanfs.runtime import DECODE_TRACE_ENV, read_decode_trace

    classes = list(members)
    owner = {rel: cls for cls, rels in members.items() for rel in rels}
    reader = PackReader(str(pack))
    try:
        ix = reader.index
        chunk_class = np.full(int(ix.chunk_count), -1, dtype=np.int64)
        for rel, cls in owner.items():
            entry = resolve(ix, b"", rel)
            if entry >= 0:
                first = int(ix.first[entry])
                chunk_class[first : first + int(ix.count[entry])] = classes.index(cls)
    finally:
        reader.close()
    files = sorted(owner)
    random.Random(seed).shuffle(files)
    mnt = work / "mnt"
    prefix = work / "decode-trace"
    for old in work.glob("decode-trace.*"):
        old.unlink()
    os.environ[DECODE_TRACE_ENV] = str(prefix)
    try:
        with bench_codecs.mounted(pack, mnt, prefetch=False) as (_, log_path):
            _read_class(mnt, files)
    finally:
        del os.environ[DECODE_TRACE_ENV]
    deadline = time.monotonic() + 30  # (the traces are written before the last statistics)
    while time.monotonic() < deadline and "statistics: " not in log_path.read_text():
        time.sleep(0.1)
    out = dict.fromkeys(members, 0.0)
    traced = 0
    for path in work.glob("decode-trace.*"):
        pairs = read_decode_trace(path)
        path.unlink()
        owners = chunk_class[pairs[:, 0]]
        for k, cls in enumerate(classes):
            out[cls] += float(pairs[owners == k, 1].sum()) / 1e9
        traced += int(pairs[:, 1].sum())
    total = _decode_ns(log_path)
    if abs(traced - total) > 1e-6 * max(total, 1):
        raise RuntimeError("decode trace %d ns against decode_ns %d" % (traced, total))
    return out


def epoch_per_class(
    results: dict[str, dict[str, Any]], name: str, tree: Path, work: Path, repeats: int
) -> None:
    """Each class's decode within shuffled epochs (`shuffled_epoch_per_class`) of the pack
    `name`, and of the default (zstd:3) pack in turn if there is one, `repeats` times; the
    medians against the plan's prediction, and against the default's (the plan's ratio to its
    zstd:3 estimate: the host's drift cancels)."""
    plan = results[name]["inspect"]["plan"]
    packs = {name: Path(results[name]["path"])}
    if results.get("default", {}).get("path"):
        packs["default"] = Path(results["default"]["path"])
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in packs}
    for _ in range(repeats):
        for n, path in packs.items():
            log("shuffled epoch per class: %s", n)
            runs[n].append(shuffled_epoch_per_class(path, tree, plan, work))
    got = {
        n: {cls: statistics.median(r[cls] for r in rs) for cls in rs[0]} for n, rs in runs.items()
    }
    results[name]["epoch_per_class"] = got
    results[name]["epoch_per_class_runs"] = runs
    print("\n### %s: decode per class within a shuffled epoch, through the mount\n" % name)
    print(
        "Every file once in one seeded random order, read-ahead off, the mount's decode trace "
        "charged to each chunk's class; medians of %d epochs%s. Predicted: the plan's decode "
        "for the class (a solid class's blocks each decoded once).\n"
        % (repeats, ", each pack's in turn with the default pack's" if "default" in got else "")
    )
    print(
        "| class | codec | predicted s | measured s | measured / predicted "
        "| predicted / zstd:3 | measured / default | ratio / ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    counts = dict.fromkeys(("d_hits", "d_under", "d_total"), 0)
    total_p = total_m = 0.0
    for row in plan["classes"]:
        cls = row["class"]
        if not row["decode_s"] or cls not in got[name]:
            continue
        p, m = predicted_decode(row), got[name][cls]
        total_p, total_m = total_p + p, total_m + m
        cells = ["-", "-", "-"]
        ref = [
            c["decode_s"] for c in row["candidates"] if c["codec"] == "zstd:3" and not c["solid"]
        ]
        default = got.get("default", {}).get(cls, 0.0)
        if ref and ref[0] and default > 0:
            ratio = m / default / (p / ref[0])
            cells = ["%.2f" % (p / ref[0]), "%.2f" % (m / default), "%.2f" % ratio]
            counts["d_hits"] += 0.75 <= ratio <= 1.25
            counts["d_under"] += ratio <= 1.25
            counts["d_total"] += 1
        print(
            "| %s | %s | %.3f | %.3f | %.2f | %s |"
            % (
                cls,
                row["codec"] + ("+solid" if row.get("solid") else ""),
                p,
                m,
                m / p,
                " | ".join(cells),
            )
        )
    print("| all | | %.3f | %.3f | %.2f | | | |" % (total_p, total_m, total_m / total_p))
    # (`_within` takes each class's measurements by pack name)
    by_class = {cls: {name: m} for cls, m in got[name].items()}
    hits, total, _, _, under = _within(plan, by_class, name, 1.0)
    # The host's speed now against when the plan measured, as the per-class table took it
    # (its reference pass timed again), if it ran: adjusted = measured x then / now.
    passes = results[name].get("reference_pass_s")
    adjusted = ""
    if passes and passes["now"] > 0:
        speed = passes["plan"] / passes["now"]
        a_hits, _, _, _, a_under = _within(plan, by_class, name, speed)
        adjusted = "; adjusted for the host (x %.2f), %d and %d" % (speed, a_hits, a_under)
    print(
        "\nWithin 25%% of the prediction: %d of %d classes, at most 25%% over it in %d%s."
        % (hits, total, under, adjusted)
    )
    if counts["d_total"]:
        print(
            "Against the default pack: within 25%% of the predicted ratio in %d of %d classes, "
            "at most 25%% over it in %d." % (counts["d_hits"], counts["d_total"], counts["d_under"])
        )
    if "default" in got:
        print(unchanged_classes(plan, got, name))
    for n, rs in runs.items():
        if len(rs) > 1:
            print(repeatability(n, rs, got[n]))


def unchanged_classes(plan: dict[str, Any], got: dict[str, dict[str, float]], name: str) -> str:
    """The classes the plan left with the default pack's codec (zstd:3, not in solid blocks):
    their decode within the pack's shuffled epoch over the default pack's, where the plan
    predicts 1.00. What is left is what the pack's mix of other codecs (dictionaries, brotli,
    zstd's dense levels, decoded between them) costs a class whose own codec did not change:
    a floor under the ratio of any class of the pack."""
    ratios = sorted(
        got[name][row["class"]] / got["default"][row["class"]]
        for row in plan["classes"]
        if row["codec"] == "zstd:3"
        and not row.get("solid")
        and got["default"].get(row["class"], 0.0) > 0
        and row["class"] in got[name]
    )
    if not ratios:
        return "%s left no class with zstd:3 alone." % name
    return (
        "%s left %d class%s with zstd:3 alone: measured at %.2f-%.2f (median %.2f) of the "
        "default pack's decode of %s, where the plan predicts 1.00."
        % (
            name,
            len(ratios),
            "" if len(ratios) == 1 else "es",
            ratios[0],
            ratios[-1],
            statistics.median(ratios),
            "it" if len(ratios) == 1 else "them",
        )
    )


def repeatability(name: str, runs: list[dict[str, float]], median: dict[str, float]) -> str:
    """The measurement's own floor: how many classes' decode, in every one of `runs` (the same
    pack's shuffled epochs minutes apart), came within 25% of its median; a prediction cannot
    be held to a tighter bar than the pack measured against itself."""
    steady = total = 0
    for cls, m in median.items():
        if m <= 0:
            continue
        total += 1
        steady += all(0.75 <= r[cls] / m <= 1.25 for r in runs)
    worst = max(
        (
            (max(r[cls] for r in runs) / min(r[cls] for r in runs), cls)
            for cls, m in median.items()
            if m > 0 and min(r[cls] for r in runs) > 0
        ),
        default=(1.0, "-"),
    )
    return (
        "%s against itself: every one of its %d epochs within 25%% of the median in %d of %d "
        "classes (widest: %s, %.2fx from its fastest epoch to its slowest)."
        % (name, len(runs), steady, total, worst[1], worst[0])
    )


def against_default(
    results: dict[str, dict[str, Any]], names: list[str], tree: Path, work: Path, repeats: int
) -> None:
    """The balanced mode's promise measured directly: shuffled epochs (`shuffled_epoch`, the
    same order) of each pack in `names` and of the default zstd:3 pack, in turn, `repeats`
    times with read-ahead off and then on, so that the host's drift moves them alike; the
    medians against the default's. (The plan compares with its own model of zstd:3, which
    left a dictionary's cold cost out: a balanced pack of 6a54d53's plan decoded 1.13-1.26x
    the default's epoch, docs/benchmarks.md "2026-11-27, evening".)"""
    plan = results[names[0]]["inspect"]["plan"]  # (its classes cover every file)
    everyone = ["default", *names]
    print("\n### The same shuffled epoch against the default pack's\n")
    print(
        "Each pack and the default (zstd:3) pack read in turn, %d times per read-ahead "
        "setting, fresh mounts; medians.\n" % repeats
    )
    print("| pack | MB | read-ahead | epochs s | median s | / default |")
    print("|---|---|---|---|---|---|")
    for prefetch in (False, True):
        times: dict[str, list[float]] = {n: [] for n in everyone}
        for _ in range(repeats):
            for n in everyone:
                log("epoch against the default: %s, read-ahead %s", n, prefetch)
                path = Path(results[n]["path"])
                times[n].append(shuffled_epoch(path, tree, plan, work, prefetch=prefetch))
        base = statistics.median(times["default"])
        for n in everyone:
            med = statistics.median(times[n])
            results[n]["epoch_vs_default_readahead" if prefetch else "epoch_vs_default"] = med
            print(
                "| %s | %s | %s | %s | %.3f | %.2f |"
                % (
                    n,
                    _mb(results[n]["bytes"]),
                    "on" if prefetch else "off",
                    " ".join("%.3f" % t for t in times[n]),
                    med,
                    med / base,
                )
            )
    print()
    for n in names:
        plan = results[n]["inspect"]["plan"]
        cold = plan.get("sample", {}).get("cold") if plan else None
        if cold:
            print(
                "%s: cold costs from a mount of the sample for %d classes, brotli's for %d, "
                "with their dictionaries for %d (%.1f s)%s."
                % (
                    n,
                    len(cold["mounted_classes"]),
                    len(cold.get("brotli_classes", ())),
                    len(cold.get("dictionary_classes", ())),
                    cold["mount_s"],
                    "; the method for the rest" + (" (%s)" % cold["note"] if cold["note"] else ""),
                )
            )
        if (
            plan.get("mode") == "balanced"
            and plan.get("budget_s")
            and plan["sample"].get("reference_s")
        ):
            # The balanced budget is the plan's own projection of zstd:3; inflated against
            # the default pack's real epoch, it lets the plan buy slow codecs with seconds
            # only its model had (docs/benchmarks.md, "2026-11-27, late night").
            print(
                "%s: the plan's budget (its zstd:3 epoch) is %.2fx its reference pass and %.2fx "
                "the default pack's measured epoch (read-ahead on)."
                % (
                    n,
                    plan["budget_s"] / plan["sample"]["reference_s"],
                    plan["budget_s"] / results["default"]["epoch_vs_default_readahead"],
                )
            )
            if plan.get("warm_budget_s"):
                print(
                    "%s: with hot caches, the plan decodes %.3f s of a %.3f s budget; with "
                    "the cold penalties, %.3f s of %.3f s."
                    % (
                        n,
                        plan["warm_decode_s"],
                        plan["warm_budget_s"],
                        plan["decode_s"],
                        plan["budget_s"],
                    )
                )


def _within(
    plan: dict[str, Any], got: dict[str, dict[str, float]], name: str, speed: float
) -> tuple[int, int, int, int, int]:
    """Classes whose measured decode (times `speed`) is within 25% of the plan's walk-order
    prediction: of all measured, all measured; of those predicted at 0.05 s or more, those;
    and of all, those that decode at most 25% over it (within their share of the budget)."""
    hits = total = big_hits = big = under = 0
    for row in plan["classes"]:
        if not row["decode_s"] or row["class"] not in got:
            continue
        p = predicted_decode(row)
        ratio = got[row["class"]][name] * speed / p
        ok = 0.75 <= ratio <= 1.25
        hits, total, under = hits + ok, total + 1, under + (ratio <= 1.25)
        if p >= 0.05:
            big_hits, big = big_hits + ok, big + 1
    return hits, total, big_hits, big, under


def against_default_per_class(
    plan: dict[str, Any], got: dict[str, dict[str, float]], name: str
) -> None:
    """Each class's decode through the mount over the default (zstd:3) pack's decode of the
    same files, read in turn on fresh mounts in each pass (`decode_through_mount`), against
    the plan's own ratio: its prediction for the class over its zstd:3 estimate (the
    reference the balanced budget is made of). The host's speed, which drifts by a quarter
    between the plan and the reading, and the mount's own cost per request cancel out of
    both ratios; what is left is the model's claim that one codec decodes so much faster or
    slower than zstd:3 on this class."""
    print("\n### %s: decode per class against the default pack's, through the mount\n" % name)
    print(
        "Each class read on fresh mounts of both packs in turn (medians of the passes); "
        "predicted: the plan's decode for the class over its zstd:3 estimate.\n"
    )
    print("| class | codec | predicted / zstd:3 | measured / default | measured / predicted |")
    print("|---|---|---|---|---|")
    hits = under = total = 0
    for row in plan["classes"]:
        ref = [
            c["decode_s"] for c in row["candidates"] if c["codec"] == "zstd:3" and not c["solid"]
        ]
        if not row["decode_s"] or row["class"] not in got or not ref or not ref[0]:
            continue
        mine, default = got[row["class"]][name], got[row["class"]]["default"]
        if default <= 0:
            continue
        p = predicted_decode(row) / ref[0]
        ratio = mine / default / p
        hits, under, total = hits + (0.75 <= ratio <= 1.25), under + (ratio <= 1.25), total + 1
        print(
            "| %s | %s | %.2f | %.2f | %.2f |"
            % (
                row["class"],
                row["codec"] + ("+solid" if row.get("solid") else ""),
                p,
                mine / default,
                ratio,
            )
        )
    print(
        "\nAgainst the default pack: within 25%% of the predicted ratio in %d of %d classes, "
        "at most 25%% over it in %d." % (hits, total, under)
    )


def predicted_decode(row: dict[str, Any], order: str = "walk") -> float:
    """The plan's decode seconds for one class (a row of its `classes`), a solid class's as
    read in `order` ("random": each member decodes its block; "walk": each block once)."""
    return float((row.get("solid_decode_s") or {}).get(order, row["decode_s"]))


def predicted_epoch(plan: dict[str, Any], order: str) -> float:
    """The plan's decode seconds for an epoch: every class's (`predicted_decode`)."""
    return sum(predicted_decode(row, order) for row in plan["classes"])


# --- the report ---------------------------------------------------------------------------------


def _mb(n: float) -> str:
    return "%.1f" % (n / 1e6)


def main() -> int:
    # Ctrl-C and SIGTERM end the run through its `finally`s, so no mount is left behind: a
    # run started in the background by a non-interactive shell has SIGINT ignored, and
    # SIGTERM's default kills it where it stands.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _benchlib.install_signal_handlers()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/var/tmp/fanfs-realdata"))
    ap.add_argument("--quick", action="store_true", help="a ~150 MB subset")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument(
        "--per-class",
        default="",
        metavar="SYSTEMS",
        help="auto packs (e.g. auto-balanced,auto-capacity) to measure per class through the mount",
    )
    ap.add_argument(
        "--passes",
        type=int,
        default=3,
        help="mounts per class with --per-class (0: no per-class table, for --epoch alone)",
    )
    ap.add_argument(
        "--epoch",
        action="store_true",
        help="with --per-class: also read each pack's whole dataset once in a shuffled order "
        "(read-ahead off, then on) and compare its decode with the plan's epoch; and each "
        "class's decode within such epochs (--epoch-repeats of them)",
    )
    ap.add_argument(
        "--epoch-repeats",
        type=int,
        default=3,
        metavar="N",
        help="with --epoch and the default system: shuffled epochs of each pack and of the "
        "default (zstd:3) pack, in turn, N times; medians against the default's",
    )
    ap.add_argument("--keep", action="store_true", help="keep the packs")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="take the fanfs packs an earlier --keep run left instead of packing again (for "
        "--per-class on new mount code; implies --keep)",
    )
    args = ap.parse_args()
    if args.epoch_repeats < 1 or args.passes < 0:
        ap.error("--epoch-repeats must be at least 1 and --passes at least 0")
    if args.per_class and args.passes > 0 and os.geteuid() != 0:
        ap.error("--per-class drops the page cache between a class's reads: run it as root")
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    os.environ["PYTHONPATH"] = str(REPO)
    tree = build_dataset(args.cache, args.quick)
    files, size = tree_stats(tree)
    log("dataset %s: %d files, %.1f MB", tree, files, size / 1e6)
    work = args.cache / ("work-quick" if args.quick else "work-full")
    work.mkdir(parents=True, exist_ok=True)
    systems = [s for s in args.systems.split(",") if s]
    results: dict[str, dict[str, Any]] = {}
    for name in systems:
        log("pack %s", name)
        results[name] = run_system(name, tree, work, reuse=args.reuse)
        log("  %s: %.1f MB in %.0f s", name, results[name]["bytes"] / 1e6, results[name]["seconds"])
        if "path" in results[name]:
            results[name]["inspect"] = pack_summary(Path(results[name]["path"]))
    print("\n## Real mixed dataset: %d files, %.1f MB (%s)\n" % (files, size / 1e6, tree))
    print("| pack | ratio (source / pack) | MB | pack s | plan s | decode budget used |")
    print("|---|---|---|---|---|---|")
    for name in systems:
        r = results[name]
        plan = (r.get("inspect") or {}).get("plan")
        plan_s = "%.0f" % plan["sample"]["seconds"] if plan else "-"
        used = (
            "%.0f%%" % (100 * plan["decode_s"] / plan["budget_s"])
            if plan and plan.get("budget_s")
            else "-"
        )
        print(
            "| %s | %.3fx | %s | %.0f | %s | %s |"
            % (name, size / r["bytes"], _mb(r["bytes"]), r["seconds"], plan_s, used)
        )
    auto = [n for n in systems if n in AUTO_ARGS]
    if auto:
        plan0 = results[auto[0]]["inspect"]["plan"]
        print("\n### Per class: realised ratio (codec)\n")
        print("| class | files | MB | " + " | ".join(auto) + " |")
        print("|---|---|---|" + "---|" * len(auto))
        for i, row in enumerate(plan0["classes"]):
            cells = []
            for n in auto:
                crow = results[n]["inspect"]["plan"]["classes"][i]
                real = crow.get("realised") or {}
                ratio = (
                    real["bytes_in"] / real["bytes_out"] if real.get("bytes_out") else crow["ratio"]
                )
                cells.append(
                    "%.2fx %s" % (ratio, crow["codec"] + ("+solid" if crow.get("solid") else ""))
                )
            print(
                "| %s | %d | %s | %s |"
                % (row["class"], row["files"], _mb(row["bytes"]), " | ".join(cells))
            )
    checked = [n for n in args.per_class.split(",") if n in auto]
    packs = {n: Path(results[n]["path"]) for n in checked}
    if checked and args.passes > 0:
        for n in checked:
            log("per-class decode through the mount: %s", n)
            plan = results[n]["inspect"]["plan"]
            before = reference_pass_s(tree, plan)
            # Beside the default (zstd:3) pack, read in turn in each pass: the host's drift
            # moves both alike (`against_default_per_class`).
            beside = {"default": Path(results["default"]["path"])} if "default" in results else {}
            got = decode_through_mount({n: packs[n], **beside}, tree, plan, work, args.passes)
            now = (before + reference_pass_s(tree, plan)) / 2
            then = plan["sample"]["reference_s"]
            # Measured x then / now: the decode as the host ran when the plan measured.
            speed = then / now if now > 0 else 1.0
            results[n]["through_mount"] = got
            results[n]["reference_pass_s"] = {"plan": then, "now": now}
            print("\n### %s: decode per class through the mount against the plan\n" % n)
            print(
                "The plan's reference pass took %.2f s of CPU when planned, %.2f s now (mean of "
                "before and after): adjusted = measured x %.2f." % (then, now, speed)
            )
            print()
            print(
                "Outside: the class's stored objects verified and decoded once each, back to "
                "back in the benchmark's process, beside each mount (the same work, no mount)."
            )
            print()
            print(
                "| class | codec | predicted s | measured s | measured / predicted | "
                "adjusted / predicted | outside s | measured / outside | outside / predicted "
                "| MB/s |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
            total_p = total_m = total_o = 0.0
            for row in plan["classes"]:
                if not row["decode_s"] or row["class"] not in got:
                    continue
                m = got[row["class"]][n]
                o = got[row["class"]]["outside:" + n]
                # A solid class read in walk order decodes each block once (the plan's "walk").
                p = predicted_decode(row)
                total_p, total_m, total_o = total_p + p, total_m + m, total_o + o
                print(
                    "| %s | %s | %.3f | %.3f | %.2f | %.2f | %.3f | %.2f | %.2f | %.0f |"
                    % (
                        row["class"],
                        row["codec"] + ("+solid" if row.get("solid") else ""),
                        p,
                        m,
                        m / p,
                        m * speed / p,
                        o,
                        m / o if o > 0 else float("inf"),
                        o / p,
                        row["bytes"] / m / 1e6 if m > 0 else float("inf"),
                    )
                )
            print(
                "| all | | %.3f | %.3f | %.2f | %.2f | %.3f | %.2f | %.2f | |"
                % (
                    total_p,
                    total_m,
                    total_m / total_p,
                    total_m * speed / total_p,
                    total_o,
                    total_m / total_o,
                    total_o / total_p,
                )
            )
            hits, total, big_hits, big, under = _within(plan, got, n, 1.0)
            adjusted = _within(plan, got, n, speed)
            print(
                "\nWithin 25%% of the prediction: %d of %d classes (%d of the %d predicted to "
                "decode for 0.05 s or more); adjusted, %d of %d. At most 25%% over it: %d of "
                "%d (adjusted, %d)."
                % (hits, total, big_hits, big, adjusted[0], total, under, total, adjusted[4])
            )
            # The plan's model against the pack's own objects, without the mount: what the
            # prediction misses there is the model's (sampling, projection); the rest of
            # "measured / predicted" is what the mount pays on top.
            outside = _within(plan, got, "outside:" + n, 1.0)
            print(
                "The class's own objects decoded outside the mount: within 25%% of the "
                "prediction in %d of %d classes, at most 25%% over it in %d."
                % (outside[0], outside[1], outside[4])
            )
            if beside:
                against_default_per_class(plan, got, n)
    if checked and args.epoch:
        print("\n### A shuffled epoch through the mount against the plan\n")
        print(
            "Every file once, whole, in one seeded random order across all classes; a fresh "
            "mount for each. Predicted: the plan's epoch with each solid class's members each "
            "decoding their block (random) or each block decoded once (walk).\n"
        )
        print(
            "| pack | read-ahead | measured s | predicted s (random) | measured / predicted "
            "| predicted s (walk) | measured / predicted |"
        )
        print("|---|---|---|---|---|---|---|")
        for n in checked:
            plan = results[n]["inspect"]["plan"]
            rand, walk = predicted_epoch(plan, "random"), predicted_epoch(plan, "walk")
            for prefetch in (False, True):
                log("shuffled epoch through the mount: %s, read-ahead %s", n, prefetch)
                got = shuffled_epoch(packs[n], tree, plan, work, prefetch=prefetch)
                results[n]["epoch_readahead" if prefetch else "epoch"] = got
                print(
                    "| %s | %s | %.3f | %.3f | %.2f | %.3f | %.2f |"
                    % (n, "on" if prefetch else "off", got, rand, got / rand, walk, got / walk)
                )
        if results.get("default", {}).get("path"):
            against_default(results, checked, tree, work, args.epoch_repeats)
        for n in checked:
            epoch_per_class(results, n, tree, work, args.epoch_repeats)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    res_path = args.cache / ("results-%s.json" % stamp)
    res_path.write_text(
        json.dumps({"files": files, "bytes": size, "results": results}, indent=1, default=str)
    )
    log("results in %s", res_path)
    if not args.keep and not args.reuse:
        for r in results.values():
            p = Path(r.get("path", ""))
            if r.get("path") and p.exists():
                shutil.rmtree(p)
        for p in work.glob("*.sqfs"):
            p.unlink()
        for p in work.glob("*.tar.zst"):
            p.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
