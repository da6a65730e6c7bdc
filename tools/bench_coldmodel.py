"""How well two cold-cache models predict each class's decode through the mount, on the real
dataset of bench_realdata, timed together with the mount.

    .venv/bin/python tools/bench_coldmodel.py [--cache /var/tmp/fanfs-realdata] [--rounds 3]

Needs bench_realdata's tree and default (zstd:3) pack: run it once with
`--systems default --keep`.

The truth is each class's decode within a shuffled epoch of the default pack through a
fresh mount (the decode trace charged to each chunk's class, read-ahead off: what
bench_realdata's per-class epoch table measures). Both models start from the plan's
reference pass (`measure_reference`: zstd:3 on every unit of every class's sample, the hot
decode per byte, projected onto the class's bytes) and differ in the cold cost per chunk:

- method: the plan's own (`cold_penalty`: 4 MiB written before each of up to 16 units'
  decodes), what `fanfs plan` projects zstd:3 with;
- sample mount: the sample's units written out as files, packed with zstd:3 and read in a
  shuffled epoch through a real mount with the decode trace; a class's cold cost per unit
  is its traced decode less the reference pass's hot decode of the same units. What the
  plan itself does since (`fanfs.optimizer.coldmount`, `--cold-cost mount`), for the
  classes of at least 16 sample units; here for every class.

Each round measures the default pack's epoch, the reference pass and the sample pack's
epoch back to back: this shared host's speed moves by 20% within minutes, and a model timed
an hour before the mount it predicts misses by that much. Prints, per round, how many
classes each model puts within 25% of the mount, then each class's medians over the rounds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tools")]
import bench_realdata  # noqa: E402

from fanfs.format.reader import PackReader  # noqa: E402
from fanfs.hints import resolve  # noqa: E402
from fanfs.optimizer import REFERENCE, PlanSettings, sample_classes  # noqa: E402
from fanfs.optimizer.measurement import measure_reference, project_decode  # noqa: E402
from fanfs.optimizer.sampling import ClassSample  # noqa: E402
from fanfs.pack import DEFAULT_CHUNK_SIZE, effective_block_size  # noqa: E402
from fanfs.walk import sample_tree  # noqa: E402

MODELS = ("method", "sample mount")


def log(msg: str, *args: object) -> None:
    print("[coldmodel] " + msg % args, file=sys.stderr, flush=True)


def plan_sample(tree: Path) -> list[ClassSample]:
    """The classes and measured units `fanfs plan` of `tree` draws (its defaults)."""
    settings = PlanSettings()
    sample = sample_tree(str(tree), seed=settings.seed, skip_unreadable=True)
    classes, _ = sample_classes(
        sample.files,
        chunk_size=DEFAULT_CHUNK_SIZE,
        block_size=effective_block_size(DEFAULT_CHUNK_SIZE, None),
        sample_bytes=settings.sample_bytes,
        seed=settings.seed,
    )
    return [c for c in classes if c.units]


def write_sample(classes: list[ClassSample], root: Path) -> dict[str, list[bytes]]:
    """Each class's measured units as files under `root` (one directory per class); their
    paths by class."""
    members: dict[str, list[bytes]] = {}
    for k, cls in enumerate(classes):
        (root / ("c%02d" % k)).mkdir(parents=True)
        rels = members.setdefault(cls.name, [])
        for i, unit in enumerate(cls.measure_units):
            rel = "c%02d/u%05d" % (k, i)
            (root / rel).write_bytes(unit)
            rels.append(rel.encode())
    return members


def class_extent(pack: Path, members: dict[str, list[bytes]]) -> dict[str, tuple[int, int]]:
    """Each class's (chunks, decoded bytes) in `pack`."""
    reader = PackReader(str(pack))
    try:
        ix = reader.index
        out = {}
        for cls, rels in members.items():
            chunks = size = 0
            for rel in rels:
                entry = resolve(ix, b"", rel)
                if entry >= 0:
                    chunks += int(ix.count[entry])
                    size += int(ix.size[entry])
            out[cls] = (chunks, size)
        return out
    finally:
        reader.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/var/tmp/fanfs-realdata"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tree, pack = args.cache / "tree-full", args.cache / "work-full" / "default.fan"
    if not (tree / ".complete").exists() or not pack.exists():
        print(
            "bench_coldmodel: no dataset or default pack under %s: run "
            "tools/bench_realdata.py --systems default --keep first" % args.cache,
            file=sys.stderr,
        )
        return 1
    log("sampling %s as fanfs plan does", tree)
    classes = plan_sample(tree)
    members = bench_realdata.class_members(tree, [c.name for c in classes])
    extent = class_extent(pack, members)
    work = Path(tempfile.mkdtemp(prefix="fanfs-coldmodel-", dir=args.cache))
    try:
        sample_members = write_sample(classes, work / "sample")
        sample_pack = work / "sample.fan"
        log("packing the sample (%d units)", sum(len(c.measure_units) for c in classes))
        subprocess.run(
            [*bench_realdata.FANFS, "pack", str(work / "sample"), str(sample_pack), "-q"],
            check=True,
        )
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            log("round %d: the default pack's epoch", r + 1)
            truth = bench_realdata.traced_epoch(pack, members, work, seed=r + 1)
            log("round %d: the reference pass", r + 1)
            swept = measure_reference(classes, REFERENCE)
            log("round %d: the sample pack's epoch", r + 1)
            mounted = bench_realdata.traced_epoch(sample_pack, sample_members, work, seed=r + 1)
            got: dict[str, dict[str, float]] = {"truth": truth, **{m: {} for m in MODELS}}
            for cls in classes:
                m = swept[cls.name]
                chunks, size = extent[cls.name]
                # (the method's projection, and the hot part alone; the same units' hot decode)
                method, hot = project_decode(m, size, chunks)
                got["method"][cls.name] = method
                cold = (mounted[cls.name] - m.decode_s / m.cold) / m.units
                got["sample mount"][cls.name] = hot + cold * chunks
            rounds.append(got)
            within = {
                model: sum(
                    0.75 <= got[model][c.name] / truth[c.name] <= 1.25
                    for c in classes
                    if truth[c.name] > 0
                )
                for model in MODELS
            }
            print(
                "Round %d: the default pack's epoch decoded in %.3f s; within 25%% of it per "
                "class: %s"
                % (
                    r + 1,
                    sum(truth.values()),
                    ", ".join("%s %d of %d" % (m, within[m], len(classes)) for m in MODELS),
                )
            )
        print("\n| class | chunks | sample units | mount s | %s |" % " | ".join(MODELS))
        print("|---|---|---|---|%s" % ("---|" * len(MODELS)))
        for cls in classes:
            truth_s = statistics.median(g["truth"][cls.name] for g in rounds)
            ratios = [
                statistics.median(g[m][cls.name] / g["truth"][cls.name] for g in rounds)
                for m in MODELS
            ]
            print(
                "| %s | %d | %d | %.4f | %s |"
                % (
                    cls.name,
                    extent[cls.name][0],
                    len(cls.measure_units),
                    truth_s,
                    " | ".join("%.2f" % q for q in ratios),
                )
            )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
