"""The compressor-selection optimizer: profile a dataset's classes of files, then choose one
codec per class (`fanfs plan`, `fanfs pack --codec auto`).

Owns the class rule (extension x top-level directory, rare classes merged), the stratified
and seeded sample, the measurement of every candidate codec on it (ratio, single-thread
decode and compress speed; the measuring function is a parameter so tests inject numbers),
the cost model of the two modes (sync, prefetch) and of the capacity dual, and the exact
multiple-choice knapsack solver. Never writes a pack and never prints: pack.py and plan.py do.
The model and its assumptions are in docs/architecture.md, "Compressor optimizer".
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from fanfs.compression import (
    CODEC_BROTLI,
    CODEC_LZ4,
    CODEC_LZMA,
    CODEC_NONE,
    CODEC_ZSTD,
    DICT_CODECS,
    CodecSpec,
    compress_object,
    decompress,
    looks_incompressible,
    parse_codec,
    train_dictionary,
)
from fanfs.errors import UsageError
from fanfs.format.layout import chunk_count

log = logging.getLogger(__name__)

# Candidates profiled by default. zstd levels: decode speed barely depends on the level, so a
# subset spans the ratio/compress-time curve; dictionaries only help small objects: lz4hc
# with a dictionary keeps lz4's decode speed (about 4 us per 4 KB JSON record here, a zstd
# frame costs twice that) and takes such records from 1.6x to 2.3x. The byte shuffles help
# numeric arrays (float32 embeddings holding float16 values: lz4hc:9 1.40x, +shuf4 1.77x;
# a smooth float32 field: 1.00x and 1.34x) and cost the unshuffle (about 3 GB/s).
DEFAULT_CODECS: Final = (
    "none lz4 lz4hc:9 lz4hc:9+dict zstd:1 zstd:3 zstd:6 zstd:9 zstd:12 zstd:15 zstd:19 "
    "zstd:3+dict zstd:9+dict zstd:19+dict brotli:1 brotli:5 brotli:9 brotli:11 lzma:6 "
    "lz4+shuf4 lz4hc:9+shuf4 zstd:1+shuf4 zstd:19+shuf4 lz4hc:9+shuf2 zstd:1+shuf2"
)
# A class whose typical (median) object is larger than this gets no dictionary candidate:
# a dictionary only supplies context to the first KiBs of an object.
DICT_MAX_OBJECT_BYTES: Final = 32 * 1024
# Dictionaries are trained on at most this much of a class's sample (training time grows
# with it: about 1 s for 4 MiB here; zstd suggests ~100x the dictionary size).
DICT_TRAIN_MAX_BYTES: Final = 4 * 1024 * 1024
# Rare classes: fewer files than this and less than MIN_CLASS_SHARE of the bytes are merged
# into their extension's class, then into the fallback class.
MIN_CLASS_FILES: Final = 32
MIN_CLASS_SHARE: Final = 0.01
# At most this many classes survive (largest first); more would only lengthen the table and
# thin the sample, and the rest merge by extension.
MAX_CLASSES: Final = 32
# An extension found in more top-level directories than this is one class `*/*EXT`: such
# directories split one kind of data (labels of an ImageFolder tree, shards, dates), while a
# few directories may hold different kinds under one extension (train/*.json, ann/*.json).
MAX_EXT_DIRS: Final = 8
FALLBACK_CLASS: Final = "(other)"
# Every class gets at least this share of the sample budget whatever its size, so small
# classes (annotations) are still measured on more than a handful of objects.
FLOOR_SHARE: Final = 0.25
# First pass over every (class, candidate): enough to estimate its cost, then the time budget
# decides how much more of the sample each pair sees.
PILOT_BYTES: Final = 256 * 1024
# Decode passes per measurement. Each pass is timed in CPU time of the measuring thread, and
# the fastest pass is kept: on a shared machine, wall-clock passes of a few ms varied up to 3x
# between runs (preemption), which made the knapsack choose by noise; with CPU time and the
# minimum, runs mostly agree within 10% (docs/benchmarks.md, "Optimizer").
DECODE_PASSES: Final = 3
# A mount decodes each object between FUSE requests that have pushed the decoder's state
# (zstd context, entropy tables, dictionary) out of the core's caches; a loop decoding the
# sample back to back keeps it hot. For small objects that hides most of the cost: 300-byte
# JSON decoded 2.5-6.5x slower in the mount than in a hot loop (docs/benchmarks.md). So up to
# COLD_UNITS coded units, spread over the sample, are also decoded one at a time after
# evicting the caches, and the hot time is scaled by their cold/hot ratio.
COLD_UNITS: Final = 64


def _cache_bytes() -> int:
    """Bytes to write to evict this core's private caches: its L2 (sysfs), 1 MiB if unknown."""
    try:
        base = "/sys/devices/system/cpu/cpu0/cache"
        for index in sorted(os.listdir(base)):
            with open("%s/%s/level" % (base, index)) as f:
                if f.read().strip() != "2":
                    continue
            with open("%s/%s/size" % (base, index)) as f:
                text = f.read().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            size = int(text.rstrip("KM")) * unit
            return min(max(size, 256 * 1024), 4 << 20)
    except (OSError, ValueError):
        pass
    return 1 << 20


@dataclass(frozen=True, slots=True)
class Candidate:
    """A codec choice for a class: a codec and level, optionally with a trained dictionary."""

    spec: CodecSpec
    use_dict: bool = False

    def __str__(self) -> str:
        return "%s+dict" % self.spec if self.use_dict else str(self.spec)


NONE: Final = Candidate(CodecSpec(CODEC_NONE, 0))


def parse_candidates(text: str) -> tuple[Candidate, ...]:
    """Parse `--codecs` ("zstd:3 lz4 zstd:9+dict lz4hc:9+shuf4", commas or spaces); `none` is
    always in."""
    out = [NONE]
    for word in text.replace(",", " ").split():
        use_dict = "+dict" in word.lower()
        spec = parse_codec(word.lower().replace("+dict", "", 1))
        if use_dict and spec.codec_id not in DICT_CODECS:
            raise UsageError("only zstd and lz4 take a dictionary (got %r)" % word)
        if use_dict and spec.shuffle:
            # The dictionary is trained on the class's bytes as they are, not shuffled.
            raise UsageError("a dictionary does not combine with a shuffle (got %r)" % word)
        cand = Candidate(spec, use_dict)
        if cand not in out:
            out.append(cand)
    return tuple(out)


# --- classes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileRef:
    """One regular file of the dataset: relative path (class rule), path to read, size."""

    rel: bytes
    path: bytes
    size: int


def _parts(rel: bytes) -> tuple[str, str]:
    top, sep, _ = rel.partition(b"/")
    base = rel.rsplit(b"/", 1)[-1]
    ext = os.path.splitext(base)[1].lower()
    if len(ext) > 16:
        ext = b""
    return (top.decode("utf-8", "backslashreplace") if sep else "."), ext.decode(
        "utf-8", "backslashreplace"
    )


def exact_class(rel: bytes) -> str:
    """`top/*.ext`: top-level directory (`.` for files at the root) and lower-case extension."""
    top, ext = _parts(rel)
    return "%s/*%s" % (top, ext)


def class_of(rel: bytes, known: frozenset[str] | set[str]) -> str:
    """The class of `rel` among `known`: exact, else by extension (`*/*.ext`), else fallback."""
    top, ext = _parts(rel)
    name = "%s/*%s" % (top, ext)
    if name in known:
        return name
    name = "*/*" + ext
    return name if name in known else FALLBACK_CLASS


def build_classes(files: Sequence[FileRef]) -> list[str]:
    """The class names for `files` (largest first), rare classes merged as described above."""
    total = sum(f.size for f in files) or 1
    exact: dict[str, list[int]] = {}
    for f in files:
        stats = exact.setdefault(exact_class(f.rel), [0, 0])
        stats[0] += 1
        stats[1] += f.size

    def big(stats: list[int]) -> bool:
        return stats[0] >= MIN_CLASS_FILES or stats[1] >= MIN_CLASS_SHARE * total

    def ext_of(name: str) -> str:
        return name.partition("/*")[2]

    kept = [n for n, st in sorted(exact.items(), key=lambda kv: (-kv[1][1], kv[0])) if big(st)]
    # An extension spread over many top-level directories becomes one class `*/*EXT`; so does
    # the most spread one, and the next, while there are too many classes, rather than the
    # smallest classes (maybe whole kinds of data) falling into `(other)`.
    by_ext: dict[str, list[int]] = {}  # every extension's files and bytes, as `*/*EXT`
    for name, stats in exact.items():
        merged = by_ext.setdefault("*/*" + ext_of(name), [0, 0])
        merged[0] += stats[0]
        merged[1] += stats[1]
    dirs = Counter(ext_of(n) for n in exact)
    collapsed = {"*/*" + ext for ext, count in dirs.items() if count > MAX_EXT_DIRS}
    kept = [n for n in kept if "*/*" + ext_of(n) not in collapsed]
    while len(kept) + len(collapsed) > MAX_CLASSES:
        spread = Counter(ext_of(n) for n in kept)
        ext, count = max(spread.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
        if count < 2:
            break
        collapsed.add("*/*" + ext)
        kept = [n for n in kept if ext_of(n) != ext]
    # The collapsed extensions rank with the exact classes by their bytes; the rest of the
    # files merge by extension into what room is left, then into the fallback class.
    ranked = kept + [n for n in collapsed if big(by_ext[n]) and n not in kept]
    kept = sorted(ranked, key=lambda n: (-(by_ext[n] if n in collapsed else exact[n])[1], n))[
        :MAX_CLASSES
    ]
    rest: dict[str, list[int]] = {}
    for name, stats in exact.items():
        if name not in kept:
            merged = rest.setdefault("*/*" + ext_of(name), [0, 0])
            merged[0] += stats[0]
            merged[1] += stats[1]
    room = max(MAX_CLASSES - len(kept), 0)
    kept += [
        n
        for n, st in sorted(rest.items(), key=lambda kv: (-kv[1][1], kv[0]))
        if big(st) and n not in kept
    ][:room]
    known = set(kept)
    if any(class_of(f.rel, known) == FALLBACK_CLASS for f in files):
        kept.append(FALLBACK_CLASS)
    return kept


# --- sampling ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ClassSample:
    """A class of files and its sample.

    Attributes:
        files, total_bytes: the whole class.
        units: the sample (whole chunks, in the seeded random order).
        dictionary: a zstd dictionary trained on the even-numbered sample units, or None.
    """

    name: str
    files: int = 0
    total_bytes: int = 0
    chunks: int = 0
    units: list[bytes] = field(default_factory=list)
    median_unit: int = 0
    dictionary: bytes | None = None


def _allocate(sizes: list[int], budget: int) -> list[int]:
    """Sample bytes per class: a floor for every class, the rest in proportion to size."""
    if sum(sizes) <= budget:
        return list(sizes)
    floor = FLOOR_SHARE * budget / max(len(sizes), 1)
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection on the proportional share
        mid = (lo + hi) / 2
        if sum(min(s, max(floor, mid * s)) for s in sizes) > budget:
            hi = mid
        else:
            lo = mid
    return [int(min(s, max(floor, lo * s))) for s in sizes]


def _pick_units(
    members: list[FileRef], chunk_size: int, want: int, rng: np.random.Generator
) -> list[tuple[FileRef, int, int]]:
    """Chunks of `members` in random order until `want` bytes (at least one chunk)."""
    counts = np.array([chunk_count(f.size, chunk_size) for f in members], dtype=np.int64)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    picked: list[tuple[FileRef, int, int]] = []
    got = 0
    if total == 0:
        return picked
    for unit in rng.permutation(total).tolist():
        i = int(np.searchsorted(ends, unit, side="right"))
        f = members[i]
        k = unit - (int(ends[i - 1]) if i else 0)
        length = min(chunk_size, f.size - k * chunk_size)
        picked.append((f, k, length))
        got += length
        if got >= want:
            break
    return picked


@dataclass(frozen=True, slots=True)
class ReadModel:
    """Time to read one raw file of `size` bytes: latency_s + size / bytes_per_s."""

    latency_s: float
    bytes_per_s: float
    source: str  # "measured" (fitted on the sample reads from SRC) or "given"

    def seconds(self, files: float, size: float) -> float:
        return files * self.latency_s + size / self.bytes_per_s


def fit_read_model(reads: list[tuple[int, float]]) -> ReadModel:
    """Least-squares fit of t = L + size / BW over (size, seconds) sample reads."""
    if not reads:
        return ReadModel(100e-6, 1e9, "measured")
    sizes = np.array([r[0] for r in reads], dtype=np.float64)
    secs = np.array([r[1] for r in reads], dtype=np.float64)
    if len(reads) >= 2 and np.ptp(sizes) > 0:
        slope, intercept = np.polyfit(sizes, secs, 1)
    else:
        slope, intercept = 0.0, float(secs.mean())
    if slope <= 0:  # no size dependence visible: all latency
        slope, intercept = 1e-12, float(secs.mean())
    if intercept < 0:  # all bandwidth
        slope, intercept = float(secs.sum() / max(sizes.sum(), 1)), 0.0
    return ReadModel(float(intercept), float(1 / slope), "measured")


def read_unit(path: bytes, offset: int, length: int) -> tuple[bytes, float]:
    """Read one sample unit from SRC; returns the bytes and the seconds it took (open included)."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    return data, time.perf_counter() - start


def sample_classes(
    files: Sequence[FileRef],
    *,
    chunk_size: int,
    sample_bytes: int,
    seed: int,
    reader: Callable[[bytes, int, int], tuple[bytes, float]] = read_unit,
) -> tuple[list[ClassSample], list[tuple[int, float]]]:
    """Classes of `files` with a stratified seeded sample of each, and the timed raw reads.

    Deterministic for given files, options and seed: each class draws from its own generator
    seeded with (seed, crc32 of the class name).
    """
    names = build_classes(files)
    known = set(names)
    members: dict[str, list[FileRef]] = {n: [] for n in names}
    for f in files:
        members[class_of(f.rel, known)].append(f)
    classes = [ClassSample(n) for n in names]
    for cls in classes:
        group = members[cls.name]
        cls.files, cls.total_bytes = len(group), sum(f.size for f in group)
        cls.chunks = sum(chunk_count(f.size, chunk_size) for f in group)
    wants = _allocate([c.total_bytes for c in classes], sample_bytes)
    reads: list[tuple[int, float]] = []
    for cls, want in zip(classes, wants, strict=True):
        rng = np.random.default_rng([seed, zlib.crc32(cls.name.encode())])
        for f, k, length in _pick_units(members[cls.name], chunk_size, want, rng):
            data, seconds = reader(f.path, k * chunk_size, length)
            if len(data) != length:
                raise OSError(
                    "%s changed while being sampled" % f.path.decode("utf-8", "backslashreplace")
                )
            cls.units.append(data)
            if k == 0:  # a file's first chunk: open plus read, as a reader pays per file
                reads.append((length, seconds))
        if cls.units:
            cls.median_unit = int(np.median([len(u) for u in cls.units]))
    return classes, reads


# --- measurement ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measurement:
    """A candidate on some units: totals as the pack would store them (raw fallback included).

    Times are single-thread seconds: `decode_s` decodes every unit once, `compress_s`
    compresses every unit once; `overhead_s` is what measuring cost besides (the cold-cache
    decodes), counted against `--time-budget` only.
    """

    units: int
    raw_bytes: int
    stored_bytes: int
    decode_s: float
    compress_s: float
    overhead_s: float = 0.0

    def __add__(self, other: Measurement) -> Measurement:
        return Measurement(
            self.units + other.units,
            self.raw_bytes + other.raw_bytes,
            self.stored_bytes + other.stored_bytes,
            self.decode_s + other.decode_s,
            self.compress_s + other.compress_s,
            self.overhead_s + other.overhead_s,
        )


MeasureFn = Callable[[str, Candidate, Sequence[bytes], "bytes | None"], Measurement]


def measure(
    class_name: str, cand: Candidate, units: Sequence[bytes], dictionary: bytes | None
) -> Measurement:
    """Measure `cand` on `units` on this host, one thread (what one serving process decodes).

    Compresses exactly as the pack does (`compress_object`: probe and raw fallback), so raw
    units count their raw size and no decode time. Decoding is timed in this thread's CPU
    time (what a decode costs the serving process, whatever else the machine runs): the
    fastest of DECODE_PASSES passes over the coded units, scaled by `cold_factor` (a mount
    decodes with cold caches). Compression is timed on the wall clock: it is the pack's time
    cost and what `--time-budget` counts.
    """
    spec = cand.spec
    dic = dictionary if cand.use_dict else None
    start = time.perf_counter()
    stored = [compress_object(u, spec, dic) for u in units]
    compress_s = time.perf_counter() - start
    coded = [
        (codec, s, len(u))
        for (codec, s), u in zip(stored, units, strict=True)
        if codec != CODEC_NONE
    ]
    decode_s = overhead_s = 0.0
    if coded:
        decode_s = _hot_decode_s(coded, dic)
        start = time.perf_counter()
        decode_s *= cold_factor(coded[:: max(1, len(coded) // COLD_UNITS)][:COLD_UNITS], dic)
        overhead_s = time.perf_counter() - start
    return Measurement(
        len(units),
        sum(len(u) for u in units),
        sum(len(s) for _, s in stored),
        decode_s,
        compress_s,
        overhead_s,
    )


Coded = Sequence[tuple[int, bytes, int]]  # (codec id, stored bytes, decoded size)


def _hot_decode_s(coded: Coded, dic: bytes | None) -> float:
    """CPU seconds to decode `coded` back to back: the fastest of DECODE_PASSES passes."""
    passes = []
    for _ in range(DECODE_PASSES):
        start = time.thread_time()
        for codec, s, size in coded:
            decompress(codec, s, size, dic)
        passes.append(time.thread_time() - start)
    return min(passes)


@functools.cache
def _eviction_buffers() -> tuple[bytearray, bytes]:
    """A destination and a source as large as the CPU caches: copying one into the other
    evicts whatever a decode left there. Allocated once per process."""
    size = _cache_bytes()
    return bytearray(size), bytes(range(256)) * (size // 256)


def cold_factor(coded: Coded, dic: bytes | None) -> float:
    """How much slower `coded` decode one at a time with the caches evicted before each than
    back to back (at least 1): the fastest of DECODE_PASSES passes of each, CPU time, the
    clock's own cost taken off the per-object timings."""
    dest, source = _eviction_buffers()
    clock = time.thread_time
    overhead = min(_clock_cost(clock) for _ in range(3))
    hot = _hot_decode_s(coded, dic)
    cold = math.inf
    for _ in range(DECODE_PASSES):
        total = 0.0
        for codec, s, size in coded:
            dest[:] = source  # evict: what serving the FUSE requests in between does
            start = clock()
            decompress(codec, s, size, dic)
            total += clock() - start - overhead
        cold = min(cold, total)
    return max(1.0, cold / hot) if hot > 0 else 1.0


def _clock_cost(clock: Callable[[], float], calls: int = 200) -> float:
    start = clock()
    for _ in range(calls):
        clock()
    return (clock() - start) / calls


@dataclass(frozen=True, slots=True)
class Estimate:
    """A candidate's projection for a whole class, and the sample it rests on."""

    candidate: Candidate
    stored_bytes: int  # projected, dictionary included
    decode_s: float  # one thread, decoding the whole class once
    compress_s: float  # one thread, compressing the whole class once
    sample_units: int
    sample_bytes: int


@dataclass(slots=True)
class ClassProfile:
    name: str
    files: int
    total_bytes: int
    estimates: list[Estimate]
    dictionary: bytes | None = None

    def ratio(self, est: Estimate) -> float:
        return self.total_bytes / est.stored_bytes if est.stored_bytes else 1.0


def _waterfill_time(rates: list[float], rooms: list[int], seconds: float) -> list[int]:
    """Extra bytes per pair so that sum(rate * bytes) <= seconds, each pair capped by its room,
    every pair given the same time slice (fast pairs fill up first)."""
    full = sum(r * b for r, b in zip(rates, rooms, strict=True))
    if full <= seconds:
        return list(rooms)
    lo, hi = 0.0, seconds
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(min(b * r, mid) for r, b in zip(rates, rooms, strict=True)) > seconds:
            hi = mid
        else:
            lo = mid
    return [min(b, int(lo / r)) if r > 0 else b for r, b in zip(rates, rooms, strict=True)]


def _prefix(units: list[bytes], start: int, want: int) -> int:
    """Index after the units from `start` that add up to at least `want` bytes."""
    got, i = 0, start
    while i < len(units) and got < want:
        got += len(units[i])
        i += 1
    return i


def profile(
    classes: list[ClassSample],
    candidates: Sequence[Candidate],
    *,
    time_budget_s: float,
    measure_fn: MeasureFn = measure,
) -> list[ClassProfile]:
    """Measure every candidate on every class's sample and project it to the whole class.

    A pilot of PILOT_BYTES per (class, candidate) estimates each pair's cost; the rest of
    `time_budget_s` (as counted by the measurements' own times, so injected measurements make
    this deterministic) is shared so that every pair gets the same time slice: fast pairs see
    the whole sample, slow ones (brotli:11, lzma) a random prefix of it.
    """
    pairs: list[tuple[ClassSample, Candidate, list[bytes]]] = []
    pilot: list[Measurement] = []
    spent = 0.0
    share = time_budget_s / max(len(classes), 1)
    for cls in classes:
        _train_dictionary(cls, candidates)
        class_spent = 0.0
        for cand in sorted(candidates, key=lambda c: (cost_rank(c), str(c))):
            if cand == NONE or (cand.use_dict and cls.dictionary is None):
                continue
            if class_spent > share:
                # The pilots of this class's cheaper candidates used up its share of the
                # budget: costlier ones would take longer still, so they are not candidates.
                log.debug("%s: %s not profiled (time budget)", cls.name, cand)
                continue
            # Dictionary candidates are measured on the units the dictionary was not trained
            # on (the odd ones), or the estimate would flatter them.
            units = cls.units[1::2] if cand.use_dict else cls.units
            m = measure_fn(cls.name, cand, units[: _prefix(units, 0, PILOT_BYTES)], cls.dictionary)
            pairs.append((cls, cand, units))
            pilot.append(m)
            class_spent += _cost(m)
        spent += class_spent
    rates = [_cost(m) / max(m.raw_bytes, 1) for m in pilot]
    rooms = [
        sum(len(u) for u in units) - m.raw_bytes
        for (_, _, units), m in zip(pairs, pilot, strict=True)
    ]
    extra = _waterfill_time(rates, rooms, max(time_budget_s - spent, 0.0))
    totals: dict[tuple[str, Candidate], Measurement] = {}
    for (cls, cand, units), m, more in zip(pairs, pilot, extra, strict=True):
        if more > 0:
            m = m + measure_fn(
                cls.name, cand, units[m.units : _prefix(units, m.units, more)], cls.dictionary
            )
        totals[(cls.name, cand)] = m
    return [_project(cls, candidates, totals) for cls in classes]


def _cost(m: Measurement) -> float:
    """Seconds a measurement took: one compress pass, DECODE_PASSES decode passes, the rest."""
    return m.compress_s + DECODE_PASSES * m.decode_s + m.overhead_s


def _train_dictionary(cls: ClassSample, candidates: Sequence[Candidate]) -> None:
    if cls.dictionary is not None or not any(c.use_dict for c in candidates):
        return
    if cls.median_unit > DICT_MAX_OBJECT_BYTES or looks_incompressible(b"".join(cls.units[:16])):
        return
    train = cls.units[0::2]
    cls.dictionary = train_dictionary(train[: _prefix(train, 0, DICT_TRAIN_MAX_BYTES)])


def cost_rank(cand: Candidate) -> float:
    """Nominal compress cost (a static order, so the pilot is deterministic): cheap first."""
    spec = cand.spec
    extra = (0.1 if cand.use_dict else 0.0) + (0.05 * spec.shuffle.bit_length())
    if spec.codec_id == CODEC_NONE:
        return 0.0
    if spec.codec_id == CODEC_LZ4:
        return (1.0 if not spec.level else 4.0 + spec.level / 4) + extra
    if spec.codec_id == CODEC_ZSTD:
        return 1.5 + spec.level / 2 + extra
    if spec.codec_id == CODEC_BROTLI:
        return 2.0 + spec.level * 1.2 + extra
    if spec.codec_id == CODEC_LZMA:
        return 11.0 + spec.level / 10 + extra
    return 20.0


def _project(
    cls: ClassSample,
    candidates: Sequence[Candidate],
    totals: dict[tuple[str, Candidate], Measurement],
) -> ClassProfile:
    estimates = [
        Estimate(NONE, cls.total_bytes, 0.0, 0.0, len(cls.units), sum(len(u) for u in cls.units))
    ]
    for cand in candidates:
        m = totals.get((cls.name, cand))
        if m is None or m.raw_bytes == 0:
            continue
        scale = cls.total_bytes / m.raw_bytes
        extra = len(cls.dictionary) if cand.use_dict and cls.dictionary else 0
        estimates.append(
            Estimate(
                cand,
                min(int(round(m.stored_bytes * scale)), cls.total_bytes) + extra,
                m.decode_s * scale,
                m.compress_s * scale,
                m.units,
                m.raw_bytes,
            )
        )
    return ClassProfile(cls.name, cls.files, cls.total_bytes, estimates, cls.dictionary)


# --- selection --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Solution:
    """A choice per class (index into that class's options) and its totals.

    `exact` is False only when the frontier had to be trimmed; the value is then within a
    factor `1 + gap` of the optimum (proven: each trim loses at most 1 + delta, compounded).
    """

    choice: tuple[int, ...]
    weight: float
    value: float
    exact: bool
    gap: float


# Frontier size above which the solver trims (FPTAS-style) instead of staying exact.
MAX_FRONTIER: Final = 1_000_000
TRIM_GAP: Final = 1e-3


def solve_mckp(options: Sequence[Sequence[tuple[float, float]]], budget: float) -> Solution | None:
    """Multiple-choice knapsack: one option (weight, value) per group, minimising the total
    value subject to total weight <= budget. Exact; None if no choice fits.

    Dynamic programming over Pareto frontiers: after each group, keep only the (weight, value)
    totals not dominated by another total that is lighter and no worse; any optimal solution
    passes through such states, so the result is optimal. Totals that cannot fit even with
    the lightest remaining options are dropped. Ties go to the lower total weight, then to the
    earlier options. Should a frontier exceed MAX_FRONTIER states, states whose values agree
    within a factor 1 + delta keep only the lightest, and the result is within 1 + TRIM_GAP.
    """
    k = len(options)
    tol = 1e-9 * max(abs(budget), 1.0)
    min_w = [min(w for w, _ in group) for group in options]
    rest = (
        np.concatenate([np.cumsum(np.array(min_w[::-1], dtype=np.float64))[::-1], [0.0]])
        if k
        else np.zeros(1)
    )
    weights, values = np.zeros(1), np.zeros(1)
    back: list[tuple[np.ndarray, np.ndarray]] = []
    delta = (1 + TRIM_GAP) ** (1 / max(k, 1)) - 1
    exact = True
    for g, group in enumerate(options):
        gw = np.array([w for w, _ in group], dtype=np.float64)
        gv = np.array([v for _, v in group], dtype=np.float64)
        w = (weights[:, None] + gw[None, :]).ravel()
        v = (values[:, None] + gv[None, :]).ravel()
        parent = np.repeat(np.arange(len(weights)), len(group))
        opt = np.tile(np.arange(len(group)), len(weights))
        ok = w + rest[g + 1] <= budget + tol
        w, v, parent, opt = w[ok], v[ok], parent[ok], opt[ok]
        if not len(w):
            return None
        order = np.lexsort((opt, parent, v, w))  # by weight, then value, then first option
        w, v, parent, opt = w[order], v[order], parent[order], opt[order]
        best_before = np.minimum.accumulate(np.concatenate([[np.inf], v[:-1]]))
        keep = v < best_before
        w, v, parent, opt = w[keep], v[keep], parent[keep], opt[keep]
        if len(w) > MAX_FRONTIER:
            exact = False
            w, v, parent, opt = _trim(w, v, parent, opt, delta)
        weights, values = w, v
        back.append((parent, opt))
    best = int(np.lexsort((weights, values))[0])
    choice = []
    for parent, opt in reversed(back):
        choice.append(int(opt[best]))
        best = int(parent[best])
    choice.reverse()
    total_w = sum(options[g][c][0] for g, c in enumerate(choice))
    total_v = sum(options[g][c][1] for g, c in enumerate(choice))
    return Solution(tuple(choice), total_w, total_v, exact, 0.0 if exact else TRIM_GAP)


def _trim(
    w: np.ndarray, v: np.ndarray, parent: np.ndarray, opt: np.ndarray, delta: float
) -> tuple[np.ndarray, ...]:
    # Bucket values geometrically; in each bucket keep the lightest state (the first one, as
    # the frontier is sorted by weight). A dropped state's completion can be replaced by the
    # kept one's at no more weight and at most 1 + delta times the value.
    bucket = np.where(v > 0, np.floor(np.log(np.maximum(v, 1e-300)) / math.log1p(delta)), -np.inf)
    _, first = np.unique(bucket, return_index=True)
    keep = np.sort(first)
    return w[keep], v[keep], parent[keep], opt[keep]


@dataclass(frozen=True, slots=True)
class Objective:
    """What to optimise.

    mode "sync" or "prefetch": minimise stored bytes under a decode budget of `budget_s`
    seconds of one-thread decode per epoch. mode "capacity": minimise decode seconds under
    `capacity_bytes`, and if `budget_s` is not None also require decode <= budget_s.
    """

    mode: str
    budget_s: float | None
    capacity_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Selection:
    choices: tuple[Estimate, ...]
    stored_bytes: int
    decode_s: float
    feasible: bool
    exact: bool
    gap: float
    problem: str = ""  # one line when not feasible


def _options(profiles: Sequence[ClassProfile]) -> list[list[Estimate]]:
    # Drop dominated estimates (no smaller and no faster than another); exact-safe, and it
    # keeps the frontier small. Sorted by size so that ties resolve deterministically.
    out = []
    for prof in profiles:
        # On a tie, none first: an incompressible class is stored raw and costs no decode.
        ests = sorted(
            prof.estimates,
            key=lambda e: (e.stored_bytes, e.decode_s, e.candidate != NONE, str(e.candidate)),
        )
        kept: list[Estimate] = []
        for e in ests:
            if not kept or e.decode_s < min(k.decode_s for k in kept):
                kept.append(e)
        out.append(kept)
    return out


def select(profiles: Sequence[ClassProfile], objective: Objective) -> Selection:
    """Choose one estimate per class for `objective`; infeasible objectives return the
    closest plan (feasible=False and a one-line `problem`)."""
    opts = _options(profiles)
    if objective.mode == "capacity":
        return _select_capacity(opts, objective)
    assert objective.budget_s is not None
    sol = solve_mckp(
        [[(e.decode_s, float(e.stored_bytes)) for e in g] for g in opts], objective.budget_s
    )
    if sol is None:  # only when "none" was not a candidate: never by default
        sol = solve_mckp([[(e.decode_s, float(e.stored_bytes)) for e in g] for g in opts], math.inf)
        assert sol is not None
        return _selection(
            opts, sol, False, "no plan keeps decoding within the %s budget" % objective.mode
        )
    return _selection(opts, sol, True)


def _select_capacity(opts: list[list[Estimate]], objective: Objective) -> Selection:
    assert objective.capacity_bytes is not None
    sol = solve_mckp(
        [[(float(e.stored_bytes), e.decode_s) for e in g] for g in opts],
        float(objective.capacity_bytes),
    )
    if sol is None:
        smallest = solve_mckp([[(0.0, float(e.stored_bytes)) for e in g] for g in opts], 0.0)
        assert smallest is not None
        sel = _selection(opts, smallest, False)
        return _replace_problem(
            sel,
            "no plan fits in %s: the smallest needs %s"
            % (_size(objective.capacity_bytes), _size(sel.stored_bytes)),
        )
    sel = _selection(opts, sol, True)
    if objective.budget_s is not None and sel.decode_s > objective.budget_s * (1 + 1e-9):
        return _replace_problem(
            sel,
            "no plan fits in %s within the decode budget: the fastest that fits needs %.1f%% of it"
            % (_size(objective.capacity_bytes), 100 * sel.decode_s / objective.budget_s),
        )
    return sel


def _size(n: float) -> str:
    from fanfs._sizes import format_size

    return format_size(n)


def _replace_problem(sel: Selection, problem: str) -> Selection:
    return Selection(
        sel.choices, sel.stored_bytes, sel.decode_s, False, sel.exact, sel.gap, problem
    )


def _selection(
    opts: list[list[Estimate]], sol: Solution, feasible: bool, problem: str = ""
) -> Selection:
    choices = tuple(opts[g][c] for g, c in enumerate(sol.choice))
    return Selection(
        choices,
        sum(e.stored_bytes for e in choices),
        sum(e.decode_s for e in choices),
        feasible,
        sol.exact,
        sol.gap,
        problem,
    )


# --- budgets ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """Everything `fanfs plan` and `fanfs pack --codec auto` take (see `fanfs plan --help`)."""

    mode: str = "sync"  # "sync" | "prefetch" | "capacity"
    max_overhead: float = 0.05
    compute_s: float = 0.0
    read_model: ReadModel | None = None  # None: fitted on the sample reads
    target_files_per_s: float | None = None
    target_bytes_per_s: float | None = None
    decode_cores: float = 2.0
    capacity_bytes: int | None = None
    check_mode: str | None = None  # with a capacity: also hold this mode's budget
    sample_bytes: int = 64 * 1024 * 1024
    time_budget_s: float = 60.0
    seed: int = 0
    candidates: tuple[Candidate, ...] = field(
        default_factory=lambda: parse_candidates(DEFAULT_CODECS)
    )


def decode_budget(
    mode: str, settings: PlanSettings, files: int, size: int, read: ReadModel
) -> float:
    """Seconds of one-thread decode allowed per epoch (every file read once).

    sync: decode adds to every read, so the epoch's total decode may be at most
        max_overhead x (raw read time + compute time) of the epoch; an average over files,
        which is what the epoch time sees.
    prefetch: decode runs on `decode_cores` otherwise idle cores while the job consumes the
        target rate, so an epoch at that rate lasts files / rate (or bytes / rate) seconds and
        offers decode_cores x that many seconds of decode.
    """
    if mode == "sync":
        return settings.max_overhead * (read.seconds(files, size) + files * settings.compute_s)
    if mode == "prefetch":
        if settings.target_files_per_s:
            epoch_s = files / settings.target_files_per_s
        elif settings.target_bytes_per_s:
            epoch_s = size / settings.target_bytes_per_s
        else:
            raise UsageError("--mode prefetch needs --target-rate")
        return settings.decode_cores * epoch_s
    raise ValueError(mode)


@dataclass(slots=True)
class Plan:
    """A profiled dataset and the selection made for it (what plan.py prints and pack runs)."""

    settings: PlanSettings
    read_model: ReadModel
    profiles: list[ClassProfile]
    selection: Selection
    budget_s: float | None
    files: int
    total_bytes: int
    sample_units: int
    sample_bytes: int
    elapsed_s: float
    chunk_size: int

    def choice(self, class_name: str) -> tuple[CodecSpec, bytes | None]:
        for prof, est in zip(self.profiles, self.selection.choices, strict=True):
            if prof.name == class_name:
                return est.candidate.spec, prof.dictionary if est.candidate.use_dict else None
        raise KeyError(class_name)

    @property
    def class_names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.profiles)


def make_plan(
    files: Sequence[FileRef],
    settings: PlanSettings,
    *,
    chunk_size: int,
    measure_fn: MeasureFn = measure,
    reader: Callable[[bytes, int, int], tuple[bytes, float]] = read_unit,
) -> Plan:
    """Sample, profile and select: the whole of `fanfs plan`."""
    start = time.perf_counter()
    classes, reads = sample_classes(
        files,
        chunk_size=chunk_size,
        sample_bytes=settings.sample_bytes,
        seed=settings.seed,
        reader=reader,
    )
    read_model = settings.read_model or fit_read_model(reads)
    profiles = profile(
        classes, settings.candidates, time_budget_s=settings.time_budget_s, measure_fn=measure_fn
    )
    n_files, n_bytes = len(files), sum(f.size for f in files)
    budget: float | None = None
    if settings.mode in ("sync", "prefetch"):
        budget = decode_budget(settings.mode, settings, n_files, n_bytes, read_model)
    elif settings.check_mode:
        budget = decode_budget(settings.check_mode, settings, n_files, n_bytes, read_model)
    objective = Objective(settings.mode, budget, settings.capacity_bytes)
    selection = select(profiles, objective)
    return Plan(
        settings,
        read_model,
        profiles,
        selection,
        budget,
        n_files,
        n_bytes,
        sum(len(c.units) for c in classes),
        sum(len(u) for c in classes for u in c.units),
        time.perf_counter() - start,
        chunk_size,
    )


def plan_record(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-able data (`fanfs plan --json`, the pack manifest's `plan`)."""
    s, sel = plan.settings, plan.selection
    classes = []
    for prof, est in zip(plan.profiles, sel.choices, strict=True):
        classes.append(
            {
                "class": prof.name,
                "files": prof.files,
                "bytes": prof.total_bytes,
                "codec": str(est.candidate),
                "ratio": round(prof.ratio(est), 4),
                "decode_mbps": (
                    round(prof.total_bytes / est.decode_s / 1e6, 1) if est.decode_s else None
                ),
                "decode_s": round(est.decode_s, 6),
                "budget_share": round(est.decode_s / plan.budget_s, 4) if plan.budget_s else None,
                "projected_bytes": est.stored_bytes,
                "compress_mbps": round(prof.total_bytes / est.compress_s / 1e6, 2)
                if est.compress_s
                else None,
                "sample_units": est.sample_units,
                "sample_bytes": est.sample_bytes,
                "dictionary_bytes": len(prof.dictionary)
                if est.candidate.use_dict and prof.dictionary
                else 0,
                "candidates": [
                    {
                        "codec": str(e.candidate),
                        "projected_bytes": e.stored_bytes,
                        "decode_s": round(e.decode_s, 6),
                        "compress_s": round(e.compress_s, 6),
                        "sample_units": e.sample_units,
                        "sample_bytes": e.sample_bytes,
                    }
                    for e in prof.estimates
                ],
            }
        )
    return {
        "mode": s.mode,
        "check_mode": s.check_mode,
        "feasible": sel.feasible,
        "problem": sel.problem or None,
        "exact": sel.exact,
        "gap": sel.gap,
        "budget_s": round(plan.budget_s, 6) if plan.budget_s is not None else None,
        "decode_s": round(sel.decode_s, 6),
        "files": plan.files,
        "bytes": plan.total_bytes,
        "projected_bytes": sel.stored_bytes,
        "settings": {
            "max_overhead": s.max_overhead,
            "compute_ms": s.compute_s * 1e3,
            "read_latency_ms": round(plan.read_model.latency_s * 1e3, 6),
            "read_mbps": round(plan.read_model.bytes_per_s / 1e6, 3),
            "read_model": plan.read_model.source,
            "target_files_per_s": s.target_files_per_s,
            "target_mbps": s.target_bytes_per_s / 1e6 if s.target_bytes_per_s else None,
            "decode_cores": s.decode_cores,
            "capacity_bytes": s.capacity_bytes,
            "sample_bytes_budget": s.sample_bytes,
            "time_budget_s": s.time_budget_s,
            "seed": s.seed,
            "chunk_size": plan.chunk_size,
            "candidates": [str(c) for c in s.candidates],
        },
        "sample": {
            "units": plan.sample_units,
            "bytes": plan.sample_bytes,
            "seconds": round(plan.elapsed_s, 3),
        },
        "classes": classes,
    }
