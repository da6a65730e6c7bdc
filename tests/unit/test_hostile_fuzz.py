"""The seeded random forgery loop over every field of the golden packs (tests/hostile_harness.py):
each case refused with one line and exit 3, or served with the reference decoder's bytes (EIO
where it finds corruption), never a hang, a crash, an internal error or unbounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = 300


@pytest.mark.slow
def test_random_forgeries_are_refused_or_served_exactly(tmp_path: Path) -> None:
    # Format 4 (every codec, dictionaries, the shuffle, symlinks, broadcast partitions) and
    # format 1 (plain crc32, no dictionaries column).
    bases = [*sorted((DATA / "golden-v4").glob("*.fan")), DATA / "golden-v1" / "zstd.fan"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.hostile_harness",
            "--workdir",
            str(tmp_path),
            "--seed",
            "20261124",
            "--cases",
            str(CASES),
            *map(str, bases),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == CASES
    bad = [row for row in rows if row["problems"]]
    assert not bad, "\n".join(
        "case %d (%s): %s\n  %s\n  %s"
        % (r["case"], r["base"], r["forgery"], r["outcome"], "\n  ".join(r["problems"]))
        for r in bad[:5]
    )
    # The loop must keep reaching both sides: forgeries the checks refuse, and forgeries
    # that open and are served (bombs, flipped bytes, values that stay consistent).
    refused = sum(row["outcome"].startswith("refused") for row in rows)
    served = sum(row["outcome"].startswith("served") for row in rows)
    assert refused >= CASES // 5 and served >= CASES // 5, (refused, served)
    assert any("bomb" in row["forgery"] and row["outcome"].startswith("served") for row in rows)
