"""Hostile packs in cluster mode (issue 10): real `mpirun` jobs whose pack names a partition
outside itself. Rank 0 validates the pack before anything is staged, and every rank stops
with the same one-line error: nothing is written outside the cache dirs."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fanfs.format.layout import MANIFEST_NAME
from integration.conftest import MpiJob
from tests.conftest import NOBODY, run_fanfs
from tests.forge import PackImage
from tests.treegen import label_text, write_tree

pytestmark = pytest.mark.mpi

StartJob = Callable[..., MpiJob]
EXIT_DEADLINE_S = 45.0


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("hostile-cluster")
    src = write_tree(
        base / "src", {"d%d/f%02d.txt" % (i % 3, i): label_text(20_000, i) for i in range(30)}
    )
    out = base / "good.fan"
    assert (
        run_fanfs("pack", src, out, "-q", "--partitions", "4", "--chunk-size", "64KiB").returncode
        == 0
    )
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["../../escaped", "/tmp/fanfs-escaped-by-a-pack"])
def test_a_partition_named_outside_the_pack_stops_every_rank_before_staging(
    mpi_jobs: StartJob, pack: Path, tmp_path: Path, name: str
) -> None:
    """A root rank used to copy `PACK/NAME` to `CACHE/pack-XXXXXXXX/NAME` (plus a .verified
    marker) wherever NAME led. '../../escaped' from a rank's stage dir is the job's workdir."""

    def rename(manifest: dict[str, Any]) -> None:
        manifest["partitions"][1]["file"] = name

    forged = PackImage(pack).save(tmp_path / "forged.fan", after=rename)
    (tmp_path / "forged.fan" / "escaped").write_bytes(b"attacker bytes")  # what ../ would reach
    job = mpi_jobs(forged, 3, ready=False, name="job")
    code = job.wait_exit(EXIT_DEADLINE_S)
    out = job.output()
    message = (
        "fanfs mount: error: %s: manifest field partitions[1].file is %r, expected 'part-00001'"
        % (forged, name)
    )
    assert code == 3, "mpirun exited %d:\n%s" % (code, out)
    assert out.count(message) == 3, out
    assert "Traceback" not in out, out
    assert job.mounted() == []
    written = sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "escaped" in p.name
    )
    assert written == ["forged.fan/escaped"]
    assert not Path("/tmp/fanfs-escaped-by-a-pack").exists()
    # Nothing was staged either: rank 0 refused the pack before any rank copied a byte.
    assert [p for p in (tmp_path / "job").rglob("part-*")] == []


# --- cache dirs other users can change (docs/security.md) ------------------------------------

NP = 2


def refused_job(
    mpi_jobs: StartJob, pack: Path, prepare: Callable[[Path], None]
) -> tuple[MpiJob, str]:
    """A job whose every rank must stop with exit 4 (mount setup) and no traceback."""
    job = mpi_jobs(pack, NP, ready=False, name="job", prepare=prepare)
    code = job.wait_exit(EXIT_DEADLINE_S)
    out = job.output()
    assert code == 4, "mpirun exited %d:\n%s" % (code, out)
    assert "Traceback" not in out, out
    return job, out


def assert_each_rank_refused(out: str, messages: list[str]) -> None:
    """Each rank printed its own refusal once (mpirun may join the ranks' lines)."""
    for message in messages:
        assert out.count("fanfs mount: error: " + message) == 1, out
    assert out.count("fanfs mount: error: ") == len(messages), out


@pytest.mark.timeout(90)
def test_a_cache_dir_writable_by_others_is_refused_by_every_rank(
    mpi_jobs: StartJob, pack: Path
) -> None:
    def world_writable(workdir: Path) -> None:
        for rank in range(NP):
            (workdir / ("cache%d" % rank)).mkdir(mode=0o777)
            (workdir / ("cache%d" % rank)).chmod(0o777)

    job, out = refused_job(mpi_jobs, pack, world_writable)
    assert_each_rank_refused(
        out,
        [
            "refusing to use --cache-dir %s: it is writable by others (other users could replace "
            "what fanfs writes there; use a directory only you can write)"
            % (job.workdir / ("cache%d" % rank))
            for rank in range(NP)
        ],
    )
    assert job.mounted() == []
    assert [p for p in job.workdir.rglob("pack-*")] == []


@pytest.mark.timeout(90)
def test_a_planted_stage_dir_in_a_shared_cache_dir_is_refused(
    mpi_jobs: StartJob, pack: Path, tmp_path: Path
) -> None:
    """A cache dir on shared scratch (sticky and world-writable, like /tmp): another user
    plants `pack-CRC` as a symlink to a directory of theirs before the job stages. Root's
    ranks used to write the index, the manifest and partitions through it."""
    stage_name = "pack-%08x" % zlib.crc32((pack / MANIFEST_NAME).read_bytes())
    victim = tmp_path / "attacker-dir"
    victim.mkdir()

    def plant(workdir: Path) -> None:
        for rank in range(NP):
            cache = workdir / ("cache%d" % rank)
            cache.mkdir()
            cache.chmod(0o1777)
            (cache / stage_name).symlink_to(victim)
            os.lchown(cache / stage_name, NOBODY, NOBODY)

    job, out = refused_job(mpi_jobs, pack, plant)
    assert_each_rank_refused(
        out,
        [
            "refusing to use %s: it is a symbolic link (it must be a directory of uid %d with mode "
            "0700; remove it)" % (job.workdir / ("cache%d" % rank) / stage_name, os.geteuid())
            for rank in range(NP)
        ],
    )
    assert list(victim.iterdir()) == []
    assert job.mounted() == []
