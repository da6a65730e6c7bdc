"""Does a shuffled epoch of a sample of a pack's files show what each class costs among the
pack's other decoders? A probe for the plan's next cold-cost model, on the real dataset of
bench_realdata.

    .venv/bin/python tools/bench_mixsample.py [--pack work-full/auto-balanced.fan]
        [--cache /var/tmp/fanfs-realdata] [--fraction 0.1] [--rounds 2]

Needs bench_realdata's tree, its default (zstd:3) pack and a `--codec auto` pack (the plan's
classes come from its manifest): run `tools/bench_realdata.py --systems
default,auto-balanced --keep` once first.

Each round reads, on fresh mounts with read-ahead off and the decode trace on (as
bench_realdata's per-class epoch table does), the auto pack's full shuffled epoch, then a
shuffled epoch of a seeded sample of its files (`--fraction` of each class's, at least 16),
then the same two of the default pack. A class's decode in the sample's epoch, times its
files over the sampled files, estimates its decode in the full epoch; and each class's
decode in the auto pack over the default pack's, in the sample's epochs against the full
ones, says whether the sample shows the mixed pack's cost. Prints how many classes each
puts within 25%, then the medians per class.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tools")]
import bench_realdata  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/var/tmp/fanfs-realdata"))
    ap.add_argument("--pack", type=Path, default=Path("work-full/auto-balanced.fan"))
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    tree = args.cache / "tree-full"
    packs = {"auto": args.cache / args.pack, "default": args.cache / "work-full" / "default.fan"}
    if not (tree / ".complete").exists() or not all(p.exists() for p in packs.values()):
        print(
            "bench_mixsample: no dataset, default pack or %s under %s: run "
            "tools/bench_realdata.py --systems default,auto-balanced --keep first"
            % (args.pack, args.cache),
            file=sys.stderr,
        )
        return 1
    plan = bench_realdata.pack_summary(packs["auto"]).get("plan")
    if not plan:
        print("bench_mixsample: %s has no plan (not --codec auto)" % packs["auto"], file=sys.stderr)
        return 1
    classes = [row["class"] for row in plan["classes"]]
    solid = {row["class"] for row in plan["classes"] if row["solid"]}
    members = bench_realdata.class_members(tree, classes)
    rng = random.Random(args.seed)
    sample = {
        cls: sorted(rng.sample(rels, max(min(len(rels), 16), int(len(rels) * args.fraction))))
        for cls, rels in members.items()
    }
    work = Path(tempfile.mkdtemp(prefix="fanfs-mixsample-", dir=args.cache))
    got: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {p: [] for p in packs}
    try:
        for r in range(args.rounds):
            for name, pack in packs.items():
                full = bench_realdata.traced_epoch(pack, members, work, seed=r + 1)
                part = bench_realdata.traced_epoch(pack, sample, work, seed=r + 1)
                got[name].append((full, part))
                print(
                    "Round %d, %s pack: the full epoch decoded in %.3f s, the sample's (%d "
                    "files) in %.3f s"
                    % (r + 1, name, sum(full.values()), sum(map(len, sample.values())),
                       sum(part.values()))
                )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(name: str, which: int, cls: str) -> float:
        return statistics.median(pair[which][cls] for pair in got[name])

    print(
        "\n| class | codec | files | sampled | auto: sample / full | default: sample / full "
        "| auto / default, full | auto / default, sample |"
    )
    print("|---|---|---|---|---|---|---|---|")
    within = {"auto": 0, "default": 0, "mixed": 0}
    for row in plan["classes"]:
        cls = row["class"]
        scale = len(members[cls]) / max(len(sample[cls]), 1)
        est = {n: med(n, 1, cls) * scale / max(med(n, 0, cls), 1e-12) for n in packs}
        mixed_full = med("auto", 0, cls) / max(med("default", 0, cls), 1e-12)
        mixed_part = med("auto", 1, cls) / max(med("default", 1, cls), 1e-12)
        for n in packs:
            within[n] += 0.75 <= est[n] <= 1.25
        within["mixed"] += 0.75 <= mixed_part / mixed_full <= 1.25
        print(
            "| %s | %s | %d | %d | %.2f | %.2f | %.2f | %.2f |"
            % (cls, row["codec"] + ("+solid" if cls in solid else ""), len(members[cls]),
               len(sample[cls]), est["auto"], est["default"], mixed_full, mixed_part)
        )  # fmt: skip
    n = len(plan["classes"])
    print(
        "\nThe sample's epoch, scaled by files, within 25%% of the full epoch per class: auto "
        "pack %d of %d, default pack %d of %d. Each class's auto / default in the sample's "
        "epochs within 25%% of the full epochs': %d of %d."
        % (within["auto"], n, within["default"], n, within["mixed"], n)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
