"""`--preload`: a mount copies into memory only the partitions that fit its budget, in
partition order, and says so in `fanfs stats`; the default budget is a stated share of the
node's available memory, never the whole pack when it does not fit."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Mount, run_fanfs

pytestmark = pytest.mark.fuse

PARTITIONS = 8


@pytest.fixture(scope="module")
def random_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A pack of incompressible files in PARTITIONS partitions of similar size."""
    root = tmp_path_factory.mktemp("preload") / "src"
    for d in range(4):
        (root / ("d%d" % d)).mkdir(parents=True)
        for i in range(50):
            (root / ("d%d" % d) / ("f%02d.bin" % i)).write_bytes(os.urandom(20_000 + 97 * i))
    pack = root.parent / "random.fan"
    result = run_fanfs("pack", root, pack, "-q", "--partitions", str(PARTITIONS))
    assert result.returncode == 0, result.stderr
    return root, pack


def partition_sizes(pack: Path) -> list[int]:
    return [p.stat().st_size for p in sorted(pack.glob("part-*"))]


def stats(mount: Mount) -> dict[str, Any]:
    result = run_fanfs("stats", "--json", mount.mnt)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_preloaded(mount: Mount, expected: int) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + 30
    while True:
        got = stats(mount)
        if got["resident_partitions"] >= expected or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def first_fit(sizes: list[int], budget: int) -> int:
    """How many partitions the documented rule preloads: in partition order, each one that
    still fits in what is left of the budget."""
    used = count = 0
    for size in sizes:
        if used + size <= budget:
            used, count = used + size, count + 1
    return count


@pytest.mark.parametrize("fit", [0, 3, PARTITIONS])
def test_preload_takes_what_fits_its_budget_in_partition_order(
    fit: int, random_pack: tuple[Path, Path], mount_factory: Any
) -> None:
    source, pack = random_pack
    sizes = partition_sizes(pack)
    assert len(sizes) == PARTITIONS and min(sizes) > 0
    # a budget that holds the first `fit` partitions and less than the smallest other one
    rest = min(sizes[fit:], default=1)
    budget = sum(sizes[:fit]) + rest - 1
    assert first_fit(sizes, budget) == fit
    mount: Mount = mount_factory(pack, "--preload", str(budget), "--prefetch", "off")
    got = wait_preloaded(mount, fit)
    assert (got["resident_partitions"], got["partitions"]) == (fit, PARTITIONS)
    for path in sorted(source.rglob("*.bin"))[::7]:  # resident or not, the bytes are right
        assert (mount.mnt / path.relative_to(source)).read_bytes() == path.read_bytes()
    assert stats(mount)["resident_partitions"] == fit  # reads do not preload more


def test_preload_budget_is_a_size(random_pack: tuple[Path, Path], mount_factory: Any) -> None:
    _, pack = random_pack
    result = run_fanfs("mount", pack, pack.parent / "nowhere", "--preload", "lots")
    assert result.returncode == 2
    assert result.stderr == (
        "fanfs mount: error: invalid size 'lots' (expected a number with an optional unit"
        " such as 4MiB)\n"
    )
