"""Measuring candidates on the sample: ratio, one-thread decode time (what the daemon
times: verifying and decoding, hot, plus what each unit costs more with cold caches) and
compress time (`measure`, injectable), and `profile`, which shares the time budget among
(class, candidate) pairs and projects each onto the whole class.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

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
    dictionary_size,
    looks_incompressible,
    parse_codec,
    prepare,
    train_dictionary,
)
from fanfs.format.layout import chunk_crc, crc32
from fanfs.optimizer.candidates import NONE, Candidate
from fanfs.optimizer.coldmount import (
    BROTLI_LEVEL,
    LZ4_DICT_LEVEL,
    MountedSample,
    brotli_units,
    dictionary_units,
)
from fanfs.optimizer.sampling import (
    DICT_MAX_OBJECT_BYTES,
    FLOOR_SHARE,
    ClassSample,
    by_reference_ratio,
)

# Every candidate is compared with this one on the same units (when it is a candidate): the
# codec `fanfs pack` uses by default, so an auto plan is measured against what it replaces.
REFERENCE: Final = Candidate(CodecSpec(CODEC_ZSTD, 3))

log = logging.getLogger(__name__)


# Dictionaries are trained on at most this much of a class's sample (the even units).
DICT_TRAIN_MAX_BYTES: Final = 4 * 1024 * 1024
# Dictionary sizes tried per class (those the training set is at least 4 times as large as);
# the one that gives the smallest class, its own bytes included, is the class's dictionary.
DICT_SIZES: Final = (64 * 1024, 256 * 1024, 1024 * 1024)
# What training costs, counted against the time budget: CPU seconds per training byte (about
# 0.1 s for 4 MiB here with fixed parameters). A nominal figure, so that a plan with injected
# measurements stays exactly reproducible.
DICT_TRAIN_S_PER_BYTE: Final = 25e-9
# A floor on a candidate's measuring cost per byte before its pilot (CPU seconds per byte
# per unit of `cost_rank`): zstd:19 (rank 11) about 0.3 s per MiB, brotli:11 0.5 s per MiB.
NOMINAL_S_PER_BYTE: Final = 25e-9
# First pass over every (class, candidate): the first units of the class's sample (a random
# order), then the time budget decides how much more of the sample each pair sees. Small, so
# that a budget of a quarter of the pack time reaches the dense candidates of every class
# (on the real dataset, 128 KiB pilots left most classes with zstd:3 alone: 2.16x; 32 KiB
# pilots 2.39x, docs/benchmarks.md); the estimates are paired with the reference's.
PILOT_BYTES: Final = 32 * 1024
# A candidate no faster to decode than the reference must be smaller by this many standard
# errors of the per-unit differences measured on the same units, or it is not a candidate:
# on few units a codec that loses on the class can look better by chance.
WIN_SIGMAS: Final = 2.0
# On fewer units than this no standard error means anything (one unit: none at all), and a
# class of a few large files may have been measured on one 128 KiB block: a candidate wins
# there only if it is smaller by this share on every unit. On the real dataset the Go
# toolchain's .syso files (17 files, 16 MB) kept zstd:3 at 3.63x in the capacity-leaning plan
# with lzma:6 measured at 5.3x on its one unit.
FEW_UNITS: Final = 3
FEW_UNITS_GAIN: Final = 0.1
# ... on every unit that holds at least this share of the reference's stored bytes there;
# the smaller units need only be no larger together. A unit of 131 bytes that brotli:11
# stored in 114 bytes, as zstd:3 did, vetoed brotli:11 on the real dataset's `(other)`,
# where the unit beside it holding 95% of the bytes was 21% smaller; later, on 40 units
# (2.9 effective) 24% smaller in all and 19-28% on each of the six holding 5% or more,
# four files of 94-284 bytes that brotli stored 3-30 bytes larger did.
FEW_UNITS_MIN_SHARE: Final = 0.05
# A candidate of the reference's codec whose decode differs from the reference's by no more
# than this share is taken to decode as fast: zstd's levels and dictionaries came out within
# 5-20% of zstd:3 run to run on the same units, and the balanced budget (the reference's own
# decode) would otherwise choose between them by noise (five runs on the real dataset: 442 to
# 453 MB).
SAME_DECODE: Final = 0.1
# Decode passes per measurement. Each pass is timed in CPU time of the measuring thread, and
# the fastest pass is kept: on a shared machine, wall-clock passes of a few ms varied up to 3x
# between runs (preemption), which made the knapsack choose by noise; with CPU time and the
# minimum, runs mostly agree within 10% (docs/benchmarks.md, "Optimizer").
DECODE_PASSES: Final = 3
# A mount decodes each object between FUSE requests that have pushed the decoder's state
# (zstd context, entropy tables, dictionary) out of the core's caches; a loop decoding the
# sample back to back keeps it hot. For small objects that hides most of the cost: 300-byte
# JSON decoded 2.5-6.5x slower in the mount than in a hot loop (docs/benchmarks.md). So up to
# COLD_UNITS units, spread over the sample, are also decoded one at a time after
# evicting the caches, and what each took more than in the passes is added for every unit
# (`cold_penalty`). Added, not multiplied: a class of icons and wallpapers is mostly
# small objects, whose cold decodes cost several times their warm ones, while its bytes are
# in the large ones, where the difference is small; a ratio taken on a few units, mostly
# small, multiplied the class's decode by 5 where the mount paid 2 (docs/benchmarks.md).
COLD_UNITS: Final = 16


# What the serving path does between two decodes (the kernel's FUSE request and reply, the
# reader's copy of the data, the Python that answers, the other serving process) reaches
# further than the core's own caches: on the real dataset's packs, each class's own stored
# objects decoded after writing 1, 2, 4 and 8 MiB came to 0.75, 0.87, 1.00 and 1.38 of
# what the mount measured on them, and with 4 MiB 23 of 31 classes within 25% against 15
# with 1 MiB, this core's L2 (docs/benchmarks.md). So the eviction writes this much, or the
# core's L2 if that is larger.
EVICT_BYTES: Final = 4 * 1024 * 1024


def _sysfs_cache_bytes(level: int) -> int | None:
    """The size of this core's cache of `level` (sysfs), None if not known."""
    try:
        base = "/sys/devices/system/cpu/cpu0/cache"
        for index in sorted(os.listdir(base)):
            with open("%s/%s/level" % (base, index)) as f:
                if f.read().strip() != str(level):
                    continue
            with open("%s/%s/size" % (base, index)) as f:
                text = f.read().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * unit
    except (OSError, ValueError):
        pass
    return None


def _cache_bytes() -> int:
    """Bytes to write to evict what the serving path between two decodes does: EVICT_BYTES,
    or this core's L2 (sysfs) if larger."""
    size = _sysfs_cache_bytes(2)
    return EVICT_BYTES if size is None else min(max(size, EVICT_BYTES), 16 << 20)


# A class whose objects are few in an epoch (a class in solid blocks: one decode per block)
# finds its decoder's state and its dictionary evicted from the last-level cache as well,
# by the other classes' objects served in between, which the eviction above (4 MiB) leaves
# there. On the real dataset's balanced pack, solid blocks with a dictionary decoded in a
# shuffled epoch through the mount 1.45-1.94x their prediction in every run (SVG, 8 runs),
# `.mo` 1.19-1.48x and the Ruby docs up to 1.86x; their blocks decoded after reading 48 MiB
# (this host's L3 is 32 MiB) came out 112 and 132 us slower than hot, against 12 and 16 us
# after writing 4 MiB, and the mount paid 90-125 and 140-175 us more per block. So such
# objects are also timed after a read of LLC_SWEEP_FACTOR times the last-level cache
# (`Measurement.deep`, `cold_penalty`), once each, and `llc_share` says how much of that a
# class pays.
LLC_DEFAULT_BYTES: Final = 32 << 20
LLC_SWEEP_FACTOR: Final = 1.5
LLC_SWEEP_MAX: Final = 192 << 20  # (a host's cache reported larger is swept this far)
# Bytes an epoch moves through the caches per byte it serves: the decoder writes it, the
# daemon's reply is copied into the kernel and the reader copies it out (each a read and a
# write), besides the stored bytes read and verified.
EPOCH_TOUCH: Final = 4.0


@functools.cache
def _llc_bytes() -> int:
    """The last-level cache's size (sysfs: L3), LLC_DEFAULT_BYTES if not known."""
    return _sysfs_cache_bytes(3) or LLC_DEFAULT_BYTES


def llc_share(epoch_bytes: float, objects: float) -> float:
    """The share of the last-level cache's eviction that a class of `objects` objects an
    epoch pays on each, the epoch serving `epoch_bytes` bytes in a random order: the bytes
    it moves through the caches between two of the class's objects (EPOCH_TOUCH per byte
    served) over the cache's size, at most 1. The real dataset's SVG class in 211 solid
    blocks of a 1.09 GB epoch, with a 32 MiB cache: 0.62; its 5,571 Python files one by
    one: 0.02."""
    if objects <= 0 or epoch_bytes <= 0:
        return 0.0
    return min(1.0, EPOCH_TOUCH * epoch_bytes / objects / _llc_bytes())


@functools.cache
def _llc_sweep() -> bytes:
    """A buffer of LLC_SWEEP_FACTOR times the last-level cache, its pages real (not the
    zero page a fresh allocation reads as): reading it evicts what a decode left there.
    Allocated once per plan (`release_eviction_buffers`)."""
    size = min(int(_llc_bytes() * LLC_SWEEP_FACTOR), LLC_SWEEP_MAX)
    return bytes(range(256)) * (size // 256)


# Copies timed after a sweep of the last-level cache by `block_data_cost`.
BLOCK_DATA_TIMINGS: Final = 5


@functools.cache
def block_data_cost(block: int) -> float:
    """The seconds per byte read or written that a copy of `block` bytes takes where no
    cache holds them: the least a solid block of `block` bytes takes to be served, its stored
    bytes read and its decoded bytes written. The mount keeps each block it decodes (its
    other members are served from it) in memory just allocated, and in an epoch of a dataset
    many times the caches the stored bytes come from memory too; the hot passes reuse their
    output buffer and the cold penalty (`cold_penalty`, 4 MiB written) leaves the data in the
    last-level cache. Timed as such a copy after a read of the last-level cache
    (`_llc_sweep`), the median of BLOCK_DATA_TIMINGS in this thread's CPU time, over the
    bytes read and written; measured once per process.

    On the real dataset's PNG class in blocks of 128 KiB with lz4hc:9 (a decode as fast as
    a copy), its blocks decoded at 14.5 us each back to back and at 50.6 us through the mount
    in a shuffled epoch; a copy of 128 KiB took 39 us after the sweep, 5 us hot (one of 1 MiB
    138 us and 65 us: the hardware prefetches a long copy, so it is timed at the size of the
    blocks). A decode slower than the copy (zstd's, 150 us a block of Python sources) hides
    its data's latency: charged on top, those blocks read 0.80-0.86x their prediction."""
    size = max(block, 1)
    source = bytes(range(256)) * (size // 256) + bytes(size % 256)
    dest = bytearray(size)  # (its pages written: real, as the block's memory is)
    sweep = _llc_sweep()
    clock = time.thread_time
    cold = []
    for _ in range(BLOCK_DATA_TIMINGS):
        crc32(sweep)
        start = clock()
        dest[:] = source
        cold.append(clock() - start)
    return statistics.median(cold) / (2 * size)


def release_eviction_buffers() -> None:
    """Free the eviction buffers (`_eviction_buffers`, `_llc_sweep`: 8 MiB and 48 MiB here)
    once a plan is made: the pack that follows in the same process has no use for them."""
    _eviction_buffers.cache_clear()
    _llc_sweep.cache_clear()


@dataclass(frozen=True, slots=True)
class Measurement:
    """A candidate on some units: totals as the pack would store them (raw fallback included).

    Times are single-thread CPU seconds: `decode_s` decodes every unit once, `compress_s`
    compresses every unit once; `overhead_s` is what measuring cost besides (the cold-cache
    decodes), counted against the time budget only. `unit_stored` holds each unit's stored
    size, in order (empty when a measuring function does not report it), and `unit_decode`
    each unit's decode seconds with warm caches (empty likewise), which `decode_s` is
    `cold` times (the cold-cache factor: the passes' time plus `cold_penalty` for each unit,
    over the passes' time): `profile` compares candidates with the reference on exactly the
    same units. `beside` holds REFERENCE's warm decode seconds
    of each of the same units, timed in the same passes, unit by unit beside the candidate's
    (empty when not measured so): a comparison that the machine's speed, which drifts
    between measurements, cannot move. `deep` is the cold penalty per unit with the
    last-level cache evicted too (`cold_penalty`'s `deep`; 0: not measured).
    """

    units: int
    raw_bytes: int
    stored_bytes: int
    decode_s: float
    compress_s: float
    overhead_s: float = 0.0
    unit_stored: tuple[int, ...] = ()
    unit_decode: tuple[float, ...] = ()
    cold: float = 1.0
    beside: tuple[float, ...] = ()
    deep: float = 0.0

    def __add__(self, other: Measurement) -> Measurement:
        both = bool(self.unit_stored) and bool(other.unit_stored)
        timed = bool(self.unit_decode) and bool(other.unit_decode)
        paired = bool(self.beside) and bool(other.beside)
        hot = self.decode_s / self.cold + other.decode_s / other.cold
        return Measurement(
            self.units + other.units,
            self.raw_bytes + other.raw_bytes,
            self.stored_bytes + other.stored_bytes,
            self.decode_s + other.decode_s,
            self.compress_s + other.compress_s,
            self.overhead_s + other.overhead_s,
            self.unit_stored + other.unit_stored if both else (),
            self.unit_decode + other.unit_decode if timed else (),
            (self.decode_s + other.decode_s) / hot if hot > 0 else 1.0,
            self.beside + other.beside if paired else (),
            _mean_deep(self, other),
        )


def _mean_deep(a: Measurement, b: Measurement) -> float:
    """`Measurement.deep` of `a` and `b` together: per unit over those measured."""
    measured = [m for m in (a, b) if m.deep > 0 and m.units > 0]
    units = sum(m.units for m in measured)
    return sum(m.deep * m.units for m in measured) / units if units else 0.0


MeasureFn = Callable[[str, Candidate, Sequence[bytes], "bytes | None"], Measurement]


def measure(
    class_name: str,
    cand: Candidate,
    units: Sequence[bytes],
    dictionary: bytes | None,
    *,
    cold: bool = True,
    deep: bool = False,
) -> Measurement:
    """Measure `cand` on `units` on this host, one thread (what one serving process decodes).

    Compresses exactly as the pack does (`compress_object`: probe and raw fallback), so raw
    units count their raw size, and their checksum as their decode time. Decoding (with the
    checksum, `_serve`: what the daemon counts) is timed in this thread's CPU time (what a
    decode costs the serving process, whatever else the machine runs): the fastest of
    DECODE_PASSES passes over the units, plus `cold_penalty` for each unit (a mount decodes
    with cold caches). Compression is timed in CPU time too: a pack compresses on every
    core, so its wall time is about the CPU time over the jobs, and the machine's other work
    does not inflate the estimate. Without `cold` the cold-cache decodes are skipped and
    `Measurement.cold` is 1 (where the projection takes the penalty from elsewhere:
    `_profiling`).
    """
    spec = cand.spec
    dic = dictionary if cand.use_dict else None
    overhead_s = _prepared(spec, dic)
    stored, compress_s = _compressed(units, spec, dic)
    objects = _objects(stored, units)
    ref_objects = None
    if cand != REFERENCE:  # REFERENCE's own objects, to time beside (`Measurement.beside`)
        ref_stored, took = _compressed(units, REFERENCE.spec, None)
        ref_objects = _objects(ref_stored, units)
        overhead_s += took
    timing = _time_objects(objects, dic, ref_objects, cold=cold, deep=deep)
    return _measurement(units, stored, compress_s, overhead_s, [timing])


def _prepared(spec: CodecSpec, dic: bytes | None) -> float:
    """Build the codec's contexts (the pack builds them once per thread: overhead, not cost
    per byte); the CPU seconds it took."""
    start = time.thread_time()
    prepare(spec, dic)
    return time.thread_time() - start


def _compressed(
    units: Sequence[bytes], spec: CodecSpec, dic: bytes | None
) -> tuple[list[tuple[int, bytes]], float]:
    """`units` compressed as the pack does (`compress_object`), and the CPU seconds it took.

    While a plan runs on several threads (`compress_threads`), compressions go in pairs
    with those `ahead` names next: not done early, this thread compresses `units` while
    another compresses the first named (or, named none, `units` are split over the threads
    if there is enough to split); done early, it is taken, and the next two named are
    compressed, one here and one on another thread. The CPU seconds are each thread's,
    summed: what one thread would take."""
    state = _COMPRESSING
    if state.pool is None:
        return _compress_group(units, None, spec, dic)
    start = time.perf_counter()
    key = _key(units, spec, dic)
    early = state.ready.pop(key, None)
    named = [h for h in state.hints if h[0] != key and h[0] not in state.ready]
    state.hints = []
    if early is None:
        if named:
            _start_early(named[0], state.pool)
            stored, cpu = _compress_group(units, None, spec, dic)
        elif len(units) >= 2 and _bytes(units) >= SPLIT_MIN_BYTES and _idle():
            stored, cpu = _split_compress(state.pool, state.threads, units, spec, dic)
        else:
            stored, cpu = _compress_group(units, None, spec, dic)
    else:
        if len(named) >= 2:
            _start_early(named[1], state.pool)
        if named:
            _start_early(named[0], None)
        stored, cpu = early.result()
    state.beside_s += cpu - (time.perf_counter() - start)
    return stored, cpu


def _start_early(hint: _Hint, pool: concurrent.futures.ThreadPoolExecutor | None) -> None:
    """Compress what `hint` names before it is asked for: on `pool`, or on this thread now
    (None)."""
    key, units, spec, dic = hint
    if pool is not None:
        future = pool.submit(_compress_group, units, None, spec, dic)
    else:
        future = concurrent.futures.Future()
        future.set_result(_compress_group(units, None, spec, dic))
    ready = _COMPRESSING.ready
    ready[key] = future
    while len(ready) > READY_MAX:  # (those never asked for)
        del ready[next(iter(ready))]


def _idle() -> bool:
    """Whether no compression started early is still running (a split would wait for it)."""
    return all(f.done() for f in _COMPRESSING.ready.values())


def ahead(*steps: tuple[Sequence[bytes], CodecSpec, bytes | None]) -> None:
    """Name the compressions (units, codec, dictionary) a plan is likely to measure after
    the next one, in order (`_compressed`): they are compressed early, in pairs on two
    threads, and taken if asked for; a wrong guess costs time but changes no result.
    Outside `compress_threads`, nothing."""
    if _COMPRESSING.pool is not None:
        _COMPRESSING.hints = [(_key(u, c, d), u, c, d) for u, c, d in steps[:2] if u]


def _settle() -> None:
    """Wait for the compressions running on other threads (`ahead`), so that what this
    thread times next (a decode) runs with nothing else of the plan's; the wait is wall
    time the plan spent (taken off `_Compressing.beside_s`)."""
    state = _COMPRESSING
    running = [f for f in state.ready.values() if not f.done()]
    if running:
        start = time.perf_counter()
        concurrent.futures.wait(running)
        state.beside_s -= time.perf_counter() - start


def _key(units: Sequence[bytes], spec: CodecSpec, dic: bytes | None) -> tuple[object, ...]:
    """A compression's identity for `ahead`: the unit objects themselves (a sample's units
    live as long as the plan), the codec, the dictionary object."""
    return (spec, id(dic), *map(id, units))


def _split_compress(
    pool: concurrent.futures.ThreadPoolExecutor,
    threads: int,
    units: Sequence[bytes],
    spec: CodecSpec,
    dic: bytes | None,
) -> tuple[list[tuple[int, bytes]], float]:
    """`units` compressed on `threads` threads (this one and `pool`'s), in groups of about as
    many bytes; each thread's CPU seconds summed."""
    groups = _split_by_bytes(units, threads)
    futures = [pool.submit(_compress_group, units, g, spec, dic) for g in groups[1:]]
    try:
        done = [_compress_group(units, groups[0], spec, dic)]
    finally:
        concurrent.futures.wait(futures)  # (none left running if this thread's part failed)
    done += [f.result() for f in futures]
    stored: list[tuple[int, bytes]] = [(0, b"")] * len(units)
    for group, (out, _) in zip(groups, done, strict=True):
        for i, obj in zip(group, out, strict=True):
            stored[i] = obj
    return stored, sum(took for _, took in done)


def _compress_group(
    units: Sequence[bytes], group: Sequence[int] | None, spec: CodecSpec, dic: bytes | None
) -> tuple[list[tuple[int, bytes]], float]:
    """`units[i]` for i in `group` (None: every unit) compressed (`compress_object`), and
    this thread's CPU seconds; the codec's contexts are built first, untimed (`_prepared`
    times them once)."""
    prepare(spec, dic)
    picked = units if group is None else [units[i] for i in group]
    start = time.thread_time()
    stored = [compress_object(u, spec, dic) for u in picked]
    return stored, time.thread_time() - start


def _split_by_bytes(units: Sequence[bytes], parts: int) -> list[list[int]]:
    """The indices of `units` in `parts` groups of about as many bytes (largest first, each
    to the lightest group), each in ascending order."""
    groups: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in sorted(range(len(units)), key=lambda k: -len(units[k])):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += len(units[i])
    return [sorted(g) for g in groups if g]


# A measurement's units are split over the plan's threads only when they hold at least this
# many bytes: below, handing half to another thread costs more than it saves.
SPLIT_MIN_BYTES: Final = 32 * 1024
# Compressions done or started early (`ahead`) kept at most (the oldest, never asked for,
# are dropped).
READY_MAX: Final = 4

_Hint = tuple[tuple[object, ...], Sequence[bytes], CodecSpec, "bytes | None"]


class _Compressing:
    """How `_compressed` compresses: on the calling thread alone, or while a plan runs
    (`compress_threads`) on a pool of others too, with the compression named `ahead` and
    those started early; and the CPU seconds the compressions counted beyond the wall time
    they took, all plans together (`PlanCost.note_other` takes a plan's part off its wall
    time)."""

    def __init__(self) -> None:
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.threads = 1
        self.hints: list[_Hint] = []
        self.ready: dict[
            tuple[object, ...], concurrent.futures.Future[tuple[list[tuple[int, bytes]], float]]
        ] = {}
        self.beside_s = 0.0


_COMPRESSING: Final = _Compressing()


@contextlib.contextmanager
def compress_threads(threads: int) -> Iterator[None]:
    """While in it, measurements compress on `threads` threads, as the pack compresses on
    its jobs: the planning thread and threads - 1 others (`_compressed`). Compression is
    timed in each thread's CPU time and summed, so a measurement counts what it did on one
    thread; decodes are timed on the planning thread with nothing else of the plan running
    (`_settle`). (Nested, or with `threads` below 2: one thread, as outside.)"""
    if threads < 2 or _COMPRESSING.pool is not None:
        yield
        return
    with concurrent.futures.ThreadPoolExecutor(threads - 1, "plan-compress") as pool:
        _COMPRESSING.pool, _COMPRESSING.threads = pool, threads
        try:
            yield
        finally:
            _COMPRESSING.pool, _COMPRESSING.threads, _COMPRESSING.hints = None, 1, []
            for future in _COMPRESSING.ready.values():
                future.cancel()
            _COMPRESSING.ready.clear()


@dataclass(frozen=True, slots=True)
class _Timing:
    """One timing of a candidate's objects (`_time_objects`): the fastest pass, each object's
    fastest time, the reference's beside them (or empty), the cold penalty per object, and
    the CPU seconds the beside decodes and the cold decodes took."""

    hot_s: float
    per_unit: tuple[float, ...]
    beside: tuple[float, ...]
    penalty: float
    overhead_s: float
    deep: float = 0.0


def _time_objects(
    objects: Objects,
    dic: bytes | None,
    beside: Objects | None,
    *,
    cold: bool,
    deep: bool = False,
) -> _Timing:
    """`_timed_decode` of `objects`, and with `cold` the `cold_penalty` of up to COLD_UNITS
    of them spread over the list (with `deep`, also with the last-level cache evicted)."""
    hot_s, per_unit, ref_units, overhead_s = _timed_decode(objects, dic, beside)
    penalty = deep_penalty = 0.0
    if cold and objects and hot_s > 0:
        picks = range(0, len(objects), max(1, len(objects) // COLD_UNITS))[:COLD_UNITS]
        picked = [objects[i] for i in picks]
        warm = [per_unit[i] for i in picks]
        start = time.thread_time()
        penalty = cold_penalty(picked, warm, dic)
        if deep:
            deep_penalty = cold_penalty(picked, warm, dic, deep=True)
        overhead_s += time.thread_time() - start
    return _Timing(hot_s, per_unit, ref_units, penalty, overhead_s, deep_penalty)


def _measurement(
    units: Sequence[bytes],
    stored: Sequence[tuple[int, bytes]],
    compress_s: float,
    overhead_s: float,
    timings: Sequence[_Timing],
) -> Measurement:
    """The Measurement of `units` stored as `stored` from one or more timings of their
    objects: the median of their fastest passes and of their cold penalties, each unit's
    median time (the timings beyond the first count as overhead)."""
    hot_s = statistics.median(t.hot_s for t in timings)
    penalty = statistics.median(t.penalty for t in timings)
    units_t = zip(*(t.per_unit for t in timings), strict=True)
    per_unit = tuple(statistics.median(ts) for ts in units_t)
    overhead_s += sum(t.overhead_s for t in timings)
    overhead_s += DECODE_PASSES * sum(t.hot_s for t in timings[1:])
    factor = 1.0 + len(units) * penalty / hot_s if hot_s > 0 else 1.0
    sizes = tuple(len(s) for _, s in stored)
    return Measurement(
        len(units),
        sum(len(u) for u in units),
        sum(sizes),
        hot_s * factor,
        compress_s,
        overhead_s,
        sizes,
        per_unit,
        factor,
        timings[0].beside,
        statistics.median(t.deep for t in timings),
    )


# The reference's decode is every class's anchor: each candidate's is projected as the
# reference's times their ratio on the same units. Timed once per class, in one window of a
# few milliseconds, it took this shared host's speed at that moment: the fastest of three
# back-to-back passes over the real dataset's JSON sample, taken 40 times half a second
# apart, ranged 0.0034-0.0182 s (mostly 0.0052-0.0056), and three plans of the same sample
# put the reference's decode of one class 1.0-3.0x apart (the GIMP brushes 0.027-0.083 s),
# where a mount's decode of a class spans many such moments. So the reference pass sweeps
# over all classes REFERENCE_SWEEPS times and takes each class's median.
REFERENCE_SWEEPS: Final = 3


def measure_reference(
    classes: Sequence[ClassSample], ref: Candidate, sweeps: int = REFERENCE_SWEEPS
) -> dict[str, Measurement]:
    """`measure` of the reference on every unit of each class's sample (by class name), the
    decode timed in `sweeps` sweeps over the classes, so that a class's timings are about a
    sweep's time apart, and the median taken (`_measurement`)."""
    prepare_s = _prepared(ref.spec, None)
    compressed = [_compressed(cls.measure_units, ref.spec, None) for cls in classes]
    objects = [_objects(s, c.measure_units) for (s, _), c in zip(compressed, classes, strict=True)]
    timings: list[list[_Timing]] = [[] for _ in classes]
    for _ in range(sweeps):
        for k, objs in enumerate(objects):
            timings[k].append(_time_objects(objs, None, None, cold=True))
    return {
        cls.name: _measurement(
            cls.measure_units, stored, compress_s, prepare_s if k == 0 else 0.0, timings[k]
        )
        for k, (cls, (stored, compress_s)) in enumerate(zip(classes, compressed, strict=True))
    }


# A decoder's cold penalty on a class, from the candidates of that decoder measured cold
# on it so far (`_profiling`): by (class name, codec id, shuffle), the first such candidate
# and each of its measurements' (penalty per object, objects timed cold).
ColdDonors = dict[tuple[str, int, int], tuple[Candidate, list[tuple[float, int]]]]


def _profiling(
    measure_fn: MeasureFn, ref: Candidate | None, donors: ColdDonors | None = None
) -> MeasureFn:
    """`measure_fn` as profiling calls it: `measure` times a candidate's decode with cold
    caches only where `_project` uses it, and once per decoder and class. A candidate of
    the reference's decoder takes the reference's cold penalty and a dictionary candidate
    its own (`dictionary_penalty`), so their cold decodes were spent for nothing: on the
    real dataset those decodes (each a 4 MiB eviction before each of 16 units, three
    times) took 28 s of a plan's 64 s of measurement, a third of it on such candidates.
    Likewise the levels of one other decoder (brotli's four, lz4 and lz4hc, one shuffle's
    zstd levels): the first measured on a class is timed cold, each time it is measured, and
    the others take its penalty per object (`_with_penalty`); the cold penalty is the
    decoder's state and tables fetched again, and timed on a few objects it varied by
    1.3-1.9x between runs on the same units, more than between the levels. In `donors`
    (kept across calls: confirming resumes from profiling's)."""
    if measure_fn is not measure or ref is None:  # (no reference: each pays its own)
        return measure_fn
    donors = {} if donors is None else donors

    def measuring(
        class_name: str, cand: Candidate, units: Sequence[bytes], dictionary: bytes | None
    ) -> Measurement:
        if cand != ref and (cand.use_dict or _same_decoder(cand, ref)):
            return measure(class_name, cand, units, dictionary, cold=False)
        group = (class_name, cand.spec.codec_id, cand.spec.shuffle)
        donor = donors.get(group)
        if donor is not None and donor[0] != cand:
            m = measure(class_name, cand, units, dictionary, cold=False)
            timed = sum(n for _, n in donor[1])
            return _with_penalty(m, sum(p * n for p, n in donor[1]) / max(timed, 1))
        m = measure(class_name, cand, units, dictionary, cold=True)
        donors.setdefault(group, (cand, []))[1].append(
            (per_object_penalty(m), min(m.units, COLD_UNITS))
        )
        return m

    return measuring


def _with_penalty(m: Measurement, penalty: float) -> Measurement:
    """`m` (timed hot only) with a cold penalty of `penalty` seconds per object, as `measure`
    adds its own (`_measurement`)."""
    if m.decode_s <= 0 or penalty <= 0:
        return m
    factor = 1.0 + m.units * penalty / m.decode_s
    return dataclasses.replace(m, decode_s=m.decode_s * factor, cold=factor)


Objects = Sequence[tuple[int, bytes, int]]  # per unit: (codec id, stored bytes, decoded size)


def _objects(stored: Sequence[tuple[int, bytes]], units: Sequence[bytes]) -> Objects:
    """Each unit's stored object as (codec id, stored bytes, decoded size), raw ones too."""
    return [(codec, s, len(u)) for (codec, s), u in zip(stored, units, strict=True)]


def _serve(obj: tuple[int, bytes, int], dictionary: bytes | None) -> None:
    """What the daemon times as a chunk's decode (`decode_ns`): verify its stored bytes
    (crc32, zlib-ng's: about 19 GB/s hot here, and a read of the bytes from memory cold) and
    decode them (`decompress`, which hands a raw chunk back as it is). A plan that timed
    the decode alone counted a raw chunk as free, where the mount pays its verifying and its
    cold caches per chunk."""
    codec, stored, size = obj
    chunk_crc(stored, 0, True)
    decompress(codec, stored, size, dictionary if codec != CODEC_NONE else None)


def _timed_decode(
    objects: Objects, dic: bytes | None, beside: Objects | None = None
) -> tuple[float, tuple[float, ...], tuple[float, ...], float]:
    """Verify and decode (`_serve`) `objects` DECODE_PASSES times, each object timed alone in
    this thread's CPU time (the clock's own cost taken off). Returns the fastest pass (its
    objects' times summed), each object's fastest time, so that a candidate can be compared
    with the reference unit by unit; and, when `beside` (REFERENCE's objects of the same
    units) is given, the same for them, each timed right after the candidate's object of
    its unit in the same pass (else empty), with the CPU seconds they took.

    Timed apart, minutes apart, the two sides differ by the machine's speed as well: on 78
    units of the real dataset's `(other)`, zstd:19 over zstd:3 came out 1.13-1.65 and once
    0.35 in twelve pairs of measurements; timed unit by unit beside each other, 1.45-1.47."""
    _settle()
    clock = time.thread_time
    overhead = _clock_overhead()

    def timed(obj: tuple[int, bytes, int], dictionary: bytes | None) -> float:
        start = clock()
        _serve(obj, dictionary)
        return max(clock() - start - overhead, 0.0)

    passes = []
    best = [math.inf] * len(objects)
    ref_best = [math.inf] * len(beside or ())
    beside_s = 0.0
    for _ in range(DECODE_PASSES):
        total = 0.0
        for i, obj in enumerate(objects):
            took = timed(obj, dic)
            total += took
            best[i] = min(best[i], took)
            if beside is not None:
                took = timed(beside[i], None)
                beside_s += took
                ref_best[i] = min(ref_best[i], took)
        passes.append(total)
    return min(passes), tuple(best), tuple(ref_best), beside_s


@functools.cache
def _clock_overhead() -> float:
    """The thread CPU clock's own cost per call, measured once per process."""
    return min(_clock_cost(time.thread_time) for _ in range(3))


@functools.cache
def _eviction_buffers() -> tuple[bytearray, bytes]:
    """A destination and a source as large as the CPU caches: copying one into the other
    evicts whatever a decode left there. Allocated once per plan (`release_eviction_buffers`)."""
    size = _cache_bytes()
    return bytearray(size), bytes(range(256)) * (size // 256)


def cold_penalty(
    objects: Objects, warm: Sequence[float], dic: bytes | None, *, deep: bool = False
) -> float:
    """The mean seconds by which an object of `objects` is verified and decoded (`_serve`)
    slower right after the caches are evicted than `warm` (each object's fastest time in
    `measure`'s passes), at least 0. Timed alone in CPU time (the clock's own cost taken
    off), the fastest of DECODE_PASSES. With `deep`, the last-level cache is evicted too
    (`_llc_sweep` read before each decode), once per object: the sweep costs milliseconds,
    and the penalty it shows is tens of microseconds, well above the timer's noise.

    A cold/warm ratio taken on 16 objects spread over a sample was applied to the whole
    class before: on the real dataset's PNG class (icons of 0.6-22 KB and wallpapers of
    several MB) it projected zstd:3's decode at 0.32 s where the class's own objects
    decoded cold in 0.10 s, and the plan moved PNG off zstd to save decode time it did not
    cost (docs/benchmarks.md)."""
    if not objects:
        return 0.0
    _settle()
    dest, source = _eviction_buffers()
    sweep = _llc_sweep() if deep else b""
    clock = time.thread_time
    overhead = _clock_overhead()
    cold = [math.inf] * len(objects)
    for _ in range(1 if deep else DECODE_PASSES):
        for i, obj in enumerate(objects):
            dest[:] = source  # evict: what serving the FUSE requests in between does
            if deep:
                crc32(sweep)  # (read: leaves no dirty lines to write back in the decode)
            start = clock()
            _serve(obj, dic)
            cold[i] = min(cold[i], clock() - start - overhead)
    return max(0.0, sum(c - w for c, w in zip(cold, warm, strict=True)) / len(objects))


# A dictionary candidate's cold cost is its own (the dictionary's content and tables are
# read again), not the reference's: it is measured once per class and codec, on this many
# units spread over those the dictionary was not trained on. Measured on a pilot's few
# units it came out 1.5-3x what the mount paid per object; on 32 units of the class, 0.8-1.2x
# for the real dataset's eight dictionary classes in an offline prototype, and through the
# mount a balanced pack's shuffled epoch within 2-4% of the plan's in two runs of three
# (docs/benchmarks.md, "2026-11-27, evening").
DICT_COLD_UNITS: Final = 32


def dictionary_penalty(cls: ClassSample, cand: Candidate) -> tuple[float, float]:
    """The mean seconds by which a unit of `cls` compressed with `cand` and the class's
    dictionary is verified and decoded slower with cold caches than warm (`cold_penalty`),
    on up to DICT_COLD_UNITS odd units spread over the sample; and the CPU seconds measuring
    it took. (0, 0) without a dictionary or units."""
    units = cls.measure_units[1::2]
    if cls.dictionary is None or not units:
        return 0.0, 0.0
    start = time.thread_time()
    picks = units[:: max(1, len(units) // DICT_COLD_UNITS)][:DICT_COLD_UNITS]
    objects = _objects([compress_object(u, cand.spec, cls.dictionary) for u in picks], picks)
    _, warm, _, _ = _timed_decode(objects, cls.dictionary)
    penalty = cold_penalty(objects, warm, cls.dictionary)
    return penalty, time.thread_time() - start


def raw_serving(cls: ClassSample) -> tuple[float, float, float]:
    """What serving `cls` stored raw costs the daemon: seconds per byte of verifying (the
    fastest of DECODE_PASSES passes over up to 2 x COLD_UNITS units spread over the sample),
    the cold penalty per chunk on top (`cold_penalty`), and the CPU seconds measuring took.
    A raw chunk is not free: a plan that counted only its checksum stored the real dataset's
    11,771 Ruby docs (9.1 MB, 0.4 KB each) raw to save decode time, and the mount spent 0.074
    s on them, against 0.001 s predicted."""
    units = cls.measure_units
    if not units:
        return 0.0, 0.0, 0.0
    start = time.thread_time()
    picks = units[:: max(1, len(units) // (2 * COLD_UNITS))][: 2 * COLD_UNITS]
    objects = [(CODEC_NONE, u, len(u)) for u in picks]
    hot, warm, _, _ = _timed_decode(objects, None)
    penalty = cold_penalty(objects, warm, None)
    return hot / max(sum(len(u) for u in picks), 1), penalty, time.thread_time() - start


def _clock_cost(clock: Callable[[], float], calls: int = 200) -> float:
    start = clock()
    for _ in range(calls):
        clock()
    return (clock() - start) / calls


@dataclass(frozen=True, slots=True)
class Estimate:
    """A candidate's projection for a whole class, and the sample it rests on.

    `loses`: the candidate is no faster to decode than the reference and was not shown to be
    smaller on the same units (by WIN_SIGMAS standard errors); selection never picks it.
    `solid`: the class's small files go into solid blocks with this candidate (the balanced
    mode's option, `budgets.SolidOptions`): `stored_bytes` and `decode_s` are projected so.
    `warm_s`: `decode_s` without the cold-cache penalties (`cold_penalty`), the decode a
    mount would pay with every cache hot (negative: not known, taken as `decode_s`).
    """

    candidate: Candidate
    stored_bytes: int  # projected, dictionary included
    decode_s: float  # one thread, decoding the whole class once
    compress_s: float  # one thread, compressing the whole class once
    sample_units: int
    sample_bytes: int
    loses: bool = False
    solid: bool = False
    warm_s: float = -1.0

    @property
    def warm(self) -> float:
        """The decode with hot caches (`warm_s`, or `decode_s` where that is not known)."""
        return self.decode_s if self.warm_s < 0 else self.warm_s


@dataclass(slots=True)
class ClassProfile:
    name: str
    files: int
    total_bytes: int
    estimates: list[Estimate]
    dictionary: bytes | None = None

    def ratio(self, est: Estimate) -> float:
        return self.total_bytes / est.stored_bytes if est.stored_bytes else 1.0


def _prefix(units: list[bytes], start: int, want: int) -> int:
    """Index after the units from `start` that add up to at least `want` bytes."""
    got, i = 0, start
    while i < len(units) and got < want:
        got += len(units[i])
        i += 1
    return i


def reference_of(candidates: Sequence[Candidate]) -> Candidate | None:
    """The candidate every other is compared with: REFERENCE, else the cheapest plain one."""
    plain = [c for c in candidates if c != NONE and not c.use_dict]
    if REFERENCE in plain:
        return REFERENCE
    if not plain:
        return None
    return min(plain, key=lambda c: (cost_rank(c), str(c)))


def class_shares(sizes: Sequence[int], seconds: float) -> list[float]:
    """Seconds of measurement per class: FLOOR_SHARE shared equally, the rest by `sizes`
    (the bytes the reference saves on each class)."""
    total = sum(sizes)
    if not sizes:
        return []
    floor = FLOOR_SHARE * seconds / len(sizes)
    rest = (1 - FLOOR_SHARE) * seconds
    return [floor + (rest * s / total if total else rest / len(sizes)) for s in sizes]


@dataclass(slots=True)
class PlanCost:
    """What profiling was allowed and what it spent (CPU seconds, as the budget counts them);
    `predicted_pack_s` when the budget is a share of the predicted pack time."""

    budget_s: float | None
    measure_s: float = 0.0  # after the reference pass (with plan_share, the budget bounds
    # it with `reference_s` and `sample_s`: `budgets._measuring_budget`)
    reference_s: float = 0.0  # the reference pass
    sample_s: float = 0.0  # reading the sample (wall seconds, as the reader timed them)
    predicted_pack_s: float | None = None
    # the first guess at the pack (`budgets`: the dense levels' nominal cost in the balanced
    # mode), the pack the plan aims at before it has measured its codecs
    aimed_pack_s: float | None = None
    rounds: int = 1  # calls of `profile` that measured (the budget's rounds: `_budget_rounds`)
    # every (class, candidate) measurement so far: a later `profile` call resumes from them
    totals: dict[tuple[str, Candidate], Measurement] = field(default_factory=dict)
    # each (class, codec id)'s dictionary penalty so far (`dictionary_penalty`), likewise;
    # and each class's cost of serving raw chunks (`raw_serving`)
    penalties: dict[tuple[str, int], float] = field(default_factory=dict)
    raw: dict[str, tuple[float, float]] = field(default_factory=dict)
    # each decoder's cold penalty on each class so far (`_profiling`)
    cold_donors: ColdDonors = field(default_factory=dict)
    # The seconds per byte read or written of a copy of a solid block from memory, the least
    # a block's decode takes with its stored and decoded bytes (`block_data_cost`; 0: not
    # measured, as with injected measurements)
    block_data_s: float = 0.0
    # The sample's mount (`coldmount.sample_mount`; None: not tried), and what it shifts each
    # class's cold penalty per object by (`cold_shifts`): a class not in it keeps the method.
    mounted: MountedSample | None = None
    shifts: dict[str, float] = field(default_factory=dict)
    # The mount of the classes' units with their dictionaries (`dictionary_penalties`; None:
    # not tried); its seconds include timing the same units hot.
    dict_mounted: MountedSample | None = None
    # by how much it moved each class's zstd dictionary penalty: what a solid block decoded
    # with the dictionary is shifted by besides `shifts` (`dictionary_shift`)
    dict_shifts: dict[str, float] = field(default_factory=dict)

    def dictionary_shift(self, name: str, cand: Candidate) -> float:
        """The shift of a cold penalty per object of `cand` on class `name`: the sample's
        mount's (`shifts`), and for a zstd candidate with a dictionary the mount of the
        dictionaries' on top (`dict_shifts`)."""
        extra = cand.use_dict and cand.spec.codec_id == CODEC_ZSTD
        return self.shifts.get(name, 0.0) + (self.dict_shifts.get(name, 0.0) if extra else 0.0)

    # With real measurements, the plan's start (`time.perf_counter`), and the wall seconds
    # it took besides what is counted above (the selections, splitting the sample, the
    # host's other work between measurements) as of the last `note_other`. Injected
    # measurements count none, so that their plans stay exactly reproducible.
    started: float | None = None
    other_s: float = 0.0
    # The CPU seconds the plan's compressions ran on other threads beside its own, beyond
    # their wall time (`compress_threads`), as of the last `note_other`: its wall time is
    # that much below what it counts (from `_COMPRESSING.beside_s` when it began).
    beside_s: float = 0.0
    beside_from: float = field(default_factory=lambda: _COMPRESSING.beside_s)

    def mounted_s(self) -> float:
        """The wall seconds of the sample's mounts so far (`mounted`, `dict_mounted`)."""
        return sum(m.seconds for m in (self.mounted, self.dict_mounted) if m is not None)

    def counted_s(self) -> float:
        """The seconds counted so far: the sample, the reference pass, the sample's mounts
        (wall seconds), the measuring."""
        return self.sample_s + self.reference_s + self.mounted_s() + self.measure_s

    def note_other(self, now: float | None = None) -> float:
        """`other_s` as of `now` (perf_counter; None: now): the plan's wall time so far less
        what it counted, the compressions' CPU seconds on other threads taken off what it
        counted (`beside_s`): those ran beside its wall time, not in it. (So the plan's
        share, counted and besides, still holds its measuring as on one thread: on two,
        the plan takes less than it counts.)"""
        if self.started is not None:
            at = time.perf_counter() if now is None else now
            self.beside_s = _COMPRESSING.beside_s - self.beside_from
            self.other_s = max(at - self.started - self.counted_s() + self.beside_s, 0.0)
        return self.other_s


def profile(
    classes: list[ClassSample],
    candidates: Sequence[Candidate],
    *,
    time_budget_s: float | Callable[[float], float],
    measure_fn: MeasureFn = measure,
    spent_out: PlanCost | None = None,
    decode_budget_s: float | None = None,
    balanced: bool = False,
    cold_fn: ColdFn | None = None,
) -> list[ClassProfile]:
    """Measure every candidate on every class's sample and project it to the whole class.

    1. The reference (`reference_of`) is measured on every unit of every class's sample: it
       projects the class, and every other candidate is compared with it on the same units.
    2. `time_budget_s` is shared among the classes (`class_shares`: a floor, the rest by
       the bytes the reference saves on each). In each class, a pilot of PILOT_BYTES per
       candidate, cheapest first; a candidate whose pilot would overrun the class's share
       (judged by its cost per byte on earlier classes) is not measured. With a loose
       `decode_budget_s` (or none) the densest candidates go first, else the cheapest;
       `balanced` (a budget of the reference's own decode, known only after profiling):
       the densest of the codecs that decode about as fast as the reference first (zstd's
       levels, with a dictionary first), then lz4's, brotli's and lzma's.
       The rest of the share then extends the pairs in rounds (`_extend`).
    3. Each estimate is the reference's projection times the candidate's size over the
       reference's on the same units (`_project`), so a slow candidate's small prefix is
       not compared with the reference's whole sample.

    With `cold_fn` (`coldmount.sample_mount`), the classes' cold costs come from it, called
    once right after the reference pass (`cold_shifts`), and its seconds count in the plan's
    share (not in `time_budget_s`: `budgets._measuring_budget`).

    The reference pass is the plan's floor: `time_budget_s` bounds what is measured after
    it. Time is counted with the measurements' own numbers (and a nominal cost for dictionary
    training), so injected measurements make plans exactly reproducible. `time_budget_s` may
    be a function of the reference's compress seconds projected onto every class (what a
    pack would spend compressing): it is called once the reference is measured. `spent_out`, if
    given, receives the budget and the seconds spent; its measurements and
    seconds from an earlier call are resumed from and count against the budget.
    """
    ref = reference_of(candidates)
    measuring = _profiling(measure_fn, ref, spent_out.cold_donors if spent_out else None)
    known = spent_out.totals if spent_out is not None else {}
    penalties = spent_out.penalties if spent_out is not None else {}
    raw = spent_out.raw if spent_out is not None else {}
    ref_decode_s = 0.0
    totals: dict[tuple[str, Candidate], Measurement] = {}
    ref_spent = 0.0
    ref_compress_s = 0.0
    if ref is not None:
        # (the real measurement sweeps over the classes, `measure_reference`)
        swept = (
            measure_reference([c for c in classes if c.units and (c.name, ref) not in known], ref)
            if measure_fn is measure
            else {}
        )
        for cls in classes:
            if cls.units:
                m = (
                    known.get((cls.name, ref))
                    or swept.get(cls.name)
                    or measure_fn(cls.name, ref, cls.measure_units, None)
                )
                if (cls.name, ref) not in known:
                    ref_spent += measurement_cost(m)
                totals[(cls.name, ref)] = m
                ref_compress_s += m.compress_s * cls.total_bytes / max(m.raw_bytes, 1)
                ref_decode_s += m.decode_s * cls.total_bytes / max(m.raw_bytes, 1)
    if spent_out is not None:  # (before the budget: a share of the pack counts it, `budgets`)
        spent_out.reference_s += ref_spent
    if ref is not None and measure_fn is measure:
        for cls in classes:
            if cls.units and (cls.name, ref) not in known:
                totals[(cls.name, ref)] = _by_reference_ratio(cls, totals[(cls.name, ref)])
    shifts = spent_out.shifts if spent_out is not None else {}
    if ref is not None and cold_fn is not None and (spent_out is None or spent_out.mounted is None):
        mounted = cold_fn([c for c in classes if c.units])
        refs = {c.name: totals[(c.name, ref)] for c in classes if c.units}
        shifts.update(cold_shifts(mounted, refs))
        if measure_fn is measure:
            start = time.perf_counter()
            penalties.update(brotli_penalties(mounted, classes, refs, shifts))
            mounted = dataclasses.replace(
                mounted, seconds=mounted.seconds + time.perf_counter() - start
            )
        if spent_out is not None:
            spent_out.mounted = mounted
    # When the decode budget is loose (at least twice what zstd:3 decodes in, or none),
    # ratio decides: the densest candidates a class can afford are measured first (with a
    # dictionary first for classes that have one). Under a tight budget, the fastest.
    dense = decode_budget_s is None or decode_budget_s >= 2 * ref_decode_s
    if balanced or dense:
        # Such a plan stores a class that compresses with a dense codec (the balanced one
        # with the densest zstd level: zstd decodes alike at every level): its pack, and so
        # the share for measuring, is predicted with that level's nominal cost there.
        ref_compress_s = _dense_compress_s(classes, candidates, ref, totals, ref_compress_s)
    budget = time_budget_s(ref_compress_s) if callable(time_budget_s) else time_budget_s
    before = spent_out.measure_s if spent_out is not None else 0.0
    spent = 0.0
    # A class's share goes by the bytes the reference saves on it: measuring 20 codecs on a
    # class of PNGs (5% saved) buys little, on a class of sources (75% saved) a lot.
    weights = []
    for cls in classes:
        rm = totals.get((cls.name, ref)) if ref is not None else None
        saved = 1.0 - rm.stored_bytes / rm.raw_bytes if rm is not None and rm.raw_bytes else 1.0
        weights.append(int(cls.total_bytes * saved))
    shares = class_shares(weights, max(budget - before, 0.0))
    seen: dict[Candidate, list[float]] = {}  # cost per raw byte of earlier pilots
    if balanced:
        order = sorted(
            candidates,
            key=lambda c: (_DECODE_FAMILY.get(c.spec.codec_id, 9), not c.use_dict, -cost_rank(c)),
        )
    else:
        order = sorted(
            candidates,
            key=lambda c: (
                (not c.use_dict, -cost_rank(c), str(c)) if dense else (cost_rank(c), str(c))
            ),
        )
    for cls, share in zip(classes, shares, strict=True):
        class_spent = _train_dictionary(cls, candidates, measuring, share) if share > 0 else 0.0
        pairs: list[tuple[Candidate, list[bytes], Measurement]] = []
        pilots = _pilots(cls, order, ref)
        for k, (cand, units, pilot) in enumerate(pilots):
            if (cls.name, cand) in known:  # measured by an earlier call: resume from it
                pairs.append((cand, units, known[(cls.name, cand)]))
                continue
            guess = _pilot_guess(seen, cand, pilot)
            if (pairs or ref is not None) and (share <= 0 or class_spent + guess > share):
                # Its pilot would take more than this class has left: costlier candidates
                # are not measured on this class.
                log.debug("%s: %s not profiled (time budget)", cls.name, cand)
                continue
            # The next pilots that would fit if this one costs its guess, compressed early
            # (`ahead`; a wrong guess is not used).
            steps: list[tuple[Sequence[bytes], CodecSpec, bytes | None]] = []
            expect = class_spent + guess
            for later, _, p in pilots[k + 1 :]:
                if len(steps) == 2:
                    break
                if (cls.name, later) not in known:
                    cost = _pilot_guess(seen, later, p)
                    if expect + cost <= share:
                        expect += cost
                        steps.append((p, later.spec, cls.dictionary if later.use_dict else None))
            ahead(*steps)
            m = measuring(cls.name, cand, pilot, cls.dictionary)
            seen.setdefault(cand, []).append(measurement_cost(m) / max(m.raw_bytes, 1))
            class_spent += measurement_cost(m)
            pairs.append((cand, units, m))
        # The class's own cold costs, out of its share before the extending rounds (injected
        # measurements have no objects of their own to time cold).
        if measure_fn is measure:
            for cand, _, _ in pairs:
                key = (cls.name, cand.spec.codec_id)
                if cand.use_dict and key not in penalties:
                    cheapest = min(
                        (c for c in candidates if c.use_dict and c.spec.codec_id == key[1]),
                        key=lambda c: (cost_rank(c), str(c)),
                    )
                    penalties[key], took = dictionary_penalty(cls, cheapest)
                    class_spent += took
            if cls.name not in raw:
                per_byte, per_chunk, took = raw_serving(cls)
                raw[cls.name] = (per_byte, per_chunk)
                class_spent += took
        extended = _extend(cls, pairs, share - class_spent, measuring)
        for cand, m in extended:
            totals[(cls.name, cand)] = m
        spent += class_spent + sum(
            measurement_cost(m) - measurement_cost(p)
            for (_, m), (_, _, p) in zip(extended, pairs, strict=True)
        )
    # The dictionaries now trained, their cold cost through a mount of them; not under a
    # decode budget of at least twice zstd:3's decode (set before profiling: the
    # capacity-leaning modes), whose choices go by size: it took 2.9 s more of such a plan,
    # which then came to 25.8% of its pack time (run Zc13).
    loose = decode_budget_s is not None and decode_budget_s >= 2 * ref_decode_s
    if (
        cold_fn is not None
        and measure_fn is measure
        and not loose
        and (spent_out is None or spent_out.dict_mounted is None)
    ):
        users = [c for c in classes if c.dictionary and (c.name, CODEC_ZSTD) in penalties]
        if users and ref is not None:
            dict_mounted = cold_fn(users, dictionaries=True)
            start = time.perf_counter()
            refs = {c.name: totals[(c.name, ref)] for c in users}
            paid = dictionary_penalties(dict_mounted, users, refs, shifts)
            # (timed hot per class: only where a candidate would take it)
            lz4_paid = (
                lz4_dictionary_penalties(dict_mounted, users, refs, shifts)
                if any(c.use_dict and c.spec.codec_id == CODEC_LZ4 for c in candidates)
                else {}
            )
            dict_mounted = dataclasses.replace(
                dict_mounted, seconds=dict_mounted.seconds + time.perf_counter() - start
            )
            if spent_out is not None:
                spent_out.dict_mounted = dict_mounted
                spent_out.dict_shifts.update({k[0]: v - penalties[k] for k, v in paid.items()})
            penalties.update(paid)
            penalties.update(lz4_paid)
    if spent_out is not None:
        spent_out.budget_s = budget
        spent_out.measure_s += spent
        spent_out.totals = totals
        spent_out.penalties = penalties
        spent_out.raw = raw
    return [
        _project(
            cls, candidates, totals, ref, penalties, raw.get(cls.name), shifts.get(cls.name, 0.0)
        )
        for cls in classes
    ]


def _by_reference_ratio(cls: ClassSample, m: Measurement) -> Measurement:
    """Reorder `cls`'s measured units so that every prefix spreads over how well the
    reference (`m`, measured on every one of them) compresses them
    (`sampling.by_reference_ratio`), and return `m` with its units in the same order. Done
    once, before any other candidate is measured on them (a dictionary is trained on the
    even units after it)."""
    units = cls.measure_units
    if len(m.unit_stored) != len(units) or len(units) < 2:
        return m
    order = by_reference_ratio(units, m.unit_stored)
    cls.units[: len(units)] = [units[i] for i in order]

    def moved(values: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(values[i] for i in order) if len(values) == len(order) else values

    return dataclasses.replace(
        m,
        unit_stored=tuple(m.unit_stored[i] for i in order),
        unit_decode=moved(m.unit_decode),
        beside=moved(m.beside),
    )


def _pilot_guess(seen: dict[Candidate, list[float]], cand: Candidate, pilot: list[bytes]) -> float:
    """What measuring `cand` on `pilot` is guessed to cost: the median cost per byte of its
    pilots on earlier classes (`seen`), at least a nominal one (until a class has shown its
    cost: a codec that only probes an incompressible class costs next to nothing, and would
    mislead the next class)."""
    rates = seen.get(cand)
    rate = sorted(rates)[len(rates) // 2] if rates else 0.0
    rate = max(rate, cost_rank(cand) * NOMINAL_S_PER_BYTE)
    return rate * _bytes(pilot)


def _pilots(
    cls: ClassSample, order: Sequence[Candidate], ref: Candidate | None
) -> list[tuple[Candidate, list[bytes], list[bytes]]]:
    """The candidates `profile` may measure on `cls`, in `order`: each with the units it is
    measured on and its pilot's. Dictionary candidates are measured on the units the
    dictionary was not trained on (the odd ones), or the estimate would flatter them."""
    out = []
    for cand in order:
        if cand in (NONE, ref) or (cand.use_dict and cls.dictionary is None):
            continue
        units = cls.measure_units[1::2] if cand.use_dict else cls.measure_units
        pilot = units[: _prefix(units, 0, PILOT_BYTES)]
        if pilot:
            out.append((cand, units, pilot))
    return out


ColdFn = Callable[..., MountedSample]  # (classes, *, dictionaries=False): `sample_mount`


def cold_shifts(mounted: MountedSample, refs: dict[str, Measurement]) -> dict[str, float]:
    """By how much each class's cold penalty per object (`per_object_penalty`) is to be
    shifted so that the reference's is what the sample's mount paid: the class's decode
    there less the reference pass's hot decode of the same units, per unit, less the
    method's penalty (`refs`: the reference's measurement by class). The shift is added to
    every cold penalty of the class (each candidate's, a dictionary's, raw chunks', solid
    blocks'), so the method's differences between them stay and only the level moves. A
    class the trace charged nothing (its units all stored as another class's chunks, or
    empty) keeps the method."""
    out = {}
    for name, traced in mounted.decode_s.items():
        m = refs.get(name)
        if m is None or not m.units or traced <= 0:
            continue
        paid = (traced - m.decode_s / m.cold) / m.units
        out[name] = paid - per_object_penalty(m)
    return out


def dictionary_penalties(
    mounted: MountedSample,
    classes: Sequence[ClassSample],
    refs: dict[str, Measurement],
    shifts: dict[str, float],
) -> dict[tuple[str, int], float]:
    """Each class's zstd dictionary penalty per chunk (`dictionary_penalty`'s) as the mount
    of its dictionary's units paid it: the class stored with zstd:3 and its dictionary
    decodes in the reference's projection (`project_decode`, with the class's shift) times
    the ratio of the dictionary's units (`dictionary_units`) decoded with it to the same
    units without it, read among them in one mount (`sample_mount` with dictionaries), its
    hot decode the reference's times the same ratio hot here. Less the class's shift, which
    `_project` adds to every cold penalty of the class (`refs`: the reference's measurement
    by class). A class either mount charged nothing keeps its penalty.

    The method's penalty (4 MiB written before each decode) put a dictionary decode of the
    real dataset's small text files at 0.96-1.09x zstd:3's, shift and all; a shuffled epoch
    through the mount read them at 1.22-1.86x the default pack's. The same files read
    through a mount with their dictionary, among the same without, came to 0.83-1.23x that
    ratio in seven classes of eight. What the dictionaries' mount paid per unit, taken as the
    penalty itself, followed the classes of small files but put the JSON files (sampled in
    units of 87 KB, stored in chunks of 47 KB) at 1.6x what the pack's epoch read; the
    ratio taken across two mounts (the units without the dictionary read in the sample's,
    before the plan's profiling), 1.3-1.9x for the small files (docs/benchmarks.md)."""
    users = [c for c in classes if c.dictionary]
    return _mounted_penalties(
        users, refs, shifts, REFERENCE.spec, (mounted.decode_s, mounted.plain_s), dictionary_units
    )


def lz4_dictionary_penalties(
    mounted: MountedSample,
    classes: Sequence[ClassSample],
    refs: dict[str, Measurement],
    shifts: dict[str, float],
) -> dict[tuple[str, int], float]:
    """Each class's lz4 dictionary penalty per chunk as the mount of its dictionary's units
    paid it, as `dictionary_penalties` takes zstd's: the same units stored with
    LZ4_DICT_LEVEL and the dictionary (`MountedSample.lz4_s`) against the same without a
    dictionary, read among them in one mount; less the class's shift.

    The method's penalty (4 MiB written before each decode) put lz4hc:9 with a dictionary
    under what a shuffled epoch through the mount read in every run that chose it: the real
    dataset's PNG files 1.35x and 1.51x their predicted ratio to the default pack's, `.pm`
    1.90x, `.po` 1.31x and 1.40x, the ONNX files 1.27x."""
    return _mounted_penalties(
        classes,
        refs,
        shifts,
        parse_codec(LZ4_DICT_LEVEL),
        (mounted.lz4_s, mounted.plain_s),
        dictionary_units,
    )


def brotli_penalties(
    mounted: MountedSample,
    classes: Sequence[ClassSample],
    refs: dict[str, Measurement],
    shifts: dict[str, float],
) -> dict[tuple[str, int], float]:
    """Each class's brotli cold penalty per chunk as the sample's mount paid it, as
    `dictionary_penalties` takes a dictionary's: the class stored with brotli decodes in
    the reference's projection times the ratio of its `brotli_units` read stored with
    BROTLI_LEVEL to the same units' zstd:3 chunks, read among the whole sample's zstd:3 units
    in one mount; less that level's hot decode, the reference's times their ratio hot here,
    and less the class's shift. A class the mount charged nothing keeps the method's.

    The method's penalty (4 MiB written before each decode, on the few units a brotli level
    is measured on) put brotli:11's decode of the real dataset's text files and HTML at
    1.6-1.9x zstd:3's, cold parts and all, 0.7x zstd:3's cold part on the text files; a
    shuffled epoch through the mount read them at 2.8-2.9x the default pack's, where a hot
    loop decodes them at 2.1x. Read among their own zstd:3 copies, half of the mount's
    decodes, they came to 2.2x: what is cold is brotli's decoder among the other classes'."""
    traced = (mounted.brotli_s, mounted.brotli_base_s)
    return _mounted_penalties(
        classes, refs, shifts, parse_codec(BROTLI_LEVEL), traced, brotli_units
    )


def _mounted_penalties(
    classes: Sequence[ClassSample],
    refs: dict[str, Measurement],
    shifts: dict[str, float],
    spec: CodecSpec,
    traced: tuple[dict[str, float], dict[str, float]],
    units_of: Callable[[ClassSample], list[bytes]],
) -> dict[tuple[str, int], float]:
    """`_mounted_penalty` by (class, codec id) for each class with chunks, a reference
    measurement in `refs` and both of `traced` (its units stored with `spec`, and with
    zstd:3) above 0."""
    out = {}
    for cls in classes:
        paid, base = (seconds.get(cls.name, 0.0) for seconds in traced)
        m = refs.get(cls.name)
        if paid <= 0 or base <= 0 or m is None or not cls.chunks:
            continue
        shift = shifts.get(cls.name, 0.0)
        out[(cls.name, spec.codec_id)] = _mounted_penalty(
            cls, m, shift, paid / base, spec, units_of(cls)
        )
    return out


def _mounted_penalty(
    cls: ClassSample,
    m: Measurement,
    shift: float,
    ratio: float,
    spec: CodecSpec,
    units: Sequence[bytes],
) -> float:
    """The cold penalty per chunk of `cls` stored with `spec` (and the class's dictionary
    for zstd and lz4) when `units` stored so decoded `ratio` times as long through a mount
    as stored with zstd:3: the reference's projection (`m`, with `shift`) times `ratio`, less
    the hot decode (the reference's times the same units' ratio hot here), over the chunks,
    less `shift`."""
    dictionary = cls.dictionary if spec.codec_id in DICT_CODECS else None
    decode_s, warm_s = project_decode(m, cls.total_bytes, cls.chunks, shift)
    stored = _objects([compress_object(u, spec, dictionary) for u in units], units)
    plain = _objects([compress_object(u, REFERENCE.spec) for u in units], units)
    _, hot, hot_plain, _ = _timed_decode(stored, dictionary, beside=plain)
    hot_ratio = sum(hot) / max(sum(hot_plain), 1e-9)
    return (decode_s * ratio - warm_s * hot_ratio) / cls.chunks - shift


# A class the reference shrinks by at least this share is predicted, in the balanced mode, to
# be stored with the densest zstd level.
DENSE_SAVING: Final = 0.1


def _dense_compress_s(
    classes: list[ClassSample],
    candidates: Sequence[Candidate],
    ref: Candidate | None,
    totals: dict[tuple[str, Candidate], Measurement],
    ref_compress_s: float,
) -> float:
    """The compress seconds of a pack with the densest plain zstd candidate on every class
    the reference shrinks by DENSE_SAVING or more (nominal cost, at least the reference's
    measured one), and the reference elsewhere."""
    levels = [
        c
        for c in candidates
        if c.spec.codec_id == CODEC_ZSTD and not c.use_dict and not c.spec.shuffle
    ]
    if ref is None or not levels:
        return ref_compress_s
    rate = cost_rank(max(levels, key=cost_rank)) * NOMINAL_S_PER_BYTE
    total = 0.0
    for cls in classes:
        m = totals.get((cls.name, ref))
        if m is None or not m.raw_bytes:
            continue
        own = m.compress_s * cls.total_bytes / m.raw_bytes
        saved = 1.0 - m.stored_bytes / m.raw_bytes
        total += max(own, rate * cls.total_bytes) if saved >= DENSE_SAVING else own
    return total


def _extend(
    cls: ClassSample,
    pairs: list[tuple[Candidate, list[bytes], Measurement]],
    seconds: float,
    measure_fn: MeasureFn,
) -> list[tuple[Candidate, Measurement]]:
    """Extend every pair's measurement over more of its units within `seconds`, in rounds:
    each round offers every pair as many more bytes as it has seen (cheapest pairs first),
    cut to what its cost so far says fits in the time left. A pilot's cost per byte can be
    far off on a mixed class (a JPEG probe is cheap, the text after it is not), so the rate
    is re-estimated after every step instead of planned once."""
    done = [m for _, _, m in pairs]
    left = seconds
    grew = True
    while grew and left > 0:
        grew = False
        for i, (cand, units, _) in enumerate(pairs):
            end = _extension(units, done[i], left)
            if end is None:
                continue
            m = done[i]
            # The next pairs' steps as they would be if this one costs what its rate says,
            # compressed early (`ahead`; a wrong guess is not used).
            guess = left - measurement_cost(m) / max(m.raw_bytes, 1) * _bytes(units[m.units : end])
            steps: list[tuple[Sequence[bytes], CodecSpec, bytes | None]] = []
            for j in range(i + 1, len(pairs)):
                if len(steps) == 2:
                    break
                later = _extension(pairs[j][1], done[j], guess)
                if later is not None:
                    dic = cls.dictionary if pairs[j][0].use_dict else None
                    steps.append((pairs[j][1][done[j].units : later], pairs[j][0].spec, dic))
            ahead(*steps)
            more = measure_fn(cls.name, cand, units[m.units : end], cls.dictionary)
            left -= measurement_cost(more)
            done[i] = m + more
            grew = True
    return [(cand, m) for (cand, _, _), m in zip(pairs, done, strict=True)]


def _extension(units: list[bytes], m: Measurement, left: float) -> int | None:
    """Where `_extend`'s next step of a pair measured as `m` on the first `m.units` of `units`
    ends, with `left` seconds: as many more bytes as it has seen (at least PILOT_BYTES), cut
    to what its cost per byte so far says fits; None if no unit does."""
    if m.units >= len(units) or left <= 0:
        return None
    rate = measurement_cost(m) / max(m.raw_bytes, 1)
    want = max(m.raw_bytes, PILOT_BYTES)
    if rate > 0:
        want = min(want, int(left / rate))
    end = _prefix(units, m.units, want) if want > 0 else m.units
    if rate > 0 and rate * _bytes(units[m.units : end]) > left:
        end -= 1  # the last unit would overrun: leave it
    return end if end > m.units else None


def _bytes(units: Sequence[bytes]) -> int:
    return sum(len(u) for u in units)


# After the selection, a class whose chosen candidate was measured on fewer units than this
# (of a sample that holds more) is measured on that many, and the plan selects again
# (`confirm`): the win test needs FEW_UNITS and more to mean anything, and one unit carries
# its luck into the decode projection as well as the size. On the real dataset the balanced
# plan chose brotli:11 for the PAM images on one 128 KiB block: projected 8.6 MB and 0.07 s
# of decode, the class took 11.2 MB and 0.23 s through the mount.
CONFIRM_UNITS: Final = 4
# Where the measured units' decode times vary, the chosen candidate is confirmed on more:
# enough for a standard error of CONFIRM_ERROR on the class's projected decode time, at most
# CONFIRM_MAX_UNITS. The shared objects of the real dataset decode at 26 to 257 MB/s per
# 128 KiB block (lzma:6, 5th and 95th percentile): projections from 11 blocks fell within
# 0.75-1.23x of the class's decode time in 90% of random draws, from 30 within 0.85-1.14x
# (by bytes; paired with zstd:3's decode on the same blocks, 0.68-1.20x and 0.78-1.13x).
CONFIRM_ERROR: Final = 0.08
CONFIRM_MAX_UNITS: Final = 32


def decode_error(m: Measurement, base: Sequence[float]) -> float | None:
    """The relative standard error of the class decode time projected from `m` as a ratio
    estimate: its units' decode times over `base`, per unit the same quantity the projection
    scales by (the reference's decode times on the same units, as `_paired_decode` pairs
    them, or the units' sizes). None without per-unit times for at least two units."""
    times = m.unit_decode
    n = len(times)
    if n < 2 or len(base) != n or sum(times) <= 0 or sum(base) <= 0:
        return None
    ratio = sum(times) / sum(base)
    spread = sum((t - ratio * b) ** 2 for t, b in zip(times, base, strict=True)) / (n - 1)
    return math.sqrt(spread / n) / (sum(times) / n)


# Student's t (two-sided 95%) for 1 to 10 degrees of freedom, for `_small_sample`.
_T95: Final = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def _small_sample(units: int) -> float:
    """How much a standard error estimated from `units` units is widened so that it may be
    read as a normal one: Student's t over the normal 1.96 (1.62 on 4 units, 1.18 on 10;
    beyond 10 degrees of freedom t is about 1.96 + 2.4 / df)."""
    df = units - 1
    if df < 1:
        return math.inf
    t = _T95[df - 1] if df <= len(_T95) else 1.96 + 2.4 / df
    return t / 1.96


# A candidate whose decoder's pace follows the content (brotli, lzma) decodes unlike the
# reference from one unit to the next: brotli:11 over zstd:3, per 128 KiB block of the real
# dataset's PAM images and `.syso` objects, had a coefficient of variation of 0.49 and 0.41
# (p10-p90 1.6-5.2x; zstd:12 over zstd:3 on the HTML 0.15, lz4hc:9 with a shuffle on the PPM
# images 0.19). A few units' own spread does not show it: brotli:11 was chosen for the PAM
# images on 4 units that decoded at 0.56x the class's rate, and the class decoded 1.85x its
# prediction through the mount (docs/benchmarks.md, "2026-11-29, evening"). So its decode
# estimate's error is taken as at least this over the square root of its units.
CONTENT_PACED_CV: Final = 0.45


# Other decoders than the reference's (lz4, a shuffle undone after zstd) and zstd's
# searching levels (from SEARCHING_ZSTD_LEVEL: the binary-tree parsers, whose matches reach
# further back) decode unlike zstd:3 from one unit to the next too, if less: per 128 KiB
# block of the real dataset, zstd:19 over zstd:3 had a coefficient of variation of
# 0.17-0.51 over twelve classes (the PAM images 0.29, the shared objects 0.22), zstd:15
# 0.20-0.29, zstd:1 with a shuffle 0.34-0.42, lz4hc:9 0.14-0.59, where zstd:12 had 0.04-0.19
# and zstd:3 against itself 0.07-0.08 (the timing's own noise). A few units' own spread
# hides it: zstd:19 was projected for the PAM images on 3 blocks that decoded at 1.04x
# zstd:3 (taken for 1.0, `_paired_decode`), where all 306 blocks decode at 1.43x and the
# mount read the class at 1.40-1.66x the default pack's in four plans. (Confirming rarely
# has the seconds to buy the units this asks for in a balanced plan: what moved the PAM
# images' estimate was the units' order, `sampling.by_reference_ratio`.)
OTHER_PACE_CV: Final = 0.25
SEARCHING_ZSTD_LEVEL: Final = 13


def _error_floor(cand: Candidate) -> float:
    """CONTENT_PACED_CV for a candidate of brotli or lzma, OTHER_PACE_CV for one of lz4, with
    a shuffle or of zstd from SEARCHING_ZSTD_LEVEL, else 0 (zstd's faster levels, NONE)."""
    spec = cand.spec
    if spec.codec_id in (CODEC_BROTLI, CODEC_LZMA):
        return CONTENT_PACED_CV
    if spec.codec_id == CODEC_NONE or (
        spec.codec_id == CODEC_ZSTD and not spec.shuffle and spec.level < SEARCHING_ZSTD_LEVEL
    ):
        return 0.0
    return OTHER_PACE_CV


def _floored_error(m: Measurement, base: Sequence[float], floor: float) -> float | None:
    """`decode_error` of `m` over `base`, at least `floor` over the square root of its units
    (`_error_floor`)."""
    error = decode_error(m, base)
    return None if error is None else max(error, floor / math.sqrt(m.units))


def confirm_units(m: Measurement, base: Sequence[float], available: int, floor: float = 0.0) -> int:
    """How many units `confirm` wants a chosen candidate measured on: CONFIRM_UNITS, or as
    many as a decode estimate within CONFIRM_ERROR needs (`decode_error` over `base`, at
    least `floor` over the square root of the units (`_error_floor`), widened by
    `_small_sample`: an error estimated from 4 units is itself uncertain, and on the real
    dataset lzma:6 choices confirmed on 4 units of the PAM, PPM and `.syso` images decoded
    1.5-1.7x their projection outside the mount; the error shrinks with the square root of
    the units), at most CONFIRM_MAX_UNITS and `available`."""
    want = CONFIRM_UNITS
    error = _floored_error(m, base, floor)
    if error is not None:
        wide = error * _small_sample(m.units)
        if wide > CONFIRM_ERROR:
            want = max(want, math.ceil(m.units * (wide / CONFIRM_ERROR) ** 2))
    return min(want, CONFIRM_MAX_UNITS, available)


def confirm(
    classes: Sequence[ClassSample],
    chosen: Sequence[Candidate],
    candidates: Sequence[Candidate],
    cost: PlanCost,
    measure_fn: MeasureFn,
    seconds: float,
    *,
    for_decode: bool = True,
) -> float:
    """Measure each class's chosen candidate (`chosen`, in the order of `classes`; the
    reference of `candidates` needs no confirming: it saw every unit) within `seconds`:
    on CONFIRM_UNITS units, the largest classes first, then (`for_decode`) on those
    `confirm_units` asks for with the seconds left, the classes whose projected decode is
    least certain in seconds first (`_decode_doubt`; as many units as fit by the
    candidate's cost so far; a class whose next units would not fit is left). The
    measurements join `cost.totals` and count in `cost.measure_s`; returns the seconds
    spent (0: nothing to confirm, or no room)."""
    ref = reference_of(candidates)
    measuring = _profiling(measure_fn, ref, cost.cold_donors)
    spent = 0.0
    # First every choice on CONFIRM_UNITS (what decides a size win), then more units where
    # the decode estimate needs them, with the seconds left.
    for more_for_decode in (False, True) if for_decode else (False,):
        if more_for_decode:
            doubt = [
                _decode_doubt(cls, cand, cost, ref)
                for cls, cand in zip(classes, chosen, strict=True)
            ]
            order = sorted(range(len(classes)), key=lambda k: -doubt[k])
        else:
            order = sorted(range(len(classes)), key=lambda k: -classes[k].total_bytes)
        for i in order:
            cls, cand = classes[i], chosen[i]
            m = cost.totals.get((cls.name, cand))
            if cand in (NONE, ref) or m is None:
                continue
            units = cls.measure_units[1::2] if cand.use_dict else cls.measure_units
            least = min(CONFIRM_UNITS, len(units))
            want = least
            if more_for_decode:
                base = _decode_base(cls, cand, m, ref, cost)
                want = confirm_units(m, base, len(units), _error_floor(cand))
            rate = measurement_cost(m) / max(m.raw_bytes, 1)
            while want >= least and rate * _bytes(units[m.units : want]) > seconds - spent:
                want -= 1
            if m.units >= want or want < least:
                continue
            more = measuring(cls.name, cand, units[m.units : want], cls.dictionary)
            cost.totals[(cls.name, cand)] = m + more
            spent += measurement_cost(more)
            log.debug("%s: %s confirmed on %d units", cls.name, cand, want)
    cost.measure_s += spent
    return spent


def _decode_doubt(
    cls: ClassSample, cand: Candidate, cost: PlanCost, ref: Candidate | None
) -> float:
    """How many seconds the class's projected decode with `cand` may be off: the projection
    (its measurement's decode per byte over the class's bytes) times its standard error
    widened for the units it stands on (`decode_error`, `_small_sample`; the projection
    itself without per-unit times). On the real dataset the balanced plan's choices that
    stood on 4 units (brotli:11 for `.mo` and `(other)`, lzma:6 for PPM) carried 9-13% of
    its decode each and read 1.5-2.5x their projection, while confirming, ordered by bytes,
    spent its seconds on the PNG and Python classes first. (The error is at least
    `_error_floor`'s.)"""
    m = cost.totals.get((cls.name, cand))
    if m is None or m.raw_bytes <= 0:
        return 0.0
    projected = m.decode_s * cls.total_bytes / m.raw_bytes
    error = _floored_error(m, _decode_base(cls, cand, m, ref, cost), _error_floor(cand))
    return projected * (1.0 if error is None else min(error * _small_sample(m.units), 1.0))


def _decode_base(
    cls: ClassSample, cand: Candidate, m: Measurement, ref: Candidate | None, cost: PlanCost
) -> Sequence[float]:
    """What the projection of `m`'s decode time scales by, per unit it covers: the
    reference's decode times on the same units (`_paired_decode`), or their sizes when the
    reference has no per-unit times."""
    paired = _beside(m, ref)
    if paired is not None:
        return paired
    ref_m = cost.totals.get((cls.name, ref)) if ref is not None else None
    ids = _unit_ids(cand, m)
    if ref_m is not None and len(ref_m.unit_decode) >= len(cls.measure_units):
        return [ref_m.unit_decode[k] for k in ids]
    return [len(cls.measure_units[k]) for k in ids]


def measurement_cost(m: Measurement) -> float:
    """Seconds a measurement took: one compress pass, DECODE_PASSES decode passes, the rest."""
    return m.compress_s + DECODE_PASSES * m.decode_s + m.overhead_s


def _train_dictionary(
    cls: ClassSample, candidates: Sequence[Candidate], measure_fn: MeasureFn, share: float
) -> float:
    """Train the class's dictionary, its size chosen by measurement; returns the seconds it
    counts against the time budget.

    One dictionary per size in DICT_SIZES that the training set (the even units, at most
    DICT_TRAIN_MAX_BYTES) is at least four times as large as (or one of a quarter of the
    training set when it is smaller than all of them); each is measured with the
    first dictionary candidate's codec on a pilot of the odd units, and the one that makes
    the class smallest, its own bytes included, is kept.
    """
    users = sorted((c for c in candidates if c.use_dict), key=lambda c: (cost_rank(c), str(c)))
    if cls.dictionary is not None or not users or not cls.units:
        return 0.0
    if cls.median_unit > DICT_MAX_OBJECT_BYTES or looks_incompressible(b"".join(cls.units[:16])):
        return 0.0
    train = cls.units[0::2]
    train = train[: _prefix(train, 0, DICT_TRAIN_MAX_BYTES)]
    train_bytes = sum(len(u) for u in train)
    test = cls.measure_units[1::2]
    test = test[: _prefix(test, 0, 4 * PILOT_BYTES)]
    test_bytes = sum(len(u) for u in test)
    sizes = [d for d in DICT_SIZES if 4 * d <= train_bytes] or [dictionary_size(train_bytes)]
    spent = 0.0
    best: tuple[float, bytes] | None = None
    for size in sizes:
        if best is not None and spent > share / 2:
            break  # the class's share of the budget: keep the sizes measured so far
        spent += train_bytes * DICT_TRAIN_S_PER_BYTE
        dictionary = train_dictionary(train, size)
        if dictionary is None or not test_bytes:
            continue
        if len(sizes) == 1:
            best = (0.0, dictionary)
            break
        m = measure_fn(cls.name, users[0], test, dictionary)
        spent += measurement_cost(m)
        projected = m.stored_bytes * cls.total_bytes / max(m.raw_bytes, 1) + len(dictionary)
        if best is None or projected < best[0]:
            best = (projected, dictionary)
    cls.dictionary = best[1] if best else None
    return spent


# The balanced mode's profiling order by codec: those that decode about as fast as zstd:3
# (zstd at every level) before the faster ones that only free decode time (lz4) and the
# slower ones that need it (brotli, then lzma).
_DECODE_FAMILY: Final = {CODEC_NONE: 0, CODEC_ZSTD: 0, CODEC_LZ4: 1, CODEC_BROTLI: 2, CODEC_LZMA: 3}


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


def _paired(cand: Candidate, m: Measurement, ref_m: Measurement | None) -> tuple[float, bool]:
    """(the candidate's stored bytes over the reference's on the same units, whether it was
    shown to be smaller by WIN_SIGMAS standard errors); (nan, True) when not comparable."""
    if ref_m is None or not m.unit_stored or not ref_m.unit_stored:
        return math.nan, True
    ref_units = ref_m.unit_stored[1::2] if cand.use_dict else ref_m.unit_stored
    n = len(m.unit_stored)
    if len(ref_units) < n:
        return math.nan, True
    ref_sum = sum(ref_units[:n])
    if ref_sum <= 0 or ref_sum >= m.raw_bytes:
        # The reference stored these units raw: nothing to compare a codec with on them.
        return math.nan, True
    ratio = sum(m.unit_stored) / ref_sum
    # Units that hold most of the bytes decide the ratio: n units of which one is nearly all
    # the bytes are about one unit's worth of evidence.
    effective = ref_sum * ref_sum / max(sum(r * r for r in ref_units[:n]), 1)
    if n < FEW_UNITS or effective < FEW_UNITS:
        # (the units holding less than FEW_UNITS_MIN_SHARE of the bytes each need only be
        # no larger together)
        cut = FEW_UNITS_MIN_SHARE * ref_sum
        pairs = list(zip(m.unit_stored, ref_units[:n], strict=True))
        wins = all(c <= (1 - FEW_UNITS_GAIN) * r for c, r in pairs if r >= cut)
        wins = wins and sum(c - r for c, r in pairs if r < cut) <= 0
    else:
        # The standard error of the ratio of sums (the projection), from each unit's
        # departure from it: a codec that saves the same share of every unit wins however
        # unequal the units are. (The difference of sums' error grew with the units' sizes:
        # on `(other)`, units of 0.1 to 60 KB, brotli:11 and lzma:6 projected 14-16% smaller
        # than zstd:3 on 31-45 units and lost; zstd:19 was stored, 8% larger than them.)
        mean_ref = ref_sum / n
        resid = [c - ratio * r for c, r in zip(m.unit_stored, ref_units[:n], strict=True)]
        var = sum(e * e for e in resid) / (n - 1)
        wins = ratio < 1 and (var == 0 or 1 - ratio > WIN_SIGMAS * math.sqrt(var / n) / mean_ref)
    return ratio, wins


def _paired_decode(
    cand: Candidate, m: Measurement, ref: Candidate | None, ref_m: Measurement
) -> float:
    """The candidate's decode seconds over the reference's, or nan when either has no
    per-unit times or the reference decoded nothing on the candidate's units.

    Warm-cache times are compared on the same units (the odd ones for a dictionary
    candidate): a pilot's few units may decode faster or slower than the class, and the
    ratio carries over to the class where the pilot's own rate does not. The reference's
    times are those timed beside the candidate's in the same passes (`Measurement.beside`)
    where `measure` took them, else its own measurement's on those units. The cold-cache
    factor, measured on a few objects, varies by 1.3-1.9x between runs on the same units:
    a candidate of the reference's codec (another zstd level, a dictionary) shares the
    reference's, measured over the whole sample, and other codecs keep their own, as does a
    shuffle (undoing it is a pass over the output of its own: on the real FITS images
    zstd:19+shuf4 was projected to decode as fast as zstd:3, and its blocks took 1.6x the
    projection). A dictionary candidate's cold cost is its own (`dictionary_penalty`, added
    in `_project`); here it shares the reference's like the other levels. A candidate of
    the reference's decoder (zstd decodes about as fast at every level) is taken to decode
    exactly as fast as the reference unless their ratio differs from 1 by WIN_SIGMAS of its
    standard errors and by more than SAME_DECODE: the balanced mode's budget is
    the reference's own decode, and a level that differs by noise alone would otherwise be
    kept out of it, or let in, by chance."""
    n = len(m.unit_decode)
    if not n:
        return math.nan
    ref_units = _beside(m, ref)
    if ref_units is None:
        if not ref_m.unit_decode:
            return math.nan
        ref_units = ref_m.unit_decode[1::2] if cand.use_dict else ref_m.unit_decode
        if len(ref_units) < n:
            return math.nan
    ref_sum = sum(ref_units[:n])
    if ref_sum <= 0:
        return math.nan
    if not _same_decoder(cand, ref):
        return sum(m.unit_decode) / ref_sum * m.cold / ref_m.cold
    # The ratio's own standard error (`decode_error`'s), not the per-unit differences':
    # those grow with the units' sizes, so that units of mixed sizes hid a steady ratio.
    # zstd:19 over zstd:3 on the real FITS images was 2.05-2.18 on 6 units in three
    # measurements, 2.11-2.13 on 30, and the differences' test took it for 1.0 in a plan
    # whose pack then decoded them 1.92x the default pack's; `.so` 1.16-1.30, PAM 1.31-1.45.
    ratio = sum(m.unit_decode) / ref_sum
    error = decode_error(m, ref_units[:n])
    if error is None or abs(ratio - 1) <= max(SAME_DECODE, WIN_SIGMAS * error * ratio):
        return 1.0
    return ratio


def _same_decoder(cand: Candidate, ref: Candidate | None) -> bool:
    # (a shuffle is undone by a pass of its own over the output: not the same decoder)
    return (
        ref is not None
        and cand.spec.codec_id == ref.spec.codec_id
        and cand.spec.shuffle == ref.spec.shuffle
    )


def _beside(m: Measurement, ref: Candidate | None) -> tuple[float, ...] | None:
    """The reference's decode times of `m`'s units timed beside the candidate's
    (`Measurement.beside`), when the reference is REFERENCE and `m` has them for every unit."""
    if ref == REFERENCE and m.beside and len(m.beside) == len(m.unit_decode):
        return m.beside
    return None


def _unit_ids(cand: Candidate, m: Measurement) -> range:
    """The sample units (indexes into `ClassSample.measure_units`) a measurement covers: a
    prefix, of the odd units for a dictionary candidate."""
    return range(1, 2 * m.units, 2) if cand.use_dict else range(m.units)


def _consistent(
    rows: Sequence[tuple[Candidate, Measurement, float, float, bool]], ref: Candidate | None
) -> dict[Candidate, float]:
    """Each candidate's projected stored bytes (dictionary excluded), made consistent with the
    candidates measured on more units: a candidate that is no smaller than a better-measured
    one on the units both saw is projected as that one's projection times their size ratio
    there, so never below it.

    Every projection is the reference's times the candidate's size ratio to it on its own
    units, so a candidate measured on a few units carries their luck: on the real dataset,
    zstd:19 measured on one 128 KiB block of the PAM images projected 9.0 MB, where lzma:6
    on five blocks projected 9.5 MB, and the class stored with zstd:19 took 12.9 MB against
    lzma:6's 10.5 MB. On the units both saw, the better-measured candidate shows what the
    lucky block hides. A candidate smaller there keeps its own projection: scaling it too
    would charge every costly candidate the noise of its few units (lzma:6 on eight `.mo`
    files, scaled through brotli:11, lost to a dictionary that stored the class 11% larger)."""
    out = {cand: stored for cand, _, stored, _, _ in rows}
    ranked = sorted(rows, key=lambda r: (-r[1].units, str(r[0])))
    for i, (cand, m, _, _, _) in enumerate(ranked):
        if cand == ref or not m.unit_stored:
            continue
        ids = _unit_ids(cand, m)
        own = sum(m.unit_stored)
        for other, om, _, _, _ in ranked[:i]:
            if om.units <= m.units or not om.unit_stored:
                continue
            by_id = dict(zip(_unit_ids(other, om), om.unit_stored, strict=True))
            if not all(j in by_id for j in ids):
                continue
            theirs = sum(by_id[j] for j in ids)
            if 0 < theirs <= own:
                out[cand] = max(out[cand], out[other] * own / theirs)
    return out


def per_object_penalty(m: Measurement) -> float:
    """The seconds each of `m`'s units decoded slower with cold caches than hot: its decode
    over its hot passes (`Measurement.cold`), spread over its units."""
    if not m.units or m.cold <= 1.0:
        return 0.0
    return (m.decode_s - m.decode_s / m.cold) / m.units


def project_decode(
    m: Measurement, total_bytes: float, objects: float, shift: float = 0.0, far: float = 0.0
) -> tuple[float, float]:
    """`m`'s decode projected onto `total_bytes` stored as `objects` objects (chunks, solid
    blocks), and the same with hot caches: the hot passes per byte, the cold penalty per
    object (`per_object_penalty`). The penalty is a cost of each object, not of its bytes
    (the decoder's state, tables and code fetched again): projected per byte, it came out
    as the sample's units were large or small, and the real dataset's 46 PyTables files
    (21 KB each, sampled in units of 35 KB) decoded 1.6x their projection. With `objects`
    0 (not known) the units' own count, scaled by bytes, stands in. `shift` moves the
    penalty per object (`cold_shifts`; at least 0 after it). Where `m` was also timed with
    the last-level cache evicted (`Measurement.deep`), `far` of each object's penalty is
    that one instead (`llc_share`)."""
    if m.raw_bytes <= 0:
        return 0.0, 0.0
    hot = m.decode_s / m.cold * total_bytes / m.raw_bytes
    return hot + _penalty_s(m, total_bytes, objects, shift, far), hot


def _penalty_s(
    m: Measurement, total_bytes: float, objects: float, shift: float = 0.0, far: float = 0.0
) -> float:
    """`m`'s cold penalty over `objects` objects (`project_decode`; 0: the units' count
    scaled to `total_bytes`), each shifted by `shift`; `far` of it the deep one
    (`Measurement.deep`), projected per byte: it is mostly the dictionary's content fetched
    from memory, as far as the object's matches reach into it, and the sample's blocks
    (its runs, part-filled) are smaller than the pack's (the real dataset's Ruby docs: 48 KB
    against 119 KB, and 79 us against the 132 us the pack's blocks took)."""
    per_unit = m.units / max(m.raw_bytes, 1)
    count = objects or per_unit * total_bytes
    per_object = max(per_object_penalty(m) + shift, 0.0)
    if m.deep <= 0 or far <= 0:
        return per_object * count
    return (1.0 - far) * per_object * count + far * m.deep * per_unit * total_bytes


def _project(
    cls: ClassSample,
    candidates: Sequence[Candidate],
    totals: dict[tuple[str, Candidate], Measurement],
    ref: Candidate | None,
    penalties: dict[tuple[str, int], float] | None = None,
    raw: tuple[float, float] | None = None,
    shift: float = 0.0,
) -> ClassProfile:
    """Every measured candidate's estimate for the whole class, and NONE's (its serving cost
    `raw`, seconds per byte and per chunk, as `raw_serving` measures it; else nothing). A
    dictionary candidate with its own cold penalty in `penalties` (by class and codec id)
    decodes as the reference's warm decode times their paired ratio, plus that penalty for
    each of the class's chunks. Every cold penalty per object is moved by `shift` (the
    sample's mount, `cold_shifts`), at least 0 after it."""
    units = cls.measure_units
    per_byte, per_chunk = raw or (0.0, 0.0)
    per_chunk = max(per_chunk + shift, 0.0)
    estimates = [
        Estimate(
            NONE,
            cls.total_bytes,
            per_byte * cls.total_bytes + per_chunk * cls.chunks,
            0.0,
            len(units),
            sum(len(u) for u in units),
            warm_s=per_byte * cls.total_bytes,
        )
    ]
    ref_m = totals.get((cls.name, ref)) if ref is not None else None
    ref_decode, ref_warm = (
        project_decode(ref_m, cls.total_bytes, cls.chunks, shift) if ref_m else (math.inf, math.inf)
    )
    rows: list[tuple[Candidate, Measurement, float, float, bool]] = []
    warm_of: dict[Candidate, float] = {}
    for cand in candidates:
        m = totals.get((cls.name, cand))
        if m is None or m.raw_bytes == 0:
            continue
        stored = m.stored_bytes * cls.total_bytes / m.raw_bytes
        decode_s, warm_of[cand] = project_decode(m, cls.total_bytes, cls.chunks, shift)
        loses = False
        if ref_m is not None and cand != ref:
            rel, wins = _paired(cand, m, ref_m)
            if not math.isnan(rel):
                stored = ref_m.stored_bytes * cls.total_bytes / ref_m.raw_bytes * rel
            # The reference's hot decode times the warm ratio (without one, the candidate's
            # own hot decode), plus a cold penalty per chunk: the reference's for a
            # candidate of its decoder (measured on more units; profiling does not time
            # such a candidate cold, `_profiling`), the candidate's own for another, a
            # dictionary's own where measured.
            same = _same_decoder(cand, ref)
            rel_decode = _paired_decode(cand, m, ref, ref_m)
            if not math.isnan(rel_decode):
                warm_of[cand] = ref_warm * rel_decode
                if not same:
                    # (`_paired_decode`'s ratio is cold: warm it)
                    warm_of[cand] *= ref_m.cold / m.cold
            penalty = (penalties or {}).get((cls.name, cand.spec.codec_id))
            if penalty is not None and (cand.use_dict or cand.spec.codec_id == CODEC_BROTLI):
                # At least the reference's own penalty for a dictionary of its decoder: a
                # cold decode with a dictionary fetches all a plain one does, and its tables.
                # Measured once on a class, it came out below the reference's by noise: the
                # real dataset's `.mo` was projected at 0.56x zstd:3's decode with
                # zstd:19+dict, and read through the mount at 1.01x the default pack's.
                floor = per_object_penalty(ref_m) if same else 0.0
                decode_s = warm_of[cand] + max(max(penalty, floor) + shift, 0.0) * cls.chunks
            else:
                decode_s = warm_of[cand] + _penalty_s(
                    ref_m if same else m, cls.total_bytes, cls.chunks, shift
                )
            # (a relative tolerance: the same decode computed in another order may round
            # below the reference's, and a candidate no faster would escape the rule)
            loses = not wins and decode_s >= ref_decode * (1 - 1e-9)
        rows.append((cand, m, stored, decode_s, loses))
    stored_of = _consistent(rows, ref)
    for cand, m, _, decode_s, loses in rows:
        extra = len(cls.dictionary) if cand.use_dict and cls.dictionary else 0
        estimates.append(
            Estimate(
                cand,
                min(int(round(stored_of[cand])), cls.total_bytes) + extra,
                decode_s,
                m.compress_s * cls.total_bytes / m.raw_bytes,
                m.units,
                m.raw_bytes,
                loses,
                warm_s=min(warm_of[cand], decode_s),
            )
        )
    return ClassProfile(cls.name, cls.files, cls.total_bytes, estimates, cls.dictionary)
