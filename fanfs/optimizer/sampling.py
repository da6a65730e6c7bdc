"""The seeded, stratified sample of each class, and the raw-read model fitted to reading it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from fanfs.format.layout import chunk_count, chunk_length, crc32, storage_unit
from fanfs.optimizer.classes import FileRef, build_classes, class_of

# Every class gets at least this share of the sample budget whatever its size, so small
# classes (annotations) are still measured on more than a handful of objects.
FLOOR_SHARE: Final = 0.25
# A class whose typical (median) file is larger than this gets no dictionary candidate: a
# dictionary only supplies context to the first KiBs of an object.
DICT_MAX_OBJECT_BYTES: Final = 32 * 1024
# A class of small files (a dictionary candidate) is sampled up to this much whatever the
# sample budget: half of it trains the dictionary, half measures it, and a dictionary trained
# on 4 MiB is 1-7% better than one trained on 1 MiB on real sources (docs/benchmarks.md).
# Reading it costs a few hundred files per MiB; what the measurements cost is bounded by the
# time budget, not by the sample.
DICT_SAMPLE_BYTES: Final = 8 * 1024 * 1024
# ... and at most this many files: reading a file costs its latency (0.1-0.2 ms here),
# which the plan's time budget counts.
DICT_SAMPLE_UNITS: Final = 2048


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
    measured: int = -1  # the first units that candidates are measured on (-1: all of them)
    # Runs of the class's small files as the pack stores them, consecutive in walk order,
    # for the solid-block choice (`sample_classes` with `solid_block`): files of one directory
    # often resemble each other (icon sets, translations), which random units do not show.
    runs: list[list[bytes]] = field(default_factory=list)
    # More such runs, for the decode of a class chosen in solid blocks (SOLID_MORE_RUNS).
    more_runs: list[list[bytes]] = field(default_factory=list)

    @property
    def measure_units(self) -> list[bytes]:
        """The units candidates are measured on: the class's share of the sample budget (the
        units read beyond it, for a dictionary's training set, only train)."""
        return self.units if self.measured < 0 else self.units[: self.measured]


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
    members: list[FileRef], chunk_size: int, block_size: int, want: int, rng: np.random.Generator
) -> list[tuple[FileRef, int, int, int]]:
    """Chunks of `members` in random order until `want` bytes (at least one chunk), as
    (file, chunk number, offset, length): the units the pack will compress (blocks for a
    file larger than a chunk)."""
    units = [storage_unit(f.size, chunk_size, block_size) for f in members]
    counts = np.array(
        [chunk_count(f.size, unit) for f, unit in zip(members, units, strict=True)],
        dtype=np.int64,
    )
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    picked: list[tuple[FileRef, int, int, int]] = []
    got = 0
    if total == 0:
        return picked
    for number in rng.permutation(total).tolist():
        i = int(np.searchsorted(ends, number, side="right"))
        f = members[i]
        k = number - (int(ends[i - 1]) if i else 0)
        length = chunk_length(f.size, units[i], k)
        picked.append((f, k, k * units[i], length))
        got += length
        if got >= want:
            break
    return picked


# Units at least this large (blocks of large files) form a stratum of their own in the order
# candidates are measured in (`stratified`).
STRATUM_BYTES: Final = 64 * 1024


def stratified(units: list[bytes]) -> list[bytes]:
    """`units` (in random order) reordered so that every prefix holds the large units
    (STRATUM_BYTES and up) in about their share of all the units' bytes, each stratum in its
    own order. A costly candidate is measured on a prefix that its time share cuts short: in
    plain random order, a class whose bytes are mostly in a few large units shows it only
    small ones (the real dataset's `(other)`: brotli:11 measured on 8 units of 63 KB, none
    above 64 KiB, where 71% of the sample's bytes are)."""
    large = [i for i, u in enumerate(units) if len(u) >= STRATUM_BYTES]
    small = [i for i, u in enumerate(units) if len(u) < STRATUM_BYTES]
    return [units[i] for i in _interleaved(large, small, [len(u) for u in units])]


def _interleaved(large: list[int], small: list[int], sizes: Sequence[int]) -> list[int]:
    """The indices of `large` and `small`, each in its own order, merged so that every prefix
    holds `large` in about its share of the bytes (`sizes` by index)."""
    total = sum(sizes[i] for i in large) + sum(sizes[i] for i in small)
    share = sum(sizes[i] for i in large) / total if total else 0.0
    out: list[int] = []
    got = got_large = 0
    i = j = 0
    while i < len(large) or j < len(small):
        if j >= len(small) or (i < len(large) and got_large <= share * got):
            unit = large[i]
            i += 1
            got_large += sizes[unit]
        else:
            unit = small[j]
            j += 1
        out.append(unit)
        got += sizes[unit]
    return out


def by_reference_ratio(units: Sequence[bytes], stored: Sequence[int]) -> list[int]:
    """An order of `units` (indices; `stored`: each one's size with the reference codec) in
    which every prefix spreads over the units the reference compresses least to most, in
    each stratum (STRATUM_BYTES), the strata merged as `stratified` merges them: the prefix
    a costly candidate is measured on.

    A candidate's decode over zstd:3's varies from unit to unit with the unit's content, and
    with how well zstd:3 compresses it: per 128 KiB block of the real dataset, zstd:19's
    ratio correlated with zstd:3's compression ratio at -0.41 on the PAM images, -0.65 on
    shared objects and -0.58 on FITS images, and 4 blocks one from each quarter of the blocks
    ranked by it estimated the class's ratio with an error of 0.17, 0.07 and 0.06 (root mean
    square over 2,000 draws) where 4 drawn at random erred by 0.21, 0.11 and 0.08; the plan's
    3 random PAM blocks decoded at 1.04x zstd:3, all 306 at 1.43x (docs/benchmarks.md).
    The units alternate between the ranking's lower and upper half, each half spread alike
    (`_spread`), the first of each pair from the lower half and the next from the upper:
    so the even units (a dictionary's training set) and the odd (its candidates' measured
    units) spread alike too, and the first 4 of a stratum sit in its four quarters."""
    sizes = [len(u) for u in units]
    strata: list[list[int]] = []
    for large in (True, False):
        members = [i for i in range(len(units)) if (sizes[i] >= STRATUM_BYTES) is large]
        ranked = sorted(members, key=lambda i: stored[i] / max(sizes[i], 1))
        half = (len(ranked) + 1) // 2
        low, high = ranked[:half], ranked[half:]
        low_order, high_order = _spread(len(low)), _spread(len(high))
        order: list[int] = []
        for k in range(half):
            pair = [low[low_order[k]]] + ([high[high_order[k]]] if k < len(high) else [])
            order += pair if k % 2 == 0 else pair[::-1]
        strata.append(order)
    return _interleaved(strata[0], strata[1], sizes)


def _spread(n: int) -> list[int]:
    """range(n) in an order whose every prefix covers it about evenly: a van der Corput
    sequence (1/2, 1/4, 3/4, 1/8, ... of the way), shifted by a quarter so that its first
    two sit at a quarter and three quarters."""
    if n <= 0:
        return []
    bits = max((n - 1).bit_length(), 1)
    out: list[int] = []
    seen: set[int] = set()
    for i in range(1 << bits):
        reversed_i = int(format(i, "0%db" % bits)[::-1], 2)
        rank = int(((reversed_i + 0.5) / (1 << bits) + 0.25) % 1.0 * n)
        if rank not in seen:
            seen.add(rank)
            out.append(rank)
    return out


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
    block_size: int = 0,
    sample_bytes: int,
    seed: int,
    reader: Callable[[bytes, int, int], tuple[bytes, float]] = read_unit,
    solid_block: int = 0,
) -> tuple[list[ClassSample], list[tuple[int, float]]]:
    """Classes of `files` with a stratified seeded sample of each, and the timed raw reads.

    `files` in walk order (the pack's). With `solid_block`, each class also gets SOLID_RUNS
    runs of its files of at most a quarter of that, consecutive in walk order from random
    starts, of one block each (`ClassSample.runs`), and SOLID_MORE_RUNS more
    (`ClassSample.more_runs`).

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
        cls.chunks = sum(
            chunk_count(f.size, storage_unit(f.size, chunk_size, block_size)) for f in group
        )
    wants = _allocate([c.total_bytes for c in classes], sample_bytes)
    reads: list[tuple[int, float]] = []
    for cls, want in zip(classes, wants, strict=True):
        sizes = [f.size for f in members[cls.name]]
        read = want
        if sizes and float(np.median(sizes)) <= DICT_MAX_OBJECT_BYTES:
            read = max(want, min(cls.total_bytes, DICT_SAMPLE_BYTES))
        rng = np.random.default_rng([seed, crc32(cls.name.encode())])
        got = 0
        for f, k, offset, length in _pick_units(
            members[cls.name], chunk_size, block_size, read, rng
        ):
            if read > want and got >= want:
                if cls.measured < 0:
                    cls.measured = len(cls.units)
                if len(cls.units) >= DICT_SAMPLE_UNITS:
                    break
            got += length
            data, seconds = reader(f.path, offset, length)
            if len(data) != length:
                raise OSError(
                    "%s changed while being sampled" % f.path.decode("utf-8", "backslashreplace")
                )
            cls.units.append(data)
            if k == 0:  # a file's first chunk: open plus read, as a reader pays per file
                reads.append((length, seconds))
        if cls.units:
            end = len(cls.units) if cls.measured < 0 else cls.measured
            cls.units[:end] = stratified(cls.units[:end])
            cls.median_unit = int(np.median([len(u) for u in cls.units]))
        if solid_block:
            cls.runs = _read_runs(members[cls.name], solid_block, rng, reader, SOLID_RUNS)
            cls.more_runs = _read_runs(members[cls.name], solid_block, rng, reader, SOLID_MORE_RUNS)
    return classes, reads


# Runs of consecutive small files per class for the solid-block choice, one block each: a
# run shorter than a block (64 KiB, three PNG icons) showed under 1% where the class's small
# PNGs gain 2.9% in walk order. About 0.5 s of zstd:19 per class, alone and grouped.
SOLID_RUNS: Final = 4
# ... and this many more, drawn after them, on which the decode of a class chosen in solid
# blocks is measured again (`budgets._confirm_solid`): projected from 4 blocks, the real
# dataset's solid classes decoded 0.62-1.37x their prediction in shuffled epochs through
# the mount, the Go sources 0.62x and 0.80x in two plans (docs/benchmarks.md).
SOLID_MORE_RUNS: Final = 12


def _read_runs(
    members: list[FileRef],
    block: int,
    rng: np.random.Generator,
    reader: Callable[[bytes, int, int], tuple[bytes, float]],
    count: int,
) -> list[list[bytes]]:
    small = [f for f in members if 0 < f.size <= block // 4]
    if len(small) < 8:
        return []
    runs = []
    for start in sorted(set(rng.integers(0, len(small), count).tolist())):
        run: list[bytes] = []
        got = 0
        for f in small[start:]:
            data, _ = reader(f.path, 0, f.size)
            if len(data) != f.size:
                raise OSError(
                    "%s changed while being sampled" % f.path.decode("utf-8", "backslashreplace")
                )
            run.append(data)
            got += len(data)
            if got >= block:
                break
        runs.append(run)
    return runs
