"""The codec plan's presentation: option parsing into `PlanSettings` and the plan tables
shared by `fanfs plan` (`pack.run_plan`, which walks the tree as `pack` does), `fanfs pack`
and `fanfs inspect`. Imports nothing above the optimizer.

Never writes anything but stdout; the optimizer does the work (the fanfs/optimizer/ package).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from typing import TYPE_CHECKING, Any, Final

from fanfs._sizes import format_size, parse_size
from fanfs.errors import UsageError
from fanfs.optimizer import (
    DEFAULT_CODECS,
    Plan,
    PlanSettings,
    ReadModel,
    parse_candidates,
    plan_record,
)
from fanfs.optimizer.budgets import plan_ceiling_s

if TYPE_CHECKING:
    from fanfs.walk import TreeSample

_RATE_RE: Final = re.compile(r"^\s*([0-9.]+)\s*([a-zA-Z]*)\s*(?:/\s*s)?\s*$")


def parse_percent(text: str, most: float = 1.0) -> float:
    """`5%` or `0.05` -> 0.05: a share from 0 to `most` (100%). A bare number above 1 is
    refused, not read as a share: `--plan-share 25` was taken as 2,500% of the pack time,
    and profiling ran for 400 s where 25% allowed 50."""
    percent = text.strip().endswith("%")
    try:
        value = float(text.strip()[:-1]) / 100 if percent else float(text)
    except ValueError:
        raise UsageError("invalid percentage %r (expected e.g. 5%%)" % text) from None
    if not percent and value > 1:
        raise UsageError(
            "invalid percentage %r (a number without %% is a share from 0 to 1: write %s%% or %s)"
            % (text, text.strip(), value / 100)
        )
    if not 0 <= value <= most:
        bound = "0%% to %g%%" % (100 * most) if math.isfinite(most) else "at least 0%"
        raise UsageError("invalid percentage %r (expected %s)" % (text, bound))
    return value


def parse_rate(text: str) -> tuple[float | None, float | None]:
    """`--target-rate`: `2000` or `2000files/s` (files per second) or `500MB/s` (bytes per
    second, any size unit). Returns (files per s, bytes per s), one of them None."""
    match = _RATE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    try:
        if match is None:
            raise ValueError
        if unit in ("", "files", "file", "f"):
            value = float(match.group(1))
            if value <= 0:
                raise ValueError
            return value, None
        value = parse_size(match.group(1) + match.group(2))
        if value <= 0:
            raise ValueError
        return None, float(value)
    except (UsageError, ValueError):
        raise UsageError("invalid rate %r (expected e.g. 2000files/s or 500MB/s)" % text) from None


def _number(text: str, what: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0 or (positive and value == 0) or value != value or value == float("inf"):
        raise UsageError(
            "%s must be a %s number (got %r)"
            % (what, "positive" if positive else "non-negative", text)
        )
    return value


def _nodes(value: int | None, mode: str) -> int:
    """--nodes: the balanced mode's (its solid blocks' decode per epoch depends on it)."""
    if value is None:
        return 1
    if mode != "balanced":
        raise UsageError("--nodes applies to --mode balanced (not %s)" % mode)
    if value < 1:
        raise UsageError("--nodes must be at least 1 (got %d)" % value)
    return value


def settings_from_args(args: argparse.Namespace) -> PlanSettings:
    files_rate, bytes_rate = parse_rate(args.target_rate) if args.target_rate else (None, None)
    # Without --mode: prefetch if a target rate is given, sync if a sync option is, else
    # balanced (decode no slower than the default codec's).
    sync_options = [
        flag
        for flag, value in (
            ("--max-overhead", args.max_overhead),
            ("--compute-ms", args.compute_ms),
        )
        if value is not None
    ]
    implied = "prefetch" if args.target_rate else "sync" if sync_options else None
    mode = args.mode or implied or "balanced"
    if mode == "prefetch" and not args.target_rate:
        raise UsageError("--mode prefetch needs --target-rate")
    if mode != "sync" and sync_options:
        raise UsageError("%s applies to --mode sync (not %s)" % (sync_options[0], mode))
    read_model = None
    if args.read_mbps is not None or args.read_latency_ms is not None:
        if args.read_mbps is None or args.read_latency_ms is None:
            raise UsageError("give both --read-mbps and --read-latency-ms, or neither")
        read_model = ReadModel(
            _number(args.read_latency_ms, "--read-latency-ms", positive=False) / 1e3,
            _number(args.read_mbps, "--read-mbps", positive=True) * 1e6,
            "given",
        )
    capacity = parse_size(args.capacity) if args.capacity else None
    compute = _number(args.compute_ms or "0", "--compute-ms", positive=False)
    return PlanSettings(
        mode="capacity" if capacity is not None else mode,
        max_overhead=parse_percent(args.max_overhead or "5%", math.inf),
        compute_s=compute / 1e3,
        read_model=read_model,
        target_files_per_s=files_rate,
        target_bytes_per_s=bytes_rate,
        decode_cores=_number(args.decode_cores, "--decode-cores", positive=True),
        capacity_bytes=capacity,
        check_mode=(args.mode or implied) if capacity is not None else None,
        sample_bytes=parse_size(args.sample_bytes),
        time_budget_s=(
            _number(args.time_budget, "--time-budget", positive=True)
            if args.time_budget is not None
            else None
        ),
        plan_share=parse_percent(args.plan_share),
        jobs=getattr(args, "jobs", 0) or os.cpu_count() or 1,
        nodes=_nodes(args.nodes, "capacity" if capacity is not None else mode),
        cold_model=args.cold_cost,
        seed=args.seed,
        candidates=parse_candidates(args.codecs or DEFAULT_CODECS),
    )


# --- a plan of a sampled tree ------------------------------------------------------------------

# Fields of a plan record that grow with the tree: counted in files, or in bytes or seconds.
_FILE_FIELDS: Final = ("files",)
_BYTE_FIELDS: Final = (
    "bytes",
    "projected_bytes",
    "decode_s",
    "budget_s",
    "compress_s",
    "warm_decode_s",
    "warm_budget_s",
)


def _scales(sample: TreeSample) -> tuple[float, float]:
    """(files, bytes) of the tree per file and byte of the sample; 1 for a complete walk."""
    if sample.complete or not sample.files:
        return 1.0, 1.0
    sample_bytes = sum(f.size for f in sample.files)
    return sample.est_files / len(sample.files), sample.est_bytes / max(sample_bytes, 1)


def sample_settings(settings: PlanSettings, sample: TreeSample) -> PlanSettings:
    """The settings to plan the sample with: a capacity limit and the bytes of small files
    the page cache is taken to hold (`resident_bytes`) are for the whole tree, so the sample
    gets its share of them (every other constraint is per file or a ratio)."""
    _, per_byte = _scales(sample)
    if per_byte == 1.0:
        return settings
    capacity = settings.capacity_bytes
    return dataclasses.replace(
        settings,
        capacity_bytes=None if capacity is None else int(capacity / per_byte),
        resident_bytes=int(settings.resident_bytes / per_byte),
    )


def sampled_plan_record(plan: Plan, sample: TreeSample) -> dict[str, Any]:
    """`plan_record` with the sample's counts extrapolated to the whole tree (an estimate,
    marked in `sample.walk`) when the walk was sampled; exactly `plan_record` otherwise."""
    record = plan_record(plan)
    if sample.complete:
        return record
    per_file, per_byte = _scales(sample)

    def scale(obj: dict[str, Any]) -> None:
        for key in _FILE_FIELDS:
            if obj.get(key) is not None:
                obj[key] = int(round(obj[key] * per_file))
        for key in _BYTE_FIELDS:
            if obj.get(key) is not None:
                value = obj[key] * per_byte
                obj[key] = value if key.endswith("_s") else int(round(value))

    scale(record)
    for row in record["classes"]:
        scale(row)
        for cand in row["candidates"]:
            scale(cand)
        if row.get("solid_decode_s"):
            row["solid_decode_s"] = {k: v * per_byte for k, v in row["solid_decode_s"].items()}
    if record["settings"]["capacity_bytes"] is not None:
        record["settings"]["capacity_bytes"] = int(
            round(record["settings"]["capacity_bytes"] * per_byte)
        )
    record["sample"]["walk"] = {
        "entries_examined": sample.examined,
        "directories_listed": sample.directories,
        "files_sampled": len(sample.files),
        "files_estimated": int(round(sample.est_files)),
        "bytes_estimated": int(round(sample.est_bytes)),
        "partial": sample.truncated,
    }
    return record


# --- output -----------------------------------------------------------------------------------


def _ratio(b_in: int, b_out: int) -> str:
    return "%.2fx" % (b_in / b_out) if b_out else "-"


def plan_table(record: dict[str, Any]) -> str:
    """The plan table and its summary lines, from a `plan_record` (also the manifest's)."""
    head = "%-18s %8s %11s  %-13s %7s %8s %7s %11s %16s" % (
        "class",
        "files",
        "bytes",
        "codec",
        "ratio",
        "dec MB/s",
        "budget",
        "projected",
        "sample",
    )
    lines = [head]
    for row in record["classes"]:
        lines.append(
            "%-18s %8d %11s  %-13s %7s %8s %7s %11s %16s"
            % (
                row["class"][:18],
                row["files"],
                format_size(row["bytes"]),
                row["codec"] + ("+solid" if row.get("solid") is True else ""),
                "%.2fx" % row["ratio"],
                "%.0f" % row["decode_mbps"] if row["decode_mbps"] else "-",
                "%.1f%%" % (100 * row["budget_share"]) if row["budget_share"] else "-",
                format_size(row["projected_bytes"]),
                "%d / %s" % (row["sample_units"], format_size(row["sample_bytes"])),
            )
        )
    lines.append(
        "%-18s %8d %11s  %-13s %7s %8s %7s %11s"
        % (
            "total",
            record["files"],
            format_size(record["bytes"]),
            "",
            _ratio(record["bytes"], record["projected_bytes"]),
            "",
            "%.1f%%" % (100 * record["decode_s"] / record["budget_s"])
            if record["budget_s"]
            else "-",
            format_size(record["projected_bytes"]),
        )
    )
    return "\n".join([*lines, "", *summary_lines(record)])


def summary_lines(record: dict[str, Any]) -> list[str]:
    s = record["settings"]
    files = max(record["files"], 1)
    out = []
    budget, decode = record["budget_s"], record["decode_s"]
    mode = record["check_mode"] if record["mode"] == "capacity" else record["mode"]
    if record["mode"] == "capacity":
        out.append(
            "objective   least decode time that fits in %s" % format_size(s["capacity_bytes"])
        )
    if mode == "balanced":
        out.append(
            "budget      balanced: decode no slower in all than the default codec, zstd:3 "
            "(--mode sync or prefetch for a budget of your job's)"
        )
    elif mode == "sync":
        out.append(
            "budget      sync: decode may add %g%% to the time to read a sample raw%s"
            % (
                100 * s["max_overhead"],
                " plus %g ms of compute" % s["compute_ms"] if s["compute_ms"] else "",
            )
        )
        out.append(
            "read model  %.3f ms + size / %.0f MB/s per file (%s)"
            % (
                s["read_latency_ms"],
                s["read_mbps"],
                "measured reading the sample from SRC; set --read-mbps and --read-latency-ms "
                "for the storage the pack will be read from"
                if s["read_model"] == "measured"
                else "given",
            )
        )
    elif mode == "prefetch":
        target = (
            ("%g files/s" % s["target_files_per_s"])
            if s["target_files_per_s"]
            else ("%g MB/s" % s["target_mbps"])
        )
        out.append(
            "budget      prefetch: decoding on %g cores must keep up with %s"
            % (s["decode_cores"], target)
        )
        if decode:
            out.append(
                "            this plan decodes up to %.0f files/s (%s/s) on %g cores"
                % (
                    files * s["decode_cores"] / decode,
                    format_size(record["bytes"] * s["decode_cores"] / decode),
                    s["decode_cores"],
                )
            )
    if budget is not None:
        out.append(
            "decode      %.3f s per epoch on one thread, %.1f%% of the budget of %.3f s; "
            "%.1f us per file"
            % (decode, 100 * decode / budget if budget else 0.0, budget, 1e6 * decode / files)
        )
        warm, warm_budget = record.get("warm_decode_s"), record.get("warm_budget_s")
        if warm is not None and warm_budget:
            out.append(
                "            with hot caches %.3f s, %.1f%% of zstd:3's %.3f s"
                % (warm, 100 * warm / warm_budget, warm_budget)
            )
    else:
        out.append(
            "decode      %.3f s per epoch on one thread; %.1f us per file"
            % (decode, 1e6 * decode / files)
        )
    solver = "optimal" if record["exact"] else "within %.2f%% of optimal" % (100 * record["gap"])
    out.append(
        "solver      %s (multiple-choice knapsack over %d candidates)"
        % (solver, len(s["candidates"]))
    )
    smp = record["sample"]
    out.append(
        "sample      %d units, %s, profiled in %.1f s, seed %d; "
        "ratios and speeds measured on this host, one thread"
        % (smp["units"], format_size(smp["bytes"]), smp["seconds"], s["seed"])
    )
    cold = smp.get("cold")
    if cold:
        out.append("cold cost   " + _cold_words(cold))
    walk = smp.get("walk")
    if walk:
        out.append(
            "walk        sampled: %d files of an estimated %d (%s) from %d entries in %d "
            "directories (--sample-entries); files, bytes and times above are extrapolated%s"
            % (
                walk["files_sampled"],
                walk["files_estimated"],
                format_size(walk["bytes_estimated"]),
                walk["entries_examined"],
                walk["directories_listed"],
                "; part of the tree was not reached, so they are low" if walk["partial"] else "",
            )
        )
    if smp.get("predicted_pack_s") is not None:
        out.append(
            "plan cost   %.1f s reading the sample, %.1f s the zstd:3 pass%s, %.1f s of "
            "measurement (CPU) within a budget of %.1f s%s%s%s; the pack is predicted to "
            "take %.1f s on %d jobs: the budget aims at %g%% of it (%.1f s) for all%s"
            % (
                smp.get("sample_read_s", 0.0),
                smp["reference_s"],
                ", %.1f s its mount" % cold["mount_s"] if cold and cold["mount_s"] else "",
                smp["measure_s"],
                s["time_budget_s"],
                " set in %d rounds" % smp["rounds"] if smp.get("rounds", 1) > 1 else "",
                ", %.1f s besides (the selections)" % smp["other_s"] if "other_s" in smp else "",
                (
                    "; %.1f s of the measurement ran beside the plan's thread (compressing)"
                    % smp["beside_s"]
                    if smp.get("beside_s")
                    else ""
                ),
                smp["predicted_pack_s"],
                s["jobs"],
                100 * s["plan_share"],
                s["plan_share"] * smp["predicted_pack_s"],
                _share_ceiling(s["plan_share"], smp["predicted_pack_s"]),
            )
        )
    return out


def _cold_words(cold: dict[str, Any]) -> str:
    """The plan table's words for how cold decodes were measured (`budgets._cold_record`)."""
    method = "timed after evicting the CPU caches"
    mounted = len(cold["mounted_classes"])
    if not mounted:
        return "%s (%s)" % (method, cold["note"]) if cold["note"] else method
    dicts = len(cold.get("dictionary_classes", ()))
    lz4 = len(cold.get("lz4_dictionary_classes", ()))
    brotli = len(cold.get("brotli_classes", ()))
    return (
        "the sample read through a mount of it, for %d class%s%s%s%s (%.1f s); %s for those of "
        "fewer sample units"
        % (
            mounted,
            "" if mounted == 1 else "es",
            ", brotli's cost for %d" % brotli if brotli else "",
            ", with their dictionaries for %d" % dicts if dicts else "",
            " (lz4's too for %d)" % lz4 if lz4 else "",
            cold["mount_s"],
            method,
        )
    )


def _share_ceiling(share: float, predicted_pack_s: float) -> str:
    """The plan table's words for where measuring stops (`budgets._within_share`)."""
    ceiling = plan_ceiling_s(share, predicted_pack_s)
    if math.isinf(ceiling):
        return ""
    words = ", and measuring after its rounds stops at %g%% of the pack time with the plan"
    return words % (100 * share) + " (%.1f s, as last predicted)" % ceiling


def realised_table(record: dict[str, Any]) -> str:
    """`fanfs inspect`: each class's planned and realised ratio."""
    lines = [
        "%-18s %-13s %9s %9s %11s %11s"
        % ("class", "codec", "planned", "realised", "bytes in", "stored")
    ]
    for row in record["classes"]:
        real = row.get("realised", {})
        lines.append(
            "%-18s %-13s %9s %9s %11s %11s"
            % (
                row["class"][:18],
                row["codec"] + ("+solid" if row.get("solid") is True else ""),
                "%.2fx" % row["ratio"],
                _ratio(real.get("bytes_in", 0), real.get("bytes_out", 0)),
                format_size(real.get("bytes_in", 0)),
                format_size(real.get("bytes_out", 0)),
            )
        )
    return "\n".join(lines)
