"""Measuring candidates on the sample: ratio, one-thread decode time (hot, scaled by a
cold-cache factor) and compress time (`measure`, injectable), and `profile`, which shares
the time budget among (class, candidate) pairs and projects each onto the whole class.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from fanfs.compression import (
    CODEC_BROTLI,
    CODEC_LZ4,
    CODEC_LZMA,
    CODEC_NONE,
    CODEC_ZSTD,
    compress_object,
    decompress,
    looks_incompressible,
    train_dictionary,
)
from fanfs.optimizer.candidates import NONE, Candidate
from fanfs.optimizer.sampling import ClassSample

log = logging.getLogger(__name__)


# A class whose typical (median) object is larger than this gets no dictionary candidate:
# a dictionary only supplies context to the first KiBs of an object.
DICT_MAX_OBJECT_BYTES: Final = 32 * 1024
# Dictionaries are trained on at most this much of a class's sample (training time grows
# with it: about 1 s for 4 MiB here; zstd suggests ~100x the dictionary size).
DICT_TRAIN_MAX_BYTES: Final = 4 * 1024 * 1024
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
