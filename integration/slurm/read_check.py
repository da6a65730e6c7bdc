"""The reader step of integration/test_slurm.py: runs on every node of a Slurm job.

    python read_check.py MNT EXPECTED.json OUTDIR

Reads every file listed in EXPECTED.json (relative path -> sha256 of the source file)
through the fanfs mount at MNT, each node in its own shuffled order, checks the bytes and
that the mount lists exactly those files, and writes OUTDIR/JOB.STEP.HOST.json with what it
found and the mount's counters. Exits 1 on any difference. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import sys


def main(argv: list[str]) -> int:
    mnt, expected_path, outdir = argv[1:4]
    with open(expected_path) as f:
        expected: dict[str, str] = json.load(f)
    host = socket.gethostname()
    order = sorted(expected)
    random.Random(host).shuffle(order)
    wrong = []
    for rel in order:
        with open(os.path.join(mnt, rel), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != expected[rel]:
                wrong.append(rel)
    listed = {
        os.path.relpath(os.path.join(dirpath, name), mnt)
        for dirpath, _, names in os.walk(mnt)
        for name in names
    }
    result = {
        "host": host,
        "job": os.environ.get("SLURM_JOB_ID"),
        "step": os.environ.get("SLURM_STEP_ID"),
        "rank": os.environ.get("SLURM_PROCID"),
        "files": len(order),
        "wrong": wrong,
        "missing": sorted(set(expected) - listed),
        "extra": sorted(listed - set(expected)),
        "stats": json.loads(os.getxattr(mnt, "user.fanfs.stats")),
    }
    name = "%s.%s.%s.json" % (result["job"], result["step"], host)
    with open(os.path.join(outdir, name + ".tmp"), "w") as f:
        json.dump(result, f)
    os.rename(os.path.join(outdir, name + ".tmp"), os.path.join(outdir, name))
    ok = not (wrong or result["missing"] or result["extra"])
    print("read_check on %s: %d files, %s" % (host, len(order), "ok" if ok else "DIFFERENT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
