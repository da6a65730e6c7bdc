"""The compressor-selection optimizer: profile a dataset's classes of files, then choose one
codec per class (`fanfs plan`, `fanfs pack --codec auto`).

Owns the class rule (extension x top-level directory, rare classes merged), the stratified
and seeded sample, the measurement of every candidate codec on it (ratio, single-thread
decode and compress speed; the measuring function is a parameter so tests inject numbers),
the cost model of the two modes (sync, prefetch) and of the capacity dual, and the exact
multiple-choice knapsack solver. Never writes a pack and never prints: pack.py and plan.py do.
The model and its assumptions are in docs/architecture.md, "Compressor optimizer".

One module per step, each importing only those before it: `candidates`, `classes`,
`sampling`, `coldmount` (the sample read through a mount of it), `measurement`, `selection`,
`budgets`.
"""

from fanfs.optimizer.budgets import Plan, PlanSettings, decode_budget, make_plan, plan_record
from fanfs.optimizer.candidates import DEFAULT_CODECS, NONE, Candidate, parse_candidates
from fanfs.optimizer.classes import (
    FALLBACK_CLASS,
    MAX_CLASSES,
    MAX_EXT_DIRS,
    MIN_CLASS_FILES,
    MIN_CLASS_SHARE,
    FileRef,
    build_classes,
    class_of,
    exact_class,
)
from fanfs.optimizer.measurement import (
    COLD_UNITS,
    DECODE_PASSES,
    DICT_MAX_OBJECT_BYTES,
    DICT_TRAIN_MAX_BYTES,
    PILOT_BYTES,
    REFERENCE,
    WIN_SIGMAS,
    ClassProfile,
    Estimate,
    MeasureFn,
    Measurement,
    PlanCost,
    cold_penalty,
    confirm,
    cost_rank,
    measure,
    profile,
)
from fanfs.optimizer.sampling import (
    FLOOR_SHARE,
    ClassSample,
    ReadModel,
    fit_read_model,
    read_unit,
    sample_classes,
)
from fanfs.optimizer.selection import (
    MAX_FRONTIER,
    TRIM_GAP,
    Objective,
    Selection,
    Solution,
    select,
    solve_mckp,
)

__all__ = [
    "COLD_UNITS",
    "DECODE_PASSES",
    "DEFAULT_CODECS",
    "DICT_MAX_OBJECT_BYTES",
    "DICT_TRAIN_MAX_BYTES",
    "FALLBACK_CLASS",
    "FLOOR_SHARE",
    "MAX_CLASSES",
    "MAX_EXT_DIRS",
    "MAX_FRONTIER",
    "MIN_CLASS_FILES",
    "MIN_CLASS_SHARE",
    "NONE",
    "PILOT_BYTES",
    "REFERENCE",
    "TRIM_GAP",
    "WIN_SIGMAS",
    "Candidate",
    "ClassProfile",
    "ClassSample",
    "Estimate",
    "FileRef",
    "MeasureFn",
    "Measurement",
    "Objective",
    "Plan",
    "PlanCost",
    "PlanSettings",
    "ReadModel",
    "Selection",
    "Solution",
    "build_classes",
    "class_of",
    "cold_penalty",
    "confirm",
    "cost_rank",
    "decode_budget",
    "exact_class",
    "fit_read_model",
    "make_plan",
    "measure",
    "parse_candidates",
    "plan_record",
    "profile",
    "read_unit",
    "sample_classes",
    "select",
    "solve_mckp",
]
