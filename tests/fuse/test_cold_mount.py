"""The plan's sample mount (`coldmount.sample_mount`): each class's sample read through a real
mount of it, charged by the decode trace; nothing left behind, whatever happens; the method
kept, with the reason in the plan, when the mount cannot be made."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fanfs.mountinfo import mounts_under
from fanfs.optimizer import ClassSample, coldmount
from fanfs.optimizer.coldmount import MOUNT_MIN_UNITS, sample_mount
from tests.conftest import run_fanfs

pytestmark = pytest.mark.fuse


def _texts(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    words = ["tensor", "label", "image", "batch", "epoch", "loss"]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(200, 2000))).encode()
        for _ in range(n)
    ]


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory `sample_mount` makes its own in (to see it cleaned up)."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    monkeypatch.setattr(coldmount, "SCRATCH_DIRS", (str(base),))
    return base


def test_each_class_of_enough_units_is_read_through_a_mount_and_nothing_is_left(
    private_tmp: Path,
) -> None:
    many = ClassSample("a/*.txt", files=40, units=_texts(MOUNT_MIN_UNITS + 4, 1))
    few = ClassSample("b/*.txt", files=3, units=_texts(MOUNT_MIN_UNITS - 1, 2))
    got = sample_mount([many, few], chunk_size=1 << 20)
    assert got.note == ""
    assert list(got.decode_s) == ["a/*.txt"]
    # 20 units of 1-12 KB of zstd:3 each decoded and verified once: microseconds each
    assert 0.0 < got.decode_s["a/*.txt"] < 1.0
    assert got.plain_s == {}
    # the class's first odd units stored with brotli too, and the same units' zstd:3 chunks
    assert list(got.brotli_s) == list(got.brotli_base_s) == ["a/*.txt"]
    assert 0.0 < got.brotli_base_s["a/*.txt"] < got.decode_s["a/*.txt"]
    assert 0.0 < got.brotli_s["a/*.txt"] < 1.0
    assert got.seconds > 0.0
    assert os.listdir(private_tmp) == []
    assert mounts_under(str(private_tmp)) == []


def test_the_sample_is_written_where_it_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the first of SCRATCH_DIRS with room for it (memory on a real host), else the
    temporary directory; nothing left in either."""
    scratch, temp = tmp_path / "shm", tmp_path / "tmp"
    scratch.mkdir()
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    made: list[str] = []
    real = tempfile.mkdtemp

    def spy(*args: object, **kwargs: object) -> str:
        made.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    cls = ClassSample("a/*.txt", files=40, units=_texts(MOUNT_MIN_UNITS, 1))
    for dirs, where in (((str(scratch),), scratch), ((str(tmp_path / "none"),), temp)):
        monkeypatch.setattr(coldmount, "SCRATCH_DIRS", dirs)
        assert sample_mount([cls], chunk_size=1 << 20).note == ""
        assert Path(made[-1]).parent == where
    free = os.statvfs(scratch).f_bavail * os.statvfs(scratch).f_frsize
    monkeypatch.setattr(coldmount, "SCRATCH_DIRS", (str(scratch),))
    assert coldmount._scratch(2 * free) is None
    assert coldmount._scratch(free // 2) == str(scratch)
    assert os.listdir(scratch) == os.listdir(temp) == []


def test_with_dictionaries_the_units_each_dictionary_was_not_trained_on_are_mounted(
    private_tmp: Path,
) -> None:
    """`dictionaries`: a class with a dictionary and 2 x MOUNT_MIN_UNITS units has its odd
    ones read through a mount of them packed with it, again without it and again with lz4
    and it; a class without one, or with too few such units, is not mounted."""
    from fanfs.compression import train_dictionary

    units = _texts(2 * MOUNT_MIN_UNITS, 1)
    dictionary = train_dictionary(units[::2])
    assert dictionary is not None
    many = ClassSample("a/*.txt", files=40, units=units, dictionary=dictionary)
    few = ClassSample(
        "b/*.txt", files=40, units=units[: 2 * MOUNT_MIN_UNITS - 2], dictionary=dictionary
    )
    plain = ClassSample("c/*.txt", files=40, units=units)
    got = sample_mount([many, few, plain], chunk_size=1 << 20, dictionaries=True)
    assert got.note == ""
    assert list(got.decode_s) == ["a/*.txt"]
    assert 0.0 < got.decode_s["a/*.txt"] < 1.0
    # the same units without the dictionary, and with lz4 and it, read in the same mount
    assert list(got.plain_s) == list(got.lz4_s) == ["a/*.txt"]
    assert 0.0 < got.plain_s["a/*.txt"] < 1.0
    assert 0.0 < got.lz4_s["a/*.txt"] < 1.0
    assert os.listdir(private_tmp) == []
    assert mounts_under(str(private_tmp)) == []
    none = sample_mount([plain], chunk_size=1 << 20, dictionaries=True)
    assert none.note == "no class has %d sample units" % MOUNT_MIN_UNITS


def test_a_dictionarys_first_use_is_charged_to_no_class(private_tmp: Path) -> None:
    """Each serving process of the mount builds a dictionary's context on its first frame
    (about 1.2 ms for 1 MiB), once for a class of the pack but the cost of many small units
    here: left out (each process's first decode of a class charged the class's mean), the
    class's units with the dictionary trace about what they do without it."""
    units = [text[:600] for text in _texts(2 * MOUNT_MIN_UNITS, 1)]
    dictionary = random.Random(3).randbytes(1 << 20)  # (raw content: zstd takes any bytes)
    cls = ClassSample("a/*.txt", files=40, units=units, dictionary=dictionary)
    got = sample_mount([cls], chunk_size=1 << 20, dictionaries=True)
    assert got.note == ""
    # 16 units of 600 B: a few microseconds each with or without it (the context's build
    # alone would be several times their sum)
    assert got.decode_s["a/*.txt"] < 2.5 * got.plain_s["a/*.txt"], got


def test_without_a_class_of_enough_units_nothing_is_mounted(private_tmp: Path) -> None:
    few = ClassSample("b/*.txt", files=3, units=_texts(MOUNT_MIN_UNITS - 1, 2))
    got = sample_mount([few], chunk_size=1 << 20)
    assert (got.decode_s, got.seconds) == ({}, 0.0)
    assert got.note == "no class has %d sample units" % MOUNT_MIN_UNITS
    assert os.listdir(private_tmp) == []


def test_a_step_that_fails_leaves_the_method_and_says_why(
    private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fanfs.optimizer.coldmount.sys.executable", "/bin/false")
    many = ClassSample("a/*.txt", files=40, units=_texts(MOUNT_MIN_UNITS, 1))
    got = sample_mount([many], chunk_size=1 << 20)
    assert got.decode_s == {}
    assert got.note == "packing the sample failed: exit status 1"
    assert os.listdir(private_tmp) == []


def test_no_temporary_directory_leaves_the_method_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_dir))
    monkeypatch.setattr(coldmount, "SCRATCH_DIRS", ())
    many = ClassSample("a/*.txt", files=40, units=_texts(MOUNT_MIN_UNITS, 1))
    got = sample_mount([many], chunk_size=1 << 20)
    assert got.decode_s == {}
    assert got.note == "no temporary directory for the sample (Not a directory)"


def _tree(root: Path) -> None:
    (root / "docs").mkdir(parents=True)
    for i, text in enumerate(_texts(40, 3)):
        (root / "docs" / ("%02d.txt" % i)).write_bytes(text)
    (root / "misc.bin").write_bytes(os.urandom(5000))


def test_the_plan_says_which_classes_the_mount_measured_and_ignores_a_planted_fanfs(
    tmp_path: Path,
) -> None:
    # The plan runs `python -m fanfs` for the sample's pack and mount: a `fanfs` package in
    # the directory the plan is run from (one others may write) is not what runs.
    _tree(tmp_path / "src")
    planted = tmp_path / "cwd" / "fanfs"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("raise SystemExit('planted')\n")

    def plan(*extra: str) -> subprocess.CompletedProcess[str]:
        # (-P: this command's own fanfs is the real one; the plan's must be too)
        return subprocess.run(
            [sys.executable, "-P", "-m", "fanfs", "plan", str(tmp_path / "src"), *extra],
            cwd=planted.parent,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    table, as_json = plan(), plan("--json")
    assert table.returncode == 0, table.stderr
    [line] = [ln for ln in table.stdout.splitlines() if ln.startswith("cold cost")]
    assert line.startswith(
        "cold cost   the sample read through a mount of it, for 1 class, brotli's cost for 1 ("
    ), line
    assert line.endswith(
        "); timed after evicting the CPU caches for those of fewer sample units"
    ), line
    cold = json.loads(as_json.stdout)["sample"]["cold"]
    assert cold["model"] == "mount"
    assert cold["mounted_classes"] == cold["brotli_classes"] == ["docs/*.txt"]
    assert cold["note"] is None and cold["mount_s"] > 0


def test_cold_cost_method_mounts_nothing(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    done = run_fanfs("plan", tmp_path / "src", "--json", "--cold-cost", "method")
    assert done.returncode == 0, done.stderr
    cold = json.loads(done.stdout)["sample"]["cold"]
    # (a solid block's data from memory is timed whatever the cold model: no mount)
    assert 0.0 < cold.pop("block_data_ns") < 100.0
    assert cold == {
        "model": "method",
        "mounted_classes": [],
        "brotli_classes": [],
        "dictionary_classes": [],
        "lz4_dictionary_classes": [],
        "mount_s": 0.0,
        "note": "--cold-cost method",
    }


def test_a_step_that_hangs_is_killed_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    # (a read of a mount in trouble that never returns: the child is killed, the plan goes on)
    from fanfs.optimizer import coldmount

    monkeypatch.setattr(coldmount, "STEP_TIMEOUT_S", 0.5)
    with pytest.raises(coldmount._Failed) as caught:
        coldmount._python("reading the sample's mount", ["-c", "import time; time.sleep(30)"])
    assert str(caught.value).startswith("reading the sample's mount failed (Command ")
    assert str(caught.value).endswith("timed out after 0.5 seconds)")
