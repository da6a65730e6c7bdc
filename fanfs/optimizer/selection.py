"""Selection: the exact multiple-choice knapsack (`solve_mckp`) and `select`, one option per
class under a decode budget or, dually, a capacity.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from fanfs.optimizer.candidates import NONE, Candidate
from fanfs.optimizer.measurement import ClassProfile, Estimate


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
    the lightest remaining options are dropped, and so are those that cannot beat a choice
    found greedily (`_incumbent`) even with the smallest remaining values. Ties go to the
    lower total weight, then to the earlier options. Should a frontier exceed MAX_FRONTIER
    states, states whose values agree within a factor 1 + delta keep only the lightest, and
    the result is within 1 + TRIM_GAP.

    Each option extends the frontier (sorted by weight) into a run sorted by weight, so one
    stable sort merges them; only totals of equal weight need the full order. The real
    dataset's plans solve about 130 knapsacks of 33 groups and 4-5 options each (frontiers
    of up to 9,000 states): 50-70 ms each with a four-key sort of every total and no bound
    on the value, 15% of a plan's wall time outside its measuring; under 3 ms now, with the
    same choices.
    """
    k = len(options)
    tol = 1e-9 * max(abs(budget), 1.0)
    limit = budget + tol
    rest_w = _suffix_sums([min(w for w, _ in group) for group in options])
    rest_v = _suffix_sums([min(v for _, v in group) for group in options])
    bound = _incumbent(options, budget)
    bound += 1e-9 * max(abs(bound), 1.0)  # (sums in another order round otherwise)
    weights, values = np.zeros(1), np.zeros(1)
    back: list[tuple[np.ndarray, np.ndarray]] = []
    delta = (1 + TRIM_GAP) ** (1 / max(k, 1)) - 1
    exact = True
    for g, group in enumerate(options):
        f = len(weights)
        runs_w, runs_v, runs_code = [], [], []
        for j, (ow, ov) in enumerate(group):
            # The frontier's weights rise and its values fall: what fits is a prefix, what
            # can beat the bound a suffix.
            w = weights + ow
            v = values + ov
            hi = int(np.searchsorted(w + rest_w[g + 1], limit, side="right"))
            lo = int(np.searchsorted(-(v + rest_v[g + 1]), -bound, side="left"))
            if lo < hi:
                runs_w.append(w[lo:hi])
                runs_v.append(v[lo:hi])
                runs_code.append(np.arange(j * f + lo, j * f + hi))
        if not runs_w:
            return None
        w, v, code = np.concatenate(runs_w), np.concatenate(runs_v), np.concatenate(runs_code)
        order = np.argsort(w, kind="stable")
        if len(w) > 1 and (np.diff(w[order]) == 0).any():
            order = np.lexsort((code // f, code % f, v, w))  # by weight, value, first option
        w, v, code = w[order], v[order], code[order]
        keep = np.empty(len(v), dtype=bool)
        keep[0] = True
        np.less(v[1:], np.minimum.accumulate(v)[:-1], out=keep[1:])
        w, v, parent, opt = w[keep], v[keep], code[keep] % f, code[keep] // f
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


def _suffix_sums(xs: Sequence[float]) -> np.ndarray:
    """Sums of xs[g:] for g = 0..len(xs)."""
    out = np.zeros(len(xs) + 1)
    out[:-1] = np.cumsum(np.array(xs[::-1], dtype=np.float64))[::-1]
    return out


def _incumbent(options: Sequence[Sequence[tuple[float, float]]], budget: float) -> float:
    """The total value of a choice within `budget`, found greedily (inf if none is found):
    every group's lightest option, then the steps along each group's lower convex hull of
    (weight, value), steepest saving per weight first, each taken if it still fits."""
    total_w = total_v = 0.0
    steps: list[tuple[float, int, float, float]] = []
    for g, group in enumerate(options):
        hull: list[tuple[float, float]] = []
        for w, v in sorted(group):
            if hull and v >= hull[-1][1]:
                continue  # no lighter than the last, and no better
            while len(hull) >= 2 and _turns_up(hull[-2], hull[-1], (w, v)):
                hull.pop()
            hull.append((w, v))
        total_w += hull[0][0]
        total_v += hull[0][1]
        for (w0, v0), (w1, v1) in itertools.pairwise(hull):
            saving = (v0 - v1) / (w1 - w0)  # (the weights rise along the hull)
            steps.append((saving, g, w1 - w0, v0 - v1))
    if total_w > budget:
        return math.inf
    stopped: set[int] = set()  # groups whose next step did not fit: their later ones neither
    for _, g, dw, dv in sorted(steps, key=lambda s: -s[0]):
        if g in stopped:
            continue
        if total_w + dw <= budget:
            total_w += dw
            total_v -= dv
        else:
            stopped.add(g)
    return total_v


def _turns_up(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> bool:
    """Whether b lies on or above the segment from a to c (so is not on the lower hull)."""
    return (b[1] - a[1]) * (c[0] - a[0]) >= (c[1] - a[1]) * (b[0] - a[0])


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
    seconds of one-thread decode per epoch, and if `warm_budget_s` is not None (the
    balanced mode) also under that budget for the decode with hot caches (`Estimate.warm`);
    `reference` is then the candidate whose decode both budgets are, chosen everywhere when
    nothing else is found within both.
    mode "capacity": minimise decode seconds under `capacity_bytes`, and if `budget_s` is
    not None also require decode <= budget_s.
    """

    mode: str
    budget_s: float | None
    capacity_bytes: int | None = None
    warm_budget_s: float | None = None
    reference: Candidate | None = None


@dataclass(frozen=True, slots=True)
class Selection:
    choices: tuple[Estimate, ...]
    stored_bytes: int
    decode_s: float
    feasible: bool
    exact: bool
    gap: float
    problem: str = ""  # one line when not feasible


def _options(
    profiles: Sequence[ClassProfile], weight: Callable[[Estimate], float] | None = None
) -> list[list[Estimate]]:
    # Drop dominated estimates (no smaller and no faster than another, by `weight`: the
    # decode by default); exact-safe, and it keeps the frontier small. Sorted by size so
    # that ties resolve deterministically.
    cost = weight or (lambda e: e.decode_s)
    out = []
    for prof in profiles:
        # On a tie, none first: an incompressible class is stored raw, verified but never
        # decoded.
        # A candidate that loses to the reference (no faster, not shown smaller on the same
        # units) is never an option: the default codec is never replaced by a worse one.
        # Nor is one that stores the class no smaller than none does: it stores it raw, and
        # serving it is none's work, whatever their separate measurements say.
        raw = min((e.stored_bytes for e in prof.estimates if e.candidate == NONE), default=None)
        ests = sorted(
            (
                e
                for e in prof.estimates
                if not e.loses and (raw is None or e.candidate == NONE or e.stored_bytes < raw)
            ),
            key=lambda e: (e.stored_bytes, cost(e), e.candidate != NONE, str(e.candidate)),
        )
        kept: list[Estimate] = []
        for e in ests:
            if not kept or cost(e) < min(cost(k) for k in kept):
                kept.append(e)
        out.append(kept)
    return out


def select(profiles: Sequence[ClassProfile], objective: Objective) -> Selection:
    """Choose one estimate per class for `objective`; infeasible objectives return the
    closest plan (feasible=False and a one-line `problem`).

    A decode budget below what storing every class raw costs (its chunks are verified and
    served too: `measurement.raw_serving`) is taken as that floor: a pack can always store
    raw, as it could when raw was counted as free."""
    floor = sum(
        min((e.decode_s for e in p.estimates if e.candidate == NONE), default=0.0) for p in profiles
    )
    if objective.budget_s is not None and objective.budget_s < floor:
        objective = dataclasses.replace(objective, budget_s=floor)
    opts = _options(profiles)
    if objective.mode == "capacity":
        return _select_capacity(opts, objective)
    assert objective.budget_s is not None
    if objective.warm_budget_s is not None:
        both = _select_both(profiles, objective.budget_s, objective.warm_budget_s)
        if both is None and objective.reference is not None:
            both = _everywhere(profiles, objective.reference)
        if both is not None and _within_both(both, objective.budget_s, objective.warm_budget_s):
            return both
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


# The weights `_select_both` gives the cold budget against the warm one (1: the cold
# budget alone, 0: the warm alone).
BOTH_WEIGHTS: Final = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)


def _select_both(
    profiles: Sequence[ClassProfile], budget_s: float, warm_budget_s: float
) -> Selection | None:
    """The smallest selection found within both decode budgets, cold (`decode_s`) and warm
    (`Estimate.warm`), or None if none is found (the caller then takes the reference in
    every class, `Objective.reference`, else the cold budget alone).

    A knapsack with two budgets is solved through one: for each weight w of BOTH_WEIGHTS,
    exactly under w x cold / budget_s + (1 - w) x warm / warm_budget_s <= 1, which every
    selection within both budgets satisfies; of the selections that turn out within both,
    the smallest. (The best w is not always on the grid: the result is within both budgets,
    and is the cold budget's own optimum when that one is within both; otherwise it is the
    best on the grid, and `exact` speaks of that weight's knapsack only.)"""
    if budget_s <= 0 or warm_budget_s <= 0:
        return None
    best: Selection | None = None
    over: list[tuple[float, bool]] = []  # (w, whether its optimum is over the cold budget)
    for w in BOTH_WEIGHTS:
        opts, groups = _weighted(profiles, w, budget_s, warm_budget_s)
        sol = solve_mckp(groups, 1.0)
        if sol is None:
            continue
        sel = _selection(opts, sol, True)
        if not _within_both(sel, budget_s, warm_budget_s):
            over.append((w, sel.decode_s > budget_s * (1 + 1e-9)))
            continue
        if best is None or sel.stored_bytes < best.stored_bytes:
            best = sel
        if w == 1.0:
            break  # the cold budget alone is within the warm one: nothing smaller exists
    if best is not None:
        return best
    # The weights on either side of where the optimum goes from over the warm budget (the
    # cold weighed most) to over the cold one: the combined budget is shrunk there.
    turns: set[float] = set()
    for (w0, cold0), (w1, cold1) in itertools.pairwise(over):
        if cold0 != cold1:
            turns.update((w0, w1))
    return _select_both_shrunk(profiles, budget_s, warm_budget_s, sorted(turns, reverse=True))


# Halvings of the combined budget per weight in `_select_both_shrunk`.
BOTH_SHRINK_STEPS: Final = 8


def _select_both_shrunk(
    profiles: Sequence[ClassProfile],
    budget_s: float,
    warm_budget_s: float,
    weights: Sequence[float],
) -> Selection | None:
    """When no weight's knapsack is within both budgets (each optimum spends one budget's
    slack past the other), the knapsacks of `weights` again under a smaller combined budget,
    found by bisection: the smallest selection within both of those found (`exact` False),
    or None.

    Without it the cold budget alone decided: run L on the real dataset (2026-11-28) found
    none on the grid, and its pack decoded 1.21-1.41x the default's shuffled epoch, its hot
    decode 1.10x its budget. A knapsack of the real dataset's 446-494 estimates takes about
    45 ms: every weight of the grid, ten halvings each, forced on each of a plan's
    selections, made it 2.2x as long (122 s against 55 s); the two weights around the turn,
    eight halvings each, added 3.3 s to a 58 s plan over its 6 selections (the grid solved
    again included)."""
    best: Selection | None = None
    for w in weights:
        opts, groups = _weighted(profiles, w, budget_s, warm_budget_s)
        lo, hi = 0.0, 1.0
        for _ in range(BOTH_SHRINK_STEPS):
            mid = (lo + hi) / 2
            sol = solve_mckp(groups, mid)
            if sol is None:
                lo = mid  # nothing that fast: larger
                continue
            sel = dataclasses.replace(_selection(opts, sol, True), exact=False)
            if _within_both(sel, budget_s, warm_budget_s):
                lo = mid
                if best is None or sel.stored_bytes < best.stored_bytes:
                    best = sel
            else:
                hi = mid
    return best


def estimates_of(profiles: Sequence[ClassProfile], cand: Candidate | None) -> list[Estimate]:
    """Each class's estimate with `cand` alone (not in solid blocks), where it has one."""
    out = []
    for prof in profiles:
        est = next((e for e in prof.estimates if e.candidate == cand and not e.solid), None)
        if est is not None:
            out.append(est)
    return out


def _everywhere(profiles: Sequence[ClassProfile], cand: Candidate) -> Selection | None:
    """`cand` (alone, not in solid blocks) for every class, or None if a class has no such
    estimate."""
    choices = estimates_of(profiles, cand)
    if len(choices) < len(profiles):
        return None
    return Selection(
        tuple(choices),
        stored_bytes=sum(e.stored_bytes for e in choices),
        decode_s=sum(e.decode_s for e in choices),
        feasible=True,
        exact=False,
        gap=0.0,
    )


def _weighted(
    profiles: Sequence[ClassProfile], w: float, budget_s: float, warm_budget_s: float
) -> tuple[list[list[Estimate]], list[list[tuple[float, float]]]]:
    """The options under the weight w x cold / budget_s + (1 - w) x warm / warm_budget_s,
    and the knapsack's (weight, stored bytes) groups of them."""

    def weight(e: Estimate) -> float:
        return w * e.decode_s / budget_s + (1 - w) * e.warm / warm_budget_s

    opts = _options(profiles, weight)
    return opts, [[(weight(e), float(e.stored_bytes)) for e in g] for g in opts]


def _within_both(sel: Selection, budget_s: float, warm_budget_s: float) -> bool:
    tol = 1 + 1e-9
    warm = sum(e.warm for e in sel.choices)
    return sel.decode_s <= budget_s * tol and warm <= warm_budget_s * tol


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
