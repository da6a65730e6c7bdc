"""Budgets and the plan: `PlanSettings`, the decode budget of the sync and prefetch modes,
`make_plan` (classes, sample, profile, select) and `plan_record` for the manifest.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fanfs.compression import CODEC_BROTLI, CodecSpec
from fanfs.errors import UsageError
from fanfs.optimizer.candidates import DEFAULT_CODECS, NONE, Candidate, parse_candidates
from fanfs.optimizer.classes import FileRef
from fanfs.optimizer.coldmount import sample_mount
from fanfs.optimizer.measurement import (
    CONFIRM_UNITS,
    ClassProfile,
    Estimate,
    MeasureFn,
    Measurement,
    PlanCost,
    block_data_cost,
    compress_threads,
    confirm,
    llc_share,
    measure,
    measurement_cost,
    profile,
    project_decode,
    reference_of,
    release_eviction_buffers,
)
from fanfs.optimizer.sampling import (
    ClassSample,
    ReadModel,
    fit_read_model,
    read_unit,
    sample_classes,
)
from fanfs.optimizer.selection import Objective, Selection, estimates_of, select

log = logging.getLogger(__name__)


# The balanced mode counts a solid block decoded once an epoch on each node that reads one
# of its members: the first READ of a member decodes the block, and the mount pushes the
# others into the page cache (`Prefetcher.push_mates`), where they stay through the epoch
# while the solid classes' small files fit in memory. The plan takes that for the classes
# with the fewest bytes in small files, up to this many in all (`PlanSettings.resident_bytes`),
# and for any beyond it the worst case, each member decoding its block.
SOLID_RESIDENT_BYTES: Final = 4 << 30


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """Everything `fanfs plan` and `fanfs pack --codec auto` take (see `fanfs plan --help`)."""

    mode: str = "balanced"  # "balanced" | "sync" | "prefetch" | "capacity"
    max_overhead: float = 0.05
    compute_s: float = 0.0
    read_model: ReadModel | None = None  # None: fitted on the sample reads
    target_files_per_s: float | None = None
    target_bytes_per_s: float | None = None
    decode_cores: float = 2.0
    capacity_bytes: int | None = None
    check_mode: str | None = None  # with a capacity: also hold this mode's budget
    sample_bytes: int = 64 * 1024 * 1024
    # CPU seconds of measurement; None: plan_share of the predicted pack time (`time_budget`)
    time_budget_s: float | None = None
    plan_share: float = 0.25
    jobs: int = 1  # the pack's compression threads (its predicted time divides by them)
    nodes: int = 1  # balanced: nodes that read the dataset each epoch (`node_decodes`)
    # balanced: bytes of small files in solid blocks the page cache is taken to hold
    resident_bytes: int = SOLID_RESIDENT_BYTES
    # how a decode's cost with cold caches is measured: "mount" (a mount of the sample,
    # `coldmount.sample_mount`, where FUSE works) or "method" (`measurement.cold_penalty`)
    cold_model: str = "mount"
    seed: int = 0
    candidates: tuple[Candidate, ...] = field(
        default_factory=lambda: parse_candidates(DEFAULT_CODECS)
    )


def decode_budget(
    mode: str, settings: PlanSettings, files: int, size: int, read: ReadModel
) -> float:
    """Seconds of one-thread decode allowed per epoch (every file read once), for the modes
    whose budget is known before profiling (balanced's is `reference_decode_s`).

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


def reference_decode_s(profiles: Sequence[ClassProfile], candidates: Sequence[Candidate]) -> float:
    """The balanced mode's budget: seconds of one-thread decode per epoch of the whole
    dataset stored with the reference codec (zstd:3, `fanfs pack`'s default), as profiled.

    A plan within it decodes no slower in all than the default pack, and spends what its
    cheaper classes save (an incompressible class stored raw, lz4 where it loses nothing) on
    denser codecs elsewhere: the default pack is always one of its options, so the plan is
    never projected larger. Without the reference among the candidates, the cheapest plain
    candidate stands in (`reference_of`)."""
    ref = reference_of(candidates)
    return sum(e.decode_s for e in estimates_of(profiles, ref))


def balanced_objective(
    profiles: Sequence[ClassProfile], candidates: Sequence[Candidate], settings: PlanSettings
) -> Objective:
    """The balanced mode's objective: the reference's decode (`reference_decode_s`), and the
    same with hot caches (each estimate's `warm`) as a second budget.

    A mount pays each object's decode somewhere between hot and the cold penalty the plan
    measures after evicting the caches, and where depends on the host: on the real dataset
    the plan's zstd:3 epoch came to 0.80-2.57x the default pack's measured epoch in seven
    runs, and the two most inflated plans bought lzma and brotli for large files with the
    cold penalties that dictionaries and solid blocks saved on small ones; their packs
    decoded 1.5-1.6x the default's. Held to both budgets, a selection decodes no slower
    than the reference at every point between, the penalty counted whole or not at all."""
    return Objective(
        settings.mode,
        reference_decode_s(profiles, candidates),
        settings.capacity_bytes,
        warm_budget_s=reference_warm_s(profiles, candidates),
        reference=reference_of(candidates),
    )


def reference_warm_s(profiles: Sequence[ClassProfile], candidates: Sequence[Candidate]) -> float:
    """`reference_decode_s` with hot caches (`Estimate.warm`): the balanced mode's second
    budget."""
    return sum(e.warm for e in estimates_of(profiles, reference_of(candidates)))


@dataclass(frozen=True, slots=True)
class SolidDecode:
    """A solid class's projected decode seconds, one thread, the whole class once.

    walk: read in walk order (the pack's storage order), each block decoded once and its
        members sliced from it: what reading the class through a mount in order costs.
    random: each file read alone decodes its whole block (a random epoch with no block
        cached): what the capacity-leaning modes' budget is checked with (the balanced
        mode's is an epoch per node, `SolidOptions`)."""

    walk: float
    random: float


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
    cost: PlanCost = field(default_factory=lambda: PlanCost(None))
    # Classes whose small files go into solid blocks (format 7), by measurement
    # (`_solid_classes`, or the balanced mode's `SolidOptions`), and for each its decode
    # seconds per epoch (`SolidDecode`).
    solid: frozenset[str] = frozenset()
    solid_decode: dict[str, SolidDecode] = field(default_factory=dict)

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
    block_size: int = 0,
    solid_block: int = 0,
    measure_fn: MeasureFn = measure,
    reader: Callable[[bytes, int, int], tuple[bytes, float]] = read_unit,
) -> Plan:
    """Sample, profile and select: the whole of `fanfs plan`. Real measurements compress on
    the pack's `jobs` threads (`compress_threads`): the plan's wall time then falls below
    the one-thread CPU seconds it counts against its share, which leaves it a margin for a
    pack that runs faster than predicted."""
    try:
        with compress_threads(settings.jobs if measure_fn is measure else 1):
            return _make_plan(
                files,
                settings,
                chunk_size=chunk_size,
                block_size=block_size,
                solid_block=solid_block,
                measure_fn=measure_fn,
                reader=reader,
            )
    finally:
        release_eviction_buffers()


def _make_plan(
    files: Sequence[FileRef],
    settings: PlanSettings,
    *,
    chunk_size: int,
    block_size: int,
    solid_block: int,
    measure_fn: MeasureFn,
    reader: Callable[[bytes, int, int], tuple[bytes, float]],
) -> Plan:
    start = time.perf_counter()
    budget_mode = settings.check_mode if settings.mode == "capacity" else settings.mode
    # Solid blocks: the capacity-leaning modes count each member decoding its block, which
    # their budget absorbs; the balanced mode counts a block decoded once per node
    # (`SolidOptions`). A sync budget is for one reader that may read anything.
    solid_block = solid_block if budget_mode != "sync" or settings.mode == "capacity" else 0
    classes, reads = sample_classes(
        files,
        chunk_size=chunk_size,
        block_size=block_size,
        sample_bytes=settings.sample_bytes,
        seed=settings.seed,
        reader=reader,
        solid_block=solid_block,
    )
    read_model = settings.read_model or fit_read_model(reads)
    n_files, n_bytes = len(files), sum(f.size for f in files)
    cost = PlanCost(settings.time_budget_s, started=start if measure_fn is measure else None)
    if measure_fn is measure and solid_block:
        began = time.thread_time()
        cost.block_data_s = block_data_cost(solid_block)
        cost.measure_s += time.thread_time() - began
    # The codecs' share of the measuring budget: CONFIRM_SHARE of it is kept for confirming
    # choices made on few units (`measurement.confirm`), and with solid blocks to choose,
    # SOLID_SHARE for that choice (`_solid_classes`, `_measure_balanced_solid`).
    codecs_share = 1.0 - CONFIRM_SHARE - (SOLID_SHARE if solid_block else 0.0)
    if settings.time_budget_s is None:
        # The pack reads every file (the raw-read model fitted on the sample reads) and
        # compresses on `jobs` threads: first with zstd:3 (the reference), then with the
        # codecs the first selection chose.
        read_s = read_model.seconds(n_files, n_bytes)
        # (as the reader timed them: what the plan spent; not by a given read model, which
        # on a small dataset would charge the sample at the whole pack's reading)
        cost.sample_s = sum(seconds for _, seconds in reads)

        def budget_of(ref_compress_s: float) -> float:
            cost.predicted_pack_s = pack_seconds(read_s, ref_compress_s, settings.jobs)
            if cost.aimed_pack_s is None:
                cost.aimed_pack_s = cost.predicted_pack_s
            log.debug("plan: the pack is first predicted at %.1f s", cost.predicted_pack_s)
            return _measuring_budget(settings, cost, cost.predicted_pack_s, codecs_share)

        time_budget: float | Callable[[float], float] = budget_of
    else:
        time_budget = settings.time_budget_s * codecs_share
    budget: float | None = None
    balanced = budget_mode == "balanced"
    if budget_mode in ("sync", "prefetch"):
        budget = decode_budget(budget_mode, settings, n_files, n_bytes, read_model)
    # balanced: the budget is the reference's decode, known once profiled; until then none
    # (so the densest candidates are measured first: zstd's levels decode alike)
    profiles = profile(
        classes,
        settings.candidates,
        time_budget_s=time_budget,
        measure_fn=measure_fn,
        spent_out=cost,
        decode_budget_s=budget,
        balanced=balanced,
        cold_fn=(
            functools.partial(sample_mount, chunk_size=chunk_size, seed=settings.seed)
            if settings.cold_model == "mount" and measure_fn is measure
            else None
        ),
    )
    objective = Objective(settings.mode, budget, settings.capacity_bytes)
    if balanced:
        objective = balanced_objective(profiles, settings.candidates, settings)
        budget = objective.budget_s
    selection = select(profiles, objective)
    if settings.time_budget_s is None:
        # The pack to be made compresses with the chosen codecs, not with the guess above:
        # the budget follows the selection's own predicted pack, in rounds that resume from
        # what was measured (`_budget_rounds`).
        profiles, selection, budget = _budget_rounds(
            classes,
            settings,
            cost,
            profiles,
            selection,
            budget,
            read_s=read_s,
            codecs_share=codecs_share,
            balanced=balanced,
            measure_fn=measure_fn,
        )
    assert cost.budget_s is not None
    solid: SolidOptions | None = None

    def reselect(
        confirmed_only: bool = False, resume: list[ClassProfile] | None = None
    ) -> tuple[list[ClassProfile], Selection, float | None]:
        """Select again (with the solid options, if any) on what has been measured (on the
        profiles `resume`, without profiling again, if given), among the estimates
        confirming has measured enough with `confirmed_only`, and predict the pack that
        selection makes."""
        assert cost.budget_s is not None
        again = _reselect(
            classes,
            settings,
            cost,
            budget,
            cost.budget_s,
            balanced=balanced,
            measure_fn=measure_fn,
            solid=solid,
            confirmed_only=confirmed_only,
            resume=resume,
        )
        if settings.time_budget_s is None:
            cost.predicted_pack_s = _predicted_pack_s(again[1], read_s, settings.jobs)
        return again

    solid_s = cost.budget_s * SOLID_SHARE / codecs_share if solid_block else 0.0
    if solid_block and settings.mode == "balanced":
        # Measured before confirming: a candidate the blocks make worth choosing is
        # confirmed like any other.
        solid = SolidOptions(settings.nodes)
        _measure_balanced_solid(
            classes,
            profiles,
            selection,
            solid_block,
            settings.resident_bytes,
            measure_fn,
            cost,
            solid,
            _within_share(settings, cost, solid_s, aimed=True),
        )
        profiles, selection, budget = reselect()
    # The capacity-leaning modes' solid blocks come after confirming: their seconds are kept.
    keep = solid_s if solid is None else 0.0
    profiles, selection, budget = _confirm_rounds(
        classes,
        settings.candidates,
        cost,
        measure_fn,
        _within_share(settings, cost, cost.budget_s * CONFIRM_SHARE / codecs_share, keep),
        (profiles, selection, budget),
        reselect,
    )
    if _unconfirmed(selection, classes):
        # Confirming's seconds ran out with choices on fewer units than it asks of each:
        # the best of those it confirmed instead.
        profiles, selection, budget = reselect(confirmed_only=True, resume=profiles)
    solid_decode: dict[str, SolidDecode] = {}
    if solid is not None:
        # (a second SOLID_SHARE at most: the plan's share bounds both)
        seconds = _within_share(settings, cost, solid_s)
        if _confirm_solid(classes, selection, solid, solid_block, measure_fn, cost, seconds):
            profiles, selection, budget = reselect(confirmed_only=True)
        solid_decode = solid.chosen(profiles, selection)
    elif solid_block:
        seconds = _within_share(settings, cost, solid_s)
        solid_decode = _solid_classes(
            classes, selection, budget, solid_block, measure_fn, cost, seconds
        )
    cost.budget_s /= codecs_share  # the whole budget, as the plan table reports it
    # (one instant for both: whatever runs in between, the sums below or a collection of
    # the sample's objects, would be in the elapsed time and not in other_s)
    now = time.perf_counter()
    cost.note_other(now)
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
        now - start,
        chunk_size,
        cost,
        frozenset(solid_decode),
        solid_decode,
    )


# The measuring budget's rounds (`_budget_rounds`): each may grow the budget by this factor
# at most, until it is within ROUND_SLACK of its share of the selection's predicted pack.
ROUND_GROWTH: Final = 1.5
ROUND_SLACK: Final = 1.1
MAX_ROUNDS: Final = 12


def _measuring_budget(
    settings: PlanSettings, cost: PlanCost, predicted_pack_s: float, codecs_share: float
) -> float:
    """The codecs' measuring budget under plan_share of a pack predicted to take
    `predicted_pack_s`. The share bounds the plan, so what it spent besides measuring so
    far is taken off first: reading the sample, the reference pass, and the wall time not
    counted in those or in the measuring (`PlanCost.note_other`). Outside the budget, the
    first two and the selections were 4-13 s of the real dataset's plans of 47-85 s, which
    took 25-29% of the pack time in four runs of five; counting the first two, the wall
    time the plan did not count (mostly its selections) was 11-15 s of plans of 60-77 s,
    and the last balanced one took 30.4% of the pack time. The sample's mounts are not taken
    off here (they count in the share after the rounds, `_within_share`): taken off, on a
    fast moment they left a first budget of 14 s, no class was measured in solid blocks,
    and the balanced pack came to 473.5 MB against 444-446 MB (run Z31)."""
    floor = cost.sample_s + cost.reference_s + cost.note_other()
    return max(settings.plan_share * predicted_pack_s - floor, 0.0) * codecs_share


def _within_share(
    settings: PlanSettings, cost: PlanCost, seconds: float, keep: float = 0.0, aimed: bool = False
) -> float:
    """`seconds` of the measuring that follows the budget's rounds (the solid blocks,
    confirming), cut to what keeps the plan within plan_share of the pack time, the plan
    included (what it counted and its wall time besides, `PlanCost.note_other`), as the
    pack is predicted now; `keep` of those left are kept for what comes
    after (the capacity-leaning modes' solid blocks, which save more than confirming).

    The budget aims at plan_share of the predicted pack without the plan (`_budget_rounds`),
    which leaves room for the prediction to fall as the plan measures more. It fell further:
    the rounds grow the budget toward the fastest pack predicted so far, and the selections
    made after, on more units, chose codecs that compress faster (on the real dataset,
    brotli:11 chosen for the JSON on 9 units gave way to zstd:19 with a dictionary: 78 s of
    the predicted pack became 15 s). Two capacity-leaning plans of the last five took 26.9%
    and 27.7% of the pack time, the second after reporting 78.5 s as its bound and spending
    120.7 s (docs/benchmarks.md, "2026-11-28, late").

    `aimed` (the balanced mode's solid blocks, measured before confirming): the pack taken
    as the larger of the latest prediction and the first guess (`PlanCost.aimed_pack_s`).
    The selections before the blocks are measured choose no block, so they predict a pack
    without them: on the real dataset such plans predicted 79-88 s, left their blocks no
    time, and projected 464-467 MB (469.4 and 473.5 MB stored in runs Z34 and Z31; 444-448
    MB where the selections had predicted 99-124 s, the blocks measured and chosen for 7-8
    classes); the first guess, every compressible class at the densest zstd level, was
    119 s."""
    if settings.time_budget_s is not None or cost.predicted_pack_s is None:
        return seconds
    spent = cost.counted_s() + cost.note_other()
    predicted = cost.predicted_pack_s
    if aimed:
        predicted = max(predicted, cost.aimed_pack_s or 0.0)
    left = plan_ceiling_s(settings.plan_share, predicted) - spent
    return max(min(seconds, left - keep), 0.0)


def plan_ceiling_s(plan_share: float, predicted_pack_s: float) -> float:
    """The most a plan may take to stay within `plan_share` of the pack time, itself
    included, when the pack (without the plan) is predicted to take `predicted_pack_s`."""
    if plan_share >= 1.0:
        return math.inf
    return plan_share / (1.0 - plan_share) * predicted_pack_s


Selected = tuple[list[ClassProfile], Selection, float | None]


def _confirm_rounds(
    classes: list[ClassSample],
    candidates: Sequence[Candidate],
    cost: PlanCost,
    measure_fn: MeasureFn,
    seconds: float,
    selected: Selected,
    reselect: Callable[[], Selected],
) -> Selected:
    """Confirm the selection's choices within `seconds` (`measurement.confirm`) and select
    again (`reselect`), in up to CONFIRM_ROUNDS + 1 rounds: the choices made on fewer than
    CONFIRM_UNITS units first, round after round while selecting again brings new ones;
    then the decode estimates, with DECODE_CONFIRM_PART of the seconds left, so that the
    choices that brings are confirmed too, and again whenever a selection holds a choice
    whose decode has not been confirmed, if the selection's decode is near enough its
    budget for them to matter (`_decode_binds`). The last of those rounds is the decode
    estimates' if they are due (on the real dataset one class's choices alone, `.syso`'s zstd:6,
    zstd:12, brotli:9, lzma:6 and brotli:5, each confirmed and dropped in turn, took every
    round, and no decode estimate was confirmed), and one more confirms the choices that
    brings on CONFIRM_UNITS (without it, zstd:12 stayed chosen for the HTML on 3 units).
    Confirming both in each round, the decode estimates could take the seconds of the
    rounds after: plans of the real dataset kept 1-5 classes chosen on 1-3 units (the HTML
    with brotli:11 on one, the PAM images with zstd:15 on one or two). Confirming the
    decode estimates once, a choice that came after kept its 4 units (the PAM images with
    brotli:11, 4 units that all decode fast of a class that mostly does not: 2.6-3.0x its
    projected decode through the mount). Returns the last selection (`selected` if nothing
    was measured)."""
    decode_confirmed: set[tuple[str, Candidate]] = set()
    for left in range(CONFIRM_ROUNDS, -1, -1):
        chosen = [e.candidate for e in selected[1].choices]
        args = (classes, chosen, candidates, cost, measure_fn)
        choices = {(cls.name, cand) for cls, cand in zip(classes, chosen, strict=True)}
        due = left > 0 and _decode_binds(selected) and not choices <= decode_confirmed
        measured = 0.0 if left == 1 and due else confirm(*args, seconds, for_decode=False)
        if not measured and due:
            decode_confirmed |= choices
            measured = confirm(*args, seconds * DECODE_CONFIRM_PART)
        if not measured:
            break
        seconds -= measured
        selected = reselect()
    return selected


def _decode_binds(selected: Selected) -> bool:
    """Whether the selection's decode estimates can decide it: there is no decode budget
    (the capacity objective minimises decode), or the selection decodes for at least
    DECODE_CONFIRM_FROM of it. Below, its whole decode would have to be off by a factor
    of two to reach the budget. The capacity-leaning plans of the real dataset decode for
    4% of theirs, and confirming their lzma:6 choices' decode took 7 s of a plan of 141 s."""
    _, selection, budget = selected
    return budget is None or selection.decode_s >= DECODE_CONFIRM_FROM * budget


def _predicted_pack_s(selection: Selection, read_s: float, jobs: int) -> float:
    """Seconds the pack is predicted to take with the selection's codecs
    (`pack_seconds`)."""
    return pack_seconds(read_s, sum(e.compress_s for e in selection.choices), jobs)


def pack_seconds(read_s: float, compress_s: float, jobs: int) -> float:
    """A pack that reads every file in `read_s` (one reader, the sample's raw-read model)
    and compresses for `compress_s` of one thread's CPU on `jobs` threads: the slower of
    the two, as the pack reads many files in flight while it compresses
    (`pack.Packer._compress_all`). Summed, the real dataset's packs ran at 0.77-1.11x the
    prediction (median 0.92, 29 plans), at 0.78-1.13x the compressing alone (median 0.95):
    the sum counted the sample's reads from a tree not in the page cache again for a pack
    that read while it compressed. Run Z45's plan read its sample in 2.9 s, predicted 14.4 s
    of reading for a pack of 104 s, and took 29.8% of the pack time (docs/benchmarks.md)."""
    return max(read_s, compress_s / max(jobs, 1))


def _budget_rounds(
    classes: list[ClassSample],
    settings: PlanSettings,
    cost: PlanCost,
    profiles: list[ClassProfile],
    selection: Selection,
    budget: float | None,
    *,
    read_s: float,
    codecs_share: float,
    balanced: bool,
    measure_fn: MeasureFn,
) -> tuple[list[ClassProfile], Selection, float | None]:
    """Grow the measuring budget toward plan_share of the pack that the current selection
    predicts, and select again after each round.

    The first round's budget came from a guess at the pack (the reference's compress time,
    or a dense zstd level's). A selection made on few measurements can predict a far slower
    pack than the one made on more (its costliest candidates projected from a pilot), so
    the budget grows by ROUND_GROWTH at most a round, and stops once it covers the share of
    the latest prediction: what the plan spends then tracks the pack that is made, not the
    first guess (on the real dataset the first selection predicted 546 s for a pack of
    309 s). The budget grows toward the share of the fastest pack any selection has
    predicted so far, not the latest one: spent seconds are not given back, and a middle
    selection with a costly candidate measured on a pilot predicts a slow pack that the
    next one, measured on more, does not choose (on the real dataset 309 s, 246 s, and
    167 s in the end; the plan had spent 28% of the pack time). For the same reason each
    round's choices made on fewer than CONFIRM_UNITS units are confirmed on that many first
    (`measurement.confirm`), and the prediction is the selection made after: brotli:11
    chosen on one unit of a class added 70-136 s of compression to a selection's pack, and
    confirming it on four dropped it. Each round resumes from the measurements before it
    (`PlanCost.totals`)."""
    fastest = math.inf
    for _ in range(MAX_ROUNDS):
        assert cost.budget_s is not None
        chosen = [e.candidate for e in selection.choices]
        seconds = cost.budget_s * CONFIRM_SHARE / codecs_share
        if confirm(
            classes, chosen, settings.candidates, cost, measure_fn, seconds, for_decode=False
        ):
            profiles, selection, budget = _reselect(
                classes,
                settings,
                cost,
                budget,
                cost.budget_s,
                balanced=balanced,
                measure_fn=measure_fn,
            )
        predicted = _predicted_pack_s(selection, read_s, settings.jobs)
        fastest = min(fastest, predicted)
        want = _measuring_budget(settings, cost, fastest, codecs_share)
        if want <= cost.budget_s * ROUND_SLACK:
            break
        grown = min(want, cost.budget_s * ROUND_GROWTH)
        log.debug(
            "plan: the selection predicts a pack of %.1f s (the fastest so far %.1f s); "
            "measuring budget %.1f -> %.1f s",
            predicted,
            fastest,
            cost.budget_s,
            grown,
        )
        profiles, selection, budget = _reselect(
            classes, settings, cost, budget, grown, balanced=balanced, measure_fn=measure_fn
        )
        cost.rounds += 1
    cost.predicted_pack_s = _predicted_pack_s(selection, read_s, settings.jobs)
    return profiles, selection, budget


def _reselect(
    classes: list[ClassSample],
    settings: PlanSettings,
    cost: PlanCost,
    budget: float | None,
    time_budget_s: float,
    *,
    balanced: bool,
    measure_fn: MeasureFn,
    solid: SolidOptions | None = None,
    confirmed_only: bool = False,
    resume: list[ClassProfile] | None = None,
) -> tuple[list[ClassProfile], Selection, float | None]:
    """Profile again within `time_budget_s`, resuming from `cost`'s measurements, and select
    again; the balanced mode's decode budget is the reference's decode as now profiled, and
    its solid options (`solid`) are options of the selection. With `confirmed_only`, among
    the estimates measured on as many units as confirming asks of a choice (`_confirmed`);
    the profiles returned keep every estimate. With `resume` (profiles a selection was made
    on), nothing is measured: its solid options are built again."""
    if resume is not None:
        profiles = [
            dataclasses.replace(p, estimates=[e for e in p.estimates if not e.solid])
            for p in resume
        ]
    else:
        profiles = profile(
            classes,
            settings.candidates,
            time_budget_s=time_budget_s,
            measure_fn=measure_fn,
            spent_out=cost,
            decode_budget_s=None if balanced else budget,
            balanced=balanced,
        )
    objective = Objective(settings.mode, budget, settings.capacity_bytes)
    if balanced:
        objective = balanced_objective(profiles, settings.candidates, settings)
        budget = objective.budget_s
    if solid is not None:
        profiles = solid.options(profiles)
    eligible = _confirmed(profiles, classes) if confirmed_only else profiles
    return profiles, select(eligible, objective), budget


def _enough_units(est: Estimate, cls: ClassSample) -> bool:
    """Whether `est` rests on as many units as confirming asks of a choice: CONFIRM_UNITS,
    or every unit the class's sample holds for its candidate (NONE needs none)."""
    held = cls.measure_units[1::2] if est.candidate.use_dict else cls.measure_units
    return est.candidate == NONE or est.sample_units >= min(CONFIRM_UNITS, len(held))


def _confirmed(profiles: list[ClassProfile], classes: list[ClassSample]) -> list[ClassProfile]:
    """`profiles` with only the estimates that rest on enough units (`_enough_units`). After
    confirming's rounds the plan selects among these: each round confirmed the choices of
    its selection, and the next selection brought new ones of one or two units in the small
    classes, where many candidates lie within a few percent (on the real dataset the GIMP
    `.pgm` images went from zstd:15 to brotli:11, zstd:19, brotli:11, zstd:12 and zstd:9,
    kept on 2 units; in run Z24 brotli:11 stood on 2 units of the PAM images and decoded
    2.1x its prediction through the mount, docs/benchmarks.md, "2026-11-29, evening")."""
    return [
        dataclasses.replace(prof, estimates=[e for e in prof.estimates if _enough_units(e, cls)])
        for prof, cls in zip(profiles, classes, strict=True)
    ]


def _unconfirmed(selection: Selection, classes: list[ClassSample]) -> bool:
    """Whether a choice of `selection` rests on fewer units than confirming asks."""
    return not all(_enough_units(e, cls) for e, cls in zip(selection.choices, classes, strict=True))


# The share of the plan's measuring budget kept for confirming the chosen candidates measured
# on few units (`measurement.confirm`), and the rounds of confirming and selecting again.
CONFIRM_SHARE: Final = 0.10
CONFIRM_ROUNDS: Final = 5
# The share of confirming's seconds left that the decode estimates may take (once the choices
# made on few units are confirmed).
DECODE_CONFIRM_PART: Final = 0.5
# ... and only while the selection decodes for at least this share of its budget.
DECODE_CONFIRM_FROM: Final = 0.5
# The share of the plan's measuring budget kept for the solid-block choice: 2 x 512 KiB per
# class with the chosen codec (and in the balanced mode its densest too), about 0.1-1 s
# each.
SOLID_SHARE: Final = 0.15
# A class's small files go into solid blocks when that makes them this much smaller, as
# measured on the sample with the class's codec (small PNGs: 1.8% smaller in 64 KiB blocks).
SOLID_MIN_SAVING: Final = 0.01


@dataclass(frozen=True, slots=True)
class SolidFit:
    """A candidate measured on a class's runs of small files alone and in solid blocks
    (`_project_solid`), projected onto the class's small files: the bytes the blocks save,
    the files' decode alone and the blocks' with each decoded once, the blocks' mean
    members, and the share of the class's bytes in small files."""

    saved: float
    alone_s: float
    blocks_s: float
    members: float
    small_share: float
    blocks_warm_s: float = -1.0  # `blocks_s` with hot caches (negative: not known)
    large_chunks: float = -1.0  # the share of the class's chunks in larger files (-1: by bytes)
    # The blocks' measurement, projected onto `small_bytes` for `blocks_s` (None: not kept)
    grouped: Measurement | None = None
    small_bytes: float = 0.0

    def compress_s(self, est: Estimate) -> float:
        """The class's compress CPU with its small files in blocks, what the pack spends:
        the larger files' share of `est`'s, and the small files' bytes at the blocks' own
        rate (`grouped`; `est`'s where the blocks' is not known). The blocks' rate is what
        the pack pays for them: the real dataset's Python sources in blocks with zstd:19
        and a dictionary took 0.72x the CPU of their files one by one, its PNG icons with
        lz4hc:9 5.4x (the probe that skips an incompressible file alone does not skip a
        block of them), the Ruby docs and ONNX files 1.4-1.6x. Taken as `est`'s times the
        blocks' rate over the same files' alone, the blocks took on the few units a class
        estimate can stand on: the real dataset's SVG
        files with zstd:19 and a 1 MiB dictionary, estimated on 5-6 units at 0.6-1.0 MB/s
        (an object above 8 KiB costs about 20 ms with that dictionary whatever its size),
        were predicted at 29-33 s of CPU in blocks, where the pack's blocks took 8.7 s at
        3.4 MB/s and the plan's own 8 blocks measured 3.3 MB/s (docs/benchmarks.md)."""
        blocks = self.grouped
        if blocks is None or blocks.compress_s <= 0 or blocks.raw_bytes <= 0:
            return est.compress_s
        per_byte = blocks.compress_s / blocks.raw_bytes
        return est.compress_s * (1 - self.small_share) + self.small_bytes * per_byte

    def rest_s(self, est: Estimate) -> float:
        """The decode of the class's larger files with `est`'s candidate: its estimate's hot
        decode by their share of the bytes (an upper bound: small files cost more per byte)
        and its cold penalties by their share of the chunks. (By bytes, the real dataset's
        Ruby docs, 11,771 files of 0.8 KB and a few larger ones, were projected 0.09 s in
        solid blocks, about 0.07 s of it the larger files' share, mostly the small files'
        penalties; the mount decoded the class in 0.03 s.)"""
        chunks = 1 - self.small_share if self.large_chunks < 0 else self.large_chunks
        return est.warm * (1 - self.small_share) + (est.decode_s - est.warm) * chunks

    def warm_s(self, est: Estimate, decodes: float) -> float:
        """The class's decode with hot caches when its blocks are decoded `decodes` times
        each: the larger files' share of `est.warm`, and the blocks' own."""
        blocks = self.blocks_s if self.blocks_warm_s < 0 else self.blocks_warm_s
        return est.warm * (1 - self.small_share) + blocks * decodes


def _project_solid(
    cls: ClassSample,
    est: Estimate,
    block: int,
    measure_fn: MeasureFn,
    cost: PlanCost,
    epoch_bytes: float = 0.0,
) -> tuple[SolidFit | None, float]:
    """`est`'s candidate measured on `cls`'s runs alone and grouped into blocks of `block`
    bytes, as the pack groups them (`ClassSample.runs`, consecutive in walk order); None
    unless grouped is SOLID_MIN_SAVING smaller. Also returns the CPU seconds measuring took
    (added to `cost`). The blocks' cold penalty takes the last-level cache's eviction
    (`_measure_blocks`) as far as an epoch of `epoch_bytes` evicts it (`llc_share`)."""
    cand = est.candidate
    units, blocks = _grouped(cls.runs, block)
    alone = measure_fn(cls.name, cand, units, cls.dictionary)
    grouped = _measure_blocks(measure_fn, cls, cand, blocks)
    took = measurement_cost(alone) + measurement_cost(grouped)
    cost.measure_s += took
    if alone.stored_bytes <= 0 or grouped.stored_bytes > alone.stored_bytes * (
        1 - SOLID_MIN_SAVING
    ):
        return None, took
    # Projected onto the class's small files (their share of the sample's bytes), the cold
    # penalties per file alone and per full block grouped (`project_decode`): the sample's
    # runs end in part-filled blocks, which the pack's blocks of many runs mostly are not.
    small_share = _small_share(cls, block)
    small_bytes = cls.total_bytes * small_share
    scale = small_bytes / max(alone.raw_bytes, 1)
    shift = cost.dictionary_shift(cls.name, cand)
    alone_s, _ = project_decode(alone, small_bytes, _small_files(cls, block), shift)
    objects = max(small_bytes / block, 1.0)
    blocks_s, blocks_warm_s = project_decode(
        grouped, small_bytes, objects, shift, llc_share(epoch_bytes, objects)
    )
    if grouped.deep <= 0:  # (timed with the last-level cache evicted, it paid its data there)
        blocks_s = max(blocks_s, cost.block_data_s * (grouped.stored_bytes * scale + small_bytes))
    sampled = cls.measure_units
    fit = SolidFit(
        (alone.stored_bytes - grouped.stored_bytes) * scale,
        alone_s,
        blocks_s,
        len(units) / len(blocks),
        small_share,
        blocks_warm_s,
        sum(1 for u in sampled if len(u) > block // 4) / max(len(sampled), 1),
        grouped,
        small_bytes,
    )
    return fit, took


def _measure_blocks(
    measure_fn: MeasureFn, cls: ClassSample, cand: Candidate, blocks: Sequence[bytes]
) -> Measurement:
    """`cand` measured on `blocks` of `cls`; with a dictionary (and `measure` itself), also
    with the last-level cache evicted (`Measurement.deep`): a class's dictionary and its
    decoder are its own, and in an epoch they wait out the other classes' objects between
    two of its blocks, where the decoder without one serves every class (the real
    dataset's SVG and Ruby docs, solid with zstd:19 and a dictionary, decoded 1.45-1.94x
    and 1.2-1.9x their prediction in shuffled epochs; its Python and Go sources, solid with
    zstd:19 alone, 0.74-1.01x)."""
    if cand.use_dict and measure_fn is measure:
        return measure(cls.name, cand, blocks, cls.dictionary, deep=True)
    return measure_fn(cls.name, cand, blocks, cls.dictionary)


def _grouped(runs: Sequence[Sequence[bytes]], block: int) -> tuple[list[bytes], list[bytes]]:
    """The files of `runs` (runs of a class's small files, `ClassSample.runs`), and the same
    grouped into blocks of at most `block` bytes as the pack groups them (a file larger than
    what a block has left starts the next)."""
    units: list[bytes] = []
    blocks: list[bytes] = []
    for run in runs:
        group = bytearray()
        for u in run:
            if group and len(group) + len(u) > block:
                blocks.append(bytes(group))
                group = bytearray()
            group += u
            units.append(u)
        if group:
            blocks.append(bytes(group))
    return units, blocks


def _confirm_solid(
    classes: Sequence[ClassSample],
    selection: Selection,
    solid: SolidOptions,
    block: int,
    measure_fn: MeasureFn,
    cost: PlanCost,
    seconds: float,
) -> float:
    """Measure the blocks of each class chosen in solid blocks again on its further runs
    (`ClassSample.more_runs`) with the chosen candidate, within `seconds` (CPU, as its
    earlier blocks cost per byte; the classes whose blocks decode longest first), and
    project the fit's blocks from all of them (`SolidFit.blocks_s`). Returns the seconds
    spent (0: nothing measured). The solid choice itself stays with the first runs: what the
    blocks save is known from them well enough, their decode is not (projected from 4
    blocks, the real dataset's Go sources decoded 0.62x and 0.80x their prediction in
    shuffled epochs through the mount in two plans, the `(other)` class 0.63x)."""
    spent = 0.0
    epoch_bytes = sum(c.total_bytes for c in classes)
    chosen = [
        (i, est, solid.fits[(cls.name, est.candidate)])
        for i, (cls, est) in enumerate(zip(classes, selection.choices, strict=True))
        if est.solid and (cls.name, est.candidate) in solid.fits
    ]
    for i, est, fit in sorted(chosen, key=lambda c: -c[2].blocks_s):
        cls, grouped = classes[i], fit.grouped
        if grouped is None or not cls.more_runs or grouped.raw_bytes <= 0:
            continue
        _, blocks = _grouped(cls.more_runs, block)
        rate = measurement_cost(grouped) / grouped.raw_bytes
        while blocks and rate * sum(len(b) for b in blocks) > seconds - spent:
            blocks.pop()
        if not blocks:
            continue
        more = _measure_blocks(measure_fn, cls, est.candidate, blocks)
        spent += measurement_cost(more)
        both = grouped + more
        objects = max(fit.small_bytes / block, 1.0)
        blocks_s, blocks_warm_s = project_decode(
            both,
            fit.small_bytes,
            objects,
            cost.dictionary_shift(cls.name, est.candidate),
            llc_share(epoch_bytes, objects),
        )
        log.debug(
            "%s: %s blocks confirmed on %d (%.3f s -> %.3f s)",
            cls.name,
            est.candidate,
            both.units,
            fit.blocks_s,
            blocks_s,
        )
        solid.fits[(cls.name, est.candidate)] = dataclasses.replace(
            fit, blocks_s=blocks_s, blocks_warm_s=blocks_warm_s, grouped=both
        )
    cost.measure_s += spent
    return spent


def _solid_classes(
    classes: Sequence[ClassSample],
    selection: Selection,
    budget: float | None,
    block: int,
    measure_fn: MeasureFn,
    cost: PlanCost,
    seconds: float = math.inf,
) -> dict[str, SolidDecode]:
    """The capacity-leaning modes' solid classes: those whose files of at most block / 4
    bytes are better stored in solid blocks of `block` bytes with the chosen codec
    (`_project_solid`). Reading one such file decodes its whole block, so a class's decode
    is projected with that amplification (each member pays its block's decode: the worst
    case of a random epoch), and classes join, best saving per second of decode first,
    while the plan's decode stays within `budget`. Measuring stops once it has taken
    `seconds` (CPU, as the plan's budget counts), the classes with the most small files
    first, as the balanced mode measures them: what grouping saves is mostly each small
    file's own frame and missing context (largest first, a capacity-leaning plan of the
    real dataset ran out of seconds before the Ruby docs, `.po`, `.s` and `.xml`, and its
    pack came out 1.2 MB larger than one that grouped them, 427.2 MB against xz's 426.3).
    Returns the chosen classes with their projected decode (`SolidDecode`)."""
    offers: list[tuple[float, float, str]] = []
    decodes: dict[str, SolidDecode] = {}
    spent = 0.0
    epoch_bytes = sum(c.total_bytes for c in classes)
    for i in sorted(range(len(classes)), key=lambda i: -_small_files(classes[i], block)):
        cls, est = classes[i], selection.choices[i]
        if est.candidate == NONE or not cls.runs:
            continue
        if spent >= seconds:
            log.debug("%s: solid blocks not measured (time budget)", cls.name)
            continue
        fit, took = _project_solid(cls, est, block, measure_fn, cost, epoch_bytes)
        spent += took
        if fit is None:
            continue
        extra_s = max(fit.blocks_s * fit.members - fit.alone_s, 0.0)
        offers.append((fit.saved / extra_s if extra_s else float("inf"), extra_s, cls.name))
        # In walk order the small files cost their blocks' decode once.
        decodes[cls.name] = SolidDecode(fit.rest_s(est) + fit.blocks_s, est.decode_s + extra_s)
    chosen: dict[str, SolidDecode] = {}
    decode_s = selection.decode_s
    for _, extra_s, name in sorted(offers, reverse=True):
        if budget is None or decode_s + extra_s <= budget:
            chosen[name] = decodes[name]
            decode_s += extra_s
    return chosen


def node_decodes(members: float, nodes: int) -> float:
    """Expected decodes of a solid block of `members` files in an epoch read by `nodes`
    nodes, each file by one node drawn at random, each node keeping what it decoded
    (pushed) through the epoch: a node decodes the block if it reads any of its members,
    with probability 1 - (1 - 1/nodes)^members, so `nodes` times that. One node: 1; many
    nodes: up to `members`, each member decoding the block."""
    if nodes <= 1:
        return 1.0
    return min(members, nodes * (1.0 - (1.0 - 1.0 / nodes) ** members))


@dataclass(slots=True)
class SolidOptions:
    """The balanced mode's solid blocks as options of the selection: each class's
    candidates measured in blocks (`fits`, by `_measure_balanced_solid`), the classes whose
    small files the page cache is taken to hold through an epoch (`resident`), and the
    nodes that read the dataset each epoch."""

    nodes: int
    fits: dict[tuple[str, Candidate], SolidFit] = field(default_factory=dict)
    resident: set[str] = field(default_factory=set)

    def options(self, profiles: Sequence[ClassProfile]) -> list[ClassProfile]:
        """`profiles` with an estimate (`Estimate.solid`) for each candidate measured in
        blocks, the class's small files in them, decoding what an epoch costs: each block
        decoded once on each node that reads one of its members (`node_decodes`), or, for a
        class beyond what the page cache is taken to hold, once per member. Built from the
        candidates' current estimates, so that measuring more (confirming) moves them too."""
        out = []
        for prof in profiles:
            options = []
            for est in prof.estimates:
                fit = self.fits.get((prof.name, est.candidate))
                if fit is None or est.solid or est.loses:
                    continue
                decodes = self._decodes(prof.name, fit)
                options.append(
                    dataclasses.replace(
                        est,
                        stored_bytes=max(int(est.stored_bytes - fit.saved), 0),
                        decode_s=fit.rest_s(est) + fit.blocks_s * decodes,
                        compress_s=fit.compress_s(est),
                        solid=True,
                        warm_s=fit.warm_s(est, decodes),
                    )
                )
            out.append(dataclasses.replace(prof, estimates=[*prof.estimates, *options]))
        return out

    def _decodes(self, name: str, fit: SolidFit) -> float:
        """Decodes of each of class `name`'s blocks an epoch: once per node that reads one
        of its files, or once per member beyond what the page cache is taken to hold."""
        return node_decodes(fit.members, self.nodes) if name in self.resident else fit.members

    def chosen(
        self, profiles: Sequence[ClassProfile], selection: Selection
    ) -> dict[str, SolidDecode]:
        """The classes whose chosen estimate is a solid option, with their decode read in
        walk order and file by file (`SolidDecode`)."""
        out = {}
        for prof, est in zip(profiles, selection.choices, strict=True):
            if est.solid:
                fit = self.fits[(prof.name, est.candidate)]
                rest_s = est.decode_s - fit.blocks_s * self._decodes(prof.name, fit)
                out[prof.name] = SolidDecode(
                    rest_s + fit.blocks_s, rest_s + fit.blocks_s * fit.members
                )
        return out


def _measure_balanced_solid(
    classes: Sequence[ClassSample],
    profiles: Sequence[ClassProfile],
    selection: Selection,
    block: int,
    resident_bytes: int,
    measure_fn: MeasureFn,
    cost: PlanCost,
    solid: SolidOptions,
    seconds: float = math.inf,
) -> None:
    """Measure the balanced mode's solid options into `solid`: for each class with runs of
    small files, its chosen candidate and its densest alone and in solid blocks
    (`_project_solid`; a dictionary's tables are loaded cold once per tiny file read alone,
    once per block in blocks), the classes with the most small files first (what blocks
    save is mostly each file's own decode: the real dataset's 11,771 Ruby docs of 0.7 KB
    took 8% of a balanced plan's decode), until measuring has taken `seconds`. The classes
    with a fit whose small files the page cache is taken to hold through an epoch are the
    smallest in such bytes, up to `resident_bytes` in all."""
    small = {cls.name: _small_share(cls, block) * cls.total_bytes for cls in classes}
    epoch_bytes = sum(cls.total_bytes for cls in classes)
    spent = 0.0
    for i in sorted(range(len(classes)), key=lambda i: -_small_files(classes[i], block)):
        cls, prof, chosen = classes[i], profiles[i], selection.choices[i]
        plain = [e for e in prof.estimates if not e.loses and e.candidate != NONE]
        if not cls.runs or not plain:
            continue
        densest = min(plain, key=lambda e: (e.stored_bytes, e.decode_s))
        for est in dict.fromkeys(e for e in (chosen, densest) if e.candidate != NONE):
            if spent >= seconds:
                log.debug("%s: solid blocks not measured (time budget)", cls.name)
                break
            fit, took = _project_solid(cls, est, block, measure_fn, cost, epoch_bytes)
            spent += took
            if fit is not None:
                solid.fits[(cls.name, est.candidate)] = fit
    held = 0.0
    for name in sorted({name for name, _ in solid.fits}, key=lambda n: small[n]):
        if held + small[name] <= resident_bytes:
            solid.resident.add(name)
            held += small[name]


def _small_files(cls: ClassSample, block: int) -> float:
    """About how many of `cls`'s files are small (at most block / 4 bytes): its files times
    the share of its sampled units that are."""
    sampled = cls.measure_units
    small = sum(1 for u in sampled if 0 < len(u) <= block // 4)
    return cls.files * small / max(len(sampled), 1)


def _small_share(cls: ClassSample, block: int) -> float:
    """The share of `cls`'s sampled bytes in files of at most block / 4 bytes (those the pack
    puts into solid blocks)."""
    sampled = cls.measure_units
    return sum(len(u) for u in sampled if 0 < len(u) <= block // 4) / max(
        sum(len(u) for u in sampled), 1
    )


def _cold_record(plan: Plan) -> dict[str, Any]:
    """How the plan measured cold decodes (`PlanSettings.cold_model`): the classes whose cold
    cost came from the sample's mount, those whose brotli's came from it too
    (`measurement.brotli_penalties`), those whose dictionary's came from the mount of their
    dictionaries, the two mounts' wall seconds, and why they were not used (if so)."""
    mounted = plan.cost.mounted
    note: str | None
    if plan.settings.cold_model != "mount":
        note = "--cold-cost method"
    elif mounted is None:
        note = "not measured"
    else:
        note = mounted.note or None
    return {
        "model": plan.settings.cold_model,
        "mounted_classes": sorted(plan.cost.shifts),
        "brotli_classes": sorted(n for n, codec in plan.cost.penalties if codec == CODEC_BROTLI),
        "dictionary_classes": sorted(plan.cost.dict_shifts),
        # (those whose lz4 dictionary's cost came from that mount too)
        "lz4_dictionary_classes": sorted(
            plan.cost.dict_mounted.lz4_s if plan.cost.dict_mounted is not None else ()
        ),
        "mount_s": round(plan.cost.mounted_s(), 3),
        "note": note,
        # a solid block's data copied from memory, ns per byte read or written
        "block_data_ns": round(plan.cost.block_data_s * 1e9, 4),
    }


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
                "solid": prof.name in plan.solid,
                # a solid class's decode: in walk order, and with each file decoding its block
                "solid_decode_s": {
                    "walk": round(plan.solid_decode[prof.name].walk, 6),
                    "random": round(plan.solid_decode[prof.name].random, 6),
                }
                if prof.name in plan.solid_decode
                else None,
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
                        "solid": e.solid,  # an option with the class's small files in blocks
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
        # the balanced mode's second budget, and the selection against it (hot caches)
        "warm_budget_s": (
            round(reference_warm_s(plan.profiles, s.candidates), 6)
            if s.mode == "balanced"
            else None
        ),
        "warm_decode_s": round(sum(e.warm for e in sel.choices), 6),
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
            "time_budget_s": round(plan.cost.budget_s, 3)
            if plan.cost.budget_s is not None
            else None,
            "plan_share": s.plan_share if s.time_budget_s is None else None,
            "jobs": s.jobs,
            "nodes": s.nodes,
            "seed": s.seed,
            "chunk_size": plan.chunk_size,
            "candidates": [str(c) for c in s.candidates],
        },
        "sample": {
            "units": plan.sample_units,
            "bytes": plan.sample_bytes,
            "seconds": round(plan.elapsed_s, 3),
            "measure_s": round(plan.cost.measure_s, 3),
            "other_s": round(plan.cost.other_s, 3),
            # CPU seconds of the measuring that ran on other threads (`compress_threads`)
            "beside_s": round(max(plan.cost.beside_s, 0.0), 3),
            "reference_s": round(plan.cost.reference_s, 3),
            "sample_read_s": round(plan.cost.sample_s, 3),
            "predicted_pack_s": round(plan.cost.predicted_pack_s, 3)
            if plan.cost.predicted_pack_s is not None
            else None,
            "rounds": plan.cost.rounds,
            "cold": _cold_record(plan),
        },
        "classes": classes,
    }
